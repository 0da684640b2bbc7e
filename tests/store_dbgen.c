/* store_dbgen.c — a history database for tests/test_python_history.py, written through the store
 * (schema/), with what the store itself reads back as the reference:
 *   store_dbgen <database> <export.jsonl> [seed]
 *   store_dbgen --export <database> <export.jsonl>   (an existing database, migrated if older:
 *                                                    every run exported, nothing else written)
 * Two runs (one name with two ranks, and another), random statistics with empty heads (NaN means,
 * max_logit -inf), heads pushed again at a later time, a head written straight into the exact
 * tier with a gap in its ids, then the retention step: compaction (the exact tier keeps the newest
 * steps) and downsampling by age (buckets), and alert transitions; then two heads of a compacted
 * step pushed again (in both tiers: the exact one wins). Every run is then exported
 * (store_export, one JSON line a row, store_format_sample) to export.jsonl.
 * Exits 0, or 1 with a message on stderr. Includes store_read.h, store_write.h, store_retain.h and
 * SQLite (the raw row).
 */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <sqlite3.h>

#include "store_read.h"
#include "store_retain.h"
#include "store_write.h"

static uint64_t rng;

static double unit(void)
{
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (double)(rng >> 11) / 9007199254740992.0;
}

static void fail(const char *what, const store_error *e)
{
    fprintf(stderr, "store_dbgen: %s: %s\n", what, e ? e->msg : "failed");
    exit(1);
}

static stats_head rand_head(void)
{
    stats_head h;
    memset(&h, 0, sizeof h);
    if (unit() < 0.1) { /* no counted row */
        h.rows_empty = 1 + (int64_t)(unit() * 20);
        h.entropy_mean = h.entropy_std = h.entropy_min = h.entropy_max = NAN;
        h.entropy_norm_mean = h.collapsed_frac = h.sink_mass = h.distance = NAN;
        h.max_logit = -INFINITY;
        return h;
    }
    h.rows = 1 + (int64_t)(unit() * 100000);
    h.rows_norm = (int64_t)(unit() * (double)h.rows);
    h.nonfinite_rows = unit() < 0.2;
    h.entropy_min = unit() * 2;
    h.entropy_max = h.entropy_min + unit() * 5;
    h.entropy_mean = h.entropy_min + unit() * (h.entropy_max - h.entropy_min);
    h.entropy_std = unit();
    h.entropy_norm_mean = h.rows_norm ? unit() : NAN;
    h.collapsed_frac = h.rows_norm ? unit() * 0.2 : NAN;
    h.max_logit = (unit() - 0.3) * 100;
    h.sampled = unit() < 0.3;
    h.sink_mass = unit();
    h.distance = unit() * 900;
    return h;
}

static int write_row(void *ctx, const store_sample *s)
{
    char line[STORE_FORMAT_MAX];
    size_t n = store_format_sample(s, STORE_FORMAT_JSONL, line, sizeof line);
    if (n >= sizeof line || fwrite(line, 1, n, (FILE *)ctx) != n)
        return 1;
    return 0;
}

/* Export every run of an existing database (opened read-write: an older one is migrated). */
static int export_only(const char *db, const char *out)
{
    store_error err;
    store *st = store_open(db, 0, &err);
    if (!st)
        fail("open", &err);
    FILE *f = fopen(out, "w");
    if (!f) {
        perror(out);
        return 1;
    }
    for (int64_t id = 1; id < 64; id++) {
        store_status rs = store_export(st, id, write_row, f, &err);
        if (rs != STORE_OK && rs != STORE_NOTFOUND)
            fail("export", &err);
    }
    if (fclose(f) != 0) {
        perror(out);
        return 1;
    }
    store_close(st);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc == 4 && strcmp(argv[1], "--export") == 0)
        return export_only(argv[2], argv[3]);
    if (argc < 3) {
        fprintf(stderr, "usage: store_dbgen <database> <export.jsonl> [seed]\n");
        return 2;
    }
    rng = argc > 3 ? strtoull(argv[3], NULL, 10) | 1 : 88172645463325252ULL;
    store_error err;
    store *st = store_open(argv[1], 0, &err);
    if (!st)
        fail("open", &err);
    int64_t runs[3];
    const char *names[3] = {"gpt", "gpt", "bert"};
    for (int r = 0; r < 3; r++) {
        store_run_info info = {.name = names[r], .rank = r == 1, .host = "node", .pid = 7 + r,
                               .time_ms = 1000, .config = "{}"};
        if (store_run_begin(st, &info, &runs[r], &err))
            fail("run", &err);
    }
    const int layers = 3, heads = 6, steps = 120;
    for (int r = 0; r < 3; r++)
        for (int s = 0; s < steps; s++) {
            for (int l = 0; l < layers; l++) {
                stats_head hs[8];
                for (int h = 0; h < heads; h++)
                    hs[h] = rand_head();
                int nh = l == 2 && s % 3 ? heads - 2 : heads;
                if (store_add_samples(st, runs[r], s, l, hs, nh, 100000 + 1000 * s, &err))
                    fail("samples", &err);
                if (s % 7 == 0) { /* two heads pushed again later: other times in one row */
                    hs[0] = rand_head();
                    if (store_add_samples(st, runs[r], s, l, hs, 2, 100000 + 1000 * s + 17, &err))
                        fail("samples", &err);
                }
            }
            if (s % 10 == 3) {
                store_alert a = {.run_id = runs[r], .layer = s % layers, .head = s % heads,
                                 .step = s, .rule = "entropy_floor",
                                 .state = s % 20 == 3 ? STORE_ALERT_RAISED : STORE_ALERT_CLEARED,
                                 .value = unit(), .threshold = 0.1, .time_ms = 5000 + s};
                if (store_add_alert(st, &a, &err))
                    fail("alert", &err);
            }
            if (store_commit(st, &err))
                fail("commit", &err);
        }
    /* a head written straight into the exact tier, with a gap in the ids (head 40) */
    sqlite3 *db = NULL;
    char sql[512];
    snprintf(sql, sizeof sql, "INSERT INTO samples (run_id, layer, head, step, time, rows, "
             "rows_norm, rows_empty, nonfinite_rows, entropy_mean, entropy_std, entropy_min, "
             "entropy_max, entropy_norm_mean, collapsed_frac, max_logit, sampled) VALUES (%"
             PRId64 ", 1, 40, 55, 155000, 9, 9, 0, 0, 1.25, 0.5, 0.25, 2.5, 0.75, 0.125, 33.5, 1)",
             runs[0]);
    if (sqlite3_open(argv[1], &db) != SQLITE_OK ||
        sqlite3_exec(db, sql, NULL, NULL, NULL) != SQLITE_OK) {
        fprintf(stderr, "store_dbgen: raw insert: %s\n", sqlite3_errmsg(db));
        return 1;
    }
    sqlite3_close(db);
    /* compaction (the newest 10 steps stay exact, in blocks) and buckets of steps older than 40 */
    store_retention p = {.exact_steps = 10, .retain_ms = 1000 * (steps - 40), .bucket_steps = 8,
                         .now_ms = 100000 + 1000 * steps};
    store_retain_report rep;
    int calls = 0;
    do
        if (store_retain_step(st, &p, 500, &rep, &err) || ++calls > 100000)
            fail("retention", &err);
    while (rep.more);
    /* heads 0 and 1 of a compacted step pushed again: in both tiers, read from the exact one */
    stats_head again[2] = {rand_head(), rand_head()};
    if (store_add_samples(st, runs[2], 60, 0, again, 2, 999999, &err) || store_commit(st, &err))
        fail("push again", &err);
    FILE *f = fopen(argv[2], "w");
    if (!f) {
        perror(argv[2]);
        return 1;
    }
    for (int r = 0; r < 3; r++)
        if (store_export(st, runs[r], write_row, f, &err))
            fail("export", &err);
    if (fclose(f) != 0) {
        perror(argv[2]);
        return 1;
    }
    store_close(st);
    return 0;
}
