/* bench_history.c — the history store (schema/) at the scale of real runs, through its own
 * functions, beside a plain SQLite program with the same schema (the limit). Run by hand:
 *   build/bench/bench_history [--steps 10000] [--layers 80] [--heads 64] [--dir /tmp] [--keep]
 *                             [--seconds 10] [--quick]
 * 1. Ingest of tiny pushes (one layer of 8 heads): the store (store_add_samples + store_commit)
 *    and a plain SQLite program doing the same inserts into the same tables (a plain INSERT, and
 *    the store's upsert), interleaved, 3 trials each: batched (100 pushes a commit) and a commit
 *    per push; STORE_SYNC_FULL too; and the plain program on version 1's key
 *    (run, layer, head, step) for the bytes it wrote.
 * 2. A database of layers x heads x steps samples (80 x 64 x 10 000 = 51.2 M by default), one
 *    push per layer, a commit per step, and after each commit one retention step (the default
 *    policy: compaction into the compact tier), as the daemon's upkeep would run; ~20 alert
 *    transitions per 100 steps. Insert rate, bytes per sample on disk, bytes written per sample
 *    (/proc/self/io), the retention step's lock time.
 * 3. Queries on a read-only handle (the CLI's): runs, grid (latest and older steps), the trend of
 *    one head and of a whole layer (every / from / to), active alerts, export.
 * 4. Retention: downsampling the older half by age (cost per sample, lock time), and ingest of a
 *    second run while another thread runs retention steps on its own handle, against the same
 *    ingest alone.
 * The database lives in --dir (default /tmp) and is deleted at the end unless --keep.
 * Includes store_read.h, store_write.h, store_retain.h, vocab.h (the exact tier's columns),
 * SQLite, libc, pthreads.
 */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <sqlite3.h>

#include "store_read.h"
#include "store_retain.h"
#include "store_write.h"
#include "vocab.h"

/* ---- measuring -------------------------------------------------------------------------------- */

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* CPU seconds of the calling thread (user + system): on a machine shared with other work, the
 * work done apart from the waiting. */
static double cpu_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

typedef struct {
    int64_t wchar, write_bytes;
} io_counts;

static io_counts proc_io(void)
{
    io_counts c = {0, 0};
    FILE *f = fopen("/proc/self/io", "r");
    char line[128];
    while (f && fgets(line, sizeof line, f)) {
        long long v;
        if (sscanf(line, "wchar: %lld", &v) == 1)
            c.wchar = v;
        else if (sscanf(line, "write_bytes: %lld", &v) == 1)
            c.write_bytes = v;
    }
    if (f)
        fclose(f);
    return c;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Percentile p (0..100) of v[0 .. n-1] (sorts v). */
static double pct(double *v, size_t n, double p)
{
    if (!n)
        return NAN;
    qsort(v, n, sizeof *v, cmp_double);
    size_t i = (size_t)(p / 100.0 * (double)(n - 1) + 0.5);
    return v[i < n ? i : n - 1];
}

static void die(const char *what, const store_error *e)
{
    fprintf(stderr, "bench_history: %s: %s\n", what, e ? e->msg : strerror(errno));
    exit(1);
}

/* ---- data ------------------------------------------------------------------------------------- */

static uint64_t rng = 0x9E3779B97F4A7C15ULL;

static double unit(void)
{
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (double)(rng >> 11) / 9007199254740992.0;
}

/* A pool of plausible heads (never all zeros): a push takes `heads` of them from a rotating
 * offset, so values change from push to push without a generator in the timed loop. */
enum { POOL = 4096 };
static stats_head pool[POOL + 128];

static void make_pool(void)
{
    for (int i = 0; i < POOL + 128; i++) {
        stats_head *h = &pool[i];
        memset(h, 0, sizeof *h);
        h->rows = 4096;
        h->rows_norm = 4095;
        h->rows_empty = i % 97 == 0;
        h->nonfinite_rows = i % 211 == 0;
        h->entropy_min = unit() * 2;
        h->entropy_max = h->entropy_min + unit() * 6;
        h->entropy_mean = h->entropy_min + unit() * (h->entropy_max - h->entropy_min);
        h->entropy_std = unit();
        h->entropy_norm_mean = unit();
        h->collapsed_frac = unit() * 0.1;
        h->max_logit = unit() * 40 - 5;
        h->sink_mass = unit() * 0.6;
        h->distance = unit() * 900;
        h->sampled = i % 3 == 0;
    }
}

static const stats_head *heads_at(int64_t k)
{
    return &pool[(uint64_t)k * 61 % POOL];
}

/* ---- 1. ingest beside the plain program ------------------------------------------------------- */

typedef struct {
    double secs, cpu;
    io_counts io;
} run_result;

static void path_in(char *out, size_t len, const char *dir, const char *name)
{
    snprintf(out, len, "%s/attnstat-bench-%d-%s.db", dir, (int)getpid(), name);
}

static void remove_db(const char *path)
{
    char p[600];
    unlink(path);
    snprintf(p, sizeof p, "%s-wal", path);
    unlink(p);
    snprintf(p, sizeof p, "%s-shm", path);
    unlink(p);
}

static run_result ingest_store(const char *path, int64_t pushes, int layers, int heads,
                               int per_commit, store_durability d)
{
    store_error err;
    store_options o = STORE_OPTIONS_DEFAULT;
    o.durability = d;
    store *st = store_open_ex(path, &o, &err);
    if (!st)
        die("store_open_ex", &err);
    store_run_info info = {.name = "ingest", .rank = 0, .time_ms = 1};
    int64_t run;
    if (store_run_begin(st, &info, &run, &err))
        die("store_run_begin", &err);
    io_counts a = proc_io();
    double t0 = now_s(), c0 = cpu_s();
    for (int64_t p = 0; p < pushes; p++) {
        if (store_add_samples(st, run, p / layers, (int32_t)(p % layers), heads_at(p), heads,
                              1700000000000 + p, &err))
            die("store_add_samples", &err);
        if ((p + 1) % per_commit == 0 && store_commit(st, &err))
            die("store_commit", &err);
    }
    if (store_commit(st, &err))
        die("store_commit", &err);
    run_result r = {now_s() - t0, cpu_s() - c0, proc_io()};
    r.io.wchar -= a.wchar;
    r.io.write_bytes -= a.write_bytes;
    store_close(st);
    return r;
}

static void plain_exec(sqlite3 *db, const char *sql)
{
    char *msg = NULL;
    if (sqlite3_exec(db, sql, NULL, NULL, &msg) != SQLITE_OK) {
        fprintf(stderr, "bench_history: %s: %s\n", sql, msg ? msg : "?");
        exit(1);
    }
}

/* The exact tier's columns from vocab.h's rows, as the store writes them (schema/store_sql.c), and
 * where each value sits in a stats_head. */
#define COL_(name, ...) ", " #name
#define REAL_COL_(name, ...) ", " #name " REAL"
#define PARAM_(name, ...) ", ?"
#define OFF_(name, ...) offsetof(stats_head, name),
static const size_t stat_off[VOCAB_NSTATS] = {VOCAB_STATS(OFF_)};
static const size_t count_off[VOCAB_NCOUNTS] = {VOCAB_COUNTS(OFF_)};

/* The limit: the same rows into the same tables (made by the store, or version 1's samples table
 * with v1_key), positional binds on one prepared INSERT, the run's summary updated once per
 * commit, nothing else. */
static run_result ingest_plain(const char *path, int64_t pushes, int layers, int heads,
                               int per_commit, int v1_key, int full, int upsert)
{
    store_error err;
    store *st = store_open(path, 0, &err); /* the schema */
    if (!st)
        die("store_open", &err);
    store_close(st);
    sqlite3 *db = NULL;
    if (sqlite3_open_v2(path, &db, SQLITE_OPEN_READWRITE, NULL) != SQLITE_OK)
        die("sqlite3_open_v2", NULL);
    plain_exec(db, "PRAGMA journal_mode = WAL");
    plain_exec(db, full ? "PRAGMA synchronous = FULL" : "PRAGMA synchronous = NORMAL");
    plain_exec(db, "PRAGMA foreign_keys = ON");
    if (v1_key)
        plain_exec(db, "DROP TABLE samples; CREATE TABLE samples (run_id INTEGER NOT NULL "
                       "REFERENCES runs(id) ON DELETE CASCADE, layer INTEGER NOT NULL CHECK "
                       "(layer >= 0), head INTEGER NOT NULL CHECK (head >= 0), step INTEGER NOT "
                       "NULL, time INTEGER NOT NULL, rows INTEGER NOT NULL, rows_norm INTEGER NOT "
                       "NULL, rows_empty INTEGER NOT NULL, nonfinite_rows INTEGER NOT NULL"
                       VOCAB_STATS(REAL_COL_) ", sampled "
                       "INTEGER NOT NULL DEFAULT 0, PRIMARY KEY (run_id, layer, head, step)) "
                       "WITHOUT ROWID; CREATE INDEX samples_step ON samples (run_id, step)");
    plain_exec(db, "INSERT INTO runs (id, name, started, last_hello) VALUES (1, 'ingest', 1, 1)");
    sqlite3_stmt *ins = NULL, *sum = NULL;
    char sql[1024];
    /* upsert: the store's statement (a sample pushed again replaces the stored one) */
    snprintf(sql, sizeof sql,
             "INSERT INTO samples (run_id, layer, head, step, time" VOCAB_COUNTS(COL_)
             VOCAB_STATS(COL_) ", sampled) VALUES (?1, ?2, ?3, ?4, ?5" VOCAB_COUNTS(PARAM_)
             VOCAB_STATS(PARAM_) ", ?)%s",
             upsert ? " ON CONFLICT (run_id, step, layer, head) DO NOTHING" : "");
    if (sqlite3_prepare_v3(db, sql, -1, SQLITE_PREPARE_PERSISTENT, &ins, NULL) != SQLITE_OK ||
        sqlite3_prepare_v3(db,
                           "UPDATE runs SET samples = samples + ?2, step_min = min(coalesce("
                           "step_min, ?3), ?3), step_max = max(coalesce(step_max, ?4), ?4), "
                           "last_time = max(coalesce(last_time, ?5), ?5) WHERE id = ?1",
                           -1, SQLITE_PREPARE_PERSISTENT, &sum, NULL) != SQLITE_OK) {
        fprintf(stderr, "bench_history: prepare: %s\n", sqlite3_errmsg(db));
        exit(1);
    }
    io_counts a = proc_io();
    double t0 = now_s(), c0 = cpu_s();
    int64_t batch_first = 0;
    plain_exec(db, "BEGIN IMMEDIATE");
    for (int64_t p = 0; p < pushes; p++) {
        const stats_head *hs = heads_at(p);
        int64_t step = p / layers, time = 1700000000000 + p;
        for (int h = 0; h < heads; h++) {
            const stats_head *x = &hs[h];
            sqlite3_bind_int64(ins, 1, 1);
            sqlite3_bind_int(ins, 2, (int)(p % layers));
            sqlite3_bind_int(ins, 3, h);
            sqlite3_bind_int64(ins, 4, step);
            sqlite3_bind_int64(ins, 5, time);
            int k = 6;
            for (int c = 0; c < VOCAB_NCOUNTS; c++)
                sqlite3_bind_int64(ins, k++, *(const int64_t *)(const void *)((const char *)x +
                                                                      count_off[c]));
            for (int f = 0; f < VOCAB_NSTATS; f++)
                sqlite3_bind_double(ins, k++, *(const double *)(const void *)((const char *)x +
                                                                      stat_off[f]));
            sqlite3_bind_int(ins, k, x->sampled);
            if (sqlite3_step(ins) != SQLITE_DONE) {
                fprintf(stderr, "bench_history: insert: %s\n", sqlite3_errmsg(db));
                exit(1);
            }
            sqlite3_reset(ins);
        }
        if ((p + 1) % per_commit == 0 || p + 1 == pushes) {
            sqlite3_bind_int64(sum, 1, 1);
            sqlite3_bind_int64(sum, 2, (p + 1 - batch_first) * heads);
            sqlite3_bind_int64(sum, 3, batch_first / layers);
            sqlite3_bind_int64(sum, 4, step);
            sqlite3_bind_int64(sum, 5, time);
            if (sqlite3_step(sum) != SQLITE_DONE)
                die("summary", NULL);
            sqlite3_reset(sum);
            plain_exec(db, "COMMIT");
            if (p + 1 < pushes)
                plain_exec(db, "BEGIN IMMEDIATE");
            batch_first = p + 1;
        }
    }
    run_result r = {now_s() - t0, cpu_s() - c0, proc_io()};
    r.io.wchar -= a.wchar;
    r.io.write_bytes -= a.write_bytes;
    sqlite3_finalize(ins);
    sqlite3_finalize(sum);
    sqlite3_close(db);
    return r;
}

static void ingest_section(const char *dir, int quick)
{
    enum { LAYERS = 4, HEADS = 8 };
    struct {
        const char *name;
        int64_t pushes;
        int per_commit, store, v1, full, upsert;
    } cases[] = {
        {"store, 100 pushes a commit", 200000, 100, 1, 0, 0, 1},
        {"plain SQLite, 100 pushes a commit", 200000, 100, 0, 0, 0, 0},
        {"plain SQLite upsert, 100 pushes a commit", 200000, 100, 0, 0, 0, 1},
        {"store, a commit per push", 40000, 1, 1, 0, 0, 1},
        {"plain SQLite, a commit per push", 40000, 1, 0, 0, 0, 0},
        {"store FULL, 100 pushes a commit", 100000, 100, 1, 0, 1, 1},
        {"plain SQLite FULL, 100 pushes a commit", 100000, 100, 0, 0, 1, 0},
        {"store FULL, a commit per push", 2000, 1, 1, 0, 1, 1},
        {"plain SQLite FULL, a commit per push", 2000, 1, 0, 0, 1, 0},
        {"plain SQLite, version 1's key, 100 pushes a commit", 200000, 100, 0, 1, 0, 0},
    };
    int ncases = (int)(sizeof cases / sizeof cases[0]), trials = quick ? 1 : 3;
    static double secs[16][3], cpu[16][3];
    static io_counts io[16];
    for (int t = 0; t < trials; t++)
        for (int c = 0; c < ncases; c++) { /* interleaved: the machine's noise hits all alike */
            char path[512];
            path_in(path, sizeof path, dir, "ingest");
            int64_t n = quick ? cases[c].pushes / 10 : cases[c].pushes;
            run_result r = cases[c].store
                               ? ingest_store(path, n, LAYERS, HEADS, cases[c].per_commit,
                                              cases[c].full ? STORE_SYNC_FULL : STORE_SYNC_NORMAL)
                               : ingest_plain(path, n, LAYERS, HEADS, cases[c].per_commit,
                                              cases[c].v1, cases[c].full, cases[c].upsert);
            secs[c][t] = r.secs;
            cpu[c][t] = r.cpu;
            if (t == 0)
                io[c] = r.io;
            remove_db(path);
        }
    printf("\n## 1. Ingest: tiny pushes (1 layer x %d heads), median of %d interleaved trials\n",
           HEADS, trials);
    printf("%-52s %9s %12s %12s %14s %14s %14s\n", "case", "pushes", "pushes/s", "samples/s",
           "samples/CPU-s", "wchar/sample", "written/sample");
    for (int c = 0; c < ncases; c++) {
        int64_t n = quick ? cases[c].pushes / 10 : cases[c].pushes;
        double s = pct(secs[c], (size_t)trials, 50), cs = pct(cpu[c], (size_t)trials, 50);
        double samples = (double)n * HEADS;
        printf("%-52s %9" PRId64 " %12.0f %12.0f %14.0f %14.1f %14.1f\n", cases[c].name, n,
               (double)n / s, samples / s, samples / cs, (double)io[c].wchar / samples,
               (double)io[c].write_bytes / samples);
    }
    fflush(stdout);
}

/* ---- 2. the big database ---------------------------------------------------------------------- */

typedef struct {
    int64_t steps;
    int layers, heads;
    int64_t run, samples, alerts;
    int64_t t0_ms; /* time of step 0; a step is 1 s */
} bigdb;

static void add_alerts(store *st, const bigdb *b, int64_t step, int32_t *raised)
{
    store_error err;
    /* every 5th step, one head changes state: ~20 transitions per 100 steps */
    if (step % 5)
        return;
    int32_t key = (int32_t)(unit() * 200);
    store_alert a = {.run_id = b->run, .layer = key % b->layers, .head = key % b->heads,
                     .step = step, .rule = key % 2 ? "entropy_floor" : "logit_ceiling",
                     .state = raised[key] ? STORE_ALERT_CLEARED : STORE_ALERT_RAISED,
                     .value = unit(), .threshold = 0.1, .time_ms = b->t0_ms + step * 1000,
                     .message = "bench"};
    raised[key] = !raised[key];
    if (store_add_alert(st, &a, &err))
        die("store_add_alert", &err);
}

static void build_section(const char *path, bigdb *b)
{
    store_error err;
    store_options o = STORE_OPTIONS_DEFAULT;
    o.cache_kib = 64 * 1024;
    store *st = store_open_ex(path, &o, &err);
    if (!st)
        die("store_open_ex", &err);
    store_run_info info = {.name = "big", .rank = 0, .time_ms = b->t0_ms};
    if (store_run_begin(st, &info, &b->run, &err))
        die("store_run_begin", &err);
    store_retention pol = STORE_RETENTION_DEFAULT;
    double *lock_ms = malloc((size_t)b->steps * 2 * sizeof *lock_ms);
    size_t nlock = 0;
    int32_t raised[256] = {0};
    double t_ingest = 0, t_retain = 0, c_ingest = 0, c_retain = 0, t_start = now_s();
    io_counts a = proc_io();
    int64_t compacted = 0;
    for (int64_t s = 0; s < b->steps; s++) {
        double t0 = now_s(), c0 = cpu_s();
        for (int l = 0; l < b->layers; l++)
            if (store_add_samples(st, b->run, s, l, heads_at(s * b->layers + l), b->heads,
                                  b->t0_ms + s * 1000, &err))
                die("store_add_samples", &err);
        add_alerts(st, b, s, raised);
        if (store_commit(st, &err))
            die("store_commit", &err);
        double t1 = now_s(), c1 = cpu_s();
        store_retain_report rep;
        if (store_retain_step(st, &pol, 0, &rep, &err))
            die("store_retain_step", &err);
        c_ingest += c1 - c0;
        c_retain += cpu_s() - c1;
        compacted += rep.compacted;
        if (rep.compacted)
            lock_ms[nlock++] = (double)rep.lock_us / 1000;
        t_ingest += t1 - t0;
        t_retain += now_s() - t1;
        if ((s + 1) % 1000 == 0) {
            fprintf(stderr, "  step %" PRId64 "/%" PRId64 ": %.0f s, %.0f samples/s\n", s + 1,
                    b->steps, now_s() - t_start,
                    (double)(s + 1) * b->layers * b->heads / (now_s() - t_start));
        }
    }
    store_retain_report rep;
    do {
        if (store_retain_step(st, &pol, 0, &rep, &err))
            die("store_retain_step", &err);
        compacted += rep.compacted;
    } while (rep.more);
    double total = now_s() - t_start;
    io_counts io = proc_io();
    b->samples = b->steps * b->layers * b->heads;
    int64_t used = rep.used_bytes;
    store_close(st);
    struct stat sb;
    int64_t file = stat(path, &sb) == 0 ? (int64_t)sb.st_size : -1;
    double per = (double)b->samples;
    printf("\n## 2. Build: %d layers x %d heads x %" PRId64 " steps = %" PRId64 " samples\n",
           b->layers, b->heads, b->steps, b->samples);
    printf("one push per layer (%d samples), a commit per step, one retention step after each "
           "(the default policy: exact_steps %d, budget %d samples), a 64 MiB page cache\n",
           b->heads, STORE_EXACT_STEPS_DEFAULT, STORE_RETAIN_BUDGET_DEFAULT);
    printf("total %.1f s: %.0f samples/s overall; ingest (add + commit) %.1f s = %.0f samples/s, "
           "%.0f pushes/s; retention %.1f s\n", total, per / total, t_ingest, per / t_ingest,
           (double)b->steps * b->layers / t_ingest, t_retain);
    printf("CPU: ingest %.1f s = %.0f samples per CPU-second; retention %.1f s = %.0f samples "
           "compacted per CPU-second\n", c_ingest, per / c_ingest, c_retain,
           (double)compacted / c_retain);
    printf("compacted %" PRId64 " samples; retention step lock time (ms): p50 %.2f p99 %.2f max "
           "%.2f over %zu calls that compacted\n", compacted, pct(lock_ms, nlock, 50),
           pct(lock_ms, nlock, 99), pct(lock_ms, nlock, 100), nlock);
    printf("on disk: %" PRId64 " bytes in use = %.2f bytes/sample (file %" PRId64 " bytes = "
           "%.2f/sample)\n", used, (double)used / per, file, (double)file / per);
    printf("written: wchar %.1f bytes/sample, write_bytes %.1f bytes/sample (/proc/self/io)\n",
           (double)(io.wchar - a.wchar) / per, (double)(io.write_bytes - a.write_bytes) / per);
    free(lock_ms);
    fflush(stdout);
}

/* The share of each table and index of the file (dbstat, when this SQLite has it). */
static void space_section(const char *path, const bigdb *b)
{
    sqlite3 *db = NULL;
    sqlite3_stmt *s = NULL;
    if (sqlite3_open_v2(path, &db, SQLITE_OPEN_READONLY, NULL) != SQLITE_OK ||
        sqlite3_prepare_v2(db, "SELECT name, sum(pgsize), count(*) FROM dbstat GROUP BY name "
                               "ORDER BY 2 DESC", -1, &s, NULL) != SQLITE_OK) {
        printf("(no dbstat in this SQLite: no per-table sizes)\n");
        sqlite3_close(db);
        return;
    }
    printf("per table and index:");
    while (sqlite3_step(s) == SQLITE_ROW)
        printf(" %s %.2f B/sample;", (const char *)sqlite3_column_text(s, 0),
               (double)sqlite3_column_int64(s, 1) / (double)b->samples);
    printf("\n");
    sqlite3_finalize(s);
    sqlite3_close(db);
}

/* ---- 3. queries ------------------------------------------------------------------------------- */

static int count_sample_cb(void *ctx, const store_sample *s)
{
    (void)s;
    (*(int64_t *)ctx)++;
    return 0;
}

static int count_run_cb(void *ctx, const store_run *r)
{
    (void)r;
    (*(int64_t *)ctx)++;
    return 0;
}

static int count_alert_cb(void *ctx, const store_alert *a)
{
    (void)a;
    (*(int64_t *)ctx)++;
    return 0;
}

typedef struct {
    int64_t rows, limit;
} export_ctx;

static int export_cb(void *ctx, const store_sample *s)
{
    export_ctx *e = ctx;
    char line[STORE_FORMAT_MAX];
    store_format_sample(s, STORE_FORMAT_CSV, line, sizeof line); /* as the CLI would */
    return ++e->rows >= e->limit;
}

enum { Q_RUNS, Q_GRID_LATEST, Q_GRID_OLD, Q_HEAD, Q_HEAD_RANGE, Q_LAYER, Q_LAYER_RANGE,
       Q_ALERTS_ACTIVE, Q_ALERTS_RUN, NQ };

static const char *const qname[NQ] = {
    "runs (list)",
    "heads: grid of the latest step",
    "heads: grid of an older step (compact tier)",
    "trend of one head, every step",
    "trend of one head, every 10th, from/to a 1/5 range",
    "trend of a whole layer, every step",
    "trend of a whole layer, every 10th, from/to a 1/5 range",
    "alerts --active (every run)",
    "alerts --active (the run)",
};

static int64_t query(store *st, const bigdb *b, int q)
{
    store_error err;
    int64_t n = 0, from = (int64_t)(unit() * (double)b->steps * 0.8);
    int32_t layer = (int32_t)(unit() * b->layers), head = (int32_t)(unit() * b->heads);
    store_status rs = STORE_OK;
    switch (q) {
    case Q_RUNS: rs = store_list_runs(st, count_run_cb, &n, &err); break;
    case Q_GRID_LATEST:
        rs = store_grid(st, b->run, STORE_STEP_LATEST, NULL, count_sample_cb, &n, &err);
        break;
    case Q_GRID_OLD:
        rs = store_grid(st, b->run, from, NULL, count_sample_cb, &n, &err);
        break;
    case Q_HEAD:
        rs = store_trend(st, b->run, layer, head, INT64_MIN, INT64_MAX, 1, count_sample_cb, &n,
                         &err);
        break;
    case Q_HEAD_RANGE:
        rs = store_trend(st, b->run, layer, head, from, from + b->steps / 5, 10, count_sample_cb,
                         &n, &err);
        break;
    case Q_LAYER:
        rs = store_trend(st, b->run, layer, -1, INT64_MIN, INT64_MAX, 1, count_sample_cb, &n,
                         &err);
        break;
    case Q_LAYER_RANGE:
        rs = store_trend(st, b->run, layer, -1, from, from + b->steps / 5, 10, count_sample_cb,
                         &n, &err);
        break;
    case Q_ALERTS_ACTIVE: rs = store_alerts(st, 0, 1, count_alert_cb, &n, &err); break;
    case Q_ALERTS_RUN: rs = store_alerts(st, b->run, 1, count_alert_cb, &n, &err); break;
    default: break;
    }
    if (rs)
        die(qname[q], &err);
    return n;
}

static void query_section(const char *path, const bigdb *b, const char *title, int reps)
{
    store_error err;
    store *st = store_open_readonly(path, 0, &err);
    if (!st)
        die("store_open_readonly", &err);
    printf("\n## 3. Queries%s: a read-only handle (the CLI's), %d runs each with random layer / "
           "head / step; the first call is the handle's first use of that statement\n", title,
           reps);
    printf("%-56s %10s %10s %10s %10s %12s\n", "query", "rows", "first ms", "median ms",
           "max ms", "median CPU ms");
    for (int q = 0; q < NQ; q++) {
        double ms[64], cms[64], first = 0;
        int64_t rows = 0;
        for (int r = 0; r < reps; r++) {
            double t0 = now_s(), c0 = cpu_s();
            rows = query(st, b, q);
            ms[r] = (now_s() - t0) * 1000;
            cms[r] = (cpu_s() - c0) * 1000;
            if (r == 0)
                first = ms[r];
        }
        printf("%-56s %10" PRId64 " %10.2f %10.2f %10.2f %12.2f\n", qname[q], rows, first,
               pct(ms, (size_t)reps, 50), pct(ms, (size_t)reps, 100),
               pct(cms, (size_t)reps, 50));
    }
    export_ctx e = {0, 2000000};
    double t0 = now_s(), c0 = cpu_s();
    if (store_export(st, b->run, export_cb, &e, &err))
        die("store_export", &err);
    double s = now_s() - t0, cs = cpu_s() - c0;
    printf("export (the first %" PRId64 " rows, formatted as CSV): %.2f s = %.0f rows/s (%.0f rows "
           "per CPU-second)\n", e.rows, s, (double)e.rows / s, (double)e.rows / cs);
    store_close(st);
    fflush(stdout);
}

/* ---- 4. retention ----------------------------------------------------------------------------- */

static void downsample_section(const char *path, const bigdb *b)
{
    store_error err;
    store *st = store_open(path, 0, &err);
    if (!st)
        die("store_open", &err);
    store_retention pol = STORE_RETENTION_DEFAULT;
    pol.now_ms = b->t0_ms + b->steps * 1000;
    pol.retain_ms = b->steps / 2 * 1000; /* the older half */
    double *lock_ms = malloc(100000 * sizeof *lock_ms);
    size_t n = 0;
    int64_t merged = 0, buckets = 0, used = 0;
    io_counts a = proc_io();
    double t0 = now_s(), c0 = cpu_s();
    store_retain_report rep;
    do {
        if (store_retain_step(st, &pol, 0, &rep, &err))
            die("store_retain_step", &err);
        merged += rep.downsampled;
        buckets += rep.buckets;
        used = rep.used_bytes;
        if (n < 100000)
            lock_ms[n++] = (double)rep.lock_us / 1000;
    } while (rep.more);
    double s = now_s() - t0, cs = cpu_s() - c0;
    io_counts io = proc_io();
    printf("\n## 4. Retention\n");
    printf("downsampling the older half by age (windows of %d steps, budget %d samples a call): "
           "%" PRId64 " samples into %" PRId64 " buckets in %.1f s = %.0f samples/s (%.0f per "
           "CPU-second); %zu calls, "
           "lock time per call (ms) p50 %.2f p99 %.2f max %.2f; written %.1f bytes per sample "
           "merged (write_bytes)\n", STORE_BUCKET_STEPS_DEFAULT, STORE_RETAIN_BUDGET_DEFAULT,
           merged, buckets, s, (double)merged / s, (double)merged / cs, n, pct(lock_ms, n, 50),
           pct(lock_ms, n, 99),
           pct(lock_ms, n, 100), (double)(io.write_bytes - a.write_bytes) / (double)merged);
    printf("bytes in use after: %" PRId64 " = %.2f bytes per sample stored\n", used,
           (double)used / (double)b->samples);
    free(lock_ms);
    store_close(st);
    fflush(stdout);
}

typedef struct {
    const char *path;
    store_retention pol;
    volatile int stop;
    int64_t calls, downsampled, compacted;
    double lock_ms[200000], wait_ms[200000];
    size_t n;
} retainer;

static void *retain_thread(void *arg)
{
    retainer *r = arg;
    store_error err;
    store *st = store_open(r->path, 0, &err);
    if (!st)
        die("store_open (retention thread)", &err);
    while (!r->stop) {
        store_retain_report rep;
        if (store_retain_step(st, &r->pol, 0, &rep, &err))
            die("store_retain_step (retention thread)", &err);
        r->calls++;
        r->downsampled += rep.downsampled;
        r->compacted += rep.compacted;
        if (r->n < 200000) {
            r->wait_ms[r->n] = (double)rep.wait_us / 1000;
            r->lock_ms[r->n++] = (double)rep.lock_us / 1000;
        }
        if (!rep.more) {
            struct timespec ts = {0, 10 * 1000 * 1000}; /* idle: look again in 10 ms */
            nanosleep(&ts, NULL);
        }
    }
    store_close(st);
    return NULL;
}

/* Ingest a run of b's shape for `seconds`: samples/s and commit latencies (ms). */
static double ingest_for(const char *path, const bigdb *b, const char *name, double seconds,
                         double *lat, size_t *nlat, double *cpu_rate)
{
    store_error err;
    store *st = store_open(path, 0, &err);
    if (!st)
        die("store_open", &err);
    store_run_info info = {.name = name, .rank = 0, .time_ms = b->t0_ms};
    int64_t run;
    if (store_run_begin(st, &info, &run, &err))
        die("store_run_begin", &err);
    double t0 = now_s(), cstart = cpu_s();
    int64_t s = 0;
    *nlat = 0;
    while (now_s() - t0 < seconds) {
        double c0 = now_s();
        for (int l = 0; l < b->layers; l++)
            if (store_add_samples(st, run, s, l, heads_at(s * b->layers + l), b->heads,
                                  b->t0_ms + s * 1000, &err))
                die("store_add_samples", &err);
        if (store_commit(st, &err))
            die("store_commit", &err);
        if (*nlat < 100000)
            lat[(*nlat)++] = (now_s() - c0) * 1000;
        s++;
    }
    double rate = (double)s * b->layers * b->heads / (now_s() - t0);
    *cpu_rate = (double)s * b->layers * b->heads / (cpu_s() - cstart);
    store_close(st);
    return rate;
}

static void concurrent_section(const char *path, const bigdb *b, double seconds)
{
    static double lat[100000];
    size_t nlat;
    double alone_cpu, with_cpu;
    double alone = ingest_for(path, b, "alone", seconds, lat, &nlat, &alone_cpu);
    double a50 = pct(lat, nlat, 50), a99 = pct(lat, nlat, 99), amax = pct(lat, nlat, 100);
    static retainer r;
    memset(&r, 0, sizeof r);
    r.path = path;
    r.pol = (store_retention)STORE_RETENTION_DEFAULT;
    r.pol.now_ms = b->t0_ms + b->steps * 1000;
    r.pol.retain_ms = b->steps / 4 * 1000; /* the next quarter of the big run, and compaction */
    pthread_t th;
    if (pthread_create(&th, NULL, retain_thread, &r) != 0)
        die("pthread_create", NULL);
    double with = ingest_for(path, b, "beside retention", seconds, lat, &nlat, &with_cpu);
    r.stop = 1;
    pthread_join(th, NULL);
    printf("ingest of a second run (%d x %d samples a commit) for %.0f s: alone %.0f samples/s "
           "(commit p50 %.2f p99 %.2f max %.2f ms); with a retention thread on its own handle "
           "%.0f samples/s (commit p50 %.2f p99 %.2f max %.2f ms) = %.0f%% of alone\n",
           b->layers, b->heads, seconds, alone, a50, a99, amax, with, pct(lat, nlat, 50),
           pct(lat, nlat, 99), pct(lat, nlat, 100), 100 * with / alone);
    printf("ingest per CPU-second: alone %.0f, beside retention %.0f samples\n", alone_cpu,
           with_cpu);
    printf("the retention thread meanwhile: %" PRId64 " calls, %" PRId64 " samples downsampled, "
           "%" PRId64 " compacted (%.0f samples/s); lock held per call p50 %.2f p99 %.2f max "
           "%.2f ms; waited for it p50 %.2f max %.2f ms\n", r.calls, r.downsampled, r.compacted,
           (double)(r.downsampled + r.compacted) / seconds, pct(r.lock_ms, r.n, 50),
           pct(r.lock_ms, r.n, 99), pct(r.lock_ms, r.n, 100), pct(r.wait_ms, r.n, 50),
           pct(r.wait_ms, r.n, 100));
    fflush(stdout);
}

/* ---- main ------------------------------------------------------------------------------------- */

int main(int argc, char **argv)
{
    bigdb b = {.steps = 10000, .layers = 80, .heads = 64, .t0_ms = 1700000000000};
    const char *dir = "/tmp";
    int keep = 0, quick = 0;
    double seconds = 10;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--steps") && v)
            b.steps = atoll(argv[++i]);
        else if (!strcmp(a, "--layers") && v)
            b.layers = atoi(argv[++i]);
        else if (!strcmp(a, "--heads") && v)
            b.heads = atoi(argv[++i]);
        else if (!strcmp(a, "--dir") && v)
            dir = argv[++i];
        else if (!strcmp(a, "--seconds") && v)
            seconds = atof(argv[++i]);
        else if (!strcmp(a, "--keep"))
            keep = 1;
        else if (!strcmp(a, "--quick"))
            quick = 1;
        else {
            fprintf(stderr, "usage: %s [--steps N] [--layers L] [--heads H] [--dir DIR] "
                            "[--seconds S] [--keep] [--quick]\n", argv[0]);
            return 2;
        }
    }
    if (b.steps < 100 || b.layers < 1 || b.heads < 1 || b.heads > 128) {
        fprintf(stderr, "bench_history: --steps >= 100, --layers >= 1, 1 <= --heads <= 128\n");
        return 2;
    }
    if (quick)
        seconds = 2;
    make_pool();
    double load[3] = {0, 0, 0};
    FILE *lf = fopen("/proc/loadavg", "r");
    if (lf) {
        if (fscanf(lf, "%lf %lf %lf", &load[0], &load[1], &load[2]) != 3)
            load[0] = load[1] = load[2] = 0;
        fclose(lf);
    }
    printf("# bench_history: SQLite %s, %s, %ld CPUs, load average at start %.2f %.2f %.2f\n",
           sqlite3_libversion(), quick ? "quick" : "full", sysconf(_SC_NPROCESSORS_ONLN), load[0],
           load[1], load[2]);
    ingest_section(dir, quick);
    char path[512];
    path_in(path, sizeof path, dir, "history");
    remove_db(path);
    build_section(path, &b);
    space_section(path, &b);
    query_section(path, &b, "", 20);
    downsample_section(path, &b);
    concurrent_section(path, &b, seconds);
    query_section(path, &b, " after downsampling the older 3/4 of the run", 10);
    lf = fopen("/proc/loadavg", "r");
    if (lf) {
        if (fscanf(lf, "%lf %lf %lf", &load[0], &load[1], &load[2]) == 3)
            printf("\nload average at the end %.2f %.2f %.2f\n", load[0], load[1], load[2]);
        fclose(lf);
    }
    if (keep)
        printf("\nkept %s\n", path);
    else
        remove_db(path);
    return 0;
}
