/* utf8.h — reading UTF-8, and which characters an operator's terminal takes as commands. Shared by
 * attnstatd (what a peer names is checked and logged escaped) and the attnstat CLI (what it prints
 * from the database or the daemon is escaped), so both agree on what is text. Stage: the wire
 * (proto/), a leaf; includes libc only. */
#ifndef ATTNSTAT_UTF8_H
#define ATTNSTAT_UTF8_H

#include <stddef.h>
#include <stdint.h>

/* The length (1..4) of the well-formed UTF-8 sequence at s (n bytes available) and its code point
 * in *cp; 0 when s does not start one (a stray continuation byte, an overlong form, a surrogate,
 * past U+10FFFF, or cut short). */
int utf8_next(const unsigned char *s, size_t n, uint32_t *cp);

/* 1 for a control character: C0 (below U+0020), DEL, C1 (U+0080..U+009F, CSI among them). */
int utf8_is_control(uint32_t cp);

/* 1 for a character that shows nothing itself but changes how the text around it shows or where
 * its line ends: Unicode's format characters (general category Cf, Unicode 15: U+200B zero width
 * space, U+202E right-to-left override, the isolates U+2066..U+2069, U+FEFF, the tags
 * U+E0020..U+E007F...) and the line and paragraph separators U+2028 and U+2029. A name holding
 * one can pass for another name, or reorder or split the line it is printed in. */
int utf8_is_format(uint32_t cp);

/* 1 for a control or a format character: what a name may not hold, what escaping writes out. */
int utf8_is_hidden(uint32_t cp);

/* s (NULL: "") into out (len bytes, always terminated), every byte of a control or format
 * character (utf8_is_hidden) or of what is not UTF-8 written as \xHH, the rest as it is; cut at a
 * whole character or escape when out is full. Returns out. */
char *utf8_escape(char *out, size_t len, const char *s);

#endif /* ATTNSTAT_UTF8_H */
