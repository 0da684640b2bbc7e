/* test_alerts.c — Check suite for daemon/alerts: exact hysteresis of every rule, a spike injected
 * into a stable random series raising only its rule (sink_mass_ceiling and distance_floor too),
 * per-run overrides, samples that say nothing (NaN sink mass and distance too; both rules off at
 * their defaults),
 * steady-state observation without allocation, forgetting runs, config bounds, the per-run and
 * engine limits on states (a run past its cap leaves other runs' alerts alone). The memory and
 * limits tests are in test_alerts_limits.c, the helpers they share in alerts_testutil.c.
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

#include "alerts_testutil.h"
#include "stats_testutil.h"

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
            case ALERTS_SINK_MASS_CEILING:
                ck_assert(t[0].value == h.sink_mass && t[0].threshold == c.sink_mass_ceiling);
                ck_assert(t[0].value > t[0].threshold && t[0].value <= 1);
                break;
            case ALERTS_DISTANCE_FLOOR:
                ck_assert(t[0].value == h.distance && t[0].threshold == c.distance_floor);
                ck_assert(t[0].value < t[0].threshold && t[0].value >= 0);
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

    /* The rules on sink mass and distance restore like the others (a run stored with them on):
     * raised, not raised again, cleared together by clear_after good samples. */
    ck_assert_int_eq(alerts_restore(e, 1, 3, 0, ALERTS_SINK_MASS_CEILING, 40, 0.9, 0.8), ALERTS_OK);
    ck_assert_int_eq(alerts_restore(e, 1, 3, 0, ALERTS_DISTANCE_FLOOR, 40, 1.5, 4), ALERTS_OK);
    ck_assert_uint_eq(alerts_active(e, 1, NULL, 0), 2);
    ck_assert_int_eq(observe(e, 1, 3, 0, 41, &h, t), 0);
    ck_assert_int_eq(observe(e, 1, 3, 0, 42, &h, t), 2);
    ck_assert(t[0].rule == ALERTS_SINK_MASS_CEILING && t[0].state == ALERTS_CLEARED);
    ck_assert(t[1].rule == ALERTS_DISTANCE_FLOOR && t[1].state == ALERTS_CLEARED);
    ck_assert_uint_eq(alerts_active(e, 1, NULL, 0), 0);

    /* Bad arguments. */
    ck_assert_int_eq(alerts_restore(e, 0, 0, 0, ALERTS_LOGIT_CEILING, 0, 1, 1), ALERTS_EINVAL);
    ck_assert_int_eq(alerts_restore(e, 1, -1, 0, ALERTS_LOGIT_CEILING, 0, 1, 1), ALERTS_EINVAL);
    ck_assert_int_eq(alerts_restore(e, 1, 0, -1, ALERTS_LOGIT_CEILING, 0, 1, 1), ALERTS_EINVAL);
    ck_assert_int_eq(alerts_restore(e, 1, 0, 0, (alerts_rule)0, 0, 1, 1), ALERTS_EINVAL);
    ck_assert_int_eq(alerts_restore(e, 1, 0, 0, (alerts_rule)(ALERTS_NRULES + 1), 0, 1, 1),
                     ALERTS_EINVAL);
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

/* ---- sink mass and distance ------------------------------------------------------------------- */

/* At the table's defaults (sink_mass_ceiling 1, distance_floor 0) the two rules never fire on any
 * finite value a head can have: a mass in [0, 1], a distance >= 0, the bounds themselves too. */
START_TEST(test_new_rules_off_by_default)
{
    alerts_config c;
    alerts_config_default(&c);
    ck_assert(c.sink_mass_ceiling == 1.0 && c.distance_floor == 0.0);
    alerts_engine *e = new_engine(&c);
    alerts_transition t[ALERTS_NRULES];
    int64_t step = warm(e, 1, 0, 0, 2.0, &c, 0);
    for (int i = 0; i < 400; i++, step++) {
        stats_head h = healthy(2.0);
        switch (i % 4) {
        case 0: h.sink_mass = 1.0, h.distance = 0.0; break; /* the bounds */
        case 1: h.sink_mass = rnd_unit(), h.distance = rnd_unit() * 1e-6; break;
        case 2: h.sink_mass = 1.0 - rnd_unit() * 1e-12, h.distance = rnd_unit() * 1e6; break;
        default: h.sink_mass = 0.0, h.distance = 1e-300; break;
        }
        ck_assert_msg(observe(e, 1, 0, 0, step, &h, t) == 0, "sample %d (sink_mass %.17g, "
                      "distance %.17g) fired %s", i, h.sink_mass, h.distance,
                      alerts_rule_name(t[0].rule));
    }
    alerts_free(e);
}
END_TEST

/* A NaN sink mass or distance (a producer that does not compute it, a head without rows) says
 * nothing for its rule: neither bad nor good; the streaks go on across it. */
START_TEST(test_new_rules_nan_says_nothing)
{
    alerts_config c = random_config();
    if (c.raise_after < 2)
        c.raise_after = 2;
    alerts_engine *e = new_engine(&c);
    alerts_transition t[ALERTS_NRULES];
    int64_t step = warm(e, 1, 0, 0, 2.0, &c, 0);
    /* raise_after - 1 samples bad for both, NaN ones between: no raise */
    for (uint32_t i = 0; i + 1 < c.raise_after; i++) {
        stats_head h = spiked(2.0, ALERTS_SINK_MASS_CEILING, &c);
        h.distance = spiked(2.0, ALERTS_DISTANCE_FLOOR, &c).distance;
        ck_assert_int_eq(observe(e, 1, 0, 0, step++, &h, t), 0);
        for (int g = (int)rnd_range(1, 4); g > 0; g--) {
            stats_head x = healthy(2.0);
            x.sink_mass = x.distance = NAN;
            ck_assert_int_eq(observe(e, 1, 0, 0, step++, &x, t), 0);
        }
    }
    /* the raise_after-th bad one raises both, in the table's order */
    stats_head h = spiked(2.0, ALERTS_SINK_MASS_CEILING, &c);
    h.distance = spiked(2.0, ALERTS_DISTANCE_FLOOR, &c).distance;
    ck_assert_int_eq(observe(e, 1, 0, 0, step++, &h, t), 2);
    ck_assert(t[0].rule == ALERTS_SINK_MASS_CEILING && t[0].state == ALERTS_RAISED &&
              t[0].value == h.sink_mass && t[0].threshold == c.sink_mass_ceiling);
    ck_assert(t[1].rule == ALERTS_DISTANCE_FLOOR && t[1].state == ALERTS_RAISED &&
              t[1].value == h.distance && t[1].threshold == c.distance_floor);
    ck_assert_uint_eq(t[0].streak, c.raise_after);
    /* NaN samples do not clear them, whatever their number */
    for (uint32_t i = 0; i < c.clear_after + 5; i++) {
        stats_head x = healthy(2.0);
        x.sink_mass = x.distance = NAN;
        ck_assert_int_eq(observe(e, 1, 0, 0, step++, &x, t), 0);
    }
    ck_assert_uint_eq(alerts_active(e, 1, NULL, 0), 2);
    /* clear_after good ones (NaN ones between) clear both, on the last */
    for (uint32_t i = 0; i < c.clear_after; i++) {
        stats_head x = healthy(2.0);
        int n = observe(e, 1, 0, 0, step++, &x, t);
        ck_assert_int_eq(n, i + 1 == c.clear_after ? 2 : 0);
        x.sink_mass = x.distance = NAN;
        ck_assert_int_eq(observe(e, 1, 0, 0, step++, &x, t), 0);
    }
    ck_assert_uint_eq(alerts_active(e, 1, NULL, 0), 0);
    alerts_free(e);
}
END_TEST

/* ---- config ------------------------------------------------------------------------------------- */

START_TEST(test_config)
{
    tu_rng rng = {tu_seed()};
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

    /* the runs table's text, read back by key: every threshold, of random values */
    alerts_config x = c;
    x.entropy_floor = tu_uniform(&rng) * 0.9 + 0.01;
    x.entropy_drop = tu_uniform(&rng) * 0.8 + 0.1;
    x.ema_alpha = tu_uniform(&rng) * 0.5 + 0.01;
    x.ema_warmup = 1 + (uint32_t)(tu_uniform(&rng) * 100);
    x.logit_ceiling = 10.0 + tu_uniform(&rng) * 1000.0;
    x.raise_after = 1 + (uint32_t)(tu_uniform(&rng) * 9);
    x.clear_after = 1 + (uint32_t)(tu_uniform(&rng) * 9);
    x.sink_mass_ceiling = 0.05 + tu_uniform(&rng) * 0.9;
    x.distance_floor = tu_uniform(&rng) * 100.0;
    int len = alerts_config_format(&x, json, sizeof json);
    ck_assert_int_eq(len, (int)strlen(json));
    /* the text as rows written before the table hold it, byte for byte, then the new keys */
    char old[512], want[512];
    snprintf(old, sizeof old,
             "{\"entropy_floor\":%.17g,\"entropy_drop\":%.17g,\"ema_alpha\":%.17g,"
             "\"ema_warmup\":%u,\"logit_ceiling\":%.17g,\"raise_after\":%u,\"clear_after\":%u}",
             x.entropy_floor, x.entropy_drop, x.ema_alpha, (unsigned)x.ema_warmup,
             x.logit_ceiling, (unsigned)x.raise_after, (unsigned)x.clear_after);
    snprintf(want, sizeof want, "%.*s,\"sink_mass_ceiling\":%.17g,\"distance_floor\":%.17g}",
             (int)strlen(old) - 1, old, x.sink_mass_ceiling, x.distance_floor);
    ck_assert_str_eq(json, want);
    alerts_overrides o;
    ck_assert_int_eq(alerts_config_parse(json, &o), VOCAB_NTHRESHOLDS);
    alerts_config back;
    ck_assert_int_eq(alerts_config_merge(&back, &c, &o, err, sizeof err), ALERTS_OK);
    ck_assert(memcmp(&back, &x, sizeof back) == 0);
    /* a row stored before the new thresholds: the new ones are the daemon's (here: not the
     * defaults), the others the row's */
    alerts_config daemon = c;
    daemon.sink_mass_ceiling = 0.5 + tu_uniform(&rng) * 0.4;
    daemon.distance_floor = 1.0 + tu_uniform(&rng) * 9.0;
    ck_assert_int_eq(alerts_config_parse(old, &o), 7);
    ck_assert(!o.has_sink_mass_ceiling && !o.has_distance_floor);
    ck_assert_int_eq(alerts_config_merge(&back, &daemon, &o, err, sizeof err), ALERTS_OK);
    ck_assert(back.sink_mass_ceiling == daemon.sink_mass_ceiling &&
              back.distance_floor == daemon.distance_floor);
    ck_assert(back.entropy_floor == x.entropy_floor && back.logit_ceiling == x.logit_ceiling &&
              back.clear_after == x.clear_after);
    /* the new thresholds' bounds: the table's (a mass ceiling in (0, 1], a floor >= 0) */
    alerts_config nb = c;
    nb.sink_mass_ceiling = 0.0;
    ck_assert_int_eq(alerts_config_check(&nb, err, sizeof err), ALERTS_EINVAL);
    ck_assert_msg(strstr(err, "sink_mass_ceiling") && strstr(err, "(0, 1]"), "%s", err);
    nb.sink_mass_ceiling = 1.0 + 1e-9;
    ck_assert_int_eq(alerts_config_check(&nb, err, sizeof err), ALERTS_EINVAL);
    nb = c;
    nb.distance_floor = -1e-9;
    ck_assert_int_eq(alerts_config_check(&nb, err, sizeof err), ALERTS_EINVAL);
    ck_assert_msg(strstr(err, "distance_floor") && strstr(err, "[0, "), "%s", err);
    nb.distance_floor = NAN;
    ck_assert_int_eq(alerts_config_check(&nb, err, sizeof err), ALERTS_EINVAL);
    /* a row of an older or newer daemon: a key missing stays the daemon's, one unknown ignored */
    snprintf(want, sizeof want, "{\"entropy_floor\":0.25,\"sink_mass_floor\":0.5,"
             "\"logit_ceiling\":%.17g}", x.logit_ceiling);
    ck_assert_int_eq(alerts_config_parse(want, &o), 2);
    ck_assert(o.has_entropy_floor && o.entropy_floor == 0.25 && o.has_logit_ceiling &&
              o.logit_ceiling == x.logit_ceiling && !o.has_entropy_drop && !o.has_raise_after);
    ck_assert_int_eq(alerts_config_parse("not json", &o), -1);
    ck_assert_int_eq(alerts_config_parse("{\"entropy_floor\":oops}", &o), 0);

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
                      strstr(msg, "step 1200") && strstr(msg, "0.041 < 0.1"),
                  "%s", msg);
    /* the words follow the rule's comparison: a ceiling is "over" */
    t.rule = ALERTS_SINK_MASS_CEILING, t.value = 0.93, t.threshold = 0.8;
    alerts_format(&t, msg, sizeof msg);
    ck_assert_msg(strstr(msg, "sink_mass_ceiling raised") && strstr(msg, "sink_mass 0.93 > 0.8"),
                  "%s", msg);
    t.rule = ALERTS_DISTANCE_FLOOR, t.state = ALERTS_CLEARED, t.value = 12, t.threshold = 4;
    alerts_format(&t, msg, sizeof msg);
    ck_assert_msg(strstr(msg, "distance_floor cleared") && strstr(msg, "distance 12 >= 4"),
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
    tcase_add_test(tc, test_new_rules_off_by_default);
    tcase_add_test(tc, test_new_rules_nan_says_nothing);
    suite_add_tcase(s, tc);
    tc = tcase_create("engine");
    tcase_add_checked_fixture(tc, setup, NULL);
    alerts_limits_tests(tc); /* test_alerts_limits.c */
    tcase_add_test(tc, test_config);
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
