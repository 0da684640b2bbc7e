/* local_pb.h — local mode's one conversion: a head's statistics as the kernels computed them
 * (stats_head, kernels/stats.h) into the wire's HeadStats of a Computed message, every count and
 * statistic of vocab/vocab.h's rows. A header (static inline) so that tests/test_vocab.c checks
 * this very code in a build without CUDA, where local.c's kernel path is left out.
 *
 * Stage: below local.c; includes stats.h, the generated protocol and client_vocab.h. */
#ifndef ATTNSTAT_LOCAL_PB_H
#define ATTNSTAT_LOCAL_PB_H

#include <math.h>
#include <stdint.h>

#include "attnstat.pb-c.h"
#include "client_vocab.h"
#include "stats.h"

static inline void local_head_pb(Attnstat__HeadStats *o, uint32_t head, const stats_head *h)
{
    attnstat__head_stats__init(o);
    o->head = head;
    /* Every count and every statistic of vocab.h's rows; a statistic that is not finite (NaN:
     * not defined for this head) is left out, which the daemon reads as absent. */
#define X(name, ...)                                                                               \
    CLIENT_VOCAB_UNLESS(REQUIRED, name)(o->has_##name = 1;)                                        \
    o->name = (uint64_t)h->name;
    VOCAB_COUNTS(X)
#undef X
#define X(name, ...)                                                                               \
    o->has_##name = isfinite(h->name);                                                             \
    o->name = h->name;
    VOCAB_STATS(X)
#undef X
    o->has_sampled = 1;
    o->sampled = h->sampled != 0;
}

#endif /* ATTNSTAT_LOCAL_PB_H */
