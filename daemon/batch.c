/* batch.c — computed pushes through the store thread, then their answers (see batch.h). Stage:
 * batch; calls the storer, the store (batch_add_samples, on the store thread), counters, util and
 * log, and its hooks.
 *
 * An item's op is its own (batch_item.op): the op's done (loop thread) appends the item to the
 * list of finished ones; batch_drained() hands that list to the hooks and empties it. */
#include "batch.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "util.h"

struct batch {
    storer *st;
    batch_add_fn add;
    batch_hooks hooks;
    void *data;
    counters *cnt;
    uint32_t pending;        /* added, not answered */
    batch_item **fin;        /* finished, not yet handed to the hooks */
    Attnstat__Code *codes;
    size_t nfin, capfin;
};

store_status batch_add_samples(void *db, const batch_item *it, store_error *err)
{
    return store_add_samples_at(db, it->run_id, it->step, it->layer, it->head_base, it->heads,
                                it->nheads, it->time_ms, err);
}

batch *batch_new(storer *st, batch_add_fn add, const batch_hooks *hooks, void *data,
                 counters *cnt, char *err, size_t errlen)
{
    batch *b = calloc(1, sizeof *b);
    if (!b) {
        util_err(err, errlen, "out of memory");
        return NULL;
    }
    b->st = st;
    b->add = add;
    b->hooks = *hooks;
    b->data = data;
    b->cnt = cnt;
    return b;
}

uint32_t batch_pending(const batch *b)
{
    return b->pending;
}

/* Store thread: the item into the open transaction. */
static store_status item_run(void *db, storer_op *op, store_error *err)
{
    batch_item *it = (batch_item *)op; /* op is the item's first member */
    batch *b = op->data;
    return b->add(db, it, err);
}

/* Loop thread: the item is committed (or not); it waits for batch_drained(). */
static void item_done(storer_op *op)
{
    batch_item *it = (batch_item *)op;
    batch *b = op->data;
    if (b->nfin == b->capfin) {
        size_t ncap = b->capfin ? b->capfin * 2 : 256;
        batch_item **nf = realloc(b->fin, ncap * sizeof *nf);
        Attnstat__Code *nc = nf ? realloc(b->codes, ncap * sizeof *nc) : NULL;
        if (nf)
            b->fin = nf;
        if (!nf || !nc) {
            /* No room to wait: answered now, alone (the alert feed does not see it). */
            LOG_ERROR("store", "out of memory: push %llu of run '%s' answered without its alerts",
                      (unsigned long long)it->seq, it->run);
            b->pending--;
            b->hooks.answer(b->data, it, op->status == STORE_OK ? ATTNSTAT__CODE__OK
                                                                : ATTNSTAT__CODE__INTERNAL,
                            op->status == STORE_OK ? "" : "not stored: out of memory");
            return;
        }
        b->codes = nc;
        b->capfin = ncap;
    }
    b->fin[b->nfin] = it;
    b->codes[b->nfin] = op->status == STORE_OK ? ATTNSTAT__CODE__OK : ATTNSTAT__CODE__INTERNAL;
    b->nfin++;
}

void batch_add(batch *b, batch_item *it)
{
    it->op.mode = STORER_BATCHED;
    it->op.run = item_run;
    it->op.done = item_done;
    it->op.data = b;
    b->pending++;
    storer_submit(b->st, &it->op);
}

void batch_drained(batch *b)
{
    storer_counts sc;
    memset(&sc, 0, sizeof sc);
    storer_take(b->st, &sc);
    counters_add(b->cnt, CNT_COMMITS, sc.commits);
    if (sc.rollbacks) {
        counters_add(b->cnt, CNT_COMMIT_FAILURES, sc.rollbacks);
        counters_store_error(b->cnt, sc.last_error);
        LOG_ERROR("store", "%llu transaction%s rolled back: %s", (unsigned long long)sc.rollbacks,
                  sc.rollbacks == 1 ? "" : "s", sc.last_error);
    }
    if (b->nfin == 0)
        return;
    /* This turn works on its own copy: the hooks may add items, finished in a later turn. */
    size_t n = b->nfin;
    batch_item **items = b->fin;
    Attnstat__Code *codes = b->codes;
    b->fin = NULL;
    b->codes = NULL;
    b->nfin = b->capfin = 0;
    uint64_t rows = 0;
    size_t ok = 0;
    for (size_t i = 0; i < n; i++) {
        if (codes[i] == ATTNSTAT__CODE__OK) {
            rows += (uint64_t)items[i]->nheads;
            ok++;
        } else if (items[i]->op.status == STORE_EINVAL || items[i]->op.status == STORE_NOTFOUND) {
            LOG_ERROR("store", "push %llu of run '%s' not stored: %s",
                      (unsigned long long)items[i]->seq, items[i]->run, items[i]->op.err.msg);
        }
    }
    counters_add(b->cnt, CNT_SAMPLES_STORED, rows);
    if (ok && b->hooks.stored)
        b->hooks.stored(b->data, items, codes, n);
    for (size_t i = 0; i < n; i++) {
        char msg[600] = "";
        if (codes[i] != ATTNSTAT__CODE__OK)
            snprintf(msg, sizeof msg, "not stored: %s", items[i]->op.err.msg);
        b->pending--;
        b->hooks.answer(b->data, items[i], codes[i], msg);
    }
    free(items);
    free(codes);
    if (b->hooks.done)
        b->hooks.done(b->data);
}

void batch_free(batch *b)
{
    if (!b)
        return;
    if (b->pending)
        LOG_ERROR("store", "%u pushes were never answered (the batch was freed before the store "
                  "thread finished)", b->pending);
    free(b->fin);
    free(b->codes);
    free(b);
}
