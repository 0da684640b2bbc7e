/* alerts_testutil.h — what the alert engine's suite (test_alerts.c, test_alerts_limits.c) shares
 * (alerts_testutil.c). Random data comes from g_seed, set by main and printed. */
#ifndef ATTNSTAT_ALERTS_TESTUTIL_H
#define ATTNSTAT_ALERTS_TESTUTIL_H

#include <check.h>
#include <stdint.h>

#include "alerts.h"

extern uint64_t g_seed;

uint64_t rnd(void);
double rnd_unit(void);
int64_t rnd_range(int64_t lo, int64_t hi);
/* The checked fixture: the generator restarted from g_seed. */
void setup(void);

/* A healthy head: entropy around base (nats, +-1%), normalised entropy well above any floor, max
 * logit, sink mass well under any ceiling, distance well over any floor (of random_config()),
 * every row finite. */
stats_head healthy(double base);
/* The same head made bad for one rule only. */
stats_head spiked(double base, alerts_rule rule, const alerts_config *c);
/* A head with no counted row (nonfinite rows of them non-finite). */
stats_head empty_head(int64_t nonfinite);
alerts_engine *new_engine(const alerts_config *c);
/* alerts_observe, its transitions checked against its arguments. */
int observe(alerts_engine *e, int64_t run, int32_t layer, int32_t head, int64_t step,
            const stats_head *h, alerts_transition out[ALERTS_NRULES]);
/* Warm a head up with healthy samples (enough for the drop baseline); no transition allowed. */
int64_t warm(alerts_engine *e, int64_t run, int32_t layer, int32_t head, double base,
             const alerts_config *c, int64_t step);
alerts_config random_config(void);

/* The memory and limits tests (test_alerts_limits.c), added to tc. */
void alerts_limits_tests(TCase *tc);

#endif /* ATTNSTAT_ALERTS_TESTUTIL_H */
