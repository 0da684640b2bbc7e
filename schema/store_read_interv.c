/* store_read_interv.c — a run's interventions read back, behind store_read.h:
 * store_interventions(). Used by the CLI on a read-only handle (and by any handle). Calls store_core.c's helpers
 * (store_internal.h) and SQLite.
 *
 * How it works
 * - One statement (S_INTERVENTIONS) walks interventions_run (run, step) in one read transaction.
 * - heads and head_values are the JSON arrays store_add_intervention() writes
 *   (schema/006_interventions.sql): integers, and numbers with 17 significant digits, which strtod
 *   reads back bit for bit. They are decoded into the handle's scratch buffers (BUF_A, BUF_B); a
 *   text that is not such an array (a row written by hand) is an error naming the row, never a
 *   silently wrong head.
 */
#include "store_read.h"

#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "store_internal.h"

/* Elements of the JSON array text: commas + 1, or 0 for "[]" (the syntax is checked later). */
static int32_t array_count(const char *t)
{
    const char *p = t + strspn(t, " \t\r\n");
    if (*p != '[')
        return -1;
    p++;
    p += strspn(p, " \t\r\n");
    if (*p == ']')
        return 0;
    int64_t n = 1;
    for (; *p; p++)
        n += *p == ',';
    return n > STORE_INTERVENTION_HEADS_MAX ? -1 : (int32_t)n;
}

/* Decodes the array text t of n elements into ints (integers >= 0) or dbls; -1 when it is not
 * one. */
static int array_decode(const char *t, int32_t n, int32_t *ints, double *dbls)
{
    const char *p = t + strspn(t, " \t\r\n") + 1;
    for (int32_t i = 0; i < n; i++) {
        char *end;
        errno = 0;
        if (ints) {
            long long v = strtoll(p, &end, 10);
            if (end == p || errno || v < 0 || v > INT32_MAX)
                return -1;
            ints[i] = (int32_t)v;
        } else {
            double v = strtod(p, &end);
            if (end == p)
                return -1;
            dbls[i] = v;
        }
        p = end + strspn(end, " \t\r\n");
        if (*p != (i + 1 < n ? ',' : ']'))
            return -1;
        p++;
    }
    if (n == 0)
        p = strchr(p, ']') + 1; /* "[ ]": array_count found the ']' */
    return p[strspn(p, " \t\r\n")] == '\0' ? 0 : -1;
}

/* The row s is on into *iv (its texts and arrays valid until the statement moves). */
static store_status read_row(store *st, sqlite3_stmt *s, store_intervention *iv, store_error *err)
{
    *iv = (store_intervention){
        .id = sqlite3_column_int64(s, 0),
        .run_id = sqlite3_column_int64(s, 1),
        .rank = (int32_t)sqlite3_column_int64(s, 2),
        .step = sqlite3_column_int64(s, 3),
        .time_ms = sqlite3_column_int64(s, 4),
        .kind = (const char *)sqlite3_column_text(s, 5),
        .layer = sqlite3_column_type(s, 6) == SQLITE_NULL ? -1
                                                          : (int32_t)sqlite3_column_int64(s, 6),
        .threshold = col_f64(s, 9),
        .measured = col_f64(s, 10),
        .detail = (const char *)sqlite3_column_text(s, 11),
    };
    const char *heads = (const char *)sqlite3_column_text(s, 7);
    const char *values = (const char *)sqlite3_column_text(s, 8);
    int32_t n = heads ? array_count(heads) : -1;
    int32_t nv = values ? array_count(values) : n;
    if (n < 0 || nv != n) {
        store_set_err(err, 0, "intervention %" PRId64 " of run %" PRId64 ": heads and head_values "
                      "are not JSON arrays of one value a head (schema/006_interventions.sql): "
                      "the row was written by something else than attnstatd",
                      iv->id, iv->run_id);
        return STORE_ERROR;
    }
    int32_t *h = store_scratch(st, BUF_A, (size_t)(n ? n : 1) * sizeof *h, err);
    double *v = values ? store_scratch(st, BUF_B, (size_t)(n ? n : 1) * sizeof *v, err) : NULL;
    if (!h || (values && !v))
        return STORE_ERROR;
    if (array_decode(heads, n, h, NULL) != 0 || (values && array_decode(values, n, NULL, v) != 0)) {
        store_set_err(err, 0, "intervention %" PRId64 " of run %" PRId64 ": heads or head_values "
                      "is not the JSON array attnstatd writes (integers >= 0, numbers)",
                      iv->id, iv->run_id);
        return STORE_ERROR;
    }
    iv->heads = h;
    iv->nheads = n;
    iv->values = v;
    return STORE_OK;
}

store_status store_interventions(store *st, int64_t run_id, store_intervention_cb cb, void *ctx,
                                 store_error *err)
{
    if (run_id < 0 || !cb) {
        store_set_err(err, 0, "store_interventions: run_id %" PRId64 " must be >= 0 (0: every "
                      "run), and a callback given", run_id);
        return STORE_EINVAL;
    }
    int began = 0;
    store_status rs = store_read_begin(st, &began, err);
    if (rs)
        return rs;
    if (run_id > 0 && (rs = store_check_run(st, run_id, err)) != STORE_OK) {
        store_read_end(st, began);
        return rs;
    }
    sqlite3_stmt *s = store_bind_ints(st, S_INTERVENTIONS, &run_id, 1, "listing interventions",
                                      err);
    if (!s) {
        store_read_end(st, began);
        return STORE_ERROR;
    }
    int rc;
    while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
        store_intervention iv;
        if ((rs = read_row(st, s, &iv, err)) != STORE_OK)
            break;
        if (cb(ctx, &iv))
            break;
    }
    if (rs == STORE_OK && rc != SQLITE_ROW && rc != SQLITE_DONE)
        rs = store_db_err(st, err, rc, "listing the interventions of run %" PRId64, run_id);
    stmt_done(s);
    store_read_end(st, began);
    return rs;
}
