/* test_daemon_interv.c — attnstatd end to end: Intervention (what a job did to its model because of
 * what was measured: qk_clip's scaled heads) after Hello, stored with the run. Random ones sent in
 * raw frames come back from the database field by field (kind, step, rank, the daemon's receive
 * time, layer or NULL, heads and values as the JSON arrays schema/006_interventions.sql documents,
 * threshold, measured, detail); under a ParallelLayout their layer and heads are global as a push's
 * are (tp_rank 1 of 2 with 8 heads: heads + 8; a pipeline stage's layer_offset; an explicit
 * head_offset); every bad field is refused with BAD_REQUEST naming it, and the connection goes on
 * serving pushes and interventions; before Hello: NO_HELLO; the HelloReply lists "interventions".
 * Raw frames (tests/harness). */
#include "daemon_harness.h"

#define HQ 8   /* query heads per rank */
#define SN 16
#define SD 16

static dh_daemon daemon_;
static int metrics_port_;

static void setup(void)
{
    dh_dir_init(&daemon_);
    metrics_port_ = dh_free_port();
    char port[16];
    snprintf(port, sizeof port, "%d", metrics_port_);
    dh_start(&daemon_, "--metrics-port", port, (const char *)NULL);
}

/* The daemon stopped as an operator stops it: it exits 0 (under the sanitizers, with nothing of
 * the interventions' path leaked or misused: they make it exit otherwise). */
static void teardown(void)
{
    int status = dh_stop(&daemon_);
    dh_cleanup(&daemon_, status != 0);
    ck_assert_msg(status == 0, "attnstatd exited %d (its log is above)", status);
}

/* One process: its connection and shared memory with random q/k of HQ heads for its pushes. */
typedef dh_proc proc; /* q and k: HQ heads of SN rows of SD */

static void proc_open(proc *p, dh_rng *r, const char *run, int rank, const char *tag)
{
    dh_proc_open(p, &daemon_, r, run, rank, tag, HQ, SN, SD);
}

/* A push of the process at step/layer, its Ack OK asserted. Every write the daemon took from this
 * connection before it is in the store's queue ahead of it. */
static void push_ok(proc *p, int64_t step, uint32_t layer)
{
    uint64_t seq = ++p->seq;
    dh_push(&p->c, seq, step, layer, &p->q, &p->k, 1, 0, 0);
    char msg[256];
    ck_assert_msg(dh_wait_ack(&p->c, seq, msg, sizeof msg, 30000) == ATTNSTAT__CODE__OK,
                  "push %llu: %s", (unsigned long long)seq, msg);
}

/* ParallelLayout: fields < 0 are left unset. */
static void send_layout(proc *p, int tp_rank, int tp_size, int layer_offset, int head_offset)
{
    Attnstat__ParallelLayout m;
    attnstat__parallel_layout__init(&m);
#define SET(f)                                                                                     \
    if (f >= 0) {                                                                                  \
        m.has_##f = 1;                                                                             \
        m.f = (uint32_t)f;                                                                         \
    }
    SET(tp_rank) SET(tp_size) SET(layer_offset) SET(head_offset)
#undef SET
    Attnstat__Envelope env;
    ck_assert_int_eq(dh_send(&p->c, envelope_layout(&env, &m)), 0);
}

/* ---- interventions: one as sent, and as it should be stored ----------------------------------- */

#define IV_MAX_HEADS 4200

typedef struct {
    Attnstat__Intervention m; /* its arrays point into the fields below */
    char kind[48];
    uint32_t heads[IV_MAX_HEADS];
    double values[IV_MAX_HEADS];
    char detail[1100];
} iv_msg;

static void iv_send(dh_conn *c, iv_msg *v)
{
    v->m.kind = v->kind;
    v->m.heads = v->heads;
    v->m.values = v->values;
    if (v->m.detail)
        v->m.detail = v->detail;
    Attnstat__Envelope env = ATTNSTAT__ENVELOPE__INIT;
    env.msg_case = ATTNSTAT__ENVELOPE__MSG_INTERVENTION;
    env.intervention = &v->m;
    ck_assert_int_eq(dh_send(c, &env), 0);
}

/* A random qk_clip-like intervention of local heads 0..HQ-1: a step, a layer (or none, 1 in 5),
 * 1..HQ distinct heads in random order with their factors in (0, 1] (or no values, 1 in 4), tau
 * and the measured max logit (each absent 1 in 4), a JSON detail (absent 1 in 2). */
static void iv_random(dh_rng *r, iv_msg *v)
{
    memset(v, 0, sizeof *v);
    attnstat__intervention__init(&v->m);
    static const char *const kinds[] = {"qk_clip", "qk_clip", "lr.scale", "head-reset_2"};
    snprintf(v->kind, sizeof v->kind, "%s", kinds[dh_next(r) % 4]);
    v->m.step = (int64_t)(dh_next(r) % 100000000);
    if (dh_next(r) % 5) {
        v->m.has_layer = 1;
        v->m.layer = (uint32_t)(dh_next(r) % 64);
    }
    uint32_t perm[HQ];
    for (uint32_t i = 0; i < HQ; i++)
        perm[i] = i;
    for (uint32_t i = HQ - 1; i > 0; i--) {
        uint32_t j = (uint32_t)(dh_next(r) % (i + 1)), t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    v->m.n_heads = 1 + dh_next(r) % HQ;
    int values = dh_next(r) % 4 != 0;
    for (size_t i = 0; i < v->m.n_heads; i++) {
        v->heads[i] = perm[i];
        v->values[i] = 1.0 - (double)(dh_next(r) >> 11) / 9007199254740992.0;
    }
    v->m.n_values = values ? v->m.n_heads : 0;
    double tau = 30.0 + 170.0 * (double)(dh_next(r) >> 11) / 9007199254740992.0;
    if (dh_next(r) % 4) {
        v->m.has_threshold = 1;
        v->m.threshold = tau;
    }
    if (dh_next(r) % 4) {
        v->m.has_measured = 1;
        v->m.measured = tau * (1.0 + (double)(dh_next(r) >> 11) / 9007199254740992.0);
    }
    if (dh_next(r) % 2) {
        snprintf(v->detail, sizeof v->detail, "{\"qk_clip\":{\"alpha\":0.5,\"tag\":\"%016llx\"}}",
                 (unsigned long long)dh_next(r));
        v->m.detail = v->detail;
    }
}

/* The JSON array the store writes of heads + base, and of the values (%.17g). */
static void iv_json(const iv_msg *v, int32_t base, char *heads, size_t hn, char *vals, size_t vn)
{
    size_t a = 0, b = 0;
    a += (size_t)snprintf(heads + a, hn - a, "[");
    b += (size_t)snprintf(vals + b, vn - b, "[");
    for (size_t i = 0; i < v->m.n_heads; i++) {
        a += (size_t)snprintf(heads + a, hn - a, "%s%d", i ? "," : "", (int)(v->heads[i] + base));
        b += (size_t)snprintf(vals + b, vn - b, "%s%.17g", i ? "," : "", v->values[i]);
    }
    snprintf(heads + a, hn - a, "]");
    snprintf(vals + b, vn - b, "]");
}

/* Waits until run_id has n interventions stored (the store thread commits them with the next
 * batch; push_ok() after them makes that soon). */
static void wait_stored(sqlite3 *db, int64_t run_id, int n)
{
    char sql[160];
    snprintf(sql, sizeof sql, "SELECT count(*) FROM interventions WHERE run_id = %lld",
             (long long)run_id);
    int64_t end = dh_now_ms() + 20000, got = 0;
    while ((got = dh_db_int(db, sql)) < n && dh_now_ms() < end)
        dh_sleep_ms(20);
    ck_assert_int_eq(got, n);
}

/* The stored rows of run_id, by id, against sent[0..n) with the layer offset and head base the
 * layout gives; their receive times within [t0, t1]. */
static void assert_stored(sqlite3 *db, int64_t run_id, int rank, const iv_msg *sent, int n,
                          int layer_offset, int head_base, int64_t t0, int64_t t1)
{
    sqlite3_stmt *s = NULL;
    ck_assert_int_eq(sqlite3_prepare_v2(db, "SELECT rank, step, time_ms, kind, layer, heads, "
                                            "head_values, threshold, measured, detail FROM "
                                            "interventions WHERE run_id = ?1 ORDER BY id",
                                        -1, &s, NULL),
                     SQLITE_OK);
    sqlite3_bind_int64(s, 1, run_id);
    static char heads[IV_MAX_HEADS * 12], vals[IV_MAX_HEADS * 26];
    for (int i = 0; i < n; i++) {
        ck_assert_int_eq(sqlite3_step(s), SQLITE_ROW);
        const iv_msg *v = &sent[i];
        ck_assert_int_eq(sqlite3_column_int(s, 0), rank);
        ck_assert_int_eq(sqlite3_column_int64(s, 1), v->m.step);
        int64_t t = sqlite3_column_int64(s, 2);
        ck_assert_msg(t >= t0 && t <= t1, "row %d: time %lld outside [%lld, %lld]", i,
                      (long long)t, (long long)t0, (long long)t1);
        ck_assert_str_eq((const char *)sqlite3_column_text(s, 3), v->kind);
        if (v->m.has_layer)
            ck_assert_int_eq(sqlite3_column_int(s, 4), (int)v->m.layer + layer_offset);
        else
            ck_assert_int_eq(sqlite3_column_type(s, 4), SQLITE_NULL);
        iv_json(v, head_base, heads, sizeof heads, vals, sizeof vals);
        ck_assert_str_eq((const char *)sqlite3_column_text(s, 5), heads);
        if (v->m.n_values)
            ck_assert_str_eq((const char *)sqlite3_column_text(s, 6), vals);
        else
            ck_assert_int_eq(sqlite3_column_type(s, 6), SQLITE_NULL);
        if (v->m.has_threshold)
            ck_assert_msg(sqlite3_column_double(s, 7) == v->m.threshold, "row %d: threshold", i);
        else
            ck_assert_int_eq(sqlite3_column_type(s, 7), SQLITE_NULL);
        if (v->m.has_measured)
            ck_assert_msg(sqlite3_column_double(s, 8) == v->m.measured, "row %d: measured", i);
        else
            ck_assert_int_eq(sqlite3_column_type(s, 8), SQLITE_NULL);
        if (v->m.detail)
            ck_assert_str_eq((const char *)sqlite3_column_text(s, 9), v->detail);
        else
            ck_assert_int_eq(sqlite3_column_type(s, 9), SQLITE_NULL);
    }
    ck_assert_int_eq(sqlite3_step(s), SQLITE_DONE);
    sqlite3_finalize(s);
}

/* An Error of code saying words, read from c (skipping other messages). */
static void expect_error(dh_conn *c, Attnstat__Code code, const char *words)
{
    Attnstat__Envelope *e = dh_expect(c, ATTNSTAT__ENVELOPE__MSG_ERROR, 30000);
    ck_assert_ptr_nonnull(e);
    ck_assert_msg(e->error->code == code, "error %d (%s), want %d", (int)e->error->code,
                  e->error->message, (int)code);
    ck_assert_msg(strstr(e->error->message, words), "error '%s' does not say '%s'",
                  e->error->message, words);
    attnstat__envelope__free_unpacked(e, NULL);
}

/* ---- tests --------------------------------------------------------------------------------- */

#define NSENT 24

START_TEST(test_stored_exactly)
{
    dh_rng r = dh_rng_new("interv_stored");
    proc p;
    proc_open(&p, &r, "clipjob", 3, "iv0");
    static iv_msg sent[NSENT];
    int64_t t0 = (int64_t)time(NULL) * 1000 - 1000;
    for (int i = 0; i < NSENT; i++) {
        iv_random(&r, &sent[i]);
        iv_send(&p.c, &sent[i]);
    }
    push_ok(&p, 1, 0);
    sqlite3 *db = dh_db_open(&daemon_);
    wait_stored(db, p.run_id, NSENT);
    int64_t t1 = (int64_t)time(NULL) * 1000 + 1000;
    assert_stored(db, p.run_id, 3, sent, NSENT, 0, 0, t0, t1); /* no layout: local numbers */
    sqlite3_close(db);
    /* /metrics: the run's interventions and the heads they named (counted once the store's
     * commit is back on the loop: asked until then) */
    uint64_t heads = 0;
    for (int i = 0; i < NSENT; i++)
        heads += sent[i].m.n_heads;
    char want_n[160], want_h[160];
    snprintf(want_n, sizeof want_n, "attnstat_run_interventions_total{run=\"clipjob\",rank=\"3\","
             "run_id=\"%lld\"} %d\n", (long long)p.run_id, NSENT);
    snprintf(want_h, sizeof want_h, "attnstat_run_intervened_heads_total{run=\"clipjob\","
             "rank=\"3\",run_id=\"%lld\"} %llu\n", (long long)p.run_id,
             (unsigned long long)heads);
    static char page[1 << 20];
    for (int tries = 0; tries < 2000; tries++) { /* 20 s: the loaded and sanitized runs */
        dh_scrape(metrics_port_, page, sizeof page);
        if (strstr(page, want_n))
            break;
        dh_sleep_ms(10);
    }
    ck_assert_msg(strstr(page, want_n) && strstr(page, want_h), "want\n%s%sin\n%.3000s", want_n,
                  want_h, strstr(page, "attnstat_run_interv") ? strstr(page, "attnstat_run_interv")
                                                             : page);
    dh_proc_close(&p);
}
END_TEST

START_TEST(test_hello_reply_and_no_hello)
{
    dh_rng r = dh_rng_new("interv_no_hello");
    dh_conn c;
    dh_connect(&c, &daemon_);
    static iv_msg v;
    iv_random(&r, &v);
    iv_send(&c, &v);
    expect_error(&c, ATTNSTAT__CODE__NO_HELLO, "Intervention before Hello");
    /* the connection goes on: the HelloReply lists "interventions" */
    int64_t run_id;
    dh_hello_lists(&c, "nohello", 0, NULL, "interventions", &run_id);
    iv_send(&c, &v);
    Attnstat__Envelope *st = dh_status(&c); /* answered after the intervention was taken */
    attnstat__envelope__free_unpacked(st, NULL);
    sqlite3 *db = dh_db_open(&daemon_);
    wait_stored(db, run_id, 1);
    assert_stored(db, run_id, 0, &v, 1, 0, 0, 1, INT64_MAX);
    sqlite3_close(db);
    dh_close(&c);
}
END_TEST

START_TEST(test_layout_global_numbers)
{
    dh_rng r = dh_rng_new("interv_layout");
    /* tensor-parallel rank 1 of 2, a pipeline stage from layer 20: heads + 8, layers + 20 */
    proc p;
    proc_open(&p, &r, "tpclip", 1, "iv1");
    send_layout(&p, 1, 2, 20, -1);
    static iv_msg v;
    iv_random(&r, &v);
    iv_send(&p.c, &v); /* no push yet: how many heads a rank has is not known */
    expect_error(&p.c, ATTNSTAT__CODE__BAD_REQUEST, "intervention.heads");
    push_ok(&p, 1, 2); /* HQ heads: rank 1's are HQ .. 2 HQ - 1 */
    static iv_msg sent[NSENT];
    for (int i = 0; i < NSENT; i++) {
        iv_random(&r, &sent[i]);
        iv_send(&p.c, &sent[i]);
    }
    push_ok(&p, 2, 2);
    sqlite3 *db = dh_db_open(&daemon_);
    wait_stored(db, p.run_id, NSENT);
    assert_stored(db, p.run_id, 1, sent, NSENT, 20, HQ, 1, INT64_MAX);
    /* the pushes' own heads sit where the interventions' do */
    char sql[200];
    snprintf(sql, sizeof sql, "SELECT min(head) * 1000 + max(head) FROM samples WHERE run_id = "
             "%lld AND layer = 22", (long long)p.run_id);
    ck_assert_int_eq(dh_db_int(db, sql), HQ * 1000 + 2 * HQ - 1);

    /* an explicit head_offset wins over tp_rank x heads */
    send_layout(&p, 1, 2, 0, 1000);
    iv_random(&r, &v);
    iv_send(&p.c, &v);
    push_ok(&p, 3, 0);
    wait_stored(db, p.run_id, NSENT + 1);
    snprintf(sql, sizeof sql, "SELECT heads FROM interventions WHERE run_id = %lld ORDER BY id "
             "DESC LIMIT 1", (long long)p.run_id);
    char got[200], want[200], vals[400];
    dh_db_text(db, sql, got, sizeof got);
    iv_json(&v, 1000, want, sizeof want, vals, sizeof vals);
    ck_assert_str_eq(got, want);
    sqlite3_close(db);
    dh_proc_close(&p);
}
END_TEST

START_TEST(test_bad_fields_refused)
{
    dh_rng r = dh_rng_new("interv_bad");
    proc p;
    proc_open(&p, &r, "badclip", 0, "iv2");
    static iv_msg good[16], v;
    int ngood = 0;
    struct {
        const char *says;
    } cases[] = {
        {"intervention.kind is 0 bytes"},      {"intervention.kind: byte 2"},
        {"intervention.kind is 33 bytes"},     {"intervention.step -1"},
        {"intervention.layer 2097152"},        {"intervention.heads has 4097"},
        {"intervention.heads[2] is 16777216"}, {"intervention.values has 2 entries for 3"},
        {"intervention.values[1] is nan"},     {"intervention.threshold is inf"},
        {"intervention.measured is -inf"},     {"intervention.detail is 1025 bytes"},
    };
    int ncases = (int)(sizeof cases / sizeof cases[0]);
    for (int k = 0; k < ncases; k++) {
        iv_random(&r, &v);
        v.m.n_heads = 3, v.m.n_values = 3;
        switch (k) {
        case 0: v.kind[0] = '\0'; break;
        case 1: snprintf(v.kind, sizeof v.kind, "qkClip"); break;
        case 2: memset(v.kind, 'a', 33), v.kind[33] = '\0'; break;
        case 3: v.m.step = -1; break;
        case 4: v.m.has_layer = 1, v.m.layer = 1u << 21; break;
        case 5: v.m.n_heads = 4097, v.m.n_values = 0; break;
        case 6: v.heads[2] = 1u << 24; break;
        case 7: v.m.n_values = 2; break;
        case 8: v.values[1] = NAN; break;
        case 9: v.m.has_threshold = 1, v.m.threshold = INFINITY; break;
        case 10: v.m.has_measured = 1, v.m.measured = -INFINITY; break;
        case 11: memset(v.detail, 'd', 1025), v.detail[1025] = '\0', v.m.detail = v.detail; break;
        }
        iv_send(&p.c, &v);
        expect_error(&p.c, ATTNSTAT__CODE__BAD_REQUEST, cases[k].says);
        /* the connection goes on: a good one, and every few a push */
        iv_random(&r, &good[ngood]);
        iv_send(&p.c, &good[ngood++]);
        if (k % 4 == 3)
            push_ok(&p, k, 1);
    }
    /* the largest heads accepted: 4096 of them, each < 2^24 */
    iv_random(&r, &good[ngood]);
    good[ngood].m.n_heads = 4096;
    good[ngood].m.n_values = 0;
    for (int i = 0; i < 4096; i++)
        good[ngood].heads[i] = (uint32_t)(dh_next(&r) % (1u << 24));
    iv_send(&p.c, &good[ngood++]);
    /* global numbers past the bound: refused as a push is */
    send_layout(&p, -1, -1, -1, 1 << 24);
    iv_random(&r, &v);
    iv_send(&p.c, &v);
    expect_error(&p.c, ATTNSTAT__CODE__BAD_REQUEST, "global numbers");
    send_layout(&p, -1, -1, -1, 0);
    push_ok(&p, 100, 1);
    sqlite3 *db = dh_db_open(&daemon_);
    wait_stored(db, p.run_id, ngood);
    assert_stored(db, p.run_id, 0, good, ngood, 0, 0, 1, INT64_MAX);
    sqlite3_close(db);
    /* the daemon is whole: status answers, and counts what it recorded and what it refused (a
     * clip is counted once the store thread's commit is back on the loop: asked until then) */
    uint64_t stored = 0, refused = 0;
    for (int tries = 0; tries < 2000; tries++) { /* 20 s: the loaded and sanitized runs */
        Attnstat__Envelope *st = dh_status(&p.c);
        ck_assert_ptr_nonnull(st);
        ck_assert_int_eq(st->msg_case, ATTNSTAT__ENVELOPE__MSG_STATUS_REPLY);
        ck_assert(st->status_reply->has_interventions_stored &&
                  st->status_reply->has_interventions_refused);
        stored = st->status_reply->interventions_stored;
        refused = st->status_reply->interventions_refused;
        attnstat__envelope__free_unpacked(st, NULL);
        if (stored == (uint64_t)ngood)
            break;
        usleep(10000);
    }
    ck_assert_msg(stored == (uint64_t)ngood && refused == (uint64_t)ncases + 1,
                  "status: %llu interventions recorded (sent %d good), %llu refused (sent %d bad)",
                  (unsigned long long)stored, ngood, (unsigned long long)refused, ncases + 1);
    dh_proc_close(&p);
}
END_TEST

static Suite *interv_suite(void)
{
    Suite *s = suite_create("daemon_interventions");
    TCase *tc = tcase_create("interventions");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_stored_exactly);
    tcase_add_test(tc, test_hello_reply_and_no_hello);
    tcase_add_test(tc, test_layout_global_numbers);
    tcase_add_test(tc, test_bad_fields_refused);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return dh_run(interv_suite());
}
