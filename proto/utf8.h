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

/* s (NULL: "") into out (len bytes, always terminated), every byte of a control character or of
 * what is not UTF-8 written as \xHH, the rest as it is; cut at a whole character or escape when
 * out is full. Returns out. */
char *utf8_escape(char *out, size_t len, const char *s);

#endif /* ATTNSTAT_UTF8_H */
