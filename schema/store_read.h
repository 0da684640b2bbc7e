/* store_read.h — the reading half of the store: runs (list, get, resolve a name), the trend of a
 * layer or head over steps, the grid of one step, alert transitions, a run's export (with a CSV /
 * JSON-lines formatter), and the integrity check. Used by the CLI on a read-only handle
 * (store_open_readonly()) and by the daemon's restore at start-up on its read-write handle. None
 * of these calls writes to the database (on a handle with an open batch they see that batch).
 *
 * The three tiers (store.h) read as one history: where a step has a row in the exact tier and in
 * the compact tier (a sample pushed again after it was compacted), each head is read from the
 * exact tier when it is there. A bucket (a downsampled window of steps) reads as one row per head
 * whose step is the window's first step (store_sample.step_last its last, .merged its number of
 * samples, .stats the means, .min / .max the extremes). A read that runs several statements runs
 * them in one read transaction, so it sees one snapshot even while the retention step moves rows
 * between tiers.
 * Includes store.h and kernels/stats.h (stats_head, the statistics of one head).
 *
 * Reads deliver rows through callbacks: each row struct and its strings are valid only during the
 * call (copy what you keep). A callback returns 0 to go on, non-zero to stop early (the read then
 * returns STORE_OK). Rows come in a documented order.
 */
#ifndef ATTNSTAT_STORE_READ_H
#define ATTNSTAT_STORE_READ_H

#include <stdint.h>

#include "stats.h"
#include "store.h"
#include "vocab.h"

#ifdef __cplusplus
extern "C" {
#endif

/* store_grid(): the latest step of the run. */
#define STORE_STEP_LATEST INT64_MIN

typedef struct {
    int64_t id;
    const char *name;
    int32_t rank;
    const char *host;        /* NULL when unknown */
    int64_t pid;             /* 0 when unknown */
    int64_t started_ms;      /* first Hello */
    int64_t last_hello_ms;   /* latest Hello */
    const char *config;      /* NULL when none */
    const char *thresholds;  /* NULL when none */
    int64_t samples;         /* committed samples (a bucket counts the samples it merged) */
    int64_t step_min, step_max; /* 0 when samples == 0 */
    int64_t last_time_ms;    /* time of the newest sample; 0 when none */
    int64_t bytes;           /* estimate of the bytes its samples take (store_retain.h) */
    int64_t retain_ms, retain_bytes; /* its own retention limits; -1: the policy's */
    int has_owner;           /* the uid that owns it (store_run_info.owner_uid) */
    uint32_t owner_uid;
    int64_t ended_ms;        /* when it ended (store_run_end()); 0: running, or never seen to end */
    const char *end_reason;  /* why; NULL when ended_ms is 0 */
} store_run;

/* store_sample.tier: where a row comes from, and so its precision (store.h, "Tiers"). */
#define STORE_TIER_EXACT 0
#define STORE_TIER_COMPACT 1
#define STORE_TIER_BUCKET 2

typedef struct {
    int64_t run_id;
    int32_t layer, head;
    int64_t step;
    int64_t time_ms;         /* a bucket: the newest time it merged */
    stats_head stats;        /* a bucket: each field's mean over the samples it merged */
    int32_t tier;            /* STORE_TIER_EXACT, _COMPACT or _BUCKET */
    int64_t step_last;       /* == step, except for a bucket: its window's last step */
    int64_t merged;          /* 1, except for a bucket: the samples of this head it merged */
    const stats_head *min, *max; /* a bucket's minima and maxima; NULL for a sample */
} store_sample;

typedef int (*store_run_cb)(void *ctx, const store_run *run);
typedef int (*store_sample_cb)(void *ctx, const store_sample *s);
typedef int (*store_alert_cb)(void *ctx, const store_alert *a);

/* Every run, ordered by id. */
store_status store_list_runs(store *st, store_run_cb cb, void *ctx, store_error *err);

/* One run by id. STORE_NOTFOUND when there is none. */
store_status store_get_run(store *st, int64_t run_id, store_run_cb cb, void *ctx,
                           store_error *err);

/* Resolve a run given by the user: a decimal id of an existing run, else a run name. A name with
 * several ranks needs rank >= 0 (rank < 0: any rank, STORE_AMBIGUOUS when there are several).
 * STORE_NOTFOUND with a message naming spec when nothing matches. */
store_status store_resolve_run(store *st, const char *spec, int32_t rank, int64_t *run_id,
                               store_error *err);

/* Trend of one layer of one run over steps [step_from, step_to] (inclusive), head >= 0 for one
 * head, head < 0 for every head. Thinning: of the distinct steps in the range (that have a sample
 * of the selected head(s)), the first one and then every `every`-th (every <= 1: all); a bucket
 * that overlaps the range counts as one step (its first). Rows come ordered by step, then head;
 * a bucket comes before a sample of the same step. */
store_status store_trend(store *st, int64_t run_id, int32_t layer, int32_t head,
                         int64_t step_from, int64_t step_to, int64_t every,
                         store_sample_cb cb, void *ctx, store_error *err);

/* Every (layer, head) sample of one step of one run: the grid. step == STORE_STEP_LATEST: the
 * run's highest stored step. The step used is written to *step_used (may be NULL). A step that
 * was downsampled reads as the buckets whose window holds it (when no sample of it remains).
 * STORE_NOTFOUND when the run has no sample (or none at that step).
 * Rows come ordered by layer, then head. */
store_status store_grid(store *st, int64_t run_id, int64_t step, int64_t *step_used,
                        store_sample_cb cb, void *ctx, store_error *err);

/* A window of wall-clock time [since_ms, until_ms] (Unix ms, inclusive; INT64_MIN / INT64_MAX:
 * no bound) as the run's steps [*step_from, *step_to], for the step ranges of store_trend() and
 * the readers above: the window starts after the newest step stored before since_ms (INT64_MIN
 * when none was) and ends with the newest step stored at or before until_ms (INT64_MAX when
 * until_ms is). Where a run's times grow with its steps (it never went back to an earlier step),
 * these are exactly the steps whose samples were stored in the window. A compact row counts at
 * its row's time, a bucket with its window's last step at the newest time it merged.
 * STORE_NOTFOUND (with a message) when the run has no such step, or is no run. */
store_status store_time_steps(store *st, int64_t run_id, int64_t since_ms, int64_t until_ms,
                              int64_t *step_from, int64_t *step_to, store_error *err);

/* The newest step of a run stored before `step` (a step inside a bucket's window reads as the
 * bucket: store_grid() finds it there). STORE_NOTFOUND when there is none. */
store_status store_step_before(store *st, int64_t run_id, int64_t step, int64_t *prev,
                               store_error *err);

/* The layers a run has samples of, in any tier, ascending. cb returns non-zero to stop. */
typedef int (*store_layer_cb)(void *ctx, int32_t layer);
store_status store_run_layers(store *st, int64_t run_id, store_layer_cb cb, void *ctx,
                              store_error *err);

/* Alert transitions of one run (run_id > 0) or of all runs (run_id == 0), ordered by id (time of
 * insertion). active_only: for each (run, layer, head, rule), only its latest transition, and only
 * when that one is a raise. */
store_status store_alerts(store *st, int64_t run_id, int active_only, store_alert_cb cb,
                          void *ctx, store_error *err);

/* The alert alert_id when it is active (a raise that no later transition of its (run, layer,
 * head, rule) ended): cb gets it. STORE_NOTFOUND when there is no such alert; STORE_EINVAL, with
 * a message saying what ended it, when it is not active. */
store_status store_active_alert(store *st, int64_t alert_id, store_alert_cb cb, void *ctx,
                                store_error *err);

/* The silences in force at now_ms (0: now): those whose until_ms is later, and those that last
 * until their run ends, of a run that has not ended. Of one run (run_id > 0) or of all (0),
 * ordered by id. */
typedef int (*store_silence_cb)(void *ctx, const store_silence *s);
store_status store_silences(store *st, int64_t run_id, int64_t now_ms, store_silence_cb cb,
                            void *ctx, store_error *err);

/* The interventions of one run (run_id > 0) or of every run (0), ordered by run, then step,
 * then id (the order they were received in). The arrays of the row given to cb are valid during
 * the call only. A row whose heads or head_values are not the JSON arrays the store writes is
 * reported (STORE_ERROR, naming its id) rather than read wrong. cb returns non-zero to stop. */
typedef int (*store_intervention_cb)(void *ctx, const store_intervention *iv);
store_status store_interventions(store *st, int64_t run_id, store_intervention_cb cb, void *ctx,
                                 store_error *err);

/* Every sample of one run, every tier, as a stream: ordered by layer, then step, then head, with
 * each bucket at its first step (before a sample of that step), as store_trend() reads one layer
 * over all steps. One read transaction holds the snapshot for the whole export: writers go on
 * (WAL), but the WAL file cannot be checkpointed past it until the export ends. STORE_NOTFOUND
 * when there is no such run. */
store_status store_export(store *st, int64_t run_id, store_sample_cb cb, void *ctx,
                          store_error *err);

/* Text formats of an exported row (store_format_sample()). */
typedef enum {
    STORE_FORMAT_CSV = 0,   /* STORE_EXPORT_CSV_HEADER's columns; NaN is an empty cell */
    STORE_FORMAT_JSONL = 1, /* one JSON object a line, keys as the CSV columns; NaN and
                             * infinities are null (JSON has neither) */
} store_format;

/* The columns of an export, in order (CSV header line, newline included): the keys, the counts,
 * sampled, then vocab.h's statistics in table order, then <statistic>_lo and <statistic>_hi of each
 * in table order. The *_lo / *_hi columns are a bucket's minima and maxima (a sample's own value
 * otherwise); doubles are printed with %.17g (they read back exactly), times in Unix milliseconds,
 * tier as exact/compact/bucket. */
#define STORE_EXPORT_STAT_(name, ...) "," #name
#define STORE_EXPORT_RANGE_(name, ...) "," #name "_lo," #name "_hi"
#define STORE_EXPORT_CSV_HEADER                                                                    \
    "run_id,layer,head,step,step_last,tier,merged,time_ms,rows,rows_norm,rows_empty,"             \
    "nonfinite_rows,sampled" VOCAB_STATS(STORE_EXPORT_STAT_) VOCAB_STATS(STORE_EXPORT_RANGE_) "\n"

/* Format one row as a line (newline included) into buf: the length it needs, as snprintf (the
 * line is cut when len is too small). A row takes at most STORE_FORMAT_MAX bytes: the keys, counts
 * and sampled under 420 as JSON, and each statistic's three values (24 characters at most, %.17g)
 * with their JSON keys in 3 x its name's length + 96 (160 for names up to 21 characters). */
#define STORE_FORMAT_MAX (512 + 160 * VOCAB_NSTATS)
size_t store_format_sample(const store_sample *s, store_format f, char *buf, size_t len);

/* PRAGMA integrity_check: STORE_OK when it says "ok"; otherwise STORE_ERROR with the problems it
 * found in err (as many as fit). store_quick_check: the same with PRAGMA quick_check (every page
 * read and checked, indexes not compared with their tables: O(size) rather than O(size log size)),
 * what the daemon runs at start. */
store_status store_integrity_check(store *st, store_error *err);
store_status store_quick_check(store *st, store_error *err);

/* The same checks (quick: quick_check, else integrity_check) with every problem handed to fn as
 * one line of text, in SQLite's order: SQLite's answers, up to 100, each split at its newlines
 * ("*** in database main ***", "On tree page 47 cell 3: ..."). *problems gets the number of lines
 * handed over. STORE_OK when the check says "ok" (fn is never called); STORE_ERROR either when it
 * found problems (*problems > 0; err says how many) or when it could not run (*problems 0; err
 * says why). fn returning non-zero stops the listing (the status stays STORE_ERROR). */
typedef int (*store_problem_fn)(void *ctx, const char *line);
store_status store_check_problems(store *st, int quick, store_problem_fn fn, void *ctx,
                                  uint64_t *problems, store_error *err);

#ifdef __cplusplus
}
#endif

#endif /* ATTNSTAT_STORE_READ_H */
