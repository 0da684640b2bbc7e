/* store.h — the attnstat history database (SQLite): runs, per-(run, layer, head, step) statistics,
 * and alert transitions. What every user of the store sees: status codes, errors, opening and
 * closing a handle, and what the store promises. The calls come in three parts on top of this one:
 *   store_write.h   the daemon's half: begin a run, add samples and alerts to a batch, commit,
 *                   roll back, count
 *   store_read.h    the CLI's half (and the daemon's restore at start-up): list, get and resolve
 *                   runs, trend, grid, alerts, export, integrity check
 *   store_job.h     a job across its processes (runs of one name, with their parallel layouts)
 *                   and databases: its runs, and samples pooled over disjoint rows
 *   store_retain.h  upkeep, for a background thread of the daemon and the CLI: the retention step
 *                   (compaction, downsampling by age and by size), per-run limits, deleting a run
 * The daemon writes through one read-write handle; the CLI reads through a read-only handle that
 * works whether the daemon is running or not. Includes only <stdint.h>: this header names no
 * SQLite type and nothing of the daemon or the client.
 *
 * What the store promises
 * - Durability, chosen at open (store_options.durability); the database is always in WAL mode and
 *   always passes PRAGMA integrity_check, whatever happens to the process or the machine:
 *     STORE_SYNC_NORMAL (the default; synchronous=NORMAL): a batch is durable against a crash of
 *       the process (kill -9, the OOM killer, an abort) once store_commit() returned STORE_OK. A
 *       power loss or an operating-system crash can lose the commits made since the last
 *       checkpoint (SQLite syncs the WAL when it checkpoints, every ~1000 pages written by
 *       default), never part of a commit. No fsync on the commit path.
 *     STORE_SYNC_FULL (synchronous=FULL): the WAL is synced before store_commit() returns, so a
 *       returned commit survives a power loss or an operating-system crash too, as far as the disk
 *       honours fsync. One fsync per commit: batch accordingly (bench/RESULTS.md, "History").
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
 *   processes) may share one file; writes from several handles take turns (the busy timeout).
 * - Tiers and precision. A sample is stored exactly when it is written (the exact tier). The
 *   retention step (store_retain.h) later packs samples older than the newest few steps of their
 *   run into the compact tier, and may merge old ones into downsampled buckets. Reads see the three
 *   tiers as one history. What reads back:
 *     exact tier: statistics that are NaN (a head with rows == 0 has NaN means) are stored as NULL
 *       and read back as NaN. Every other double reads back bit for bit, infinities included
 *       (max_logit is -inf when rows == 0), except that -0.0 reads back as +0.0.
 *     compact tier: each field at the precision that schema/store_pack.h states for its row's
 *       `pack` in vocab/vocab.h (binary32 for entropy_mean, max_logit and distance, 1/2048 nat for
 *       entropy_std/min/max, 1/65534 for the three fractions, counts and times exact, sampled as
 *       0/1); NaN and infinities as in the exact tier. A statistic newer than a row (sink_mass and
 *       distance of rows stored before schema version 5) reads back as NaN in every tier.
 *     buckets: per head, the minimum, the mean and the maximum of each field over the samples the
 *       window merged, at the compact precision (store_read.h says how a bucket reads).
 * - Lifecycle (schema version 3). A run has an owner (a uid) and may end (store_run_end(): when
 *   and why; a new Hello of the same (name, rank) resumes it). An alert ends by a CLEARED or a
 *   RESOLVED transition; while it is active (its latest transition is the raise) it may be
 *   acknowledged (who and when, on the raise's row). Silences keep the transitions of one (run,
 *   layer, head, rule) from being delivered for a while; the store only records them.
 * - Queries. Reads deliver rows through callbacks, in a fixed order: runs by id; a trend by step,
 *   then head; a grid by layer, then head; alert transitions by id (order of insertion); an export
 *   by layer, then step, then head. A read-write handle may read too. Details in store_read.h.
 */
#ifndef ATTNSTAT_STORE_H
#define ATTNSTAT_STORE_H

#include <stdint.h>

#include "vocab.h"

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

/* Alert state values; they match AlertState in proto/attnstat.proto. An alert is raised, then
 * cleared (its samples became good again) or resolved (its run ended, or an operator resolved
 * it): either ends it. */
#define STORE_ALERT_RAISED 1
#define STORE_ALERT_CLEARED 2
#define STORE_ALERT_RESOLVED 3

/* One alert transition: written by store_add_alert(), read back by store_alerts(). */
typedef struct {
    int64_t id;              /* set by the store (reads); ignored by store_add_alert() */
    int64_t run_id;
    int32_t layer, head;
    int64_t step;
    const char *rule;        /* rule name, e.g. "entropy_floor" (alerts_rule_name()) */
    int32_t state;           /* STORE_ALERT_RAISED, _CLEARED or _RESOLVED */
    double value;            /* observed value (NaN: none -> NULL) */
    double threshold;        /* threshold crossed (NaN: none -> NULL) */
    int64_t time_ms;         /* 0: now (writes) */
    const char *message;     /* optional human-readable text */
    const char *reason;      /* CLEARED / RESOLVED: why ("samples", "goodbye", "operator"...);
                              * NULL: none */
    int has_uid;             /* RESOLVED by an operator: uid is who */
    uint32_t uid;
    /* Reads only: a raise that was acknowledged (store_ack_alert()), by whom and when. */
    int acked;
    uint32_t ack_uid;
    int64_t ack_ms;
} store_alert;

/* A silence: the transitions of one (run, layer, head, rule) are kept but not delivered until
 * until_ms, or until the run ends (until_ms 0). Written by store_add_silence() (store_write.h),
 * read back by store_silences() (store_read.h). */
typedef struct {
    int64_t id;              /* set by the store */
    int64_t run_id;
    int32_t layer, head;
    const char *rule;
    uint32_t uid;            /* who silenced it */
    int64_t time_ms;         /* when; 0: now (writes) */
    int64_t until_ms;        /* 0: until the run ends */
} store_silence;

/* What a job did to its model at a step because of what was measured (schema/006_interventions.sql;
 * proto's Intervention): written by store_add_intervention() (store_write.h), read back by
 * store_interventions() (store_read.h). Layer and heads are global numbers. */
#define STORE_INTERVENTION_KIND_MAX VOCAB_INTERVENTION_KIND_MAX
#define STORE_INTERVENTION_HEADS_MAX VOCAB_INTERVENTION_HEADS_MAX
#define STORE_INTERVENTION_DETAIL_MAX VOCAB_INTERVENTION_DETAIL_MAX
typedef struct {
    int64_t id;              /* set by the store (reads); ignored by store_add_intervention() */
    int64_t run_id;
    int32_t rank;            /* the process's rank */
    int64_t step;            /* >= 0 */
    int64_t time_ms;         /* when it was received; 0: now (writes) */
    const char *kind;        /* "qk_clip" */
    int32_t layer;           /* -1: none (NULL) */
    const int32_t *heads;    /* nheads global query heads (each >= 0), in the order sent */
    int32_t nheads;
    const double *values;    /* NULL: none; else one per head (finite) */
    double threshold;        /* NaN: none */
    double measured;         /* NaN: none */
    const char *detail;      /* NULL: none */
} store_intervention;

/* The parallel layout of a run (schema/004_layout.sql; proto's ParallelLayout): the ranks that
 * produce its samples and the offsets that turn its local numbers into global ones. A size is
 * >= 1 and a rank is less than its size; head_offset is -1 when each push's offset is
 * tp_rank x its query heads. */
typedef struct {
    int32_t tp_rank, tp_size;   /* tensor parallelism: the heads of a layer are split */
    int32_t pp_rank, pp_size;   /* pipeline: the layers are split */
    int32_t dp_rank, dp_size;   /* data parallelism: replicas */
    int32_t cp_rank, cp_size;   /* context parallelism: the rows of a sequence are split */
    int32_t layer_offset;       /* global number of the stage's layer 0, >= 0 */
    int32_t head_offset;        /* global number of query head 0, >= 0, or -1 (see above) */
} store_layout;

const char *store_status_name(store_status st);

/* Schema version this code writes (the number of compiled-in migrations). */
int store_schema_version(void);

/* ---- Opening ------------------------------------------------------------------------------ */

/* store_options.durability: see "Durability" above. */
typedef enum {
    STORE_SYNC_NORMAL = 0,
    STORE_SYNC_FULL = 1,
} store_durability;

typedef struct {
    int busy_ms;                 /* wait for another handle's write lock; 0: 5000 ms */
    store_durability durability; /* writing handles; ignored by a read-only one */
    int readonly;                /* 1: as store_open_readonly() */
    int64_t cache_kib;           /* this handle's page cache in KiB; 0: SQLite's default (2 MiB) */
    int64_t checkpoint_pages;    /* writing handles: > 0, WAL checkpoints run on a thread of the
                                  * handle's own (a second connection) once the WAL holds this
                                  * many pages, never on the committing thread unless the WAL
                                  * passes 4x that; 0: SQLite's own (the committing thread, at
                                  * 1000 pages). See store_checkpoint_counts(). */
} store_options;

/* Every option at its default: a read-write handle, STORE_SYNC_NORMAL, 5 s busy timeout,
 * checkpoints as SQLite does them. */
#define STORE_OPTIONS_DEFAULT {0, STORE_SYNC_NORMAL, 0, 0, 0}

/* What a handle's checkpoint thread did since open (store_options.checkpoint_pages). */
typedef struct {
    uint64_t runs;            /* checkpoints the thread ran */
    uint64_t frames;          /* WAL frames they copied into the database */
    uint64_t inline_runs;     /* checkpoints the committing thread ran (the thread fell behind) */
    uint64_t errors;          /* failed checkpoints (the WAL keeps the data: nothing is lost) */
    char last_error[200];
} store_ckpt_counts;

/* 1 and *out filled when the handle has a checkpoint thread; 0 (and *out zero) otherwise. */
int store_checkpoint_counts(store *st, store_ckpt_counts *out);

/* Open with options (NULL: STORE_OPTIONS_DEFAULT). A read-write open creates the database when it
 * is missing, migrates it, and sets WAL, the durability asked for and foreign keys on. Returns
 * NULL with err set on failure (a bad option included). */
store *store_open_ex(const char *path, const store_options *opt, store_error *err);

/* Open (creating it when missing) the database at path for writing, migrate it, and prepare the
 * statements. Sets WAL, synchronous=NORMAL, foreign keys on, a busy timeout of busy_ms
 * (0: 5000 ms). Returns NULL with err set on failure. Same as store_open_ex() with busy_ms and
 * every other option at its default. */
store *store_open(const char *path, int busy_ms, store_error *err);

/* Open an existing database for reading only (the CLI). Never creates, migrates or writes the
 * database file (SQLite may create the -shm/-wal side files next to it, as every WAL reader does).
 * Returns NULL with err set when the file is missing, unreadable, corrupt, or of another schema. */
store *store_open_readonly(const char *path, int busy_ms, store_error *err);

/* The schema version a database file says it has (PRAGMA user_version), read without opening it
 * as a store: nothing is checked, migrated or written (SQLite may make the -shm file, as every
 * WAL reader does). For saying why an open refused a file: STORE_OK with *version (0: an empty
 * file, or one that has tables but no version: not attnstat's); STORE_SCHEMA when its
 * application_id is another program's (err says which); STORE_ERROR when SQLite cannot read it
 * (err says why). */
store_status store_file_schema(const char *path, int64_t *version, store_error *err);

/* Close the handle. An open batch is rolled back (commit first to keep it). NULL is fine. */
void store_close(store *st);

/* The handle's path, as given to open. */
const char *store_path(const store *st);

/* The durability this handle writes with (STORE_SYNC_NORMAL for a read-only handle). */
store_durability store_durability_of(const store *st);

#ifdef __cplusplus
}
#endif

#endif /* ATTNSTAT_STORE_H */
