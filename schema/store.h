/* store.h — the attnstat history database (SQLite): runs, per-(run, layer, head, step) statistics,
 * and alert transitions. The daemon writes through one read-write handle; the CLI reads through a
 * read-only handle that works whether the daemon is running or not.
 *
 * What the store promises
 * - Durability. The database is in WAL mode with synchronous=NORMAL: a batch is durable against a
 *   crash of the process (kill -9) once store_commit() returned STORE_OK, and the file always passes
 *   PRAGMA integrity_check. (A power loss can lose the last few commits but never corrupts.)
 * - Batches. store_add_samples() and store_add_alert() write into the open batch (one transaction,
 *   begun by the first write); nothing of it is visible to other connections, or survives a crash,
 *   until store_commit(). The daemon acknowledges a push only after the commit that holds it.
 *   Any error while a batch is open rolls the whole batch back (store_pending() is then 0): the
 *   caller answers every push of that batch with an error. Argument errors (bad layer, unknown run)
 *   are found before anything is written and leave the batch untouched.
 * - Schema. PRAGMA user_version is the number of the last migration (schema/NNN_*.sql, compiled in)
 *   that was applied. A read-write open applies the missing ones in one transaction; a database
 *   whose version is newer than this code is refused, never touched. A read-only open refuses a
 *   database that is older or newer than the code, or that is not an attnstat database.
 * - Errors. Every call returns a store_status; on failure err->msg says what was being done and,
 *   for SQLite failures, the extended result code (err->code) and sqlite3_errmsg(). err may be NULL.
 *   Nothing here exits or aborts.
 * - Threads. A handle is used by one thread at a time. Different handles (even in different
 *   processes) may share one file.
 * - Missing values. Statistics that are NaN (a head with rows == 0 has NaN means) are stored as NULL
 *   and read back as NaN. Every other double reads back bit for bit, infinities included (max_logit
 *   is -inf when rows == 0), except that -0.0 reads back as +0.0.
 *
 * Reads deliver rows through callbacks: each row struct and its strings are valid only during the
 * call (copy what you keep). A callback returns 0 to go on, non-zero to stop early (the read then
 * returns STORE_OK). Rows come in a documented order.
 */
#ifndef ATTNSTAT_STORE_H
#define ATTNSTAT_STORE_H

#include <stdint.h>

#include "stats.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    STORE_OK = 0,
    STORE_ERROR = 1,     /* SQLite or I/O failure: err->code holds the extended result code */
    STORE_EINVAL = 2,    /* a bad argument: the message names it */
    STORE_NOTFOUND = 3,  /* the run (or step) asked for does not exist */
    STORE_AMBIGUOUS = 4, /* a run name matches several runs (ranks): ask by id */
    STORE_SCHEMA = 5,    /* not an attnstat database, or a schema version this code cannot use */
} store_status;

typedef struct {
    int code;       /* SQLite extended result code, 0 when the failure was not SQLite's */
    char msg[512];
} store_error;

typedef struct store store;

/* Alert state values; they match AlertState in proto/attnstat.proto. */
#define STORE_ALERT_RAISED 1
#define STORE_ALERT_CLEARED 2

/* store_grid(): the latest step of the run. */
#define STORE_STEP_LATEST INT64_MIN

const char *store_status_name(store_status st);

/* Schema version this code writes (the number of compiled-in migrations). */
int store_schema_version(void);

/* ---- Opening ------------------------------------------------------------------------------ */

/* Open (creating it when missing) the database at path for writing, migrate it, and prepare the
 * statements. Sets WAL, synchronous=NORMAL, foreign keys on, a busy timeout of busy_ms
 * (0: 5000 ms). Returns NULL with err set on failure. */
store *store_open(const char *path, int busy_ms, store_error *err);

/* Open an existing database for reading only (the CLI). Never creates, migrates or writes the
 * database file (SQLite may create the -shm/-wal side files next to it, as every WAL reader does).
 * Returns NULL with err set when the file is missing, unreadable, corrupt, or of another schema. */
store *store_open_readonly(const char *path, int busy_ms, store_error *err);

/* Close the handle. An open batch is rolled back (commit first to keep it). NULL is fine. */
void store_close(store *st);

/* The handle's path, as given to open. */
const char *store_path(const store *st);

/* ---- Writing (daemon) ---------------------------------------------------------------------- */

typedef struct {
    const char *name;        /* required, non-empty */
    int32_t rank;            /* >= 0 */
    const char *host;        /* optional (NULL) */
    int64_t pid;             /* 0: unknown */
    int64_t time_ms;         /* time of the Hello; 0: now */
    const char *config;      /* optional free text (JSON) */
    const char *thresholds;  /* optional: the run's effective thresholds as text (JSON) */
} store_run_info;

/* Begin (or resume) a run and return its id in *run_id.
 * Reconnects: a run is identified by (name, rank). When that pair exists already, its id is
 * reused (the history continues: a trainer resuming from a checkpoint or reconnecting after a
 * daemon restart keeps one trend), host/pid/config/thresholds are replaced by the new values and
 * `started` keeps the first Hello's time. A sample pushed again for a step that is already stored
 * replaces the stored one (see store_add_samples()).
 * The run is durable when this returns: an open batch is committed together with it. */
store_status store_run_begin(store *st, const store_run_info *info, int64_t *run_id,
                             store_error *err);

/* Add the statistics of one push (one layer, heads 0 .. nheads-1 of it) to the open batch, with
 * time time_ms (0: now). A (run, layer, head, step) that is already stored is replaced.
 * STORE_NOTFOUND when run_id is not a run; STORE_EINVAL for a negative layer, nheads < 1 or NULL
 * heads; both leave the batch as it was. */
store_status store_add_samples(store *st, int64_t run_id, int64_t step, int32_t layer,
                               const stats_head *heads, int32_t nheads, int64_t time_ms,
                               store_error *err);

typedef struct {
    int64_t id;              /* set by the store (reads); ignored by store_add_alert() */
    int64_t run_id;
    int32_t layer, head;
    int64_t step;
    const char *rule;        /* rule name, e.g. "entropy_floor" (alerts_rule_name()) */
    int32_t state;           /* STORE_ALERT_RAISED or STORE_ALERT_CLEARED */
    double value;            /* observed value (NaN: none -> NULL) */
    double threshold;        /* threshold crossed (NaN: none -> NULL) */
    int64_t time_ms;         /* 0: now (writes) */
    const char *message;     /* optional human-readable text */
} store_alert;

/* Add one alert transition to the open batch. Same error rules as store_add_samples(). */
store_status store_add_alert(store *st, const store_alert *a, store_error *err);

/* Commit the open batch (no-op STORE_OK when none is open). On failure the batch is rolled back. */
store_status store_commit(store *st, store_error *err);

/* Roll back the open batch, if any. */
void store_rollback(store *st);

/* Samples (per-head rows) in the open batch. */
int64_t store_pending(const store *st);

/* Samples committed through this handle since it was opened (for the daemon's status). */
int64_t store_samples_written(const store *st);

/* Number of committed sample rows of one run (run_id > 0) or of all runs (run_id == 0). */
store_status store_count_samples(store *st, int64_t run_id, int64_t *count, store_error *err);

/* ---- Reading (CLI; also usable on a read-write handle) --------------------------------------- */

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
    int64_t samples;         /* committed sample rows */
    int64_t step_min, step_max; /* 0 when samples == 0 */
    int64_t last_time_ms;    /* time of the newest sample; 0 when none */
} store_run;

typedef struct {
    int64_t run_id;
    int32_t layer, head;
    int64_t step;
    int64_t time_ms;
    stats_head stats;
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
 * of the selected head(s)), the first one and then every `every`-th (every <= 1: all).
 * Rows come ordered by step, then head. */
store_status store_trend(store *st, int64_t run_id, int32_t layer, int32_t head,
                         int64_t step_from, int64_t step_to, int64_t every,
                         store_sample_cb cb, void *ctx, store_error *err);

/* Every (layer, head) sample of one step of one run: the grid. step == STORE_STEP_LATEST: the
 * run's highest stored step. The step used is written to *step_used (may be NULL).
 * STORE_NOTFOUND when the run has no sample (or none at that step).
 * Rows come ordered by layer, then head. */
store_status store_grid(store *st, int64_t run_id, int64_t step, int64_t *step_used,
                        store_sample_cb cb, void *ctx, store_error *err);

/* Alert transitions of one run (run_id > 0) or of all runs (run_id == 0), ordered by id (time of
 * insertion). active_only: for each (run, layer, head, rule), only its latest transition, and only
 * when that one is a raise. */
store_status store_alerts(store *st, int64_t run_id, int active_only, store_alert_cb cb,
                          void *ctx, store_error *err);

/* PRAGMA integrity_check: STORE_OK when it says "ok"; otherwise STORE_ERROR with the first
 * problem in err. */
store_status store_integrity_check(store *st, store_error *err);

#ifdef __cplusplus
}
#endif

#endif /* ATTNSTAT_STORE_H */
