/* test_client_e2e.c — libattnstat and the attnstat CLI against a real attnstatd started from the
 * build tree on a temporary socket and database:
 *   - random Q/K of every dtype and layout (padded, [B,N,H,D], GQA, causal, sampled) pushed through
 *     libattnstat, flushed, then read back with `attnstat heads/trend --format json`: every value
 *     equals stats_cpu() on the same tensors, computed here (within 1e-5 relative, 1e-5 absolute:
 *     the daemon computes with the float32 backend, stats_cpu_fast_ws);
 *   - the CLI's runs/trend/heads/alerts in table, json and csv; alerts raised and cleared through
 *     per-run thresholds in the hello; --active;
 *   - `attnstat status` and `attnstat watch` against the live daemon;
 *   - CLI errors: unknown run (lists the known ones), missing database, usage errors — exit codes;
 *   - a SIGSTOP'd daemon: pushes keep returning (OK or DROPPED) and the drops are counted; after
 *     SIGCONT every push sent is answered.
 * Fresh random data each run; the seed is printed (ATTNSTAT_TEST_SEED repeats a run). No timing
 * assertions. */
#include "daemon_harness.h"
#include "stats_testutil.h"

#include "attnstat.h"
#include "cli_harness.h"

static void close_enough(double got, double want, const char *what, int layer, int head,
                         long long step, uint64_t seed)
{
    if (isnan(want) && isnan(got))
        return;
    if (isinf(want) && got == want)
        return;
    ck_assert_msg(fabs(got - want) <= 1e-5 * fabs(want) + 1e-5, /* the daemon's fast backend */
                  "seed %llu: %s of layer %d head %d step %lld: CLI says %.17g, stats_cpu %.17g",
                  (unsigned long long)seed, what, layer, head, step, got, want);
}

/* ---- Values through the whole pipeline ---------------------------------------------------------*/
START_TEST(test_values_equal_reference)
{
    uint64_t seed = tu_seed();
    tu_rng rng = {seed};
    dh_daemon d;
    dh_dir_init(&d);
    dh_start(&d, NULL);
    attnstat_client *c = cli_trainer(d.sock, "values", 0, NULL, 16u << 20, 0);

    enum { PUSHES = 12 };
    stats_head want[PUSHES][8];
    int nheads[PUSHES];
    for (int p = 0; p < PUSHES; p++) {
        stats_dtype dt = (stats_dtype)(tu_next(&rng) % 3);
        int64_t b = 1 + (int64_t)(tu_next(&rng) % 2), hkv = 1 + (int64_t)(tu_next(&rng) % 4);
        int64_t hq = hkv * (1 + (int64_t)(tu_next(&rng) % 2));
        int64_t nq = 8 + (int64_t)(tu_next(&rng) % 57), nk = nq + (int64_t)(tu_next(&rng) % 9);
        int64_t dd = 16 << (tu_next(&rng) % 3);
        tu_tensor q, k;
        tu_alloc(&q, b, hq, nq, dd, dt, (tu_layout)(tu_next(&rng) % 3));
        tu_alloc(&k, b, hkv, nk, dd, dt, (tu_layout)(tu_next(&rng) % 3));
        double amp = 0.5 + 2.5 * tu_uniform(&rng);
        tu_fill_gauss(&q, &rng, amp);
        tu_fill_gauss(&k, &rng, amp);

        attnstat_push_opts o;
        attnstat_push_opts_init(&o);
        o.step = p / 2;
        o.layer = (uint32_t)(p % 2);
        o.causal = (int32_t)(tu_next(&rng) % 2);
        if (p == 5)
            o.sample_every = 3;
        if (p == 7) {
            o.sample_rows = 5;
            o.sample_seed = tu_next(&rng);
        }
        if (p == 9)
            o.window_left = 4;
        attnstat_tensor aq = cli_tensor(&q), ak = cli_tensor(&k);
        ck_assert_msg(attnstat_push(c, &o, &aq, &ak, NULL) == ATTNSTAT_OK, "push %d: %s", p,
                      attnstat_last_error(c));

        stats_problem pr;
        stats_problem_init(&pr);
        pr.batch = (int32_t)b, pr.heads_q = (int32_t)hq, pr.heads_kv = (int32_t)hkv;
        pr.len_q = (int32_t)nq, pr.len_k = (int32_t)nk, pr.head_dim = (int32_t)dd, pr.dtype = dt;
        pr.q = tu_view(&q);
        pr.k = tu_view(&k);
        pr.causal = o.causal;
        pr.window_left = o.window_left;
        pr.sample_every = (int32_t)o.sample_every;
        pr.sample_rows = (int32_t)o.sample_rows;
        pr.sample_seed = o.sample_seed;
        stats_error se;
        ck_assert_msg(stats_cpu(&pr, want[p], NULL, NULL, &se) == STATS_OK, "%s", se.msg);
        nheads[p] = (int)hq;
        /* pushes must not depend on the caller's memory after they return */
        tu_free(&q);
        tu_free(&k);
    }
    ck_assert_msg(attnstat_flush(c, 120000) == ATTNSTAT_OK, "flush: %s", attnstat_last_error(c));
    attnstat_counters st;
    attnstat_stats(c, &st);
    ck_assert_uint_eq(st.acked, PUSHES);
    ck_assert_uint_eq(st.rejected + st.dropped_daemon + st.dropped_local, 0);
    ck_assert_uint_eq(st.ring_used, 0);
    attnstat_close(c);

    /* heads: one step at a time, both layers */
    for (int step = 0; step < PUSHES / 2; step++) {
        char s[16];
        snprintf(s, sizeof s, "%d", step);
        cli_result r = cli_run(d.dir, "--db", d.db, "heads", "--run", "values", "--step", s,
                               "--format", "json");
        ck_assert_msg(r.status == 0, "heads: %s", r.err);
        int seen = 0;
        for (char *line = strtok(r.out, "\n"); line; line = strtok(NULL, "\n")) {
            int layer = (int)cli_json_num(line, "layer"), head = (int)cli_json_num(line, "head");
            ck_assert_int_eq((int)cli_json_num(line, "step"), step);
            ck_assert(cli_json_has(line, "run", "values"));
            int p = step * 2 + layer;
            ck_assert_int_lt(head, nheads[p]);
            const stats_head *w = &want[p][head];
            ck_assert_int_eq((int64_t)cli_json_num(line, "rows"), w->rows);
            close_enough(cli_json_num(line, "entropy_mean"), w->entropy_mean, "entropy_mean", layer,
                         head, step, seed);
            close_enough(cli_json_num(line, "entropy_norm_mean"), w->entropy_norm_mean,
                         "entropy_norm_mean", layer, head, step, seed);
            close_enough(cli_json_num(line, "entropy_min"), w->entropy_min, "entropy_min", layer, head,
                         step, seed);
            close_enough(cli_json_num(line, "entropy_max"), w->entropy_max, "entropy_max", layer, head,
                         step, seed);
            close_enough(cli_json_num(line, "entropy_std"), w->entropy_std, "entropy_std", layer, head,
                         step, seed);
            close_enough(cli_json_num(line, "max_logit"), w->max_logit, "max_logit", layer, head, step,
                         seed);
            close_enough(cli_json_num(line, "collapsed_frac"), w->collapsed_frac, "collapsed_frac",
                         layer, head, step, seed);
            ck_assert_int_eq((int)cli_json_num(line, "sampled"), w->sampled);
            seen++;
        }
        ck_assert_int_eq(seen, nheads[step * 2] + nheads[step * 2 + 1]);
        cli_result_free(&r);
    }
    /* trend of layer 1 head 0 over every step, and thinned */
    cli_result r = cli_run(d.dir, "--db", d.db, "trend", "--run", "values", "--layer", "1", "--head",
                           "0", "--format", "json");
    ck_assert_msg(r.status == 0, "trend: %s", r.err);
    ck_assert_int_eq(cli_count_lines(r.out), PUSHES / 2);
    int step = 0;
    for (char *line = strtok(r.out, "\n"); line; line = strtok(NULL, "\n"), step++) {
        ck_assert_int_eq((int)cli_json_num(line, "step"), step);
        close_enough(cli_json_num(line, "entropy_mean"), want[step * 2 + 1][0].entropy_mean,
                     "entropy_mean", 1, 0, step, seed);
        close_enough(cli_json_num(line, "max_logit"), want[step * 2 + 1][0].max_logit, "max_logit", 1,
                     0, step, seed);
    }
    cli_result_free(&r);
    r = cli_run(d.dir, "--db", d.db, "trend", "--run", "values", "--layer", "1", "--head", "0",
                "--from", "1", "--to", "5", "--every", "2", "--format", "csv");
    ck_assert_msg(r.status == 0, "trend csv: %s", r.err);
    ck_assert_int_eq(cli_count_lines(r.out), 1 + 3); /* header, steps 1 3 5 */
    ck_assert(!strncmp(r.out, "run,run_id,layer,head,step,", 27));
    ck_assert_ptr_nonnull(strstr(r.out, "\nvalues,1,1,0,3,"));
    cli_result_free(&r);
    ck_assert_int_eq(dh_stop(&d), 0);
    dh_cleanup(&d, 0);
}
END_TEST

/* ---- CLI formats, alerts, status, watch --------------------------------------------------------*/
/* Display width (code points) of a line. */
static size_t line_width(const char *s, size_t n)
{
    size_t w = 0;
    for (size_t i = 0; i < n; i++)
        w += ((unsigned char)s[i] & 0xC0) != 0x80;
    return w;
}

/* Every line of the first `lines` of a table has the same width (right-aligned last column). */
static void assert_aligned(const char *out, int lines)
{
    const char *p = out;
    size_t w0 = 0;
    for (int i = 0; i < lines && *p; i++) {
        const char *e = strchr(p, '\n');
        ck_assert_ptr_nonnull(e);
        size_t w = line_width(p, (size_t)(e - p));
        if (i == 0)
            w0 = w;
        ck_assert_msg(w == w0, "table line %d is %zu wide, the header %zu:\n%s", i, w, w0, out);
        p = e + 1;
    }
}

START_TEST(test_cli_formats_and_alerts)
{
    tu_rng rng = {tu_seed()};
    dh_daemon d;
    dh_dir_init(&d);
    dh_start(&d, NULL);

    /* `attnstat watch` in the background from the start */
    char wout[400];
    snprintf(wout, sizeof wout, "%s/watch.out", d.dir);
    pid_t wpid = fork();
    ck_assert_int_ge(wpid, 0);
    if (wpid == 0) {
        int fo = open(wout, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fo < 0)
            _exit(126);
        dup2(fo, 1);
        dup2(fo, 2);
        execl(cli_binary(), cli_binary(), "--socket", d.sock, "watch", "--format", "json",
              (char *)NULL);
        _exit(127);
    }
    /* wait until the watcher says it is subscribed (it confirms with a round trip first) */
    int64_t deadline = dh_now_ms() + 60000;
    for (;;) {
        char *w = cli_slurp(wout);
        int ready = strstr(w, "watching alerts from") != NULL;
        free(w);
        if (ready)
            break;
        int st;
        ck_assert_msg(waitpid(wpid, &st, WNOHANG) == 0, "attnstat watch exited early");
        ck_assert_msg(dh_now_ms() < deadline, "attnstat watch never subscribed");
        dh_sleep_ms(20);
    }

    /* A run whose ceiling is 1 and whose rules act on one sample: every push raises at once. */
    attnstat_thresholds th;
    attnstat_thresholds_init(&th);
    th.logit_ceiling = 1.0;
    th.raise_after = 1;
    th.clear_after = 1;
    attnstat_client *c = cli_trainer(d.sock, "alerty", 0, &th, 0, 0);
    cli_push_steps(c, &rng, 0, 3, 2, 3.0);    /* logits well over 1: raised */
    cli_push_steps(c, &rng, 3, 4, 2, 0.001);  /* logits ~0: cleared */
    attnstat_client *c2 = cli_trainer(d.sock, "quiet", 0, NULL, 0, 0);
    cli_push_steps(c2, &rng, 0, 10, 1, 1.0);

    /* status while both trainers are connected */
    cli_result r = cli_run(d.dir, "--socket", d.sock, "status");
    ck_assert_msg(r.status == 0, "%s", r.err);
    ck_assert_ptr_nonnull(strstr(r.out, "clients"));
    ck_assert_ptr_nonnull(strstr(r.out, "alerty"));
    ck_assert_ptr_nonnull(strstr(r.out, "cpu"));
    cli_result_free(&r);
    r = cli_run(d.dir, "--socket", d.sock, "status", "--format", "json");
    ck_assert_int_eq(r.status, 0);
    ck_assert_int_ge((int)cli_json_num(r.out, "clients"), 3);
    ck_assert_int_ge((int)cli_json_num(r.out, "pushes_done"), 18);
    cli_result_free(&r);
    attnstat_close(c);
    attnstat_close(c2);

    /* runs */
    r = cli_run(d.dir, "--db", d.db, "runs");
    ck_assert_msg(r.status == 0, "%s", r.err);
    ck_assert_int_eq(cli_count_lines(r.out), 3);
    ck_assert_ptr_nonnull(strstr(r.out, "alerty"));
    ck_assert_ptr_nonnull(strstr(r.out, "0..9"));
    cli_result_free(&r);
    r = cli_run(d.dir, "--db", d.db, "runs", "--format", "json");
    ck_assert_int_eq(cli_count_lines(r.out), 2);
    ck_assert(cli_json_has(r.out, "run", "alerty"));
    ck_assert_ptr_nonnull(strstr(r.out, "\"samples\": 32"));
    cli_result_free(&r);
    r = cli_run(d.dir, "--db", d.db, "runs", "--format", "csv");
    ck_assert_int_eq(cli_count_lines(r.out), 3);
    ck_assert(!strncmp(r.out, "run_id,run,rank,host,", 21));
    cli_result_free(&r);

    /* trend: aligned table, then sparklines */
    r = cli_run(d.dir, "--db", d.db, "trend", "--run", "quiet", "--layer", "0", "--head", "2");
    ck_assert_msg(r.status == 0, "%s", r.err);
    assert_aligned(r.out, 11);
    ck_assert_ptr_nonnull(strstr(r.out, "entropy_norm "));
    const char *blocks[] = {"▁", "▂", "▃", "▄", "▅", "▆", "▇", "█"};
    int sparks = 0;
    for (int i = 0; i < 8; i++)
        sparks += strstr(r.out, blocks[i]) != NULL;
    ck_assert_int_gt(sparks, 0);
    cli_result_free(&r);

    /* heads: heatmap with a legend; colour only when asked (stdout is not a tty here) */
    r = cli_run(d.dir, "--db", d.db, "heads", "--run", "alerty", "--step", "1");
    ck_assert_msg(r.status == 0, "%s", r.err);
    ck_assert_ptr_nonnull(strstr(r.out, "layer 0"));
    ck_assert_ptr_nonnull(strstr(r.out, "layer 1"));
    ck_assert_ptr_nonnull(strstr(r.out, "legend"));
    ck_assert_ptr_null(strstr(r.out, "\x1b["));
    cli_result_free(&r);
    r = cli_run(d.dir, "--db", d.db, "heads", "--run", "alerty", "--metric", "max_logit", "--color",
                "always");
    ck_assert_msg(r.status == 0, "%s", r.err);
    ck_assert_ptr_nonnull(strstr(r.out, "\x1b[48;5;"));
    ck_assert_ptr_nonnull(strstr(r.out, "step 3"));
    cli_result_free(&r);
    r = cli_run(d.dir, "--db", d.db, "heads", "--run", "alerty", "--format", "csv");
    ck_assert_int_eq(cli_count_lines(r.out), 1 + 8);
    cli_result_free(&r);

    /* alerts: 2 layers x 4 heads raised at step 0 and cleared at step 3 */
    r = cli_run(d.dir, "--db", d.db, "alerts", "--run", "alerty", "--format", "json");
    ck_assert_msg(r.status == 0, "%s", r.err);
    int raised = 0, cleared = 0;
    for (char *line = strtok(r.out, "\n"); line; line = strtok(NULL, "\n")) {
        if (!cli_json_has(line, "rule", "logit_ceiling"))
            continue;
        ck_assert(cli_json_has(line, "run", "alerty"));
        ck_assert(cli_json_num(line, "threshold") == 1.0);
        if (cli_json_has(line, "state", "raised")) {
            raised++;
            ck_assert_int_eq((int)cli_json_num(line, "step"), 0);
            ck_assert(cli_json_num(line, "value") > 1.0);
        } else if (cli_json_has(line, "state", "cleared")) {
            cleared++;
            ck_assert_int_eq((int)cli_json_num(line, "step"), 3);
        }
        ck_assert(!isnan(cli_json_num(line, "layer")) && !isnan(cli_json_num(line, "head")));
    }
    ck_assert_int_eq(raised, 8);
    ck_assert_int_eq(cleared, 8);
    cli_result_free(&r);
    r = cli_run(d.dir, "--db", d.db, "alerts", "--run", "alerty", "--active", "--format", "json");
    ck_assert_int_eq(r.status, 0);
    ck_assert_ptr_null(strstr(r.out, "logit_ceiling"));
    cli_result_free(&r);
    r = cli_run(d.dir, "--db", d.db, "alerts");
    ck_assert_int_eq(r.status, 0);
    ck_assert_ptr_nonnull(strstr(r.out, "logit_ceiling"));
    ck_assert_ptr_nonnull(strstr(r.out, "threshold"));
    cli_result_free(&r);
    r = cli_run(d.dir, "--db", d.db, "alerts", "--format", "csv");
    ck_assert(!strncmp(r.out, "id,time,time_ms,run,run_id,layer,head,step,rule,state,value,", 60));
    cli_result_free(&r);

    /* watch saw the raises and clears as they happened */
    deadline = dh_now_ms() + 60000;
    for (;;) {
        char *w = cli_slurp(wout);
        int n = 0;
        for (const char *p = w; (p = strstr(p, "\"rule\": \"logit_ceiling\"")); p++)
            n++;
        free(w);
        if (n >= 16)
            break;
        ck_assert_msg(dh_now_ms() < deadline, "attnstat watch printed %d of 16 alerts", n);
        dh_sleep_ms(50);
    }
    kill(wpid, SIGINT);
    int st;
    waitpid(wpid, &st, 0);
    ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "watch exit status %d", st);

    /* history works with the daemon down */
    ck_assert_int_eq(dh_stop(&d), 0);
    r = cli_run(d.dir, "--db", d.db, "alerts", "--run", "alerty");
    ck_assert_int_eq(r.status, 0);
    ck_assert_ptr_nonnull(strstr(r.out, "cleared"));
    cli_result_free(&r);
    r = cli_run(d.dir, "--socket", d.sock, "status");
    ck_assert_int_eq(r.status, 1);
    ck_assert_ptr_nonnull(strstr(r.err, "cannot connect"));
    cli_result_free(&r);
    dh_cleanup(&d, 0);
}
END_TEST

/* ---- Numbers in cells, runs given by id, layer and head numbers up to INT32_MAX ----------------*/
static void db_exec(sqlite3 *db, const char *sql)
{
    char *msg = NULL;
    int rc = sqlite3_exec(db, sql, NULL, NULL, &msg);
    ck_assert_msg(rc == SQLITE_OK, "%s: %s", sql, msg ? msg : "?");
}

/* Adds one sample of run_id with max logit ml (and a healthy entropy) at (layer, head, step). */
static void db_sample(sqlite3 *db, int64_t run_id, int64_t layer, int64_t head, int64_t step,
                      double ml)
{
    char sql[512];
    snprintf(sql, sizeof sql,
             "INSERT OR REPLACE INTO samples (run_id, layer, head, step, time, rows, rows_norm, "
             "rows_empty, nonfinite_rows, entropy_mean, entropy_std, entropy_min, entropy_max, "
             "entropy_norm_mean, collapsed_frac, max_logit, sampled) VALUES (%lld, %lld, %lld, "
             "%lld, 1700000000000, 32, 32, 0, 0, 2.5, 0.1, 2.0, 3.0, 0.7, 0.0, %.17g, 32)",
             (long long)run_id, (long long)layer, (long long)head, (long long)step, ml);
    db_exec(db, sql);
}

/* The heatmap's rows (the lines starting "layer ") are all as wide as its header (the line after
 * the title, which starts "run "). */
static void assert_heatmap_aligned(const char *out)
{
    const char *t = strstr(out, "run ");
    ck_assert_ptr_nonnull(t);
    const char *hdr = strchr(t, '\n') + 1;
    const char *he = strchr(hdr, '\n');
    ck_assert_ptr_nonnull(he);
    size_t w0 = line_width(hdr, (size_t)(he - hdr));
    int rows = 0;
    for (const char *p = he + 1; !strncmp(p, "layer ", 6); rows++) {
        const char *e = strchr(p, '\n');
        ck_assert_ptr_nonnull(e);
        size_t w = line_width(p, (size_t)(e - p));
        ck_assert_msg(w == w0, "heatmap row %d is %zu wide, its header %zu:\n%s", rows, w, w0, out);
        p = e + 1;
    }
    ck_assert_int_gt(rows, 0);
}

START_TEST(test_cli_cells_run_ids_and_huge_numbers)
{
    tu_rng rng = {tu_seed()};
    dh_daemon d;
    dh_dir_init(&d);
    dh_start(&d, NULL);
    const char *names[] = {"logits", "deep", "wide"};
    for (int i = 0; i < 3; i++) {
        attnstat_client *c = cli_trainer(d.sock, names[i], 0, NULL, 0, 0);
        cli_push_steps(c, &rng, 0, 1, 1, 1.0);
        attnstat_close(c);
    }
    ck_assert_int_eq(dh_stop(&d), 0);

    /* Step 1 of each run written straight into the database, with the values wanted. */
    int64_t id[3];
    sqlite3 *db = cli_db_runs(d.db, names, 3, id);
    /* logits: max logits that a 4-character cell used to cut (12345 showed as "1e+0") */
    const double ml[2][4] = {{12345, -12345, -1234, 1234567}, {0.5, 99999, -0.25, 1e21}};
    for (int l = 0; l < 2; l++)
        for (int h = 0; h < 4; h++)
            db_sample(db, id[0], l, h, 1, ml[l][h]);
    /* deep: layer and head numbers at INT32_MAX next to ordinary ones */
    for (int h = 0; h < 4; h++)
        db_sample(db, id[1], 0, h, 1, 5.0 + h);
    db_sample(db, id[1], 2147483647, 0, 1, 7.0);
    db_sample(db, id[1], 0, 2147483647, 1, 8.0);
    /* wide: 20 heads (no values in the cells) over 120 layers (3-digit layer labels) */
    db_exec(db, "BEGIN");
    for (int l = 0; l < 120; l += 7)
        for (int h = 0; h < 20; h++)
            db_sample(db, id[2], l, h, 1, 1.0 + l + h);
    db_sample(db, id[2], 119, 19, 1, 3.0);
    db_exec(db, "COMMIT");
    /* the runs' summary, which finds the latest step */
    db_exec(db, "UPDATE runs SET step_max = 1, samples = (SELECT count(*) FROM samples WHERE "
                "samples.run_id = runs.id)");
    sqlite3_close(db);

    /* (A) every number whole in the heatmap's cells, the cells aligned under their header */
    cli_result r = cli_run(d.dir, "--db", d.db, "heads", "--run", "logits", "--metric", "max_logit");
    ck_assert_msg(r.status == 0, "%s", r.err);
    const char *want[] = {"12.3k", "-12k", "-1234", "1.23M", "0.50", "100k", "-0.25", "1e21"};
    for (int i = 0; i < 8; i++)
        ck_assert_msg(strstr(r.out, want[i]), "no '%s' in:\n%s", want[i], r.out);
    for (const char *p = strstr(r.out, "\nlayer "); p; p = strstr(p + 1, "\nlayer ")) {
        const char *e = strchr(p + 1, '\n');
        ck_assert_msg(!memmem(p, (size_t)(e - p), "e+", 2), "a cut number in:\n%s", r.out);
    }
    assert_heatmap_aligned(r.out);
    cli_result_free(&r);
    r = cli_run(d.dir, "--db", d.db, "heads", "--run", "logits", "--metric", "max_logit", "--color",
                "always");
    ck_assert_msg(r.status == 0, "%s", r.err);
    for (int i = 0; i < 8; i++)
        ck_assert_msg(strstr(r.out, want[i]), "no '%s' in:\n%s", want[i], r.out);
    cli_result_free(&r);
    r = cli_run(d.dir, "--db", d.db, "heads", "--run", "wide", "--metric", "max_logit");
    ck_assert_msg(r.status == 0, "%s", r.err);
    ck_assert_ptr_nonnull(strstr(r.out, "h16"));
    ck_assert_ptr_nonnull(strstr(r.out, "layer 119"));
    assert_heatmap_aligned(r.out);
    cli_result_free(&r);

    /* (B) --run given by id: every output names the run */
    char sid[32];
    snprintf(sid, sizeof sid, "%lld", (long long)id[0]);
    r = cli_run(d.dir, "--db", d.db, "heads", "--run", sid, "--format", "csv");
    ck_assert_msg(r.status == 0, "%s", r.err);
    ck_assert_int_eq(cli_count_lines(r.out), 1 + 8);
    ck_assert_msg(strstr(r.out, "\nlogits,") && !strstr(r.out, "\n1,"), "%s", r.out);
    cli_result_free(&r);
    r = cli_run(d.dir, "--db", d.db, "heads", "--run", sid, "--format", "json");
    ck_assert_msg(r.status == 0, "%s", r.err);
    ck_assert_msg(cli_json_has(r.out, "run", "logits"), "%s", r.out);
    cli_result_free(&r);
    r = cli_run(d.dir, "--db", d.db, "heads", "--run", sid);
    ck_assert_msg(r.status == 0, "%s", r.err);
    ck_assert_msg(strstr(r.out, "run logits, step 1"), "%s", r.out);
    cli_result_free(&r);
    r = cli_run(d.dir, "--db", d.db, "trend", "--run", sid, "--layer", "0", "--format", "json");
    ck_assert_msg(r.status == 0, "%s", r.err);
    ck_assert_msg(cli_json_has(r.out, "run", "logits") && !strstr(r.out, "\"run\": \"1\""), "%s", r.out);
    cli_result_free(&r);
    r = cli_run(d.dir, "--db", d.db, "trend", "--run", sid, "--layer", "0");
    ck_assert_msg(r.status == 0, "%s", r.err);
    ck_assert_msg(strstr(r.out, "run logits, layer 0"), "%s", r.out);
    cli_result_free(&r);
    r = cli_run(d.dir, "--db", d.db, "alerts", "--run", sid);
    ck_assert_msg(r.status == 0, "%s", r.err);
    ck_assert_msg(strstr(r.out, "no alerts for run logits"), "%s", r.out);
    cli_result_free(&r);
    r = cli_run(d.dir, "--db", d.db, "heads", "--run", sid, "--step", "7");
    ck_assert_int_eq(r.status, 1);
    ck_assert_msg(strstr(r.err, "run 'logits' has no samples at step 7"), "%s", r.err);
    cli_result_free(&r);

    /* (C) layer and head numbers at INT32_MAX: no overflow, a grid that size refused by name */
    r = cli_run(d.dir, "--db", d.db, "heads", "--run", "deep");
    ck_assert_msg(r.status == 1, "status %d: %s", r.status, r.err);
    ck_assert_msg(strstr(r.err, "2147483648 x 2147483648 heatmap") && strstr(r.err, "--format") &&
                      !strstr(r.err, "out of memory"),
                  "%s", r.err);
    cli_result_free(&r);
    r = cli_run(d.dir, "--db", d.db, "heads", "--run", "deep", "--format", "csv");
    ck_assert_msg(r.status == 0, "%s", r.err);
    ck_assert_int_eq(cli_count_lines(r.out), 1 + 6);
    ck_assert_ptr_nonnull(strstr(r.out, ",2147483647,"));
    cli_result_free(&r);
    r = cli_run(d.dir, "--db", d.db, "trend", "--run", "deep", "--layer", "5");
    ck_assert_int_eq(r.status, 1);
    /* layer 5 lies within 0..INT32_MAX (it used to read as past a wrapped-around count) */
    ck_assert_msg(strstr(r.err, "run 'deep' layer 5 has no samples in steps"), "%s", r.err);
    cli_result_free(&r);
    r = cli_run(d.dir, "--db", d.db, "trend", "--run", "deep", "--layer", "0", "--from", "1",
                "--per-head");
    ck_assert_msg(r.status == 0, "status %d: %s", r.status, r.err);
    ck_assert_ptr_nonnull(strstr(r.out, "head 3\n"));
    ck_assert_ptr_nonnull(strstr(r.out, "head 2147483647\n"));
    cli_result_free(&r);
    r = cli_run(d.dir, "--db", d.db, "trend", "--run", "deep", "--layer", "2147483647",
                "--per-head");
    ck_assert_msg(r.status == 0, "status %d: %s", r.status, r.err);
    ck_assert_ptr_nonnull(strstr(r.out, "head 0\n"));
    cli_result_free(&r);
    dh_cleanup(&d, 0);
}
END_TEST

/* ---- CLI errors --------------------------------------------------------------------------------*/
START_TEST(test_cli_errors)
{
    tu_rng rng = {tu_seed()};
    dh_daemon d;
    dh_dir_init(&d);
    dh_start(&d, NULL);
    attnstat_client *c = cli_trainer(d.sock, "known-run", 0, NULL, 0, 0);
    cli_push_steps(c, &rng, 0, 2, 1, 1.0);
    attnstat_close(c);
    ck_assert_int_eq(dh_stop(&d), 0);

    cli_result r = cli_run(d.dir, "--db", d.db, "trend", "--run", "nope", "--layer", "0");
    ck_assert_int_eq(r.status, 1);
    ck_assert_ptr_nonnull(strstr(r.err, "no run 'nope'"));
    ck_assert_ptr_nonnull(strstr(r.err, "known runs: known-run"));
    cli_result_free(&r);
    r = cli_run(d.dir, "--db", d.db, "heads", "--run", "known-run", "--step", "99");
    ck_assert_int_eq(r.status, 1);
    ck_assert_ptr_nonnull(strstr(r.err, "no samples at step 99"));
    cli_result_free(&r);
    r = cli_run(d.dir, "--db", d.db, "trend", "--run", "known-run", "--layer", "7");
    ck_assert_int_eq(r.status, 1);
    ck_assert_ptr_nonnull(strstr(r.err, "no layer 7"));
    cli_result_free(&r);
    char missing[400];
    snprintf(missing, sizeof missing, "%s/none.db", d.dir);
    r = cli_run(d.dir, "--db", missing, "runs");
    ck_assert_int_eq(r.status, 1);
    ck_assert_ptr_nonnull(strstr(r.err, "does not exist"));
    ck_assert_ptr_nonnull(strstr(r.err, missing));
    cli_result_free(&r);
    r = cli_run(d.dir, "--db", d.db, "trend", "--run", "known-run");
    ck_assert_int_eq(r.status, 2);
    ck_assert_ptr_nonnull(strstr(r.err, "--layer"));
    cli_result_free(&r);
    r = cli_run(d.dir, "--db", d.db, "frobnicate");
    ck_assert_int_eq(r.status, 2);
    ck_assert_ptr_nonnull(strstr(r.err, "unknown command 'frobnicate'"));
    cli_result_free(&r);
    r = cli_run(d.dir, "--db", d.db, "runs", "--bogus");
    ck_assert_int_eq(r.status, 2);
    ck_assert_ptr_nonnull(strstr(r.err, "--bogus"));
    cli_result_free(&r);
    r = cli_run(d.dir, "--db", d.db, "runs", "--format", "xml");
    ck_assert_int_eq(r.status, 2);
    cli_result_free(&r);
    r = cli_run(d.dir, "--db", d.db, "trend", "--run", "known-run", "--layer", "x");
    ck_assert_int_eq(r.status, 2);
    ck_assert_ptr_nonnull(strstr(r.err, "--layer wants an integer"));
    cli_result_free(&r);
    const char *cmds[] = {"runs", "trend", "heads", "alerts", "status", "watch"};
    for (int i = 0; i < 6; i++) {
        r = cli_run(d.dir, cmds[i], "--help");
        ck_assert_int_eq(r.status, 0);
        ck_assert_ptr_nonnull(strstr(r.out, "usage: attnstat"));
        ck_assert_ptr_nonnull(strstr(r.out, cmds[i]));
        cli_result_free(&r);
    }
    r = cli_run(d.dir, "--help");
    ck_assert_int_eq(r.status, 0);
    cli_result_free(&r);
    r = cli_run(d.dir, "--socket", "/nonexistent/attnstatd.sock", "status");
    ck_assert_int_eq(r.status, 1);
    ck_assert_ptr_nonnull(strstr(r.err, "/nonexistent/attnstatd.sock"));
    cli_result_free(&r);
    dh_cleanup(&d, 0);
}
END_TEST

/* ---- A stopped daemon never blocks a push ------------------------------------------------------*/
START_TEST(test_push_never_blocks_on_stopped_daemon)
{
    tu_rng rng = {tu_seed()};
    dh_daemon d;
    dh_dir_init(&d);
    dh_start(&d, NULL);
    attnstat_client *c = cli_trainer(d.sock, "stopped", 0, NULL, 4u << 20, 64u << 10);
    tu_tensor q, k;
    tu_alloc(&q, 1, 4, 32, 32, STATS_BF16, TU_BHND);
    tu_alloc(&k, 1, 4, 32, 32, STATS_BF16, TU_BHND);
    tu_fill_gauss(&q, &rng, 1.0);
    tu_fill_gauss(&k, &rng, 1.0);
    attnstat_tensor aq = cli_tensor(&q), ak = cli_tensor(&k);
    attnstat_push_opts o;
    attnstat_push_opts_init(&o);

    ck_assert_int_eq(kill(d.pid, SIGSTOP), 0);
    const int n = 20000;
    int ok = 0, dropped = 0;
    for (int i = 0; i < n; i++) {
        o.step = i;
        attnstat_code rc = attnstat_push(c, &o, &aq, &ak, NULL);
        ck_assert_msg(rc == ATTNSTAT_OK || rc == ATTNSTAT_DROPPED, "push %d: %d %s", i, rc,
                      attnstat_last_error(c));
        ok += rc == ATTNSTAT_OK;
        dropped += rc == ATTNSTAT_DROPPED;
    }
    attnstat_counters st;
    attnstat_stats(c, &st);
    ck_assert_uint_eq(st.sent, (uint64_t)ok);
    ck_assert_uint_eq(st.dropped_local, (uint64_t)dropped);
    /* A 4 MiB ring holds 256 pushes of 16 KiB: nearly everything was dropped, and counted. */
    ck_assert_int_le(ok, 256);
    ck_assert_int_ge(dropped, n - 256);
    ck_assert_uint_eq(st.dropped_ring + st.dropped_queue, (uint64_t)dropped);

    ck_assert_int_eq(kill(d.pid, SIGCONT), 0);
    ck_assert_msg(attnstat_flush(c, 120000) == ATTNSTAT_OK, "%s", attnstat_last_error(c));
    attnstat_stats(c, &st);
    ck_assert_uint_eq(st.acked + st.dropped_daemon + st.rejected, st.sent);
    ck_assert_uint_eq(st.rejected, 0);
    ck_assert_uint_eq(st.ring_used, 0);
    /* and the client is usable again */
    ck_assert_int_eq(attnstat_push(c, &o, &aq, &ak, NULL), ATTNSTAT_OK);
    ck_assert_int_eq(attnstat_flush(c, 60000), ATTNSTAT_OK);
    attnstat_close(c);
    tu_free(&q);
    tu_free(&k);
    ck_assert_int_eq(dh_stop(&d), 0);
    dh_cleanup(&d, 0);
}
END_TEST

int main(void)
{
    const TTest *tests[] = {test_values_equal_reference, test_cli_formats_and_alerts,
                            test_cli_errors, test_cli_cells_run_ids_and_huge_numbers,
                            test_push_never_blocks_on_stopped_daemon};
    return cli_run_tests("client_e2e", tests, (int)(sizeof tests / sizeof tests[0]));
}
