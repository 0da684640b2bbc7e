/* test_cli_alerts.c — alerts an operator acts on from the table, and runs that show their life,
 * through the attnstat CLI against a real attnstatd and its database:
 *   - alerts: the id in the table; --state firing|raised|cleared|resolved, --unacked and
 *     --silenced keep exactly the alerts the database says they should (its own SQL, not the
 *     CLI's); who acknowledged and until when a silence holds; an ack of an alert acknowledged
 *     already names the first (uid and time) and changes nothing; alerts silences lists the
 *     silences in force, a new one of a key replaces the old; alerts unsilence (by id, by run)
 *     ends them, and the transitions of an unsilenced key reach a watcher again while those of a
 *     key still silenced do not (recorded all the same);
 *   - runs: live or ended, why, active alerts, duration, limits, against the database;
 *     retention: --bytes keeps --days (and the other way round), --run alone shows the limits
 *     (the run's own and attnstatd's), --default.
 * Fresh random data each run; the seed is printed (ATTNSTAT_TEST_SEED repeats a run). */
#include "daemon_harness.h"
#include "stats_testutil.h"

#include "attnstat.h"
#include "cli_harness.h"

#define MAXIDS 64

/* The raise that is still the latest transition of its (run, layer, head, rule). */
#define FIRING_SQL                                                                                 \
    "SELECT id FROM alerts a WHERE state = 'raised' AND id = (SELECT max(id) FROM alerts b "      \
    "WHERE b.run_id = a.run_id AND b.layer = a.layer AND b.head = a.head AND b.rule = a.rule)"

static int64_t db_int(const dh_daemon *d, const char *sql)
{
    sqlite3 *db = dh_db_open(d);
    int64_t v = dh_db_int(db, sql);
    sqlite3_close(db);
    return v;
}

/* Waits (30 s at most) until sql counts want: an alert is recorded on the store thread after the
 * samples that raised it, so after the trainer's flush, not with it. */
static void wait_count(const dh_daemon *d, const char *sql, int64_t want)
{
    int64_t deadline = dh_now_ms() + 30000, got;
    while ((got = db_int(d, sql)) != want) {
        ck_assert_msg(dh_now_ms() < deadline, "%s: %lld, not %lld", sql, (long long)got,
                      (long long)want);
        dh_sleep_ms(20);
    }
}

/* The first column of every row of sql, in order. */
static int db_ids(const dh_daemon *d, const char *sql, int64_t *out)
{
    sqlite3 *db = dh_db_open(d);
    sqlite3_stmt *s = NULL;
    ck_assert_msg(sqlite3_prepare_v2(db, sql, -1, &s, NULL) == SQLITE_OK, "%s: %s", sql,
                  sqlite3_errmsg(db));
    int n = 0;
    while (sqlite3_step(s) == SQLITE_ROW) {
        ck_assert_int_lt(n, MAXIDS);
        out[n++] = sqlite3_column_int64(s, 0);
    }
    sqlite3_finalize(s);
    sqlite3_close(db);
    return n;
}

/* The "id" of every JSON line of out, in order. */
static int json_ids(const char *out, int64_t *ids)
{
    int n = 0;
    for (const char *l = out; *l; l = strchr(l, '\n') + 1) {
        ck_assert_int_lt(n, MAXIDS);
        ids[n++] = (int64_t)cli_json_num(l, "id");
        if (!strchr(l, '\n'))
            break;
    }
    return n;
}

/* The JSON line of out whose "id" is id (a copy to free), or NULL. */
static char *json_line_of(const char *out, int64_t id)
{
    for (const char *l = out; *l;) {
        const char *e = strchr(l, '\n');
        size_t len = e ? (size_t)(e - l) : strlen(l);
        if ((int64_t)cli_json_num(l, "id") == id)
            return strndup(l, len);
        if (!e)
            break;
        l = e + 1;
    }
    return NULL;
}

/* The table line of out that starts with id (its first column), a copy to free, or NULL. */
static char *table_line_of(const char *out, int64_t id)
{
    char want[32];
    snprintf(want, sizeof want, "%lld ", (long long)id);
    for (const char *l = out; *l;) {
        const char *e = strchr(l, '\n');
        size_t len = e ? (size_t)(e - l) : strlen(l);
        const char *p = l;
        while (*p == ' ')
            p++;
        if (!strncmp(p, want, strlen(want)))
            return strndup(l, len);
        if (!e)
            break;
        l = e + 1;
    }
    return NULL;
}

/* The CLI prints exactly the ids the database's query gives, in order. */
static void check_ids(const dh_daemon *d, const char *sql, const char *what, const char *out)
{
    int64_t want[MAXIDS], got[MAXIDS];
    int nw = db_ids(d, sql, want), ng = json_ids(out, got);
    ck_assert_msg(ng == nw, "%s: %d alerts printed, the database says %d:\n%s", what, ng, nw, out);
    for (int i = 0; i < nw; i++)
        ck_assert_msg(got[i] == want[i], "%s: alert %d is %lld, the database says %lld", what, i,
                      (long long)got[i], (long long)want[i]);
}

static int64_t real_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void rfc3339(char *buf, size_t len, int64_t ms)
{
    time_t t = (time_t)(ms / 1000);
    struct tm tm;
    gmtime_r(&t, &tm);
    strftime(buf, len, "%Y-%m-%dT%H:%M:%SZ", &tm);
}

/* A trainer whose alerts are logit_ceiling only (the entropy rules never fire), raised and cleared
 * by one sample: pushes of amplitude 3 raise every head, 0.001 clears it. */
static attnstat_client *ceiling_trainer(const dh_daemon *d, const char *run)
{
    attnstat_thresholds th;
    attnstat_thresholds_init(&th);
    th.logit_ceiling = 1.0;
    th.entropy_floor = 0;
    th.entropy_drop = 0.999;
    th.raise_after = 1;
    th.clear_after = 1;
    return cli_trainer(d->sock, run, 0, &th, 0, 0);
}

/* The id of alert (firing, logit_ceiling) of layer/head of run ta. */
static int64_t alert_at(const dh_daemon *d, int layer, int head)
{
    char sql[512];
    snprintf(sql, sizeof sql, FIRING_SQL " AND layer = %d AND head = %d", layer, head);
    return db_int(d, sql);
}

/* ---- alerts ------------------------------------------------------------------------------- */
START_TEST(test_alerts_act_from_the_table)
{
    tu_rng rng = {tu_seed()};
    dh_daemon d;
    dh_dir_init(&d);
    dh_start(&d, "--run-grace-ms", "600000", (const char *)NULL);
    attnstat_client *c = ceiling_trainer(&d, "ta");
    cli_push_steps(c, &rng, 0, 1, 2, 3.0); /* 2 layers x 4 heads raise */
    wait_count(&d, "SELECT count(*) FROM (" FIRING_SQL ")", 8);
    const unsigned uid = (unsigned)getuid();
    int ha = (int)(tu_next(&rng) % 4), la = (int)(tu_next(&rng) % 2);
    int hb = (int)(tu_next(&rng) % 4), hc = (hb + 1 + (int)(tu_next(&rng) % 3)) % 4;
    int64_t ida = alert_at(&d, la, ha), idb = alert_at(&d, 0, hb), idc = alert_at(&d, 0, hc);
    char sa[32], sb[32], sc[32], sql[512];
    snprintf(sa, sizeof sa, "%lld", (long long)ida);
    snprintf(sb, sizeof sb, "%lld", (long long)idb);
    snprintf(sc, sizeof sc, "%lld", (long long)idc);

    /* acknowledged once; again: the first is named and kept */
    cli_result r = cli_run(d.dir, "--db", d.db, "--socket", d.sock, "alerts", "ack", "--id", sa);
    ck_assert_msg(r.status == 0 && strstr(r.out, "acknowledged"), "%s%s", r.out, r.err);
    cli_result_free(&r);
    snprintf(sql, sizeof sql, "SELECT ack_time FROM alerts WHERE id = %s AND ack_uid = %u", sa,
             uid);
    int64_t t_ack = db_int(&d, sql);
    ck_assert_int_gt(t_ack, 0);
    char first[128], when[40];
    rfc3339(when, sizeof when, t_ack);
    snprintf(first, sizeof first, "acknowledged already, by uid %u at %s", uid, when);
    r = cli_run(d.dir, "--db", d.db, "--socket", d.sock, "alerts", "ack", "--id", sa, "--format",
                "json");
    ck_assert_msg(r.status == 0 && strstr(r.out, first) && cli_json_num(r.out, "count") == 0,
                  "wanted '%s':\n%s%s", first, r.out, r.err);
    cli_result_free(&r);
    ck_assert_int_eq(db_int(&d, sql), t_ack);

    /* silenced: B for 2 hours, C until the run ends */
    int64_t t0 = real_now_ms();
    r = cli_run(d.dir, "--db", d.db, "--socket", d.sock, "alerts", "silence", "--id", sb, "--for",
                "2h");
    int64_t t1 = real_now_ms();
    ck_assert_msg(r.status == 0 && strstr(r.out, "silenced"), "%s%s", r.out, r.err);
    cli_result_free(&r);
    r = cli_run(d.dir, "--db", d.db, "--socket", d.sock, "alerts", "silence", "--id", sc);
    ck_assert_msg(r.status == 0, "%s%s", r.out, r.err);
    cli_result_free(&r);

    /* the filters, against the database's own account */
    r = cli_run(d.dir, "--db", d.db, "alerts", "--state", "firing", "--format", "json");
    ck_assert_msg(r.status == 0, "%s", r.err);
    check_ids(&d, FIRING_SQL " ORDER BY id", "--state firing", r.out);
    ck_assert_int_eq(cli_count_text(r.out, "\"firing\": 1"), 8);
    cli_result_free(&r);
    r = cli_run(d.dir, "--db", d.db, "alerts", "--unacked", "--format", "json");
    ck_assert_msg(r.status == 0, "%s", r.err);
    snprintf(sql, sizeof sql, FIRING_SQL " AND ack_uid IS NULL AND id NOT IN (%s, %s) ORDER BY id",
             sb, sc);
    check_ids(&d, sql, "--unacked", r.out);
    ck_assert_int_eq(cli_count_lines(r.out), la == 0 && (ha == hb || ha == hc) ? 6 : 5);
    cli_result_free(&r);
    r = cli_run(d.dir, "--db", d.db, "alerts", "--silenced", "--format", "json");
    ck_assert_msg(r.status == 0, "%s", r.err);
    snprintf(sql, sizeof sql, "SELECT id FROM alerts WHERE id IN (%s, %s) ORDER BY id", sb, sc);
    check_ids(&d, sql, "--silenced", r.out);
    char *lb = json_line_of(r.out, idb), *lc = json_line_of(r.out, idc);
    ck_assert_msg(lb && lc, "%s", r.out);
    double until_b = cli_json_num(lb, "silenced_until_ms");
    ck_assert_msg(until_b >= (double)(t0 + 7200000) && until_b <= (double)(t1 + 7200000), "%s",
                  lb);
    ck_assert_msg(cli_json_num(lc, "silenced_until_ms") == 0, "%s", lc);
    ck_assert_msg(cli_json_num(lb, "silenced_by") == uid, "%s", lb);
    snprintf(sql, sizeof sql, "SELECT id FROM silences WHERE layer = 0 AND head = %d", hc);
    int64_t sil_c = db_int(&d, sql);
    ck_assert_msg(cli_json_num(lc, "silence_id") == (double)sil_c, "%s", lc);
    free(lb);
    free(lc);
    cli_result_free(&r);
    /* --state raised: every raise; none of the others */
    r = cli_run(d.dir, "--db", d.db, "alerts", "--state", "resolved", "--format", "json");
    ck_assert_msg(r.status == 0 && cli_count_lines(r.out) == 0, "%s%s", r.out, r.err);
    cli_result_free(&r);

    /* the table: ids, firing, who acknowledged, until when silenced */
    r = cli_run(d.dir, "--db", d.db, "alerts", "--run", "ta");
    ck_assert_msg(r.status == 0 && strstr(r.out, "silenced until") && strstr(r.out, "acked by"),
                  "%s%s", r.out, r.err);
    char *ta = table_line_of(r.out, ida), *tb = table_line_of(r.out, idb),
         *tc = table_line_of(r.out, idc);
    ck_assert_msg(ta && tb && tc, "%s", r.out);
    char uidtext[32], until_text[40];
    snprintf(uidtext, sizeof uidtext, " %u ", uid);
    rfc3339(until_text, sizeof until_text, (int64_t)until_b);
    ck_assert_msg(strstr(ta, "firing") && strstr(ta, uidtext) && strstr(ta, when), "%s", ta);
    ck_assert_msg(strstr(tb, "firing") && strstr(tb, until_text), "%s", tb);
    ck_assert_msg(strstr(tc, "firing") && strstr(tc, "run end"), "%s", tc);
    free(ta);
    free(tb);
    free(tc);
    cli_result_free(&r);

    /* alerts silences; a new silence of B replaces its first */
    r = cli_run(d.dir, "--db", d.db, "alerts", "silences", "--format", "json");
    ck_assert_msg(r.status == 0, "%s", r.err);
    check_ids(&d, "SELECT id FROM silences ORDER BY id", "silences", r.out);
    cli_result_free(&r);
    snprintf(sql, sizeof sql, "SELECT id FROM silences WHERE layer = 0 AND head = %d", hb);
    int64_t sil_b_old = db_int(&d, sql);
    r = cli_run(d.dir, "--db", d.db, "--socket", d.sock, "alerts", "silence", "--id", sb, "--for",
                "1h");
    ck_assert_msg(r.status == 0, "%s%s", r.out, r.err);
    cli_result_free(&r);
    snprintf(sql, sizeof sql, "SELECT max(id) FROM silences WHERE layer = 0 AND head = %d", hb);
    int64_t sil_b = db_int(&d, sql);
    ck_assert_int_gt(sil_b, sil_b_old);
    r = cli_run(d.dir, "--db", d.db, "alerts", "silences", "--run", "ta", "--format", "json");
    snprintf(sql, sizeof sql, "SELECT id FROM silences WHERE id IN (%lld, %lld) ORDER BY id",
             (long long)sil_c, (long long)sil_b);
    check_ids(&d, sql, "silences after a second silence of B", r.out);
    cli_result_free(&r);
    r = cli_run(d.dir, "--db", d.db, "alerts", "silences");
    ck_assert_msg(r.status == 0 && cli_count_lines(r.out) == 3 && strstr(r.out, "run end"),
                  "%s%s", r.out, r.err);
    cli_result_free(&r);

    /* unsilenced B; again: refused, saying so */
    char ssb[32];
    snprintf(ssb, sizeof ssb, "%lld", (long long)sil_b);
    r = cli_run(d.dir, "--db", d.db, "--socket", d.sock, "alerts", "unsilence", "--id", ssb);
    ck_assert_msg(r.status == 0 && strstr(r.out, "ended"), "%s%s", r.out, r.err);
    cli_result_free(&r);
    r = cli_run(d.dir, "--db", d.db, "--socket", d.sock, "alerts", "unsilence", "--id", ssb);
    ck_assert_msg(r.status == 1 && strstr(r.err, "no silence") && strstr(r.err, ssb), "%d %s",
                  r.status, r.err);
    cli_result_free(&r);
    r = cli_run(d.dir, "--db", d.db, "--socket", d.sock, "alerts", "unsilence");
    ck_assert_msg(r.status == 2 && strstr(r.err, "--id"), "%d %s", r.status, r.err);
    cli_result_free(&r);
    r = cli_run(d.dir, "--db", d.db, "alerts", "--silenced", "--format", "json");
    snprintf(sql, sizeof sql, "SELECT %s", sc);
    check_ids(&d, sql, "--silenced after unsilence", r.out);
    cli_result_free(&r);

    /* every remaining alert acknowledged by run: A is named as acknowledged before */
    r = cli_run(d.dir, "--db", d.db, "--socket", d.sock, "alerts", "ack", "--run", "ta",
                "--format", "json");
    char named[64];
    snprintf(named, sizeof named, "the first: alert %s, by uid %u", sa, uid);
    ck_assert_msg(r.status == 0 && cli_json_num(r.out, "count") == 7 && strstr(r.out, named) &&
                      strstr(r.out, "1 acknowledged already"), "%s%s", r.out, r.err);
    cli_result_free(&r);
    ck_assert_int_eq(db_int(&d, "SELECT count(*) FROM (" FIRING_SQL " AND ack_uid IS NULL)"), 0);
    r = cli_run(d.dir, "--db", d.db, "alerts", "--unacked");
    ck_assert_msg(r.status == 0 && strstr(r.out, "no alerts matching --unacked"), "%s", r.out);
    cli_result_free(&r);

    /* Layer 0 clears (B delivered again, C still silenced), then layer 1 does: a watcher that
     * has layer 1's clears has had every clear of layer 0 it would ever get. */
    char wout[512], werr[512];
    snprintf(wout, sizeof wout, "%s/watch.out", d.dir);
    snprintf(werr, sizeof werr, "%s/watch.err", d.dir);
    pid_t w = cli_spawn(wout, werr, "--socket", d.sock, "watch", "--run", "ta", "--format",
                        "json");
    cli_wait_text(werr, "watching alerts from", 1, w, 60000);
    cli_push_steps(c, &rng, 1, 2, 1, 0.001);
    cli_push_steps(c, &rng, 2, 3, 2, 0.001);
    cli_wait_text(wout, "\"state\": \"cleared\"", 7, w, 60000);
    kill(w, SIGINT);
    int st;
    waitpid(w, &st, 0);
    char *got = cli_slurp(wout);
    for (int l = 0; l < 2; l++)
        for (int h = 0; h < 4; h++) {
            char key[64];
            snprintf(key, sizeof key, "\"layer\": %d, \"head\": %d,", l, h);
            ck_assert_msg(cli_count_text(got, key) == (l == 0 && h == hc ? 0 : 1),
                          "layer %d head %d (C is layer 0 head %d):\n%s", l, h, hc, got);
        }
    free(got);
    snprintf(sql, sizeof sql, "SELECT count(*) FROM alerts WHERE state = 'cleared' AND layer = 0 "
             "AND head = %d", hc);
    ck_assert_int_eq(db_int(&d, sql), 1); /* recorded, silenced or not */

    /* every alert cleared: the states, against the database */
    r = cli_run(d.dir, "--db", d.db, "alerts", "--state", "cleared", "--format", "json");
    check_ids(&d, "SELECT id FROM alerts WHERE state = 'cleared' ORDER BY id", "--state cleared",
              r.out);
    cli_result_free(&r);
    r = cli_run(d.dir, "--db", d.db, "alerts", "--state", "raised", "--format", "json");
    check_ids(&d, "SELECT id FROM alerts WHERE state = 'raised' ORDER BY id", "--state raised",
              r.out);
    ck_assert_int_eq(cli_count_text(r.out, "\"firing\": 0"), 8);
    cli_result_free(&r);
    r = cli_run(d.dir, "--db", d.db, "alerts", "--state", "firing");
    ck_assert_msg(r.status == 0 && strstr(r.out, "no alerts matching --state firing"), "%s",
                  r.out);
    cli_result_free(&r);

    /* the run's silences ended at once; none left */
    r = cli_run(d.dir, "--db", d.db, "--socket", d.sock, "alerts", "unsilence", "--run", "ta");
    ck_assert_msg(r.status == 0 && strstr(r.out, "1 silence of run"), "%s%s", r.out, r.err);
    cli_result_free(&r);
    r = cli_run(d.dir, "--db", d.db, "alerts", "silences");
    ck_assert_msg(r.status == 0 && strstr(r.out, "no silences in force"), "%s%s", r.out, r.err);
    cli_result_free(&r);
    ck_assert_int_eq(db_int(&d, "SELECT count(*) FROM silences WHERE until IS NULL"), 0);
    attnstat_close(c);
    ck_assert_int_eq(dh_stop(&d), 0);
    dh_cleanup(&d, 0);
}
END_TEST

/* ---- runs and retention ------------------------------------------------------------------- */
/* The JSON line of runs --format json for run name. */
static char *run_line(const char *out, const char *name)
{
    char key[64];
    snprintf(key, sizeof key, "\"run\": \"%s\"", name);
    const char *p = strstr(out, key);
    ck_assert_msg(p != NULL, "no run %s:\n%s", name, out);
    while (p > out && p[-1] != '\n')
        p--;
    const char *e = strchr(p, '\n');
    return strndup(p, e ? (size_t)(e - p) : strlen(p));
}

START_TEST(test_runs_show_their_life)
{
    tu_rng rng = {tu_seed()};
    dh_daemon d;
    dh_dir_init(&d);
    dh_start(&d, "--run-grace-ms", "600000", "--retain-days", "7", (const char *)NULL);
    attnstat_client *live = ceiling_trainer(&d, "la");
    cli_push_steps(live, &rng, 0, 1, 2, 3.0);
    attnstat_client *gone = ceiling_trainer(&d, "lb");
    cli_push_steps(gone, &rng, 0, 2, 1, 3.0);
    wait_count(&d, "SELECT count(*) FROM (" FIRING_SQL ")", 12);
    attnstat_close(gone); /* its 4 alerts resolved */
    wait_count(&d, "SELECT count(*) FROM runs WHERE ended IS NOT NULL", 1);
    wait_count(&d, "SELECT count(*) FROM (" FIRING_SQL ")", 8);

    cli_result r = cli_run(d.dir, "--db", d.db, "runs", "--format", "json");
    int64_t now = real_now_ms();
    ck_assert_msg(r.status == 0 && cli_count_lines(r.out) == 2, "%s%s", r.out, r.err);
    char *la = run_line(r.out, "la"), *lb = run_line(r.out, "lb");
    int64_t la_started = db_int(&d, "SELECT started FROM runs WHERE name = 'la'");
    ck_assert_msg(cli_json_has(la, "state", "live") && strstr(la, "\"end_reason\": null"), "%s",
                  la);
    ck_assert_msg(cli_json_num(la, "alerts_active") ==
                      (double)db_int(&d, "SELECT count(*) FROM (" FIRING_SQL " AND run_id = "
                                         "(SELECT id FROM runs WHERE name = 'la'))") &&
                      cli_json_num(la, "alerts_active") == 8, "%s", la);
    double dur = cli_json_num(la, "duration_ms");
    ck_assert_msg(dur >= 0 && dur <= (double)(now - la_started), "%s", la);
    ck_assert_msg(cli_json_has(la, "limits", "default") && cli_json_num(la, "retain_ms") == -1,
                  "%s", la);
    ck_assert_msg(cli_json_has(lb, "state", "ended") && cli_json_has(lb, "end_reason", "goodbye") &&
                      cli_json_num(lb, "alerts_active") == 0, "%s", lb);
    ck_assert_msg(cli_json_num(lb, "ended_ms") ==
                      (double)db_int(&d, "SELECT ended FROM runs WHERE name = 'lb'"), "%s", lb);
    ck_assert_msg(cli_json_num(lb, "duration_ms") ==
                      (double)db_int(&d, "SELECT ended - started FROM runs WHERE name = 'lb'"),
                  "%s", lb);
    free(la);
    free(lb);
    cli_result_free(&r);
    r = cli_run(d.dir, "--db", d.db, "runs");
    ck_assert_msg(r.status == 0 && strstr(r.out, " live ") && strstr(r.out, " ended ") &&
                      strstr(r.out, " goodbye ") && strstr(r.out, " default"), "%s", r.out);
    cli_result_free(&r);

    /* retention: each limit alone keeps the other */
    int tenths = 1 + (int)(tu_next(&rng) % 300);
    char days[32], bytes[32];
    snprintf(days, sizeof days, "%d.%d", tenths / 10, tenths % 10);
    int64_t nbytes = 100000 + (int64_t)(tu_next(&rng) % 1000000000);
    snprintf(bytes, sizeof bytes, "%lld", (long long)nbytes);
    int64_t want_ms = (int64_t)(tenths / 10.0 * 86400000.0);
    r = cli_run(d.dir, "--db", d.db, "--socket", d.sock, "retention", "--run", "la", "--days",
                days);
    ck_assert_msg(r.status == 0, "%s%s", r.out, r.err);
    cli_result_free(&r);
    ck_assert_int_eq(db_int(&d, "SELECT retain_ms FROM runs WHERE name = 'la'"), want_ms);
    ck_assert_int_eq(db_int(&d, "SELECT retain_bytes IS NULL FROM runs WHERE name = 'la'"), 1);
    r = cli_run(d.dir, "--db", d.db, "--socket", d.sock, "retention", "--run", "la", "--bytes",
                bytes);
    ck_assert_msg(r.status == 0 && strstr(r.out, bytes), "%s%s", r.out, r.err);
    cli_result_free(&r);
    ck_assert_int_eq(db_int(&d, "SELECT retain_ms FROM runs WHERE name = 'la'"), want_ms);
    ck_assert_int_eq(db_int(&d, "SELECT retain_bytes FROM runs WHERE name = 'la'"), nbytes);
    r = cli_run(d.dir, "--db", d.db, "--socket", d.sock, "retention", "--run", "la", "--days",
                "0");
    ck_assert_msg(r.status == 0, "%s%s", r.out, r.err);
    cli_result_free(&r);
    ck_assert_int_eq(db_int(&d, "SELECT retain_ms FROM runs WHERE name = 'la'"), 0);
    ck_assert_int_eq(db_int(&d, "SELECT retain_bytes FROM runs WHERE name = 'la'"), nbytes);

    /* shown: by runs, and by retention --run alone (with the daemon's own) */
    r = cli_run(d.dir, "--db", d.db, "runs", "--format", "json");
    la = run_line(r.out, "la");
    ck_assert_msg(cli_json_num(la, "retain_ms") == 0 && cli_json_num(la, "retain_bytes") ==
                      (double)nbytes && strstr(la, "\"limits\": \"age none, size "), "%s", la);
    free(la);
    cli_result_free(&r);
    r = cli_run(d.dir, "--db", d.db, "--socket", d.sock, "retention", "--run", "la", "--format",
                "json");
    ck_assert_msg(r.status == 0 && cli_json_num(r.out, "retain_ms") == 0 &&
                      cli_json_num(r.out, "retain_bytes") == (double)nbytes &&
                      cli_json_num(r.out, "daemon_retain_ms") == 7 * 86400000.0 &&
                      cli_json_num(r.out, "daemon_retain_bytes") == 0, "%s%s", r.out, r.err);
    cli_result_free(&r);
    char own[64];
    snprintf(own, sizeof own, "%s bytes (its own)", bytes);
    r = cli_run(d.dir, "--db", d.db, "--socket", d.sock, "retention", "--run", "la");
    ck_assert_msg(r.status == 0 && strstr(r.out, "none (its own)") && strstr(r.out, own), "%s%s",
                  r.out, r.err);
    cli_result_free(&r);
    r = cli_run(d.dir, "--db", d.db, "--socket", d.sock, "retention", "--run", "la", "--default");
    ck_assert_msg(r.status == 0, "%s%s", r.out, r.err);
    cli_result_free(&r);
    ck_assert_int_eq(db_int(&d, "SELECT retain_ms IS NULL AND retain_bytes IS NULL FROM runs "
                                "WHERE name = 'la'"), 1);
    r = cli_run(d.dir, "--db", d.db, "--socket", d.sock, "retention", "--run", "la");
    ck_assert_msg(r.status == 0 && strstr(r.out, "attnstatd's retain_days: 7 days") &&
                      strstr(r.out, "attnstatd's retain_bytes: none"), "%s%s", r.out, r.err);
    cli_result_free(&r);
    r = cli_run(d.dir, "--db", d.db, "--socket", d.sock, "retention", "--run", "la", "--days",
                "1", "--default");
    ck_assert_msg(r.status == 2 && strstr(r.err, "--default"), "%d %s", r.status, r.err);
    cli_result_free(&r);

    attnstat_close(live);
    ck_assert_int_eq(dh_stop(&d), 0);
    /* with no daemon: the run's own limits, and that attnstatd's are not known */
    r = cli_run(d.dir, "--db", d.db, "--socket", d.sock, "retention", "--run", "la");
    ck_assert_msg(r.status == 0 && strstr(r.out, "did not answer"), "%s%s", r.out, r.err);
    cli_result_free(&r);
    dh_cleanup(&d, 0);
}
END_TEST

int main(void)
{
    const TTest *tests[] = {test_alerts_act_from_the_table, test_runs_show_their_life};
    return cli_run_tests("cli_alerts", tests, (int)(sizeof tests / sizeof tests[0]));
}
