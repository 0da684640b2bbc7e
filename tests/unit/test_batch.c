/* test_batch.c — unit tests of daemon/batch.c on the store thread (daemon/storer.c), with a fake
 * store behind their interfaces (no SQLite, no daemon): results are committed before they are
 * answered, OK, in the order they came; pushes that arrive while the thread is busy go into one
 * transaction (group commit), and a lone one is committed at once; the alert feed (the stored
 * hook) sees exactly the stored items; an add or a commit that fails rolls its transaction back
 * and answers every item of it INTERNAL with the store's message, acknowledges nothing and feeds
 * no alert; an item the store refuses alone fails alone; max_ops and commit_ms end a transaction
 * while ops keep coming; an op that runs alone runs with no transaction open, in order; the idle
 * work runs when nothing waits, and between two transactions of a stream that never drains, never
 * inside one; after the close, ops run inline.
 * The fake store's gate holds the store thread inside an add, so that what arrives meanwhile is
 * known to wait in the queue (no timing is relied on: every wait has a generous deadline).
 * Random data from a printed seed (ATTNSTAT_TEST_SEED replays it). */
#include <pthread.h>
#include <uv.h>

#include "batch.h"
#include "counters.h"
#include "daemon_harness.h" /* seeds, the runner, and the usual system headers */
#include "storer.h"

static dh_rng R; /* seeded by main, printed */

static uint64_t rnd(void)
{
    return dh_next(&R);
}

/* ---- the fake store: a transaction of adds, then commit or rollback (store thread) ------------ */

#define FAKE_MAX 4096

typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int gate_closed;          /* an add waits while closed */
    int in_gate;              /* an add is waiting at the gate */
    int fail_add_at;          /* 1-based add of a transaction that fails (STORE_ERROR); 0: none */
    int refuse_add_at;        /* 1-based add refused alone (STORE_EINVAL); 0: none */
    int fail_commit;
    int sleep_ms;             /* each add sleeps this long */
    int adds, commits, rollbacks, idles, idle_in_txn, alone_in_txn;
    int adds_at_idle[64];     /* adds done when each of the first idles ran */
    const batch_item *open[FAKE_MAX]; /* added in the open transaction */
    int nopen;
    const batch_item *stored[FAKE_MAX]; /* committed */
    int nstored;
    int txn_sizes[FAKE_MAX];  /* items of each commit */
    char log[256];            /* test_alone_op_in_order: ops and commits, in order */
} fake_db;

static store_status fake_add(void *db, const batch_item *it, store_error *err)
{
    fake_db *f = db;
    pthread_mutex_lock(&f->mu);
    while (f->gate_closed) {
        f->in_gate = 1;
        pthread_cond_broadcast(&f->cv);
        pthread_cond_wait(&f->cv, &f->mu);
    }
    f->in_gate = 0;
    f->adds++;
    int nth = f->nopen + 1;
    store_status st = STORE_OK;
    if (nth == f->fail_add_at) {
        f->fail_add_at = 0; /* once */
        snprintf(err->msg, sizeof err->msg, "disk I/O error (fake, add %d)", nth);
        err->code = 10;
        st = STORE_ERROR;
    } else if (nth == f->refuse_add_at) {
        f->refuse_add_at = 0;
        snprintf(err->msg, sizeof err->msg, "run %lld is not registered (fake)",
                 (long long)it->run_id);
        st = STORE_EINVAL;
    } else {
        f->open[f->nopen++] = it;
    }
    int sleep_ms = f->sleep_ms;
    pthread_mutex_unlock(&f->mu);
    if (sleep_ms)
        dh_sleep_ms(sleep_ms);
    return st;
}

static store_status fake_commit(void *db, store_error *err)
{
    fake_db *f = db;
    pthread_mutex_lock(&f->mu);
    store_status st = STORE_OK;
    if (f->fail_commit) {
        snprintf(err->msg, sizeof err->msg, "database is locked (fake)");
        st = STORE_ERROR;
    } else {
        if (f->nopen) {
            f->txn_sizes[f->commits++ % FAKE_MAX] = f->nopen;
            size_t n = strlen(f->log);
            if (n + 2 < sizeof f->log)
                f->log[n] = '|';
        }
        for (int i = 0; i < f->nopen; i++)
            f->stored[f->nstored++ % FAKE_MAX] = f->open[i];
        f->nopen = 0;
    }
    pthread_mutex_unlock(&f->mu);
    return st;
}

static void fake_rollback(void *db)
{
    fake_db *f = db;
    pthread_mutex_lock(&f->mu);
    f->rollbacks++;
    f->nopen = 0;
    pthread_mutex_unlock(&f->mu);
}

static int fake_idle(void *ctx)
{
    fake_db *f = ctx;
    pthread_mutex_lock(&f->mu);
    if (f->idles < 64)
        f->adds_at_idle[f->idles] = f->adds;
    f->idles++;
    f->idle_in_txn += f->nopen > 0;
    pthread_mutex_unlock(&f->mu);
    return 0;
}

static void gate(fake_db *f, int closed)
{
    pthread_mutex_lock(&f->mu);
    f->gate_closed = closed;
    pthread_cond_broadcast(&f->cv);
    pthread_mutex_unlock(&f->mu);
}

/* Waits (generously) until an add waits at the closed gate. */
static void wait_in_gate(fake_db *f)
{
    int64_t t0 = dh_now_ms();
    pthread_mutex_lock(&f->mu);
    while (!f->in_gate && dh_now_ms() - t0 < 30000) {
        pthread_mutex_unlock(&f->mu);
        dh_sleep_ms(1);
        pthread_mutex_lock(&f->mu);
    }
    int in = f->in_gate;
    pthread_mutex_unlock(&f->mu);
    ck_assert_msg(in, "the store thread never reached the gate");
}

static int was_stored(fake_db *f, const batch_item *it)
{
    pthread_mutex_lock(&f->mu);
    int found = 0;
    for (int i = 0; i < f->nstored && i < FAKE_MAX && !found; i++)
        found = f->stored[i] == it;
    pthread_mutex_unlock(&f->mu);
    return found;
}

/* ---- what the hooks saw ------------------------------------------------------------------- */

typedef struct {
    fake_db db;
    counters *cnt;
    uv_loop_t loop;
    storer *st;
    batch *b;
    int stored_calls, fed;         /* hooks.stored calls; items fed to the alert feed */
    const batch_item *fed_items[4096];
    const batch_item *answered[4096];
    Attnstat__Code codes[4096];
    char msgs[4096][160];
    int nanswers, done_calls;
    batch_item *extra;             /* added by the answer hook, once */
} world;

static world W;

static void on_stored(void *data, batch_item *const *items, const Attnstat__Code *codes, size_t n)
{
    world *w = data;
    w->stored_calls++;
    for (size_t i = 0; i < n; i++) {
        if (codes[i] != ATTNSTAT__CODE__OK)
            continue;
        ck_assert_msg(was_stored(&w->db, items[i]), "item %zu fed but not stored", i);
        w->fed_items[w->fed++ % 4096] = items[i];
    }
}

static void on_answer(void *data, batch_item *it, Attnstat__Code code, const char *msg)
{
    world *w = data;
    if (code == ATTNSTAT__CODE__OK)
        ck_assert_msg(was_stored(&w->db, it), "item seq %llu acknowledged but not stored",
                      (unsigned long long)it->seq);
    int k = w->nanswers++ % 4096;
    w->answered[k] = it;
    w->codes[k] = code;
    snprintf(w->msgs[k], sizeof w->msgs[k], "%s", msg ? msg : "");
    if (w->extra) {
        batch_item *x = w->extra;
        w->extra = NULL;
        batch_add(w->b, x);
    }
}

static void on_done(void *data)
{
    world *w = data;
    w->done_calls++;
}

static void on_drained(void *data)
{
    world *w = data;
    batch_drained(w->b);
}

static void open_world(uint64_t commit_ms, uint32_t max_ops, int idle)
{
    memset(&W, 0, sizeof W);
    pthread_mutex_init(&W.db.mu, NULL);
    pthread_cond_init(&W.db.cv, NULL);
    ck_assert_int_eq(uv_loop_init(&W.loop), 0);
    W.cnt = counters_new();
    ck_assert_ptr_nonnull(W.cnt);
    storer_db sdb = {&W.db, fake_commit, fake_rollback, idle ? fake_idle : NULL, &W.db};
    storer_opts o = {commit_ms, max_ops, 1};
    char err[256];
    W.st = storer_new(&W.loop, &sdb, &o, on_drained, &W, err, sizeof err);
    ck_assert_msg(W.st != NULL, "%s", err);
    batch_hooks h = {on_stored, on_answer, on_done};
    W.b = batch_new(W.st, fake_add, &h, &W, W.cnt, err, sizeof err);
    ck_assert_msg(W.b != NULL, "%s", err);
}

static void close_world(void)
{
    storer_close(W.st);
    ck_assert_uint_eq(batch_pending(W.b), 0);
    batch_free(W.b);
    ck_assert_int_eq(uv_run(&W.loop, UV_RUN_DEFAULT), 0);
    storer_free(W.st);
    ck_assert_int_eq(uv_loop_close(&W.loop), 0);
    counters_free(W.cnt);
}

/* Runs the loop until n answers came (30 s at most). */
static void run_until_answers(int n)
{
    int64_t t0 = dh_now_ms();
    while (W.nanswers < n && dh_now_ms() - t0 < 30000)
        uv_run(&W.loop, UV_RUN_ONCE);
    ck_assert_msg(W.nanswers >= n, "%d answers of %d after 30 s", W.nanswers, n);
}

/* n random items (heads with random rows, never all zero). */
static batch_item *make_items(int n, stats_head **heads_out)
{
    batch_item *it = calloc((size_t)n, sizeof *it);
    stats_head *heads = calloc((size_t)n * 8, sizeof *heads);
    ck_assert(it && heads);
    for (int i = 0; i < n; i++) {
        int32_t nh = 1 + (int32_t)(rnd() % 8);
        for (int h = 0; h < nh; h++) {
            heads[i * 8 + h].rows = 1 + (int64_t)(rnd() % 4096);
            heads[i * 8 + h].entropy_mean = (double)(rnd() % 1000) / 100.0;
        }
        it[i].owner = &it[i];
        it[i].run_id = 1 + (int64_t)(rnd() % 5);
        it[i].run = "run";
        it[i].rank = (int32_t)(rnd() % 8);
        it[i].seq = rnd();
        it[i].step = (int64_t)(rnd() % 100000);
        it[i].layer = (int32_t)(rnd() % 96);
        it[i].heads = &heads[i * 8];
        it[i].nheads = nh;
        it[i].time_ms = (int64_t)(rnd() % 2000000000000ull);
    }
    *heads_out = heads;
    return it;
}

static uint64_t rows_of(const batch_item *it, int n)
{
    uint64_t rows = 0;
    for (int i = 0; i < n; i++)
        rows += (uint64_t)it[i].nheads;
    return rows;
}

/* Adds n items while the store thread is held inside the first one's add, then lets it go: the
 * n items are in one transaction. */
static void add_held(batch_item *it, int n)
{
    gate(&W.db, 1);
    batch_add(W.b, &it[0]);
    wait_in_gate(&W.db);
    for (int i = 1; i < n; i++)
        batch_add(W.b, &it[i]);
    ck_assert_int_eq(W.nanswers, 0); /* nothing answered before its commit */
    ck_assert_uint_eq(batch_pending(W.b), (uint32_t)n);
    gate(&W.db, 0);
}

/* ---- tests ---------------------------------------------------------------------------------- */

/* Items that arrive while the thread is busy: one commit, then the feed sees them, then every
 * item is answered OK in order, then done. */
START_TEST(test_commit_then_answer)
{
    open_world(1000, 0, 0);
    int n = 2 + (int)(rnd() % 300);
    stats_head *heads;
    batch_item *it = make_items(n, &heads);
    add_held(it, n);
    run_until_answers(n);
    ck_assert_uint_eq(batch_pending(W.b), 0);
    ck_assert_int_eq(W.db.commits, 1);
    ck_assert_int_eq(W.db.txn_sizes[0], n);
    ck_assert_int_eq(W.db.rollbacks, 0);
    ck_assert_int_eq(W.stored_calls, 1);
    ck_assert_int_eq(W.fed, n);
    ck_assert_int_eq(W.nanswers, n);
    ck_assert_int_eq(W.done_calls, 1);
    for (int i = 0; i < n; i++) {
        ck_assert_ptr_eq(W.answered[i], &it[i]);
        ck_assert_int_eq(W.codes[i], ATTNSTAT__CODE__OK);
        ck_assert_str_eq(W.msgs[i], "");
        ck_assert_ptr_eq(W.fed_items[i], &it[i]);
    }
    ck_assert_uint_eq(counters_get(W.cnt, CNT_COMMITS), 1);
    ck_assert_uint_eq(counters_get(W.cnt, CNT_SAMPLES_STORED), rows_of(it, n));
    ck_assert_uint_eq(counters_get(W.cnt, CNT_COMMIT_FAILURES), 0);
    close_world();
    free(it);
    free(heads);
}
END_TEST

/* A lone item is committed and answered with no wait for more (the queue drained), whatever
 * commit_ms says; so is each of a sequence of lone items. */
START_TEST(test_lone_item_commits_at_once)
{
    open_world(3600 * 1000, 0, 0); /* an hour: only the drained queue can commit */
    int n = 2 + (int)(rnd() % 20);
    stats_head *heads;
    batch_item *it = make_items(n, &heads);
    for (int i = 0; i < n; i++) {
        batch_add(W.b, &it[i]);
        run_until_answers(i + 1);
        ck_assert_int_eq(W.codes[i], ATTNSTAT__CODE__OK);
        ck_assert_int_eq(W.db.commits, i + 1);
    }
    close_world();
    free(it);
    free(heads);
}
END_TEST

/* An add that fails mid-transaction: rolled back, every item of that transaction INTERNAL with the
 * store's message, nothing of it acknowledged, no alert fed; the items after it go into the next
 * transaction and are stored. */
START_TEST(test_failed_add_answers_all_internal)
{
    open_world(1000, 0, 0);
    int n = 2 + (int)(rnd() % 300);
    int k = 1 + (int)(rnd() % (uint64_t)n); /* the k-th add fails */
    W.db.fail_add_at = k;
    stats_head *heads;
    batch_item *it = make_items(n, &heads);
    add_held(it, n);
    run_until_answers(n);
    ck_assert_int_eq(W.db.rollbacks, 1);
    ck_assert_int_eq(W.db.commits, k < n ? 1 : 0);
    ck_assert_int_eq(W.db.nstored, n - k);
    ck_assert_int_eq(W.fed, n - k);
    for (int i = 0; i < n; i++) {
        ck_assert_ptr_eq(W.answered[i], &it[i]);
        if (i < k) {
            ck_assert_int_eq(W.codes[i], ATTNSTAT__CODE__INTERNAL);
            ck_assert_msg(strstr(W.msgs[i], "not stored: disk I/O error (fake"), "%s", W.msgs[i]);
            ck_assert(!was_stored(&W.db, &it[i]));
        } else {
            ck_assert_int_eq(W.codes[i], ATTNSTAT__CODE__OK);
        }
    }
    ck_assert_uint_eq(counters_get(W.cnt, CNT_COMMIT_FAILURES), 1);
    ck_assert_uint_eq(counters_get(W.cnt, CNT_STORE_ERRORS), 1);
    ck_assert_msg(strstr(counters_last_store_error(W.cnt), "disk I/O error (fake"), "%s",
                  counters_last_store_error(W.cnt));
    ck_assert_uint_eq(counters_get(W.cnt, CNT_SAMPLES_STORED), rows_of(it + k, n - k));
    close_world();
    free(it);
    free(heads);
}
END_TEST

/* A commit that fails: every item of the transaction INTERNAL; the next one commits. */
START_TEST(test_failed_commit_answers_all_internal)
{
    open_world(1000, 0, 0);
    int n = 1 + (int)(rnd() % 300);
    W.db.fail_commit = 1;
    stats_head *heads;
    batch_item *it = make_items(n + 1, &heads);
    add_held(it, n);
    run_until_answers(n);
    ck_assert_int_eq(W.db.adds, n);
    ck_assert_int_eq(W.db.rollbacks, 1);
    ck_assert_int_eq(W.db.nstored, 0);
    ck_assert_int_eq(W.stored_calls, 0);
    for (int i = 0; i < n; i++) {
        ck_assert_int_eq(W.codes[i], ATTNSTAT__CODE__INTERNAL);
        ck_assert_msg(strstr(W.msgs[i], "not stored: commit failed: database is locked"), "%s",
                      W.msgs[i]);
    }
    ck_assert_uint_eq(counters_get(W.cnt, CNT_COMMIT_FAILURES), 1);
    pthread_mutex_lock(&W.db.mu);
    W.db.fail_commit = 0;
    pthread_mutex_unlock(&W.db.mu);
    batch_add(W.b, &it[n]);
    run_until_answers(n + 1);
    ck_assert_int_eq(W.codes[n], ATTNSTAT__CODE__OK);
    ck_assert_uint_eq(counters_get(W.cnt, CNT_COMMITS), 1);
    close_world();
    free(it);
    free(heads);
}
END_TEST

/* An item the store refuses before writing anything fails alone; the rest is stored, answered OK
 * and fed. */
START_TEST(test_refused_item_fails_alone)
{
    open_world(1000, 0, 0);
    int n = 2 + (int)(rnd() % 300);
    int bad = (int)(rnd() % (uint64_t)n);
    W.db.refuse_add_at = bad + 1;
    stats_head *heads;
    batch_item *it = make_items(n, &heads);
    add_held(it, n);
    run_until_answers(n);
    ck_assert_int_eq(W.db.commits, 1);
    ck_assert_int_eq(W.db.nstored, n - 1);
    ck_assert_int_eq(W.fed, n - 1);
    for (int i = 0; i < n; i++) {
        ck_assert_ptr_eq(W.answered[i], &it[i]);
        if (i == bad) {
            ck_assert_int_eq(W.codes[i], ATTNSTAT__CODE__INTERNAL);
            ck_assert_msg(strstr(W.msgs[i], "not stored: run") && strstr(W.msgs[i], "not registered"),
                          "%s", W.msgs[i]);
            ck_assert(!was_stored(&W.db, &it[i]));
        } else {
            ck_assert_int_eq(W.codes[i], ATTNSTAT__CODE__OK);
        }
    }
    ck_assert_uint_eq(counters_get(W.cnt, CNT_SAMPLES_STORED),
                      rows_of(it, n) - (uint64_t)it[bad].nheads);
    close_world();
    free(it);
    free(heads);
}
END_TEST

/* While ops keep coming, max_ops ends a transaction; so does commit_ms (each add here takes 2 ms,
 * so a transaction is older than 1 ms after every add). */
START_TEST(test_bounded_transactions)
{
    uint32_t max_ops = 2 + (uint32_t)(rnd() % 6);
    open_world(1000, max_ops, 0);
    int n = (int)max_ops * 3 + 1;
    stats_head *heads;
    batch_item *it = make_items(n, &heads);
    add_held(it, n);
    run_until_answers(n);
    ck_assert_int_eq(W.db.commits, 4);
    for (int k = 0; k < 3; k++)
        ck_assert_int_eq(W.db.txn_sizes[k], (int)max_ops);
    ck_assert_int_eq(W.db.txn_sizes[3], 1);
    close_world();

    open_world(1, 0, 0);
    W.db.sleep_ms = 2;
    n = 2 + (int)(rnd() % 6);
    add_held(it, n);
    run_until_answers(n);
    ck_assert_int_eq(W.db.commits, n);
    close_world();
    free(it);
    free(heads);
}
END_TEST

/* An answer hook that adds the next item (a push answered, another computed meanwhile): it is
 * answered in a later turn. */
START_TEST(test_answer_may_add_more)
{
    open_world(1000, 0, 0);
    int n = 3 + (int)(rnd() % 10);
    stats_head *heads;
    batch_item *it = make_items(n + 1, &heads);
    W.extra = &it[n];
    add_held(it, n);
    run_until_answers(n + 1);
    ck_assert_ptr_eq(W.answered[n], &it[n]);
    ck_assert_int_eq(W.codes[n], ATTNSTAT__CODE__OK);
    ck_assert_int_eq(W.db.commits, 2);
    ck_assert_int_ge(W.done_calls, 2);
    close_world();
    free(it);
    free(heads);
}
END_TEST

/* ---- ops that run alone, the idle work, the close --------------------------------------------- */

/* Plain ops (not batch items): each appends its letter to the fake's log on the store thread, and
 * its done records the turn it was completed in. */
typedef struct {
    storer_op op;
    char letter;
    int turn;
} log_op;

static int g_turn;

static store_status log_run(void *db, storer_op *op, store_error *err)
{
    (void)err;
    fake_db *f = db;
    log_op *l = (log_op *)op;
    pthread_mutex_lock(&f->mu);
    while (f->gate_closed && l->letter == 'b') {
        f->in_gate = 1;
        pthread_cond_broadcast(&f->cv);
        pthread_cond_wait(&f->cv, &f->mu);
    }
    f->in_gate = 0;
    size_t n = strlen(f->log);
    if (n + 2 < sizeof f->log)
        f->log[n] = l->letter;
    if (op->mode == STORER_ALONE)
        f->alone_in_txn += f->nopen > 0;
    else
        f->nopen++;
    pthread_mutex_unlock(&f->mu);
    return STORE_OK;
}

static void log_done(storer_op *op)
{
    ((log_op *)op)->turn = g_turn++;
}

/* batched ops, then one that runs alone, then batched ones, queued while the thread is held in
 * the first: the first ones are committed before the alone op runs (with no transaction open),
 * the last ones after it, and every op is completed in the order it was submitted. */
START_TEST(test_alone_op_in_order)
{
    open_world(1000, 0, 0);
    int n = 2 + (int)(rnd() % 8);
    log_op ops[2 * 10 + 1];
    memset(ops, 0, sizeof ops);
    int total = 2 * n + 1;
    for (int i = 0; i < total; i++) {
        ops[i].op.mode = i == n ? STORER_ALONE : STORER_BATCHED;
        ops[i].op.run = log_run;
        ops[i].op.done = log_done;
        ops[i].letter = i == 0 ? 'b' : i == n ? 'A' : 'a';
        ops[i].turn = -1;
    }
    g_turn = 0;
    gate(&W.db, 1);
    storer_submit(W.st, &ops[0].op);
    wait_in_gate(&W.db);
    for (int i = 1; i < total; i++)
        storer_submit(W.st, &ops[i].op);
    gate(&W.db, 0);
    int64_t t0 = dh_now_ms();
    while (g_turn < total && dh_now_ms() - t0 < 30000)
        uv_run(&W.loop, UV_RUN_ONCE);
    ck_assert_int_eq(g_turn, total);
    for (int i = 0; i < total; i++)
        ck_assert_int_eq(ops[i].turn, i);
    ck_assert_int_eq(W.db.alone_in_txn, 0);
    /* the log: the first group's letters, the commit, the alone op, the second group, its commit */
    char want[64] = "b";
    for (int i = 1; i < n; i++)
        strcat(want, "a");
    strcat(want, "|A");
    for (int i = 0; i < n; i++)
        strcat(want, "a");
    strcat(want, "|");
    ck_assert_str_eq(W.db.log, want);
    close_world();
}
END_TEST

/* The idle work runs when nothing waits, never with a transaction open. */
START_TEST(test_idle_work)
{
    open_world(1000, 0, 1);
    stats_head *heads;
    int n = 50 + (int)(rnd() % 50);
    batch_item *it = make_items(n, &heads);
    for (int i = 0; i < n; i++)
        batch_add(W.b, &it[i]);
    run_until_answers(n);
    int64_t t0 = dh_now_ms();
    for (;;) {
        pthread_mutex_lock(&W.db.mu);
        int idles = W.db.idles;
        pthread_mutex_unlock(&W.db.mu);
        if (idles >= 3 || dh_now_ms() - t0 > 30000)
            break;
        dh_sleep_ms(2);
    }
    ck_assert_int_ge(W.db.idles, 3);
    ck_assert_int_eq(W.db.idle_in_txn, 0);
    close_world();
    free(it);
    free(heads);
}
END_TEST

/* A stream that never lets the queue drain does not starve the idle work: with a transaction
 * per op (max_ops 1) and ops waiting behind the first, the idle work runs after that first
 * commit, before the next op, once idle_ms (1 ms) has passed since its last turn (the first op is
 * held inside its add for 5 ms while the others queue up: a slower machine only waits longer). */
START_TEST(test_idle_work_not_starved)
{
    open_world(1000, 1, 1);
    stats_head *heads;
    int n = 3 + (int)(rnd() % 20);
    batch_item *it = make_items(n, &heads);
    gate(&W.db, 1);
    batch_add(W.b, &it[0]);
    wait_in_gate(&W.db); /* the first is held inside its add while the others queue up */
    for (int i = 1; i < n; i++)
        batch_add(W.b, &it[i]);
    dh_sleep_ms(5); /* past idle_ms since the idle work's last turn */
    gate(&W.db, 0);
    run_until_answers(n);
    pthread_mutex_lock(&W.db.mu);
    int found = 0;
    for (int i = 0; i < W.db.idles && i < 64; i++)
        found |= W.db.adds_at_idle[i] >= 1 && W.db.adds_at_idle[i] < n;
    int in_txn = W.db.idle_in_txn;
    pthread_mutex_unlock(&W.db.mu);
    ck_assert_msg(found, "the idle work never ran between the %d ops of the stream", n);
    ck_assert_int_eq(in_txn, 0);
    close_world();
    free(it);
    free(heads);
}
END_TEST

/* Closing finishes what is queued; an op submitted after the close runs inline. */
START_TEST(test_close_finishes_then_inline)
{
    open_world(1000, 0, 0);
    stats_head *heads;
    int n = 5 + (int)(rnd() % 50);
    batch_item *it = make_items(n + 1, &heads);
    for (int i = 0; i < n; i++)
        batch_add(W.b, &it[i]);
    storer_close(W.st);
    ck_assert_int_eq(W.nanswers, n); /* answered by the close itself */
    batch_add(W.b, &it[n]);
    ck_assert_int_eq(W.nanswers, n + 1);
    ck_assert_int_eq(W.codes[n], ATTNSTAT__CODE__OK);
    ck_assert(was_stored(&W.db, &it[n]));
    batch_free(W.b);
    ck_assert_int_eq(uv_run(&W.loop, UV_RUN_DEFAULT), 0);
    storer_free(W.st);
    ck_assert_int_eq(uv_loop_close(&W.loop), 0);
    counters_free(W.cnt);
    free(it);
    free(heads);
}
END_TEST

int main(void)
{
    R = dh_rng_new("test_batch");
    Suite *s = suite_create("batch");
    TCase *tc = tcase_create("batch");
    tcase_add_test(tc, test_commit_then_answer);
    tcase_add_test(tc, test_lone_item_commits_at_once);
    tcase_add_test(tc, test_failed_add_answers_all_internal);
    tcase_add_test(tc, test_failed_commit_answers_all_internal);
    tcase_add_test(tc, test_refused_item_fails_alone);
    tcase_add_test(tc, test_bounded_transactions);
    tcase_add_test(tc, test_answer_may_add_more);
    tcase_add_test(tc, test_alone_op_in_order);
    tcase_add_test(tc, test_idle_work);
    tcase_add_test(tc, test_idle_work_not_starved);
    tcase_add_test(tc, test_close_finishes_then_inline);
    tcase_set_timeout(tc, 120);
    suite_add_tcase(s, tc);
    return dh_run(s);
}
