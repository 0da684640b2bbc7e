/* test_store_lifecycle.c — Check suite for the store's lifecycle of runs and alerts (schema version
 * 3): a run's owner as a column (kept when the run resumes; taken by a run recorded without one),
 * ids handed out by the writer (store_add_run into the open batch, an id of another run refused
 * with the batch intact), the end of a run and its resumption, resolved transitions that end an
 * alert (reason and uid read back), acknowledging (only an active raise; who and when read back),
 * silences in force (by time, and "until the run ends"), a silence replacing the one of its key,
 * and silences ended by id or by run (the rows kept, their `until` the time they ended).
 *
 * Random data comes from a seed printed at start (ATTNSTAT_TEST_SEED=<n> replays a run). Every test
 * works in its own temporary directory.
 */
#include "store_testutil.h"

/* A run's record as the store reads it back (strings copied). */
typedef struct {
    store_run r;
    char thresholds[256], end_reason[64];
    int found;
} run_copy;

static int copy_run(void *ctx, const store_run *r)
{
    run_copy *c = ctx;
    c->r = *r;
    snprintf(c->thresholds, sizeof c->thresholds, "%s", r->thresholds ? r->thresholds : "");
    snprintf(c->end_reason, sizeof c->end_reason, "%s", r->end_reason ? r->end_reason : "");
    c->found = 1;
    return 0;
}

static run_copy get_run(store *st, int64_t id)
{
    run_copy c;
    memset(&c, 0, sizeof c);
    store_error err = {0};
    ck_assert_msg(store_get_run(st, id, copy_run, &c, &err) == STORE_OK, "%s", err.msg);
    ck_assert(c.found);
    return c;
}

/* Every alert transition, with the lifecycle's columns. */
typedef struct {
    int n;
    store_alert a[64];
    char reason[64][32];
} alerts_copy;

static int copy_alert(void *ctx, const store_alert *a)
{
    alerts_copy *c = ctx;
    if (c->n < 64) {
        c->a[c->n] = *a;
        snprintf(c->reason[c->n], sizeof c->reason[0], "%s", a->reason ? a->reason : "");
        c->a[c->n].rule = c->a[c->n].message = c->a[c->n].reason = NULL;
    }
    c->n++;
    return 0;
}

static void add_alert(store *st, int64_t run, int32_t head, const char *rule, int state,
                      int64_t step, const char *reason)
{
    store_error err = {0};
    store_alert a = {.run_id = run, .layer = 1, .head = head, .step = step, .rule = rule,
                     .state = state, .value = rnd_unit(), .threshold = 0.5,
                     .time_ms = 1000 + step, .message = "m", .reason = reason};
    ck_assert_msg(store_add_alert(st, &a, &err) == STORE_OK, "%s", err.msg);
}

START_TEST(test_owner_and_ids)
{
    store *st = open_ok(dbpath);
    store_error err = {0};
    uint32_t uid = (uint32_t)rnd_range(1, 60000);
    int64_t want = rnd_range(10, 1000);
    store_run_info info = {.name = "gpt", .rank = 0, .thresholds = "{\"a\":1}", .has_owner = 1,
                           .owner_uid = uid, .id = want};
    int64_t id = 0;
    /* into the open batch: invisible to another connection until the commit */
    ck_assert_msg(store_add_run(st, &info, &id, &err) == STORE_OK, "%s", err.msg);
    ck_assert_int_eq(id, want);
    ck_assert_int_eq(raw_int(dbpath, "SELECT count(*) FROM runs"), 0);
    stats_head h = rand_head(0);
    ck_assert_int_eq(store_add_samples(st, id, 5, 0, &h, 1, 0, &err), STORE_OK); /* may name it */
    ck_assert_int_eq(store_commit(st, &err), STORE_OK);
    run_copy c = get_run(st, id);
    ck_assert(c.r.has_owner);
    ck_assert_uint_eq(c.r.owner_uid, uid);
    ck_assert_str_eq(c.thresholds, "{\"a\":1}");
    ck_assert_int_eq(c.r.ended_ms, 0);

    /* another run may not take that id: refused, the open batch kept */
    ck_assert_int_eq(store_add_samples(st, id, 6, 0, &h, 1, 0, &err), STORE_OK);
    store_run_info other = {.name = "bert", .rank = 0, .has_owner = 1, .owner_uid = uid + 1,
                            .id = want};
    int64_t oid = 0;
    ck_assert_int_eq(store_add_run(st, &other, &oid, &err), STORE_EINVAL);
    ck_assert_msg(strstr(err.msg, "belongs to another run"), "%s", err.msg);
    ck_assert_int_eq(store_pending(st), 1);
    ck_assert_int_eq(store_commit(st, &err), STORE_OK);
    int64_t n = 0;
    ck_assert_int_eq(store_count_samples(st, id, &n, &err), STORE_OK);
    ck_assert_int_eq(n, 2);

    /* resumed by another uid's Hello (the daemon refuses those; the store keeps the first) */
    info.owner_uid = uid + 7;
    info.id = 0;
    info.thresholds = "{\"b\":2}";
    ck_assert_int_eq(store_run_begin(st, &info, &id, &err), STORE_OK);
    ck_assert_int_eq(id, want);
    c = get_run(st, id);
    ck_assert_uint_eq(c.r.owner_uid, uid);
    ck_assert_str_eq(c.thresholds, "{\"b\":2}");

    /* a run recorded without an owner takes the first one named */
    store_run_info none = {.name = "old", .rank = 3};
    int64_t nid = 0;
    ck_assert_int_eq(store_run_begin(st, &none, &nid, &err), STORE_OK);
    ck_assert_int_gt(nid, want); /* SQLite's choice: after the largest */
    ck_assert(!get_run(st, nid).r.has_owner);
    none.has_owner = 1;
    none.owner_uid = 0; /* root is an owner like any */
    ck_assert_int_eq(store_run_begin(st, &none, &nid, &err), STORE_OK);
    c = get_run(st, nid);
    ck_assert(c.r.has_owner);
    ck_assert_uint_eq(c.r.owner_uid, 0);
    store_close(st);
}
END_TEST

START_TEST(test_run_end_and_resume)
{
    store *st = open_ok(dbpath);
    store_error err = {0};
    int64_t a = begin_run(st, "a", 0), b = begin_run(st, "b", 1);
    int64_t t = rnd_range(1000000, 2000000);
    ck_assert_int_eq(store_run_end(st, a, t, "goodbye", &err), STORE_OK);
    ck_assert_int_eq(store_run_end(st, a + b + 100, t, "goodbye", &err), STORE_NOTFOUND);
    ck_assert_int_eq(store_commit(st, &err), STORE_OK);
    run_copy c = get_run(st, a);
    ck_assert_int_eq(c.r.ended_ms, t);
    ck_assert_str_eq(c.end_reason, "goodbye");
    ck_assert_int_eq(get_run(st, b).r.ended_ms, 0);
    /* the same (name, rank) says Hello again: running */
    int64_t again = begin_run(st, "a", 0);
    ck_assert_int_eq(again, a);
    c = get_run(st, a);
    ck_assert_int_eq(c.r.ended_ms, 0);
    ck_assert_ptr_null(c.r.end_reason);
    store_close(st);
}
END_TEST

START_TEST(test_resolved_ends_an_alert)
{
    store *st = open_ok(dbpath);
    store_error err = {0};
    int64_t r = begin_run(st, "a", 0);
    add_alert(st, r, 0, "entropy_floor", STORE_ALERT_RAISED, 10, NULL);
    add_alert(st, r, 1, "logit_ceiling", STORE_ALERT_RAISED, 11, NULL);
    add_alert(st, r, 2, "nonfinite", STORE_ALERT_RAISED, 12, NULL);
    uint32_t uid = (uint32_t)rnd_range(1, 60000);
    store_alert res = {.run_id = r, .layer = 1, .head = 1, .step = 13, .rule = "logit_ceiling",
                       .state = STORE_ALERT_RESOLVED, .value = NAN, .threshold = NAN,
                       .reason = "operator", .has_uid = 1, .uid = uid};
    ck_assert_msg(store_add_alert(st, &res, &err) == STORE_OK, "%s", err.msg);
    add_alert(st, r, 2, "nonfinite", STORE_ALERT_CLEARED, 14, "samples");
    ck_assert_int_eq(store_commit(st, &err), STORE_OK);
    alerts_copy all = {0}, act = {0};
    ck_assert_int_eq(store_alerts(st, r, 0, copy_alert, &all, &err), STORE_OK);
    ck_assert_int_eq(all.n, 5);
    ck_assert_int_eq(all.a[3].state, STORE_ALERT_RESOLVED);
    ck_assert_str_eq(all.reason[3], "operator");
    ck_assert(all.a[3].has_uid);
    ck_assert_uint_eq(all.a[3].uid, uid);
    ck_assert(!all.a[0].has_uid);
    ck_assert_str_eq(all.reason[0], "");
    ck_assert_str_eq(all.reason[4], "samples");
    ck_assert_int_eq(store_alerts(st, r, 1, copy_alert, &act, &err), STORE_OK);
    ck_assert_int_eq(act.n, 1); /* head 0 only: the others were resolved and cleared */
    ck_assert_int_eq(act.a[0].head, 0);
    /* a state the store does not know is refused */
    res.state = 4;
    ck_assert_int_eq(store_add_alert(st, &res, &err), STORE_EINVAL);
    store_close(st);
}
END_TEST

static int64_t alert_id_of(int32_t head, const char *state)
{
    char sql[200];
    snprintf(sql, sizeof sql, "SELECT max(id) FROM alerts WHERE head = %d AND state = '%s'",
             (int)head, state);
    return raw_int(dbpath, sql);
}

START_TEST(test_ack)
{
    store *st = open_ok(dbpath);
    store_error err = {0};
    int64_t r = begin_run(st, "a", 0);
    add_alert(st, r, 0, "entropy_floor", STORE_ALERT_RAISED, 10, NULL);
    add_alert(st, r, 1, "entropy_floor", STORE_ALERT_RAISED, 11, NULL);
    add_alert(st, r, 1, "entropy_floor", STORE_ALERT_CLEARED, 12, "samples");
    add_alert(st, r, 2, "entropy_floor", STORE_ALERT_RAISED, 13, NULL);
    add_alert(st, r, 2, "entropy_floor", STORE_ALERT_RAISED, 14, NULL); /* supersedes the first */
    ck_assert_int_eq(store_commit(st, &err), STORE_OK);
    int64_t a0 = alert_id_of(0, "raised"), a1 = alert_id_of(1, "raised");
    int64_t c1 = alert_id_of(1, "cleared"), a2 = alert_id_of(2, "raised");
    uint32_t uid = (uint32_t)rnd_range(1, 60000);
    int64_t t = rnd_range(1000000, 2000000);
    ck_assert_msg(store_ack_alert(st, a0, uid, t, &err) == STORE_OK, "%s", err.msg);
    ck_assert_int_eq(store_ack_alert(st, a1, uid, t, &err), STORE_EINVAL);
    ck_assert_msg(strstr(err.msg, "no longer active"), "%s", err.msg);
    ck_assert_int_eq(store_ack_alert(st, c1, uid, t, &err), STORE_EINVAL);
    ck_assert_msg(strstr(err.msg, "is a clear"), "%s", err.msg);
    ck_assert_int_eq(store_ack_alert(st, a2 - 1, uid, t, &err), STORE_EINVAL);
    ck_assert_int_eq(store_ack_alert(st, a2 + 1000, uid, t, &err), STORE_NOTFOUND);
    ck_assert_int_eq(store_pending(st), 0);
    ck_assert_int_eq(store_commit(st, &err), STORE_OK);
    alerts_copy act = {0};
    ck_assert_int_eq(store_alerts(st, r, 1, copy_alert, &act, &err), STORE_OK);
    ck_assert_int_eq(act.n, 2);
    ck_assert_int_eq(act.a[0].id, a0);
    ck_assert(act.a[0].acked);
    ck_assert_uint_eq(act.a[0].ack_uid, uid);
    ck_assert_int_eq(act.a[0].ack_ms, t);
    ck_assert(!act.a[1].acked);
    /* acknowledged again: the last one counts */
    ck_assert_int_eq(store_ack_alert(st, a0, uid + 1, t + 5, &err), STORE_OK);
    ck_assert_int_eq(store_commit(st, &err), STORE_OK);
    memset(&act, 0, sizeof act);
    ck_assert_int_eq(store_alerts(st, r, 1, copy_alert, &act, &err), STORE_OK);
    ck_assert_uint_eq(act.a[0].ack_uid, uid + 1);
    ck_assert_int_eq(act.a[0].ack_ms, t + 5);
    /* store_active_alert: the row of an active one */
    memset(&act, 0, sizeof act);
    ck_assert_int_eq(store_active_alert(st, a2, copy_alert, &act, &err), STORE_OK);
    ck_assert_int_eq(act.n, 1);
    ck_assert_int_eq(act.a[0].step, 14);
    store *ro = store_open_readonly(dbpath, 0, &err);
    ck_assert_ptr_nonnull(ro);
    ck_assert_int_eq(store_ack_alert(ro, a0, uid, t, &err), STORE_EINVAL); /* read-only */
    store_close(ro);
    store_close(st);
}
END_TEST

typedef struct {
    int n;
    int64_t id[16], run[16], until[16];
    int32_t head[16];
    uint32_t uid[16];
} silences_copy;

static int copy_silence(void *ctx, const store_silence *s)
{
    silences_copy *c = ctx;
    if (c->n < 16) {
        c->id[c->n] = s->id;
        c->run[c->n] = s->run_id;
        c->until[c->n] = s->until_ms;
        c->head[c->n] = s->head;
        c->uid[c->n] = s->uid;
    }
    c->n++;
    return 0;
}

START_TEST(test_silences)
{
    store *st = open_ok(dbpath);
    store_error err = {0};
    int64_t r = begin_run(st, "a", 0), q = begin_run(st, "b", 0);
    int64_t now = rnd_range(1000000, 2000000);
    uint32_t uid = (uint32_t)rnd_range(1, 60000);
    store_silence s1 = {.run_id = r, .layer = 0, .head = 1, .rule = "entropy_floor", .uid = uid,
                        .time_ms = now, .until_ms = now + 1000};
    store_silence s2 = {.run_id = r, .layer = 0, .head = 2, .rule = "nonfinite", .uid = uid,
                        .time_ms = now, .until_ms = 0};
    store_silence s3 = {.run_id = q, .layer = 0, .head = 3, .rule = "nonfinite", .uid = uid + 1,
                        .time_ms = now, .until_ms = 0};
    int64_t id1 = 0;
    ck_assert_int_eq(store_add_silence(st, &s1, &id1, &err), STORE_OK);
    ck_assert_int_gt(id1, 0);
    ck_assert_int_eq(store_add_silence(st, &s2, NULL, &err), STORE_OK);
    ck_assert_int_eq(store_add_silence(st, &s3, NULL, &err), STORE_OK);
    store_silence bad = s1;
    bad.run_id = r + q + 50;
    ck_assert_int_eq(store_add_silence(st, &bad, NULL, &err), STORE_NOTFOUND);
    bad = s1;
    bad.rule = NULL;
    ck_assert_int_eq(store_add_silence(st, &bad, NULL, &err), STORE_EINVAL);
    ck_assert_int_eq(store_commit(st, &err), STORE_OK);

    silences_copy c = {0};
    ck_assert_int_eq(store_silences(st, 0, now + 10, copy_silence, &c, &err), STORE_OK);
    ck_assert_int_eq(c.n, 3);
    ck_assert_int_eq(c.until[0], now + 1000);
    ck_assert_int_eq(c.until[1], 0);
    ck_assert_uint_eq(c.uid[2], uid + 1);
    memset(&c, 0, sizeof c); /* past the first one's time */
    ck_assert_int_eq(store_silences(st, r, now + 1000, copy_silence, &c, &err), STORE_OK);
    ck_assert_int_eq(c.n, 1);
    ck_assert_int_eq(c.head[0], 2);
    /* run r ends: its "until the run ends" silence ends with it; q's stays */
    ck_assert_int_eq(store_run_end(st, r, now + 20, "goodbye", &err), STORE_OK);
    ck_assert_int_eq(store_commit(st, &err), STORE_OK);
    memset(&c, 0, sizeof c);
    ck_assert_int_eq(store_silences(st, 0, now + 30, copy_silence, &c, &err), STORE_OK);
    ck_assert_int_eq(c.n, 2);
    ck_assert_int_eq(c.run[0], r); /* s1, until now + 1000 */
    ck_assert_int_eq(c.run[1], q);
    ck_assert_int_eq(raw_int(dbpath, "SELECT until FROM silences WHERE head = 2"), now + 20);
    /* resumed, the ended silence stays ended */
    begin_run(st, "a", 0);
    memset(&c, 0, sizeof c);
    ck_assert_int_eq(store_silences(st, r, now + 30, copy_silence, &c, &err), STORE_OK);
    ck_assert_int_eq(c.n, 1);
    /* deleting a run deletes its silences and alerts too */
    int done = 0;
    ck_assert_int_eq(store_delete_run(st, q, 0, &done, &err), STORE_OK);
    ck_assert(done);
    ck_assert_int_eq(raw_int(dbpath, "SELECT count(*) FROM silences"), 2);
    store_close(st);
}
END_TEST

/* A new silence of a key ends the one it replaces; store_end_silences ends one by id, or every one
 * of a run, and nothing of another run or already over. */
START_TEST(test_silences_replace_and_end)
{
    store *st = open_ok(dbpath);
    store_error err = {0};
    int64_t r = begin_run(st, "a", 0), q = begin_run(st, "b", 0);
    int64_t now = rnd_range(1000000, 2000000);
    uint32_t uid = (uint32_t)rnd_range(1, 60000);
    int32_t layer = (int32_t)rnd_range(0, 40), head = (int32_t)rnd_range(0, 60);
    store_silence s1 = {.run_id = r, .layer = layer, .head = head, .rule = "entropy_floor",
                        .uid = uid, .time_ms = now, .until_ms = 0};
    store_silence s2 = s1; /* the same key, later, for a while: replaces s1 */
    s2.uid = uid + 1;
    s2.time_ms = now + 5;
    s2.until_ms = now + 5000;
    store_silence s3 = s1; /* another head of r */
    s3.head = head + 1;
    store_silence s4 = s1; /* the same key in another run */
    s4.run_id = q;
    int64_t id1, id2, id3, id4;
    ck_assert_int_eq(store_add_silence(st, &s1, &id1, &err), STORE_OK);
    ck_assert_int_eq(store_add_silence(st, &s2, &id2, &err), STORE_OK);
    ck_assert_int_eq(store_add_silence(st, &s3, &id3, &err), STORE_OK);
    ck_assert_int_eq(store_add_silence(st, &s4, &id4, &err), STORE_OK);
    ck_assert_int_eq(store_commit(st, &err), STORE_OK);
    char sql[128];
    snprintf(sql, sizeof sql, "SELECT until FROM silences WHERE id = %lld", (long long)id1);
    ck_assert_int_eq(raw_int(dbpath, sql), now + 5);
    silences_copy c = {0};
    ck_assert_int_eq(store_silences(st, r, now + 10, copy_silence, &c, &err), STORE_OK);
    ck_assert_int_eq(c.n, 2);
    ck_assert_int_eq(c.id[0], id2);
    ck_assert_uint_eq(c.uid[0], uid + 1);
    ck_assert_int_eq(c.id[1], id3);

    int64_t ended = -1;
    /* another run's silence, an unknown id: nothing ends */
    ck_assert_int_eq(store_end_silences(st, r, id4, now + 20, &ended, &err), STORE_OK);
    ck_assert_int_eq(ended, 0);
    ck_assert_int_eq(store_end_silences(st, r, id4 + 100, now + 20, &ended, &err), STORE_OK);
    ck_assert_int_eq(ended, 0);
    ck_assert_int_eq(store_end_silences(st, r, -1, now + 20, &ended, &err), STORE_EINVAL);
    ck_assert_int_eq(store_end_silences(st, r + q + 9, 0, now + 20, &ended, &err),
                     STORE_NOTFOUND);
    /* one by id */
    ck_assert_int_eq(store_end_silences(st, r, id2, now + 20, &ended, &err), STORE_OK);
    ck_assert_int_eq(ended, 1);
    ck_assert_int_eq(store_commit(st, &err), STORE_OK);
    memset(&c, 0, sizeof c);
    ck_assert_int_eq(store_silences(st, r, now + 30, copy_silence, &c, &err), STORE_OK);
    ck_assert_int_eq(c.n, 1);
    ck_assert_int_eq(c.id[0], id3);
    /* ended already: not again */
    ck_assert_int_eq(store_end_silences(st, r, id2, now + 40, &ended, &err), STORE_OK);
    ck_assert_int_eq(ended, 0);
    snprintf(sql, sizeof sql, "SELECT until FROM silences WHERE id = %lld", (long long)id2);
    ck_assert_int_eq(raw_int(dbpath, sql), now + 20);
    /* every one of run r: s3; q's stays */
    ck_assert_int_eq(store_end_silences(st, r, 0, now + 50, &ended, &err), STORE_OK);
    ck_assert_int_eq(ended, 1);
    ck_assert_int_eq(store_commit(st, &err), STORE_OK);
    memset(&c, 0, sizeof c);
    ck_assert_int_eq(store_silences(st, 0, now + 60, copy_silence, &c, &err), STORE_OK);
    ck_assert_int_eq(c.n, 1);
    ck_assert_int_eq(c.id[0], id4);
    ck_assert_int_eq(raw_int(dbpath, "SELECT count(*) FROM silences"), 4);
    store_close(st);
}
END_TEST

int main(void)
{
    seed_init("test_store_lifecycle");
    Suite *s = suite_create("store lifecycle");
    TCase *tc = tcase_create("lifecycle");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_owner_and_ids);
    tcase_add_test(tc, test_run_end_and_resume);
    tcase_add_test(tc, test_resolved_ends_an_alert);
    tcase_add_test(tc, test_ack);
    tcase_add_test(tc, test_silences);
    tcase_add_test(tc, test_silences_replace_and_end);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
