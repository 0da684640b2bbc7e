/* test_daemon_alerts.c — alerts end to end through a real attnstatd: a head whose attention
 * collapses onto one key (normalised entropy near 0, logits over the ceiling) raises
 * ENTROPY_FLOOR and LOGIT_CEILING after raise_after bad samples and clears them after clear_after
 * good ones (hysteresis); NaN in Q raises NONFINITE at once. Each transition reaches a Subscribe'd
 * connection (Alert), the alerts table, and the --alert-exec command's environment. The run's
 * thresholds come from its Hello and override the daemon's configuration. An operator's requests
 * on the wire: UNSILENCE (one silence or a run's; bad requests, another uid refused) and
 * RETENTION (a limit the request leaves out stays as it is). */
#include "daemon_harness.h"

#include <grp.h>

enum { H = 2, N = 32, D = 16 };

/* good: small random q (flat attention); bad: head 1's query rows are 5x a key row each. */
static void fill_step(dh_rng *rng, float *q, const float *k, int bad, int nan)
{
    for (int h = 0; h < H; h++)
        for (int i = 0; i < N; i++)
            for (int d = 0; d < D; d++) {
                float *dst = &q[(h * N + i) * D + d];
                if (bad && h == 1)
                    *dst = 5.0f * k[(0 * N + (i * 7) % N) * D + d]; /* K has one head */
                else
                    *dst = (float)(0.05 * dh_gauss(rng));
            }
    if (nan)
        q[3] = NAN; /* head 0, row 0 */
}

typedef struct {
    int rule, state, head;
    int64_t step;
} seen_alert;

START_TEST(test_alerts_raise_and_clear)
{
    dh_rng rng = dh_rng_new("alerts_raise_and_clear");
    dh_daemon d;
    dh_dir_init(&d);
    char exec_cmd[512], exec_log[300];
    snprintf(exec_log, sizeof exec_log, "%s/exec.log", d.dir);
    snprintf(exec_cmd, sizeof exec_cmd,
             "echo \"$ATTNSTAT_RUN $ATTNSTAT_LAYER $ATTNSTAT_HEAD $ATTNSTAT_STEP $ATTNSTAT_RULE "
             "$ATTNSTAT_STATE $ATTNSTAT_VALUE $ATTNSTAT_THRESHOLD\" >> %s", exec_log);
    /* The configured ceiling is high: only the run's own (5) makes the logits bad. */
    dh_start(&d, "--logit-ceiling", "1000", "--alert-exec", exec_cmd, (const char *)NULL);

    dh_conn sub;
    dh_connect(&sub, &d);
    dh_subscribe(&sub, 1, 1);
    attnstat__envelope__free_unpacked(dh_status(&sub), NULL); /* subscription in place */

    dh_conn c;
    dh_connect(&c, &d);
    Attnstat__Thresholds th = ATTNSTAT__THRESHOLDS__INIT;
    th.has_logit_ceiling = 1;
    th.logit_ceiling = 5.0;
    th.has_raise_after = 1;
    th.raise_after = 2;
    th.has_clear_after = 1;
    th.clear_after = 2;
    int64_t run_id;
    dh_hello_th(&c, "alerting", 0, &th, &run_id);

    dh_tensor q, k;
    dh_tensor_contig(&q, 1, 0, ATTNSTAT__DTYPE__F32, 1, H, N, D);
    uint64_t qbytes = dh_tensor_elems(&q) * 4;
    dh_tensor_contig(&k, 1, qbytes, ATTNSTAT__DTYPE__F32, 1, 1, N, D);
    dh_shm shm;
    dh_shm_create(&shm, "alerts", qbytes + dh_tensor_elems(&k) * 4);
    float *qp = shm.ptr, *kp = (float *)((char *)shm.ptr + qbytes);
    dh_register(&c, 1, shm.name, shm.size);

    /* steps 0-2 good, 3-5 bad (raise at 4), 6-8 good (clear at 7), 9 NaN (NONFINITE now). */
    for (int step = 0; step < 10; step++) {
        dh_fill(&rng, kp, dh_tensor_elems(&k), k.dtype, 1.0);
        fill_step(&rng, qp, kp, step >= 3 && step <= 5, step == 9);
        dh_push(&c, (uint64_t)step + 1, step, 2, &q, &k, 0, 0, 0);
        char msg[256];
        int code = dh_wait_ack(&c, (uint64_t)step + 1, msg, sizeof msg, 30000);
        ck_assert_msg(code == ATTNSTAT__CODE__OK, "step %d: code %d %s", step, code, msg);
    }

    /* The subscriber's view: Results for every push, and exactly these Alerts. */
    seen_alert want[] = {
        {ATTNSTAT__ALERT_RULE__ENTROPY_FLOOR, ATTNSTAT__ALERT_STATE__RAISED, 1, 4},
        {ATTNSTAT__ALERT_RULE__LOGIT_CEILING, ATTNSTAT__ALERT_STATE__RAISED, 1, 4},
        {ATTNSTAT__ALERT_RULE__ENTROPY_FLOOR, ATTNSTAT__ALERT_STATE__CLEARED, 1, 7},
        {ATTNSTAT__ALERT_RULE__LOGIT_CEILING, ATTNSTAT__ALERT_STATE__CLEARED, 1, 7},
        {ATTNSTAT__ALERT_RULE__NONFINITE, ATTNSTAT__ALERT_STATE__RAISED, 0, 9},
    };
    size_t nwant = sizeof want / sizeof want[0], got = 0;
    int results = 0;
    while (got < nwant || results < 10) {
        Attnstat__Envelope *e = dh_recv(&sub, 20000);
        ck_assert_msg(e != NULL, "subscriber: %zu of %zu alerts and %d of 10 results arrived", got,
                      nwant, results);
        if (e->msg_case == ATTNSTAT__ENVELOPE__MSG_RESULT) {
            ck_assert_str_eq(e->result->run, "alerting");
            ck_assert_uint_eq(e->result->layer, 2);
            ck_assert_uint_eq(e->result->n_heads, H);
            results++;
        } else if (e->msg_case == ATTNSTAT__ENVELOPE__MSG_ALERT) {
            Attnstat__Alert *a = e->alert;
            ck_assert_msg(got < nwant, "unexpected extra alert rule %d state %d head %u step %lld",
                          a->rule, a->state, a->head, (long long)a->step);
            ck_assert_str_eq(a->run, "alerting");
            ck_assert_int_eq(a->run_id, run_id);
            ck_assert_uint_eq(a->layer, 2);
            ck_assert_msg((int)a->rule == want[got].rule && (int)a->state == want[got].state &&
                              (int)a->head == want[got].head && a->step == want[got].step,
                          "alert %zu: rule %d state %d head %u step %lld; expected rule %d state %d "
                          "head %d step %lld",
                          got, a->rule, a->state, a->head, (long long)a->step, want[got].rule,
                          want[got].state, want[got].head, (long long)want[got].step);
            if (a->rule == ATTNSTAT__ALERT_RULE__LOGIT_CEILING && a->state == ATTNSTAT__ALERT_STATE__RAISED) {
                ck_assert(a->has_threshold && a->threshold == 5.0);
                ck_assert(a->has_value && a->value > 5.0);
            }
            got++;
        }
        attnstat__envelope__free_unpacked(e, NULL);
    }

    /* The alerts table. */
    sqlite3 *db = dh_db_open(&d);
    char sql[256];
    snprintf(sql, sizeof sql, "SELECT count(*) FROM alerts WHERE run_id=%lld", (long long)run_id);
    ck_assert_int_eq(dh_db_int(db, sql), (int64_t)nwant);
    ck_assert_int_eq(dh_db_int(db, "SELECT count(*) FROM alerts WHERE rule='logit_ceiling' AND "
                                   "state='raised' AND step=4 AND head=1 AND layer=2 AND threshold=5"),
                     1);
    ck_assert_int_eq(dh_db_int(db, "SELECT count(*) FROM alerts WHERE rule='entropy_floor' AND "
                                   "state='cleared' AND step=7 AND head=1"),
                     1);
    ck_assert_int_eq(dh_db_int(db, "SELECT count(*) FROM alerts WHERE rule='nonfinite' AND "
                                   "state='raised' AND step=9 AND head=0"),
                     1);
    ck_assert_int_eq(dh_db_int(db, "SELECT count(*) FROM alerts WHERE head=0 AND rule!='nonfinite'"), 0);
    sqlite3_close(db);

    Attnstat__Envelope *st = dh_status(&sub);
    ck_assert_uint_eq(st->status_reply->alerts_active, 1); /* NONFINITE on head 0 */
    attnstat__envelope__free_unpacked(st, NULL);

    /* The exec sink: one line per transition, with the alert in its environment. */
    int64_t deadline = dh_now_ms() + 20000;
    int lines = 0;
    char buf[4096] = "";
    while (dh_now_ms() < deadline) {
        FILE *f = fopen(exec_log, "r");
        lines = 0;
        buf[0] = '\0';
        if (f) {
            size_t n = fread(buf, 1, sizeof buf - 1, f);
            buf[n] = '\0';
            fclose(f);
            for (size_t i = 0; i < n; i++)
                lines += buf[i] == '\n';
        }
        if (lines >= (int)nwant)
            break;
        dh_sleep_ms(50);
    }
    ck_assert_msg(lines == (int)nwant, "alert_exec ran %d times, expected %zu:\n%s", lines, nwant, buf);
    ck_assert_msg(strstr(buf, "alerting 2 1 4 logit_ceiling raised "), "exec log:\n%s", buf);
    ck_assert_msg(strstr(buf, "alerting 2 1 7 entropy_floor cleared "), "exec log:\n%s", buf);
    ck_assert_msg(strstr(buf, "alerting 2 0 9 nonfinite raised "), "exec log:\n%s", buf);

    dh_close(&c);
    dh_close(&sub);
    dh_shm_destroy(&shm);
    int code = dh_stop(&d);
    dh_cleanup(&d, code != 0);
    ck_assert_int_eq(code, 0);
}
END_TEST

/* Alerts raised before a restart are taken back by the new daemon's engine: good samples after
 * the restart clear them in the alerts table, and nothing is left active. */
START_TEST(test_alerts_survive_restart)
{
    dh_rng rng = dh_rng_new("alerts_restart");
    dh_daemon d;
    dh_dir_init(&d);
    dh_start(&d, "--logit-ceiling", "1000", (const char *)NULL);
    Attnstat__Thresholds th = ATTNSTAT__THRESHOLDS__INIT;
    th.has_logit_ceiling = 1;
    th.logit_ceiling = 5.0;
    th.has_raise_after = 1;
    th.raise_after = 1;
    th.has_clear_after = 1;
    th.clear_after = 2;

    dh_tensor q, k;
    dh_tensor_contig(&q, 1, 0, ATTNSTAT__DTYPE__F32, 1, H, N, D);
    uint64_t qbytes = dh_tensor_elems(&q) * 4;
    dh_tensor_contig(&k, 1, qbytes, ATTNSTAT__DTYPE__F32, 1, 1, N, D);
    dh_shm shm;
    dh_shm_create(&shm, "restart", qbytes + dh_tensor_elems(&k) * 4);
    float *qp = shm.ptr, *kp = (float *)((char *)shm.ptr + qbytes);
    char msg[256];

    /* First daemon: one bad sample raises LOGIT_CEILING (and ENTROPY_FLOOR) on head 1. */
    dh_conn c;
    dh_connect(&c, &d);
    int64_t run_id = 0, run_id2 = 0;
    dh_hello_th(&c, "restarting", 3, &th, &run_id);
    dh_register(&c, 1, shm.name, shm.size);
    dh_fill(&rng, kp, dh_tensor_elems(&k), k.dtype, 1.0);
    fill_step(&rng, qp, kp, 1, 0);
    dh_push(&c, 1, 0, 2, &q, &k, 0, 0, 0);
    int code = dh_wait_ack(&c, 1, msg, sizeof msg, 30000);
    ck_assert_msg(code == ATTNSTAT__CODE__OK, "bad push: code %d %s", code, msg);
    dh_close(&c);
    int rc1 = dh_stop(&d);
    ck_assert_int_eq(rc1, 0);

    static const char active_sql[] =
        "SELECT count(*) FROM alerts a WHERE a.state='raised' AND a.id = (SELECT max(b.id) FROM "
        "alerts b WHERE b.run_id=a.run_id AND b.layer=a.layer AND b.head=a.head AND b.rule=a.rule)";
    sqlite3 *db = dh_db_open(&d);
    int64_t raised = dh_db_int(db, active_sql);
    ck_assert_int_ge(dh_db_int(db, "SELECT count(*) FROM alerts WHERE rule='logit_ceiling' AND "
                                   "state='raised' AND head=1 AND layer=2 AND step=0"),
                     1);
    sqlite3_close(db);
    ck_assert_int_ge(raised, 1);

    /* Second daemon on the same database: the same run comes back and its head recovers. */
    dh_start(&d, "--logit-ceiling", "1000", (const char *)NULL);
    dh_connect(&c, &d);
    Attnstat__Envelope *st = dh_status(&c);
    ck_assert_uint_eq(st->status_reply->alerts_active, (uint32_t)raised); /* restored at start */
    attnstat__envelope__free_unpacked(st, NULL);
    dh_hello_th(&c, "restarting", 3, &th, &run_id2);
    ck_assert_int_eq(run_id2, run_id);
    dh_register(&c, 1, shm.name, shm.size);
    for (int step = 1; step <= 2; step++) {
        dh_fill(&rng, kp, dh_tensor_elems(&k), k.dtype, 1.0);
        fill_step(&rng, qp, kp, 0, 0);
        dh_push(&c, (uint64_t)step + 1, step, 2, &q, &k, 0, 0, 0);
        code = dh_wait_ack(&c, (uint64_t)step + 1, msg, sizeof msg, 30000);
        ck_assert_msg(code == ATTNSTAT__CODE__OK, "good push %d: code %d %s", step, code, msg);
    }
    st = dh_status(&c);
    uint32_t active_after = st->status_reply->alerts_active;
    attnstat__envelope__free_unpacked(st, NULL);
    dh_close(&c);
    dh_shm_destroy(&shm);
    int rc2 = dh_stop(&d);

    db = dh_db_open(&d);
    int64_t active_left = dh_db_int(db, active_sql);
    int64_t cleared = dh_db_int(db, "SELECT count(*) FROM alerts WHERE rule='logit_ceiling' AND "
                                    "state='cleared' AND head=1 AND layer=2 AND step=2");
    sqlite3_close(db);
    dh_cleanup(&d, rc2 != 0 || active_left != 0 || cleared != 1 || active_after != 0);
    ck_assert_int_eq(rc2, 0);
    ck_assert_msg(cleared == 1, "logit_ceiling was not cleared at step 2 after the restart");
    ck_assert_msg(active_left == 0, "%lld alerts still active in the table", (long long)active_left);
    ck_assert_uint_eq(active_after, 0);
}
END_TEST

/* A batch that is rolled back must not move the alert engine. The database lives on a small
 * tmpfs (needs root: skipped otherwise) that a filler file leaves full: a bad sample of a few
 * heads and a push of 4096 heads fail with SQLITE_FULL and their transactions are rolled back
 * (the store thread commits as soon as its queue drains, so the two may or may not share one: the
 * disk is full for either). With the filler gone, the next bad sample must raise the alert (and
 * the alerts table must hold it): the rolled-back sample must not have raised it silently. */
START_TEST(test_rolled_back_batch_does_not_eat_transitions)
{
    char mnt[64] = "/tmp/attnstat-test-full-XXXXXX";
    ck_assert_ptr_nonnull(mkdtemp(mnt));
    char cmd[256];
    snprintf(cmd, sizeof cmd, "mount -t tmpfs -o size=2m tmpfs %s 2>/dev/null", mnt);
    if (geteuid() != 0 || system(cmd) != 0) {
        fprintf(stderr, "rollback_alerts: SKIPPED (needs root to mount a small tmpfs)\n");
        rmdir(mnt);
        return;
    }
    dh_rng rng = dh_rng_new("rollback_alerts");
    dh_daemon d;
    dh_dir_init(&d);
    snprintf(d.db, sizeof d.db, "%s/attnstat.db", mnt);
    dh_start(&d, "--commit-ms", "1000", (const char *)NULL);
    dh_conn c;
    dh_connect(&c, &d);
    Attnstat__Thresholds th = ATTNSTAT__THRESHOLDS__INIT;
    th.has_logit_ceiling = 1;
    th.logit_ceiling = 0.000001; /* every sample is bad */
    th.has_raise_after = 1;
    th.raise_after = 1;
    dh_hello_th(&c, "rollback", 0, &th, NULL);
    enum { BIGH = 4096 };
    dh_tensor q, k, bq, bk;
    dh_tensor_contig(&q, 1, 0, ATTNSTAT__DTYPE__F32, 1, H, N, D);
    uint64_t qbytes = dh_tensor_elems(&q) * 4;
    dh_tensor_contig(&k, 1, qbytes, ATTNSTAT__DTYPE__F32, 1, 1, N, D);
    dh_tensor_contig(&bq, 1, 0, ATTNSTAT__DTYPE__F32, 1, BIGH, 1, D);
    bq.strides[1] = 0; /* every head reads the same row */
    dh_tensor_contig(&bk, 1, qbytes, ATTNSTAT__DTYPE__F32, 1, 1, N, D);
    dh_shm shm;
    dh_shm_create(&shm, "rollback", qbytes + dh_tensor_elems(&k) * 4);
    dh_fill(&rng, shm.ptr, shm.size / 4, ATTNSTAT__DTYPE__F32, 1.0);
    dh_register(&c, 1, shm.name, shm.size);
    attnstat__envelope__free_unpacked(dh_status(&c), NULL);

    /* Nothing left free. */
    snprintf(cmd, sizeof cmd, "dd if=/dev/zero of=%s/filler bs=4k count=2048 2>/dev/null; sync", mnt);
    if (system(cmd) != 0) { /* dd stops at ENOSPC; that is the point */
    }
    dh_push(&c, 1, 1, 0, &q, &k, 0, 0, 0);
    dh_push(&c, 2, 1, 1, &bq, &bk, 0, 0, 0);
    char msg[512];
    int code1 = dh_wait_ack(&c, 1, msg, sizeof msg, 60000);
    int code2 = dh_wait_ack(&c, 2, msg, sizeof msg, 60000);
    fprintf(stderr, "rollback_alerts: with the disk full: codes %d %d (%s)\n", code1, code2, msg);
    ck_assert_msg(code1 == ATTNSTAT__CODE__INTERNAL && code2 == ATTNSTAT__CODE__INTERNAL,
                  "the batch was not rolled back (codes %d, %d): %s", code1, code2, msg);
    /* The store's failure is in the status: counted, with its reason (it once said rejected 0). */
    Attnstat__Envelope *st = dh_status(&c);
    ck_assert_msg(st->status_reply->has_store_errors && st->status_reply->store_errors >= 1,
                  "status shows no store error with the disk full");
    ck_assert_msg(st->status_reply->failed >= 2, "status shows %llu failed pushes, not 2",
                  (unsigned long long)st->status_reply->failed);
    ck_assert_msg(st->status_reply->last_store_error &&
                  strstr(st->status_reply->last_store_error, "full"),
                  "the last store error does not say the disk is full: '%s'",
                  st->status_reply->last_store_error ? st->status_reply->last_store_error : "");
    attnstat__envelope__free_unpacked(st, NULL);
    snprintf(cmd, sizeof cmd, "rm -f %s/filler", mnt);
    ck_assert_int_eq(system(cmd), 0);

    dh_push(&c, 3, 2, 0, &q, &k, 0, 0, 0);
    int code = dh_wait_ack(&c, 3, msg, sizeof msg, 30000);
    ck_assert_msg(code == ATTNSTAT__CODE__OK, "push 3: code %d: %s", code, msg);
    dh_close(&c);
    dh_shm_destroy(&shm);
    int rc = dh_stop(&d);
    sqlite3 *db = dh_db_open(&d);
    int64_t nalerts = dh_db_int(db, "SELECT count(*) FROM alerts WHERE rule = 'logit_ceiling' AND "
                                    "state = 'raised' AND layer = 0");
    sqlite3_close(db);
    dh_cleanup(&d, rc != 0 || nalerts != H);
    snprintf(cmd, sizeof cmd, "umount %s && rmdir %s", mnt, mnt);
    ck_assert_int_eq(system(cmd), 0);
    ck_assert_int_eq(rc, 0);
    ck_assert_msg(nalerts == H, "%lld logit_ceiling alerts raised for layer 0, expected %d",
                  (long long)nalerts, H);
}
END_TEST

/* A run past max_heads_per_run: its samples are stored and acknowledged, the limit is logged
 * once for the run (not as an out-of-memory error, not at every batch). */
START_TEST(test_heads_per_run_limit_logged_once)
{
    dh_rng rng = dh_rng_new("heads_limit");
    dh_daemon d;
    dh_dir_init(&d);
    dh_start(&d, "--max-heads-per-run", "4", (const char *)NULL);
    dh_conn c;
    dh_connect(&c, &d);
    dh_hello(&c, "many-heads", 0, NULL);
    dh_tensor q, k;
    dh_tensor_contig(&q, 1, 0, ATTNSTAT__DTYPE__F32, 1, 8, N, D);
    uint64_t qbytes = dh_tensor_elems(&q) * 4;
    dh_tensor_contig(&k, 1, qbytes, ATTNSTAT__DTYPE__F32, 1, 1, N, D);
    dh_shm shm;
    dh_shm_create(&shm, "heads", qbytes + dh_tensor_elems(&k) * 4);
    dh_fill(&rng, shm.ptr, shm.size / 4, ATTNSTAT__DTYPE__F32, 1.0);
    dh_register(&c, 1, shm.name, shm.size);
    char msg[256];
    for (uint64_t s = 1; s <= 5; s++) {
        dh_push(&c, s, (int64_t)s, 0, &q, &k, 0, 0, 0);
        ck_assert_int_eq(dh_wait_ack(&c, s, msg, sizeof msg, 30000), ATTNSTAT__CODE__OK);
    }
    dh_close(&c);
    dh_shm_destroy(&shm);
    int rc = dh_stop(&d);
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "test \"$(grep -c 'pairs (max_heads_per_run)' %s)\" = 1 && "
             "! grep -q 'out of memory' %s", d.log, d.log);
    int logged_once = system(cmd) == 0;
    sqlite3 *db = dh_db_open(&d);
    ck_assert_int_eq(dh_db_int(db, "SELECT count(*) FROM samples"), 5 * 8);
    sqlite3_close(db);
    dh_cleanup(&d, rc != 0 || !logged_once);
    ck_assert_int_eq(rc, 0);
    ck_assert_msg(logged_once, "the per-run limit was not logged exactly once (or logged as out of "
                  "memory)");
}
END_TEST

/* ---- an operator's requests ---------------------------------------------------------------- */
#define NOBODY 65534

/* Sends the Command m on c: the CommandReply's code, its count into *count, its message into
 * msg. */
static int command(dh_conn *c, Attnstat__Command *m, uint64_t *count, char *msg, size_t len)
{
    Attnstat__Envelope env = ATTNSTAT__ENVELOPE__INIT;
    env.msg_case = ATTNSTAT__ENVELOPE__MSG_COMMAND;
    env.command = m;
    ck_assert_int_eq(dh_send(c, &env), 0);
    Attnstat__Envelope *r = dh_expect(c, ATTNSTAT__ENVELOPE__MSG_COMMAND_REPLY, 30000);
    ck_assert_msg(r != NULL, "no CommandReply");
    int code = r->command_reply->code;
    *count = r->command_reply->has_count ? r->command_reply->count : 0;
    snprintf(msg, len, "%s", r->command_reply->message ? r->command_reply->message : "");
    attnstat__envelope__free_unpacked(r, NULL);
    return code;
}

static Attnstat__Command unsilence(int64_t silence_id, int64_t run_id)
{
    Attnstat__Command m = ATTNSTAT__COMMAND__INIT;
    m.action = ATTNSTAT__COMMAND__ACTION__UNSILENCE;
    m.has_silence_id = silence_id != 0;
    m.silence_id = silence_id;
    m.has_run_id = run_id != 0;
    m.run_id = run_id;
    return m;
}

static int64_t db_exec_id(const dh_daemon *d, const char *sql)
{
    sqlite3 *db = NULL;
    ck_assert_int_eq(sqlite3_open_v2(d->db, &db, SQLITE_OPEN_READWRITE, NULL), SQLITE_OK);
    sqlite3_busy_timeout(db, 10000);
    char *err = NULL;
    ck_assert_msg(sqlite3_exec(db, sql, NULL, NULL, &err) == SQLITE_OK, "%s: %s", sql, err);
    int64_t id = sqlite3_last_insert_rowid(db);
    sqlite3_close(db);
    return id;
}

static int64_t db_one(const dh_daemon *d, const char *sql)
{
    sqlite3 *db = dh_db_open(d);
    int64_t v = dh_db_int(db, sql);
    sqlite3_close(db);
    return v;
}

/* Silences of a run (written into the database, as a SILENCE leaves them) ended by id and by run;
 * requests naming neither, both, or a silence not in force refused with the reason; another uid
 * refused (when the test runs as root, which can act as one). */
START_TEST(test_unsilence_requests)
{
    dh_rng rng = dh_rng_new("unsilence_requests");
    struct group *g = getuid() == 0 ? getgrgid(NOBODY) : NULL;
    dh_daemon d;
    dh_dir_init(&d);
    if (g) {
        ck_assert_int_eq(chmod(d.dir, 0755), 0);
        dh_start(&d, "--allow-group", g->gr_name, (const char *)NULL);
        ck_assert_int_eq(chmod(d.sock, 0666), 0);
    } else {
        fprintf(stderr, "unsilence_requests: another uid's refusal SKIPPED (needs root)\n");
        dh_start(&d, NULL);
    }
    dh_conn c;
    dh_connect(&c, &d);
    int64_t run;
    dh_hello(&c, "own", 0, &run);
    int layer = (int)(dh_next(&rng) % 40), head = (int)(dh_next(&rng) % 64);
    char sql[512];
    snprintf(sql, sizeof sql, "INSERT INTO silences (run_id, layer, head, rule, uid, time, until) "
             "VALUES (%lld, %d, %d, 'logit_ceiling', 0, strftime('%%s','now') * 1000, NULL)",
             (long long)run, layer, head);
    int64_t s1 = db_exec_id(&d, sql);
    snprintf(sql, sizeof sql, "INSERT INTO silences (run_id, layer, head, rule, uid, time, until) "
             "VALUES (%lld, %d, %d, 'entropy_floor', 0, strftime('%%s','now') * 1000, "
             "(strftime('%%s','now') + 3600) * 1000)", (long long)run, layer, head + 1);
    int64_t s2 = db_exec_id(&d, sql);

    char msg[600];
    uint64_t n;
    Attnstat__Command m = unsilence(0, 0);
    ck_assert_int_eq(command(&c, &m, &n, msg, sizeof msg), ATTNSTAT__CODE__BAD_REQUEST);
    ck_assert_msg(strstr(msg, "name one silence"), "%s", msg);
    m = unsilence(s1, run);
    ck_assert_int_eq(command(&c, &m, &n, msg, sizeof msg), ATTNSTAT__CODE__BAD_REQUEST);
    m = unsilence(s2 + 1000, 0);
    ck_assert_int_eq(command(&c, &m, &n, msg, sizeof msg), ATTNSTAT__CODE__BAD_REQUEST);
    ck_assert_msg(strstr(msg, "no silence") && strstr(msg, "in force"), "%s", msg);
    m = unsilence(0, run + 1000);
    ck_assert_int_eq(command(&c, &m, &n, msg, sizeof msg), ATTNSTAT__CODE__BAD_REQUEST);

    if (g) { /* another uid, by the silence's id and by the run */
        int pfd[2];
        ck_assert_int_eq(pipe(pfd), 0);
        pid_t child = fork();
        ck_assert_int_ge(child, 0);
        if (child == 0) {
            close(pfd[0]);
            char out[1400] = "setuid failed";
            if (setgid(NOBODY) == 0 && setuid(NOBODY) == 0) {
                int fd = dh_try_connect(d.sock);
                snprintf(out, sizeof out, "connect failed");
                if (fd >= 0) {
                    dh_conn o = {.fd = fd};
                    frame_reader_init(&o.rd, 1u << 20);
                    char m1[600], m2[600];
                    Attnstat__Command x = unsilence(s1, 0), y = unsilence(0, run);
                    int c1 = command(&o, &x, &n, m1, sizeof m1);
                    int c2 = command(&o, &y, &n, m2, sizeof m2);
                    snprintf(out, sizeof out, "%d %d %s | %s", c1, c2, m1, m2);
                    dh_close(&o);
                }
            }
            ssize_t w = write(pfd[1], out, strlen(out));
            _exit(w > 0 ? 0 : 1);
        }
        close(pfd[1]);
        char got[1400] = "";
        ssize_t r = read(pfd[0], got, sizeof got - 1);
        close(pfd[0]);
        got[r > 0 ? r : 0] = '\0';
        int st;
        waitpid(child, &st, 0);
        int c1 = -1, c2 = -1;
        sscanf(got, "%d %d", &c1, &c2);
        ck_assert_msg(c1 == ATTNSTAT__CODE__PERMISSION && c2 == ATTNSTAT__CODE__PERMISSION &&
                          strstr(got, "belongs to uid 0"), "another uid's unsilence got: %s", got);
        snprintf(sql, sizeof sql, "SELECT count(*) FROM silences WHERE until IS NULL OR until > "
                 "strftime('%%s','now') * 1000");
        ck_assert_int_eq(db_one(&d, sql), 2); /* nothing ended */
    }

    /* the owner: one by id, then the run's others; again, none is left */
    m = unsilence(s1, 0);
    ck_assert_int_eq(command(&c, &m, &n, msg, sizeof msg), ATTNSTAT__CODE__OK);
    ck_assert_msg(n == 1 && strstr(msg, "ended"), "%llu %s", (unsigned long long)n, msg);
    snprintf(sql, sizeof sql, "SELECT until IS NOT NULL AND until <= strftime('%%s','now') * 1000 "
             "+ 1000 FROM silences WHERE id = %lld", (long long)s1);
    ck_assert_int_eq(db_one(&d, sql), 1);
    snprintf(sql, sizeof sql, "SELECT until > strftime('%%s','now') * 1000 FROM silences WHERE "
             "id = %lld", (long long)s2);
    ck_assert_int_eq(db_one(&d, sql), 1);
    m = unsilence(s1, 0);
    ck_assert_int_eq(command(&c, &m, &n, msg, sizeof msg), ATTNSTAT__CODE__BAD_REQUEST);
    m = unsilence(0, run);
    ck_assert_int_eq(command(&c, &m, &n, msg, sizeof msg), ATTNSTAT__CODE__OK);
    ck_assert_msg(n == 1, "%llu %s", (unsigned long long)n, msg);
    m = unsilence(0, run);
    ck_assert_int_eq(command(&c, &m, &n, msg, sizeof msg), ATTNSTAT__CODE__OK);
    ck_assert_msg(n == 0 && strstr(msg, "none was in force"), "%llu %s", (unsigned long long)n,
                  msg);
    ck_assert_int_eq(db_one(&d, "SELECT count(*) FROM silences"), 2); /* the rows stay */
    dh_close(&c);
    int rc = dh_stop(&d);
    dh_cleanup(&d, rc != 0);
    ck_assert_int_eq(rc, 0);
}
END_TEST

/* RETENTION sets the limits it carries and leaves the others as they are. */
START_TEST(test_retention_keeps_what_it_leaves_out)
{
    dh_rng rng = dh_rng_new("retention_keeps");
    dh_daemon d;
    dh_dir_init(&d);
    dh_start(&d, NULL);
    dh_conn c;
    dh_connect(&c, &d);
    int64_t run;
    dh_hello(&c, "kept", 0, &run);
    int64_t ms = 1 + (int64_t)(dh_next(&rng) % 100000000000LL);
    int64_t bytes = 1 + (int64_t)(dh_next(&rng) % 1000000000000LL);
    char msg[600], sql[256];
    uint64_t n;
    snprintf(sql, sizeof sql, "SELECT coalesce(retain_ms, -1) || ' ' || coalesce(retain_bytes, -1) "
             "FROM runs WHERE id = %lld", (long long)run);
    struct {
        int has_ms, has_bytes;
        int64_t ms, bytes;  /* sent */
        int64_t want_ms, want_bytes; /* stored after (-1: the daemon's, NULL) */
    } steps[] = {
        {1, 0, ms, 0, ms, -1},        /* the age alone */
        {0, 1, 0, bytes, ms, bytes},  /* the size alone: the age stays */
        {1, 0, 0, 0, 0, bytes},       /* no age limit: the size stays */
        {0, 0, 0, 0, 0, bytes},       /* neither: both stay */
        {1, 1, -1, -1, -1, -1},       /* both back to the daemon's */
    };
    for (size_t i = 0; i < sizeof steps / sizeof steps[0]; i++) {
        Attnstat__Command m = ATTNSTAT__COMMAND__INIT;
        m.action = ATTNSTAT__COMMAND__ACTION__RETENTION;
        m.has_run_id = 1;
        m.run_id = run;
        m.has_retain_ms = steps[i].has_ms;
        m.retain_ms = steps[i].ms;
        m.has_retain_bytes = steps[i].has_bytes;
        m.retain_bytes = steps[i].bytes;
        ck_assert_int_eq(command(&c, &m, &n, msg, sizeof msg), ATTNSTAT__CODE__OK);
        char got[128], want[128];
        sqlite3 *db = dh_db_open(&d);
        dh_db_text(db, sql, got, sizeof got);
        sqlite3_close(db);
        snprintf(want, sizeof want, "%lld %lld", (long long)steps[i].want_ms,
                 (long long)steps[i].want_bytes);
        ck_assert_msg(!strcmp(got, want), "step %zu: stored %s, expected %s (%s)", i, got, want,
                      msg);
    }
    dh_close(&c);
    int rc = dh_stop(&d);
    dh_cleanup(&d, rc != 0);
    ck_assert_int_eq(rc, 0);
}
END_TEST

static Suite *alerts_suite(void)
{
    Suite *s = suite_create("daemon_alerts");
    TCase *tc = tcase_create("alerts");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, test_alerts_raise_and_clear);
    tcase_add_test(tc, test_alerts_survive_restart);
    tcase_add_test(tc, test_rolled_back_batch_does_not_eat_transitions);
    tcase_add_test(tc, test_heads_per_run_limit_logged_once);
    tcase_add_test(tc, test_unsilence_requests);
    tcase_add_test(tc, test_retention_keeps_what_it_leaves_out);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return dh_run(alerts_suite());
}
