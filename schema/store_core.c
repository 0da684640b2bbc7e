/* store_core.c — the store's core, behind store.h: opening a handle (read-write or read-only, with its
 * options), the schema check and the migrations, statements, errors, the batch's per-run deltas,
 * read transactions, scratch memory, and closing. The other files of the store (store_write.c,
 * store_read.c, store_rows.c, store_export.c, store_retain.c, store_compact.c,
 * store_downsample.c) build on the helpers it exports
 * through store_internal.h; it calls none of them. Includes store_internal.h (store.h, SQLite),
 * the generated store_schema.h and libc.
 *
 * How it works
 * - Every statement lives in one table (store_sql[], store_sql.c), is prepared the first time it
 *   is needed with SQLITE_PREPARE_PERSISTENT, kept for the life of the handle, bound by position
 *   (never by name on the hot path), and reset (bindings cleared) after every use, whatever
 *   happened.
 * - Every SQLite return code is checked. A failure is turned into a store_error that says what was
 *   being done, sqlite3_errmsg() and the extended code, captured before anything else touches the
 *   connection (a rollback would overwrite the message).
 * - The struct itself is allocated with sqlite3_malloc(), so the fault-injection test that
 *   replaces SQLite's allocator covers the handle's own allocation too.
 */
#include "store_internal.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

/* Generated from the schema/ migrations: store_migrations[], STORE_SCHEMA_VERSION. */
#include "store_schema.h"

/* 'atst': PRAGMA application_id of an attnstat database. */
#define STORE_APPLICATION_ID 0x61747374

/* ---- errors ------------------------------------------------------------------------------- */

void store_set_err(store_error *err, int code, const char *fmt, ...)
{
    if (!err)
        return;
    err->code = code;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->msg, sizeof err->msg, fmt, ap);
    va_end(ap);
}

void store_append_err(store_error *err, const char *fmt, ...)
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
        store_append_err(err, "; the open batch of %" PRId64 " samples was rolled back",
                         st->pending);
        st->in_batch = 0;
        st->pending = 0;
        st->ndeltas = 0;
    }
    if (st->in_read && sqlite3_get_autocommit(st->db))
        st->in_read = 0;
}

store_status store_db_err(store *st, store_error *err, int rc, const char *fmt, ...)
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
        store_set_err(err, ext, "%s: %s (SQLite error %d)", what, msg, ext);
        if ((rc & 0xff) == SQLITE_CANTOPEN && st->db && sqlite3_system_errno(st->db))
            store_append_err(err, " [%s]", strerror(sqlite3_system_errno(st->db)));
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

store_durability store_durability_of(const store *st)
{
    return st->durability;
}

/* ---- statements ----------------------------------------------------------------------------- */

sqlite3_stmt *store_stmt(store *st, int id, store_error *err)
{
    if (!st->stmt[id]) {
        int rc = sqlite3_prepare_v3(st->db, store_sql[id], -1, SQLITE_PREPARE_PERSISTENT,
                                    &st->stmt[id], NULL);
        if (rc != SQLITE_OK) {
            store_db_err(st, err, rc, "preparing \"%.120s\"", store_sql[id]);
            sqlite3_finalize(st->stmt[id]);
            st->stmt[id] = NULL;
        }
    }
    return st->stmt[id];
}

/* Run one-off SQL (pragmas, migrations, transactions at open). */
static store_status exec_sql(store *st, const char *sql, const char *what, store_error *err)
{
    int rc = sqlite3_exec(st->db, sql, NULL, NULL, NULL);
    if (rc != SQLITE_OK)
        return store_db_err(st, err, rc, "%s", what);
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
        store_db_err(st, err, rc, "%s", what);
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
    store_ckpt_stop(st);
    for (int i = 0; i < S_COUNT; i++)
        sqlite3_finalize(st->stmt[i]);
    for (int i = 0; i < BUF_N; i++)
        sqlite3_free(st->buf[i].p);
    sqlite3_free(st->deltas);
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
        store_set_err(err, 0,
                      "database '%s' is not an attnstat database (application_id %" PRId64 ")",
                      st->path, app);
        return STORE_SCHEMA;
    }
    if (*version > STORE_SCHEMA_VERSION) {
        store_set_err(err, 0,
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
            store_set_err(err, 0,
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

/* SQLite's process-wide settings, once, before it is initialised: no memory statistics (every
 * allocation would take a global mutex to count itself; the store never reads them: 4% of an
 * ingest's CPU time, measured). SQLITE_MISUSE means SQLite was initialised already (by another
 * user in this process): its settings stay, which only costs that speed. */
static pthread_once_t configure_once = PTHREAD_ONCE_INIT;

static void configure_sqlite(void)
{
    int rc = sqlite3_config(SQLITE_CONFIG_MEMSTATUS, 0);
    (void)rc; /* SQLITE_OK, or SQLITE_MISUSE as above: both leave a working SQLite */
}

/* A path that names something other than a regular file (a FIFO, a device, a socket, a
 * directory) is refused before SQLite opens it: opening a FIFO blocks until a writer comes, for
 * ever. A path that does not exist is left to SQLite (a read-write open creates it). */
static int path_is_file(const char *path, store_error *err)
{
    struct stat sb;
    if (stat(path, &sb) != 0 || S_ISREG(sb.st_mode))
        return 1;
    mode_t m = sb.st_mode;
    store_set_err(err, 0, "'%s' is %s, not a database file: pass the path of the database file "
                  "itself", path, S_ISDIR(m) ? "a directory" : S_ISFIFO(m) ? "a FIFO"
                  : S_ISCHR(m) ? "a character device" : S_ISBLK(m) ? "a block device"
                  : S_ISSOCK(m) ? "a socket" : "a special file");
    return 0;
}

static store *open_common(const char *path, const store_options *opt, store_error *err)
{
    store_options o = STORE_OPTIONS_DEFAULT;
    if (opt)
        o = *opt;
    if (!path || !*path) {
        store_set_err(err, 0, "no database path given");
        return NULL;
    }
    if (o.durability != STORE_SYNC_NORMAL && o.durability != STORE_SYNC_FULL) {
        store_set_err(err, 0, "opening database '%s': durability %d is neither STORE_SYNC_NORMAL "
                      "nor STORE_SYNC_FULL", path, (int)o.durability);
        return NULL;
    }
    if (o.busy_ms < 0 || o.cache_kib < 0 || o.checkpoint_pages < 0 ||
        o.checkpoint_pages > (1 << 24)) {
        store_set_err(err, 0, "opening database '%s': busy_ms (%d), cache_kib (%lld) and "
                      "checkpoint_pages (%lld) must not be negative, nor checkpoint_pages over "
                      "%d", path, o.busy_ms, (long long)o.cache_kib,
                      (long long)o.checkpoint_pages, 1 << 24);
        return NULL;
    }
    int readonly = o.readonly != 0;
    if (!path_is_file(path, err))
        return NULL;
    pthread_once(&configure_once, configure_sqlite);
    int rc = sqlite3_initialize();
    if (rc != SQLITE_OK) {
        store_set_err(err, rc, "initialising SQLite: %s (SQLite error %d)", sqlite3_errstr(rc), rc);
        return NULL;
    }
    size_t len = strlen(path);
    store *st = sqlite3_malloc64(sizeof *st + len + 1);
    if (!st) {
        store_set_err(err, SQLITE_NOMEM, "opening database '%s': out of memory", path);
        return NULL;
    }
    memset(st, 0, sizeof *st);
    memcpy(st->path, path, len + 1);
    const char *mode = readonly ? "reading" : "writing";

    int flags = readonly ? SQLITE_OPEN_READONLY : SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE;
    rc = sqlite3_open_v2(path, &st->db, flags | SQLITE_OPEN_NOMUTEX | SQLITE_OPEN_EXRESCODE, NULL);
    if (rc != SQLITE_OK) {
        if (st->db)
            store_db_err(st, err, rc, "opening database '%s' for %s", path, mode);
        else
            store_set_err(err, rc, "opening database '%s' for %s: %s (SQLite error %d)", path, mode,
                    sqlite3_errstr(rc), rc);
        store_free(st);
        return NULL;
    }
    st->readonly = readonly;
    st->durability = readonly ? STORE_SYNC_NORMAL : o.durability;
    sqlite3_extended_result_codes(st->db, 1);
    rc = sqlite3_busy_timeout(st->db, o.busy_ms > 0 ? o.busy_ms : 5000);
    if (rc != SQLITE_OK) {
        store_db_err(st, err, rc, "setting the busy timeout of '%s'", path);
        store_free(st);
        return NULL;
    }

    int64_t version = 0;
    store_status rs = check_schema(st, &version, err);
    if (rs == STORE_ERROR && err) {
        char inner[sizeof err->msg];
        memcpy(inner, err->msg, sizeof inner);
        store_set_err(err, err->code, "opening database '%s' for %s: %s", path, mode, inner);
    }
    if (rs == STORE_OK && readonly) {
        if (version == 0) {
            store_set_err(err, 0, "database '%s' is not an attnstat database (it is empty)", path);
            rs = STORE_SCHEMA;
        } else if (version < STORE_SCHEMA_VERSION) {
            store_set_err(err, 0,
                    "database '%s' has schema version %" PRId64 ", older than this attnstat's "
                    "(%d): start attnstatd on it once to migrate it", path, version,
                    STORE_SCHEMA_VERSION);
            rs = STORE_SCHEMA;
        }
    }
    if (rs == STORE_OK && !readonly) {
        if (sqlite3_db_readonly(st->db, "main") == 1) {
            store_set_err(err, SQLITE_READONLY,
                          "database '%s' is not writable (check its permissions)", path);
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
                store_set_err(err, 0,
                              "database '%s': cannot use WAL mode (journal mode stays '%s')",
                              path, m ? m : "?");
                rs = STORE_ERROR;
            }
        } else {
            store_db_err(st, err, rc, "switching '%s' to WAL mode", path);
            rs = STORE_ERROR;
        }
        sqlite3_finalize(s);
        if (rs == STORE_OK)
            rs = exec_sql(st, st->durability == STORE_SYNC_FULL ? "PRAGMA synchronous = FULL"
                                                                : "PRAGMA synchronous = NORMAL",
                          "setting the durability (synchronous)", err);
        /* Migrations run with foreign keys off: a table rebuilt by one is copied, not
         * re-checked row by row (foreign_keys cannot change inside their transaction). */
        if (rs == STORE_OK && version < STORE_SCHEMA_VERSION)
            rs = migrate(st, err);
        if (rs == STORE_OK)
            rs = exec_sql(st, "PRAGMA foreign_keys = ON", "setting foreign_keys", err);
        if (rs == STORE_OK)
            rs = query_int(st, "PRAGMA foreign_keys", &dummy, "checking foreign_keys", err);
        if (rs == STORE_OK && dummy != 1) {
            store_set_err(err, 0, "database '%s': this SQLite cannot enforce foreign keys", path);
            rs = STORE_ERROR;
        }
    }
    if (rs == STORE_OK && o.cache_kib > 0) {
        char sql[64];
        snprintf(sql, sizeof sql, "PRAGMA cache_size = -%lld", (long long)o.cache_kib);
        rs = exec_sql(st, sql, "setting the page cache size", err);
    }
    if (rs == STORE_OK && readonly)
        rs = exec_sql(st, "PRAGMA query_only = ON", "setting query_only", err);
    if (rs == STORE_OK && !readonly && o.checkpoint_pages > 0) {
        store_error ce = {0, ""};
        rs = store_ckpt_start(st, o.checkpoint_pages,
                              st->durability == STORE_SYNC_FULL ? "PRAGMA synchronous = FULL"
                                                                : "PRAGMA synchronous = NORMAL",
                              &ce);
        if (rs != STORE_OK)
            store_set_err(err, ce.code, "%s", ce.msg);
    }
    /* Prepared now so that ending a batch never has to allocate to prepare. */
    for (int i = S_BEGIN; rs == STORE_OK && !readonly && i <= S_ROLLBACK; i++)
        if (!store_stmt(st, i, err))
            rs = STORE_ERROR;
    if (rs != STORE_OK) {
        store_free(st);
        return NULL;
    }
    return st;
}

store *store_open_ex(const char *path, const store_options *opt, store_error *err)
{
    return open_common(path, opt, err);
}

store *store_open(const char *path, int busy_ms, store_error *err)
{
    store_options o = STORE_OPTIONS_DEFAULT;
    o.busy_ms = busy_ms > 0 ? busy_ms : 0;
    return open_common(path, &o, err);
}

store *store_open_readonly(const char *path, int busy_ms, store_error *err)
{
    store_options o = STORE_OPTIONS_DEFAULT;
    o.busy_ms = busy_ms > 0 ? busy_ms : 0;
    o.readonly = 1;
    return open_common(path, &o, err);
}

/* One integer pragma of an open connection (user_version, application_id). */
static int file_pragma(sqlite3 *db, const char *sql, int64_t *out)
{
    sqlite3_stmt *s = NULL;
    int rc = sqlite3_prepare_v2(db, sql, -1, &s, NULL);
    if (rc == SQLITE_OK) {
        rc = sqlite3_step(s);
        if (rc == SQLITE_ROW) {
            *out = sqlite3_column_int64(s, 0);
            rc = SQLITE_OK;
        }
    }
    sqlite3_finalize(s);
    return rc;
}

store_status store_file_schema(const char *path, int64_t *version, store_error *err)
{
    *version = 0;
    if (!path || !*path) {
        store_set_err(err, 0, "no database path given");
        return STORE_ERROR;
    }
    if (!path_is_file(path, err))
        return STORE_ERROR;
    pthread_once(&configure_once, configure_sqlite);
    sqlite3 *db = NULL;
    int rc = sqlite3_open_v2(path, &db, SQLITE_OPEN_READONLY | SQLITE_OPEN_NOMUTEX |
                                            SQLITE_OPEN_EXRESCODE, NULL);
    int64_t app = 0;
    if (rc == SQLITE_OK)
        rc = sqlite3_busy_timeout(db, 5000);
    if (rc == SQLITE_OK)
        rc = file_pragma(db, "PRAGMA user_version", version);
    if (rc == SQLITE_OK)
        rc = file_pragma(db, "PRAGMA application_id", &app);
    if (rc != SQLITE_OK) {
        store_set_err(err, rc, "reading the schema version of '%s': %s (SQLite error %d)", path,
                      db ? sqlite3_errmsg(db) : sqlite3_errstr(rc), rc);
        sqlite3_close_v2(db);
        *version = 0;
        return STORE_ERROR;
    }
    sqlite3_close_v2(db);
    if (app != 0 && app != STORE_APPLICATION_ID) {
        store_set_err(err, 0, "database '%s' is not an attnstat database (application_id %" PRId64
                      ")", path, app);
        return STORE_SCHEMA;
    }
    return STORE_OK;
}

void store_close(store *st)
{
    if (!st)
        return;
    store_batch_rollback(st);
    store_free(st);
}

/* ---- transactions and runs (for both halves) ------------------------------------------------- */

int store_step_simple(store *st, int id, store_error *err)
{
    sqlite3_stmt *s = store_stmt(st, id, err);
    if (!s)
        return SQLITE_ERROR;
    int rc = sqlite3_step(s);
    if (rc == SQLITE_DONE)
        rc = SQLITE_OK;
    if (rc != SQLITE_OK)
        store_db_err(st, err, rc, "%s", store_sql[id]);
    stmt_done(s);
    return rc;
}

void store_batch_rollback(store *st)
{
    if (!sqlite3_get_autocommit(st->db)) {
        /* A failed ROLLBACK leaves nothing to do: SQLite rolls back on close. Use exec, not a
         * prepared statement: this must work even when preparing failed (out of memory). */
        if (store_step_simple(st, S_ROLLBACK, NULL) != SQLITE_OK)
            sqlite3_exec(st->db, "ROLLBACK", NULL, NULL, NULL);
    }
    st->in_batch = 0;
    st->in_read = 0;
    st->pending = 0;
    st->ndeltas = 0;
}

store_status store_check_run(store *st, int64_t run_id, store_error *err)
{
    if (run_id > 0 && run_id == st->known_run)
        return STORE_OK;
    sqlite3_stmt *s = store_stmt(st, S_RUN_EXISTS, err);
    if (!s)
        return STORE_ERROR;
    int rc = SQLITE_OK;
    BIND(bind_i64(s, 1, run_id));
    if (rc == SQLITE_OK)
        rc = sqlite3_step(s);
    stmt_done(s);
    if (rc == SQLITE_ROW) {
        st->known_run = run_id;
        return STORE_OK;
    }
    if (rc == SQLITE_DONE) {
        store_set_err(err, 0, "no run with id %" PRId64 " in '%s'", run_id, st->path);
        return STORE_NOTFOUND;
    }
    return store_db_err(st, err, rc, "looking up run %" PRId64, run_id);
}

/* ---- the batch's per-run deltas ----------------------------------------------------------------- */

store_status store_flush_deltas(store *st, store_error *err)
{
    if (st->ndeltas == 0)
        return STORE_OK;
    sqlite3_stmt *s = store_stmt(st, S_RUN_SUMMARY, err);
    if (!s)
        return STORE_ERROR;
    /* from the end, each one dropped once written: a failure half-way leaves exactly the deltas
     * not yet written, for the next try (the commit) */
    while (st->ndeltas > 0) {
        const store_run_delta *d = &st->deltas[st->ndeltas - 1];
        int rc = SQLITE_OK;
        BIND(bind_i64(s, 1, d->run_id));
        BIND(bind_i64(s, 2, d->added));
        BIND(bind_i64(s, 3, d->step_min));
        BIND(bind_i64(s, 4, d->step_max));
        BIND(bind_i64(s, 5, d->time_max));
        BIND(bind_i64(s, 6, d->added * STORE_EXACT_ROW_BYTES));
        if (rc == SQLITE_OK)
            rc = sqlite3_step(s);
        if (rc == SQLITE_DONE)
            rc = SQLITE_OK;
        stmt_done(s);
        if (rc != SQLITE_OK)
            return store_db_err(st, err, rc, "updating the summary of run %" PRId64, d->run_id);
        st->ndeltas--;
    }
    return STORE_OK;
}

/* ---- read transactions ----------------------------------------------------------------------- */

store_status store_read_begin(store *st, int *began, store_error *err)
{
    *began = 0;
    if (!sqlite3_get_autocommit(st->db)) {
        /* inside a batch: the reader sees it, summaries included */
        return st->in_batch ? store_flush_deltas(st, err) : STORE_OK;
    }
    if (store_step_simple(st, S_READ_BEGIN, err) != SQLITE_OK)
        return STORE_ERROR;
    st->in_read = 1;
    *began = 1;
    return STORE_OK;
}

void store_read_end(store *st, int began)
{
    if (!began || !st->in_read)
        return;
    st->in_read = 0;
    /* A read transaction has nothing to keep: COMMIT ends it; if even that fails, ROLLBACK. */
    if (!sqlite3_get_autocommit(st->db) && store_step_simple(st, S_COMMIT, NULL) != SQLITE_OK &&
        store_step_simple(st, S_ROLLBACK, NULL) != SQLITE_OK)
        sqlite3_exec(st->db, "ROLLBACK", NULL, NULL, NULL);
}

/* ---- scratch memory --------------------------------------------------------------------------- */

void *store_scratch(store *st, int id, size_t bytes, store_error *err)
{
    store_buf *b = &st->buf[id];
    if (b->cap >= bytes && b->p)
        return b->p;
    size_t cap = b->cap ? b->cap : 4096;
    while (cap < bytes)
        cap *= 2;
    void *p = sqlite3_realloc64(b->p, cap);
    if (!p) {
        store_set_err(err, SQLITE_NOMEM, "out of memory (%zu bytes of scratch space)", cap);
        return NULL;
    }
    b->p = p;
    b->cap = cap;
    return p;
}

/* ---- small statement helpers (the upkeep files) ---------------------------------------------- */

store_status store_one_int(store *st, sqlite3_stmt *s, int64_t *v, int *isnull, const char *what,
                            store_error *err)
{
    int rc = sqlite3_step(s);
    store_status rs = STORE_OK;
    if (rc == SQLITE_ROW) {
        *isnull = sqlite3_column_type(s, 0) == SQLITE_NULL;
        *v = sqlite3_column_int64(s, 0);
    } else if (rc == SQLITE_DONE) {
        *isnull = 1;
        *v = 0;
    } else {
        rs = store_db_err(st, err, rc, "%s in '%s'", what, st->path);
    }
    stmt_done(s);
    return rs;
}

store_status store_run_done(store *st, sqlite3_stmt *s, const char *what, store_error *err)
{
    int rc = sqlite3_step(s);
    stmt_done(s);
    if (rc != SQLITE_DONE)
        return store_db_err(st, err, rc, "%s in '%s'", what, st->path);
    return STORE_OK;
}

sqlite3_stmt *store_bind_ints(store *st, int id, const int64_t *args, int n, const char *what,
                              store_error *err)
{
    sqlite3_stmt *s = store_stmt(st, id, err);
    if (!s)
        return NULL;
    int rc = SQLITE_OK;
    for (int i = 0; i < n; i++)
        BIND(bind_i64(s, i + 1, args[i]));
    if (rc != SQLITE_OK) {
        stmt_done(s);
        store_db_err(st, err, rc, "binding the parameters of %s", what);
        return NULL;
    }
    return s;
}

store_status store_exec_ints(store *st, int id, const int64_t *args, int n, const char *what,
                             store_error *err)
{
    sqlite3_stmt *s = store_bind_ints(st, id, args, n, what, err);
    return s ? store_run_done(st, s, what, err) : STORE_ERROR;
}

store_status store_query_int(store *st, int id, const int64_t *args, int n, int64_t *v,
                             int *isnull, const char *what, store_error *err)
{
    sqlite3_stmt *s = store_bind_ints(st, id, args, n, what, err);
    return s ? store_one_int(st, s, v, isnull, what, err) : STORE_ERROR;
}

store_status store_adjust_run(store *st, int64_t run, int64_t bytes, int64_t samples,
                              store_error *err)
{
    if (!bytes && !samples)
        return STORE_OK;
    return store_exec_ints(st, S_RUN_ADJUST, (const int64_t[]){run, bytes, samples}, 3,
                           "updating a run's summary", err);
}
