/* store.c — the history database behind store.h, store_write.h and store_read.h, on SQLite.
 *
 * How it works
 * - Every statement lives in one table (store_sql[]), is prepared the first time it is needed with
 *   SQLITE_PREPARE_PERSISTENT, kept for the life of the handle, bound by parameter name, and reset
 *   (bindings cleared) after every use, whatever happened.
 * - Every SQLite return code is checked. A failure is turned into a store_error that says what was
 *   being done, sqlite3_errmsg() and the extended code, captured before anything else touches the
 *   connection (a rollback would overwrite the message).
 * - The batch is one transaction, begun with BEGIN IMMEDIATE by the first write (so it holds the
 *   write lock from the start and never fails half-way on a lock upgrade); store_commit() ends it. A write failure rolls it back. SQLite itself may roll a
 *   transaction back on some errors (out of memory, I/O, full disk); after any failure the handle
 *   checks sqlite3_get_autocommit() so its idea of the batch never drifts from SQLite's.
 * - The runs table carries a per-run summary (sample count, step range, last time) updated by each
 *   push in the same transaction, so listing runs and finding the latest step never scan samples.
 *   A sample is inserted with ON CONFLICT DO NOTHING and updated in place when that inserted
 *   nothing, which tells new rows from replaced ones and keeps the count exact.
 * - The struct itself is allocated with sqlite3_malloc(), so the fault-injection test that
 *   replaces SQLite's allocator covers the handle's own allocation too.
 */
#include "store_read.h"
#include "store_write.h"

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <sqlite3.h>

/* Generated from the schema/ migrations: store_migrations[], STORE_SCHEMA_VERSION. */
#include "store_schema.h"

/* 'atst': PRAGMA application_id of an attnstat database. */
#define STORE_APPLICATION_ID 0x61747374

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

#define RUN_COLS                                                                                   \
    "id, name, rank, host, pid, started, last_hello, config, thresholds, samples, step_min, "     \
    "step_max, last_time"
#define SAMPLE_COLS                                                                                \
    "run_id, layer, head, step, time, rows, rows_norm, rows_empty, nonfinite_rows, entropy_mean, " \
    "entropy_std, entropy_min, entropy_max, entropy_norm_mean, collapsed_frac, max_logit, sampled"
#define ALERT_COLS "id, run_id, layer, head, step, rule, state, value, threshold, time, message"

static const char *const store_sql[S_COUNT] = {
    [S_BEGIN] = "BEGIN IMMEDIATE",
    [S_COMMIT] = "COMMIT",
    [S_ROLLBACK] = "ROLLBACK",
    [S_RUN_UPSERT] =
        "INSERT INTO runs (name, rank, host, pid, started, last_hello, config, thresholds) "
        "VALUES (:name, :rank, :host, :pid, :time, :time, :config, :thresholds) "
        "ON CONFLICT (name, rank) DO UPDATE SET host = excluded.host, pid = excluded.pid, "
        "last_hello = excluded.last_hello, config = excluded.config, "
        "thresholds = excluded.thresholds RETURNING id",
    [S_RUN_EXISTS] = "SELECT 1 FROM runs WHERE id = :run",
    [S_SAMPLE_INSERT] =
        "INSERT INTO samples (" SAMPLE_COLS ") VALUES (:run, :layer, :head, :step, :time, :rows, "
        ":rows_norm, :rows_empty, :nonfinite_rows, :entropy_mean, :entropy_std, :entropy_min, "
        ":entropy_max, :entropy_norm_mean, :collapsed_frac, :max_logit, :sampled) "
        "ON CONFLICT (run_id, layer, head, step) DO NOTHING",
    [S_SAMPLE_UPDATE] =
        "UPDATE samples SET time = :time, rows = :rows, rows_norm = :rows_norm, "
        "rows_empty = :rows_empty, nonfinite_rows = :nonfinite_rows, "
        "entropy_mean = :entropy_mean, entropy_std = :entropy_std, entropy_min = :entropy_min, "
        "entropy_max = :entropy_max, entropy_norm_mean = :entropy_norm_mean, "
        "collapsed_frac = :collapsed_frac, max_logit = :max_logit, sampled = :sampled "
        "WHERE run_id = :run AND layer = :layer AND head = :head AND step = :step",
    [S_RUN_SUMMARY] =
        "UPDATE runs SET samples = samples + :added, "
        "step_min = min(coalesce(step_min, :step), :step), "
        "step_max = max(coalesce(step_max, :step), :step), "
        "last_time = max(coalesce(last_time, :time), :time) WHERE id = :run",
    [S_ALERT_INSERT] =
        "INSERT INTO alerts (run_id, layer, head, step, rule, state, value, threshold, time, "
        "message) VALUES (:run, :layer, :head, :step, :rule, :state, :value, :threshold, :time, "
        ":message)",
    [S_RUNS_ALL] = "SELECT " RUN_COLS " FROM runs ORDER BY id",
    [S_RUN_ONE] = "SELECT " RUN_COLS " FROM runs WHERE id = :run",
    [S_RUN_BY_NAME] =
        "SELECT id, rank FROM runs WHERE name = :name AND (:rank < 0 OR rank = :rank) "
        "ORDER BY rank, id",
    [S_TREND_HEAD] =
        "SELECT " SAMPLE_COLS " FROM (SELECT *, row_number() OVER (ORDER BY step) - 1 AS i "
        "FROM samples WHERE run_id = :run AND layer = :layer AND head = :head "
        "AND step BETWEEN :from AND :to) WHERE i % :every = 0 ORDER BY step",
    [S_TREND_LAYER] =
        "WITH steps AS (SELECT step, row_number() OVER (ORDER BY step) - 1 AS i FROM "
        "(SELECT DISTINCT step FROM samples WHERE run_id = :run AND layer = :layer "
        "AND step BETWEEN :from AND :to)) "
        "SELECT " SAMPLE_COLS " FROM samples WHERE run_id = :run AND layer = :layer "
        "AND step IN (SELECT step FROM steps WHERE i % :every = 0) ORDER BY step, head",
    [S_GRID] = "SELECT " SAMPLE_COLS " FROM samples WHERE run_id = :run AND step = :step "
               "ORDER BY layer, head",
    [S_ALERTS_ALL] =
        "SELECT " ALERT_COLS " FROM alerts WHERE (:run = 0 OR run_id = :run) ORDER BY id",
    [S_ALERTS_ACTIVE] =
        "SELECT " ALERT_COLS " FROM alerts WHERE id IN (SELECT max(id) FROM alerts "
        "WHERE (:run = 0 OR run_id = :run) GROUP BY run_id, layer, head, rule) "
        "AND state = 'raised' ORDER BY id",
    [S_COUNT_ONE] = "SELECT samples FROM runs WHERE id = :run",
    [S_COUNT_ALL] = "SELECT coalesce(sum(samples), 0) FROM runs",
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

/* ---- errors ------------------------------------------------------------------------------- */

static void set_err(store_error *err, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void set_err(store_error *err, int code, const char *fmt, ...)
{
    if (!err)
        return;
    err->code = code;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->msg, sizeof err->msg, fmt, ap);
    va_end(ap);
}

/* Append to an error message already set. */
static void add_err(store_error *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void add_err(store_error *err, const char *fmt, ...)
{
    if (!err)
        return;
    size_t n = strlen(err->msg);
    if (n + 1 >= sizeof err->msg)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->msg + n, sizeof err->msg - n, fmt, ap);
    va_end(ap);
}

/* If SQLite ended the transaction on its own (it does on some errors), forget the batch, and say
 * so in err. */
static void note_lost_batch(store *st, store_error *err)
{
    if (st->in_batch && sqlite3_get_autocommit(st->db)) {
        add_err(err, "; the open batch of %" PRId64 " samples was rolled back", st->pending);
        st->in_batch = 0;
        st->pending = 0;
    }
}

/* Record a failure of SQLite call rc while doing `what` (printf format). */
static store_status db_err(store *st, store_error *err, int rc, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static store_status db_err(store *st, store_error *err, int rc, const char *fmt, ...)
{
    if (err) {
        char what[256];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(what, sizeof what, fmt, ap);
        va_end(ap);
        int ext = st->db ? sqlite3_extended_errcode(st->db) : rc;
        if ((ext & 0xff) != (rc & 0xff))
            ext = rc; /* the connection's code belongs to another call */
        const char *msg = st->db ? sqlite3_errmsg(st->db) : sqlite3_errstr(rc);
        set_err(err, ext, "%s: %s (SQLite error %d)", what, msg, ext);
        if ((rc & 0xff) == SQLITE_CANTOPEN && st->db && sqlite3_system_errno(st->db))
            add_err(err, " [%s]", strerror(sqlite3_system_errno(st->db)));
    }
    if (st->db)
        note_lost_batch(st, err);
    return STORE_ERROR;
}

const char *store_status_name(store_status s)
{
    switch (s) {
    case STORE_OK: return "ok";
    case STORE_ERROR: return "database error";
    case STORE_EINVAL: return "invalid argument";
    case STORE_NOTFOUND: return "not found";
    case STORE_AMBIGUOUS: return "ambiguous";
    case STORE_SCHEMA: return "schema mismatch";
    }
    return "unknown status";
}

int store_schema_version(void)
{
    return STORE_SCHEMA_VERSION;
}

const char *store_path(const store *st)
{
    return st->path;
}

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* ---- statements ----------------------------------------------------------------------------- */

/* The prepared statement id, preparing it on first use. NULL with err set on failure. */
static sqlite3_stmt *stmt_get(store *st, int id, store_error *err)
{
    if (!st->stmt[id]) {
        int rc = sqlite3_prepare_v3(st->db, store_sql[id], -1, SQLITE_PREPARE_PERSISTENT,
                                    &st->stmt[id], NULL);
        if (rc != SQLITE_OK) {
            db_err(st, err, rc, "preparing \"%.120s\"", store_sql[id]);
            sqlite3_finalize(st->stmt[id]);
            st->stmt[id] = NULL;
        }
    }
    return st->stmt[id];
}

static void stmt_done(sqlite3_stmt *s)
{
    sqlite3_reset(s);
    sqlite3_clear_bindings(s);
}

static int param(sqlite3_stmt *s, const char *name)
{
    return sqlite3_bind_parameter_index(s, name);
}

static int bind_i64(sqlite3_stmt *s, const char *name, int64_t v)
{
    int i = param(s, name);
    return i ? sqlite3_bind_int64(s, i, v) : SQLITE_RANGE;
}

static int bind_f64(sqlite3_stmt *s, const char *name, double v)
{
    int i = param(s, name);
    if (!i)
        return SQLITE_RANGE;
    return isnan(v) ? sqlite3_bind_null(s, i) : sqlite3_bind_double(s, i, v);
}

/* The text must outlive the statement's use: every statement is reset and cleared before the
 * function that bound it returns. */
static int bind_text(sqlite3_stmt *s, const char *name, const char *v)
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

static double col_f64(sqlite3_stmt *s, int i)
{
    return sqlite3_column_type(s, i) == SQLITE_NULL ? NAN : sqlite3_column_double(s, i);
}

static const char *col_text(sqlite3_stmt *s, int i)
{
    return sqlite3_column_type(s, i) == SQLITE_NULL ? NULL : (const char *)sqlite3_column_text(s, i);
}

/* Run one-off SQL (pragmas, migrations, transactions at open). */
static store_status exec_sql(store *st, const char *sql, const char *what, store_error *err)
{
    int rc = sqlite3_exec(st->db, sql, NULL, NULL, NULL);
    if (rc != SQLITE_OK)
        return db_err(st, err, rc, "%s", what);
    return STORE_OK;
}

/* One integer from one-off SQL (a pragma). */
static store_status query_int(store *st, const char *sql, int64_t *out, const char *what,
                              store_error *err)
{
    sqlite3_stmt *s = NULL;
    int rc = sqlite3_prepare_v2(st->db, sql, -1, &s, NULL);
    if (rc == SQLITE_OK) {
        rc = sqlite3_step(s);
        if (rc == SQLITE_ROW) {
            *out = sqlite3_column_int64(s, 0);
            rc = SQLITE_OK;
        } else if (rc == SQLITE_DONE) {
            *out = 0;
            rc = SQLITE_OK;
        }
    }
    if (rc != SQLITE_OK) {
        db_err(st, err, rc, "%s", what);
        sqlite3_finalize(s);
        return STORE_ERROR;
    }
    sqlite3_finalize(s);
    return STORE_OK;
}

/* ---- opening --------------------------------------------------------------------------------- */

static void store_free(store *st)
{
    if (!st)
        return;
    for (int i = 0; i < S_COUNT; i++)
        sqlite3_finalize(st->stmt[i]);
    sqlite3_close_v2(st->db);
    sqlite3_free(st);
}

/* Read user_version and application_id and decide whether this code may use the database.
 * *version gets user_version. */
static store_status check_schema(store *st, int64_t *version, store_error *err)
{
    int64_t app = 0, objects = 0;
    if (query_int(st, "PRAGMA user_version", version, "reading the schema version", err) ||
        query_int(st, "PRAGMA application_id", &app, "reading the application id", err))
        return STORE_ERROR;
    if (app != 0 && app != STORE_APPLICATION_ID) {
        set_err(err, 0, "database '%s' is not an attnstat database (application_id %" PRId64 ")",
                st->path, app);
        return STORE_SCHEMA;
    }
    if (*version > STORE_SCHEMA_VERSION) {
        set_err(err, 0,
                "database '%s' has schema version %" PRId64 ", newer than this attnstat "
                "understands (%d): use the attnstat that wrote it, or a newer one",
                st->path, *version, STORE_SCHEMA_VERSION);
        return STORE_SCHEMA;
    }
    if (*version == 0) {
        if (query_int(st, "SELECT count(*) FROM sqlite_schema", &objects,
                      "reading the schema", err))
            return STORE_ERROR;
        if (objects > 0) {
            set_err(err, 0,
                    "database '%s' is not an attnstat database (it has tables but no attnstat "
                    "schema version)", st->path);
            return STORE_SCHEMA;
        }
    }
    return STORE_OK;
}

/* Apply migrations user_version+1 .. STORE_SCHEMA_VERSION in one transaction. */
static store_status migrate(store *st, store_error *err)
{
    store_status rs = exec_sql(st, "BEGIN IMMEDIATE", "starting the schema migration", err);
    if (rs)
        return rs;
    int64_t version = 0;
    rs = check_schema(st, &version, err); /* again, now that no one else can write */
    for (int64_t v = version + 1; rs == STORE_OK && v <= STORE_SCHEMA_VERSION; v++) {
        char what[128];
        snprintf(what, sizeof what, "applying schema migration %s", store_migrations[v - 1].name);
        rs = exec_sql(st, store_migrations[v - 1].sql, what, err);
    }
    if (rs == STORE_OK && version < STORE_SCHEMA_VERSION) {
        char sql[128];
        snprintf(sql, sizeof sql, "PRAGMA user_version = %d; PRAGMA application_id = %d",
                 STORE_SCHEMA_VERSION, STORE_APPLICATION_ID);
        rs = exec_sql(st, sql, "recording the schema version", err);
    }
    if (rs == STORE_OK)
        rs = exec_sql(st, "COMMIT", "committing the schema migration", err);
    if (rs != STORE_OK && !sqlite3_get_autocommit(st->db))
        sqlite3_exec(st->db, "ROLLBACK", NULL, NULL, NULL);
    return rs;
}

static store *open_common(const char *path, int readonly, int busy_ms, store_error *err)
{
    if (!path || !*path) {
        set_err(err, 0, "no database path given");
        return NULL;
    }
    int rc = sqlite3_initialize();
    if (rc != SQLITE_OK) {
        set_err(err, rc, "initialising SQLite: %s (SQLite error %d)", sqlite3_errstr(rc), rc);
        return NULL;
    }
    size_t len = strlen(path);
    store *st = sqlite3_malloc64(sizeof *st + len + 1);
    if (!st) {
        set_err(err, SQLITE_NOMEM, "opening database '%s': out of memory", path);
        return NULL;
    }
    memset(st, 0, sizeof *st);
    memcpy(st->path, path, len + 1);
    const char *mode = readonly ? "reading" : "writing";

    int flags = readonly ? SQLITE_OPEN_READONLY : SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE;
    rc = sqlite3_open_v2(path, &st->db, flags | SQLITE_OPEN_NOMUTEX | SQLITE_OPEN_EXRESCODE, NULL);
    if (rc != SQLITE_OK) {
        if (st->db)
            db_err(st, err, rc, "opening database '%s' for %s", path, mode);
        else
            set_err(err, rc, "opening database '%s' for %s: %s (SQLite error %d)", path, mode,
                    sqlite3_errstr(rc), rc);
        store_free(st);
        return NULL;
    }
    st->readonly = readonly;
    sqlite3_extended_result_codes(st->db, 1);
    rc = sqlite3_busy_timeout(st->db, busy_ms > 0 ? busy_ms : 5000);
    if (rc != SQLITE_OK) {
        db_err(st, err, rc, "setting the busy timeout of '%s'", path);
        store_free(st);
        return NULL;
    }

    int64_t version = 0;
    store_status rs = check_schema(st, &version, err);
    if (rs == STORE_ERROR && err) {
        char inner[sizeof err->msg];
        memcpy(inner, err->msg, sizeof inner);
        set_err(err, err->code, "opening database '%s' for %s: %s", path, mode, inner);
    }
    if (rs == STORE_OK && readonly) {
        if (version == 0) {
            set_err(err, 0, "database '%s' is not an attnstat database (it is empty)", path);
            rs = STORE_SCHEMA;
        } else if (version < STORE_SCHEMA_VERSION) {
            set_err(err, 0,
                    "database '%s' has schema version %" PRId64 ", older than this attnstat's "
                    "(%d): start attnstatd on it once to migrate it", path, version,
                    STORE_SCHEMA_VERSION);
            rs = STORE_SCHEMA;
        }
    }
    if (rs == STORE_OK && !readonly) {
        if (sqlite3_db_readonly(st->db, "main") == 1) {
            set_err(err, SQLITE_READONLY, "database '%s' is not writable (check its permissions)",
                    path);
            rs = STORE_ERROR;
        }
    }
    if (rs == STORE_OK && !readonly) {
        int64_t dummy = 0;
        /* journal_mode answers with the mode it ended up in. */
        sqlite3_stmt *s = NULL;
        rc = sqlite3_prepare_v2(st->db, "PRAGMA journal_mode = WAL", -1, &s, NULL);
        if (rc == SQLITE_OK)
            rc = sqlite3_step(s);
        if (rc == SQLITE_ROW) {
            const char *m = (const char *)sqlite3_column_text(s, 0);
            if (!m || strcmp(m, "wal") != 0) {
                set_err(err, 0, "database '%s': cannot use WAL mode (journal mode stays '%s')",
                        path, m ? m : "?");
                rs = STORE_ERROR;
            }
        } else {
            db_err(st, err, rc, "switching '%s' to WAL mode", path);
            rs = STORE_ERROR;
        }
        sqlite3_finalize(s);
        if (rs == STORE_OK)
            rs = exec_sql(st, "PRAGMA synchronous = NORMAL; PRAGMA foreign_keys = ON",
                          "setting synchronous=NORMAL and foreign_keys", err);
        if (rs == STORE_OK)
            rs = query_int(st, "PRAGMA foreign_keys", &dummy, "checking foreign_keys", err);
        if (rs == STORE_OK && dummy != 1) {
            set_err(err, 0, "database '%s': this SQLite cannot enforce foreign keys", path);
            rs = STORE_ERROR;
        }
        if (rs == STORE_OK && version < STORE_SCHEMA_VERSION)
            rs = migrate(st, err);
    }
    if (rs == STORE_OK && readonly)
        rs = exec_sql(st, "PRAGMA query_only = ON", "setting query_only", err);
    /* Prepared now so that ending a batch never has to allocate to prepare. */
    for (int i = S_BEGIN; rs == STORE_OK && !readonly && i <= S_ROLLBACK; i++)
        if (!stmt_get(st, i, err))
            rs = STORE_ERROR;
    if (rs != STORE_OK) {
        store_free(st);
        return NULL;
    }
    return st;
}

store *store_open(const char *path, int busy_ms, store_error *err)
{
    return open_common(path, 0, busy_ms, err);
}

store *store_open_readonly(const char *path, int busy_ms, store_error *err)
{
    return open_common(path, 1, busy_ms, err);
}

void store_close(store *st)
{
    if (!st)
        return;
    store_rollback(st);
    store_free(st);
}

/* ---- batches --------------------------------------------------------------------------------- */

static store_status check_writable(store *st, store_error *err)
{
    if (st->readonly) {
        set_err(err, 0, "database '%s' was opened read-only", st->path);
        return STORE_EINVAL;
    }
    return STORE_OK;
}

/* Run a statement that returns no row (BEGIN, COMMIT, ROLLBACK). */
static int step_simple(store *st, int id, store_error *err)
{
    sqlite3_stmt *s = stmt_get(st, id, err);
    if (!s)
        return SQLITE_ERROR;
    int rc = sqlite3_step(s);
    if (rc == SQLITE_DONE)
        rc = SQLITE_OK;
    if (rc != SQLITE_OK)
        db_err(st, err, rc, "%s", store_sql[id]);
    stmt_done(s);
    return rc;
}

static store_status batch_begin(store *st, store_error *err)
{
    if (st->in_batch)
        return STORE_OK;
    if (!sqlite3_get_autocommit(st->db))
        store_rollback(st); /* a rollback that failed earlier left a transaction behind */
    if (step_simple(st, S_BEGIN, err) != SQLITE_OK) {
        add_err(err, " (starting a batch in '%s')", st->path);
        return STORE_ERROR;
    }
    st->in_batch = 1;
    st->pending = 0;
    return STORE_OK;
}

void store_rollback(store *st)
{
    if (!st)
        return;
    if (!sqlite3_get_autocommit(st->db)) {
        /* A failed ROLLBACK leaves nothing to do: SQLite rolls back on close. Use exec, not a
         * prepared statement: this must work even when preparing failed (out of memory). */
        if (step_simple(st, S_ROLLBACK, NULL) != SQLITE_OK)
            sqlite3_exec(st->db, "ROLLBACK", NULL, NULL, NULL);
    }
    st->in_batch = 0;
    st->pending = 0;
}

/* A write failed: roll back the batch and say so. */
static store_status batch_fail(store *st, store_error *err)
{
    if (st->in_batch) {
        if (err && !strstr(err->msg, "was rolled back"))
            add_err(err, "; the open batch of %" PRId64 " samples was rolled back", st->pending);
        store_rollback(st);
    }
    return STORE_ERROR;
}

store_status store_commit(store *st, store_error *err)
{
    if (!st->in_batch)
        return STORE_OK;
    if (step_simple(st, S_COMMIT, err) != SQLITE_OK) {
        add_err(err, " (committing a batch to '%s')", st->path);
        return batch_fail(st, err);
    }
    st->written += st->pending;
    st->pending = 0;
    st->in_batch = 0;
    return STORE_OK;
}

int64_t store_pending(const store *st)
{
    return st->pending;
}

int64_t store_samples_written(const store *st)
{
    return st->written;
}

/* ---- writing --------------------------------------------------------------------------------- */

store_status store_run_begin(store *st, const store_run_info *info, int64_t *run_id,
                             store_error *err)
{
    store_status rs = check_writable(st, err);
    if (rs)
        return rs;
    if (!info || !info->name || !*info->name) {
        set_err(err, 0, "a run needs a non-empty name");
        return STORE_EINVAL;
    }
    if (info->rank < 0) {
        set_err(err, 0, "run '%s': rank %" PRId32 " is negative", info->name, info->rank);
        return STORE_EINVAL;
    }
    if ((rs = batch_begin(st, err)))
        return rs;
    sqlite3_stmt *s = stmt_get(st, S_RUN_UPSERT, err);
    if (!s)
        return batch_fail(st, err);
    int rc = SQLITE_OK;
    BIND(bind_text(s, ":name", info->name));
    BIND(bind_i64(s, ":rank", info->rank));
    BIND(bind_text(s, ":host", info->host));
    BIND(bind_i64(s, ":pid", info->pid));
    BIND(bind_i64(s, ":time", info->time_ms ? info->time_ms : now_ms()));
    BIND(bind_text(s, ":config", info->config));
    BIND(bind_text(s, ":thresholds", info->thresholds));
    if (rc == SQLITE_OK) {
        rc = sqlite3_step(s);
        if (rc == SQLITE_ROW) {
            *run_id = sqlite3_column_int64(s, 0);
            rc = sqlite3_step(s);
        }
        if (rc == SQLITE_DONE)
            rc = SQLITE_OK;
    }
    if (rc != SQLITE_OK) {
        db_err(st, err, rc, "recording run '%s' rank %" PRId32, info->name, info->rank);
        stmt_done(s);
        return batch_fail(st, err);
    }
    stmt_done(s);
    return store_commit(st, err);
}

/* STORE_OK when run_id names a run (cached: runs are never deleted through a handle). */
static store_status check_run(store *st, int64_t run_id, store_error *err)
{
    if (run_id > 0 && run_id == st->known_run)
        return STORE_OK;
    sqlite3_stmt *s = stmt_get(st, S_RUN_EXISTS, err);
    if (!s)
        return STORE_ERROR;
    int rc = SQLITE_OK;
    BIND(bind_i64(s, ":run", run_id));
    if (rc == SQLITE_OK)
        rc = sqlite3_step(s);
    stmt_done(s);
    if (rc == SQLITE_ROW) {
        st->known_run = run_id;
        return STORE_OK;
    }
    if (rc == SQLITE_DONE) {
        set_err(err, 0, "no run with id %" PRId64 " in '%s'", run_id, st->path);
        return STORE_NOTFOUND;
    }
    return db_err(st, err, rc, "looking up run %" PRId64, run_id);
}

static int bind_sample(sqlite3_stmt *s, int64_t run_id, int32_t layer, int32_t head,
                       int64_t step, int64_t time_ms, const stats_head *h)
{
    int rc = SQLITE_OK;
    BIND(bind_i64(s, ":run", run_id));
    BIND(bind_i64(s, ":layer", layer));
    BIND(bind_i64(s, ":head", head));
    BIND(bind_i64(s, ":step", step));
    BIND(bind_i64(s, ":time", time_ms));
    BIND(bind_i64(s, ":rows", h->rows));
    BIND(bind_i64(s, ":rows_norm", h->rows_norm));
    BIND(bind_i64(s, ":rows_empty", h->rows_empty));
    BIND(bind_i64(s, ":nonfinite_rows", h->nonfinite_rows));
    BIND(bind_f64(s, ":entropy_mean", h->entropy_mean));
    BIND(bind_f64(s, ":entropy_std", h->entropy_std));
    BIND(bind_f64(s, ":entropy_min", h->entropy_min));
    BIND(bind_f64(s, ":entropy_max", h->entropy_max));
    BIND(bind_f64(s, ":entropy_norm_mean", h->entropy_norm_mean));
    BIND(bind_f64(s, ":collapsed_frac", h->collapsed_frac));
    BIND(bind_f64(s, ":max_logit", h->max_logit));
    BIND(bind_i64(s, ":sampled", h->sampled));
    return rc;
}

store_status store_add_samples(store *st, int64_t run_id, int64_t step, int32_t layer,
                               const stats_head *heads, int32_t nheads, int64_t time_ms,
                               store_error *err)
{
    store_status rs = check_writable(st, err);
    if (rs)
        return rs;
    if (!heads || nheads < 1 || layer < 0) {
        set_err(err, 0, "samples of run %" PRId64 " step %" PRId64 ": need layer >= 0 and at "
                "least one head (layer %" PRId32 ", %" PRId32 " heads)", run_id, step, layer,
                nheads);
        return STORE_EINVAL;
    }
    if ((rs = check_run(st, run_id, err))) {
        if (rs == STORE_ERROR)
            return batch_fail(st, err);
        return rs;
    }
    if ((rs = batch_begin(st, err)))
        return rs;
    if (!time_ms)
        time_ms = now_ms();
    sqlite3_stmt *ins = stmt_get(st, S_SAMPLE_INSERT, err);
    sqlite3_stmt *upd = ins ? stmt_get(st, S_SAMPLE_UPDATE, err) : NULL;
    sqlite3_stmt *sum = upd ? stmt_get(st, S_RUN_SUMMARY, err) : NULL;
    if (!sum)
        return batch_fail(st, err);
    int64_t added = 0;
    int rc = SQLITE_OK;
    int32_t h;
    for (h = 0; h < nheads && rc == SQLITE_OK; h++) {
        rc = bind_sample(ins, run_id, layer, h, step, time_ms, &heads[h]);
        if (rc == SQLITE_OK)
            rc = sqlite3_step(ins);
        if (rc == SQLITE_DONE) {
            rc = SQLITE_OK;
            if (sqlite3_changes(st->db) > 0) {
                added++;
            } else { /* already stored: replace */
                rc = bind_sample(upd, run_id, layer, h, step, time_ms, &heads[h]);
                if (rc == SQLITE_OK)
                    rc = sqlite3_step(upd);
                if (rc == SQLITE_DONE)
                    rc = SQLITE_OK;
                if (rc != SQLITE_OK)
                    db_err(st, err, rc, "replacing sample run %" PRId64 " layer %" PRId32
                           " head %" PRId32 " step %" PRId64, run_id, layer, h, step);
                stmt_done(upd);
            }
        } else {
            db_err(st, err, rc, "storing sample run %" PRId64 " layer %" PRId32 " head %" PRId32
                   " step %" PRId64, run_id, layer, h, step);
        }
        stmt_done(ins);
    }
    if (rc == SQLITE_OK) {
        BIND(bind_i64(sum, ":added", added));
        BIND(bind_i64(sum, ":step", step));
        BIND(bind_i64(sum, ":time", time_ms));
        BIND(bind_i64(sum, ":run", run_id));
        if (rc == SQLITE_OK)
            rc = sqlite3_step(sum);
        if (rc == SQLITE_DONE)
            rc = SQLITE_OK;
        if (rc != SQLITE_OK)
            db_err(st, err, rc, "updating the summary of run %" PRId64, run_id);
        stmt_done(sum);
    }
    if (rc != SQLITE_OK)
        return batch_fail(st, err);
    st->pending += nheads;
    return STORE_OK;
}

store_status store_add_alert(store *st, const store_alert *a, store_error *err)
{
    store_status rs = check_writable(st, err);
    if (rs)
        return rs;
    if (!a || !a->rule || !*a->rule || a->layer < 0 || a->head < 0 ||
        (a->state != STORE_ALERT_RAISED && a->state != STORE_ALERT_CLEARED)) {
        set_err(err, 0, "an alert needs a rule name, layer >= 0, head >= 0 and state raised or "
                "cleared");
        return STORE_EINVAL;
    }
    if ((rs = check_run(st, a->run_id, err))) {
        if (rs == STORE_ERROR)
            return batch_fail(st, err);
        return rs;
    }
    if ((rs = batch_begin(st, err)))
        return rs;
    sqlite3_stmt *s = stmt_get(st, S_ALERT_INSERT, err);
    if (!s)
        return batch_fail(st, err);
    int rc = SQLITE_OK;
    BIND(bind_i64(s, ":run", a->run_id));
    BIND(bind_i64(s, ":layer", a->layer));
    BIND(bind_i64(s, ":head", a->head));
    BIND(bind_i64(s, ":step", a->step));
    BIND(bind_text(s, ":rule", a->rule));
    BIND(bind_text(s, ":state", a->state == STORE_ALERT_RAISED ? "raised" : "cleared"));
    BIND(bind_f64(s, ":value", a->value));
    BIND(bind_f64(s, ":threshold", a->threshold));
    BIND(bind_i64(s, ":time", a->time_ms ? a->time_ms : now_ms()));
    BIND(bind_text(s, ":message", a->message));
    if (rc == SQLITE_OK)
        rc = sqlite3_step(s);
    if (rc == SQLITE_DONE)
        rc = SQLITE_OK;
    if (rc != SQLITE_OK)
        db_err(st, err, rc, "storing alert %s of run %" PRId64 " layer %" PRId32 " head %" PRId32,
               a->rule, a->run_id, a->layer, a->head);
    stmt_done(s);
    return rc == SQLITE_OK ? STORE_OK : batch_fail(st, err);
}

/* ---- reading --------------------------------------------------------------------------------- */

static void read_run(sqlite3_stmt *s, store_run *r)
{
    r->id = sqlite3_column_int64(s, 0);
    r->name = col_text(s, 1);
    r->rank = sqlite3_column_int(s, 2);
    r->host = col_text(s, 3);
    r->pid = sqlite3_column_int64(s, 4);
    r->started_ms = sqlite3_column_int64(s, 5);
    r->last_hello_ms = sqlite3_column_int64(s, 6);
    r->config = col_text(s, 7);
    r->thresholds = col_text(s, 8);
    r->samples = sqlite3_column_int64(s, 9);
    r->step_min = sqlite3_column_int64(s, 10);
    r->step_max = sqlite3_column_int64(s, 11);
    r->last_time_ms = sqlite3_column_int64(s, 12);
    if (!r->name)
        r->name = "";
}

static void read_sample(sqlite3_stmt *s, store_sample *o)
{
    o->run_id = sqlite3_column_int64(s, 0);
    o->layer = sqlite3_column_int(s, 1);
    o->head = sqlite3_column_int(s, 2);
    o->step = sqlite3_column_int64(s, 3);
    o->time_ms = sqlite3_column_int64(s, 4);
    stats_head *h = &o->stats;
    h->rows = sqlite3_column_int64(s, 5);
    h->rows_norm = sqlite3_column_int64(s, 6);
    h->rows_empty = sqlite3_column_int64(s, 7);
    h->nonfinite_rows = sqlite3_column_int64(s, 8);
    h->entropy_mean = col_f64(s, 9);
    h->entropy_std = col_f64(s, 10);
    h->entropy_min = col_f64(s, 11);
    h->entropy_max = col_f64(s, 12);
    h->entropy_norm_mean = col_f64(s, 13);
    h->collapsed_frac = col_f64(s, 14);
    h->max_logit = col_f64(s, 15);
    h->sampled = sqlite3_column_int(s, 16);
}

static void read_alert(sqlite3_stmt *s, store_alert *a)
{
    a->id = sqlite3_column_int64(s, 0);
    a->run_id = sqlite3_column_int64(s, 1);
    a->layer = sqlite3_column_int(s, 2);
    a->head = sqlite3_column_int(s, 3);
    a->step = sqlite3_column_int64(s, 4);
    a->rule = col_text(s, 5);
    const char *state = col_text(s, 6);
    a->state = state && strcmp(state, "raised") == 0 ? STORE_ALERT_RAISED : STORE_ALERT_CLEARED;
    a->value = col_f64(s, 7);
    a->threshold = col_f64(s, 8);
    a->time_ms = sqlite3_column_int64(s, 9);
    a->message = col_text(s, 10);
    if (!a->rule)
        a->rule = "";
}

enum { ROW_RUN, ROW_SAMPLE, ROW_ALERT };

/* Step a bound statement to its end, handing each row to cb. *rows counts the rows delivered.
 * Resets the statement. */
static store_status deliver(store *st, sqlite3_stmt *s, int kind, void *cb, void *ctx,
                            int64_t *rows, const char *what, store_error *err)
{
    int64_t n = 0;
    int rc;
    while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
        int stop;
        n++;
        if (kind == ROW_RUN) {
            store_run r;
            read_run(s, &r);
            stop = ((store_run_cb)cb)(ctx, &r);
        } else if (kind == ROW_SAMPLE) {
            store_sample r;
            read_sample(s, &r);
            stop = ((store_sample_cb)cb)(ctx, &r);
        } else {
            store_alert r;
            read_alert(s, &r);
            stop = ((store_alert_cb)cb)(ctx, &r);
        }
        if (stop) {
            rc = SQLITE_DONE;
            break;
        }
    }
    store_status rs = STORE_OK;
    if (rc != SQLITE_DONE)
        rs = db_err(st, err, rc, "%s in '%s'", what, st->path);
    stmt_done(s);
    if (rows)
        *rows = n;
    return rs;
}

static store_status check_cb(const void *cb, store_error *err)
{
    if (!cb) {
        set_err(err, 0, "no callback given");
        return STORE_EINVAL;
    }
    return STORE_OK;
}

store_status store_list_runs(store *st, store_run_cb cb, void *ctx, store_error *err)
{
    if (check_cb((const void *)cb, err))
        return STORE_EINVAL;
    sqlite3_stmt *s = stmt_get(st, S_RUNS_ALL, err);
    if (!s)
        return STORE_ERROR;
    return deliver(st, s, ROW_RUN, (void *)cb, ctx, NULL, "listing runs", err);
}

store_status store_get_run(store *st, int64_t run_id, store_run_cb cb, void *ctx,
                           store_error *err)
{
    if (check_cb((const void *)cb, err))
        return STORE_EINVAL;
    sqlite3_stmt *s = stmt_get(st, S_RUN_ONE, err);
    if (!s)
        return STORE_ERROR;
    int rc = bind_i64(s, ":run", run_id);
    if (rc != SQLITE_OK) {
        stmt_done(s);
        return db_err(st, err, rc, "binding the run id");
    }
    int64_t n = 0;
    store_status rs = deliver(st, s, ROW_RUN, (void *)cb, ctx, &n, "reading a run", err);
    if (rs == STORE_OK && n == 0) {
        set_err(err, 0, "no run with id %" PRId64 " in '%s'", run_id, st->path);
        return STORE_NOTFOUND;
    }
    return rs;
}

store_status store_resolve_run(store *st, const char *spec, int32_t rank, int64_t *run_id,
                               store_error *err)
{
    if (!spec || !*spec) {
        set_err(err, 0, "no run given (a run id or name)");
        return STORE_EINVAL;
    }
    /* A decimal id of an existing run wins over a run that happens to be named with digits. */
    char *end = NULL;
    errno = 0;
    long long id = strtoll(spec, &end, 10);
    if (*spec >= '0' && *spec <= '9' && end && !*end && errno == 0 && id > 0) {
        store_status rs = check_run(st, id, err);
        if (rs == STORE_OK) {
            *run_id = id;
            return STORE_OK;
        }
        if (rs != STORE_NOTFOUND)
            return rs;
    }
    sqlite3_stmt *s = stmt_get(st, S_RUN_BY_NAME, err);
    if (!s)
        return STORE_ERROR;
    int rc = SQLITE_OK;
    BIND(bind_text(s, ":name", spec));
    BIND(bind_i64(s, ":rank", rank));
    int n = 0;
    char ids[160] = "";
    size_t used = 0;
    while (rc == SQLITE_OK && (rc = sqlite3_step(s)) == SQLITE_ROW) {
        int64_t rid = sqlite3_column_int64(s, 0);
        if (n++ == 0)
            *run_id = rid;
        if (used + 48 < sizeof ids)
            used += (size_t)snprintf(ids + used, sizeof ids - used, "%s id %" PRId64 " rank %d",
                                     n > 1 ? "," : "", rid, sqlite3_column_int(s, 1));
        rc = SQLITE_OK;
    }
    if (rc != SQLITE_DONE) {
        db_err(st, err, rc, "looking up run '%s'", spec);
        stmt_done(s);
        return STORE_ERROR;
    }
    stmt_done(s);
    if (n == 0) {
        if (rank >= 0)
            set_err(err, 0, "no run '%s' with rank %" PRId32 " in '%s'", spec, rank, st->path);
        else
            set_err(err, 0, "no run with id or name '%s' in '%s'", spec, st->path);
        return STORE_NOTFOUND;
    }
    if (n > 1) {
        set_err(err, 0, "run name '%s' matches %d runs (%s): give a rank or a run id", spec, n,
                ids);
        return STORE_AMBIGUOUS;
    }
    return STORE_OK;
}

store_status store_trend(store *st, int64_t run_id, int32_t layer, int32_t head,
                         int64_t step_from, int64_t step_to, int64_t every,
                         store_sample_cb cb, void *ctx, store_error *err)
{
    if (check_cb((const void *)cb, err))
        return STORE_EINVAL;
    sqlite3_stmt *s = stmt_get(st, head >= 0 ? S_TREND_HEAD : S_TREND_LAYER, err);
    if (!s)
        return STORE_ERROR;
    int rc = SQLITE_OK;
    BIND(bind_i64(s, ":run", run_id));
    BIND(bind_i64(s, ":layer", layer));
    if (head >= 0)
        BIND(bind_i64(s, ":head", head));
    BIND(bind_i64(s, ":from", step_from));
    BIND(bind_i64(s, ":to", step_to));
    BIND(bind_i64(s, ":every", every > 1 ? every : 1));
    if (rc != SQLITE_OK) {
        stmt_done(s);
        return db_err(st, err, rc, "binding the trend query");
    }
    return deliver(st, s, ROW_SAMPLE, (void *)cb, ctx, NULL, "reading a trend", err);
}

store_status store_grid(store *st, int64_t run_id, int64_t step, int64_t *step_used,
                        store_sample_cb cb, void *ctx, store_error *err)
{
    if (check_cb((const void *)cb, err))
        return STORE_EINVAL;
    if (step == STORE_STEP_LATEST) {
        sqlite3_stmt *q = stmt_get(st, S_RUN_ONE, err);
        if (!q)
            return STORE_ERROR;
        int rc = bind_i64(q, ":run", run_id);
        if (rc == SQLITE_OK)
            rc = sqlite3_step(q);
        int have = 0;
        if (rc == SQLITE_ROW) {
            have = sqlite3_column_type(q, 11) != SQLITE_NULL;
            step = sqlite3_column_int64(q, 11);
            rc = SQLITE_DONE;
        } else if (rc == SQLITE_DONE) {
            stmt_done(q);
            set_err(err, 0, "no run with id %" PRId64 " in '%s'", run_id, st->path);
            return STORE_NOTFOUND;
        }
        if (rc != SQLITE_DONE) {
            db_err(st, err, rc, "finding the latest step of run %" PRId64, run_id);
            stmt_done(q);
            return STORE_ERROR;
        }
        stmt_done(q);
        if (!have) {
            set_err(err, 0, "run %" PRId64 " has no samples yet", run_id);
            return STORE_NOTFOUND;
        }
    }
    if (step_used)
        *step_used = step;
    sqlite3_stmt *s = stmt_get(st, S_GRID, err);
    if (!s)
        return STORE_ERROR;
    int rc = SQLITE_OK;
    BIND(bind_i64(s, ":run", run_id));
    BIND(bind_i64(s, ":step", step));
    if (rc != SQLITE_OK) {
        stmt_done(s);
        return db_err(st, err, rc, "binding the grid query");
    }
    int64_t n = 0;
    store_status rs = deliver(st, s, ROW_SAMPLE, (void *)cb, ctx, &n, "reading a step", err);
    if (rs == STORE_OK && n == 0) {
        set_err(err, 0, "run %" PRId64 " has no sample at step %" PRId64, run_id, step);
        return STORE_NOTFOUND;
    }
    return rs;
}

store_status store_alerts(store *st, int64_t run_id, int active_only, store_alert_cb cb,
                          void *ctx, store_error *err)
{
    if (check_cb((const void *)cb, err))
        return STORE_EINVAL;
    sqlite3_stmt *s = stmt_get(st, active_only ? S_ALERTS_ACTIVE : S_ALERTS_ALL, err);
    if (!s)
        return STORE_ERROR;
    int rc = bind_i64(s, ":run", run_id > 0 ? run_id : 0);
    if (rc != SQLITE_OK) {
        stmt_done(s);
        return db_err(st, err, rc, "binding the alert query");
    }
    return deliver(st, s, ROW_ALERT, (void *)cb, ctx, NULL, "reading alerts", err);
}

store_status store_count_samples(store *st, int64_t run_id, int64_t *count, store_error *err)
{
    sqlite3_stmt *s = stmt_get(st, run_id > 0 ? S_COUNT_ONE : S_COUNT_ALL, err);
    if (!s)
        return STORE_ERROR;
    int rc = SQLITE_OK;
    if (run_id > 0)
        BIND(bind_i64(s, ":run", run_id));
    if (rc == SQLITE_OK)
        rc = sqlite3_step(s);
    store_status rs = STORE_OK;
    if (rc == SQLITE_ROW) {
        *count = sqlite3_column_int64(s, 0);
    } else if (rc == SQLITE_DONE) {
        set_err(err, 0, "no run with id %" PRId64 " in '%s'", run_id, st->path);
        rs = STORE_NOTFOUND;
    } else {
        rs = db_err(st, err, rc, "counting samples in '%s'", st->path);
    }
    stmt_done(s);
    return rs;
}

store_status store_integrity_check(store *st, store_error *err)
{
    sqlite3_stmt *s = NULL;
    int rc = sqlite3_prepare_v2(st->db, "PRAGMA integrity_check", -1, &s, NULL);
    if (rc == SQLITE_OK)
        rc = sqlite3_step(s);
    store_status rs = STORE_OK;
    if (rc == SQLITE_ROW) {
        const char *r = (const char *)sqlite3_column_text(s, 0);
        if (!r || strcmp(r, "ok") != 0) {
            set_err(err, SQLITE_CORRUPT, "integrity check of '%s' failed: %s", st->path,
                    r ? r : "(no answer)");
            rs = STORE_ERROR;
        }
    } else {
        rs = db_err(st, err, rc, "checking the integrity of '%s'", st->path);
    }
    sqlite3_finalize(s);
    return rs;
}
