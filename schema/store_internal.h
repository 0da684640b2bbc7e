/* store_internal.h — private to schema/: the handle (struct store), the statement ids, and the
 * helpers that store_core.c gives the other files of the store (errors, statements, the run check, the
 * end of a batch, read transactions, scratch memory, parameter binding). Included by every .c file
 * of schema/ (store*.c but store_pack.c) and the private header store_upkeep.h,
 * never by a user of the store (the tests of the statements' plans excepted). Includes store.h,
 * store_pack.h, SQLite and libc.
 *
 * The helpers with external linkage carry the store_ prefix (symbols of the library, though no
 * public header declares them); the small static inline ones at the end keep short names.
 */
#ifndef ATTNSTAT_STORE_INTERNAL_H
#define ATTNSTAT_STORE_INTERNAL_H

#include <math.h>
#include <stdint.h>

#include <sqlite3.h>

#include "store.h"
#include "store_pack.h"

/* Bytes an exact-tier row takes on disk, about (the 17 columns, the cell and the page's slack);
 * the per-run size estimate (runs.bytes) counts exact rows at this. 002_compact.sql uses it too. */
#define STORE_EXACT_ROW_BYTES 110
/* Bytes a compact or bucket row takes beyond its BLOBs: key, columns, cell, index entry. */
#define STORE_PACK_ROW_OVERHEAD 40

/* Statement ids: the SQL of each is store_sql[id] (store_sql.c), with numbered parameters (?1,
 * ?2, ...) bound by position. */
enum {
    /* transactions */
    S_BEGIN,
    S_COMMIT,
    S_ROLLBACK,
    S_READ_BEGIN,
    /* the write path (store_write.c) */
    S_RUN_UPSERT,
    S_RUN_ID_TAKEN,
    S_RUN_END,
    S_SILENCES_END_RUN,
    S_RUN_EXISTS,
    S_SAMPLE_INSERT,
    S_SAMPLE_UPDATE,
    S_RUN_SUMMARY,
    S_ALERT_INSERT,
    S_ALERT_ONE,
    S_ALERT_ACK,
    S_SILENCE_INSERT,
    S_SILENCES_END_KEY,
    S_SILENCES_END,
    S_SILENCES,
    /* reads (store_read.c, store_export.c) */
    S_RUNS_ALL,
    S_RUN_ONE,
    S_RUN_BY_NAME,
    S_HOT_TREND_HEAD,
    S_HOT_TREND_LAYER,
    S_HOT_GRID,
    S_PACK_TREND,
    S_PACK_GRID,
    S_COARSE_TREND,
    S_COARSE_AT,
    S_LAYERS,
    S_ALERTS_ALL,
    S_ALERTS_RUN,
    S_ALERTS_ACTIVE,
    S_ALERTS_ACTIVE_RUN,
    S_COUNT_ONE,
    S_COUNT_ALL,
    /* retention (store_retain.c) */
    S_RUNS_RETAIN,
    S_RUNS_RETAIN_ONE,
    S_NEXT_LAYER,
    S_HOT_MIN_STEP,
    S_HOT_BLOCK,
    S_HOT_DELETE,
    S_PACK_GET,
    S_PACK_PUT,
    S_PACK_NEXT_STEP,
    S_PACK_WINDOW_TIME,
    S_PACK_DELETE,
    S_ALERT_STEPS,
    S_COARSE_GET,
    S_COARSE_STARTED,
    S_COARSE_PUT,
    S_RUN_DOWNSAMPLED,
    S_RUN_ADJUST,
    S_RUN_SET_RETAIN,
    S_PAGES_USED,
    S_DEL_HOT_BOUND,
    S_DEL_HOT,
    S_DEL_PACK_BOUND,
    S_DEL_PACK,
    S_DEL_COARSE,
    S_DEL_RUN,
    /* the parallel layout of runs, a job's runs (store_write.c, store_job.c) */
    S_RUN_SET_LAYOUT,
    S_JOB_RUNS,
    S_JOB_RUN_ONE,
    /* interventions (store_write.c, store_read_interv.c) */
    S_INTERVENTION_INSERT,
    S_INTERVENTIONS,
    S_COUNT
};

/* The SQL of a statement id (store_sql.c). */
extern const char *const store_sql[S_COUNT];

/* What a batch did to one run, written to its summary row at commit. */
typedef struct {
    int64_t run_id;
    int64_t added;            /* new samples */
    int64_t step_min, step_max;
    int64_t time_max;
} store_run_delta;

/* Growable scratch memory owned by the handle (sqlite3_realloc64, so allocation failures are
 * injected by the tests like SQLite's own). */
typedef struct {
    void *p;
    size_t cap;               /* bytes */
} store_buf;

enum { BUF_A, BUF_B, BUF_OUT, BUF_LO, BUF_HI, BUF_BYTES, BUF_COUNTS, BUF_RUNS, BUF_N };

struct store {
    sqlite3 *db;
    int readonly;
    store_durability durability;
    int in_batch;             /* a transaction begun by a write is open */
    int in_read;              /* a read transaction begun by store_read_begin() is open */
    int64_t pending;          /* samples in the open batch */
    int64_t written;          /* samples committed through this handle */
    int64_t known_run;        /* last run id checked to exist (0: none); reset by each batch */
    store_run_delta *deltas;  /* runs touched by the open batch */
    int ndeltas, capdeltas;
    store_buf buf[BUF_N];
    sqlite3_stmt *stmt[S_COUNT];
    struct store_ckpt *ckpt;  /* the checkpoint thread (store_ckpt.c); NULL: none */
    char path[];              /* as given to open */
};

/* ---- the checkpoint thread (store_ckpt.c) ----------------------------------------------------- */

/* Starts it for a writing handle: a second connection (sync_sql sets its synchronous), the
 * writer's automatic checkpoint off and a WAL hook that wakes the thread at `pages`. err (not
 * NULL) says why it could not. */
store_status store_ckpt_start(store *st, int64_t pages, const char *sync_sql, store_error *err);
/* Stops and joins it (before the writer's connection closes); nothing when there is none. */
void store_ckpt_stop(store *st);

/* ---- errors (store_core.c) ------------------------------------------------------------------- */

/* Set err (when not NULL): the code, and the message formatted from fmt. */
void store_set_err(store_error *err, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Append to an error message already set. */
void store_append_err(store_error *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Record a failure of SQLite call rc while doing `what` (printf format): err gets what, the
 * connection's message and the extended code, and a batch that SQLite ended on its own is
 * forgotten (and said so). Returns STORE_ERROR. */
store_status store_db_err(store *st, store_error *err, int rc, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* ---- statements and transactions (store_core.c) ---------------------------------------------- */

/* The prepared statement id, preparing it on first use. NULL with err set on failure. */
sqlite3_stmt *store_stmt(store *st, int id, store_error *err);

/* Run a statement that returns no row (BEGIN, COMMIT, ROLLBACK): SQLITE_OK, or the failing code
 * with err set. */
int store_step_simple(store *st, int id, store_error *err);

/* Roll back whatever transaction is open and forget the batch (store_rollback(), store_close()).
 * Never fails: a ROLLBACK that cannot run leaves SQLite to roll back on close. */
void store_batch_rollback(store *st);

/* STORE_OK when run_id names a run (the last one found is cached until the next batch begins or
 * the run is deleted); STORE_NOTFOUND with a message when it does not. */
store_status store_check_run(store *st, int64_t run_id, store_error *err);

/* Write the open batch's per-run deltas to the runs table (before a commit, and before a read on
 * the writing handle, so that it sees its own batch). */
store_status store_flush_deltas(store *st, store_error *err);

/* A read that runs several statements sees one snapshot: store_read_begin() opens a read
 * transaction unless one (or a batch) is open already, and says in *began whether it did;
 * store_read_end() ends it when began. */
store_status store_read_begin(store *st, int *began, store_error *err);
void store_read_end(store *st, int began);

/* One integer from a bound statement's first row (*isnull: NULL or no row); resets it. */
store_status store_one_int(store *st, sqlite3_stmt *s, int64_t *v, int *isnull, const char *what,
                           store_error *err);

/* Run a bound statement that returns no row; resets it. */
store_status store_run_done(store *st, sqlite3_stmt *s, const char *what, store_error *err);

/* Statement id with its parameters 1 .. n bound to args[0 .. n-1] (integers): store_bind_ints()
 * returns it bound (the caller steps and resets it; NULL with err set on failure);
 * store_exec_ints() runs one that returns no row; store_query_int() one that returns one integer
 * (*isnull: NULL or no row). `what` names the work for an error message. */
sqlite3_stmt *store_bind_ints(store *st, int id, const int64_t *args, int n, const char *what,
                              store_error *err);
store_status store_exec_ints(store *st, int id, const int64_t *args, int n, const char *what,
                             store_error *err);
store_status store_query_int(store *st, int id, const int64_t *args, int n, int64_t *v,
                             int *isnull, const char *what, store_error *err);

/* Add to a run's size estimate and sample count (both may be negative; the size stops at 0). */
store_status store_adjust_run(store *st, int64_t run, int64_t bytes, int64_t samples,
                              store_error *err);

/* Scratch memory: buffer id grown to at least `bytes`. NULL with err set when out of memory. */
void *store_scratch(store *st, int id, size_t bytes, store_error *err);

/* ---- rows of the tiers (store_rows.c) ------------------------------------------------------------ */

/* The exact tier's columns (HOT_COLS, store_sql.c), 0-based: run_id, layer, head, step, time, then
 * vocab.h's VOCAB_COUNTS and VOCAB_STATS rows in table order, then sampled. S_SAMPLE_INSERT and
 * S_SAMPLE_UPDATE take them as parameters ?1 .. ?HOT_NCOLS in the same order (column c: ?c+1). */
enum {
    HOT_COL_COUNTS = 5,
    HOT_COL_STATS = HOT_COL_COUNTS + VOCAB_NCOUNTS,
    HOT_COL_SAMPLED = HOT_COL_STATS + VOCAB_NSTATS,
    HOT_NCOLS
};

/* The exact-tier row the statement is on (the columns of HOT_COLS, store_sql.c) into h; its
 * layer to *layer, its step to *step (either may be NULL). */
void store_row_hot(sqlite3_stmt *s, store_pack_head *h, int32_t *layer, int64_t *step);

/* The compact row at columns time_col / data_col into BUF_A: every head (head < 0) or the one of
 * id head; *n: the heads decoded. -1 with err set when the row is damaged or memory runs out. */
int store_row_pack(store *st, sqlite3_stmt *s, int time_col, int data_col, int32_t head,
                   int32_t *n, store_error *err);

/* A bucket's columns (merged, lo, mean, hi at columns c .. c+3 of s): n heads into the handle's
 * scratch buffers BUF_LO, BUF_A, BUF_HI and BUF_COUNTS. -1 with err set when they do not agree
 * (a damaged row) or memory runs out. */
int store_row_bucket(store *st, sqlite3_stmt *s, int c, int64_t time, int32_t *n,
                     store_error *err);

/* ---- binding: by position; statements are reset, bindings cleared, after every use ----------- */

static inline void stmt_done(sqlite3_stmt *s)
{
    sqlite3_reset(s);
    sqlite3_clear_bindings(s);
}

static inline int bind_i64(sqlite3_stmt *s, int i, int64_t v)
{
    return sqlite3_bind_int64(s, i, v);
}

static inline int bind_f64(sqlite3_stmt *s, int i, double v)
{
    return isnan(v) ? sqlite3_bind_null(s, i) : sqlite3_bind_double(s, i, v);
}

/* The text must outlive the statement's use: every statement is reset and cleared before the
 * function that bound it returns. */
static inline int bind_text(sqlite3_stmt *s, int i, const char *v)
{
    return v ? sqlite3_bind_text(s, i, v, -1, SQLITE_STATIC) : sqlite3_bind_null(s, i);
}

static inline int bind_blob(sqlite3_stmt *s, int i, const void *v, size_t n)
{
    return sqlite3_bind_blob64(s, i, v, n, SQLITE_STATIC);
}

/* A column that may be NULL: NaN then. */
static inline double col_f64(sqlite3_stmt *s, int i)
{
    return sqlite3_column_type(s, i) == SQLITE_NULL ? NAN : sqlite3_column_double(s, i);
}

#define BIND(call)                                                                                 \
    do {                                                                                           \
        if (rc == SQLITE_OK)                                                                       \
            rc = (call);                                                                           \
    } while (0)

#endif /* ATTNSTAT_STORE_INTERNAL_H */
