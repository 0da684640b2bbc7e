/* store_sql.c — every SQL statement of the store, in one table indexed by the statement ids of
 * store_internal.h. Data only: no code. Parameters are numbered (?1, ?2, ...) and bound by
 * position; each statement's comment gives them. The plans these statements must keep (which
 * index each one searches) are checked by tests/test_store_history.c (EXPLAIN QUERY PLAN).
 * Includes store_internal.h.
 *
 * The three tiers (002_compact.sql): samples (exact, keyed run, step, layer, head), history
 * (compact, rowid; history_key on run, layer, step; history_step on run, step), coarse (buckets,
 * rowid; coarse_key on run, layer, step_lo; coarse_step on run, step_lo, layer).
 */
#include "store_internal.h"

#define RUN_COLS                                                                                   \
    "id, name, rank, host, pid, started, last_hello, config, thresholds, samples, step_min, "     \
    "step_max, last_time, bytes, coalesce(retain_ms, -1), coalesce(retain_bytes, -1), owner_uid, " \
    "ended, end_reason"
/* The exact tier's columns in the order store_row_hot() (store_rows.c) reads them (HOT_COL_*,
 * store_internal.h): the keys and time, vocab.h's counts and statistics in table order, sampled.
 * The lists are written from the rows at compile time: a column's name is its row's name. */
#define COL_(name, ...) ", " #name
#define COL_Q_(name, ...) ", samples." #name
#define PARAM_(name, ...) ", ?"
#define SET_(name, ...) ", " #name " = ?"
#define HOT_COLS "run_id, layer, head, step, time" VOCAB_COUNTS(COL_) VOCAB_STATS(COL_) ", sampled"
#define HOT_COLS_Q                                                                                 \
    "samples.run_id, samples.layer, samples.head, samples.step, samples.time"                      \
    VOCAB_COUNTS(COL_Q_) VOCAB_STATS(COL_Q_) ", samples.sampled"
#define ALERT_COLS                                                                                 \
    "id, run_id, layer, head, step, rule, state, value, threshold, time, message, reason, uid, "   \
    "ack_uid, ack_time"
/* A run with its layout, in the order store_job.c reads them. */
#define JOB_RUN_COLS                                                                               \
    "id, name, rank, host, samples, step_min, step_max, last_time, tp_rank, tp_size, pp_rank, "   \
    "pp_size, dp_rank, dp_size, cp_rank, cp_size, layer_offset, head_offset"
#define BUCKET_COLS "step_lo, step_hi, time, merged, lo, mean, hi"

/* The distinct steps of a run's exact tier in [?3, ?4], one index seek each (a skip-scan), so
 * that a trend reads one layer's rows without walking every other layer's. */
#define HOT_STEPS                                                                                  \
    "WITH RECURSIVE s(step) AS ("                                                                  \
    "SELECT (SELECT min(step) FROM samples WHERE run_id = ?1 AND step >= ?3) "                     \
    "UNION ALL SELECT (SELECT min(step) FROM samples WHERE run_id = ?1 AND step > s.step) "        \
    "FROM s WHERE s.step < ?4) "

const char *const store_sql[S_COUNT] = {
    [S_BEGIN] = "BEGIN IMMEDIATE",
    [S_COMMIT] = "COMMIT",
    [S_ROLLBACK] = "ROLLBACK",
    [S_READ_BEGIN] = "BEGIN",

    /* ?1 name, ?2 rank, ?3 host, ?4 pid, ?5 time, ?6 config, ?7 thresholds, ?8 owner uid (NULL:
     * none), ?9 the id of a new run (NULL: SQLite's). A resumed run keeps its id and its owner
     * (one it had none of takes ?8), and is running again. */
    [S_RUN_UPSERT] =
        "INSERT INTO runs (id, name, rank, host, pid, started, last_hello, config, thresholds, "
        "owner_uid) VALUES (?9, ?1, ?2, ?3, ?4, ?5, ?5, ?6, ?7, ?8) "
        "ON CONFLICT (name, rank) DO UPDATE SET host = excluded.host, pid = excluded.pid, "
        "last_hello = excluded.last_hello, config = excluded.config, "
        "thresholds = excluded.thresholds, owner_uid = coalesce(runs.owner_uid, "
        "excluded.owner_uid), ended = NULL, end_reason = NULL RETURNING id",
    /* ?1 id: taken by another run than (?2 name, ?3 rank)? */
    [S_RUN_ID_TAKEN] = "SELECT 1 FROM runs WHERE id = ?1 AND NOT (name = ?2 AND rank = ?3)",
    /* ?1 run, ?2 time, ?3 reason */
    [S_RUN_END] = "UPDATE runs SET ended = ?2, end_reason = ?3 WHERE id = ?1",
    /* ?1 run, ?2 time: silences "until the run ends" end now */
    [S_SILENCES_END_RUN] = "UPDATE silences SET until = ?2 WHERE run_id = ?1 AND until IS NULL",
    /* ?1 run */
    [S_RUN_EXISTS] = "SELECT 1 FROM runs WHERE id = ?1",
    /* ?1 run, ?2 layer, ?3 head, ?4 step, ?5 time, then the counts, the statistics and sampled
     * (the order of HOT_COLS: column c is ?c+1; S_SAMPLE_UPDATE takes the same parameters). A
     * bare ? is numbered one past the largest before it, so the lists count on from ?5. */
    [S_SAMPLE_INSERT] =
        "INSERT INTO samples (" HOT_COLS ") VALUES (?1, ?2, ?3, ?4, ?5" VOCAB_COUNTS(PARAM_)
        VOCAB_STATS(PARAM_) ", ?) ON CONFLICT (run_id, step, layer, head) DO NOTHING",
    [S_SAMPLE_UPDATE] =
        "UPDATE samples SET time = ?5" VOCAB_COUNTS(SET_) VOCAB_STATS(SET_) ", sampled = ? "
        "WHERE run_id = ?1 AND step = ?4 AND layer = ?2 AND head = ?3",
    /* ?1 run, ?2 samples added, ?3 lowest step, ?4 highest step, ?5 newest time, ?6 bytes added */
    [S_RUN_SUMMARY] =
        "UPDATE runs SET samples = samples + ?2, step_min = min(coalesce(step_min, ?3), ?3), "
        "step_max = max(coalesce(step_max, ?4), ?4), "
        "last_time = max(coalesce(last_time, ?5), ?5), bytes = bytes + ?6 WHERE id = ?1",
    /* ?1 run, ?2 layer, ?3 head, ?4 step, ?5 rule, ?6 state, ?7 value, ?8 threshold, ?9 time,
     * ?10 message, ?11 reason, ?12 uid */
    [S_ALERT_INSERT] =
        "INSERT INTO alerts (run_id, layer, head, step, rule, state, value, threshold, time, "
        "message, reason, uid) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)",
    /* ?1 alert: the row, and the id of the latest transition of its (run, layer, head, rule)
     * (a range of alerts_key) */
    [S_ALERT_ONE] =
        "SELECT " ALERT_COLS ", (SELECT max(b.id) FROM alerts AS b WHERE b.run_id = a.run_id "
        "AND b.layer = a.layer AND b.head = a.head AND b.rule = a.rule) FROM alerts AS a "
        "WHERE id = ?1",
    /* ?1 alert, ?2 uid, ?3 time */
    [S_ALERT_ACK] = "UPDATE alerts SET ack_uid = ?2, ack_time = ?3 WHERE id = ?1",
    /* ?1 run, ?2 layer, ?3 head, ?4 rule, ?5 uid, ?6 time, ?7 until (NULL: the run's end) */
    [S_SILENCE_INSERT] = "INSERT INTO silences (run_id, layer, head, rule, uid, time, until) "
                         "VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
    /* ?1 run, ?2 layer, ?3 head, ?4 rule, ?5 time: the key's silences in force end then (a new
     * one replaces them) */
    [S_SILENCES_END_KEY] =
        "UPDATE silences SET until = ?5 WHERE run_id = ?1 AND layer = ?2 AND head = ?3 AND "
        "rule = ?4 AND (until IS NULL OR until > ?5)",
    /* ?1 run, ?2 silence (0: every one of the run), ?3 time: those in force end then */
    [S_SILENCES_END] =
        "UPDATE silences SET until = ?3 WHERE run_id = ?1 AND (?2 = 0 OR id = ?2) AND "
        "(until IS NULL OR until > ?3)",
    /* ?1 now, ?2 run (0: every run): the silences in force */
    [S_SILENCES] =
        "SELECT id, run_id, layer, head, rule, uid, time, coalesce(until, 0) FROM silences AS s "
        "WHERE (?2 = 0 OR run_id = ?2) AND (until > ?1 OR (until IS NULL AND "
        "(SELECT ended FROM runs WHERE id = s.run_id) IS NULL)) ORDER BY id",

    [S_RUNS_ALL] = "SELECT " RUN_COLS " FROM runs ORDER BY id",
    /* ?1 run */
    [S_RUN_ONE] = "SELECT " RUN_COLS " FROM runs WHERE id = ?1",
    /* ?1 name, ?2 rank (< 0: any) */
    [S_RUN_BY_NAME] =
        "SELECT id, rank FROM runs WHERE name = ?1 AND (?2 < 0 OR rank = ?2) ORDER BY rank, id",
    /* ?1 run, ?2 layer, ?3 from, ?4 to, ?5 head: rows by step (the CROSS JOIN keeps the steps the
     * outer loop, in their order) */
    [S_HOT_TREND_HEAD] =
        HOT_STEPS "SELECT " HOT_COLS_Q " FROM s CROSS JOIN samples ON samples.run_id = ?1 "
        "AND samples.step = s.step AND samples.layer = ?2 AND samples.head = ?5 "
        "WHERE s.step <= ?4",
    /* ?1 run, ?2 layer, ?3 from, ?4 to: rows by step, then head */
    [S_HOT_TREND_LAYER] =
        HOT_STEPS "SELECT " HOT_COLS_Q " FROM s CROSS JOIN samples ON samples.run_id = ?1 "
        "AND samples.step = s.step AND samples.layer = ?2 WHERE s.step <= ?4",
    /* ?1 run, ?2 step */
    [S_HOT_GRID] = "SELECT " HOT_COLS " FROM samples WHERE run_id = ?1 AND step = ?2 "
                   "ORDER BY layer, head",
    /* ?1 run, ?2 layer, ?3 from, ?4 to */
    [S_PACK_TREND] = "SELECT step, time, data FROM history WHERE run_id = ?1 AND layer = ?2 "
                     "AND step BETWEEN ?3 AND ?4 ORDER BY step",
    /* ?1 run, ?2 step */
    [S_PACK_GRID] = "SELECT layer, time, data FROM history INDEXED BY history_step "
                    "WHERE run_id = ?1 AND step = ?2 ORDER BY layer",
    /* ?1 run, ?2 layer, ?3 from, ?4 to: the buckets that overlap [from, to] */
    [S_COARSE_TREND] = "SELECT " BUCKET_COLS " FROM coarse WHERE run_id = ?1 AND layer = ?2 "
                       "AND step_lo <= ?4 AND step_hi >= ?3 ORDER BY step_lo",
    /* ?1 run, ?2 step: the buckets that hold the step, every layer */
    [S_COARSE_AT] =
        "SELECT layer, " BUCKET_COLS " FROM coarse INDEXED BY coarse_step WHERE run_id = ?1 "
        "AND step_lo = (SELECT max(step_lo) FROM coarse WHERE run_id = ?1 AND step_lo <= ?2) "
        "AND step_hi >= ?2 ORDER BY layer",
    /* ?1 run: the layers a run has samples of, in any tier (the compact tier and the buckets by
     * a skip-scan of their keys; the exact tier, small once the retention step runs, by a scan) */
    [S_LAYERS] =
        "WITH RECURSIVE h(layer) AS (SELECT (SELECT min(layer) FROM history WHERE run_id = ?1) "
        "UNION ALL SELECT (SELECT min(layer) FROM history WHERE run_id = ?1 AND layer > h.layer) "
        "FROM h WHERE h.layer IS NOT NULL), "
        "c(layer) AS (SELECT (SELECT min(layer) FROM coarse WHERE run_id = ?1) "
        "UNION ALL SELECT (SELECT min(layer) FROM coarse WHERE run_id = ?1 AND layer > c.layer) "
        "FROM c WHERE c.layer IS NOT NULL) "
        "SELECT layer FROM h WHERE layer IS NOT NULL UNION SELECT layer FROM c WHERE layer IS NOT "
        "NULL UNION SELECT layer FROM samples WHERE run_id = ?1 ORDER BY 1",
    /* every run's alerts; S_ALERTS_RUN: ?1 run's */
    [S_ALERTS_ALL] = "SELECT " ALERT_COLS " FROM alerts ORDER BY id",
    [S_ALERTS_RUN] = "SELECT " ALERT_COLS " FROM alerts WHERE run_id = ?1 ORDER BY id",
    /* the latest transition of each (run, layer, head, rule), when it is a raise: every run's
     * (a walk of the alerts_key index), or ?1 run's (S_ALERTS_ACTIVE_RUN, a range of it) */
    [S_ALERTS_ACTIVE] =
        "SELECT " ALERT_COLS " FROM alerts WHERE id IN (SELECT max(id) FROM alerts "
        "GROUP BY run_id, layer, head, rule) AND state = 'raised' ORDER BY id",
    [S_ALERTS_ACTIVE_RUN] =
        "SELECT " ALERT_COLS " FROM alerts WHERE id IN (SELECT max(id) FROM alerts "
        "WHERE run_id = ?1 GROUP BY run_id, layer, head, rule) AND state = 'raised' ORDER BY id",
    /* ?1 run */
    [S_COUNT_ONE] = "SELECT samples FROM runs WHERE id = ?1",
    [S_COUNT_ALL] = "SELECT coalesce(sum(samples), 0) FROM runs",

    [S_RUNS_RETAIN] =
        "SELECT id, step_max, retain_ms, retain_bytes, coarse_upto, bytes FROM runs ORDER BY id",
    /* ?1 run: its size estimate */
    [S_RUNS_RETAIN_ONE] = "SELECT bytes FROM runs WHERE id = ?1",
    /* ?1 run, ?2 layer: the next layer of the compact tier */
    [S_NEXT_LAYER] = "SELECT min(layer) FROM history WHERE run_id = ?1 AND layer > ?2",
    /* ?1 run */
    [S_HOT_MIN_STEP] = "SELECT min(step) FROM samples WHERE run_id = ?1",
    /* ?1 run, ?2 from, ?3 to */
    [S_HOT_BLOCK] = "SELECT " HOT_COLS " FROM samples WHERE run_id = ?1 AND step BETWEEN ?2 AND ?3 "
                    "ORDER BY step, layer, head",
    [S_HOT_DELETE] = "DELETE FROM samples WHERE run_id = ?1 AND step BETWEEN ?2 AND ?3",
    /* ?1 run, ?2 layer, ?3 step */
    [S_PACK_GET] = "SELECT time, data FROM history WHERE run_id = ?1 AND layer = ?2 AND step = ?3",
    /* ?1 run, ?2 layer, ?3 step, ?4 time, ?5 heads, ?6 data */
    [S_PACK_PUT] =
        "INSERT INTO history (run_id, layer, step, time, heads, data) VALUES (?1, ?2, ?3, ?4, ?5, "
        "?6) ON CONFLICT (run_id, layer, step) DO UPDATE SET time = excluded.time, "
        "heads = excluded.heads, data = excluded.data",
    /* ?1 run, ?2 from: the first step of the compact tier at or after from */
    [S_PACK_NEXT_STEP] = "SELECT min(step) FROM history WHERE run_id = ?1 AND step >= ?2",
    /* ?1 run, ?2 from, ?3 to: the newest time in the window, and its number of rows */
    [S_PACK_WINDOW_TIME] = "SELECT max(time), count(*) FROM history WHERE run_id = ?1 "
                           "AND step BETWEEN ?2 AND ?3",
    /* ?1 run, ?2 layer, ?3 step */
    [S_PACK_DELETE] = "DELETE FROM history WHERE run_id = ?1 AND layer = ?2 AND step = ?3",
    /* ?1 run, ?2 from, ?3 to, ?4 layer: the steps an alert keeps at full resolution */
    [S_ALERT_STEPS] = "SELECT DISTINCT step FROM alerts WHERE run_id = ?1 AND layer = ?4 "
                      "AND step BETWEEN ?2 AND ?3",
    /* ?1 run, ?2 layer, ?3 step_lo */
    [S_COARSE_GET] = "SELECT " BUCKET_COLS ", samples FROM coarse WHERE run_id = ?1 AND layer = ?2 "
                     "AND step_lo = ?3",
    /* ?1 run, ?2 step_lo: whether any layer has a bucket of that window */
    [S_COARSE_STARTED] = "SELECT count(*) FROM coarse WHERE run_id = ?1 AND step_lo = ?2",
    /* ?1 run, ?2 layer, ?3 step_lo, ?4 step_hi, ?5 time, ?6 samples, ?7 merged, ?8 lo, ?9 mean,
     * ?10 hi */
    [S_COARSE_PUT] =
        "INSERT INTO coarse (run_id, layer, step_lo, step_hi, time, samples, merged, lo, mean, hi) "
        "VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10) ON CONFLICT (run_id, layer, step_lo) "
        "DO UPDATE SET step_hi = excluded.step_hi, time = excluded.time, "
        "samples = excluded.samples, merged = excluded.merged, lo = excluded.lo, "
        "mean = excluded.mean, hi = excluded.hi",
    /* ?1 run, ?2 steps below this are downsampled */
    [S_RUN_DOWNSAMPLED] = "UPDATE runs SET coarse_upto = ?2 WHERE id = ?1",
    /* ?1 run, ?2 bytes added (may be negative), ?3 samples added (may be negative) */
    [S_RUN_ADJUST] = "UPDATE runs SET bytes = max(0, bytes + ?2), samples = samples + ?3 "
                     "WHERE id = ?1",
    /* ?1 run, ?2 retain_ms, ?3 retain_bytes (NULL: the global limit) */
    [S_RUN_SET_RETAIN] = "UPDATE runs SET retain_ms = ?2, retain_bytes = ?3 WHERE id = ?1",
    /* bytes of the database in pages that hold data (the freelist is reused before the file
     * grows) */
    [S_PAGES_USED] = "SELECT (p.page_count - f.freelist_count) * s.page_size FROM "
                     "pragma_page_count() AS p, pragma_freelist_count() AS f, "
                     "pragma_page_size() AS s",

    /* ?1 run, ?2 rows to skip: the step below which deleting takes about that many rows */
    [S_DEL_HOT_BOUND] = "SELECT step FROM samples WHERE run_id = ?1 ORDER BY step LIMIT 1 OFFSET ?2",
    /* ?1 run, ?2 below (INT64_MAX: all) */
    [S_DEL_HOT] = "DELETE FROM samples WHERE run_id = ?1 AND step < ?2",
    [S_DEL_PACK_BOUND] = "SELECT layer, step FROM history WHERE run_id = ?1 ORDER BY layer, step "
                         "LIMIT 1 OFFSET ?2",
    /* ?1 run, ?2 layer, ?3 step: every row before (layer, step) */
    [S_DEL_PACK] = "DELETE FROM history WHERE run_id = ?1 AND (layer, step) < (?2, ?3)",
    [S_DEL_COARSE] = "DELETE FROM coarse WHERE run_id = ?1",
    [S_DEL_RUN] = "DELETE FROM runs WHERE id = ?1",

    /* ?1 run, ?2 .. ?11 tp_rank, tp_size, pp_rank, pp_size, dp_rank, dp_size, cp_rank, cp_size,
     * layer_offset, head_offset (store_layout's order; NULL: none) */
    [S_RUN_SET_LAYOUT] =
        "UPDATE runs SET tp_rank = ?2, tp_size = ?3, pp_rank = ?4, pp_size = ?5, dp_rank = ?6, "
        "dp_size = ?7, cp_rank = ?8, cp_size = ?9, layer_offset = ?10, head_offset = ?11 "
        "WHERE id = ?1",
    /* ?1 name: the runs of a job, by rank (the UNIQUE (name, rank) index) */
    [S_JOB_RUNS] = "SELECT " JOB_RUN_COLS " FROM runs WHERE name = ?1 ORDER BY rank, id",
    /* ?1 run */
    [S_JOB_RUN_ONE] = "SELECT " JOB_RUN_COLS " FROM runs WHERE id = ?1",

    /* ?1 run, ?2 rank, ?3 step, ?4 time, ?5 kind, ?6 layer (NULL: none), ?7 heads (JSON), ?8 head
     * values (JSON; NULL: none), ?9 threshold, ?10 measured, ?11 detail */
    [S_INTERVENTION_INSERT] =
        "INSERT INTO interventions (run_id, rank, step, time_ms, kind, layer, heads, head_values, "
        "threshold, measured, detail) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)",
    /* ?1 run (0: every run): by run, step, id (interventions_run) */
    [S_INTERVENTIONS] =
        "SELECT id, run_id, rank, step, time_ms, kind, layer, heads, head_values, threshold, "
        "measured, detail FROM interventions WHERE ?1 = 0 OR run_id = ?1 "
        "ORDER BY run_id, step, id",
};
