/* view_testutil.h — shared by test_cli_view.c and test_cli_top.c: databases written through the
 * store with fresh random statistics at known times (a run of L layers x H heads, one step a
 * minute from 2025-03-01T00:00:00Z), and reading the CLI's JSON lines back. Header-only (static
 * inline functions), as stats_testutil.h. Includes daemon_harness.h, cli_harness.h and the store's
 * read and write halves. */
#ifndef ATTNSTAT_VIEW_TESTUTIL_H
#define ATTNSTAT_VIEW_TESTUTIL_H

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli_harness.h"
#include "daemon_harness.h"
#include "store_read.h"
#include "store_retain.h"
#include "store_write.h"

#define L 3                       /* layers */
#define H 5                       /* heads */
#define MIN_MS 60000
static const int64_t T0 = 1740787200000; /* 2025-03-01T00:00:00Z */

/* ---- a database written here ------------------------------------------------------------------*/
static inline double unit(dh_rng *r)
{
    return (double)(dh_next(r) >> 11) / 9007199254740992.0;
}

/* Plausible statistics, never all zero: entropy_norm in (0.02, 1), max logit in (1, 41). */
static inline stats_head rand_stats(dh_rng *r)
{
    stats_head h;
    memset(&h, 0, sizeof h);
    h.rows = 64 + (int64_t)(dh_next(r) % 1000);
    h.rows_norm = h.rows;
    h.nonfinite_rows = (int64_t)(dh_next(r) % 3);
    h.entropy_norm_mean = 0.02 + 0.98 * unit(r);
    h.entropy_mean = h.entropy_norm_mean * log(32.0);
    h.entropy_std = unit(r);
    h.entropy_min = h.entropy_mean * unit(r);
    h.entropy_max = h.entropy_mean + unit(r);
    h.collapsed_frac = unit(r);
    h.max_logit = 1 + 40 * unit(r);
    return h;
}

/* Run `name`: steps [first, first + steps) of `layers` layers x heads, step s stored at
 * t0 + (s - first) * dt; the statistics into v[((s - first) * layers + l) * heads + h] (may be
 * NULL). Its id. */
static inline int64_t write_run_l(const char *db, const char *name, int first, int steps, int layers,
                           int heads, int64_t t0, int64_t dt, stats_head *v, dh_rng *r)
{
    store_error err;
    store *st = store_open(db, 0, &err);
    ck_assert_msg(st != NULL, "store_open: %s", err.msg);
    store_run_info info = {.name = name, .rank = 0, .host = "node", .time_ms = t0};
    int64_t id = 0;
    ck_assert_msg(store_run_begin(st, &info, &id, &err) == STORE_OK, "%s", err.msg);
    stats_head row[64];
    for (int s = 0; s < steps; s++)
        for (int l = 0; l < layers; l++) {
            for (int h = 0; h < heads; h++) {
                row[h] = rand_stats(r);
                if (v)
                    v[((size_t)s * (size_t)layers + (size_t)l) * (size_t)heads + (size_t)h] =
                        row[h];
            }
            ck_assert_msg(store_add_samples(st, id, first + s, l, row, heads, t0 + s * dt, &err) ==
                              STORE_OK, "%s", err.msg);
        }
    ck_assert_msg(store_commit(st, &err) == STORE_OK, "%s", err.msg);
    store_close(st);
    return id;
}

/* The same with L layers. */
static inline int64_t write_run(const char *db, const char *name, int first, int steps, int heads,
                         int64_t t0, int64_t dt, stats_head *v, dh_rng *r)
{
    return write_run_l(db, name, first, steps, L, heads, t0, dt, v, r);
}

static inline int64_t wall_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* The lines of s that start with '{' (JSON records), at most max, in lines[] (pointers into a
 * copy the caller frees). */
static inline int json_lines(const char *s, char **copy, char **lines, int max)
{
    *copy = strdup(s);
    ck_assert_ptr_nonnull(*copy);
    int n = 0;
    char *save = NULL;
    for (char *p = strtok_r(*copy, "\n", &save); p; p = strtok_r(NULL, "\n", &save))
        if (*p == '{') {
            ck_assert_int_lt(n, max);
            lines[n++] = p;
        }
    return n;
}

/* The steps of a trend --head JSON output, in order. */
static inline int trend_steps(const char *out, int64_t *steps, int max)
{
    char *copy, *lines[512];
    int n = json_lines(out, &copy, lines, 512);
    ck_assert_int_le(n, max);
    for (int i = 0; i < n; i++)
        steps[i] = (int64_t)cli_json_num(lines[i], "step");
    free(copy);
    return n;
}

static inline int64_t raw_count(const char *db, const char *sql)
{
    sqlite3 *h = NULL;
    ck_assert_int_eq(sqlite3_open_v2(db, &h, SQLITE_OPEN_READONLY, NULL), SQLITE_OK);
    sqlite3_stmt *q = NULL;
    ck_assert_int_eq(sqlite3_prepare_v2(h, sql, -1, &q, NULL), SQLITE_OK);
    ck_assert_int_eq(sqlite3_step(q), SQLITE_ROW);
    int64_t n = sqlite3_column_int64(q, 0);
    sqlite3_finalize(q);
    sqlite3_close(h);
    return n;
}

#define CLI_OK(r) ck_assert_msg((r).status == 0, "status %d: %s", (r).status, (r).err)

#endif /* ATTNSTAT_VIEW_TESTUTIL_H */
