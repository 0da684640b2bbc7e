/* test_batch.c — unit tests of daemon/batch.c with a fake store behind its interface (no SQLite,
 * no daemon): a batch commits in one transaction and only then answers, OK, in the order items
 * came; the alert feed (the stored hook) sees exactly the stored items; an add or a commit that
 * fails rolls the batch back and answers every item of it INTERNAL with the store's message,
 * acknowledges nothing and feeds no alert; an item the store refuses alone fails alone; a full
 * batch commits at once, a partial one when its timer fires, a closing one at every add.
 * Random data from a printed seed (ATTNSTAT_TEST_SEED replays it). */
#include <uv.h>

#include "batch.h"
#include "counters.h"
#include "daemon_harness.h" /* seeds, the runner, and the usual system headers */

static dh_rng R; /* seeded by main, printed */

static uint64_t rnd(void)
{
    return dh_next(&R);
}

/* ---- the fake store: a transaction of adds, then commit or rollback ---------------------------- */

typedef struct {
    int fail_add_at;          /* 1-based add of a transaction that fails (STORE_ERROR); 0: none */
    int refuse_add_at;        /* 1-based add refused alone (STORE_EINVAL); 0: none */
    int fail_commit;
    int adds, commits, rollbacks;
    const batch_item *open[BATCH_MAX];   /* added in the open transaction */
    int nopen;
    const batch_item *stored[4096];      /* committed */
    int nstored;
} fake_db;

static store_status fake_add(void *db, const batch_item *it, store_error *err)
{
    fake_db *f = db;
    f->adds++;
    int nth = f->nopen + 1;
    if (nth == f->fail_add_at) {
        snprintf(err->msg, sizeof err->msg, "disk I/O error (fake, add %d)", nth);
        err->code = 10;
        return STORE_ERROR;
    }
    if (nth == f->refuse_add_at) {
        f->refuse_add_at = 0;
        snprintf(err->msg, sizeof err->msg, "run %lld is not registered (fake)",
                 (long long)it->run_id);
        return STORE_EINVAL;
    }
    f->open[f->nopen++] = it;
    return STORE_OK;
}

static store_status fake_commit(void *db, store_error *err)
{
    fake_db *f = db;
    if (f->fail_commit) {
        snprintf(err->msg, sizeof err->msg, "database is locked (fake)");
        return STORE_ERROR;
    }
    f->commits++;
    for (int i = 0; i < f->nopen; i++)
        f->stored[f->nstored++ % 4096] = f->open[i];
    f->nopen = 0;
    return STORE_OK;
}

static void fake_rollback(void *db)
{
    fake_db *f = db;
    f->rollbacks++;
    f->nopen = 0;
}

static int was_stored(const fake_db *f, const batch_item *it)
{
    for (int i = 0; i < f->nstored && i < 4096; i++)
        if (f->stored[i] == it)
            return 1;
    return 0;
}

/* ---- what the hooks saw ------------------------------------------------------------------- */

typedef struct {
    fake_db db;
    counters *cnt;
    uv_loop_t loop;
    batch *b;
    int stored_calls, fed;         /* hooks.stored calls; items fed to the alert feed */
    const batch_item *fed_items[4096];
    const batch_item *answered[4096];
    Attnstat__Code codes[4096];
    char msgs[4096][160];
    int nanswers, done_calls;
} world;

static world W;

static void on_stored(void *data, batch_item *const *items, const Attnstat__Code *codes, size_t n)
{
    world *w = data;
    w->stored_calls++;
    ck_assert_int_eq(w->db.nopen, 0); /* committed before the feed sees it */
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
}

static void on_done(void *data)
{
    world *w = data;
    w->done_calls++;
}

static void open_world(uint64_t commit_ms)
{
    memset(&W, 0, sizeof W);
    ck_assert_int_eq(uv_loop_init(&W.loop), 0);
    W.cnt = counters_new();
    ck_assert_ptr_nonnull(W.cnt);
    batch_store st = {&W.db, fake_add, fake_commit, fake_rollback};
    batch_hooks h = {on_stored, on_answer, on_done};
    char err[256];
    W.b = batch_new(&W.loop, commit_ms, &st, &h, &W, W.cnt, err, sizeof err);
    ck_assert_msg(W.b != NULL, "%s", err);
}

static void close_world(void)
{
    batch_close(W.b);
    ck_assert_int_eq(uv_run(&W.loop, UV_RUN_DEFAULT), 0);
    ck_assert_int_eq(uv_loop_close(&W.loop), 0);
    counters_free(W.cnt);
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

/* Adds n items to the batch, then commits it. */
static void add_and_flush(batch_item *it, int n)
{
    for (int i = 0; i < n; i++)
        batch_add(W.b, &it[i]);
    batch_flush(W.b);
}

/* ---- tests ---------------------------------------------------------------------------------- */

/* A batch commits once, then the feed sees it, then every item is answered OK in order, then
 * done. */
START_TEST(test_commit_then_answer)
{
    open_world(5);
    int n = 1 + (int)(rnd() % (BATCH_MAX - 1));
    stats_head *heads;
    batch_item *it = make_items(n, &heads);
    for (int i = 0; i < n; i++)
        batch_add(W.b, &it[i]);
    ck_assert_uint_eq(batch_pending(W.b), (uint32_t)n);
    ck_assert_int_eq(W.nanswers, 0); /* nothing answered before its commit */
    batch_flush(W.b);
    ck_assert_uint_eq(batch_pending(W.b), 0);
    ck_assert_int_eq(W.db.commits, 1);
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
    batch_flush(W.b); /* empty: nothing happens */
    ck_assert_int_eq(W.done_calls, 1);
    close_world();
    free(it);
    free(heads);
}
END_TEST

/* An add that fails mid-batch: rolled back, every item INTERNAL with the store's message,
 * nothing acknowledged, no alert fed. */
START_TEST(test_failed_add_answers_all_internal)
{
    open_world(5);
    int n = 2 + (int)(rnd() % (BATCH_MAX - 2));
    W.db.fail_add_at = 1 + (int)(rnd() % (uint64_t)n);
    stats_head *heads;
    batch_item *it = make_items(n, &heads);
    add_and_flush(it, n);
    ck_assert_int_eq(W.db.commits, 0);
    ck_assert_int_eq(W.db.rollbacks, 1);
    ck_assert_int_eq(W.db.nstored, 0);
    ck_assert_int_eq(W.stored_calls, 0);
    ck_assert_int_eq(W.fed, 0);
    ck_assert_int_eq(W.nanswers, n);
    for (int i = 0; i < n; i++) {
        ck_assert_ptr_eq(W.answered[i], &it[i]);
        ck_assert_int_eq(W.codes[i], ATTNSTAT__CODE__INTERNAL);
        ck_assert_msg(strstr(W.msgs[i], "not stored: disk I/O error (fake"), "%s", W.msgs[i]);
    }
    ck_assert_int_eq(W.done_calls, 1);
    ck_assert_uint_eq(counters_get(W.cnt, CNT_COMMIT_FAILURES), 1);
    ck_assert_uint_eq(counters_get(W.cnt, CNT_COMMITS), 0);
    ck_assert_uint_eq(counters_get(W.cnt, CNT_SAMPLES_STORED), 0);
    close_world();
    free(it);
    free(heads);
}
END_TEST

/* A commit that fails: the same. */
START_TEST(test_failed_commit_answers_all_internal)
{
    open_world(5);
    int n = 1 + (int)(rnd() % (BATCH_MAX - 1));
    W.db.fail_commit = 1;
    stats_head *heads;
    batch_item *it = make_items(n, &heads);
    add_and_flush(it, n);
    ck_assert_int_eq(W.db.adds, n);
    ck_assert_int_eq(W.db.rollbacks, 1);
    ck_assert_int_eq(W.db.nstored, 0);
    ck_assert_int_eq(W.stored_calls, 0);
    ck_assert_int_eq(W.nanswers, n);
    for (int i = 0; i < n; i++) {
        ck_assert_int_eq(W.codes[i], ATTNSTAT__CODE__INTERNAL);
        ck_assert_msg(strstr(W.msgs[i], "not stored: commit failed: database is locked"), "%s",
                      W.msgs[i]);
    }
    ck_assert_uint_eq(counters_get(W.cnt, CNT_COMMIT_FAILURES), 1);
    /* The next batch, with a store that works again, commits. */
    W.db.fail_commit = 0;
    batch_add(W.b, &it[0]);
    batch_flush(W.b);
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
    open_world(5);
    int n = 2 + (int)(rnd() % (BATCH_MAX - 2));
    int bad = (int)(rnd() % (uint64_t)n);
    W.db.refuse_add_at = bad + 1;
    stats_head *heads;
    batch_item *it = make_items(n, &heads);
    add_and_flush(it, n);
    ck_assert_int_eq(W.db.commits, 1);
    ck_assert_int_eq(W.db.nstored, n - 1);
    ck_assert_int_eq(W.fed, n - 1);
    for (int i = 0; i < n; i++) {
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

/* BATCH_MAX items commit at once; fewer wait for the timer; a closing batch commits each add. */
START_TEST(test_when_it_commits)
{
    open_world(1000); /* a timer that would not fire during the test */
    stats_head *heads;
    batch_item *it = make_items(BATCH_MAX + 3, &heads);
    for (int i = 0; i < BATCH_MAX - 1; i++)
        batch_add(W.b, &it[i]);
    ck_assert_int_eq(W.db.commits, 0);
    batch_add(W.b, &it[BATCH_MAX - 1]);
    ck_assert_int_eq(W.db.commits, 1);
    ck_assert_int_eq(W.nanswers, BATCH_MAX);
    ck_assert_uint_eq(batch_pending(W.b), 0);
    close_world();

    open_world(0); /* the next loop iteration */
    batch_add(W.b, &it[0]);
    batch_add(W.b, &it[1]);
    ck_assert_int_eq(W.db.commits, 0);
    uv_run(&W.loop, UV_RUN_NOWAIT);
    ck_assert_int_eq(W.db.commits, 1);
    ck_assert_int_eq(W.nanswers, 2);
    batch_close(W.b); /* closing: each add commits at once (what the workers hand back last) */
    ck_assert_int_eq(W.db.commits, 1); /* nothing was pending */
    ck_assert_int_eq(uv_run(&W.loop, UV_RUN_DEFAULT), 0);
    ck_assert_int_eq(uv_loop_close(&W.loop), 0);
    counters_free(W.cnt);
    free(it);
    free(heads);
}
END_TEST

/* An answer hook that starts the next batch (a push answered, another computed meanwhile): the
 * flush in progress answers its own items only. */
static batch_item *g_extra;

static void on_answer_adding(void *data, batch_item *it, Attnstat__Code code, const char *msg)
{
    on_answer(data, it, code, msg);
    if (g_extra) {
        batch_item *x = g_extra;
        g_extra = NULL;
        batch_add(W.b, x);
    }
}

START_TEST(test_answer_may_start_next_batch)
{
    memset(&W, 0, sizeof W);
    ck_assert_int_eq(uv_loop_init(&W.loop), 0);
    W.cnt = counters_new();
    batch_store st = {&W.db, fake_add, fake_commit, fake_rollback};
    batch_hooks h = {on_stored, on_answer_adding, on_done};
    char err[256];
    W.b = batch_new(&W.loop, 1000, &st, &h, &W, W.cnt, err, sizeof err);
    ck_assert_ptr_nonnull(W.b);
    int n = 3 + (int)(rnd() % 10);
    stats_head *heads;
    batch_item *it = make_items(n + 1, &heads);
    g_extra = &it[n];
    add_and_flush(it, n);
    ck_assert_int_eq(W.nanswers, n);
    ck_assert_uint_eq(batch_pending(W.b), 1);
    batch_flush(W.b);
    ck_assert_int_eq(W.nanswers, n + 1);
    ck_assert_ptr_eq(W.answered[n], &it[n]);
    ck_assert_int_eq(W.db.commits, 2);
    close_world();
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
    tcase_add_test(tc, test_failed_add_answers_all_internal);
    tcase_add_test(tc, test_failed_commit_answers_all_internal);
    tcase_add_test(tc, test_refused_item_fails_alone);
    tcase_add_test(tc, test_when_it_commits);
    tcase_add_test(tc, test_answer_may_start_next_batch);
    suite_add_tcase(s, tc);
    return dh_run(s);
}
