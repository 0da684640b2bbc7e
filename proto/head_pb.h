/* head_pb.h — the one conversion of a head's statistics as the kernels computed them (a
 * stats_head, kernels/stats.h) into the wire's HeadStats, every count and statistic of
 * vocab/vocab.h's rows: libattnstat's local mode (a Computed message) and attnstatd's Acks and
 * Results both use it, and tests/test_vocab.c checks it. A macro, so that the wire names the
 * kernels' type only where it is expanded (client/local.c, daemon/push.c: their builds include
 * kernels/stats.h; proto/ itself does not use kernels/).
 *
 * HEAD_PB_FILL(o, num, h): o an Attnstat__HeadStats *, num its head number, h a const
 * stats_head *.
 * Every count set (rows is required, the others optional); every statistic set when finite (NaN
 * and -inf say "none" by their absence, which the daemon reads as absent).
 *
 * Stage: the wire; includes math.h, the generated protocol and wire_vocab.h. */
#ifndef ATTNSTAT_HEAD_PB_H
#define ATTNSTAT_HEAD_PB_H

#include <math.h>
#include <stdint.h>

#include "attnstat.pb-c.h"
#include "wire_vocab.h"

#define HEAD_PB_COUNT_(name, ...)                                                                  \
    WIRE_VOCAB_UNLESS(REQUIRED, name)(head_pb_o_->has_##name = 1;)                                 \
    head_pb_o_->name = (uint64_t)head_pb_h_->name;
#define HEAD_PB_STAT_(name, ...)                                                                   \
    head_pb_o_->has_##name = isfinite(head_pb_h_->name);                                           \
    head_pb_o_->name = head_pb_h_->name;

#define HEAD_PB_FILL(o, num, h)                                                                    \
    do {                                                                                           \
        Attnstat__HeadStats *head_pb_o_ = (o);                                                     \
        const stats_head *head_pb_h_ = (h);                                                        \
        attnstat__head_stats__init(head_pb_o_);                                                    \
        head_pb_o_->head = (num);                                                                  \
        VOCAB_COUNTS(HEAD_PB_COUNT_)                                                               \
        VOCAB_STATS(HEAD_PB_STAT_)                                                                 \
        head_pb_o_->has_sampled = 1;                                                               \
        head_pb_o_->sampled = head_pb_h_->sampled != 0;                                            \
    } while (0)

#endif /* ATTNSTAT_HEAD_PB_H */
