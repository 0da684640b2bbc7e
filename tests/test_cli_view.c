/* test_cli_view.c — the attnstat CLI's views of time and of runs side by side, against databases
 * this test writes through the store with fresh random statistics and known times, and against a
 * real attnstatd:
 *   - store_time_steps across the three tiers (exact, compact, downsampled buckets) and
 *     store_step_before, at the boundaries of known times;
 *   - trend, heads and export with --since/--until: RFC 3339 at exact millisecond boundaries
 *     (inclusive, one millisecond either side), offsets, dates, relative times ('-1h', '1h',
 *     '-90m') minutes away from any sample; a window with nothing in it says so;
 *   - trend's layer summary: per bucket of steps the minimum, mean and maximum over heads and
 *     steps (and the head of each extreme), against the same computed here; bounded rows by
 *     default; --per-head every row;
 *   - diff: per (layer, head) each run's means and largest max logit over the steps both have,
 *     the differences, the order by the largest change, a head one run lacks last;
 *   - the usage errors of these options and of top's (test_cli_top.c tests top itself);
 *   - sink_mass and distance (vocab.h's newer statistics): --metric and --rule take them, the
 *     sample columns carry them, heads/job draw them, diff sorts by them; and the values written
 *     come back exactly through trend, heads, job and diff (test_new_metrics_values: needs the
 *     store's columns for them).
 * Fresh random data each run; the seed is printed (ATTNSTAT_TEST_SEED repeats a run). */
#include "daemon_harness.h"
#include "stats_testutil.h"

#include "attnstat.h"
#include "cli_harness.h"
#include "view_testutil.h"

/* ---- store_time_steps across the tiers ------------------------------------------------------*/
START_TEST(test_time_steps_tiers)
{
    dh_rng r = dh_rng_new("time_steps_tiers");
    dh_daemon d;
    dh_dir_init(&d);
    /* steps 0..59, a minute apart; then compacted (4 exact steps) and the windows of 10 steps
     * older than 30 min at T0 + 60 min downsampled: steps 0..29 in buckets, 30..~55 compact */
    int64_t id = write_run(d.db, "tiers", 0, 60, H, T0, MIN_MS, NULL, &r);
    store_error err;
    store *st = store_open(d.db, 0, &err);
    ck_assert_ptr_nonnull(st);
    store_retention pol = {4, 30 * MIN_MS, 0, 10, T0 + 60 * MIN_MS};
    store_retain_report rep;
    do
        ck_assert_msg(store_retain_step(st, &pol, 0, &rep, &err) == STORE_OK, "%s", err.msg);
    while (rep.more);
    ck_assert_int_eq(raw_count(d.db, "SELECT count(*) FROM coarse"), 3 * L);
    ck_assert_int_gt(raw_count(d.db, "SELECT count(*) FROM history"), 0);
    int64_t f = 0, t = 0, p = 0;
    struct {
        int64_t since, until, from, to; /* minutes from T0 (INT64_MIN / MAX: none) */
    } cases[] = {
        {35, INT64_MAX, 35, INT64_MAX},  /* compact tier: after 34 */
        {INT64_MIN, 58, INT64_MIN, 58},  /* exact tier */
        {15, INT64_MAX, 10, INT64_MAX},  /* bucket 10..19 stored 19 min: before 15 only 0..9 */
        {INT64_MIN, 25, INT64_MIN, 19},  /* bucket 20..29 ends 29 min: after 25 */
        {42, 42, 42, 42},                /* one step, both ends inclusive */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int64_t s = cases[i].since == INT64_MIN ? INT64_MIN : T0 + cases[i].since * MIN_MS;
        int64_t u = cases[i].until == INT64_MAX ? INT64_MAX : T0 + cases[i].until * MIN_MS;
        ck_assert_msg(store_time_steps(st, id, s, u, &f, &t, &err) == STORE_OK, "%s", err.msg);
        ck_assert_msg(f == cases[i].from && t == cases[i].to, "case %zu: %lld..%lld", i,
                      (long long)f, (long long)t);
    }
    /* one millisecond past a step's time: the window starts after it */
    ck_assert_int_eq(store_time_steps(st, id, T0 + 42 * MIN_MS + 1, INT64_MAX, &f, &t, &err),
                     STORE_OK);
    ck_assert_int_eq(f, 43);
    /* nothing stored: before the run, after it, an empty window inside it */
    ck_assert_int_eq(store_time_steps(st, id, INT64_MIN, T0 - 1, &f, &t, &err), STORE_NOTFOUND);
    ck_assert_int_eq(store_time_steps(st, id, T0 + 60 * MIN_MS, INT64_MAX, &f, &t, &err),
                     STORE_NOTFOUND);
    ck_assert_int_eq(store_time_steps(st, id, T0 + 40 * MIN_MS + 1, T0 + 41 * MIN_MS - 1, &f, &t,
                                      &err), STORE_NOTFOUND);
    ck_assert_int_eq(store_time_steps(st, id + 99, INT64_MIN, INT64_MAX, &f, &t, &err),
                     STORE_NOTFOUND);
    /* the step before: an exact, a compact and a bucketed one */
    int64_t want[][2] = {{59, 58}, {40, 39}, {30, 29}, {25, 24}, {10, 9}};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        ck_assert_int_eq(store_step_before(st, id, want[i][0], &p, &err), STORE_OK);
        ck_assert_int_eq(p, want[i][1]);
    }
    ck_assert_int_eq(store_step_before(st, id, 0, &p, &err), STORE_NOTFOUND);
    store_close(st);
    dh_cleanup(&d, 0);
}
END_TEST

/* ---- trend, heads and export in a window of time ---------------------------------------------*/
START_TEST(test_time_windows)
{
    dh_rng r = dh_rng_new("time_windows");
    dh_daemon d;
    dh_dir_init(&d);
    enum { S = 40 };
    stats_head *v = malloc(sizeof(stats_head) * S * L * H);
    ck_assert_ptr_nonnull(v);
    write_run(d.db, "clock", 0, S, H, T0, MIN_MS, v, &r);
    int layer = (int)(dh_next(&r) % L), head = (int)(dh_next(&r) % H);
    char ls[16], hs[16];
    snprintf(ls, sizeof ls, "%d", layer);
    snprintf(hs, sizeof hs, "%d", head);
    struct {
        const char *since, *until;
        int from, to; /* the steps expected */
    } cases[] = {
        {"2025-03-01T00:10:00Z", "2025-03-01T00:20:00Z", 10, 20},     /* both ends inclusive */
        {"2025-03-01T00:10:00.001Z", "2025-03-01T00:19:59.999Z", 11, 19},
        {"2025-03-01T02:10:00+02:00", "2025-02-28T19:20:00-05:00", 10, 20}, /* offsets */
        {"2025-03-01 00:33", NULL, 33, S - 1},                        /* a space, no seconds */
        {NULL, "2025-03-01T00:05:30Z", 0, 5},
        {"2025-02-28", "2025-03-01T00:00:00Z", 0, 0},                 /* a date: its midnight */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const char *args[20] = {"--db", d.db, "trend", "--run", "clock", "--layer", ls,
                                "--head", hs, "--format", "json"};
        int n = 11;
        if (cases[i].since) {
            args[n++] = "--since";
            args[n++] = cases[i].since;
        }
        if (cases[i].until) {
            args[n++] = "--until";
            args[n++] = cases[i].until;
        }
        cli_result res = cli_run_v(d.dir, args);
        CLI_OK(res);
        int64_t steps[S];
        int k = trend_steps(res.out, steps, S);
        ck_assert_msg(k == cases[i].to - cases[i].from + 1, "case %zu: %d rows", i, k);
        for (int j = 0; j < k; j++)
            ck_assert_int_eq(steps[j], cases[i].from + j);
        /* the values are the samples written */
        char *copy, *lines[S];
        json_lines(res.out, &copy, lines, S);
        for (int j = 0; j < k; j++) {
            const stats_head *w = &v[((size_t)(cases[i].from + j) * L + (size_t)layer) * H +
                                     (size_t)head];
            ck_assert(cli_json_num(lines[j], "entropy_norm_mean") == w->entropy_norm_mean);
            ck_assert(cli_json_num(lines[j], "max_logit") == w->max_logit);
        }
        free(copy);
        cli_result_free(&res);
    }
    /* a window with nothing stored: said, exit 1 */
    cli_result res = cli_run(d.dir, "--db", d.db, "trend", "--run", "clock", "--layer", ls,
                             "--since", "2025-03-01T00:10:00.001Z", "--until",
                             "2025-03-01T00:10:59Z");
    ck_assert_int_eq(res.status, 1);
    ck_assert_msg(strstr(res.err, "stored no sample from 2025-03-01T00:10:00Z to "
                                  "2025-03-01T00:10:59Z"), "%s", res.err);
    cli_result_free(&res);

    /* heads --until: the grid as it was then (step 15); --since alone: the latest step */
    res = cli_run(d.dir, "--db", d.db, "heads", "--run", "clock", "--until",
                  "2025-03-01T00:15:30Z", "--format", "json");
    CLI_OK(res);
    char *copy, *lines[L * H];
    ck_assert_int_eq(json_lines(res.out, &copy, lines, L * H), L * H);
    for (int i = 0; i < L * H; i++) {
        int l = (int)cli_json_num(lines[i], "layer"), h = (int)cli_json_num(lines[i], "head");
        ck_assert_int_eq((int)cli_json_num(lines[i], "step"), 15);
        ck_assert(cli_json_num(lines[i], "max_logit") == v[((size_t)15 * L + l) * H + h].max_logit);
    }
    free(copy);
    cli_result_free(&res);
    res = cli_run(d.dir, "--db", d.db, "heads", "--run", "clock", "--since",
                  "2025-03-01T00:15:30Z", "--format", "csv");
    CLI_OK(res);
    /* run,run_id,layer,head,step: 39 */
    ck_assert_int_eq(cli_count_text(res.out, ",39,"), L * H);
    cli_result_free(&res);

    /* export: every sample of the steps of the window, no other */
    res = cli_run(d.dir, "--db", d.db, "export", "--run", "clock", "--since",
                  "2025-03-01T00:30:00Z", "--until", "2025-03-01T00:34:00Z", "--format", "json");
    CLI_OK(res);
    ck_assert_int_eq(cli_count_lines(res.out), 5 * L * H);
    for (int s = 30; s <= 34; s++) {
        char pat[32];
        snprintf(pat, sizeof pat, "\"step\": %d,", s);
        ck_assert_int_eq(cli_count_text(res.out, pat), L * H);
    }
    cli_result_free(&res);
    free(v);
    dh_cleanup(&d, 0);
}
END_TEST

/* Relative times: samples stored 3 h, 2 h, 30 min and 10 min ago (steps 0..3), every window's
 * edge at least 20 minutes from a sample. */
START_TEST(test_relative_times)
{
    dh_rng r = dh_rng_new("relative_times");
    dh_daemon d;
    dh_dir_init(&d);
    int64_t now = wall_ms(), ago[4] = {180, 120, 30, 10};
    store_error err;
    store *st = store_open(d.db, 0, &err);
    ck_assert_ptr_nonnull(st);
    store_run_info info = {.name = "rel", .time_ms = now - 200 * MIN_MS};
    int64_t id;
    ck_assert_int_eq(store_run_begin(st, &info, &id, &err), STORE_OK);
    for (int s = 0; s < 4; s++) {
        stats_head row[H];
        for (int h = 0; h < H; h++)
            row[h] = rand_stats(&r);
        ck_assert_int_eq(store_add_samples(st, id, s, 0, row, H, now - ago[s] * MIN_MS, &err),
                         STORE_OK);
    }
    ck_assert_int_eq(store_commit(st, &err), STORE_OK);
    store_close(st);
    struct {
        const char *since, *until;
        int from, to;
    } cases[] = {{"-1h", NULL, 2, 3}, {"1h", NULL, 2, 3}, {"60m", "-20m", 2, 2},
                 {NULL, "-1h", 0, 1}, {"-150m", "-90m", 1, 1}, {"-1d", "now", 0, 3},
                 {"3600s", NULL, 2, 3}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const char *args[20] = {"--db", d.db, "trend", "--run", "rel", "--layer", "0", "--head",
                                "1", "--format", "json"};
        int n = 11;
        if (cases[i].since) {
            args[n++] = "--since";
            args[n++] = cases[i].since;
        }
        if (cases[i].until) {
            args[n++] = "--until";
            args[n++] = cases[i].until;
        }
        cli_result res = cli_run_v(d.dir, args);
        CLI_OK(res);
        int64_t steps[8];
        int k = trend_steps(res.out, steps, 8);
        ck_assert_msg(k == cases[i].to - cases[i].from + 1 && steps[0] == cases[i].from,
                      "case %zu (%s .. %s): %d rows", i, cases[i].since, cases[i].until, k);
        cli_result_free(&res);
    }
    dh_cleanup(&d, 0);
}
END_TEST

/* ---- trend's layer summary -------------------------------------------------------------------*/
START_TEST(test_trend_summary)
{
    dh_rng r = dh_rng_new("trend_summary");
    dh_daemon d;
    dh_dir_init(&d);
    enum { S = 50 };
    int first = (int)(dh_next(&r) % 1000); /* steps need not start at 0 */
    stats_head *v = malloc(sizeof(stats_head) * S * L * H);
    ck_assert_ptr_nonnull(v);
    write_run(d.db, "sum", first, S, H, T0, MIN_MS, v, &r);
    int layer = (int)(dh_next(&r) % L), nb = 3 + (int)(dh_next(&r) % 10);
    char ls[16], bs[16];
    snprintf(ls, sizeof ls, "%d", layer);
    snprintf(bs, sizeof bs, "%d", nb);
    cli_result res = cli_run(d.dir, "--db", d.db, "trend", "--run", "sum", "--layer", ls,
                             "--buckets", bs, "--format", "json");
    CLI_OK(res);
    int width = (S - 1) / nb + 1, rows = (nb - 1) * width > S - 1 ? (S - 1) / width + 1 : nb;
    char *copy, *lines[64];
    ck_assert_int_eq(json_lines(res.out, &copy, lines, 64), rows);
    for (int b = 0; b < rows; b++) {
        int lo = b * width, hi = lo + width - 1 < S - 1 ? lo + width - 1 : S - 1;
        double en_lo = INFINITY, en_hi = -INFINITY, en_sum = 0, ml_lo = INFINITY;
        double ml_hi = -INFINITY, ml_sum = 0, ent_sum = 0, col_sum = 0;
        int en_lo_h = -1, ml_hi_h = -1;
        int64_t nonfinite = 0;
        for (int s = lo; s <= hi; s++)
            for (int h = 0; h < H; h++) {
                const stats_head *x = &v[((size_t)s * L + (size_t)layer) * H + (size_t)h];
                if (x->entropy_norm_mean < en_lo) {
                    en_lo = x->entropy_norm_mean;
                    en_lo_h = h;
                }
                if (x->max_logit > ml_hi) {
                    ml_hi = x->max_logit;
                    ml_hi_h = h;
                }
                en_hi = fmax(en_hi, x->entropy_norm_mean);
                ml_lo = fmin(ml_lo, x->max_logit);
                en_sum += x->entropy_norm_mean;
                ml_sum += x->max_logit;
                ent_sum += x->entropy_mean;
                col_sum += x->collapsed_frac;
                nonfinite += x->nonfinite_rows;
            }
        double n = (double)((hi - lo + 1) * H);
        const char *x = lines[b];
        ck_assert_int_eq((int)cli_json_num(x, "step_first"), first + lo);
        ck_assert_int_eq((int)cli_json_num(x, "step_last"), first + hi);
        ck_assert_int_eq((int)cli_json_num(x, "heads"), H);
        ck_assert_int_eq((int)cli_json_num(x, "samples"), (int)n);
        ck_assert_int_eq((int)cli_json_num(x, "nonfinite_rows"), (int)nonfinite);
        ck_assert(cli_json_num(x, "entropy_norm_min") == en_lo);
        ck_assert(cli_json_num(x, "entropy_norm_max") == en_hi);
        ck_assert(cli_json_num(x, "max_logit_min") == ml_lo);
        ck_assert(cli_json_num(x, "max_logit_max") == ml_hi);
        ck_assert_int_eq((int)cli_json_num(x, "entropy_norm_min_head"), en_lo_h);
        ck_assert_int_eq((int)cli_json_num(x, "max_logit_max_head"), ml_hi_h);
        ck_assert_double_eq_tol(cli_json_num(x, "entropy_norm_mean"), en_sum / n, 1e-12);
        ck_assert_double_eq_tol(cli_json_num(x, "max_logit_mean"), ml_sum / n, 1e-10);
        ck_assert_double_eq_tol(cli_json_num(x, "entropy_mean"), ent_sum / n, 1e-12);
        ck_assert_double_eq_tol(cli_json_num(x, "collapsed_frac_mean"), col_sum / n, 1e-12);
    }
    free(copy);
    cli_result_free(&res);

    /* by default a bounded number of rows; the table ends with the sparklines */
    res = cli_run(d.dir, "--db", d.db, "trend", "--run", "sum", "--layer", ls, "--format", "csv");
    CLI_OK(res);
    int n = cli_count_lines(res.out) - 1;
    ck_assert_msg(n >= 10 && n <= 30, "%d rows", n);
    cli_result_free(&res);
    res = cli_run(d.dir, "--db", d.db, "trend", "--run", "sum", "--layer", ls);
    CLI_OK(res);
    ck_assert_ptr_nonnull(strstr(res.out, "entropy_norm min"));
    ck_assert_ptr_nonnull(strstr(res.out, "max_logit max"));
    cli_result_free(&res);
    /* --per-head: every sample; --from/--to narrow the summary */
    res = cli_run(d.dir, "--db", d.db, "trend", "--run", "sum", "--layer", ls, "--per-head",
                  "--format", "csv");
    CLI_OK(res);
    ck_assert_int_eq(cli_count_lines(res.out), 1 + S * H);
    cli_result_free(&res);
    char f[16], t[16];
    snprintf(f, sizeof f, "%d", first + 7);
    snprintf(t, sizeof t, "%d", first + 9);
    res = cli_run(d.dir, "--db", d.db, "trend", "--run", "sum", "--layer", ls, "--from", f,
                  "--to", t, "--format", "json");
    CLI_OK(res);
    ck_assert_int_eq(cli_count_lines(res.out), 3); /* three steps: a bucket each */
    ck_assert_int_eq((int)cli_json_num(res.out, "step_first"), first + 7);
    cli_result_free(&res);
    free(v);
    dh_cleanup(&d, 0);
}
END_TEST

/* ---- diff -----------------------------------------------------------------------------------*/
typedef struct {
    int layer, head;
    double en[2], ent[2], ml[2], key;
} diff_expect;

static int by_change(const void *x, const void *y)
{
    const diff_expect *p = x, *q = y;
    if (isnan(p->key) != isnan(q->key))
        return isnan(p->key) - isnan(q->key);
    if (!isnan(p->key) && p->key != q->key)
        return p->key > q->key ? -1 : 1;
    return p->layer != q->layer ? p->layer - q->layer : p->head - q->head;
}

START_TEST(test_diff)
{
    dh_rng r = dh_rng_new("diff");
    dh_daemon d;
    dh_dir_init(&d);
    /* a: steps 0..39 of H + 1 heads (the last one b lacks), b: steps 10..59 of H heads: compared
     * over 10..39 */
    enum { SA = 40, SB = 50 };
    stats_head *va = malloc(sizeof(stats_head) * SA * L * (H + 1));
    stats_head *vb = malloc(sizeof(stats_head) * SB * L * H);
    ck_assert(va && vb);
    write_run(d.db, "base", 0, SA, H + 1, T0, MIN_MS, va, &r);
    write_run(d.db, "exp", 10, SB, H, T0, MIN_MS, vb, &r);
    diff_expect e[L * (H + 1)];
    int ne = 0;
    for (int l = 0; l < L; l++)
        for (int h = 0; h <= H; h++) {
            diff_expect *x = &e[ne++];
            *x = (diff_expect){l, h, {0, 0}, {0, 0}, {-INFINITY, -INFINITY}, 0};
            for (int s = 10; s < SA; s++) {
                const stats_head *a = &va[((size_t)s * L + (size_t)l) * (H + 1) + (size_t)h];
                x->en[0] += a->entropy_norm_mean / (SA - 10);
                x->ent[0] += a->entropy_mean / (SA - 10);
                x->ml[0] = fmax(x->ml[0], a->max_logit);
                if (h == H)
                    continue;
                const stats_head *b = &vb[((size_t)(s - 10) * L + (size_t)l) * H + (size_t)h];
                x->en[1] += b->entropy_norm_mean / (SA - 10);
                x->ent[1] += b->entropy_mean / (SA - 10);
                x->ml[1] = fmax(x->ml[1], b->max_logit);
            }
            x->key = h == H ? NAN : fabs(x->en[1] - x->en[0]);
        }
    qsort(e, (size_t)ne, sizeof e[0], by_change);
    cli_result res = cli_run(d.dir, "--db", d.db, "diff", "base", "exp", "--format", "json");
    CLI_OK(res);
    char *copy, *lines[64];
    ck_assert_int_eq(json_lines(res.out, &copy, lines, 64), ne);
    for (int i = 0; i < ne; i++) {
        const char *x = lines[i];
        ck_assert_msg((int)cli_json_num(x, "layer") == e[i].layer &&
                          (int)cli_json_num(x, "head") == e[i].head, "row %d: %s", i, x);
        ck_assert(cli_json_has(x, "run_a", "base") && cli_json_has(x, "run_b", "exp"));
        ck_assert_double_eq_tol(cli_json_num(x, "entropy_norm_a"), e[i].en[0], 1e-12);
        ck_assert_double_eq_tol(cli_json_num(x, "entropy_a"), e[i].ent[0], 1e-12);
        ck_assert(cli_json_num(x, "max_logit_a") == e[i].ml[0]);
        if (e[i].head == H) { /* b lacks it: null, last */
            ck_assert(isnan(cli_json_num(x, "entropy_norm_b")));
            ck_assert_int_eq((int)cli_json_num(x, "samples_b"), 0);
            continue;
        }
        ck_assert_int_eq((int)cli_json_num(x, "samples_a"), SA - 10);
        ck_assert_double_eq_tol(cli_json_num(x, "entropy_norm_b"), e[i].en[1], 1e-12);
        ck_assert(cli_json_num(x, "max_logit_b") == e[i].ml[1]);
        ck_assert_double_eq_tol(cli_json_num(x, "entropy_norm_b_minus_a"),
                                e[i].en[1] - e[i].en[0], 1e-12);
        ck_assert_double_eq_tol(cli_json_num(x, "max_logit_b_minus_a"), e[i].ml[1] - e[i].ml[0],
                                1e-12);
    }
    free(copy);
    cli_result_free(&res);
    /* --run twice is the same; -n keeps the largest changes; the table names the runs */
    res = cli_run(d.dir, "--db", d.db, "diff", "--run", "base", "--run", "exp", "-n", "3",
                  "--format", "csv");
    CLI_OK(res);
    ck_assert_int_eq(cli_count_lines(res.out), 1 + 3);
    cli_result_free(&res);
    res = cli_run(d.dir, "--db", d.db, "diff", "base", "exp", "--layer", "1");
    CLI_OK(res);
    ck_assert_ptr_nonnull(strstr(res.out, "A  run base (id 1): steps 10..39"));
    ck_assert_ptr_nonnull(strstr(res.out, "B  run exp (id 2): steps 10..39"));
    ck_assert_int_eq(cli_count_lines(res.out), 2 + 2 + 1 + H + 1);
    cli_result_free(&res);
    /* --step: one step's values */
    res = cli_run(d.dir, "--db", d.db, "diff", "base", "exp", "--step", "12", "--metric",
                  "max_logit", "--format", "json", "-n", "1");
    CLI_OK(res);
    double best = -1;
    for (int l = 0; l < L; l++)
        for (int h = 0; h < H; h++)
            best = fmax(best, fabs(vb[((size_t)2 * L + l) * H + h].max_logit -
                                   va[((size_t)12 * L + l) * (H + 1) + h].max_logit));
    ck_assert(fabs(cli_json_num(res.out, "max_logit_b_minus_a")) == best);
    cli_result_free(&res);
    /* one run is not a comparison; runs with no step in common say so */
    res = cli_run(d.dir, "--db", d.db, "diff", "base");
    ck_assert_int_eq(res.status, 2);
    ck_assert_ptr_nonnull(strstr(res.err, "two runs or more"));
    cli_result_free(&res);
    write_run(d.db, "late", 100, 5, H, T0, MIN_MS, NULL, &r);
    res = cli_run(d.dir, "--db", d.db, "diff", "base", "late");
    ck_assert_int_eq(res.status, 1);
    ck_assert_msg(strstr(res.err, "no step in common") && strstr(res.err, "steps 100..104"),
                  "%s", res.err);
    cli_result_free(&res);
    free(va);
    free(vb);
    dh_cleanup(&d, 0);
}
END_TEST
/* ---- sink_mass and distance through the views ------------------------------------------------*/
/* Run `name` of L layers x heads, steps [first, first + steps) a minute apart from T0, with
 * vocab.h's newer statistics fresh and finite: sink_mass in (0.01, 0.99), distance in (0.5, 300)
 * positions. The statistics into v[(s * L + l) * heads + h]. */
static void write_metric_run(const char *db, const char *name, int first, int steps, int heads,
                             stats_head *v, dh_rng *r)
{
    store_error err;
    store *st = store_open(db, 0, &err);
    ck_assert_msg(st != NULL, "store_open: %s", err.msg);
    store_run_info info = {.name = name, .rank = 0, .host = "node", .time_ms = T0};
    int64_t id = 0;
    ck_assert_msg(store_run_begin(st, &info, &id, &err) == STORE_OK, "%s", err.msg);
    stats_head row[64];
    for (int s = 0; s < steps; s++)
        for (int l = 0; l < L; l++) {
            for (int h = 0; h < heads; h++) {
                row[h] = rand_stats(r);
                row[h].sink_mass = 0.01 + 0.98 * unit(r);
                row[h].distance = 0.5 + 299.5 * unit(r);
                v[((size_t)s * L + (size_t)l) * (size_t)heads + (size_t)h] = row[h];
            }
            ck_assert_msg(store_add_samples(st, id, first + s, l, row, heads,
                                            T0 + (int64_t)s * MIN_MS, &err) == STORE_OK,
                          "%s", err.msg);
        }
    ck_assert_msg(store_commit(st, &err) == STORE_OK, "%s", err.msg);
    store_close(st);
}

/* The options that name the new statistics and rules are taken, and the views draw them: what
 * holds whether or not the store keeps their values. */
START_TEST(test_new_metrics_options)
{
    dh_rng r = dh_rng_new("new_metrics_options");
    dh_daemon d;
    dh_dir_init(&d);
    enum { S = 3 };
    stats_head *v = malloc(sizeof(stats_head) * S * L * H);
    ck_assert_ptr_nonnull(v);
    write_metric_run(d.db, "nm", 0, S, H, v, &r);
    write_metric_run(d.db, "nm2", 0, S, H, v, &r);
    static const struct {
        const char *metric, *pick;
    } m[] = {{"sink_mass", "highest sink_mass:"}, {"distance", "lowest distance:"}};
    for (size_t i = 0; i < 2; i++) {
        cli_result res = cli_run(d.dir, "--db", d.db, "heads", "--run", "nm", "--metric",
                                 m[i].metric);
        CLI_OK(res);
        char title[96];
        snprintf(title, sizeof title, "%s per layer x head", m[i].metric);
        ck_assert_msg(strstr(res.out, title) && strstr(res.out, m[i].pick), "%s", res.out);
        cli_result_free(&res);
        res = cli_run(d.dir, "--db", d.db, "job", "--run", "nm", "--metric", m[i].metric);
        CLI_OK(res);
        ck_assert_msg(strstr(res.out, title) && strstr(res.out, m[i].pick), "%s", res.out);
        cli_result_free(&res);
        res = cli_run(d.dir, "--db", d.db, "diff", "nm", "nm2", "--metric", m[i].metric,
                      "--format", "csv");
        CLI_OK(res);
        char key[64];
        snprintf(key, sizeof key, ",%s_a,%s_b,%s_b_minus_a", m[i].metric, m[i].metric,
                 m[i].metric);
        ck_assert_msg(strstr(res.out, key), "%s", res.out);
        cli_result_free(&res);
        /* the diff table shows the chosen statistic's columns */
        res = cli_run(d.dir, "--db", d.db, "diff", "nm", "nm2", "--metric", m[i].metric);
        CLI_OK(res);
        snprintf(key, sizeof key, "%s_B-A", m[i].metric);
        ck_assert_msg(strstr(res.out, key) && strstr(res.out, "en_B-A"), "%s", res.out);
        cli_result_free(&res);
    }
    /* the samples' JSON and CSV carry every statistic; the table the new two */
    cli_result res = cli_run(d.dir, "--db", d.db, "trend", "--run", "nm", "--layer", "0",
                             "--head", "1", "--format", "csv");
    CLI_OK(res);
    ck_assert_msg(strstr(res.out, "entropy_mean,entropy_std,entropy_min,entropy_max,"
                                  "entropy_norm_mean,collapsed_frac,max_logit,sink_mass,distance,"
                                  "rows_norm"), "%s", res.out);
    cli_result_free(&res);
    res = cli_run(d.dir, "--db", d.db, "trend", "--run", "nm", "--layer", "0", "--head", "1");
    CLI_OK(res);
    ck_assert_msg(strstr(res.out, "ent_min") && strstr(res.out, "sink_mass") &&
                      strstr(res.out, "distance") && !strstr(res.out, "entropy_std"),
                  "%s", res.out);
    cli_result_free(&res);
    /* the choices, from the tables */
    res = cli_run(d.dir, "--db", d.db, "heads", "--run", "nm", "--metric", "sink");
    ck_assert_msg(res.status == 2 &&
                      strstr(res.err, "--metric is entropy_norm, entropy, max_logit, sink_mass or "
                                      "distance, not 'sink'"), "%d %s", res.status, res.err);
    cli_result_free(&res);
    res = cli_run(d.dir, "--db", d.db, "alerts", "--rule", "sink_mass_ceiling");
    CLI_OK(res);
    cli_result_free(&res);
    res = cli_run(d.dir, "--db", d.db, "alerts", "--rule", "distance_floor", "--format", "json");
    CLI_OK(res);
    cli_result_free(&res);
    res = cli_run(d.dir, "--db", d.db, "alerts", "--rule", "sink_mass");
    ck_assert_msg(res.status == 2 && strstr(res.err, "sink_mass_ceiling or distance_floor"),
                  "%d %s", res.status, res.err);
    cli_result_free(&res);
    free(v);
    dh_cleanup(&d, 0);
}
END_TEST

/* The values of sink_mass and distance written through the store come back through trend, heads,
 * job and diff exactly (each head's most-affected named). Needs the store to keep them (its
 * columns for the newer statistics). */
START_TEST(test_new_metrics_values)
{
    dh_rng r = dh_rng_new("new_metrics_values");
    dh_daemon d;
    dh_dir_init(&d);
    enum { S = 4 };
    stats_head *va = malloc(sizeof(stats_head) * S * L * H);
    stats_head *vb = malloc(sizeof(stats_head) * S * L * H);
    ck_assert(va && vb);
    write_metric_run(d.db, "va", 0, S, H, va, &r);
    write_metric_run(d.db, "vb", 0, S, H, vb, &r);
    /* trend of one head: every step's values */
    int l = (int)(dh_next(&r) % L), hh = (int)(dh_next(&r) % H);
    char ls[16], hs[16];
    snprintf(ls, sizeof ls, "%d", l);
    snprintf(hs, sizeof hs, "%d", hh);
    cli_result res = cli_run(d.dir, "--db", d.db, "trend", "--run", "va", "--layer", ls, "--head",
                             hs, "--format", "json");
    CLI_OK(res);
    char *copy, *lines[64];
    ck_assert_int_eq(json_lines(res.out, &copy, lines, 64), S);
    for (int i = 0; i < S; i++) {
        int s = (int)cli_json_num(lines[i], "step");
        ck_assert(s >= 0 && s < S);
        const stats_head *x = &va[((size_t)s * L + (size_t)l) * H + (size_t)hh];
        ck_assert_msg(cli_json_num(lines[i], "sink_mass") == x->sink_mass &&
                          cli_json_num(lines[i], "distance") == x->distance,
                      "step %d: %s (wrote %.17g %.17g)", s, lines[i], x->sink_mass, x->distance);
    }
    free(copy);
    cli_result_free(&res);
    /* heads: the last step's grid, and the most-affected head named */
    const stats_head *last = &va[(size_t)(S - 1) * L * H];
    res = cli_run(d.dir, "--db", d.db, "heads", "--run", "va", "--format", "json");
    CLI_OK(res);
    ck_assert_int_eq(json_lines(res.out, &copy, lines, 64), L * H);
    for (int i = 0; i < L * H; i++) {
        int li = (int)cli_json_num(lines[i], "layer"), hi = (int)cli_json_num(lines[i], "head");
        const stats_head *x = &last[(size_t)li * H + (size_t)hi];
        ck_assert_msg(cli_json_num(lines[i], "sink_mass") == x->sink_mass &&
                          cli_json_num(lines[i], "distance") == x->distance, "%s", lines[i]);
    }
    free(copy);
    cli_result_free(&res);
    int top = 0, bottom = 0;
    for (int i = 1; i < L * H; i++) {
        top = last[i].sink_mass > last[top].sink_mass ? i : top;
        bottom = last[i].distance < last[bottom].distance ? i : bottom;
    }
    char want[96];
    res = cli_run(d.dir, "--db", d.db, "heads", "--run", "va", "--metric", "sink_mass");
    CLI_OK(res);
    snprintf(want, sizeof want, "highest sink_mass: L%d.H%d %.3f", top / H, top % H,
             last[top].sink_mass);
    ck_assert_msg(strstr(res.out, want), "want '%s' in:\n%s", want, res.out);
    cli_result_free(&res);
    res = cli_run(d.dir, "--db", d.db, "job", "--run", "va", "--metric", "distance");
    CLI_OK(res);
    snprintf(want, sizeof want, "lowest distance: L%d.H%d %.3f", bottom / H, bottom % H,
             last[bottom].distance);
    ck_assert_msg(strstr(res.out, want), "want '%s' in:\n%s", want, res.out);
    cli_result_free(&res);
    /* job's cells (one process: its own values) */
    res = cli_run(d.dir, "--db", d.db, "job", "--run", "va", "--format", "json");
    CLI_OK(res);
    ck_assert_int_eq(json_lines(res.out, &copy, lines, 64), L * H);
    for (int i = 0; i < L * H; i++) {
        int li = (int)cli_json_num(lines[i], "layer"), hi = (int)cli_json_num(lines[i], "head");
        const stats_head *x = &last[(size_t)li * H + (size_t)hi];
        ck_assert_msg(cli_json_num(lines[i], "sink_mass") == x->sink_mass &&
                          cli_json_num(lines[i], "distance") == x->distance, "%s", lines[i]);
    }
    free(copy);
    cli_result_free(&res);
    /* diff: the means over the steps, the rows by the largest change of --metric */
    res = cli_run(d.dir, "--db", d.db, "diff", "va", "vb", "--metric", "distance", "--format",
                  "json");
    CLI_OK(res);
    ck_assert_int_eq(json_lines(res.out, &copy, lines, 64), L * H);
    double prev = INFINITY;
    for (int i = 0; i < L * H; i++) {
        int li = (int)cli_json_num(lines[i], "layer"), hi = (int)cli_json_num(lines[i], "head");
        double ma[2] = {0, 0}, da[2] = {0, 0};
        for (int s = 0; s < S; s++) {
            size_t k = ((size_t)s * L + (size_t)li) * H + (size_t)hi;
            ma[0] += va[k].sink_mass / S;
            ma[1] += vb[k].sink_mass / S;
            da[0] += va[k].distance / S;
            da[1] += vb[k].distance / S;
        }
        ck_assert_double_eq_tol(cli_json_num(lines[i], "sink_mass_a"), ma[0], 1e-12);
        ck_assert_double_eq_tol(cli_json_num(lines[i], "sink_mass_b"), ma[1], 1e-12);
        ck_assert_double_eq_tol(cli_json_num(lines[i], "distance_a"), da[0], 1e-9);
        ck_assert_double_eq_tol(cli_json_num(lines[i], "distance_b_minus_a"), da[1] - da[0],
                                1e-9);
        double change = fabs(da[1] - da[0]);
        ck_assert_msg(change <= prev + 1e-9, "row %d out of order: %s", i, lines[i]);
        prev = change;
    }
    free(copy);
    cli_result_free(&res);
    free(va);
    free(vb);
    dh_cleanup(&d, 0);
}
END_TEST

/* ---- usage --------------------------------------------------------------------------------- */
START_TEST(test_usage)
{
    dh_rng r = dh_rng_new("usage");
    dh_daemon d;
    dh_dir_init(&d);
    write_run(d.db, "u", 0, 3, H, T0, MIN_MS, NULL, &r);
    static const struct {
        const char *args[12];
        const char *says;
    } cases[] = {
        {{"top", "--run", "u", "--interval", "0.05"}, "--interval wants seconds"},
        {{"top"}, "top needs --run R"},
        {{"trend", "--run", "u", "--layer", "0", "--every", "2"}, "the summary takes --buckets"},
        {{"trend", "--run", "u", "--layer", "0", "--head", "1", "--buckets", "3"},
         "--buckets is the summary's"},
        {{"trend", "--run", "u", "--layer", "0", "--head", "1", "--per-head"}, "not both"},
        {{"heads", "--run", "u", "--step", "1", "--since", "-1h"}, "not both"},
        {{"heads", "--run", "u", "--since", "yesterday"}, "--since wants a time"},
        {{"trend", "--run", "u", "--layer", "0", "--since", "2025-03-01T01:00:00Z", "--until",
          "2025-03-01T00:00:00Z"}, "is after --until"},
        {{"diff", "u", "u", "--step", "1", "--from", "0"}, "--step S compares one step"},
        {{"runs", "u"}, "unexpected argument 'u'"},
        {{"top", "--run", "u", "--format", "json"}, "top prints table, not json"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const char *args[16] = {"--db", d.db};
        int n = 2;
        for (int k = 0; cases[i].args[k]; k++)
            args[n++] = cases[i].args[k];
        cli_result res = cli_run_v(d.dir, args);
        ck_assert_msg(res.status == 2 && strstr(res.err, cases[i].says),
                      "case %zu: status %d, '%s'", i, res.status, res.err);
        cli_result_free(&res);
    }
    /* the help of each command lists its options; -n is each command's own */
    cli_result res = cli_run(d.dir, "top", "--help");
    CLI_OK(res);
    ck_assert_msg(strstr(res.out, "-n, --iterations N") && strstr(res.out, "--once"), "%s",
                  res.out);
    cli_result_free(&res);
    res = cli_run(d.dir, "diff", "--help");
    CLI_OK(res);
    ck_assert_msg(strstr(res.out, "[RUN...]") && strstr(res.out, "-n, --limit N"), "%s", res.out);
    cli_result_free(&res);
    dh_cleanup(&d, 0);
}
END_TEST

int main(void)
{
    const TTest *tests[] = {test_time_steps_tiers, test_time_windows, test_relative_times,
                            test_trend_summary,    test_diff,         test_usage,
                            test_new_metrics_options, test_new_metrics_values};
    return cli_run_tests("cli_view", tests, (int)(sizeof tests / sizeof tests[0]));
}

