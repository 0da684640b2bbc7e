/* test_cli_interv.c — `attnstat interventions` on a database written through the store: a job of
 * two ranks (a name both share lists both, --rank one) and another run, fresh random interventions
 * at known times; json (--json and --format json) gives every field exactly, heads and values as
 * the arrays stored, in the order run, step, id; --layer, --kind, --since and --until keep exactly
 * the rows they should; a table shows heads with their values and says when nothing matched; csv
 * has a header and a row each; a run by id; delete-run (the database changed directly, no daemon)
 * takes a run's interventions and no other's; check-db finds the database whole. The seed is
 * printed (ATTNSTAT_TEST_SEED repeats). */
#include "cli_harness.h"
#include "daemon_harness.h"
#include "store_read.h"
#include "store_write.h"

#define NIV 30 /* interventions per run */
#define NRUN 3
static const int64_t T0 = 1740787200000; /* 2025-03-01T00:00:00Z */

typedef struct {
    int64_t run_id, step, time_ms;
    int32_t rank, layer, nheads;
    char kind[16];
    int32_t heads[16];
    double values[16];
    int has_values;
    double threshold, measured;
} want_iv;

static want_iv want[NRUN * NIV];
static int64_t run_ids[NRUN];

static double unit(dh_rng *r)
{
    return (double)(dh_next(r) >> 11) / 9007199254740992.0;
}

/* Runs "clip" rank 0 and 1 and "other" rank 0, NIV random interventions each, one a minute from T0
 * (run r's i-th at T0 + (i * NRUN + r) minutes), steps ascending per run. */
static void write_db(const char *path, dh_rng *r)
{
    store_error err = {0};
    store *st = store_open(path, 0, &err);
    ck_assert_msg(st != NULL, "%s", err.msg);
    const char *names[NRUN] = {"clip", "clip", "other"};
    for (int k = 0; k < NRUN; k++) {
        store_run_info info = {.name = names[k], .rank = k == 1, .host = "n1", .time_ms = T0};
        ck_assert_msg(store_run_begin(st, &info, &run_ids[k], &err) == STORE_OK, "%s", err.msg);
    }
    static const char *const kinds[] = {"qk_clip", "qk_clip", "lr.scale"};
    for (int i = 0; i < NIV; i++)
        for (int k = 0; k < NRUN; k++) {
            want_iv *w = &want[k * NIV + i];
            memset(w, 0, sizeof *w);
            w->run_id = run_ids[k];
            w->rank = k == 1;
            w->step = i * 10 + (int64_t)(dh_next(r) % 10);
            w->time_ms = T0 + (int64_t)(i * NRUN + k) * 60000;
            w->layer = dh_next(r) % 5 ? (int32_t)(dh_next(r) % 4) + 8 * w->rank : -1;
            snprintf(w->kind, sizeof w->kind, "%s", kinds[dh_next(r) % 3]);
            w->nheads = 1 + (int32_t)(dh_next(r) % 16);
            w->has_values = dh_next(r) % 4 != 0;
            for (int h = 0; h < w->nheads; h++) {
                w->heads[h] = (int32_t)(dh_next(r) % 64);
                w->values[h] = 1.0 - unit(r);
            }
            w->threshold = dh_next(r) % 4 ? 50.0 + 100.0 * unit(r) : NAN;
            w->measured = dh_next(r) % 4 ? 100.0 + 100.0 * unit(r) : NAN;
            store_intervention iv = {.run_id = w->run_id, .rank = w->rank, .step = w->step,
                                     .time_ms = w->time_ms, .kind = w->kind, .layer = w->layer,
                                     .heads = w->heads, .nheads = w->nheads,
                                     .values = w->has_values ? w->values : NULL,
                                     .threshold = w->threshold, .measured = w->measured,
                                     .detail = i % 2 ? "{\"note\":\"x\"}" : NULL};
            ck_assert_msg(store_add_intervention(st, &iv, NULL, &err) == STORE_OK, "%s", err.msg);
        }
    ck_assert_msg(store_commit(st, &err) == STORE_OK, "%s", err.msg);
    store_close(st);
}

/* The JSON arrays of w's heads and values as the CLI prints them. */
static void arrays(const want_iv *w, char *heads, char *vals, size_t n)
{
    size_t a = (size_t)snprintf(heads, n, "\"heads\": ["), b = (size_t)snprintf(vals, n,
                                                                               "\"values\": [");
    for (int h = 0; h < w->nheads; h++) {
        a += (size_t)snprintf(heads + a, n - a, "%s%d", h ? "," : "", w->heads[h]);
        b += (size_t)snprintf(vals + b, n - b, "%s%.17g", h ? "," : "", w->values[h]);
    }
    snprintf(heads + a, n - a, "]");
    if (w->has_values)
        snprintf(vals + b, n - b, "]");
    else
        snprintf(vals, n, "\"values\": null");
}

/* Every JSON line of out against the wanted rows that keep() keeps, in the CLI's order (run id,
 * then step, then insertion); returns how many. job: export's lines (the job's name and the
 * process's rank, no run id), else the interventions command's. */
static int check_json_of(const char *out, int (*keep)(const want_iv *, const void *),
                         const void *arg, const char *job)
{
    /* the wanted order: run ids ascend with k; within a run the steps ascend with i */
    const char *l = out;
    int n = 0;
    for (int k = 0; k < NRUN; k++)
        for (int i = 0; i < NIV; i++) {
            const want_iv *w = &want[k * NIV + i];
            if (!keep(w, arg))
                continue;
            ck_assert_msg(*l, "line %d missing; output:\n%s", n, out);
            const char *e = strchr(l, '\n');
            ck_assert_ptr_nonnull(e);
            char line[4096];
            snprintf(line, sizeof line, "%.*s", (int)(e - l), l);
            ck_assert_msg((job ? cli_json_has(line, "job", job) && !strstr(line, "\"run_id\"")
                               : cli_json_num(line, "run_id") == (double)w->run_id) &&
                              cli_json_num(line, "step") == (double)w->step &&
                              cli_json_num(line, "rank") == (double)w->rank &&
                              cli_json_num(line, "time_ms") == (double)w->time_ms,
                          "line %d: %s (want run %lld step %lld)", n, line, (long long)w->run_id,
                          (long long)w->step);
            ck_assert_msg(w->layer < 0 ? isnan(cli_json_num(line, "layer"))
                                       : cli_json_num(line, "layer") == w->layer,
                          "line %d layer: %s", n, line);
            ck_assert_msg(cli_json_has(line, "kind", w->kind), "line %d kind: %s", n, line);
            char heads[512], vals[1024];
            arrays(w, heads, vals, sizeof heads);
            ck_assert_msg(strstr(line, heads), "line %d: %s lacks %s", n, line, heads);
            ck_assert_msg(strstr(line, vals), "line %d: %s lacks %s", n, line, vals);
            double th = cli_json_num(line, "threshold"), me = cli_json_num(line, "measured");
            ck_assert_msg((isnan(w->threshold) ? isnan(th) : th == w->threshold) &&
                              (isnan(w->measured) ? isnan(me) : me == w->measured),
                          "line %d threshold/measured: %s", n, line);
            l = e + 1;
            n++;
        }
    ck_assert_msg(*l == '\0', "more lines than wanted:\n%s", l);
    return n;
}

static int check_json(const char *out, int (*keep)(const want_iv *, const void *), const void *arg)
{
    return check_json_of(out, keep, arg, NULL);
}

static int keep_run(const want_iv *w, const void *arg)
{
    const int64_t *ids = arg; /* ids[0], ids[1]: the runs kept (0: none) */
    return w->run_id == ids[0] || w->run_id == ids[1];
}

typedef struct {
    int64_t run_a, run_b;
    int32_t layer; /* -2: any */
    const char *kind;
    int64_t since, until;
} filt;

static int keep_filt(const want_iv *w, const void *arg)
{
    const filt *f = arg;
    return (w->run_id == f->run_a || w->run_id == f->run_b) &&
           (f->layer == -2 || w->layer == f->layer) && (!f->kind || !strcmp(w->kind, f->kind)) &&
           w->time_ms >= f->since && w->time_ms <= f->until;
}

static void rfc3339(int64_t ms, char *buf, size_t n)
{
    time_t t = (time_t)(ms / 1000);
    struct tm tm;
    gmtime_r(&t, &tm);
    strftime(buf, n, "%Y-%m-%dT%H:%M:%SZ", &tm);
}

START_TEST(test_interventions_listed)
{
    dh_rng r = dh_rng_new("cli_interv");
    dh_daemon d;
    dh_dir_init(&d);
    write_db(d.db, &r);

    /* a name two ranks share: both, by run id then step */
    cli_result res = cli_run(d.dir, "--db", d.db, "interventions", "clip", "--json");
    ck_assert_msg(res.status == 0, "%s", res.err);
    int64_t both[2] = {run_ids[0], run_ids[1]};
    ck_assert_int_eq(check_json(res.out, keep_run, both), 2 * NIV);
    cli_result_free(&res);
    /* --rank 1, as --run and --format json */
    res = cli_run(d.dir, "--db", d.db, "--format", "json", "interventions", "--run", "clip",
                  "--rank", "1");
    ck_assert_msg(res.status == 0, "%s", res.err);
    int64_t one[2] = {run_ids[1], 0};
    ck_assert_int_eq(check_json(res.out, keep_run, one), NIV);
    cli_result_free(&res);
    /* a run by id */
    char id[32];
    snprintf(id, sizeof id, "%lld", (long long)run_ids[2]);
    res = cli_run(d.dir, "--db", d.db, "interventions", id, "--json");
    ck_assert_msg(res.status == 0, "%s", res.err);
    int64_t other[2] = {run_ids[2], 0};
    ck_assert_int_eq(check_json(res.out, keep_run, other), NIV);
    cli_result_free(&res);

    /* the filters, each against what the rows say */
    for (int round = 0; round < 4; round++) {
        filt f = {run_ids[0], run_ids[1], -2, NULL, INT64_MIN, INT64_MAX};
        const char *args[20] = {"--db", d.db, "interventions", "clip", "--json"};
        int na = 5;
        char ls[16], since[40], until[40];
        if (round == 0 || round == 3) {
            f.layer = (int32_t)(dh_next(&r) % 4);
            snprintf(ls, sizeof ls, "%d", f.layer);
            args[na++] = "--layer";
            args[na++] = ls;
        }
        if (round == 1 || round == 3) {
            f.kind = dh_next(&r) % 2 ? "qk_clip" : "lr.scale";
            args[na++] = "--kind";
            args[na++] = f.kind;
        }
        if (round >= 2) {
            int a = (int)(dh_next(&r) % (NIV * NRUN / 2)), b = a + (int)(dh_next(&r) % 40);
            f.since = T0 + (int64_t)a * 60000;
            f.until = T0 + (int64_t)b * 60000;
            rfc3339(f.since, since, sizeof since);
            rfc3339(f.until, until, sizeof until);
            args[na++] = "--since";
            args[na++] = since;
            args[na++] = "--until";
            args[na++] = until;
        }
        args[na] = NULL;
        res = cli_run_v(d.dir, args);
        ck_assert_msg(res.status == 0, "round %d: %s", round, res.err);
        int got = check_json(res.out, keep_filt, &f);
        int want_n = 0;
        for (int k = 0; k < NRUN * NIV; k++)
            want_n += keep_filt(&want[k], &f);
        ck_assert_int_eq(got, want_n);
        cli_result_free(&res);
    }

    /* a table: heads with their values; nothing matched is said */
    res = cli_run(d.dir, "--db", d.db, "interventions", "other");
    ck_assert_msg(res.status == 0, "%s", res.err);
    ck_assert_int_eq(cli_count_lines(res.out), NIV + 1);
    const want_iv *w = NULL;
    for (int i = 0; i < NIV && !w; i++)
        if (want[2 * NIV + i].has_values)
            w = &want[2 * NIV + i];
    ck_assert_ptr_nonnull(w);
    char cell[64];
    snprintf(cell, sizeof cell, "%d=%.4g", w->heads[0], w->values[0]);
    ck_assert_msg(strstr(res.out, cell), "table lacks %s:\n%s", cell, res.out);
    cli_result_free(&res);
    res = cli_run(d.dir, "--db", d.db, "interventions", "other", "--kind", "none.such");
    ck_assert_int_eq(res.status, 0);
    ck_assert_msg(strstr(res.out, "no interventions"), "%s", res.out);
    cli_result_free(&res);
    /* csv: a header, a row each, the arrays whole */
    res = cli_run(d.dir, "--db", d.db, "--format", "csv", "interventions", "other");
    ck_assert_msg(res.status == 0, "%s", res.err);
    ck_assert_int_eq(cli_count_lines(res.out), NIV + 1);
    ck_assert_msg(!strncmp(res.out, "time,time_ms,run,run_id,rank,step,layer,kind,heads,values,",
                           58), "%s", res.out);
    cli_result_free(&res);
    /* usage: no run */
    res = cli_run(d.dir, "--db", d.db, "interventions");
    ck_assert_int_eq(res.status, 2);
    ck_assert_msg(strstr(res.err, "interventions RUN"), "%s", res.err);
    cli_result_free(&res);

    /* check-db takes the database with its interventions as whole */
    res = cli_run(d.dir, "--db", d.db, "check-db");
    ck_assert_msg(res.status == 0 && strstr(res.out, "ok"), "%s%s", res.out, res.err);
    cli_result_free(&res);

    /* delete-run, the database changed directly: that run's go, the others stay */
    char sock[400];
    snprintf(sock, sizeof sock, "%s/no-daemon.sock", d.dir);
    res = cli_run(d.dir, "--db", d.db, "--socket", sock, "delete-run", "--run", "other");
    ck_assert_msg(res.status == 0, "%s%s", res.out, res.err);
    cli_result_free(&res);
    sqlite3 *db = dh_db_open(&d);
    char sql[160];
    snprintf(sql, sizeof sql, "SELECT count(*) FROM interventions WHERE run_id = %lld",
             (long long)run_ids[2]);
    ck_assert_int_eq(dh_db_int(db, sql), 0);
    ck_assert_int_eq(dh_db_int(db, "SELECT count(*) FROM interventions"), 2 * NIV);
    sqlite3_close(db);
    res = cli_run(d.dir, "--db", d.db, "interventions", "clip", "--json");
    ck_assert_int_eq(check_json(res.out, keep_run, both), 2 * NIV);
    cli_result_free(&res);
    dh_cleanup(&d, 0);
}
END_TEST

/* export --interventions: a job's interventions from every process, with the leading columns of
 * export's samples; JSON exactly as stored, the filters as the interventions command's (--since and
 * --until the times they were recorded), CSV a header and a row each with its heads as a JSON
 * array; --kind without --interventions refused; nothing matching said, not a failure. */
START_TEST(test_export_interventions)
{
    dh_rng r = dh_rng_new("cli_interv_export");
    dh_daemon d;
    dh_dir_init(&d);
    write_db(d.db, &r);
    int64_t both[2] = {run_ids[0], run_ids[1]};
    cli_result res = cli_run(d.dir, "--db", d.db, "export", "--run", "clip", "--interventions",
                             "--format", "json");
    ck_assert_msg(res.status == 0, "%s", res.err);
    ck_assert_int_eq(check_json_of(res.out, keep_run, both, "clip"), 2 * NIV);
    ck_assert_msg(cli_json_has(res.out, "host", "n1") && strstr(res.out, "\"tp_rank\": "),
                  "%.300s", res.out);
    cli_result_free(&res);

    for (int round = 0; round < 4; round++) {
        filt f = {run_ids[0], run_ids[1], -2, NULL, INT64_MIN, INT64_MAX};
        const char *args[20] = {"--db", d.db, "export", "--run", "clip", "--interventions",
                                "--format", "json"};
        int na = 8;
        char ls[16], since[40], until[40];
        if (round != 1) {
            f.layer = (int32_t)(dh_next(&r) % 4);
            snprintf(ls, sizeof ls, "%d", (int)f.layer);
            args[na++] = "--layer", args[na++] = ls;
        }
        if (round != 2) {
            f.kind = "qk_clip";
            args[na++] = "--kind", args[na++] = f.kind;
        }
        if (round != 3) { /* whole seconds, the times' own: minutes apart from T0 */
            int a = (int)(dh_next(&r) % (NIV * NRUN)), b = a + (int)(dh_next(&r) % 30);
            f.since = T0 + (int64_t)a * 60000, f.until = T0 + (int64_t)b * 60000;
            rfc3339(f.since, since, sizeof since);
            rfc3339(f.until, until, sizeof until);
            args[na++] = "--since", args[na++] = since, args[na++] = "--until", args[na++] = until;
        }
        args[na] = NULL;
        res = cli_run_v(d.dir, args);
        ck_assert_msg(res.status == 0, "round %d: %s", round, res.err);
        int got = check_json_of(res.out, keep_filt, &f, "clip");
        ck_assert_msg(got > 0 || strstr(res.err, "matching that"), "round %d: %s", round,
                      res.err);
        cli_result_free(&res);
    }

    /* CSV: the header, then a row per intervention in order, heads as a JSON array */
    res = cli_run(d.dir, "--db", d.db, "export", "--run", "clip", "--interventions");
    ck_assert_msg(res.status == 0, "%s", res.err);
    ck_assert_msg(!strncmp(res.out, "job,db,rank,host,", 17) &&
                      strstr(res.out, ",layer_offset,time,time_ms,step,layer,kind,heads,values,"
                                      "threshold,measured,detail,id\n"),
                  "%.300s", res.out);
    const char *l = strchr(res.out, '\n') + 1;
    for (int k = 0; k < 2; k++)
        for (int i = 0; i < NIV; i++) {
            const want_iv *w = &want[k * NIV + i];
            const char *e = strchr(l, '\n');
            ck_assert_msg(e != NULL, "row %d of rank %d missing", i, k);
            char line[4096], cell[600], tm[40];
            snprintf(line, sizeof line, "%.*s", (int)(e - l), l);
            size_t o = (size_t)snprintf(cell, sizeof cell, ",\"[");
            for (int h = 0; h < w->nheads; h++)
                o += (size_t)snprintf(cell + o, sizeof cell - o, "%s%d", h ? "," : "", w->heads[h]);
            snprintf(cell + o, sizeof cell - o, "]\",");
            rfc3339(w->time_ms, tm, sizeof tm);
            ck_assert_msg(!strncmp(line, "clip,", 5) && strstr(line, cell) &&
                              strstr(line, w->kind) && strstr(line, tm),
                          "rank %d row %d: %s (want heads %s at %s)", k, i, line, cell, tm);
            l = e + 1;
        }
    ck_assert_msg(*l == '\0', "more rows than wanted: %s", l);
    cli_result_free(&res);

    res = cli_run(d.dir, "--db", d.db, "export", "--run", "clip", "--kind", "qk_clip");
    ck_assert_msg(res.status == 2 && strstr(res.err, "--interventions"), "%d %s", res.status,
                  res.err);
    cli_result_free(&res);
    res = cli_run(d.dir, "--db", d.db, "export", "--run", "clip", "--interventions", "--kind",
                  "none.such");
    ck_assert_msg(res.status == 0 && strstr(res.err, "recorded an intervention matching") &&
                      cli_count_lines(res.out) == 1, "%d %s%s", res.status, res.out, res.err);
    cli_result_free(&res);
    dh_cleanup(&d, 0);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("cli_interventions");
    TCase *tc = tcase_create("interventions");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, test_interventions_listed);
    tcase_add_test(tc, test_export_interventions);
    suite_add_tcase(s, tc);
    return dh_run(s);
}
