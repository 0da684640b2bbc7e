/* test_daemon_life.c — alerts that end, through a real attnstatd: a run ends on a Goodbye, when its
 * client went away and did not come back within run_grace_ms, or when no push came for
 * run_idle_ms, and each of its active alerts is then RESOLVED with that reason (to subscribers, in
 * the alerts table, in the run's record); a push after an idle end resumes the run. Operators'
 * Commands: ack (who and when kept on the raise), resolve (a RESOLVED transition with the uid),
 * silence (kept with who, and the silenced key's next transitions not sent to subscribers).
 * /metrics counts each run's active and unacknowledged alerts, shows each live process's thresholds
 * and the acknowledged and silenced heads, and drops every series of a run that ended or was
 * deleted. A restart restores only what is still live. The retention runs in the background while
 * pushes are stored. Every wait is for a condition, with a generous deadline. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>

#include "daemon_harness.h"
#include "envelope.h"

enum { H = 2, N = 32, D = 16 };

typedef struct {
    dh_conn c;
    dh_shm shm;
    dh_tensor q, k;
    float *qp, *kp;
    int64_t run_id;
    uint64_t seq;
} trainer;

/* Head 1's query rows are 5x a key row each (collapsed, logits over 5) when bad; small noise else. */
static void fill(dh_rng *rng, trainer *t, int bad)
{
    dh_fill(rng, t->kp, dh_tensor_elems(&t->k), t->k.dtype, 1.0);
    for (int h = 0; h < H; h++)
        for (int i = 0; i < N; i++)
            for (int d = 0; d < D; d++) {
                float *dst = &t->qp[(h * N + i) * D + d];
                *dst = bad && h == 1 ? 5.0f * t->kp[((i * 7) % N) * D + d]
                                     : (float)(0.05 * dh_gauss(rng));
            }
}

/* A client of run `run` with thresholds th (NULL: the daemon's). */
static void trainer_start_th(trainer *t, const dh_daemon *d, const char *run, const char *tag,
                             const Attnstat__Thresholds *th)
{
    memset(t, 0, sizeof *t);
    dh_connect(&t->c, d);
    dh_hello_th(&t->c, run, 0, th, &t->run_id);
    dh_tensor_contig(&t->q, 1, 0, ATTNSTAT__DTYPE__F32, 1, H, N, D);
    uint64_t qbytes = dh_tensor_elems(&t->q) * 4;
    dh_tensor_contig(&t->k, 1, qbytes, ATTNSTAT__DTYPE__F32, 1, 1, N, D);
    dh_shm_create(&t->shm, tag, qbytes + dh_tensor_elems(&t->k) * 4);
    t->qp = t->shm.ptr;
    t->kp = (float *)((char *)t->shm.ptr + qbytes);
    dh_register(&t->c, 1, t->shm.name, t->shm.size);
}

/* A client of run `run`: raise_after 1, clear_after 2, logit ceiling 5. */
static void trainer_start(trainer *t, const dh_daemon *d, const char *run, const char *tag)
{
    Attnstat__Thresholds th = ATTNSTAT__THRESHOLDS__INIT;
    th.has_logit_ceiling = 1;
    th.logit_ceiling = 5.0;
    th.has_raise_after = 1;
    th.raise_after = 1;
    th.has_clear_after = 1;
    th.clear_after = 2;
    trainer_start_th(t, d, run, tag, &th);
}

/* One push of step (layer 2), acknowledged OK. */
static void trainer_push(dh_rng *rng, trainer *t, int64_t step, int bad)
{
    fill(rng, t, bad);
    uint64_t seq = ++t->seq;
    dh_push(&t->c, seq, step, 2, &t->q, &t->k, 0, 0, 0);
    char msg[256];
    int code = dh_wait_ack(&t->c, seq, msg, sizeof msg, 30000);
    ck_assert_msg(code == ATTNSTAT__CODE__OK, "step %lld: code %d %s", (long long)step, code, msg);
}

static void trainer_goodbye(trainer *t)
{
    Attnstat__Goodbye g;
    Attnstat__Envelope env;
    ck_assert_int_eq(dh_send(&t->c, envelope_goodbye(&env, &g)), 0);
}

static void trainer_end(trainer *t)
{
    dh_close(&t->c);
    dh_shm_destroy(&t->shm);
}

/* Reads alerts from sub until n with `state` (and `reason` when not NULL) of run_id arrived;
 * fails after timeout_ms. Returns how many of other states came meanwhile. */
static int wait_alerts(dh_conn *sub, int64_t run_id, int state, const char *reason, int n,
                       int timeout_ms)
{
    int got = 0, other = 0;
    int64_t deadline = dh_now_ms() + timeout_ms;
    while (got < n) {
        int left = (int)(deadline - dh_now_ms());
        Attnstat__Envelope *e = left > 0 ? dh_expect(sub, ATTNSTAT__ENVELOPE__MSG_ALERT, left)
                                         : NULL;
        ck_assert_msg(e != NULL, "%d of %d alerts in state %d (%s) of run %lld arrived", got, n,
                      state, reason ? reason : "any reason", (long long)run_id);
        Attnstat__Alert *a = e->alert;
        if (a->run_id == run_id && (int)a->state == state &&
            (!reason || (a->reason && !strcmp(a->reason, reason))))
            got++;
        else
            other++;
        attnstat__envelope__free_unpacked(e, NULL);
    }
    return other;
}

/* Waits until the query gives want (the store thread commits on its own time). */
static void wait_db(const dh_daemon *d, const char *sql, int64_t want, int timeout_ms)
{
    int64_t deadline = dh_now_ms() + timeout_ms, v = -1;
    while (dh_now_ms() < deadline) {
        sqlite3 *db = dh_db_open(d);
        v = dh_db_int(db, sql);
        sqlite3_close(db);
        if (v == want)
            return;
        dh_sleep_ms(50);
    }
    ck_abort_msg("%s gave %lld, not %lld, within %d ms", sql, (long long)v, (long long)want,
                 timeout_ms);
}

static int64_t db_int(const dh_daemon *d, const char *sql)
{
    sqlite3 *db = dh_db_open(d);
    int64_t v = dh_db_int(db, sql);
    sqlite3_close(db);
    return v;
}

static uint32_t active_now(dh_conn *c)
{
    Attnstat__Envelope *st = dh_status(c);
    uint32_t n = st->status_reply->alerts_active;
    attnstat__envelope__free_unpacked(st, NULL);
    return n;
}

/* A Command and its CommandReply (free it). */
static Attnstat__Envelope *command(dh_conn *c, Attnstat__Command__Action action, int64_t alert_id,
                                   int64_t run_id, int64_t until_ms)
{
    Attnstat__Command m;
    Attnstat__Envelope env;
    envelope_command(&env, &m, action);
    if (alert_id) {
        m.has_alert_id = 1;
        m.alert_id = alert_id;
    }
    if (run_id) {
        m.has_run_id = 1;
        m.run_id = run_id;
    }
    if (until_ms) {
        m.has_until_ms = 1;
        m.until_ms = until_ms;
    }
    ck_assert_int_eq(dh_send(c, &env), 0);
    Attnstat__Envelope *r = dh_expect(c, ATTNSTAT__ENVELOPE__MSG_COMMAND_REPLY, 30000);
    ck_assert_msg(r != NULL, "no CommandReply");
    return r;
}

/* ---- a run ends ----------------------------------------------------------------------------- */

/* Goodbye: the run's two active alerts are resolved ("goodbye") as soon as the connection closes,
 * delivered, recorded, and the run's end recorded. The grace is long: only the Goodbye ends it. */
START_TEST(test_goodbye_resolves)
{
    dh_rng rng = dh_rng_new("life_goodbye");
    dh_daemon d;
    dh_dir_init(&d);
    dh_start(&d, "--run-grace-ms", "600000", (const char *)NULL);
    dh_conn sub;
    dh_connect(&sub, &d);
    dh_subscribe(&sub, 1, 0);
    attnstat__envelope__free_unpacked(dh_status(&sub), NULL);

    trainer t;
    trainer_start(&t, &d, "bye", "life_bye");
    trainer_push(&rng, &t, 0, 1);
    wait_alerts(&sub, t.run_id, ATTNSTAT__ALERT_STATE__RAISED, NULL, 2, 30000);
    ck_assert_uint_eq(active_now(&sub), 2);
    trainer_goodbye(&t);
    trainer_end(&t);
    wait_alerts(&sub, t.run_id, ATTNSTAT__ALERT_STATE__RESOLVED, "goodbye", 2, 30000);
    ck_assert_uint_eq(active_now(&sub), 0);
    wait_db(&d, "SELECT count(*) FROM alerts WHERE state='resolved' AND reason='goodbye' AND "
                "head=1 AND layer=2", 2, 30000);
    wait_db(&d, "SELECT count(*) FROM runs WHERE name='bye' AND ended IS NOT NULL AND "
                "end_reason='goodbye'", 1, 30000);
    dh_close(&sub);
    int code = dh_stop(&d);
    dh_cleanup(&d, code != 0);
    ck_assert_int_eq(code, 0);
}
END_TEST

/* A client that goes away without Goodbye: its run waits run_grace_ms (a client that comes back
 * in time keeps it live: nothing resolved), then ends ("disconnected"). */
START_TEST(test_disconnect_grace)
{
    dh_rng rng = dh_rng_new("life_grace");
    dh_daemon d;
    dh_dir_init(&d);
    dh_start(&d, "--run-grace-ms", "300", (const char *)NULL);
    dh_conn sub;
    dh_connect(&sub, &d);
    dh_subscribe(&sub, 1, 0);
    attnstat__envelope__free_unpacked(dh_status(&sub), NULL);

    trainer t;
    trainer_start(&t, &d, "gone", "life_gone");
    trainer_push(&rng, &t, 0, 1);
    wait_alerts(&sub, t.run_id, ATTNSTAT__ALERT_STATE__RAISED, NULL, 2, 30000);
    int64_t t0 = dh_now_ms();
    trainer_end(&t);
    wait_alerts(&sub, t.run_id, ATTNSTAT__ALERT_STATE__RESOLVED, "disconnected", 2, 30000);
    ck_assert_int_ge(dh_now_ms() - t0, 300); /* not before its grace */
    ck_assert_uint_eq(active_now(&sub), 0);
    wait_db(&d, "SELECT count(*) FROM runs WHERE name='gone' AND end_reason='disconnected'", 1,
            30000);
    dh_close(&sub);
    int code = dh_stop(&d);
    dh_cleanup(&d, code != 0);
    ck_assert_int_eq(code, 0);
}
END_TEST

/* With a long grace, a client that reconnects (the same Hello) finds its run and its alerts live;
 * a new Hello of the run clears its recorded end. */
START_TEST(test_reconnect_keeps_alerts)
{
    dh_rng rng = dh_rng_new("life_reconnect");
    dh_daemon d;
    dh_dir_init(&d);
    dh_start(&d, "--run-grace-ms", "600000", (const char *)NULL);
    trainer t;
    trainer_start(&t, &d, "back", "life_back");
    int64_t id = t.run_id;
    trainer_push(&rng, &t, 0, 1);
    ck_assert_uint_eq(active_now(&t.c), 2);
    trainer_end(&t);
    trainer_start(&t, &d, "back", "life_back2");
    ck_assert_int_eq(t.run_id, id);
    ck_assert_uint_eq(active_now(&t.c), 2);
    /* two good samples clear them, as before the reconnection */
    trainer_push(&rng, &t, 1, 0);
    trainer_push(&rng, &t, 2, 0);
    ck_assert_uint_eq(active_now(&t.c), 0);
    wait_db(&d, "SELECT count(*) FROM alerts WHERE state='cleared' AND step=2", 2, 30000);
    ck_assert_int_eq(db_int(&d, "SELECT count(*) FROM alerts WHERE state='resolved'"), 0);
    trainer_end(&t);
    int code = dh_stop(&d);
    dh_cleanup(&d, code != 0);
    ck_assert_int_eq(code, 0);
}
END_TEST

/* A connected client that stops pushing: its run ends ("idle") after run_idle_ms; its next push
 * resumes it (the recorded end cleared) and a bad sample raises again. */
START_TEST(test_idle_ends_and_push_resumes)
{
    dh_rng rng = dh_rng_new("life_idle");
    dh_daemon d;
    dh_dir_init(&d);
    dh_start(&d, "--run-idle-ms", "500", (const char *)NULL);
    dh_conn sub;
    dh_connect(&sub, &d);
    dh_subscribe(&sub, 1, 0);
    attnstat__envelope__free_unpacked(dh_status(&sub), NULL);
    trainer t;
    trainer_start(&t, &d, "sleepy", "life_idle");
    trainer_push(&rng, &t, 0, 1);
    wait_alerts(&sub, t.run_id, ATTNSTAT__ALERT_STATE__RAISED, NULL, 2, 30000);
    wait_alerts(&sub, t.run_id, ATTNSTAT__ALERT_STATE__RESOLVED, "idle", 2, 30000);
    wait_db(&d, "SELECT count(*) FROM runs WHERE name='sleepy' AND end_reason='idle'", 1, 30000);
    trainer_push(&rng, &t, 1, 1); /* resumes, and raises again */
    wait_alerts(&sub, t.run_id, ATTNSTAT__ALERT_STATE__RAISED, NULL, 2, 30000);
    wait_db(&d, "SELECT count(*) FROM runs WHERE name='sleepy' AND ended IS NULL", 1, 30000);
    trainer_end(&t);
    dh_close(&sub);
    int code = dh_stop(&d);
    dh_cleanup(&d, code != 0);
    ck_assert_int_eq(code, 0);
}
END_TEST

/* ---- operators ------------------------------------------------------------------------------ */

/* ack, resolve and silence by Command; /metrics counts each run's active and unacknowledged
 * alerts, and the run's series go once it has none. */
START_TEST(test_commands_and_metrics)
{
    dh_rng rng = dh_rng_new("life_commands");
    int port = dh_free_port();
    char portarg[16];
    snprintf(portarg, sizeof portarg, "%d", port);
    dh_daemon d;
    dh_dir_init(&d);
    dh_start(&d, "--run-grace-ms", "600000", "--metrics-port", portarg, (const char *)NULL);
    dh_conn sub, op;
    dh_connect(&sub, &d);
    dh_subscribe(&sub, 1, 0);
    attnstat__envelope__free_unpacked(dh_status(&sub), NULL);
    dh_connect(&op, &d);
    trainer t;
    trainer_start(&t, &d, "marked", "life_marked");
    trainer_push(&rng, &t, 0, 1);
    wait_alerts(&sub, t.run_id, ATTNSTAT__ALERT_STATE__RAISED, NULL, 2, 30000);
    wait_db(&d, "SELECT count(*) FROM alerts WHERE state='raised'", 2, 30000);
    int64_t ent = db_int(&d, "SELECT id FROM alerts WHERE rule='entropy_floor' AND state='raised'");
    int64_t lg = db_int(&d, "SELECT id FROM alerts WHERE rule='logit_ceiling' AND state='raised'");

    static char buf[1 << 21];
    char want[256];
    dh_scrape(port, buf, sizeof buf);
    snprintf(want, sizeof want, "attnstat_run_alerts_active{run=\"marked\",rank=\"0\",run_id=\"%lld\"} 2",
             (long long)t.run_id);
    ck_assert_msg(strstr(buf, want), "no '%s' in the scrape (%zu bytes)", want, strlen(buf));

    /* ack: still active, who and when kept; one unacknowledged left */
    Attnstat__Envelope *r = command(&op, ATTNSTAT__COMMAND__ACTION__ACK, ent, 0, 0);
    ck_assert_msg(r->command_reply->code == ATTNSTAT__CODE__OK, "ack: %s",
                  r->command_reply->message);
    ck_assert_uint_eq(r->command_reply->count, 1);
    attnstat__envelope__free_unpacked(r, NULL);
    char sql[256];
    snprintf(sql, sizeof sql, "SELECT count(*) FROM alerts WHERE id=%lld AND ack_uid=%u AND "
             "ack_time > 0", (long long)ent, (unsigned)getuid());
    wait_db(&d, sql, 1, 30000);
    ck_assert_uint_eq(active_now(&op), 2);
    dh_scrape(port, buf, sizeof buf);
    snprintf(want, sizeof want, "attnstat_run_alerts_unacknowledged{run=\"marked\",rank=\"0\","
             "run_id=\"%lld\"} 1", (long long)t.run_id);
    ck_assert_msg(strstr(buf, want), "no '%s' in the scrape (%zu bytes)", want, strlen(buf));

    /* resolve the other: delivered RESOLVED ("operator"), recorded with the uid */
    r = command(&op, ATTNSTAT__COMMAND__ACTION__RESOLVE, lg, 0, 0);
    ck_assert_msg(r->command_reply->code == ATTNSTAT__CODE__OK, "resolve: %s",
                  r->command_reply->message);
    attnstat__envelope__free_unpacked(r, NULL);
    wait_alerts(&sub, t.run_id, ATTNSTAT__ALERT_STATE__RESOLVED, "operator", 1, 30000);
    snprintf(sql, sizeof sql, "SELECT count(*) FROM alerts WHERE state='resolved' AND "
             "reason='operator' AND uid=%u AND rule='logit_ceiling'", (unsigned)getuid());
    wait_db(&d, sql, 1, 30000);
    ck_assert_uint_eq(active_now(&op), 1);
    /* resolving it again: it is not active */
    r = command(&op, ATTNSTAT__COMMAND__ACTION__RESOLVE, lg, 0, 0);
    ck_assert_int_ne(r->command_reply->code, ATTNSTAT__CODE__OK);
    attnstat__envelope__free_unpacked(r, NULL);

    /* silence every active alert of the run (the entropy one): kept with who */
    r = command(&op, ATTNSTAT__COMMAND__ACTION__SILENCE, 0, t.run_id, 0);
    ck_assert_msg(r->command_reply->code == ATTNSTAT__CODE__OK, "silence: %s",
                  r->command_reply->message);
    ck_assert_uint_eq(r->command_reply->count, 1);
    attnstat__envelope__free_unpacked(r, NULL);
    snprintf(sql, sizeof sql, "SELECT count(*) FROM silences WHERE rule='entropy_floor' AND "
             "uid=%u AND head=1 AND layer=2", (unsigned)getuid());
    wait_db(&d, sql, 1, 30000);
    /* good samples clear the entropy alert (silenced: not sent) ... */
    trainer_push(&rng, &t, 1, 0);
    trainer_push(&rng, &t, 2, 0);
    wait_db(&d, "SELECT count(*) FROM alerts WHERE state='cleared' AND rule='entropy_floor'", 1,
            30000);
    /* ... and a bad one raises both again: only logit_ceiling's raise reaches the subscriber. */
    trainer_push(&rng, &t, 3, 1);
    int other = wait_alerts(&sub, t.run_id, ATTNSTAT__ALERT_STATE__RAISED, NULL, 1, 30000);
    ck_assert_int_eq(other, 0);
    wait_db(&d, "SELECT count(*) FROM alerts WHERE state='raised' AND step=3", 2, 30000);
    attnstat__envelope__free_unpacked(dh_status(&sub), NULL); /* everything before it arrived */
    Attnstat__Envelope *e;
    while ((e = dh_recv(&sub, 200)) != NULL) {
        ck_assert_msg(e->msg_case != ATTNSTAT__ENVELOPE__MSG_ALERT ||
                          e->alert->rule != ATTNSTAT__ALERT_RULE__ENTROPY_FLOOR,
                      "a silenced alert was sent (state %d)", e->alert->state);
        attnstat__envelope__free_unpacked(e, NULL);
    }

    /* the run ends: its series go */
    trainer_goodbye(&t);
    trainer_end(&t);
    wait_alerts(&sub, t.run_id, ATTNSTAT__ALERT_STATE__RESOLVED, "goodbye", 1, 30000);
    ck_assert_uint_eq(active_now(&op), 0);
    dh_scrape(port, buf, sizeof buf);
    ck_assert_msg(!strstr(buf, "attnstat_run_alerts_active{run=\"marked\""), "series of an ended "
                  "run: %.300s", strstr(buf, "attnstat_run_alerts_active{run=\"marked\""));
    ck_assert_msg(strstr(buf, "attnstat_runs_live 0"), "runs_live not 0: %.100s",
                  strstr(buf, "attnstat_runs_live"));

    /* bad requests: neither an alert nor a run, an unknown run */
    r = command(&op, ATTNSTAT__COMMAND__ACTION__ACK, 0, 0, 0);
    ck_assert_int_eq(r->command_reply->code, ATTNSTAT__CODE__BAD_REQUEST);
    attnstat__envelope__free_unpacked(r, NULL);
    r = command(&op, ATTNSTAT__COMMAND__ACTION__ACK, 0, 9999, 0);
    ck_assert_int_eq(r->command_reply->code, ATTNSTAT__CODE__BAD_REQUEST);
    attnstat__envelope__free_unpacked(r, NULL);

    dh_close(&op);
    dh_close(&sub);
    int code = dh_stop(&d);
    dh_cleanup(&d, code != 0);
    ck_assert_int_eq(code, 0);
}
END_TEST

/* ---- the exporter and the end of a run ------------------------------------------------------ */

/* "name{labels} " is on the page. */
static int has_series(const char *page, const char *name, const char *labels)
{
    char key[512];
    snprintf(key, sizeof key, "\n%s{%s} ", name, labels);
    return strstr(page, key) != NULL;
}

/* The value of name{labels}; NAN when the page has no such series. */
static double series_value(const char *page, const char *name, const char *labels)
{
    char key[512];
    snprintf(key, sizeof key, "\n%s{%s} ", name, labels);
    const char *p = strstr(page, key);
    return p ? strtod(p + strlen(key), NULL) : NAN;
}

/* Every live process's thresholds are on /metrics (its own where its Hello gave them), and so are
 * its acknowledged and silenced alerts; once the run ends (Goodbye) nothing labelled with it is
 * left on the page, while the other run's series stay. */
START_TEST(test_ended_run_leaves_metrics)
{
    dh_rng rng = dh_rng_new("life_metrics_end");
    int port = dh_free_port();
    char portarg[16];
    snprintf(portarg, sizeof portarg, "%d", port);
    dh_daemon d;
    dh_dir_init(&d);
    dh_start(&d, "--run-grace-ms", "600000", "--metrics-port", portarg, "--metrics-heads", "all",
             (const char *)NULL);
    dh_conn sub, op;
    dh_connect(&sub, &d);
    dh_subscribe(&sub, 1, 0);
    attnstat__envelope__free_unpacked(dh_status(&sub), NULL);
    dh_connect(&op, &d);
    trainer t, other;
    trainer_start(&t, &d, "left", "life_left");             /* its own ceiling: 5 */
    trainer_start_th(&other, &d, "stays", "life_stays", NULL); /* the daemon's thresholds */
    trainer_push(&rng, &t, 0, 1);
    trainer_push(&rng, &other, 0, 0);
    wait_alerts(&sub, t.run_id, ATTNSTAT__ALERT_STATE__RAISED, NULL, 2, 30000);
    wait_db(&d, "SELECT count(*) FROM alerts WHERE state='raised'", 2, 30000);
    int64_t ent = db_int(&d, "SELECT id FROM alerts WHERE rule='entropy_floor' AND state='raised'");
    int64_t lg = db_int(&d, "SELECT id FROM alerts WHERE rule='logit_ceiling' AND state='raised'");
    Attnstat__Envelope *r = command(&op, ATTNSTAT__COMMAND__ACTION__ACK, ent, 0, 0);
    ck_assert_int_eq(r->command_reply->code, ATTNSTAT__CODE__OK);
    attnstat__envelope__free_unpacked(r, NULL);
    r = command(&op, ATTNSTAT__COMMAND__ACTION__SILENCE, lg, 0, 0);
    ck_assert_int_eq(r->command_reply->code, ATTNSTAT__CODE__OK);
    attnstat__envelope__free_unpacked(r, NULL);

    static char page[1 << 21];
    dh_scrape(port, page, sizeof page);
    char lab[256];
    snprintf(lab, sizeof lab, "run=\"left\",rank=\"0\",run_id=\"%lld\",rule=\"logit_ceiling\"",
             (long long)t.run_id);
    ck_assert_double_eq(series_value(page, "attnstat_run_threshold", lab), 5);
    snprintf(lab, sizeof lab, "run=\"stays\",rank=\"0\",run_id=\"%lld\",rule=\"logit_ceiling\"",
             (long long)other.run_id);
    ck_assert_double_eq(series_value(page, "attnstat_run_threshold", lab), 100);
    snprintf(lab, sizeof lab, "run=\"stays\",rank=\"0\",run_id=\"%lld\",rule=\"entropy_floor\"",
             (long long)other.run_id);
    ck_assert_double_eq(series_value(page, "attnstat_run_threshold", lab), 0.1);
    ck_assert(has_series(page, "attnstat_head_alert_acknowledged",
                         "run=\"left\",layer=\"2\",head=\"1\",rule=\"entropy_floor\""));
    ck_assert(!has_series(page, "attnstat_head_alert_acknowledged",
                          "run=\"left\",layer=\"2\",head=\"1\",rule=\"logit_ceiling\""));
    ck_assert(has_series(page, "attnstat_head_silenced",
                         "run=\"left\",layer=\"2\",head=\"1\",rule=\"logit_ceiling\""));
    ck_assert(!has_series(page, "attnstat_head_silenced",
                          "run=\"left\",layer=\"2\",head=\"1\",rule=\"entropy_floor\""));
    ck_assert(has_series(page, "attnstat_head_alert",
                         "run=\"left\",layer=\"2\",head=\"1\",rule=\"entropy_floor\""));
    ck_assert(has_series(page, "attnstat_head_max_logit", "run=\"left\",layer=\"2\",head=\"0\""));

    trainer_goodbye(&t);
    trainer_end(&t);
    /* both resolved, one of them silenced: not sent */
    wait_alerts(&sub, t.run_id, ATTNSTAT__ALERT_STATE__RESOLVED, "goodbye", 1, 30000);
    wait_db(&d, "SELECT count(*) FROM alerts WHERE state='resolved' AND reason='goodbye'", 2,
            30000);
    dh_scrape(port, page, sizeof page);
    ck_assert_msg(!strstr(page, "run=\"left\""), "a series of the ended run: %.200s",
                  strstr(page, "run=\"left\""));
    ck_assert(has_series(page, "attnstat_head_max_logit", "run=\"stays\",layer=\"2\",head=\"1\""));
    ck_assert(has_series(page, "attnstat_layer_heads", "run=\"stays\",layer=\"2\""));
    snprintf(lab, sizeof lab, "run=\"stays\",rank=\"0\",run_id=\"%lld\",rule=\"entropy_drop\"",
             (long long)other.run_id);
    ck_assert_double_eq(series_value(page, "attnstat_run_threshold", lab), 0.5);
    trainer_end(&other);
    dh_close(&op);
    dh_close(&sub);
    int code = dh_stop(&d);
    dh_cleanup(&d, code != 0);
    ck_assert_int_eq(code, 0);
}
END_TEST

/* attnstat_run_info: one series per label set, its value the processes that have it (two clients
 * of one run that both say rank 0, as a job whose ranks are left at 0 does, and a third with rank
 * 1); a run that ends for idleness with its clients still connected leaves it, as its other series
 * do, and comes back when it resumes. */
START_TEST(test_run_info_counts_and_idle_end)
{
    dh_rng rng = dh_rng_new("life_run_info");
    int port = dh_free_port();
    char portarg[16];
    snprintf(portarg, sizeof portarg, "%d", port);
    dh_daemon d;
    dh_dir_init(&d);
    dh_start(&d, "--run-idle-ms", "700", "--metrics-port", portarg, (const char *)NULL);
    trainer a, b;
    trainer_start(&a, &d, "dup", "life_dup_a");
    trainer_start(&b, &d, "dup", "life_dup_b");
    dh_conn c;
    dh_connect(&c, &d);
    int64_t cid = 0;
    dh_hello(&c, "dup", 1, &cid); /* a run of its own (name and rank), the same name */
    ck_assert_int_eq(b.run_id, a.run_id);
    trainer_push(&rng, &a, 0, 0);
    static char page[1 << 21];
    const char *l0 = "run=\"dup\",rank=\"0\",tp_rank=\"0\",tp_size=\"1\",pp_rank=\"0\","
                     "pp_size=\"1\",dp_rank=\"0\",dp_size=\"1\",cp_rank=\"0\",cp_size=\"1\","
                     "layer_offset=\"0\"";
    const char *l1 = "run=\"dup\",rank=\"1\",tp_rank=\"0\",tp_size=\"1\",pp_rank=\"0\","
                     "pp_size=\"1\",dp_rank=\"0\",dp_size=\"1\",cp_rank=\"0\",cp_size=\"1\","
                     "layer_offset=\"0\"";
    dh_scrape(port, page, sizeof page);
    ck_assert_double_eq(series_value(page, "attnstat_run_info", l0), 2);
    ck_assert_double_eq(series_value(page, "attnstat_run_info", l1), 1);
    char key[512];
    snprintf(key, sizeof key, "\nattnstat_run_info{%s} ", l0);
    const char *first = strstr(page, key);
    ck_assert_ptr_nonnull(first);
    ck_assert_msg(!strstr(first + 1, key), "attnstat_run_info{%s} twice", l0);
    /* idle: every client stays connected and pushes nothing */
    wait_db(&d, "SELECT count(*) FROM runs WHERE name='dup' AND end_reason='idle'", 2, 30000);
    dh_scrape(port, page, sizeof page);
    ck_assert_msg(!strstr(page, "run=\"dup\""), "a series of the idle run: %.200s",
                  strstr(page, "run=\"dup\""));
    trainer_push(&rng, &b, 1, 0); /* resumes */
    wait_db(&d, "SELECT count(*) FROM runs WHERE name='dup' AND ended IS NULL", 1, 30000);
    dh_scrape(port, page, sizeof page);
    ck_assert_double_eq(series_value(page, "attnstat_run_info", l0), 2);
    ck_assert(!has_series(page, "attnstat_run_info", l1)); /* rank 1's run is still idle */
    dh_close(&c);
    trainer_end(&a);
    trainer_end(&b);
    int code = dh_stop(&d);
    dh_cleanup(&d, code != 0);
    ck_assert_int_eq(code, 0);
}
END_TEST

/* A run whose client went away is still live (it may come back within run_grace_ms): its series
 * stay. Deleted, it leaves the page, its alerts and thresholds with it. */
START_TEST(test_deleted_run_leaves_metrics)
{
    dh_rng rng = dh_rng_new("life_metrics_delete");
    int port = dh_free_port();
    char portarg[16];
    snprintf(portarg, sizeof portarg, "%d", port);
    dh_daemon d;
    dh_dir_init(&d);
    dh_start(&d, "--run-grace-ms", "600000", "--metrics-port", portarg, (const char *)NULL);
    dh_conn op;
    dh_connect(&op, &d);
    trainer t;
    trainer_start(&t, &d, "doomed", "life_doomed");
    trainer_push(&rng, &t, 0, 1);
    int64_t id = t.run_id;
    trainer_end(&t); /* no Goodbye: the run waits for its client */
    wait_db(&d, "SELECT count(*) FROM alerts WHERE state='raised'", 2, 30000);
    static char page[1 << 21];
    dh_scrape(port, page, sizeof page);
    ck_assert(has_series(page, "attnstat_head_alert",
                         "run=\"doomed\",layer=\"2\",head=\"1\",rule=\"logit_ceiling\""));
    ck_assert(has_series(page, "attnstat_layer_max_logit", "run=\"doomed\",layer=\"2\""));
    Attnstat__Envelope *r = command(&op, ATTNSTAT__COMMAND__ACTION__DELETE_RUN, 0, id, 0);
    ck_assert_msg(r->command_reply->code == ATTNSTAT__CODE__OK, "delete-run: %s",
                  r->command_reply->message);
    attnstat__envelope__free_unpacked(r, NULL);
    dh_scrape(port, page, sizeof page);
    ck_assert_msg(!strstr(page, "run=\"doomed\""), "a series of the deleted run: %.200s",
                  strstr(page, "run=\"doomed\""));
    ck_assert_msg(strstr(page, "\nattnstat_metrics_heads 0\n"), "heads kept: %.60s",
                  strstr(page, "\nattnstat_metrics_heads "));
    dh_close(&op);
    int code = dh_stop(&d);
    dh_cleanup(&d, code != 0);
    ck_assert_int_eq(code, 0);
}
END_TEST

/* ---- restart -------------------------------------------------------------------------------- */

/* A run that said Goodbye stays ended across a restart; one whose client was still connected at
 * the shutdown comes back live (its alerts restored) and, with nobody coming back, ends after the
 * new daemon's grace ("disconnected"). */
START_TEST(test_restart_restores_only_live)
{
    dh_rng rng = dh_rng_new("life_restart");
    dh_daemon d;
    dh_dir_init(&d);
    dh_start(&d, "--run-grace-ms", "600000", (const char *)NULL);
    trainer a, b;
    trainer_start(&a, &d, "finished", "life_fin");
    trainer_start(&b, &d, "running", "life_run");
    trainer_push(&rng, &a, 0, 1);
    trainer_push(&rng, &b, 0, 1);
    ck_assert_uint_eq(active_now(&a.c), 4);
    trainer_goodbye(&a);
    trainer_end(&a);
    int64_t deadline = dh_now_ms() + 30000;
    while (active_now(&b.c) != 2 && dh_now_ms() < deadline)
        dh_sleep_ms(50);
    ck_assert_uint_eq(active_now(&b.c), 2);
    int64_t bid = b.run_id;
    trainer_end(&b);
    int rc = dh_stop(&d);
    ck_assert_int_eq(rc, 0);
    ck_assert_int_eq(db_int(&d, "SELECT count(*) FROM runs WHERE name='running' AND ended IS NOT "
                                "NULL"), 0); /* a shutdown ends no run */

    /* The next daemon restores the live run's two alerts, not the ended run's. */
    dh_start(&d, "--run-grace-ms", "600000", (const char *)NULL);
    dh_conn sub;
    dh_connect(&sub, &d);
    ck_assert_uint_eq(active_now(&sub), 2);
    dh_close(&sub);
    rc = dh_stop(&d);
    ck_assert_int_eq(rc, 0);
    /* With nobody coming back, the live run ends after the grace of the daemon after that. */
    dh_start(&d, "--run-grace-ms", "300", (const char *)NULL);
    dh_connect(&sub, &d);
    char sql[200];
    snprintf(sql, sizeof sql, "SELECT count(*) FROM alerts WHERE run_id=%lld AND state='resolved' "
             "AND reason='disconnected'", (long long)bid);
    wait_db(&d, sql, 2, 30000);
    ck_assert_uint_eq(active_now(&sub), 0);
    ck_assert_int_eq(db_int(&d, "SELECT count(*) FROM alerts a JOIN runs r ON r.id=a.run_id WHERE "
                                "r.name='finished' AND a.state='resolved'"), 2);
    dh_close(&sub);
    int code = dh_stop(&d);
    dh_cleanup(&d, code != 0);
    ck_assert_int_eq(code, 0);
}
END_TEST

/* ---- retention ------------------------------------------------------------------------------ */

static Attnstat__Envelope *store_status(dh_conn *c)
{
    Attnstat__Envelope *st = dh_status(c);
    ck_assert_msg(st->status_reply->store != NULL, "no StoreStatus in the StatusReply");
    return st;
}

/* The retention runs in the background on the store thread: with one exact step and an age limit
 * of under a second, older steps are packed and then downsampled (StoreStatus counts them), while
 * pushes go on being stored and acknowledged. */
START_TEST(test_retention_in_background)
{
    dh_rng rng = dh_rng_new("life_retention");
    dh_daemon d;
    dh_dir_init(&d);
    dh_start(&d, "--retain-exact-steps", "1", "--retain-interval-ms", "10", "--retain-days",
             "0.00001", "--retain-bucket-steps", "2", (const char *)NULL);
    trainer t;
    trainer_start(&t, &d, "kept", "life_kept");
    for (int step = 0; step < 12; step++)
        trainer_push(&rng, &t, step, 0);
    Attnstat__Envelope *st = store_status(&t.c);
    int64_t age = st->status_reply->store->retain_ms; /* 0.00001 days */
    ck_assert_msg(age >= 863 && age <= 864, "retain_ms %lld", (long long)age);
    ck_assert_str_eq(st->status_reply->store->durability, "normal");
    attnstat__envelope__free_unpacked(st, NULL);
    int64_t deadline = dh_now_ms() + 60000;
    uint64_t compacted = 0, downsampled = 0;
    int step = 12;
    while (dh_now_ms() < deadline && (compacted == 0 || downsampled == 0)) {
        trainer_push(&rng, &t, step++, 0); /* ingest goes on meanwhile */
        st = store_status(&t.c);
        compacted = st->status_reply->store->compacted;
        downsampled = st->status_reply->store->downsampled;
        attnstat__envelope__free_unpacked(st, NULL);
        dh_sleep_ms(100);
    }
    ck_assert_msg(compacted > 0 && downsampled > 0, "after 60 s: %llu compacted, %llu downsampled",
                  (unsigned long long)compacted, (unsigned long long)downsampled);
    trainer_end(&t);
    int code = dh_stop(&d);
    dh_cleanup(&d, code != 0);
    ck_assert_int_eq(code, 0);
}
END_TEST

static Suite *life_suite(void)
{
    Suite *s = suite_create("daemon_life");
    TCase *tc = tcase_create("life");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, test_goodbye_resolves);
    tcase_add_test(tc, test_disconnect_grace);
    tcase_add_test(tc, test_reconnect_keeps_alerts);
    tcase_add_test(tc, test_idle_ends_and_push_resumes);
    tcase_add_test(tc, test_commands_and_metrics);
    tcase_add_test(tc, test_ended_run_leaves_metrics);
    tcase_add_test(tc, test_deleted_run_leaves_metrics);
    tcase_add_test(tc, test_run_info_counts_and_idle_end);
    tcase_add_test(tc, test_restart_restores_only_live);
    tcase_add_test(tc, test_retention_in_background);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return dh_run(life_suite());
}
