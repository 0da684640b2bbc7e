/* store_export.c — a run's whole history as a stream, behind store_read.h: store_export() and the
 * row formatter store_format_sample() (CSV, JSON lines). Calls store_trend() (store_read.c),
 * store_core.c's helpers (store_internal.h), SQLite and libc.
 *
 * How it works
 * - One read transaction for the export (store_trend() runs inside it without opening its own).
 *   The run's layers come first (S_LAYERS: a skip-scan of the compact tier's and the buckets'
 *   keys, and the exact tier's rows); then each layer is read as a trend over every step, which is
 *   the order the export promises: layer, step, head.
 * - The layers are copied out before the first trend runs; a callback that stops ends the export
 *   (the trend says nothing of it: a wrapper notes it).
 */
#include "store_read.h"

#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "store_internal.h"

/* The caller's callback, and whether it asked to stop. */
typedef struct {
    store_sample_cb cb;
    void *ctx;
    int stopped;
} stop_watch;

static int watch(void *ctx, const store_sample *s)
{
    stop_watch *w = ctx;
    w->stopped = w->cb(w->ctx, s) != 0;
    return w->stopped;
}

store_status store_export(store *st, int64_t run_id, store_sample_cb cb, void *ctx,
                          store_error *err)
{
    if (!cb) {
        store_set_err(err, 0, "no callback given");
        return STORE_EINVAL;
    }
    int began = 0;
    store_status rs = store_read_begin(st, &began, err);
    if (rs == STORE_OK)
        rs = store_check_run(st, run_id, err);
    int32_t *layers = NULL;
    size_t n = 0;
    if (rs == STORE_OK) {
        sqlite3_stmt *s = store_stmt(st, S_LAYERS, err);
        if (!s)
            rs = STORE_ERROR;
        int rc = s ? bind_i64(s, 1, run_id) : SQLITE_OK;
        while (rs == STORE_OK && rc == SQLITE_OK && (rc = sqlite3_step(s)) == SQLITE_ROW) {
            int32_t *l = store_scratch(st, BUF_BYTES, (n + 1) * sizeof *l, err);
            if (!l) {
                rs = STORE_ERROR;
                break;
            }
            layers = l;
            layers[n++] = sqlite3_column_int(s, 0);
            rc = SQLITE_OK;
        }
        if (rs == STORE_OK && rc != SQLITE_DONE)
            rs = store_db_err(st, err, rc, "listing the layers of run %" PRId64, run_id);
        if (s)
            stmt_done(s);
    }
    /* BUF_BYTES is not used by the trend reader: the list stays valid through it */
    stop_watch w = {cb, ctx, 0};
    for (size_t i = 0; rs == STORE_OK && i < n && !w.stopped; i++)
        rs = store_trend(st, run_id, layers[i], -1, INT64_MIN, INT64_MAX, 1, watch, &w, err);
    store_read_end(st, began);
    return rs;
}

/* ---- formatting ------------------------------------------------------------------------------- */

typedef struct {
    char *p;
    size_t len, used; /* used may exceed len: what the whole line needs */
} out;

static void put(out *o, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void put(out *o, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    size_t room = o->used < o->len ? o->len - o->used : 0;
    int k = vsnprintf(room ? o->p + o->used : NULL, room, fmt, ap);
    va_end(ap);
    if (k > 0)
        o->used += (size_t)k;
}

static void put_num(out *o, store_format f, double v)
{
    if (f == STORE_FORMAT_CSV) {
        if (!isnan(v))
            put(o, "%.17g", v);
    } else if (isfinite(v)) {
        put(o, "%.17g", v);
    } else {
        put(o, "null");
    }
}

static const char *const tier_names[] = {"exact", "compact", "bucket"};

size_t store_format_sample(const store_sample *s, store_format f, char *buf, size_t len)
{
#define NAME_(name, ...) #name,
    static const char *const fnames[VOCAB_NSTATS] = {VOCAB_STATS(NAME_)};
#undef NAME_
    out o = {buf, len, 0};
    if (buf && len)
        buf[0] = '\0';
    const stats_head *h = &s->stats, *lo = s->min ? s->min : h, *hi = s->max ? s->max : h;
    const char *tier = s->tier >= 0 && s->tier <= 2 ? tier_names[s->tier] : "?";
    const char *sep = f == STORE_FORMAT_CSV ? "," : ", ";
    if (f == STORE_FORMAT_CSV)
        put(&o, "%" PRId64 ",%" PRId32 ",%" PRId32 ",%" PRId64 ",%" PRId64 ",%s,%" PRId64
                ",%" PRId64 ",%" PRId64 ",%" PRId64 ",%" PRId64 ",%" PRId64 ",%" PRId32,
            s->run_id, s->layer, s->head, s->step, s->step_last, tier, s->merged, s->time_ms,
            h->rows, h->rows_norm, h->rows_empty, h->nonfinite_rows, h->sampled);
    else
        put(&o, "{\"run_id\": %" PRId64 ", \"layer\": %" PRId32 ", \"head\": %" PRId32
                ", \"step\": %" PRId64 ", \"step_last\": %" PRId64 ", \"tier\": \"%s\", "
                "\"merged\": %" PRId64 ", \"time_ms\": %" PRId64 ", \"rows\": %" PRId64
                ", \"rows_norm\": %" PRId64 ", \"rows_empty\": %" PRId64
                ", \"nonfinite_rows\": %" PRId64 ", \"sampled\": %" PRId32,
            s->run_id, s->layer, s->head, s->step, s->step_last, tier, s->merged, s->time_ms,
            h->rows, h->rows_norm, h->rows_empty, h->nonfinite_rows, h->sampled);
    for (int i = 0; i < VOCAB_NSTATS; i++) {
        put(&o, "%s", sep);
        if (f == STORE_FORMAT_JSONL)
            put(&o, "\"%s\": ", fnames[i]);
        put_num(&o, f, store_stat_get(h, i));
    }
    for (int i = 0; i < VOCAB_NSTATS; i++)
        for (int e = 0; e < 2; e++) {
            put(&o, "%s", sep);
            if (f == STORE_FORMAT_JSONL)
                put(&o, "\"%s_%s\": ", fnames[i], e ? "hi" : "lo");
            put_num(&o, f, store_stat_get(e ? hi : lo, i));
        }
    put(&o, f == STORE_FORMAT_CSV ? "\n" : "}\n");
    return o.used;
}
