/* client_vocab.h — how libattnstat walks vocab/vocab.h's rows over its public structs
 * (attnstat_head_result, attnstat_thresholds) and the wire's messages (HeadStats, Thresholds):
 * the few rows that a struct or message does not carry, marked once here, and a selector that
 * leaves their code out of an X-macro expansion (a field that does not exist cannot be named,
 * even in a branch never taken).
 *
 * The marks (each `CLIENT_VOCAB_<mark>_<name>` defined as `~, 0`):
 *   DAEMON_ONLY  a threshold that is the daemon's own option (attnstatd.conf) only: not in the
 *                hello's Thresholds, attnstat_thresholds or the Python binding's keywords.
 *   REQUIRED     a count that HeadStats declares `required` (no has_<name> in protobuf-c's struct).
 * tests/test_vocab.c checks the marks against the generated protocol's descriptors, so a mark
 * that goes wrong fails a test rather than dropping a field silently.
 *
 * Use: CLIENT_VOCAB_UNLESS(DAEMON_ONLY, name)(code) is code for every row not so marked.
 *
 * Stage: a header below link.c, local.c, replies.c and util.c; includes vocab.h only. */
#ifndef ATTNSTAT_CLIENT_VOCAB_H
#define ATTNSTAT_CLIENT_VOCAB_H

#include "vocab.h"

#define CLIENT_VOCAB_DAEMON_ONLY_ema_warmup ~, 0
#define CLIENT_VOCAB_REQUIRED_rows ~, 0

/* The selector's machinery: the mark's `~, 0` shifts the 1 out of the second place. */
#define CLIENT_VOCAB_CAT_(a, b) a##b
#define CLIENT_VOCAB_CAT(a, b) CLIENT_VOCAB_CAT_(a, b)
#define CLIENT_VOCAB_PASTE_(a, b, c) a##b##_##c
#define CLIENT_VOCAB_PASTE(a, b, c) CLIENT_VOCAB_PASTE_(a, b, c)
#define CLIENT_VOCAB_SECOND_(a, b, ...) b
#define CLIENT_VOCAB_SECOND(...) CLIENT_VOCAB_SECOND_(__VA_ARGS__)
#define CLIENT_VOCAB_IF_1(...) __VA_ARGS__
#define CLIENT_VOCAB_IF_0(...)

/* 1 when row `name` carries mark `mark`, else 0 (an integer constant expression). */
#define CLIENT_VOCAB_HAS(mark, name)                                                               \
    (!CLIENT_VOCAB_SECOND(CLIENT_VOCAB_PASTE(CLIENT_VOCAB_, mark, name), 1, ~))
/* CLIENT_VOCAB_UNLESS(mark, name)(code): code, or nothing when row `name` carries `mark`. */
#define CLIENT_VOCAB_UNLESS(mark, name)                                                            \
    CLIENT_VOCAB_CAT(CLIENT_VOCAB_IF_,                                                             \
                     CLIENT_VOCAB_SECOND(CLIENT_VOCAB_PASTE(CLIENT_VOCAB_, mark, name), 1, ~))

#endif /* ATTNSTAT_CLIENT_VOCAB_H */
