/* test_alerts.c — Check suite for daemon/alerts: exact hysteresis of every rule, a spike injected
 * into a stable random series raising only its rule, per-run overrides, samples that say nothing,
 * steady-state observation without allocation, forgetting runs, config bounds, the per-run and
 * engine limits on states (a run past its cap leaves other runs' alerts alone).
 *
 * Random data comes from a seed printed at start (ATTNSTAT_TEST_SEED=<n> replays a run).
 */
#include <check.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "alerts.h"

static uint64_t g_seed;
static uint64_t rng_state;

static uint64_t rnd(void)
{
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return rng_state * 0x2545F4914F6CDD1DULL;
}

static double rnd_unit(void)
{
    return (double)(rnd() >> 11) / 9007199254740992.0;
}

static int64_t rnd_range(int64_t lo, int64_t hi)
{
    return lo + (int64_t)(rnd() % (uint64_t)(hi - lo + 1));
}

static void setup(void)
{
    rng_state = g_seed ^ 0xD1B54A32D192ED03ULL;
    if (!rng_state)
        rng_state = 1;
}

/* A healthy head: entropy around base (nats, +-1%), normalised entropy well above any floor, max
 * logit well under any ceiling, every row finite. */
static stats_head healthy(double base)
{
    stats_head h;
    memset(&h, 0, sizeof h);
    h.rows = 512;
    h.rows_norm = 500;
    h.entropy_mean = base * (1 + (rnd_unit() - 0.5) * 0.02);
    h.entropy_std = 0.1;
    h.entropy_min = h.entropy_mean * 0.5;
    h.entropy_max = h.entropy_mean * 1.5;
    h.entropy_norm_mean = 0.5 + rnd_unit() * 0.3;
    h.collapsed_frac = 0.01;
    h.max_logit = 5 + rnd_unit() * 20;
    return h;
}

/* The same head made bad for one rule only. */
static stats_head spiked(double base, alerts_rule rule, const alerts_config *c)
{
    stats_head h = healthy(base);
    switch (rule) {
    case ALERTS_ENTROPY_FLOOR:
        h.entropy_norm_mean = c->entropy_floor * rnd_unit() * 0.9;
        break;
    case ALERTS_ENTROPY_DROP:
        h.entropy_mean = base * (1 - c->entropy_drop) * (0.1 + 0.8 * rnd_unit());
        break;
    case ALERTS_LOGIT_CEILING:
        h.max_logit = c->logit_ceiling * (1.01 + rnd_unit());
        break;
    case ALERTS_NONFINITE:
        h.nonfinite_rows = rnd_range(1, 100);
        break;
    }
    return h;
}

static stats_head empty_head(int64_t nonfinite)
{
    stats_head h;
    memset(&h, 0, sizeof h);
    h.rows = 0;
    h.rows_empty = 10;
    h.nonfinite_rows = nonfinite;
    h.entropy_mean = h.entropy_std = h.entropy_min = h.entropy_max = NAN;
    h.entropy_norm_mean = h.collapsed_frac = NAN;
    h.max_logit = -INFINITY;
    return h;
}

static alerts_engine *new_engine(const alerts_config *c)
{
    char err[256] = "";
    alerts_engine *e = alerts_new(c, err, sizeof err);
    ck_assert_msg(e != NULL, "alerts_new: %s", err);
    return e;
}

static int observe(alerts_engine *e, int64_t run, int32_t layer, int32_t head, int64_t step,
                   const stats_head *h, alerts_transition out[ALERTS_NRULES])
{
    int n = alerts_observe(e, run, layer, head, step, h, out);
    ck_assert_int_ge(n, 0);
    ck_assert_int_le(n, ALERTS_NRULES);
    for (int i = 0; i < n; i++) {
        ck_assert_int_eq(out[i].run_id, run);
        ck_assert_int_eq(out[i].layer, layer);
        ck_assert_int_eq(out[i].head, head);
        ck_assert_int_eq(out[i].step, step);
    }
    return n;
}

/* Warm a head up with healthy samples (enough for the drop baseline); no transition allowed. */
static int64_t warm(alerts_engine *e, int64_t run, int32_t layer, int32_t head, double base,
                    const alerts_config *c, int64_t step)
{
    alerts_transition t[ALERTS_NRULES];
    for (uint32_t i = 0; i < c->ema_warmup + 5; i++) {
        stats_head h = healthy(base);
        ck_assert_int_eq(observe(e, run, layer, head, step++, &h, t), 0);
    }
    return step;
}

static alerts_config random_config(void)
{
    alerts_config c;
    alerts_config_default(&c);
    c.raise_after = (uint32_t)rnd_range(1, 8);
    c.clear_after = (uint32_t)rnd_range(1, 8);
    c.ema_warmup = (uint32_t)rnd_range(1, 30);
    c.ema_alpha = 0.01 + rnd_unit() * 0.3;
    c.entropy_floor = 0.05 + rnd_unit() * 0.2;
    c.entropy_drop = 0.2 + rnd_unit() * 0.6;
    c.logit_ceiling = 30 + rnd_unit() * 200;
    return c;
}

/* ---- hysteresis ---------------------------------------------------------------------------------- */

START_TEST(test_exact_hysteresis)
{
    for (int trial = 0; trial < 50; trial++) {
        alerts_config c = random_config();
        alerts_engine *e = new_engine(&c);
        for (int r = 1; r <= ALERTS_NRULES; r++) {
            alerts_rule rule = (alerts_rule)r;
            int64_t run = 1 + r;
            double base = 0.5 + rnd_unit() * 4;
            int64_t step = warm(e, run, 3, 7, base, &c, 0);
            alerts_transition t[ALERTS_NRULES];
            uint32_t need = rule == ALERTS_NONFINITE ? 1 : c.raise_after;
            /* need - 1 bad samples: nothing */
            for (uint32_t i = 0; i + 1 < need; i++) {
                stats_head h = spiked(base, rule, &c);
                ck_assert_int_eq(observe(e, run, 3, 7, step++, &h, t), 0);
            }
            ck_assert_int_eq(alerts_active(e, run, NULL, 0), 0);
            /* the need-th: raised, once */
            stats_head h = spiked(base, rule, &c);
            ck_assert_int_eq(observe(e, run, 3, 7, step, &h, t), 1);
            ck_assert_int_eq(t[0].rule, rule);
            ck_assert_int_eq(t[0].state, ALERTS_RAISED);
            ck_assert_uint_eq(t[0].streak, need);
            int64_t raised_step = step++;
            switch (rule) {
            case ALERTS_ENTROPY_FLOOR:
                ck_assert(t[0].value == h.entropy_norm_mean && t[0].threshold == c.entropy_floor);
                break;
            case ALERTS_ENTROPY_DROP:
                ck_assert(t[0].value == h.entropy_mean && t[0].value < t[0].threshold);
                ck_assert(fabs(t[0].threshold - (1 - c.entropy_drop) * base) <
                          0.02 * base * (1 - c.entropy_drop));
                break;
            case ALERTS_LOGIT_CEILING:
                ck_assert(t[0].value == h.max_logit && t[0].threshold == c.logit_ceiling);
                break;
            case ALERTS_NONFINITE:
                ck_assert(t[0].value == (double)h.nonfinite_rows && t[0].threshold == 0);
                break;
            }
            /* staying bad repeats nothing */
            int more = (int)rnd_range(0, 5);
            for (int i = 0; i < more; i++) {
                h = spiked(base, rule, &c);
                ck_assert_int_eq(observe(e, run, 3, 7, step++, &h, t), 0);
            }
            alerts_transition act[8];
            ck_assert_int_eq(alerts_active(e, run, act, 8), 1);
            ck_assert_int_eq(act[0].rule, rule);
            ck_assert_int_eq(act[0].step, raised_step);
            /* clear_after - 1 good: still raised; a bad one in between restarts the count */
            for (uint32_t i = 0; i + 1 < c.clear_after; i++) {
                h = healthy(base);
                ck_assert_int_eq(observe(e, run, 3, 7, step++, &h, t), 0);
            }
            if (c.clear_after > 1) {
                h = spiked(base, rule, &c);
                ck_assert_int_eq(observe(e, run, 3, 7, step++, &h, t), 0);
                for (uint32_t i = 0; i + 1 < c.clear_after; i++) {
                    h = healthy(base);
                    ck_assert_int_eq(observe(e, run, 3, 7, step++, &h, t), 0);
                }
            }
            ck_assert_int_eq(alerts_active(e, run, NULL, 0), 1);
            h = healthy(base);
            ck_assert_int_eq(observe(e, run, 3, 7, step, &h, t), 1);
            ck_assert_int_eq(t[0].rule, rule);
            ck_assert_int_eq(t[0].state, ALERTS_CLEARED);
            ck_assert_uint_eq(t[0].streak, c.clear_after);
            ck_assert_int_eq(alerts_active(e, run, NULL, 0), 0);
            /* and a raise needs the full streak again, broken streaks do not add up */
            if (need > 1) {
                for (int rep = 0; rep < 3; rep++) {
                    for (uint32_t i = 0; i + 1 < need; i++) {
                        h = spiked(base, rule, &c);
                        ck_assert_int_eq(observe(e, run, 3, 7, ++step, &h, t), 0);
                    }
                    h = healthy(base);
                    ck_assert_int_eq(observe(e, run, 3, 7, ++step, &h, t), 0);
                }
            }
        }
        alerts_free(e);
    }
}
END_TEST

START_TEST(test_spike_raises_only_its_rule)
{
    alerts_config c = random_config();
    alerts_engine *e = new_engine(&c);
    enum { LAYERS = 4, HEADS = 8 };
    double base[LAYERS][HEADS];
    for (int l = 0; l < LAYERS; l++)
        for (int h = 0; h < HEADS; h++)
            base[l][h] = 0.3 + rnd_unit() * 5;
    int64_t step = 0;
    alerts_transition t[ALERTS_NRULES];
    /* stable: nothing fires */
    for (uint32_t s = 0; s < c.ema_warmup + 20; s++, step++)
        for (int l = 0; l < LAYERS; l++)
            for (int h = 0; h < HEADS; h++) {
                stats_head x = healthy(base[l][h]);
                ck_assert_int_eq(observe(e, 1, l, h, step, &x, t), 0);
            }
    for (int spike = 0; spike < 40; spike++) {
        alerts_rule rule = (alerts_rule)rnd_range(1, ALERTS_NRULES);
        int sl = (int)rnd_range(0, LAYERS - 1), sh = (int)rnd_range(0, HEADS - 1);
        uint32_t len = (rule == ALERTS_NONFINITE ? 1 : c.raise_after) + (uint32_t)rnd_range(0, 4);
        int raised = 0, cleared = 0;
        for (uint32_t s = 0; s < len + c.clear_after + 3; s++, step++) {
            for (int l = 0; l < LAYERS; l++)
                for (int h = 0; h < HEADS; h++) {
                    int here = l == sl && h == sh;
                    stats_head x = here && s < len ? spiked(base[l][h], rule, &c)
                                                   : healthy(base[l][h]);
                    int n = observe(e, 1, l, h, step, &x, t);
                    if (!here) {
                        ck_assert_msg(n == 0, "spike %d (%s at %d/%d) fired %s at %d/%d", spike,
                                      alerts_rule_name(rule), sl, sh, alerts_rule_name(t[0].rule),
                                      l, h);
                        continue;
                    }
                    for (int i = 0; i < n; i++) {
                        ck_assert_msg(t[i].rule == rule, "spike of %s fired %s",
                                      alerts_rule_name(rule), alerts_rule_name(t[i].rule));
                        if (t[i].state == ALERTS_RAISED)
                            raised++;
                        else
                            cleared++;
                    }
                }
        }
        ck_assert_int_eq(raised, 1);
        ck_assert_int_eq(cleared, 1);
        ck_assert_int_eq(alerts_active(e, 0, NULL, 0), 0);
    }
    alerts_free(e);
}
END_TEST

START_TEST(test_per_run_overrides)
{
    alerts_config c;
    alerts_config_default(&c);
    alerts_engine *e = new_engine(&c);
    char err[256];
    alerts_overrides o = {.has_logit_ceiling = 1, .logit_ceiling = 20 + rnd_unit() * 20,
                          .has_raise_after = 1, .raise_after = (uint32_t)rnd_range(1, 6)};
    ck_assert_int_eq(alerts_set_run(e, 7, &o, err, sizeof err), ALERTS_OK);
    alerts_config got;
    alerts_run_config(e, 7, &got);
    ck_assert(got.logit_ceiling == o.logit_ceiling && got.raise_after == o.raise_after);
    ck_assert(got.entropy_floor == c.entropy_floor && got.clear_after == c.clear_after);
    alerts_run_config(e, 8, &got);
    ck_assert(got.logit_ceiling == c.logit_ceiling && got.raise_after == c.raise_after);

    /* logits between the two ceilings: only run 7 raises, after its own raise_after */
    alerts_transition t[ALERTS_NRULES];
    int raised7 = 0, raised8 = 0;
    for (uint32_t s = 0; s < 20; s++) {
        stats_head h = healthy(2);
        h.max_logit = o.logit_ceiling + 1 + rnd_unit() * 30; /* < 100 */
        int n7 = observe(e, 7, 0, 0, s, &h, t);
        if (n7) {
            ck_assert_int_eq(n7, 1);
            ck_assert_int_eq(t[0].rule, ALERTS_LOGIT_CEILING);
            ck_assert(t[0].threshold == o.logit_ceiling);
            ck_assert_uint_eq(s + 1, o.raise_after);
            raised7++;
        }
        raised8 += observe(e, 8, 0, 0, s, &h, t);
    }
    ck_assert_int_eq(raised7, 1);
    ck_assert_int_eq(raised8, 0);

    /* bad overrides are refused and change nothing */
    alerts_overrides bad[] = {
        {.has_entropy_floor = 1, .entropy_floor = 1.5},
        {.has_entropy_drop = 1, .entropy_drop = 1.0},
        {.has_ema_alpha = 1, .ema_alpha = 0},
        {.has_logit_ceiling = 1, .logit_ceiling = NAN},
        {.has_raise_after = 1, .raise_after = 0},
        {.has_clear_after = 1, .clear_after = 0},
        {.has_ema_warmup = 1, .ema_warmup = 0},
    };
    const char *names[] = {"entropy_floor", "entropy_drop", "ema_alpha", "logit_ceiling",
                           "raise_after", "clear_after", "ema_warmup"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        err[0] = 0;
        ck_assert_int_eq(alerts_set_run(e, 7, &bad[i], err, sizeof err), ALERTS_EINVAL);
        ck_assert_msg(strstr(err, names[i]), "message: %s", err);
    }
    alerts_run_config(e, 7, &got);
    ck_assert(got.logit_ceiling == o.logit_ceiling);
    ck_assert_int_eq(alerts_set_run(e, 0, &o, err, sizeof err), ALERTS_EINVAL);
    /* back to the defaults */
    ck_assert_int_eq(alerts_set_run(e, 7, NULL, err, sizeof err), ALERTS_OK);
    alerts_run_config(e, 7, &got);
    ck_assert(got.logit_ceiling == c.logit_ceiling);
    alerts_free(e);
}
END_TEST

START_TEST(test_empty_and_nan_samples)
{
    alerts_config c = random_config();
    if (c.raise_after < 2)
        c.raise_after = 2;
    alerts_engine *e = new_engine(&c);
    alerts_transition t[ALERTS_NRULES];
    /* a head that only ever had empty samples has no state */
    stats_head z = empty_head(0);
    for (int i = 0; i < 10; i++)
        ck_assert_int_eq(observe(e, 1, 0, 0, i, &z, t), 0);
    ck_assert_uint_eq(alerts_heads(e), 0);

    int64_t step = warm(e, 1, 0, 1, 2.0, &c, 0);
    /* raise_after - 1 bad floor samples, then empty and NaN ones: they neither count nor break
     * the streak; then one more bad raises */
    for (uint32_t i = 0; i + 1 < c.raise_after; i++) {
        stats_head h = spiked(2.0, ALERTS_ENTROPY_FLOOR, &c);
        ck_assert_int_eq(observe(e, 1, 0, 1, step++, &h, t), 0);
        int gaps = (int)rnd_range(0, 4);
        for (int g = 0; g < gaps; g++) {
            stats_head x = empty_head(0);
            ck_assert_int_eq(observe(e, 1, 0, 1, step++, &x, t), 0);
            x = healthy(2.0);
            x.entropy_norm_mean = NAN; /* rows_norm == 0: the floor has nothing to judge */
            x.rows_norm = 0;
            ck_assert_int_eq(observe(e, 1, 0, 1, step++, &x, t), 0);
        }
    }
    stats_head h = spiked(2.0, ALERTS_ENTROPY_FLOOR, &c);
    ck_assert_int_eq(observe(e, 1, 0, 1, step++, &h, t), 1);
    ck_assert_int_eq(t[0].rule, ALERTS_ENTROPY_FLOOR);
    ck_assert_int_eq(t[0].state, ALERTS_RAISED);
    /* empty samples do not clear it either */
    for (uint32_t i = 0; i < c.clear_after + 3; i++) {
        stats_head x = empty_head(0);
        ck_assert_int_eq(observe(e, 1, 0, 1, step++, &x, t), 0);
    }
    ck_assert_int_eq(alerts_active(e, 1, NULL, 0), 1);

    /* a head whose every row is non-finite (rows == 0): NONFINITE and nothing else */
    step = warm(e, 1, 0, 2, 1.0, &c, step);
    stats_head nf = empty_head(rnd_range(1, 64));
    ck_assert_int_eq(observe(e, 1, 0, 2, step++, &nf, t), 1);
    ck_assert_int_eq(t[0].rule, ALERTS_NONFINITE);
    ck_assert(t[0].value == (double)nf.nonfinite_rows);
    /* the drop baseline never saw those samples: healthy values are still healthy */
    for (uint32_t i = 0; i < c.clear_after; i++) {
        stats_head x = healthy(1.0);
        int n = observe(e, 1, 0, 2, step++, &x, t);
        ck_assert_int_eq(n, i + 1 == c.clear_after ? 1 : 0);
        if (n)
            ck_assert(t[0].rule == ALERTS_NONFINITE && t[0].state == ALERTS_CLEARED);
    }
    /* bad arguments */
    ck_assert_int_eq(alerts_observe(e, 0, 0, 0, 0, &h, t), -1);
    ck_assert_int_eq(alerts_observe(e, 1, -1, 0, 0, &h, t), -1);
    ck_assert_int_eq(alerts_observe(e, 1, 0, -1, 0, &h, t), -1);
    ck_assert_int_eq(alerts_observe(e, 1, 0, 0, 0, NULL, t), -1);
    alerts_free(e);
}
END_TEST

START_TEST(test_drop_baseline)
{
    /* A slow drift is followed by the baseline; a sudden fall is not. */
    alerts_config c;
    alerts_config_default(&c);
    alerts_engine *e = new_engine(&c);
    alerts_transition t[ALERTS_NRULES];
    double v = 3.0;
    int64_t step = 0;
    for (int i = 0; i < 400; i++) { /* -0.5% per sample: ends at ~13% of the start */
        stats_head h = healthy(v);
        ck_assert_int_eq(observe(e, 1, 0, 0, step++, &h, t), 0);
        v *= 0.995;
    }
    int fired = 0;
    for (uint32_t i = 0; i < c.raise_after; i++) {
        stats_head h = healthy(v * 0.3);
        int n = observe(e, 1, 0, 0, step++, &h, t);
        if (n) {
            ck_assert_int_eq(t[0].rule, ALERTS_ENTROPY_DROP);
            fired = 1;
            ck_assert_uint_eq(i + 1, c.raise_after);
        }
    }
    ck_assert(fired);
    /* warm-up: a fresh head that falls right away is not judged before ema_warmup samples */
    for (uint32_t i = 0; i < c.ema_warmup; i++) {
        stats_head h = healthy(i < 2 ? 3.0 : 0.3);
        ck_assert_int_eq(observe(e, 2, 0, 0, i, &h, t), 0);
    }
    alerts_free(e);
}
END_TEST

/* ---- restore after a restart ---------------------------------------------------------------------- */

START_TEST(test_restore)
{
    alerts_config c;
    alerts_config_default(&c);
    c.raise_after = 3;
    c.clear_after = 2;
    alerts_engine *e = new_engine(&c);
    alerts_transition t[ALERTS_NRULES], act[8];

    ck_assert_int_eq(alerts_restore(e, 1, 0, 0, ALERTS_LOGIT_CEILING, 10, 150, 100), ALERTS_OK);
    ck_assert_int_eq(alerts_restore(e, 1, 0, 0, ALERTS_LOGIT_CEILING, 11, 160, 100), ALERTS_OK);
    ck_assert_uint_eq(alerts_heads(e), 1);
    ck_assert_uint_eq(alerts_run_heads(e, 1), 1);
    ck_assert_uint_eq(alerts_active(e, 1, act, 8), 1);
    ck_assert_int_eq(act[0].rule, ALERTS_LOGIT_CEILING);
    ck_assert_int_eq(act[0].state, ALERTS_RAISED);
    ck_assert_int_eq(act[0].step, 10); /* a second restore leaves the raised one as it is */
    ck_assert(act[0].value == 150 && act[0].threshold == 100);

    /* Still bad: not raised again. Then clear_after good samples clear it, once. */
    stats_head bad = spiked(3.0, ALERTS_LOGIT_CEILING, &c);
    ck_assert_int_eq(observe(e, 1, 0, 0, 12, &bad, t), 0);
    stats_head h = healthy(3.0);
    ck_assert_int_eq(observe(e, 1, 0, 0, 13, &h, t), 0);
    ck_assert_int_eq(observe(e, 1, 0, 0, 14, &h, t), 1);
    ck_assert_int_eq(t[0].rule, ALERTS_LOGIT_CEILING);
    ck_assert_int_eq(t[0].state, ALERTS_CLEARED);
    ck_assert_uint_eq(t[0].streak, 2);
    ck_assert_uint_eq(alerts_active(e, 1, NULL, 0), 0);
    ck_assert_int_eq(observe(e, 1, 0, 0, 15, &h, t), 0);

    /* ENTROPY_DROP: the baseline comes back from the threshold and is judged at once. */
    ck_assert_int_eq(alerts_restore(e, 1, 0, 1, ALERTS_ENTROPY_DROP, 20, 0.3,
                                    (1 - c.entropy_drop) * 3.0),
                     ALERTS_OK);
    stats_head low = healthy(0.3);
    ck_assert_int_eq(observe(e, 1, 0, 1, 21, &low, t), 0);
    ck_assert_int_eq(observe(e, 1, 0, 1, 22, &h, t), 0);
    ck_assert_int_eq(observe(e, 1, 0, 1, 23, &h, t), 1);
    ck_assert_int_eq(t[0].rule, ALERTS_ENTROPY_DROP);
    ck_assert_int_eq(t[0].state, ALERTS_CLEARED);

    /* NONFINITE restored; the other rules of that head start fresh. */
    ck_assert_int_eq(alerts_restore(e, 1, 3, 0, ALERTS_NONFINITE, 30, 4, 0), ALERTS_OK);
    ck_assert_int_eq(observe(e, 1, 3, 0, 31, &h, t), 0);
    ck_assert_int_eq(observe(e, 1, 3, 0, 32, &h, t), 1);
    ck_assert_int_eq(t[0].rule, ALERTS_NONFINITE);

    /* Bad arguments. */
    ck_assert_int_eq(alerts_restore(e, 0, 0, 0, ALERTS_LOGIT_CEILING, 0, 1, 1), ALERTS_EINVAL);
    ck_assert_int_eq(alerts_restore(e, 1, -1, 0, ALERTS_LOGIT_CEILING, 0, 1, 1), ALERTS_EINVAL);
    ck_assert_int_eq(alerts_restore(e, 1, 0, -1, ALERTS_LOGIT_CEILING, 0, 1, 1), ALERTS_EINVAL);
    ck_assert_int_eq(alerts_restore(e, 1, 0, 0, (alerts_rule)0, 0, 1, 1), ALERTS_EINVAL);
    ck_assert_int_eq(alerts_restore(e, 1, 0, 0, (alerts_rule)5, 0, 1, 1), ALERTS_EINVAL);
    ck_assert_int_eq(alerts_restore(e, 1, 9, 9, ALERTS_ENTROPY_DROP, 0, 1, NAN), ALERTS_EINVAL);
    ck_assert_uint_eq(alerts_heads(e), 3);

    /* Limits: a new head past them is not restored and not counted as refused. */
    alerts_limits lim;
    alerts_limits_default(&lim);
    lim.max_heads_per_run = 1;
    lim.max_heads = 4;
    ck_assert_int_eq(alerts_set_limits(e, &lim, NULL, 0), ALERTS_OK);
    ck_assert_int_eq(alerts_restore(e, 2, 0, 0, ALERTS_ENTROPY_FLOOR, 1, 0.01, 0.1), ALERTS_OK);
    ck_assert_int_eq(alerts_restore(e, 2, 0, 1, ALERTS_ENTROPY_FLOOR, 1, 0.01, 0.1), ALERTS_ELIMIT);
    ck_assert_int_eq(alerts_restore(e, 3, 0, 0, ALERTS_ENTROPY_FLOOR, 1, 0.01, 0.1), ALERTS_ELIMIT);
    ck_assert_int_eq(alerts_restore(e, 2, 0, 0, ALERTS_LOGIT_CEILING, 1, 200, 100), ALERTS_OK);
    ck_assert_uint_eq(alerts_heads(e), 4);
    ck_assert_uint_eq(alerts_active(e, 2, NULL, 0), 2);
    ck_assert_uint_eq(alerts_refused(e, 0), 0);
    alerts_free(e);
}
END_TEST

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

/* ---- config ------------------------------------------------------------------------------------- */

START_TEST(test_config)
{
    alerts_config c;
    alerts_config_default(&c);
    char err[256] = "";
    ck_assert_int_eq(alerts_config_check(&c, err, sizeof err), ALERTS_OK);
    ck_assert(c.logit_ceiling == 100.0);
    ck_assert(c.entropy_floor == 0.1);
    alerts_config bad = c;
    bad.entropy_floor = -0.01;
    ck_assert_int_eq(alerts_config_check(&bad, err, sizeof err), ALERTS_EINVAL);
    ck_assert_msg(strstr(err, "entropy_floor") && strstr(err, "[0, 1]"), "%s", err);
    bad = c;
    bad.logit_ceiling = INFINITY;
    ck_assert_int_eq(alerts_config_check(&bad, err, sizeof err), ALERTS_EINVAL);
    ck_assert_ptr_null(alerts_new(&bad, err, sizeof err));
    ck_assert_msg(strstr(err, "logit_ceiling"), "%s", err);
    ck_assert_int_eq(alerts_config_check(NULL, NULL, 0), ALERTS_EINVAL);

    char json[512];
    ck_assert_int_lt(alerts_config_format(&c, json, sizeof json), (int)sizeof json);
    ck_assert_msg(strstr(json, "\"logit_ceiling\":100") && strstr(json, "\"raise_after\":3"),
                  "%s", json);

    for (int r = 1; r <= ALERTS_NRULES; r++)
        ck_assert_int_eq(alerts_rule_from_name(alerts_rule_name((alerts_rule)r)), r);
    ck_assert_int_eq(alerts_rule_from_name("nope"), 0);
    ck_assert_str_eq(alerts_rule_name(ALERTS_LOGIT_CEILING), "logit_ceiling");
    ck_assert_str_eq(alerts_state_name(ALERTS_CLEARED), "cleared");

    alerts_transition t = {.run_id = 3, .layer = 2, .head = 7, .step = 1200,
                           .rule = ALERTS_ENTROPY_FLOOR, .state = ALERTS_RAISED,
                           .value = 0.041, .threshold = 0.1, .streak = 3};
    char msg[256];
    alerts_format(&t, msg, sizeof msg);
    ck_assert_msg(strstr(msg, "entropy_floor raised") && strstr(msg, "layer 2 head 7") &&
                      strstr(msg, "step 1200") && strstr(msg, "0.041"),
                  "%s", msg);
}
END_TEST

static Suite *make_alerts_suite(void)
{
    Suite *s = suite_create("alerts");
    TCase *tc = tcase_create("rules");
    tcase_add_checked_fixture(tc, setup, NULL);
    tcase_add_test(tc, test_exact_hysteresis);
    tcase_add_test(tc, test_spike_raises_only_its_rule);
    tcase_add_test(tc, test_per_run_overrides);
    tcase_add_test(tc, test_empty_and_nan_samples);
    tcase_add_test(tc, test_drop_baseline);
    tcase_add_test(tc, test_restore);
    suite_add_tcase(s, tc);
    tc = tcase_create("engine");
    tcase_add_checked_fixture(tc, setup, NULL);
    tcase_add_test(tc, test_many_heads_no_growth);
    tcase_add_test(tc, test_forget_run);
    tcase_add_test(tc, test_config);
    tcase_add_test(tc, test_run_cap_spares_other_runs);
    tcase_add_test(tc, test_limits_against_model);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    const char *env = getenv("ATTNSTAT_TEST_SEED");
    g_seed = env && *env ? strtoull(env, NULL, 10)
                         : ((uint64_t)time(NULL) * 6364136223846793005ULL) ^ (uint64_t)getpid();
    printf("test_alerts: seed %" PRIu64 " (ATTNSTAT_TEST_SEED=%" PRIu64 " to replay)\n", g_seed,
           g_seed);
    fflush(stdout);
    SRunner *sr = srunner_create(make_alerts_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
