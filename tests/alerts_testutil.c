/* alerts_testutil.c — what the alert engine's suite (test_alerts.c, test_alerts_limits.c) shares:
 * the seeded generator, sample heads (healthy, spiked for one rule, empty), an engine, checked
 * observation, a warmed-up head and random thresholds. */
#include "alerts_testutil.h"

#include <check.h>
#include <math.h>
#include <string.h>

uint64_t g_seed;
static uint64_t rng_state;

uint64_t rnd(void)
{
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return rng_state * 0x2545F4914F6CDD1DULL;
}

double rnd_unit(void)
{
    return (double)(rnd() >> 11) / 9007199254740992.0;
}

int64_t rnd_range(int64_t lo, int64_t hi)
{
    return lo + (int64_t)(rnd() % (uint64_t)(hi - lo + 1));
}

void setup(void)
{
    rng_state = g_seed ^ 0xD1B54A32D192ED03ULL;
    if (!rng_state)
        rng_state = 1;
}

/* A healthy head: entropy around base (nats, +-1%), normalised entropy well above any floor, max
 * logit, sink mass well under any ceiling, distance well over any floor (of random_config()),
 * every row finite. */
stats_head healthy(double base)
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
    h.sink_mass = 0.05 + rnd_unit() * 0.3;   /* under any ceiling of random_config() */
    h.distance = 20 + rnd_unit() * 200;      /* over any floor of random_config() */
    return h;
}

/* The same head made bad for one rule only. */
stats_head spiked(double base, alerts_rule rule, const alerts_config *c)
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
    case ALERTS_SINK_MASS_CEILING: /* a mass over the ceiling, at most 1 */
        h.sink_mass = c->sink_mass_ceiling + (1 - c->sink_mass_ceiling) * (0.01 + 0.99 * rnd_unit());
        break;
    case ALERTS_DISTANCE_FLOOR: /* a distance under the floor, at least 0 */
        h.distance = c->distance_floor * rnd_unit() * 0.99;
        break;
    }
    return h;
}

stats_head empty_head(int64_t nonfinite)
{
    stats_head h;
    memset(&h, 0, sizeof h);
    h.rows = 0;
    h.rows_empty = 10;
    h.nonfinite_rows = nonfinite;
    h.entropy_mean = h.entropy_std = h.entropy_min = h.entropy_max = NAN;
    h.entropy_norm_mean = h.collapsed_frac = NAN;
    h.max_logit = -INFINITY;
    h.sink_mass = h.distance = NAN;
    return h;
}

alerts_engine *new_engine(const alerts_config *c)
{
    char err[256] = "";
    alerts_engine *e = alerts_new(c, err, sizeof err);
    ck_assert_msg(e != NULL, "alerts_new: %s", err);
    return e;
}

int observe(alerts_engine *e, int64_t run, int32_t layer, int32_t head, int64_t step,
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
int64_t warm(alerts_engine *e, int64_t run, int32_t layer, int32_t head, double base,
                    const alerts_config *c, int64_t step)
{
    alerts_transition t[ALERTS_NRULES];
    for (uint32_t i = 0; i < c->ema_warmup + 5; i++) {
        stats_head h = healthy(base);
        ck_assert_int_eq(observe(e, run, layer, head, step++, &h, t), 0);
    }
    return step;
}

alerts_config random_config(void)
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
    c.sink_mass_ceiling = 0.5 + rnd_unit() * 0.45; /* on: under 1 */
    c.distance_floor = 1 + rnd_unit() * 15;        /* on: over 0 */
    return c;
}

