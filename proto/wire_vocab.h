/* wire_vocab.h — how code walks vocab/vocab.h's rows over libattnstat's public structs
 * (attnstat_head_result, attnstat_thresholds) and the wire's messages (HeadStats, Thresholds):
 * the few rows that a struct or message does not carry, marked once here, and a selector that
 * leaves their code out of an X-macro expansion (a field that does not exist cannot be named,
 * even in a branch never taken).
 *
 * The marks (each `WIRE_VOCAB_<mark>_<name>` defined as `~, 0`):
 *   DAEMON_ONLY  a threshold that is the daemon's own option (attnstatd.conf) only: not in the
 *                hello's Thresholds, attnstat_thresholds or the Python binding's keywords.
 *   REQUIRED     a count that HeadStats declares `required` (no has_<name> in protobuf-c's struct).
 * tests/test_vocab.c checks the marks against the generated protocol's descriptors, so a mark
 * that goes wrong fails a test rather than dropping a field silently.
 *
 * Use: WIRE_VOCAB_UNLESS(DAEMON_ONLY, name)(code) is code for every row not so marked.
 *
 * Stage: the wire; a header below head_pb.h and client/ (link.c, replies.c, util.c); includes
 * vocab.h only. */
#ifndef ATTNSTAT_WIRE_VOCAB_H
#define ATTNSTAT_WIRE_VOCAB_H

#include "vocab.h"

#define WIRE_VOCAB_DAEMON_ONLY_ema_warmup ~, 0
#define WIRE_VOCAB_REQUIRED_rows ~, 0

/* The selector's machinery: the mark's `~, 0` shifts the 1 out of the second place. */
#define WIRE_VOCAB_CAT_(a, b) a##b
#define WIRE_VOCAB_CAT(a, b) WIRE_VOCAB_CAT_(a, b)
#define WIRE_VOCAB_PASTE_(a, b, c) a##b##_##c
#define WIRE_VOCAB_PASTE(a, b, c) WIRE_VOCAB_PASTE_(a, b, c)
#define WIRE_VOCAB_SECOND_(a, b, ...) b
#define WIRE_VOCAB_SECOND(...) WIRE_VOCAB_SECOND_(__VA_ARGS__)
#define WIRE_VOCAB_IF_1(...) __VA_ARGS__
#define WIRE_VOCAB_IF_0(...)

/* 1 when row `name` carries mark `mark`, else 0 (an integer constant expression). */
#define WIRE_VOCAB_HAS(mark, name)                                                               \
    (!WIRE_VOCAB_SECOND(WIRE_VOCAB_PASTE(WIRE_VOCAB_, mark, name), 1, ~))
/* WIRE_VOCAB_UNLESS(mark, name)(code): code, or nothing when row `name` carries `mark`. */
#define WIRE_VOCAB_UNLESS(mark, name)                                                            \
    WIRE_VOCAB_CAT(WIRE_VOCAB_IF_,                                                             \
                     WIRE_VOCAB_SECOND(WIRE_VOCAB_PASTE(WIRE_VOCAB_, mark, name), 1, ~))

#endif /* ATTNSTAT_WIRE_VOCAB_H */
