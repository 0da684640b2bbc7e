/* test_daemon_computed.c — Computed messages (libattnstat's local mode: per-head statistics a
 * client computed in its own process) through a real attnstatd: stored as sent, answered with an
 * Ack (with the results when asked for) and no Release, checked by the alert rules like the
 * daemon's own results, refused with BAD_REQUEST and the reason when malformed (heads out of
 * order, counts that disagree, a statistic out of its vocab.h row's bounds, no heads, too many),
 * refused before Hello; the daemon keeps serving the client after every refusal; a parallel
 * layout gives them global numbers. sink_mass and distance: back in the Ack when given, absent
 * when not (or NaN); a Hello's sink_mass_ceiling and distance_floor stored and judged.
 * The HelloReply lists "computed". */
#include <math.h>

#include "daemon_harness.h"

/* Uniform in [0, 1). */
static double unit_of(dh_rng *rng)
{
    return (double)(dh_next(rng) >> 11) * 0x1p-53;
}

/* A Computed message of n heads with random, self-consistent values (head h's entropy mean is
 * base + 0.1 h); hs and ptrs are the caller's arrays of n. */
static void fill_computed(Attnstat__Computed *m, Attnstat__HeadStats *hs,
                          Attnstat__HeadStats **ptrs, size_t n, uint64_t seq, int64_t step,
                          uint32_t layer, dh_rng *rng, double base)
{
    attnstat__computed__init(m);
    m->seq = seq;
    m->step = step;
    m->layer = layer;
    for (size_t h = 0; h < n; h++) {
        Attnstat__HeadStats *o = &hs[h];
        attnstat__head_stats__init(o);
        o->head = (uint32_t)h;
        o->rows = 64 + dh_next(rng) % 64;
        o->has_rows_norm = 1;
        o->rows_norm = o->rows - 1;
        o->has_entropy_mean = o->has_entropy_std = o->has_entropy_min = o->has_entropy_max = 1;
        o->entropy_mean = base + 0.1 * (double)h;
        o->entropy_std = 0.05 + 0.01 * fabs(dh_gauss(rng));
        o->entropy_min = o->entropy_mean * 0.5;
        o->entropy_max = o->entropy_mean * 1.5;
        o->has_entropy_norm_mean = 1;
        o->entropy_norm_mean = o->entropy_mean / (o->entropy_mean + 1.0); /* in [0, 1) */
        o->has_collapsed_frac = 1;
        o->collapsed_frac = 0.25 * (double)(dh_next(rng) % 4);
        o->has_max_logit = 1;
        o->max_logit = 3.0 + dh_gauss(rng);
        o->has_sink_mass = o->has_distance = 1;
        o->sink_mass = 0.05 + 0.3 * unit_of(rng);   /* under 0.5 */
        o->distance = 4.0 + 60.0 * unit_of(rng);    /* over 3 */
        ptrs[h] = o;
    }
    m->n_heads = n;
    m->heads = ptrs;
}

static void send_computed(dh_conn *c, Attnstat__Computed *m)
{
    Attnstat__Envelope env = ATTNSTAT__ENVELOPE__INIT;
    env.msg_case = ATTNSTAT__ENVELOPE__MSG_COMPUTED;
    env.computed = m;
    ck_assert_int_eq(dh_send(c, &env), 0);
}

/* The Ack of seq (no Release may come for it: the daemon reads no memory of a Computed); the
 * caller frees it. */
static Attnstat__Envelope *ack_with_heads(dh_conn *c, uint64_t seq)
{
    int64_t deadline = dh_now_ms() + 30000;
    for (;;) {
        int64_t left = deadline - dh_now_ms();
        ck_assert_msg(left > 0, "no Ack for Computed %llu", (unsigned long long)seq);
        Attnstat__Envelope *e = dh_recv(c, (int)left);
        ck_assert_msg(e != NULL, "no Ack for Computed %llu (closed or timeout)",
                      (unsigned long long)seq);
        ck_assert_msg(!(e->msg_case == ATTNSTAT__ENVELOPE__MSG_RELEASE && e->release->seq == seq),
                      "a Release for Computed %llu: the daemon reads no memory of it",
                      (unsigned long long)seq);
        if (e->msg_case == ATTNSTAT__ENVELOPE__MSG_ACK && e->ack->seq == seq)
            return e;
        attnstat__envelope__free_unpacked(e, NULL);
    }
}

/* The Ack of seq: its code, its message in msg, its number of heads in *nheads. */
static int ack_of(dh_conn *c, uint64_t seq, char *msg, size_t len, size_t *nheads)
{
    Attnstat__Envelope *e = ack_with_heads(c, seq);
    int code = (int)e->ack->code;
    snprintf(msg, len, "%s", e->ack->message ? e->ack->message : "");
    if (nheads)
        *nheads = e->ack->n_heads;
    attnstat__envelope__free_unpacked(e, NULL);
    return code;
}

START_TEST(test_computed_stored_and_acked)
{
    dh_rng rng = dh_rng_new("computed_stored_and_acked");
    dh_daemon d;
    dh_dir_init(&d);
    dh_start(&d, (const char *)NULL);
    dh_conn c;
    dh_connect(&c, &d);
    int64_t run_id;
    dh_hello(&c, "local", 0, &run_id);
    enum { NH = 6, STEPS = 4, LAYERS = 3 };
    Attnstat__HeadStats hs[NH], *ptrs[NH];
    double want[STEPS][LAYERS][NH][3];
    uint64_t seq = 1;
    for (int s = 0; s < STEPS; s++)
        for (int l = 0; l < LAYERS; l++) {
            Attnstat__Computed m;
            fill_computed(&m, hs, ptrs, NH, seq, 10 * s, (uint32_t)l, &rng,
                          3.0 + 0.5 * fabs(dh_gauss(&rng) * dh_gauss(&rng))); /* >= 0 */
            m.has_want_results = 1;
            m.want_results = (s + l) % 2;
            for (int h = 0; h < NH; h++) {
                want[s][l][h][0] = hs[h].entropy_mean;
                want[s][l][h][1] = hs[h].max_logit;
                want[s][l][h][2] = (double)hs[h].rows;
            }
            send_computed(&c, &m);
            char msg[256];
            size_t nheads = 0;
            int code = ack_of(&c, seq, msg, sizeof msg, &nheads);
            ck_assert_msg(code == ATTNSTAT__CODE__OK, "Computed %llu answered %d: %s",
                          (unsigned long long)seq, code, msg);
            ck_assert_uint_eq(nheads, (s + l) % 2 ? NH : 0);
            seq++;
        }
    dh_close(&c);
    int rc = dh_stop(&d);
    sqlite3 *db = dh_db_open(&d);
    char sql[300];
    snprintf(sql, sizeof sql, "SELECT count(*) FROM samples WHERE run_id = %lld",
             (long long)run_id);
    int64_t stored = dh_db_int(db, sql);
    int bad = 0;
    for (int s = 0; s < STEPS; s++)
        for (int l = 0; l < LAYERS; l++)
            for (int h = 0; h < NH; h++) {
                sqlite3_stmt *st;
                snprintf(sql, sizeof sql, "SELECT entropy_mean, max_logit, rows FROM samples "
                         "WHERE run_id = %lld AND step = %d AND layer = %d AND head = %d",
                         (long long)run_id, 10 * s, l, h);
                ck_assert_int_eq(sqlite3_prepare_v2(db, sql, -1, &st, NULL), SQLITE_OK);
                ck_assert_int_eq(sqlite3_step(st), SQLITE_ROW);
                bad += !dh_close_enough(sqlite3_column_double(st, 0), want[s][l][h][0]) ||
                       !dh_close_enough(sqlite3_column_double(st, 1), want[s][l][h][1]) ||
                       sqlite3_column_double(st, 2) != want[s][l][h][2];
                sqlite3_finalize(st);
            }
    sqlite3_close(db);
    dh_cleanup(&d, rc != 0 || bad);
    ck_assert_int_eq(rc, 0);
    ck_assert_int_eq(stored, STEPS * LAYERS * NH);
    ck_assert_int_eq(bad, 0);
}
END_TEST

/* A process's parallel layout applies to its Computed messages as to its pushes: global layer
 * layer_offset + l, global head tp_rank x heads + h. */
START_TEST(test_computed_global_numbers)
{
    dh_rng rng = dh_rng_new("computed_global_numbers");
    dh_daemon d;
    dh_dir_init(&d);
    dh_start(&d, (const char *)NULL);
    dh_conn c;
    dh_connect(&c, &d);
    int64_t run_id;
    dh_hello(&c, "local-tp", 0, &run_id);
    enum { NH = 4 };
    uint32_t tp_rank = 1 + (uint32_t)(dh_next(&rng) % 3), layer_offset = 8 + (uint32_t)(dh_next(&rng) % 8);
    Attnstat__ParallelLayout lay;
    attnstat__parallel_layout__init(&lay);
    lay.has_tp_rank = lay.has_tp_size = lay.has_layer_offset = 1;
    lay.tp_rank = tp_rank;
    lay.tp_size = 4;
    lay.layer_offset = layer_offset;
    Attnstat__Envelope env;
    ck_assert_int_eq(dh_send(&c, envelope_layout(&env, &lay)), 0);
    Attnstat__HeadStats hs[NH], *ptrs[NH];
    Attnstat__Computed m;
    fill_computed(&m, hs, ptrs, NH, 1, 3, 2, &rng, 2.5 + dh_gauss(&rng) * 0.1);
    send_computed(&c, &m);
    char msg[256];
    ck_assert_int_eq(ack_of(&c, 1, msg, sizeof msg, NULL), ATTNSTAT__CODE__OK);
    dh_close(&c);
    int rc = dh_stop(&d);
    sqlite3 *db = dh_db_open(&d);
    int bad = 0;
    for (int h = 0; h < NH; h++) {
        char sql[300];
        sqlite3_stmt *st;
        snprintf(sql, sizeof sql, "SELECT entropy_mean FROM samples WHERE run_id = %lld AND "
                 "step = 3 AND layer = %u AND head = %u", (long long)run_id, layer_offset + 2,
                 tp_rank * NH + (uint32_t)h);
        ck_assert_int_eq(sqlite3_prepare_v2(db, sql, -1, &st, NULL), SQLITE_OK);
        bad += sqlite3_step(st) != SQLITE_ROW ||
               !dh_close_enough(sqlite3_column_double(st, 0), hs[h].entropy_mean);
        sqlite3_finalize(st);
    }
    char sql[200];
    snprintf(sql, sizeof sql, "SELECT count(*) FROM samples WHERE run_id = %lld", (long long)run_id);
    int64_t stored = dh_db_int(db, sql);
    sqlite3_close(db);
    dh_cleanup(&d, rc != 0 || bad);
    ck_assert_int_eq(rc, 0);
    ck_assert_int_eq(stored, NH);
    ck_assert_int_eq(bad, 0);
}
END_TEST

START_TEST(test_computed_raise_alerts)
{
    dh_rng rng = dh_rng_new("computed_raise_alerts");
    dh_daemon d;
    dh_dir_init(&d);
    dh_start(&d, (const char *)NULL);
    dh_conn c;
    dh_connect(&c, &d);
    Attnstat__Thresholds th = ATTNSTAT__THRESHOLDS__INIT;
    th.has_logit_ceiling = 1;
    th.logit_ceiling = 50.0;
    th.has_raise_after = 1;
    th.raise_after = 2;
    int64_t run_id;
    dh_hello_th(&c, "local-alerts", 0, &th, &run_id);
    enum { NH = 3 };
    Attnstat__HeadStats hs[NH], *ptrs[NH];
    for (uint64_t seq = 1; seq <= 4; seq++) {
        Attnstat__Computed m;
        fill_computed(&m, hs, ptrs, NH, seq, (int64_t)seq, 2, &rng, 2.0);
        hs[1].max_logit = 80.0 + (double)seq; /* over the run's ceiling of 50 */
        send_computed(&c, &m);
        char msg[256];
        ck_assert_int_eq(ack_of(&c, seq, msg, sizeof msg, NULL), ATTNSTAT__CODE__OK);
    }
    dh_close(&c);
    int rc = dh_stop(&d);
    sqlite3 *db = dh_db_open(&d);
    char sql[300];
    snprintf(sql, sizeof sql, "SELECT count(*) FROM alerts WHERE run_id = %lld AND "
             "rule = 'logit_ceiling' AND layer = 2 AND head = 1 AND state = 'raised'",
             (long long)run_id);
    int64_t raised = dh_db_int(db, sql);
    snprintf(sql, sizeof sql, "SELECT count(*) FROM alerts WHERE run_id = %lld AND head != 1",
             (long long)run_id);
    int64_t others = dh_db_int(db, sql);
    sqlite3_close(db);
    dh_cleanup(&d, rc != 0);
    ck_assert_int_eq(rc, 0);
    ck_assert_int_eq(raised, 1);
    ck_assert_int_eq(others, 0);
}
END_TEST

START_TEST(test_computed_refused_with_reasons)
{
    dh_rng rng = dh_rng_new("computed_refused_with_reasons");
    dh_daemon d;
    dh_dir_init(&d);
    dh_start(&d, (const char *)NULL);
    dh_conn c;
    dh_connect(&c, &d);
    enum { NH = 4 };
    Attnstat__HeadStats hs[NH], *ptrs[NH];
    Attnstat__Computed m;
    char msg[300];
    fill_computed(&m, hs, ptrs, NH, 1, 0, 0, &rng, 1.0);
    send_computed(&c, &m);
    ck_assert_int_eq(ack_of(&c, 1, msg, sizeof msg, NULL), ATTNSTAT__CODE__NO_HELLO);

    /* The HelloReply says the daemon takes them. */
    Attnstat__Hello h = ATTNSTAT__HELLO__INIT;
    h.run = "refusals";
    h.protocol_version = FRAME_PROTOCOL_VERSION;
    Attnstat__Envelope env = ATTNSTAT__ENVELOPE__INIT;
    env.msg_case = ATTNSTAT__ENVELOPE__MSG_HELLO;
    env.hello = &h;
    ck_assert_int_eq(dh_send(&c, &env), 0);
    Attnstat__Envelope *rep = dh_expect(&c, ATTNSTAT__ENVELOPE__MSG_HELLO_REPLY, 30000);
    ck_assert_ptr_nonnull(rep);
    int listed = 0;
    for (size_t i = 0; i < rep->hello_reply->n_features; i++)
        listed |= strcmp(rep->hello_reply->features[i], "computed") == 0;
    attnstat__envelope__free_unpacked(rep, NULL);
    ck_assert_msg(listed, "the HelloReply does not list \"computed\"");

    struct {
        const char *what, *says;
    } cases[] = {
        {"out of order", "come in order"},
        {"rows_norm > rows", "do not agree"},
        {"negative entropy", "entropy_min -0.25 is not in [0, "},
        {"collapsed_frac > 1", "collapsed_frac 1.5 is not in [0, 1]"},
        {"no heads", "1 to"},
        {"sink_mass > 1", "sink_mass 1.25 is not in [0, 1]"},
        {"negative distance", "distance -3 is not in [0, "},
        {"normalised entropy > 1", "entropy_norm_mean 1.01 is not in [0, 1]"},
    };
    uint64_t seq = 2;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++, seq++) {
        fill_computed(&m, hs, ptrs, NH, seq, 1, 0, &rng, 1.0);
        switch (i) {
        case 0: hs[2].head = 3; break;
        case 1: hs[1].rows_norm = hs[1].rows + 1; break;
        case 2: hs[3].entropy_min = -0.25; break;
        case 3: hs[0].collapsed_frac = 1.5; break;
        case 4: m.n_heads = 0; break;
        case 5: hs[2].sink_mass = 1.25; break;
        case 6: hs[1].distance = -3.0; break;
        case 7: hs[3].entropy_norm_mean = 1.01; break;
        }
        send_computed(&c, &m);
        int code = ack_of(&c, seq, msg, sizeof msg, NULL);
        ck_assert_msg(code == ATTNSTAT__CODE__BAD_REQUEST && strstr(msg, cases[i].says),
                      "%s: code %d, '%s'", cases[i].what, code, msg);
    }
    /* Too many heads. */
    size_t big = 4097;
    Attnstat__HeadStats *bhs = calloc(big, sizeof *bhs);
    Attnstat__HeadStats **bptrs = calloc(big, sizeof *bptrs);
    ck_assert_ptr_nonnull(bhs);
    ck_assert_ptr_nonnull(bptrs);
    fill_computed(&m, bhs, bptrs, big, seq, 1, 0, &rng, 1.0);
    send_computed(&c, &m);
    int code = ack_of(&c, seq, msg, sizeof msg, NULL);
    free(bhs);
    free(bptrs);
    ck_assert_msg(code == ATTNSTAT__CODE__BAD_REQUEST && strstr(msg, "4097 heads"), "%d %s", code,
                  msg);
    seq++;
    /* And the client is still served. */
    fill_computed(&m, hs, ptrs, NH, seq, 2, 0, &rng, 1.0);
    send_computed(&c, &m);
    ck_assert_int_eq(ack_of(&c, seq, msg, sizeof msg, NULL), ATTNSTAT__CODE__OK);
    dh_close(&c);
    int rc = dh_stop(&d);
    dh_cleanup(&d, rc != 0);
    ck_assert_int_eq(rc, 0);
}
END_TEST

/* sink_mass and distance: given, they come back in the Ack's results exactly; not given or NaN,
 * they are absent (no has_); a mass over 1 by rounding only comes back as 1. */
START_TEST(test_computed_sink_mass_and_distance)
{
    dh_rng rng = dh_rng_new("computed_sink_mass_and_distance");
    dh_daemon d;
    dh_dir_init(&d);
    dh_start(&d, (const char *)NULL);
    dh_conn c;
    dh_connect(&c, &d);
    int64_t run_id;
    dh_hello(&c, "local-new", 0, &run_id);
    enum { NH = 5 };
    Attnstat__HeadStats hs[NH], *ptrs[NH];
    Attnstat__Computed m;
    fill_computed(&m, hs, ptrs, NH, 1, 7, 1, &rng, 1.5);
    m.has_want_results = 1;
    m.want_results = 1;
    hs[1].has_sink_mass = hs[1].has_distance = 0;              /* not computed */
    hs[2].sink_mass = hs[2].distance = NAN;                    /* NaN: absent */
    hs[3].sink_mass = 1.0 + 1e-9;                              /* rounding over 1 */
    hs[4].sink_mass = 1.0, hs[4].distance = 0.0;               /* the bounds themselves */
    send_computed(&c, &m);
    Attnstat__Envelope *e = ack_with_heads(&c, 1);
    ck_assert_msg(e->ack->code == ATTNSTAT__CODE__OK, "%d %s", (int)e->ack->code,
                  e->ack->message ? e->ack->message : "");
    ck_assert_uint_eq(e->ack->n_heads, NH);
    const Attnstat__HeadStats *const *got = (const Attnstat__HeadStats *const *)e->ack->heads;
    ck_assert(got[0]->has_sink_mass && got[0]->sink_mass == hs[0].sink_mass);
    ck_assert(got[0]->has_distance && got[0]->distance == hs[0].distance);
    ck_assert(!got[1]->has_sink_mass && !got[1]->has_distance);
    ck_assert(!got[2]->has_sink_mass && !got[2]->has_distance);
    ck_assert(got[2]->has_entropy_mean && got[2]->entropy_mean == hs[2].entropy_mean);
    ck_assert(got[3]->has_sink_mass && got[3]->sink_mass == 1.0);
    ck_assert(got[4]->has_sink_mass && got[4]->sink_mass == 1.0);
    ck_assert(got[4]->has_distance && got[4]->distance == 0.0);
    attnstat__envelope__free_unpacked(e, NULL);
    dh_close(&c);
    int rc = dh_stop(&d);
    dh_cleanup(&d, rc != 0);
    ck_assert_int_eq(rc, 0);
}
END_TEST

/* A Hello's sink_mass_ceiling and distance_floor: stored with the run's thresholds, and judged:
 * head 1's mass over the ceiling and head 2's distance under the floor raise their rule after
 * raise_after samples; no other head or rule raises anything. */
START_TEST(test_computed_new_rules)
{
    dh_rng rng = dh_rng_new("computed_new_rules");
    dh_daemon d;
    dh_dir_init(&d);
    dh_start(&d, (const char *)NULL);
    dh_conn c;
    dh_connect(&c, &d);
    Attnstat__Thresholds th = ATTNSTAT__THRESHOLDS__INIT;
    th.has_sink_mass_ceiling = th.has_distance_floor = th.has_raise_after = 1;
    th.sink_mass_ceiling = 0.5;
    th.distance_floor = 3.0;
    th.raise_after = 2;
    int64_t run_id;
    dh_hello_th(&c, "local-new-rules", 0, &th, &run_id);
    enum { NH = 4 };
    Attnstat__HeadStats hs[NH], *ptrs[NH];
    for (uint64_t seq = 1; seq <= 4; seq++) {
        Attnstat__Computed m;
        fill_computed(&m, hs, ptrs, NH, seq, (int64_t)seq, 0, &rng, 2.0);
        hs[1].sink_mass = 0.6 + 0.4 * unit_of(&rng);
        hs[2].distance = 2.9 * unit_of(&rng);
        hs[3].sink_mass = hs[3].distance = NAN; /* says nothing */
        send_computed(&c, &m);
        char msg[256];
        ck_assert_int_eq(ack_of(&c, seq, msg, sizeof msg, NULL), ATTNSTAT__CODE__OK);
    }
    dh_close(&c);
    int rc = dh_stop(&d);
    sqlite3 *db = dh_db_open(&d);
    char sql[300], json[1024];
    snprintf(sql, sizeof sql, "SELECT count(*) FROM alerts WHERE run_id = %lld AND rule = "
             "'sink_mass_ceiling' AND layer = 0 AND head = 1 AND state = 'raised'",
             (long long)run_id);
    int64_t sink = dh_db_int(db, sql);
    snprintf(sql, sizeof sql, "SELECT count(*) FROM alerts WHERE run_id = %lld AND rule = "
             "'distance_floor' AND layer = 0 AND head = 2 AND state = 'raised'", (long long)run_id);
    int64_t dist = dh_db_int(db, sql);
    snprintf(sql, sizeof sql, "SELECT count(*) FROM alerts WHERE run_id = %lld AND state = "
             "'raised'", (long long)run_id);
    int64_t all = dh_db_int(db, sql);
    snprintf(sql, sizeof sql, "SELECT thresholds FROM runs WHERE id = %lld", (long long)run_id);
    dh_db_text(db, sql, json, sizeof json);
    sqlite3_close(db);
    dh_cleanup(&d, rc != 0);
    ck_assert_int_eq(rc, 0);
    ck_assert_int_eq(sink, 1);
    ck_assert_int_eq(dist, 1);
    ck_assert_int_eq(all, 2);
    ck_assert_msg(strstr(json, "\"sink_mass_ceiling\":0.5,\"distance_floor\":3") &&
                      strstr(json, "\"raise_after\":2,\"clear_after\":5,"),
                  "stored thresholds: %s", json);
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("daemon_computed");
    TCase *t = tcase_create("computed");
    tcase_set_timeout(t, 120);
    tcase_add_test(t, test_computed_stored_and_acked);
    tcase_add_test(t, test_computed_global_numbers);
    tcase_add_test(t, test_computed_raise_alerts);
    tcase_add_test(t, test_computed_refused_with_reasons);
    tcase_add_test(t, test_computed_sink_mass_and_distance);
    tcase_add_test(t, test_computed_new_rules);
    suite_add_tcase(s, t);
    return s;
}

int main(void)
{
    return dh_run(suite());
}
