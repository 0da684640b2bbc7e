/* test_daemon_layout.c — attnstatd end to end: a process's parallel layout (ParallelLayout after
 * Hello) gives its pushes global numbers. Two tensor-parallel ranks of one job on one daemon store
 * their heads side by side (rank r's head h is r x Hq + h), a pipeline stage's layers are offset,
 * an explicit head_offset wins, the layout is recorded with the run, alerts and Results to
 * subscribers carry the global numbers (the Ack the push's own), and bad layouts are refused with
 * the reason while the connection keeps serving. Raw frames (tests/harness); values against
 * stats_cpu. */
#include "daemon_harness.h"

#define LHQ 4  /* query heads per rank */
#define LN 32
#define LD 16

static dh_daemon daemon_;

static void setup(void)
{
    dh_dir_init(&daemon_);
    dh_start(&daemon_, (const char *)NULL);
}

static void teardown(void)
{
    dh_cleanup(&daemon_, 1);
}

/* One process: its connection, its shared memory with random q/k for one push. */
typedef dh_proc proc; /* q and k: LHQ heads of LN rows of LD */

static void proc_open(proc *p, dh_rng *r, const char *run, int rank, const char *tag)
{
    dh_proc_open(p, &daemon_, r, run, rank, tag, LHQ, LN, LD);
}

/* ParallelLayout: fields < 0 are left unset. */
static void send_layout(proc *p, int tp_rank, int tp_size, int layer_offset, int head_offset,
                        int dp_rank, int dp_size)
{
    Attnstat__ParallelLayout m;
    attnstat__parallel_layout__init(&m);
#define SET(f)                                                                                     \
    if (f >= 0) {                                                                                  \
        m.has_##f = 1;                                                                             \
        m.f = (uint32_t)f;                                                                         \
    }
    SET(tp_rank) SET(tp_size) SET(layer_offset) SET(head_offset) SET(dp_rank) SET(dp_size)
#undef SET
    Attnstat__Envelope env;
    ck_assert_int_eq(dh_send(&p->c, envelope_layout(&env, &m)), 0);
}

/* Pushes step/layer and asserts its Ack OK; returns the Ack's head numbers (the push's own). */
static void push_ok(proc *p, uint64_t seq, int64_t step, uint32_t layer)
{
    dh_push(&p->c, seq, step, layer, &p->q, &p->k, 1, 0, 1);
    char msg[256];
    ck_assert_msg(dh_wait_ack(&p->c, seq, msg, sizeof msg, 30000) == ATTNSTAT__CODE__OK,
                  "push %llu: %s", (unsigned long long)seq, msg);
}

/* The push's reference statistics (head h of its q). */
static void reference(const proc *p, stats_head out[LHQ])
{
    stats_problem pr;
    dh_problem(&pr, &p->q, p->shm.ptr, &p->k, p->shm.ptr);
    pr.causal = 1;
    stats_error err;
    ck_assert_int_eq(stats_cpu(&pr, out, NULL, NULL, &err), STATS_OK);
}

START_TEST(test_tensor_parallel_ranks)
{
    dh_rng r = dh_rng_new("tensor_parallel_ranks");
    proc p[2];
    for (int i = 0; i < 2; i++) {
        char tag[16];
        snprintf(tag, sizeof tag, "tp%d", i);
        proc_open(&p[i], &r, "tpjob", i, tag);
        send_layout(&p[i], i, 2, -1, -1, -1, -1);
        push_ok(&p[i], 1, 7, 3);
    }
    sqlite3 *db = dh_db_open(&daemon_);
    for (int i = 0; i < 2; i++) {
        stats_head ref[LHQ];
        reference(&p[i], ref);
        for (int h = 0; h < LHQ; h++) {
            char sql[256];
            snprintf(sql, sizeof sql, "SELECT count(*) FROM samples WHERE run_id = %lld AND "
                     "layer = 3 AND head = %d AND step = 7", (long long)p[i].run_id, i * LHQ + h);
            ck_assert_int_eq(dh_db_int(db, sql), 1);
            snprintf(sql, sizeof sql, "SELECT printf('%%.17g', entropy_mean) FROM samples WHERE "
                     "run_id = %lld AND head = %d", (long long)p[i].run_id, i * LHQ + h);
            char v[64];
            dh_db_text(db, sql, v, sizeof v);
            ck_assert_msg(dh_close_to_reference(strtod(v, NULL), ref[h].entropy_mean),
                          "rank %d head %d: %s vs %.17g", i, h, v, ref[h].entropy_mean);
        }
        char sql[200];
        snprintf(sql, sizeof sql, "SELECT tp_rank * 10 + tp_size FROM runs WHERE id = %lld",
                 (long long)p[i].run_id);
        ck_assert_int_eq(dh_db_int(db, sql), i * 10 + 2);
    }
    ck_assert_int_eq(dh_db_int(db, "SELECT count(DISTINCT head) FROM samples"), 2 * LHQ);
    ck_assert_int_eq(dh_db_int(db, "SELECT max(head) FROM samples"), 2 * LHQ - 1);
    sqlite3_close(db);
    for (int i = 0; i < 2; i++)
        dh_proc_close(&p[i]);
}
END_TEST

START_TEST(test_pipeline_offset_and_head_offset)
{
    dh_rng r = dh_rng_new("pipeline_offset");
    proc p;
    proc_open(&p, &r, "ppjob", 5, "pp");
    push_ok(&p, 1, 1, 2); /* before the layout: local numbers */
    send_layout(&p, 1, 4, 40, 100, 2, 3);
    push_ok(&p, 2, 2, 2);
    sqlite3 *db = dh_db_open(&daemon_);
    ck_assert_int_eq(dh_db_int(db, "SELECT min(head) * 1000 + layer FROM samples WHERE step = 1"),
                     2);
    /* head_offset wins over tp_rank x heads; layer_offset adds */
    ck_assert_int_eq(dh_db_int(db, "SELECT min(head) FROM samples WHERE step = 2"), 100);
    ck_assert_int_eq(dh_db_int(db, "SELECT max(head) FROM samples WHERE step = 2"), 100 + LHQ - 1);
    ck_assert_int_eq(dh_db_int(db, "SELECT min(layer) FROM samples WHERE step = 2"), 42);
    ck_assert_int_eq(dh_db_int(db, "SELECT dp_rank * 100 + dp_size * 10 + pp_size FROM runs"),
                     231);
    ck_assert_int_eq(dh_db_int(db, "SELECT head_offset + layer_offset FROM runs"), 140);
    sqlite3_close(db);
    dh_proc_close(&p);
}
END_TEST

START_TEST(test_results_and_alerts_global)
{
    dh_rng r = dh_rng_new("results_global");
    dh_conn sub;
    dh_connect(&sub, &daemon_);
    dh_subscribe(&sub, 1, 1);
    Attnstat__Envelope *st = dh_status(&sub); /* the subscription is in place */
    attnstat__envelope__free_unpacked(st, NULL);
    proc p;
    proc_open(&p, &r, "resjob", 1, "res");
    send_layout(&p, 3, 4, 10, -1, -1, -1);
    /* q = k scaled up: logits far over the ceiling, so logit_ceiling raises (raise_after 3). */
    float *qk = p.shm.ptr;
    for (uint64_t i = 0; i < dh_tensor_elems(&p.q); i++)
        qk[dh_tensor_elems(&p.q) + i] = qk[i] = qk[i] * 30.0f;
    for (int s = 0; s < 3; s++) {
        dh_push(&p.c, (uint64_t)s + 1, s, 1, &p.q, &p.k, 1, 0, 1);
        Attnstat__Envelope *ack = dh_expect(&p.c, ATTNSTAT__ENVELOPE__MSG_ACK, 30000);
        ck_assert_ptr_nonnull(ack);
        ck_assert_int_eq(ack->ack->code, ATTNSTAT__CODE__OK);
        ck_assert_uint_eq(ack->ack->n_heads, LHQ);
        for (size_t h = 0; h < ack->ack->n_heads; h++) /* the push's own numbers */
            ck_assert_uint_eq(ack->ack->heads[h]->head, h);
        attnstat__envelope__free_unpacked(ack, NULL);
    }
    int results = 0, alerts = 0;
    int64_t end = dh_now_ms() + 30000;
    while ((results < 3 || alerts < LHQ) && dh_now_ms() < end) {
        Attnstat__Envelope *e = dh_recv(&sub, 1000);
        if (!e)
            continue;
        if (e->msg_case == ATTNSTAT__ENVELOPE__MSG_RESULT) {
            ck_assert_uint_eq(e->result->layer, 11);
            ck_assert_uint_eq(e->result->n_heads, LHQ);
            for (size_t h = 0; h < e->result->n_heads; h++)
                ck_assert_uint_eq(e->result->heads[h]->head, 3 * LHQ + h);
            results++;
        } else if (e->msg_case == ATTNSTAT__ENVELOPE__MSG_ALERT &&
                   e->alert->rule == ATTNSTAT__ALERT_RULE__LOGIT_CEILING) {
            ck_assert_uint_eq(e->alert->layer, 11);
            ck_assert_uint_ge(e->alert->head, 3 * LHQ);
            ck_assert_uint_lt(e->alert->head, 4 * LHQ);
            alerts++;
        }
        attnstat__envelope__free_unpacked(e, NULL);
    }
    ck_assert_int_eq(results, 3);
    ck_assert_int_eq(alerts, LHQ);
    sqlite3 *db = dh_db_open(&daemon_);
    ck_assert_int_eq(dh_db_int(db, "SELECT min(head) * 100 + max(head) FROM alerts WHERE "
                                   "rule = 'logit_ceiling' AND layer = 11"),
                     (3 * LHQ) * 100 + 4 * LHQ - 1);
    sqlite3_close(db);
    dh_proc_close(&p);
    dh_close(&sub);
}
END_TEST

/* An Error of code, read from c (skipping other messages). */
static void expect_error(dh_conn *c, Attnstat__Code code, const char *words)
{
    Attnstat__Envelope *e = dh_expect(c, ATTNSTAT__ENVELOPE__MSG_ERROR, 30000);
    ck_assert_ptr_nonnull(e);
    ck_assert_int_eq(e->error->code, code);
    ck_assert_msg(strstr(e->error->message, words), "error '%s' does not say '%s'",
                  e->error->message, words);
    attnstat__envelope__free_unpacked(e, NULL);
}

START_TEST(test_bad_layouts)
{
    dh_rng r = dh_rng_new("bad_layouts");
    dh_conn c;
    dh_connect(&c, &daemon_);
    Attnstat__ParallelLayout m;
    attnstat__parallel_layout__init(&m);
    Attnstat__Envelope env;
    ck_assert_int_eq(dh_send(&c, envelope_layout(&env, &m)), 0);
    expect_error(&c, ATTNSTAT__CODE__NO_HELLO, "before Hello");
    dh_close(&c);

    proc p;
    proc_open(&p, &r, "badjob", 0, "bad");
    send_layout(&p, 4, 4, -1, -1, -1, -1); /* rank not under its size */
    expect_error(&p.c, ATTNSTAT__CODE__BAD_REQUEST, "tp_rank 4 of tp_size 4");
    send_layout(&p, 0, 0, -1, -1, -1, -1);
    expect_error(&p.c, ATTNSTAT__CODE__BAD_REQUEST, "tp_size 0");
    send_layout(&p, -1, -1, 1 << 25, -1, -1, -1);
    expect_error(&p.c, ATTNSTAT__CODE__BAD_REQUEST, "layer_offset");
    /* refused layouts changed nothing: local numbers */
    push_ok(&p, 1, 1, 0);
    /* a layout whose global numbers overflow a push: that push is refused, the next one served */
    send_layout(&p, -1, -1, -1, 1 << 24, -1, -1); /* the largest head_offset, + 4 heads */
    dh_push(&p.c, 2, 2, 0, &p.q, &p.k, 1, 0, 0);
    char msg[256];
    ck_assert_int_eq(dh_wait_ack(&p.c, 2, msg, sizeof msg, 30000), ATTNSTAT__CODE__BAD_REQUEST);
    ck_assert_msg(strstr(msg, "global numbers"), "%s", msg);
    send_layout(&p, 1, 2, -1, -1, -1, -1);
    push_ok(&p, 3, 3, 0);
    sqlite3 *db = dh_db_open(&daemon_);
    ck_assert_int_eq(dh_db_int(db, "SELECT min(head) FROM samples WHERE step = 1"), 0);
    ck_assert_int_eq(dh_db_int(db, "SELECT count(*) FROM samples WHERE step = 2"), 0);
    ck_assert_int_eq(dh_db_int(db, "SELECT min(head) FROM samples WHERE step = 3"), LHQ);
    sqlite3_close(db);
    dh_proc_close(&p);
}
END_TEST

static Suite *layout_suite(void)
{
    Suite *s = suite_create("daemon_layout");
    TCase *tc = tcase_create("layout");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_tensor_parallel_ranks);
    tcase_add_test(tc, test_pipeline_offset_and_head_offset);
    tcase_add_test(tc, test_results_and_alerts_global);
    tcase_add_test(tc, test_bad_layouts);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return dh_run(layout_suite());
}
