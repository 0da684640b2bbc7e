/* test_alerts_limits.c — the alert engine's memory and limits (part of the test_alerts suite):
 * steady-state observation without allocation, forgetting runs, the per-run and engine limits on
 * states (a run past its cap leaves other runs' alerts alone), random limits against a model;
 * the bound on each run's transitions (alerts_limit.h: a burst, a rate, ends that follow their
 * raise, summaries). */
#include <check.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alerts_limit.h"
#include "alerts_testutil.h"

/* ---- memory ------------------------------------------------------------------------------------- */

START_TEST(test_many_heads_no_growth)
{
    alerts_config c = random_config();
    alerts_engine *e = new_engine(&c);
    int runs = (int)rnd_range(2, 4), layers = (int)rnd_range(16, 64), heads = (int)rnd_range(16, 64);
    alerts_transition t[ALERTS_NRULES];
    for (int r = 1; r <= runs; r++)
        for (int l = 0; l < layers; l++)
            for (int h = 0; h < heads; h++) {
                stats_head x = healthy(1 + h * 0.01);
                observe(e, r, l, h, 0, &x, t);
            }
    size_t n = alerts_heads(e);
    ck_assert_uint_eq(n, (size_t)runs * layers * heads);
    size_t allocs = alerts_allocations(e);
    size_t transitions = 0;
    for (int s = 1; s < 30; s++)
        for (int r = 1; r <= runs; r++)
            for (int l = 0; l < layers; l++)
                for (int h = 0; h < heads; h++) {
                    stats_head x = rnd() % 50 == 0
                                       ? spiked(1 + h * 0.01, (alerts_rule)rnd_range(1, 4), &c)
                                       : healthy(1 + h * 0.01);
                    transitions += (size_t)observe(e, r, l, h, s, &x, t);
                }
    ck_assert_uint_eq(alerts_allocations(e), allocs);
    ck_assert_uint_eq(alerts_heads(e), n);
    fprintf(stderr, "  %zu heads, %zu allocations, %zu transitions in the steady state\n", n,
            allocs, transitions);
    /* reserve up front: then even the first pass does not grow */
    alerts_engine *f = new_engine(&c);
    ck_assert_int_eq(alerts_reserve(f, n), ALERTS_OK);
    size_t a0 = alerts_allocations(f);
    for (int r = 1; r <= runs; r++)
        for (int l = 0; l < layers; l++)
            for (int h = 0; h < heads; h++) {
                stats_head x = healthy(1);
                observe(f, r, l, h, 0, &x, t);
            }
    ck_assert_uint_eq(alerts_allocations(f), a0);
    alerts_free(f);
    alerts_free(e);
}
END_TEST

START_TEST(test_forget_run)
{
    alerts_config c = random_config();
    alerts_engine *e = new_engine(&c);
    char err[128];
    alerts_overrides o = {.has_logit_ceiling = 1, .logit_ceiling = 42};
    ck_assert_int_eq(alerts_set_run(e, 2, &o, err, sizeof err), ALERTS_OK);
    int layers = (int)rnd_range(4, 20), heads = (int)rnd_range(4, 40);
    alerts_transition t[ALERTS_NRULES];
    int64_t step = 0;
    /* three runs interleaved, so their slots collide and chain */
    for (uint32_t s = 0; s < c.ema_warmup + 2; s++, step++)
        for (int l = 0; l < layers; l++)
            for (int h = 0; h < heads; h++)
                for (int r = 1; r <= 3; r++) {
                    stats_head x = healthy(2);
                    ck_assert_int_eq(observe(e, r, l, h, step, &x, t), 0);
                }
    /* NONFINITE raised on every head of runs 2 and 3 */
    for (int l = 0; l < layers; l++)
        for (int h = 0; h < heads; h++)
            for (int r = 2; r <= 3; r++) {
                stats_head x = spiked(2, ALERTS_NONFINITE, &c);
                ck_assert_int_eq(observe(e, r, l, h, step, &x, t), 1);
            }
    step++;
    size_t per_run = (size_t)layers * heads;
    ck_assert_uint_eq(alerts_heads(e), 3 * per_run);
    ck_assert_uint_eq(alerts_active(e, 0, NULL, 0), 2 * per_run);
    size_t allocs = alerts_allocations(e);
    alerts_forget_run(e, 2);
    ck_assert_uint_eq(alerts_allocations(e), allocs);
    ck_assert_uint_eq(alerts_heads(e), 2 * per_run);
    ck_assert_uint_eq(alerts_active(e, 2, NULL, 0), 0);
    ck_assert_uint_eq(alerts_active(e, 3, NULL, 0), per_run);
    alerts_config got;
    alerts_run_config(e, 2, &got);
    ck_assert(got.logit_ceiling == c.logit_ceiling); /* overrides gone too */
    /* every state of runs 1 and 3 survived: observing them creates nothing and run 3 clears
     * after exactly clear_after good samples */
    for (uint32_t s = 0; s < c.clear_after; s++, step++) {
        size_t cleared = 0;
        for (int l = 0; l < layers; l++)
            for (int h = 0; h < heads; h++)
                for (int r = 1; r <= 3; r += 2) {
                    stats_head x = healthy(2);
                    int n = observe(e, r, l, h, step, &x, t);
                    if (n) {
                        ck_assert_int_eq(r, 3);
                        ck_assert_int_eq(t[0].state, ALERTS_CLEARED);
                        cleared++;
                    }
                }
        ck_assert_uint_eq(cleared, s + 1 == c.clear_after ? per_run : 0);
        ck_assert_uint_eq(alerts_heads(e), 2 * per_run);
    }
    /* a forgotten run starts from scratch */
    stats_head x = healthy(2);
    observe(e, 2, 0, 0, step, &x, t);
    ck_assert_uint_eq(alerts_heads(e), 2 * per_run + 1);
    alerts_forget_run(e, 1);
    alerts_forget_run(e, 3);
    alerts_forget_run(e, 2);
    alerts_forget_run(e, 99);
    ck_assert_uint_eq(alerts_heads(e), 0);
    alerts_free(e);
}
END_TEST

/* ---- limits -------------------------------------------------------------------------------------- */

/* Raises LOGIT_CEILING on (run, layer, head) after exactly raise_after bad samples and clears it
 * after exactly clear_after good ones; returns the next step. */
static int64_t raise_and_clear(alerts_engine *e, int64_t run, int32_t layer, int32_t head,
                               const alerts_config *c, int64_t step)
{
    alerts_transition t[ALERTS_NRULES];
    for (uint32_t i = 0; i < c->raise_after; i++) {
        stats_head h = spiked(2.0, ALERTS_LOGIT_CEILING, c);
        int n = observe(e, run, layer, head, step++, &h, t);
        ck_assert_int_eq(n, i + 1 == c->raise_after);
        if (n) {
            ck_assert_int_eq(t[0].rule, ALERTS_LOGIT_CEILING);
            ck_assert_int_eq(t[0].state, ALERTS_RAISED);
        }
    }
    ck_assert_uint_ge(alerts_active(e, run, NULL, 0), 1);
    for (uint32_t i = 0; i < c->clear_after; i++) {
        stats_head h = healthy(2.0);
        int n = observe(e, run, layer, head, step++, &h, t);
        ck_assert_int_eq(n, i + 1 == c->clear_after);
        if (n)
            ck_assert_int_eq(t[0].state, ALERTS_CLEARED);
    }
    return step;
}

/* One client pushing more distinct (layer, head) pairs than a run may have, with the default
 * limits: the heads past the cap are refused with their own result, nothing is allocated for them,
 * and another run's alerts (and the flooding run's kept heads) work as before. */
START_TEST(test_run_cap_spares_other_runs)
{
    alerts_config c = random_config();
    alerts_engine *e = new_engine(&c);
    alerts_limits lim;
    alerts_get_limits(e, &lim);
    ck_assert_uint_eq(lim.max_heads_per_run, 65536);
    ck_assert_uint_eq(lim.max_heads, ALERTS_MAX_HEADS);
    /* the table's memory stays within a few hundred MB whatever clients push */
    ck_assert_uint_le(alerts_table_bytes_max(e), (size_t)256 << 20);
    fprintf(stderr, "  state table at most %zu MiB\n", alerts_table_bytes_max(e) >> 20);

    /* run 2: a victim with its heads known before the flood */
    int64_t step2 = 0;
    for (int h = 0; h < 4; h++)
        step2 = warm(e, 2, 0, h, 2.0, &c, 0);
    alerts_transition t[ALERTS_NRULES];
    const uint32_t cap = lim.max_heads_per_run, extra = (uint32_t)rnd_range(1, 3000);
    for (uint32_t i = 0; i < cap + extra; i++) {
        stats_head x = healthy(2.0);
        int n = alerts_observe(e, 1, (int32_t)(i >> 8), (int32_t)(i & 255), 0, &x, t);
        if (i < cap)
            ck_assert_int_eq(n, 0);
        else
            ck_assert_msg(n == ALERTS_OBSERVE_RUN_FULL, "head %u of run 1: %d", i, n);
        if (i == cap)
            ck_assert_uint_eq(alerts_refused(e, 1), 1); /* a caller's cue to log it once */
    }
    ck_assert_uint_eq(alerts_run_heads(e, 1), cap);
    ck_assert_uint_eq(alerts_run_heads(e, 2), 4);
    ck_assert_uint_eq(alerts_heads(e), (size_t)cap + 4);
    ck_assert_uint_eq(alerts_refused(e, 1), extra);
    ck_assert_uint_eq(alerts_refused(e, 2), 0);
    ck_assert_uint_eq(alerts_refused(e, 0), extra);

    /* refusing allocates nothing, however long it goes on */
    size_t allocs = alerts_allocations(e);
    for (uint32_t i = 0; i < 1000; i++) {
        stats_head x = spiked(2.0, ALERTS_NONFINITE, &c);
        ck_assert_int_eq(alerts_observe(e, 1, 100000 + (int32_t)i, 0, 1, &x, t),
                         ALERTS_OBSERVE_RUN_FULL);
    }
    ck_assert_uint_eq(alerts_allocations(e), allocs);
    ck_assert_uint_eq(alerts_active(e, 1, NULL, 0), 0);

    /* run 2's heads raise and clear exactly; a head of run 2 new after the flood is admitted */
    for (int h = 0; h < 4; h++)
        raise_and_clear(e, 2, 0, h, &c, step2);
    int64_t s5 = warm(e, 2, 7, 5, 2.0, &c, 0);
    raise_and_clear(e, 2, 7, 5, &c, s5);
    ck_assert_uint_eq(alerts_run_heads(e, 2), 5);
    /* run 3 comes after the flood: its alerts work too */
    int64_t s3 = warm(e, 3, 1, 1, 2.0, &c, 0);
    raise_and_clear(e, 3, 1, 1, &c, s3);
    /* the flooding run's kept heads are still watched */
    raise_and_clear(e, 1, 0, 0, &c, 1);
    ck_assert_uint_eq(alerts_refused(e, 2) + alerts_refused(e, 3), 0);

    /* a forgotten run starts again with a fresh allowance */
    alerts_forget_run(e, 1);
    ck_assert_uint_eq(alerts_run_heads(e, 1), 0);
    ck_assert_uint_eq(alerts_refused(e, 1), 0);
    stats_head x = healthy(2.0);
    ck_assert_int_eq(observe(e, 1, 999, 0, 0, &x, t), 0);
    ck_assert_uint_eq(alerts_heads(e), 5 + 1 + 1);
    alerts_free(e);
}
END_TEST

/* A run that ends for idleness while its client stays (alerts_forget_heads: its states go, its
 * thresholds stay) and resumes, again and again, with the same heads up to its cap: each time every
 * head is admitted and alerted on, never refused as if the forgotten ones still counted. */
START_TEST(test_idle_cycles_keep_the_allowance)
{
    alerts_config c = random_config();
    alerts_engine *e = new_engine(&c);
    char err[256] = "";
    alerts_limits lim = {.max_heads_per_run = (uint32_t)rnd_range(4, 40)};
    lim.max_heads = 4 * lim.max_heads_per_run;
    ck_assert_int_eq(alerts_set_limits(e, &lim, err, sizeof err), ALERTS_OK);
    alerts_overrides o = {.has_logit_ceiling = 1, .logit_ceiling = c.logit_ceiling};
    ck_assert_int_eq(alerts_set_run(e, 5, &o, err, sizeof err), ALERTS_OK);
    alerts_transition t[ALERTS_NRULES];
    const uint32_t cap = lim.max_heads_per_run;
    int cycles = (int)rnd_range(3, 8);
    for (int cyc = 0; cyc < cycles; cyc++) {
        for (uint32_t hd = 0; hd < cap; hd++) {
            stats_head x = healthy(2.0);
            ck_assert_msg(observe(e, 5, 0, (int32_t)hd, 0, &x, t) == 0,
                          "cycle %d head %u refused", cyc, hd);
        }
        ck_assert_uint_eq(alerts_run_heads(e, 5), cap);
        ck_assert_uint_eq(alerts_refused(e, 5), 0);
        raise_and_clear(e, 5, 0, (int32_t)(cap - 1), &c, 1); /* the last head is alerted on */
        alerts_forget_heads(e, 5);
        ck_assert_uint_eq(alerts_run_heads(e, 5), 0);
        ck_assert_uint_eq(alerts_heads(e), 0);
    }
    alerts_free(e);
}
END_TEST

/* Small random limits against a model: every new head is admitted, or refused as its run's (cap
 * reached) or the engine's (max_heads reached), exactly when the model says. */
START_TEST(test_limits_against_model)
{
    alerts_config c = random_config();
    alerts_engine *e = new_engine(&c);
    char err[256] = "";
    alerts_limits lim = {.max_heads_per_run = (uint32_t)rnd_range(4, 40)};
    lim.max_heads = (uint32_t)rnd_range(lim.max_heads_per_run + 1, 3 * lim.max_heads_per_run);
    ck_assert_int_eq(alerts_set_limits(e, &lim, err, sizeof err), ALERTS_OK);
    enum { RUNS = 4, KEYS = 64 };
    static unsigned char kept[RUNS + 1][KEYS];
    memset(kept, 0, sizeof kept);
    size_t per_run[RUNS + 1] = {0}, total = 0;
    uint64_t refused[RUNS + 1] = {0}, refused_all = 0;
    alerts_transition t[ALERTS_NRULES];
    for (int i = 0; i < 4000; i++) {
        int r = (int)rnd_range(1, RUNS), k = (int)rnd_range(0, KEYS - 1);
        stats_head x = healthy(2.0);
        int n = alerts_observe(e, r, k / 8, k % 8, i, &x, t);
        int want;
        if (kept[r][k]) {
            want = 0;
        } else if (per_run[r] >= lim.max_heads_per_run) {
            want = ALERTS_OBSERVE_RUN_FULL;
        } else if (total >= lim.max_heads) {
            want = ALERTS_OBSERVE_FULL;
        } else {
            want = 0;
            kept[r][k] = 1;
            per_run[r]++;
            total++;
        }
        if (want < 0) {
            refused_all++;
            if (per_run[r] > 0)
                refused[r]++; /* counted per run once the run has a record */
        }
        ck_assert_msg(n == want, "observe %d (run %d key %d): %d, expected %d", i, r, k, n, want);
    }
    ck_assert_uint_eq(alerts_heads(e), total);
    ck_assert_uint_le(total, lim.max_heads);
    for (int r = 1; r <= RUNS; r++) {
        ck_assert_uint_eq(alerts_run_heads(e, r), per_run[r]);
        ck_assert_uint_le(per_run[r], lim.max_heads_per_run);
        ck_assert_uint_eq(alerts_refused(e, r), refused[r]);
    }
    ck_assert_uint_eq(alerts_refused(e, 0), refused_all);

    /* limits lowered under what is kept: the kept states stay, new heads are refused */
    alerts_limits low = {.max_heads_per_run = 1, .max_heads = 1};
    ck_assert_int_eq(alerts_set_limits(e, &low, err, sizeof err), ALERTS_OK);
    ck_assert_uint_eq(alerts_heads(e), total);
    stats_head x = healthy(2.0);
    /* run 1 is at its new cap of 1 when it kept a head; when the random global cap left it none,
     * the engine-wide cap (total >= 1) is what refuses it */
    ck_assert_int_eq(alerts_observe(e, 1, 1000, 0, 0, &x, t),
                     per_run[1] >= 1 ? ALERTS_OBSERVE_RUN_FULL : ALERTS_OBSERVE_FULL);
    ck_assert_int_eq(alerts_observe(e, RUNS + 1, 0, 0, 0, &x, t), ALERTS_OBSERVE_FULL);
    ck_assert_int_eq(alerts_reserve(e, 2), ALERTS_ELIMIT);

    /* bounds */
    alerts_limits bad = {.max_heads_per_run = 0, .max_heads = 10};
    ck_assert_int_eq(alerts_set_limits(e, &bad, err, sizeof err), ALERTS_EINVAL);
    ck_assert_msg(strstr(err, "max_heads_per_run 0") && strstr(err, "[1, "), "%s", err);
    bad = (alerts_limits){.max_heads_per_run = 10, .max_heads = ALERTS_MAX_HEADS + 1};
    ck_assert_int_eq(alerts_limits_check(&bad, err, sizeof err), ALERTS_EINVAL);
    ck_assert_msg(strstr(err, "max_heads ") && strstr(err, "out of bounds"), "%s", err);
    ck_assert_int_eq(alerts_limits_check(NULL, NULL, 0), ALERTS_EINVAL);
    alerts_limits got;
    alerts_get_limits(e, &got);
    ck_assert_uint_eq(got.max_heads_per_run, 1); /* unchanged by the refused ones */
    ck_assert_uint_eq(got.max_heads, 1);
    alerts_limits_default(&got);
    ck_assert_int_eq(alerts_limits_check(&got, NULL, 0), ALERTS_OK);
    ck_assert_int_eq(alerts_reserve(e, (size_t)ALERTS_MAX_HEADS + 1), ALERTS_ELIMIT);
    alerts_free(e);
}
END_TEST

/* ---- the bound on a run's transitions (alerts_limit.h) -------------------------------------- */

typedef struct {
    int n;
    alerts_limit_summary last;
    uint64_t sum;
} summaries;

static void take_summary(void *ctx, const alerts_limit_summary *s)
{
    summaries *l = ctx;
    l->n++;
    l->last = *s;
    l->sum += s->suppressed;
}

static alerts_transition edge(int64_t run, int32_t head, alerts_state state)
{
    alerts_transition t = {.run_id = run, .layer = (int32_t)(head % 7), .head = head,
                           .rule = ALERTS_LOGIT_CEILING, .state = state};
    return t;
}

/* A run raises more than its burst at once: exactly `burst` raises pass, the others are
 * suppressed with the ends of those raises (an end follows its raise, never alone), another run
 * keeps its own bucket, tokens come back at `rate`, the episode is summarised once, after it is
 * quiet, with every transition it suppressed, and the run's end summarises and forgets the rest. */
START_TEST(test_transitions_bounded_per_run)
{
    double rate = (double)rnd_range(2, 20), burst = (double)rnd_range(5, 50);
    alerts_limit *l = alerts_limit_new(rate, burst);
    ck_assert_ptr_nonnull(l);
    int heads = (int)burst + (int)rnd_range(10, 200);
    int64_t now = rnd_range(1000000, 2000000);
    int pass = 0, first = 0;
    uint8_t *passed = calloc((size_t)heads, 1);
    for (int h = 0; h < heads; h++) {
        alerts_transition t = edge(1, h, ALERTS_RAISED);
        alerts_limit_verdict v = alerts_limit_admit(l, &t, now);
        passed[h] = v == ALERTS_LIMIT_PASS;
        pass += passed[h];
        first += v == ALERTS_LIMIT_FIRST;
    }
    ck_assert_int_eq(pass, (int)burst);
    ck_assert_int_eq(first, 1);
    ck_assert_uint_eq(alerts_limit_suppressed(l, 1), (uint64_t)(heads - pass));
    ck_assert_uint_eq(alerts_limit_pending(l), (size_t)(heads - pass));
    /* another run: a full bucket of its own */
    alerts_transition o = edge(2, 0, ALERTS_RAISED);
    ck_assert_int_eq(alerts_limit_admit(l, &o, now), ALERTS_LIMIT_PASS);
    /* ends follow their raise: half of the heads clear */
    int ends = 0, ends_passed = 0;
    for (int h = 0; h < heads; h += 2) {
        alerts_transition t = edge(1, h, ALERTS_CLEARED);
        alerts_limit_verdict v = alerts_limit_admit(l, &t, now + 1);
        ck_assert_msg((v == ALERTS_LIMIT_PASS) == passed[h], "head %d: the end of a %s raise %s",
                      h, passed[h] ? "recorded" : "suppressed", v ? "suppressed" : "passed");
        ends++;
        ends_passed += passed[h];
    }
    uint64_t want = (uint64_t)(heads - pass) + (uint64_t)(ends - ends_passed);
    ck_assert_uint_eq(alerts_limit_suppressed(l, 1), want);
    /* still within the quiet time: no summary yet; after it, one with every suppressed one */
    summaries got = {0};
    ck_assert_uint_eq(alerts_limit_summaries(l, now + 2, take_summary, &got), 0);
    ck_assert_uint_eq(alerts_limit_summaries(l, now + 1 + ALERTS_LIMIT_QUIET_MS, take_summary,
                                             &got), 1);
    ck_assert_int_eq(got.n, 1);
    ck_assert_uint_eq(got.last.suppressed, want);
    ck_assert_int_eq(got.last.run_id, 1);
    ck_assert(got.last.ended);
    ck_assert_uint_eq(alerts_limit_summaries(l, now + 10 * ALERTS_LIMIT_QUIET_MS, take_summary,
                                             &got), 0);
    /* tokens come back at rate: k seconds later, rate x k raises pass (within the burst) */
    int64_t later = now + 1 + ALERTS_LIMIT_QUIET_MS + 1000;
    double tokens = fmin(burst, rate * (double)(later - now) / 1000.0);
    int again = 0;
    for (int h = heads; h < heads + (int)burst + 5; h++) {
        alerts_transition t = edge(1, h, ALERTS_RAISED);
        again += alerts_limit_admit(l, &t, later) == ALERTS_LIMIT_PASS;
    }
    ck_assert_int_eq(again, (int)floor(tokens));
    /* the run ends: what it still suppressed is summarised, its keys forgotten */
    uint64_t before = got.sum;
    alerts_limit_end_run(l, 1, take_summary, &got);
    ck_assert_int_eq(got.n, 2);
    ck_assert_uint_eq(got.sum - before, (uint64_t)((int)burst + 5 - again));
    ck_assert_uint_eq(alerts_limit_pending(l), 0);
    ck_assert_uint_eq(alerts_limit_suppressed(l, 1), 0); /* its entry is gone */
    ck_assert_uint_eq(alerts_limit_suppressed(l, 0), got.sum);
    /* a new episode of the same run starts with a full bucket */
    alerts_transition t = edge(1, 0, ALERTS_RAISED);
    ck_assert_int_eq(alerts_limit_admit(l, &t, later), ALERTS_LIMIT_PASS);
    free(passed);
    alerts_limit_free(l);
}
END_TEST


void alerts_limits_tests(TCase *tc)
{
    tcase_add_test(tc, test_many_heads_no_growth);
    tcase_add_test(tc, test_forget_run);
    tcase_add_test(tc, test_run_cap_spares_other_runs);
    tcase_add_test(tc, test_limits_against_model);
    tcase_add_test(tc, test_idle_cycles_keep_the_allowance);
    tcase_add_test(tc, test_transitions_bounded_per_run);
}
