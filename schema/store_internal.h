/* store_internal.h — private to schema/: the handle (struct store), the statement ids, and the
 * helpers that store.c gives the two halves (errors, statements, the run check, the end of a
 * batch, parameter binding). Included by store.c, store_write.c and store_read.c only, never by a
 * user of the store. Includes store.h, SQLite and libc.
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

/* Statement ids: the SQL of each is store_sql[id] in store.c. */
enum {
    S_BEGIN,
    S_COMMIT,
    S_ROLLBACK,
    S_RUN_UPSERT,
    S_RUN_EXISTS,
    S_SAMPLE_INSERT,
    S_SAMPLE_UPDATE,
    S_RUN_SUMMARY,
    S_ALERT_INSERT,
    S_RUNS_ALL,
    S_RUN_ONE,
    S_RUN_BY_NAME,
    S_TREND_HEAD,
    S_TREND_LAYER,
    S_GRID,
    S_ALERTS_ALL,
    S_ALERTS_ACTIVE,
    S_COUNT_ONE,
    S_COUNT_ALL,
    S_COUNT
};

struct store {
    sqlite3 *db;
    int readonly;
    int in_batch;         /* a transaction begun by a write is open */
    int64_t pending;      /* samples in the open batch */
    int64_t written;      /* samples committed through this handle */
    int64_t known_run;    /* last run id checked to exist (0: none) */
    sqlite3_stmt *stmt[S_COUNT];
    char path[];          /* as given to open */
};

/* ---- errors (store.c) ------------------------------------------------------------------------ */

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

/* ---- statements and transactions (store.c) --------------------------------------------------- */

/* The prepared statement id, preparing it on first use. NULL with err set on failure. */
sqlite3_stmt *store_stmt(store *st, int id, store_error *err);

/* Run a statement that returns no row (BEGIN, COMMIT, ROLLBACK): SQLITE_OK, or the failing code
 * with err set. */
int store_step_simple(store *st, int id, store_error *err);

/* Roll back whatever transaction is open and forget the batch (store_rollback(), store_close()).
 * Never fails: a ROLLBACK that cannot run leaves SQLite to roll back on close. */
void store_batch_rollback(store *st);

/* STORE_OK when run_id names a run (cached: runs are never deleted through a handle);
 * STORE_NOTFOUND with a message when it does not. */
store_status store_check_run(store *st, int64_t run_id, store_error *err);

/* ---- binding: by parameter name; statements are reset, bindings cleared, after every use ----- */

static inline void stmt_done(sqlite3_stmt *s)
{
    sqlite3_reset(s);
    sqlite3_clear_bindings(s);
}

static inline int param(sqlite3_stmt *s, const char *name)
{
    return sqlite3_bind_parameter_index(s, name);
}

static inline int bind_i64(sqlite3_stmt *s, const char *name, int64_t v)
{
    int i = param(s, name);
    return i ? sqlite3_bind_int64(s, i, v) : SQLITE_RANGE;
}

static inline int bind_f64(sqlite3_stmt *s, const char *name, double v)
{
    int i = param(s, name);
    if (!i)
        return SQLITE_RANGE;
    return isnan(v) ? sqlite3_bind_null(s, i) : sqlite3_bind_double(s, i, v);
}

/* The text must outlive the statement's use: every statement is reset and cleared before the
 * function that bound it returns. */
static inline int bind_text(sqlite3_stmt *s, const char *name, const char *v)
{
    int i = param(s, name);
    if (!i)
        return SQLITE_RANGE;
    return v ? sqlite3_bind_text(s, i, v, -1, SQLITE_STATIC) : sqlite3_bind_null(s, i);
}

#define BIND(call)                                                                                 \
    do {                                                                                           \
        if (rc == SQLITE_OK)                                                                       \
            rc = (call);                                                                           \
    } while (0)

#endif /* ATTNSTAT_STORE_INTERNAL_H */
