/* json.h — a strict checker of JSON text (RFC 8259), for what a peer sends as JSON (a Hello's run
 * config) before it is stored as sent. It checks, it builds nothing. Stage: none (a pure leaf
 * the session calls); includes libc only. Safe from any thread. */
#ifndef ATTNSTAT_JSON_H
#define ATTNSTAT_JSON_H

#include <stddef.h>

#define JSON_MAX_DEPTH 64 /* arrays and objects nested deeper are refused */

/* 0 when s[0..n) is one JSON object (whitespace around it allowed): strings of well-formed UTF-8
 * with valid escapes, numbers of the grammar, true/false/null, at most JSON_MAX_DEPTH levels;
 * else -1 with err saying what is wrong and at which byte. */
int json_check_object(const char *s, size_t n, char *err, size_t errlen);

#endif /* ATTNSTAT_JSON_H */
