/* test_daemon_stats.c — a push's choice of statistics (Push.stats) end to end through a real
 * attnstatd, host tensors computed by its CPU workers: the HelloReply lists "stats"; a statistic
 * the push asked for is in the Ack's results, the subscribers' Result and the store, equal to
 * stats_cpu() on the same data (within dh_close_to_reference); one it did not ask for is absent
 * from all three (has_ unset, NULL stored), the counts staying. Unset, 0 and VOCAB_STATS_DEFAULT
 * give the defaults (sink_mass and distance absent). An absent statistic raises no alert and
 * clears none, while the statistics a push did ask for are judged as usual. A stats bit past the
 * table is refused (BAD_REQUEST naming the bits and the valid rows) and the connection goes on.
 * Random data from a printed seed (ATTNSTAT_TEST_SEED replays it), fresh for every push. */
#include "daemon_harness.h"
#include "vocab.h"

/* q [B, HQ, NQ, D] and k [B, HKV, NK, D], f32, bottom-right causal (every row sees 9 keys or
 * more): every statistic of the reference is finite. */
enum { B = 2, HQ = 4, HKV = 2, NQ = 40, NK = 48, D = 16 };

typedef struct {
    dh_daemon d;
    dh_conn c, sub;
    dh_shm shm;
    dh_tensor q, k;
    dh_rng rng;
    int64_t run_id;
} fixture;

/* Hello, and the HelloReply's features: "stats" among them. */
static int64_t hello_takes_stats(dh_conn *c, const char *run, const Attnstat__Thresholds *th)
{
    Attnstat__Hello h;
    Attnstat__Envelope env;
    envelope_hello(&env, &h, run);
    h.thresholds = (Attnstat__Thresholds *)th;
    ck_assert_int_eq(dh_send(c, &env), 0);
    Attnstat__Envelope *r = dh_recv(c, 20000);
    ck_assert_msg(r && r->msg_case == ATTNSTAT__ENVELOPE__MSG_HELLO_REPLY, "no HelloReply");
    int listed = 0;
    for (size_t i = 0; i < r->hello_reply->n_features; i++)
        listed |= strcmp(r->hello_reply->features[i], "stats") == 0;
    ck_assert_msg(listed, "the HelloReply does not list \"stats\"");
    int64_t run_id = r->hello_reply->run_id;
    attnstat__envelope__free_unpacked(r, NULL);
    return run_id;
}

/* A daemon, a subscriber of results and alerts (in place before any push), a client that said
 * Hello (thresholds th, may be NULL) and registered one segment holding q and k. */
static void setup(fixture *f, const char *who, const Attnstat__Thresholds *th)
{
    f->rng = dh_rng_new(who);
    dh_dir_init(&f->d);
    dh_start(&f->d, (const char *)NULL);
    dh_connect(&f->sub, &f->d);
    dh_subscribe(&f->sub, 1, 1);
    attnstat__envelope__free_unpacked(dh_status(&f->sub), NULL);
    dh_connect(&f->c, &f->d);
    f->run_id = hello_takes_stats(&f->c, who, th);
    dh_tensor_contig(&f->q, 1, 0, ATTNSTAT__DTYPE__F32, B, HQ, NQ, D);
    uint64_t qbytes = dh_tensor_elems(&f->q) * 4;
    dh_tensor_contig(&f->k, 1, qbytes, ATTNSTAT__DTYPE__F32, B, HKV, NK, D);
    dh_shm_create(&f->shm, who, qbytes + dh_tensor_elems(&f->k) * 4);
    dh_register(&f->c, 1, f->shm.name, f->shm.size);
}

static void teardown(fixture *f)
{
    dh_close(&f->c);
    dh_close(&f->sub);
    dh_shm_destroy(&f->shm);
    int code = dh_stop(&f->d);
    dh_cleanup(&f->d, code != 0);
    ck_assert_int_eq(code, 0);
}

/* Fresh random q and k (q sharper than k, so that heads differ), and stats_cpu()'s statistics of
 * them: every row computed, whatever a push asks. */
static void fresh_data(fixture *f, stats_head ref[HQ])
{
    dh_fill(&f->rng, f->shm.ptr, dh_tensor_elems(&f->q), f->q.dtype, 1.5);
    dh_fill(&f->rng, (char *)f->shm.ptr + f->k.offset, dh_tensor_elems(&f->k), f->k.dtype, 1.0);
    stats_problem p;
    dh_problem(&p, &f->q, f->shm.ptr, &f->k, f->shm.ptr);
    p.causal = 1;
    stats_error err;
    ck_assert_int_eq(stats_cpu(&p, ref, NULL, NULL, &err), STATS_OK);
    for (int h = 0; h < HQ; h++) {
        ck_assert(ref[h].rows == B * NQ);
#define X(name, ...) ck_assert_msg(isfinite(ref[h].name), "reference head %d " #name " %g", h,   \
                                   ref[h].name);
        VOCAB_STATS(X)
#undef X
        ck_assert(ref[h].sink_mass > 0.0 && ref[h].sink_mass < 1.0 && ref[h].distance > 0.0);
    }
}

/* A Push of f's q and k, causal, its results asked for; stats set only when has_stats. */
static void push_asking(fixture *f, uint64_t seq, int64_t step, uint32_t layer, int has_stats,
                        uint32_t stats)
{
    Attnstat__TensorRef qr, kr;
    dh_tensor_ref(&qr, &f->q);
    dh_tensor_ref(&kr, &f->k);
    Attnstat__Push p;
    Attnstat__Envelope env;
    envelope_push(&env, &p, seq, step, layer, &qr, &kr);
    p.has_causal = 1;
    p.causal = 1;
    p.has_want_results = 1;
    p.want_results = 1;
    p.has_stats = has_stats != 0;
    p.stats = stats;
    ck_assert_int_eq(dh_send(&f->c, &env), 0);
}

/* The Ack of seq (OK); free it. */
static Attnstat__Envelope *ack_ok(fixture *f, uint64_t seq)
{
    Attnstat__Envelope *e = dh_expect(&f->c, ATTNSTAT__ENVELOPE__MSG_ACK, 30000);
    ck_assert_msg(e != NULL, "no Ack for push %llu", (unsigned long long)seq);
    ck_assert_uint_eq(e->ack->seq, seq);
    ck_assert_msg(e->ack->code == ATTNSTAT__CODE__OK, "push %llu: code %d: %s",
                  (unsigned long long)seq, e->ack->code, e->ack->message ? e->ack->message : "");
    return e;
}

/* Heads on the wire (an Ack's or a Result's): each count as the reference's; a statistic present
 * exactly when `want` asks for it (0: the defaults), then equal to the reference. */
static void check_wire(Attnstat__HeadStats **hs, size_t n, const stats_head ref[HQ],
                       uint32_t want, const char *where)
{
    uint32_t asked = stats_want(want);
    ck_assert_uint_eq(n, HQ);
    for (int h = 0; h < HQ; h++) {
        ck_assert_uint_eq(hs[h]->head, (uint32_t)h);
        ck_assert_uint_eq(hs[h]->rows, (uint64_t)ref[h].rows);
        ck_assert_uint_eq(hs[h]->rows_norm, (uint64_t)ref[h].rows_norm);
#define X(name, ...)                                                                               \
    ck_assert_msg(hs[h]->has_##name == ((asked & VOCAB_BIT(name)) != 0),                          \
                  "%s (stats 0x%x) head %d: " #name " %s", where, want, h,                        \
                  hs[h]->has_##name ? "present, not asked for" : "asked for, absent");             \
    ck_assert_msg(!hs[h]->has_##name || dh_close_to_reference(hs[h]->name, ref[h].name),           \
                  "%s head %d: " #name " %.17g, reference %.17g", where, h, hs[h]->name,          \
                  ref[h].name);
        VOCAB_STATS(X)
#undef X
    }
}

/* The stored rows of (layer, step): a column NULL exactly when the push did not ask for it,
 * else equal to the reference; the counts stored whatever was asked. */
static void check_store(fixture *f, uint32_t layer, int64_t step, const stats_head ref[HQ],
                        uint32_t want)
{
    uint32_t asked = stats_want(want);
    sqlite3 *db = dh_db_open(&f->d);
    for (int h = 0; h < HQ; h++) {
        char sql[512];
        snprintf(sql, sizeof sql, "SELECT rows, rows_norm"
#define X(name, ...) ", " #name
                 VOCAB_STATS(X)
#undef X
                 " FROM samples WHERE run_id = %lld AND layer = %u AND head = %d AND step = %lld",
                 (long long)f->run_id, layer, h, (long long)step);
        sqlite3_stmt *st = NULL;
        ck_assert_int_eq(sqlite3_prepare_v2(db, sql, -1, &st, NULL), SQLITE_OK);
        ck_assert_msg(sqlite3_step(st) == SQLITE_ROW, "layer %u head %d step %lld not stored",
                      layer, h, (long long)step);
        ck_assert_int_eq(sqlite3_column_int64(st, 0), ref[h].rows);
        ck_assert_int_eq(sqlite3_column_int64(st, 1), ref[h].rows_norm);
        int col = 2;
#define X(name, ...)                                                                               \
    {                                                                                              \
        int null = sqlite3_column_type(st, col) == SQLITE_NULL;                                    \
        ck_assert_msg(null == !(asked & VOCAB_BIT(name)), "layer %u head %d (stats 0x%x): " #name \
                      " stored %s", layer, h, want, null ? "NULL, asked for" : "not asked for");  \
        ck_assert_msg(null ||                                                                      \
                          dh_close_to_reference(sqlite3_column_double(st, col), ref[h].name),     \
                      "layer %u head %d: " #name " stored %.17g, reference %.17g", layer, h,      \
                      sqlite3_column_double(st, col), ref[h].name);                                \
        col++;                                                                                     \
    }
        VOCAB_STATS(X)
#undef X
        sqlite3_finalize(st);
    }
    sqlite3_close(db);
}

/* What pushes ask for, and what each gets: in the Ack, the Result and the store. */
START_TEST(test_asked_statistics_come_back)
{
    fixture f;
    setup(&f, "stats_asked", NULL);
    static const struct {
        int has;
        uint32_t stats;
    } cases[] = {
        {1, VOCAB_BIT(sink_mass) | VOCAB_BIT(distance) | VOCAB_STATS_DEFAULT}, /* everything */
        {0, 0},                                      /* unset: the defaults */
        {1, VOCAB_BIT(sink_mass)},                   /* only the sink mass: no entropy, no logit */
        {1, VOCAB_STATS_DEFAULT},                    /* the defaults, said */
        {1, 0},                                      /* 0: the defaults too */
        {1, VOCAB_BIT(distance) | VOCAB_BIT(max_logit)},
    };
    const int ncases = (int)(sizeof cases / sizeof cases[0]);
    ck_assert_uint_eq(VOCAB_BIT(sink_mass) | VOCAB_BIT(distance) | VOCAB_STATS_DEFAULT,
                      VOCAB_STATS_ALL);
    for (int i = 0; i < ncases; i++) {
        stats_head ref[HQ];
        fresh_data(&f, ref);
        uint64_t seq = 100 + (uint64_t)i;
        push_asking(&f, seq, 7, (uint32_t)i, cases[i].has, cases[i].stats);
        Attnstat__Envelope *e = ack_ok(&f, seq);
        char where[64];
        snprintf(where, sizeof where, "Ack of case %d", i);
        check_wire(e->ack->heads, e->ack->n_heads, ref, cases[i].stats, where);
        attnstat__envelope__free_unpacked(e, NULL);
        /* the rows are committed before the Ack */
        check_store(&f, (uint32_t)i, 7, ref, cases[i].stats);
        Attnstat__Envelope *r = dh_expect(&f.sub, ATTNSTAT__ENVELOPE__MSG_RESULT, 30000);
        ck_assert_msg(r != NULL, "no Result for case %d", i);
        ck_assert_uint_eq(r->result->layer, (uint32_t)i);
        snprintf(where, sizeof where, "Result of case %d", i);
        check_wire(r->result->heads, r->result->n_heads, ref, cases[i].stats, where);
        attnstat__envelope__free_unpacked(r, NULL);
    }
    teardown(&f);
}
END_TEST

typedef struct {
    int rule;
    int64_t step;
} alert_key;

/* An absent statistic is no sample for its rules. Every rule's threshold is set so that a present
 * value is bad: step 1 asks for sink_mass alone (SINK_MASS_CEILING raises; nothing else moves),
 * step 2 for the defaults (ENTROPY_FLOOR and LOGIT_CEILING raise; the sink rule, its statistic
 * absent, neither clears nor raises again), step 3 for everything (DISTANCE_FLOOR raises, the
 * first sample of its statistic). Each head raises exactly those, at those steps; nothing else
 * reaches the subscriber or the alerts table. */
START_TEST(test_absent_statistics_raise_nothing)
{
    Attnstat__Thresholds th = ATTNSTAT__THRESHOLDS__INIT;
    th.has_entropy_floor = th.has_logit_ceiling = th.has_sink_mass_ceiling = 1;
    th.has_distance_floor = th.has_raise_after = th.has_clear_after = 1;
    th.entropy_floor = 1.0;        /* a normalised entropy under 1: bad */
    th.logit_ceiling = 1e-3;       /* any logit of these heads is over it */
    th.sink_mass_ceiling = 1e-6;   /* any mass on the first key is over it */
    th.distance_floor = 1e29;      /* any distance is under it */
    th.raise_after = 1;
    th.clear_after = 1;            /* an absent value taken as good would clear at once */
    fixture f;
    setup(&f, "stats_alerts", &th);
    const uint32_t asks[3] = {VOCAB_BIT(sink_mass), 0, VOCAB_STATS_ALL};
    for (int s = 0; s < 3; s++) {
        stats_head ref[HQ];
        fresh_data(&f, ref);
        push_asking(&f, 200 + (uint64_t)s, s + 1, 0, asks[s] != 0, asks[s]);
        attnstat__envelope__free_unpacked(ack_ok(&f, 200 + (uint64_t)s), NULL);
    }
    static const alert_key want[] = {
        {ATTNSTAT__ALERT_RULE__SINK_MASS_CEILING, 1},
        {ATTNSTAT__ALERT_RULE__ENTROPY_FLOOR, 2},
        {ATTNSTAT__ALERT_RULE__LOGIT_CEILING, 2},
        {ATTNSTAT__ALERT_RULE__DISTANCE_FLOOR, 3},
    };
    enum { NWANT = sizeof want / sizeof want[0] };
    int seen[NWANT][HQ];
    memset(seen, 0, sizeof seen);
    /* One layer: the pushes are judged in order, so a stray alert of steps 1 and 2 comes before
     * the last of step 3's. */
    int got = 0;
    while (got < NWANT * HQ) {
        Attnstat__Envelope *e = dh_expect(&f.sub, ATTNSTAT__ENVELOPE__MSG_ALERT, 30000);
        ck_assert_msg(e != NULL, "%d of %d alerts arrived", got, NWANT * HQ);
        const Attnstat__Alert *a = e->alert;
        int k = 0;
        while (k < NWANT && !((int)a->rule == want[k].rule && a->step == want[k].step))
            k++;
        ck_assert_msg(k < NWANT && a->state == ATTNSTAT__ALERT_STATE__RAISED && a->head < HQ,
                      "unexpected alert: rule %d state %d head %u step %lld (value %g)",
                      (int)a->rule, (int)a->state, a->head, (long long)a->step, a->value);
        ck_assert_msg(isfinite(a->value), "rule %d raised on a value of %g", (int)a->rule,
                      a->value);
        ck_assert_msg(!seen[k][a->head]++, "rule %d head %u raised twice", (int)a->rule, a->head);
        got++;
        attnstat__envelope__free_unpacked(e, NULL);
    }
    /* Nothing more: a Status answered after every alert of the three pushes was sent. */
    dh_send_status(&f.sub);
    for (;;) {
        Attnstat__Envelope *e = dh_recv(&f.sub, 30000);
        ck_assert_msg(e != NULL, "no StatusReply");
        if (e->msg_case == ATTNSTAT__ENVELOPE__MSG_ALERT)
            ck_abort_msg("an extra alert: rule %d state %d head %u step %lld", (int)e->alert->rule,
                         (int)e->alert->state, e->alert->head, (long long)e->alert->step);
        int done = e->msg_case == ATTNSTAT__ENVELOPE__MSG_STATUS_REPLY;
        attnstat__envelope__free_unpacked(e, NULL);
        if (done)
            break;
    }
    sqlite3 *db = dh_db_open(&f.d);
    char sql[256];
    snprintf(sql, sizeof sql, "SELECT count(*) FROM alerts WHERE run_id = %lld",
             (long long)f.run_id);
    ck_assert_int_eq(dh_db_int(db, sql), NWANT * HQ);
    snprintf(sql, sizeof sql, "SELECT count(*) FROM alerts WHERE run_id = %lld AND ((rule = "
             "'sink_mass_ceiling' AND step = 1) OR (rule IN ('entropy_floor', 'logit_ceiling') AND "
             "step = 2) OR (rule = 'distance_floor' AND step = 3)) AND state = 'raised'",
             (long long)f.run_id);
    ck_assert_int_eq(dh_db_int(db, sql), NWANT * HQ);
    sqlite3_close(db);
    teardown(&f);
}
END_TEST

/* A stats bit past the table's rows: BAD_REQUEST, the message naming the bits and the rows; no
 * sample stored; the next push on the same connection is served with what it asks. */
START_TEST(test_unknown_bits_refused_then_served)
{
    fixture f;
    setup(&f, "stats_refused", NULL);
    stats_head ref[HQ];
    fresh_data(&f, ref);
    char hex[32];
    static const uint32_t bad[] = {1u << VOCAB_NSTATS, 0xffffffffu,
                                   VOCAB_BIT(entropy_mean) | 1u << 31};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        push_asking(&f, 300 + i, 9, 0, 1, bad[i]);
        char msg[512];
        int code = dh_wait_ack(&f.c, 300 + i, msg, sizeof msg, 30000);
        ck_assert_msg(code == ATTNSTAT__CODE__BAD_REQUEST, "stats 0x%x: code %d (%s)", bad[i],
                      code, msg);
        snprintf(hex, sizeof hex, "stats 0x%x ", bad[i]);
        ck_assert_msg(strstr(msg, hex), "'%s' lacks '%s'", msg, hex);
        snprintf(hex, sizeof hex, "(bits 0x%x)", bad[i] & ~(uint32_t)VOCAB_STATS_ALL);
        ck_assert_msg(strstr(msg, hex), "'%s' lacks '%s'", msg, hex);
        snprintf(hex, sizeof hex, "rows 0..%d", VOCAB_NSTATS - 1);
        ck_assert_msg(strstr(msg, hex), "'%s' lacks '%s'", msg, hex);
    }
    push_asking(&f, 310, 9, 0, 1, VOCAB_STATS_ALL);
    Attnstat__Envelope *e = ack_ok(&f, 310);
    check_wire(e->ack->heads, e->ack->n_heads, ref, VOCAB_STATS_ALL, "the push after the refusals");
    attnstat__envelope__free_unpacked(e, NULL);
    check_store(&f, 0, 9, ref, VOCAB_STATS_ALL);
    sqlite3 *db = dh_db_open(&f.d);
    ck_assert_int_eq(dh_db_int(db, "SELECT count(*) FROM samples"), HQ);
    sqlite3_close(db);
    teardown(&f);
}
END_TEST

static Suite *daemon_stats_suite(void)
{
    Suite *s = suite_create("daemon_stats");
    TCase *tc = tcase_create("stats");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, test_asked_statistics_come_back);
    tcase_add_test(tc, test_absent_statistics_raise_nothing);
    tcase_add_test(tc, test_unknown_bits_refused_then_served);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return dh_run(daemon_stats_suite());
}
