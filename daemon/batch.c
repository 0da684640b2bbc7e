/* batch.c — one store transaction per batch of computed pushes, then their answers (see batch.h).
 * Stage: batch; calls the store (through batch_store), counters, util and log, and its hooks. */
#include "batch.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "util.h"

struct batch {
    uv_timer_t timer;
    uint64_t commit_ms;
    batch_store st;
    batch_hooks hooks;
    void *data;
    counters *cnt;
    int timer_armed;
    int closing;
    uint32_t n;
    batch_item *items[BATCH_MAX];
};

static store_status sqlite_add(void *db, const batch_item *it, store_error *err)
{
    return store_add_samples_at(db, it->run_id, it->step, it->layer, it->head_base, it->heads,
                                it->nheads, it->time_ms, err);
}

static store_status sqlite_commit(void *db, store_error *err)
{
    return store_commit(db, err);
}

static void sqlite_rollback(void *db)
{
    store_rollback(db);
}

batch_store batch_store_of(store *db)
{
    batch_store st = {db, sqlite_add, sqlite_commit, sqlite_rollback};
    return st;
}

batch *batch_new(uv_loop_t *loop, uint64_t commit_ms, const batch_store *st,
                 const batch_hooks *hooks, void *data, counters *cnt, char *err, size_t errlen)
{
    batch *b = calloc(1, sizeof *b);
    if (!b) {
        util_err(err, errlen, "out of memory");
        return NULL;
    }
    int rc = uv_timer_init(loop, &b->timer);
    if (rc != 0) {
        util_err(err, errlen, "uv_timer_init: %s", uv_strerror(rc));
        free(b);
        return NULL;
    }
    b->timer.data = b;
    b->commit_ms = commit_ms;
    b->st = *st;
    b->hooks = *hooks;
    b->data = data;
    b->cnt = cnt;
    return b;
}

uint32_t batch_pending(const batch *b)
{
    return b->n;
}

void batch_flush(batch *b)
{
    if (b->timer_armed) {
        uv_timer_stop(&b->timer);
        b->timer_armed = 0;
    }
    if (b->n == 0)
        return;
    uint32_t n = b->n;
    b->n = 0; /* this flush works on its own copy: the hooks may start the next batch */
    batch_item *items[BATCH_MAX];
    Attnstat__Code codes[BATCH_MAX];
    char msgs[BATCH_MAX][256];   /* why an item the store refused alone was not stored */
    memcpy(items, b->items, n * sizeof items[0]);

    store_error se = {0, ""};
    int failed = 0;
    char failmsg[600] = "";
    uint64_t rows = 0;
    uint64_t t0 = util_mono_ns();

    /* 1. The samples, in one transaction. */
    for (uint32_t i = 0; i < n && !failed; i++) {
        codes[i] = ATTNSTAT__CODE__OK;
        msgs[i][0] = '\0';
        store_status st = b->st.add(b->st.db, items[i], &se);
        if (st == STORE_EINVAL || st == STORE_NOTFOUND) {
            /* Refused before anything was written: the batch is intact, only this push fails. */
            codes[i] = ATTNSTAT__CODE__INTERNAL;
            snprintf(msgs[i], sizeof msgs[i], "not stored: %.240s", se.msg);
            LOG_ERROR("store", "push %llu of run '%s' not stored: %s",
                      (unsigned long long)items[i]->seq, items[i]->run, se.msg);
            continue;
        }
        if (st != STORE_OK) {
            failed = 1;
            snprintf(failmsg, sizeof failmsg, "not stored: %s", se.msg);
            break;
        }
        rows += (uint64_t)items[i]->nheads;
    }
    if (!failed && b->st.commit(b->st.db, &se) != STORE_OK) {
        failed = 1;
        snprintf(failmsg, sizeof failmsg, "not stored: commit failed: %s", se.msg);
    }
    if (failed) {
        b->st.rollback(b->st.db);
        counters_inc(b->cnt, CNT_COMMIT_FAILURES);
        counters_store_error(b->cnt, failmsg);
        LOG_ERROR("store", "batch of %u pushes rolled back: %s", n, failmsg);
    } else {
        counters_inc(b->cnt, CNT_COMMITS);
        counters_add(b->cnt, CNT_SAMPLES_STORED, rows);
        LOG_DEBUG("store", "committed %u pushes (%llu rows) in %.2f ms", n, (unsigned long long)rows,
                  (double)(util_mono_ns() - t0) / 1e6);
    }

    /* 2. Only samples that are stored go on. */
    if (!failed && b->hooks.stored)
        b->hooks.stored(b->data, items, codes, n);
    /* 3. One answer per item. */
    for (uint32_t i = 0; i < n; i++) {
        if (failed)
            b->hooks.answer(b->data, items[i], ATTNSTAT__CODE__INTERNAL, failmsg);
        else
            b->hooks.answer(b->data, items[i], codes[i], msgs[i]);
    }
    /* 4. */
    if (b->hooks.done)
        b->hooks.done(b->data);
}

static void timer_cb(uv_timer_t *t)
{
    batch *b = t->data;
    b->timer_armed = 0;
    batch_flush(b);
}

void batch_add(batch *b, batch_item *it)
{
    b->items[b->n++] = it;
    if (b->n >= BATCH_MAX || b->closing) {
        batch_flush(b);
    } else if (!b->timer_armed) {
        int rc = uv_timer_start(&b->timer, timer_cb, b->commit_ms, 0);
        if (rc != 0) {
            LOG_ERROR("store", "cannot arm the commit timer (%s): committing now", uv_strerror(rc));
            batch_flush(b);
        } else {
            b->timer_armed = 1;
        }
    }
}

static void batch_closed(uv_handle_t *h)
{
    free(h->data);
}

void batch_close(batch *b)
{
    b->closing = 1;
    batch_flush(b);
    uv_close((uv_handle_t *)&b->timer, batch_closed);
}
