/* test_daemon_trust.c — what an operator trusts, with a real attnstatd (issue 13, items 4 and 5):
 * each test is a defect once seen, and fails on the code that had it.
 *  - isolation: a connection that says nothing, or half a frame, loses its slot in time; one uid
 *    cannot take every slot; a run belongs to the uid that created it (across a restart);
 *  - bounds: Hello fields checked (printable run and host, config a bounded JSON object stored as
 *    sent); nothing a peer sends forges a log line; a repeated log line is held back and summed;
 *  - the service: the reason of a refusal reaches the refused client; SIGHUP reloads the settings
 *    and logs what changed; one daemon per database; the database 0600 under a stated umask; a
 *    damaged database refused at start and found by `attnstat check-db`; RFC 3339 UTC times;
 *    journald priorities; errors that name the real cause (permission, no GPU driver).
 * Waits are for conditions, with generous deadlines: nothing here depends on a timing margin. */
#include "daemon_harness.h"

#include <grp.h>
#include <pwd.h>
#include <regex.h>

#include "cli_harness.h"
#include "share_testutil.h"

/* ---- helpers -------------------------------------------------------------------------------- */

static char *slurp(const char *path)
{
    return cli_slurp(path);
}

/* Waits until the daemon's log holds needle (or the deadline). 1 when it does. */
static int log_has(const dh_daemon *d, const char *needle, int timeout_ms)
{
    int64_t deadline = dh_now_ms() + timeout_ms;
    for (;;) {
        char *log = slurp(d->log);
        int found = strstr(log, needle) != NULL;
        free(log);
        if (found || dh_now_ms() > deadline)
            return found;
        dh_sleep_ms(50);
    }
}

/* The next Error on c (other messages skipped) with its code, message copied; -1 when none came
 * before the connection closed or timeout_ms passed. */
static int next_error(dh_conn *c, char *msg, size_t len, int timeout_ms)
{
    Attnstat__Envelope *e = dh_expect(c, ATTNSTAT__ENVELOPE__MSG_ERROR, timeout_ms);
    if (!e)
        return -1;
    int code = (int)e->error->code;
    snprintf(msg, len, "%s", e->error->message);
    attnstat__envelope__free_unpacked(e, NULL);
    return code;
}

/* Sends a Hello of run with host and config (NULL: unset); returns the Error code it got, or 0
 * for a HelloReply. */
static int hello_with(dh_conn *c, const char *run, const char *host, const char *config, char *msg,
                      size_t len)
{
    Attnstat__Hello h;
    Attnstat__Envelope env;
    envelope_hello(&env, &h, run);
    h.host = (char *)host;
    h.config = (char *)config;
    ck_assert_int_eq(dh_send(c, &env), 0);
    Attnstat__Envelope *r = dh_recv(c, 20000);
    ck_assert_msg(r != NULL, "no reply to a Hello");
    int code = 0;
    msg[0] = '\0';
    if (r->msg_case == ATTNSTAT__ENVELOPE__MSG_ERROR) {
        code = (int)r->error->code;
        snprintf(msg, len, "%s", r->error->message);
    } else {
        ck_assert_int_eq(r->msg_case, ATTNSTAT__ENVELOPE__MSG_HELLO_REPLY);
    }
    attnstat__envelope__free_unpacked(r, NULL);
    return code;
}

static const uid_t NOBODY = 65534;

/* Connects and says Hello for run, again until it is served: the connection dh_start() opened to
 * see the daemon listen may still hold a slot for a moment (its close not yet read). */
static void hold_slot(dh_conn *c, const dh_daemon *d, const char *run)
{
    int64_t deadline = dh_now_ms() + 30000;
    for (;;) {
        dh_connect(c, d);
        Attnstat__Hello h;
        Attnstat__Envelope env;
        envelope_hello(&env, &h, run);
        ck_assert_int_eq(dh_send(c, &env), 0);
        Attnstat__Envelope *r = dh_recv(c, 20000);
        int ok = r && r->msg_case == ATTNSTAT__ENVELOPE__MSG_HELLO_REPLY;
        if (r)
            attnstat__envelope__free_unpacked(r, NULL);
        if (ok)
            return;
        dh_close(c);
        ck_assert_msg(dh_now_ms() < deadline, "no slot for run %s in 30 s", run);
        dh_sleep_ms(50);
    }
}

/* Waits until the daemon counts `want` connections (w, a subscribed watcher, among them). */
static void wait_clients(dh_conn *w, uint32_t want)
{
    int64_t deadline = dh_now_ms() + 30000;
    for (;;) {
        Attnstat__Envelope *r = dh_status(w);
        uint32_t n = r->status_reply->clients;
        attnstat__envelope__free_unpacked(r, NULL);
        if (n == want)
            return;
        ck_assert_msg(dh_now_ms() < deadline, "the daemon counts %u connections, not %u", n, want);
        dh_sleep_ms(50);
    }
}

/* ---- isolation ------------------------------------------------------------------------------ */

/* Connections that never say Hello once held their slots for ever: max_clients of them locked
 * every trainer out. Now each is answered Error(NO_HELLO) and closed after hello_timeout_ms, and a
 * trainer gets in. */
START_TEST(test_silent_connections_lose_their_slot)
{
    dh_daemon d;
    dh_dir_init(&d);
    dh_start(&d, "--max-clients", "4", "--hello-timeout-ms", "300", (const char *)NULL);
    dh_conn w; /* a watcher (Subscribe, no Hello) is not silent: it stays throughout */
    dh_connect(&w, &d);
    dh_subscribe(&w, 1, 0);
    wait_clients(&w, 1);
    dh_conn idle[3];
    for (int i = 0; i < 3; i++)
        dh_connect(&idle[i], &d);
    for (int i = 0; i < 3; i++) {
        char msg[512];
        int code = next_error(&idle[i], msg, sizeof msg, 30000);
        ck_assert_msg(code == ATTNSTAT__CODE__NO_HELLO, "a silent connection got code %d (%s)",
                      code, msg);
        ck_assert_msg(strstr(msg, "hello_timeout_ms"), "the reason does not name the setting: %s",
                      msg);
        ck_assert_msg(dh_wait_closed(&idle[i], 30000), "the silent connection was not closed");
        dh_close(&idle[i]);
    }
    dh_conn c;
    hold_slot(&c, &d, "after-silence");
    attnstat__envelope__free_unpacked(dh_status(&w), NULL); /* the watcher is still served */
    dh_close(&w);
    dh_close(&c);
    int rc = dh_stop(&d);
    dh_cleanup(&d, rc != 0);
    ck_assert_int_eq(rc, 0);
}
END_TEST

/* Half a frame, then nothing: Error(FRAME) and the slot freed after frame_timeout_ms. */
START_TEST(test_half_frame_loses_its_slot)
{
    dh_rng rng = dh_rng_new("half_frame");
    dh_daemon d;
    dh_dir_init(&d);
    dh_start(&d, "--frame-timeout-ms", "300", (const char *)NULL);
    dh_conn c;
    dh_connect(&c, &d);
    dh_hello(&c, "half", 0, NULL);
    uint8_t part[3 + 8];
    uint32_t len = 100 + (uint32_t)(dh_next(&rng) % 1000);
    memcpy(part, &len, 4);
    for (size_t i = 4; i < sizeof part; i++)
        part[i] = (uint8_t)dh_next(&rng);
    size_t n = 1 + (size_t)(dh_next(&rng) % (sizeof part - 1));
    ck_assert_int_eq(dh_write_all(c.fd, part, n), 0);
    char msg[512];
    int code = next_error(&c, msg, sizeof msg, 30000);
    ck_assert_msg(code == ATTNSTAT__CODE__FRAME && strstr(msg, "frame_timeout_ms"),
                  "half a frame got code %d (%s)", code, msg);
    ck_assert(dh_wait_closed(&c, 30000));
    dh_close(&c);
    int rc = dh_stop(&d);
    dh_cleanup(&d, rc != 0);
    ck_assert_int_eq(rc, 0);
}
END_TEST

/* One uid may hold max_clients_per_uid runs (and subscriptions); the next Hello is refused with
 * the reason (and the slots left stay for the others). */
START_TEST(test_per_uid_cap)
{
    dh_daemon d;
    dh_dir_init(&d);
    dh_start(&d, "--max-clients-per-uid", "2", (const char *)NULL);
    dh_conn a, b, x;
    hold_slot(&a, &d, "cap-a");
    hold_slot(&b, &d, "cap-b");
    dh_connect(&x, &d);
    char msg[512];
    int code = hello_with(&x, "cap-x", NULL, NULL, msg, sizeof msg);
    ck_assert_msg(code == ATTNSTAT__CODE__BUSY && strstr(msg, "max_clients_per_uid 2"),
                  "a third connection of one uid got code %d (%s)", code, msg);
    dh_close(&x);
    dh_close(&b);
    /* A slot of that uid freed: a new connection is served. */
    int64_t deadline = dh_now_ms() + 30000;
    for (;;) {
        dh_connect(&x, &d);
        Attnstat__Hello h;
        Attnstat__Envelope env;
        envelope_hello(&env, &h, "cap-c");
        ck_assert_int_eq(dh_send(&x, &env), 0);
        Attnstat__Envelope *r = dh_recv(&x, 20000);
        int ok = r && r->msg_case == ATTNSTAT__ENVELOPE__MSG_HELLO_REPLY;
        if (r)
            attnstat__envelope__free_unpacked(r, NULL);
        if (ok)
            break;
        dh_close(&x); /* b's close not seen yet: again */
        ck_assert_msg(dh_now_ms() < deadline, "a freed slot of the uid was not given back");
        dh_sleep_ms(50);
    }
    dh_close(&x);
    dh_close(&a);
    int rc = dh_stop(&d);
    dh_cleanup(&d, rc != 0);
    ck_assert_int_eq(rc, 0);
}
END_TEST

/* Two uids admitted by --allow-group once wrote into one run of the same name (and raised its
 * alerts). Now the run belongs to its first uid: the other's Hello is refused with the owner
 * named, across a restart too; the other uid's own names are its own. Needs root (a second uid). */
START_TEST(test_run_belongs_to_its_uid)
{
    if (getuid() != 0) {
        fprintf(stderr, "run_belongs_to_its_uid: SKIPPED (needs root to act as a second uid)\n");
        return;
    }
    struct group *g = getgrgid(NOBODY);
    if (!g) {
        fprintf(stderr, "run_belongs_to_its_uid: SKIPPED (no group %u)\n", (unsigned)NOBODY);
        return;
    }
    char gname[64];
    snprintf(gname, sizeof gname, "%s", g->gr_name);
    dh_daemon d;
    dh_dir_init(&d);
    ck_assert_int_eq(chmod(d.dir, 0755), 0);
    dh_start(&d, "--allow-group", gname, (const char *)NULL);
    ck_assert_int_eq(chmod(d.sock, 0666), 0);
    dh_conn root;
    dh_connect(&root, &d);
    dh_hello(&root, "shared-name", 0, NULL);
    for (int round = 0; round < 2; round++) {
        int pfd[2];
        ck_assert_int_eq(pipe(pfd), 0);
        pid_t child = fork();
        ck_assert_int_ge(child, 0);
        if (child == 0) {
            close(pfd[0]);
            char out[600] = "";
            if (setgid(NOBODY) == 0 && setuid(NOBODY) == 0) {
                int fd = dh_try_connect(d.sock);
                if (fd < 0) {
                    snprintf(out, sizeof out, "connect failed");
                } else {
                    dh_conn c = {.fd = fd};
                    frame_reader_init(&c.rd, 1u << 20);
                    char msg[512];
                    int c1 = hello_with(&c, "shared-name", NULL, NULL, msg, sizeof msg);
                    dh_close(&c);
                    dh_connect(&c, &d);
                    char msg2[512];
                    int c2 = hello_with(&c, "nobodys-own", NULL, NULL, msg2, sizeof msg2);
                    dh_close(&c);
                    snprintf(out, sizeof out, "%d %d %s", c1, c2, msg);
                }
            }
            ssize_t w = write(pfd[1], out, strlen(out));
            _exit(w > 0 ? 0 : 1);
        }
        close(pfd[1]);
        char got[600] = "";
        ssize_t n = read(pfd[0], got, sizeof got - 1);
        close(pfd[0]);
        got[n > 0 ? n : 0] = '\0';
        int st;
        waitpid(child, &st, 0);
        int c1 = -1, c2 = -1;
        sscanf(got, "%d %d", &c1, &c2);
        ck_assert_msg(c1 == ATTNSTAT__CODE__PERMISSION && strstr(got, "belongs to uid 0"),
                      "round %d: another uid's Hello for the run got: %s", round, got);
        ck_assert_msg(c2 == 0, "round %d: the other uid could not start its own run: %s", round,
                      got);
        if (round == 0) { /* the ownership is in the database: it survives a restart */
            dh_close(&root);
            ck_assert_int_eq(dh_stop(&d), 0);
            dh_start(&d, "--allow-group", gname, (const char *)NULL);
            ck_assert_int_eq(chmod(d.sock, 0666), 0);
            dh_connect(&root, &d);
            dh_hello(&root, "shared-name", 0, NULL); /* its owner is welcome back */
        }
    }
    dh_close(&root);
    int rc = dh_stop(&d);
    sqlite3 *db = dh_db_open(&d);
    int64_t runs = dh_db_int(db, "SELECT count(*) FROM runs WHERE name = 'shared-name'");
    sqlite3_close(db);
    dh_cleanup(&d, rc != 0);
    ck_assert_int_eq(rc, 0);
    ck_assert_int_eq(runs, 1);
}
END_TEST

/* ---- bounds ------------------------------------------------------------------------------- */

/* Hello fields once went unchecked: a newline in host forged a log line, escape sequences
 * reached terminals through `attnstat runs`, a 1 MB config grew the database by 1 MB per Hello. */
START_TEST(test_hello_fields_checked)
{
    dh_daemon d;
    dh_dir_init(&d);
    dh_start(&d, "--max-hello-config", "4096", (const char *)NULL);
    static const struct {
        const char *run, *host, *config, *needle;
    } bad[] = {
        {"r1", "node1\n2026-01-01T00:00:00.000Z error [server] FORGED", NULL, "host"},
        {"r2", "node\x1b[2J", NULL, "host"},
        {"r3\x1b]0;pwned\x07", NULL, NULL, "run name"},
        {"r4\xc2\x9b" "31m", NULL, NULL, "run name"},   /* C1 CSI, as UTF-8 */
        {"r5\xff\xfe", NULL, NULL, "run name"},         /* not UTF-8 */
        {"r6", "node\xc0\xaf", NULL, "host"},            /* overlong */
        {"r7", NULL, "not json", "JSON"},
        {"r8", NULL, "[1, 2, 3]", "JSON object"},
        {"r9", NULL, "{\"a\": 1,}", "JSON"},
        {"r10", NULL, "{\"a\": \"\x01\"}", "JSON"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        dh_conn c;
        dh_connect(&c, &d);
        char msg[512];
        int code = hello_with(&c, bad[i].run, bad[i].host, bad[i].config, msg, sizeof msg);
        ck_assert_msg(code == ATTNSTAT__CODE__BAD_REQUEST && strstr(msg, bad[i].needle),
                      "bad Hello %zu got code %d (%s)", i, code, msg);
        dh_close(&c);
    }
    /* Over max_hello_config. */
    char *big = malloc(5000);
    ck_assert_ptr_nonnull(big);
    memset(big, ' ', 4999);
    big[0] = '{';
    memcpy(big + 1, "\"k\": \"", 6);
    memset(big + 7, 'x', 4990);
    memcpy(big + 4997, "\"}", 2);
    big[4999] = '\0';
    dh_conn c;
    dh_connect(&c, &d);
    char msg[512];
    int code = hello_with(&c, "big", NULL, big, msg, sizeof msg);
    ck_assert_msg(code == ATTNSTAT__CODE__BAD_REQUEST && strstr(msg, "max_hello_config 4096"),
                  "a 5000-byte config got code %d (%s)", code, msg);
    free(big);
    /* A good one, UTF-8 included, is stored as sent. */
    const char *cfg = "{\"lr\": 3e-4, \"name\": \"gpt \\u00e9t\xc3\xa9\", \"layers\": [1, {\"x\": "
                      "null}], \"ok\": true}";
    code = hello_with(&c, "good-run \xc3\xa9", "node-1.example", cfg, msg, sizeof msg);
    ck_assert_msg(code == 0, "a good Hello got code %d (%s)", code, msg);
    dh_close(&c);
    int rc = dh_stop(&d);
    sqlite3 *db = dh_db_open(&d);
    char stored[512];
    dh_db_text(db, "SELECT config FROM runs WHERE host = 'node-1.example'", stored, sizeof stored);
    int64_t runs = dh_db_int(db, "SELECT count(*) FROM runs");
    sqlite3_close(db);
    char *log = slurp(d.log);
    int forged = strstr(log, "\n2026-01-01T00:00:00.000Z error [server] FORGED") != NULL;
    free(log);
    dh_cleanup(&d, rc != 0);
    ck_assert_int_eq(rc, 0);
    ck_assert_str_eq(stored, cfg);
    ck_assert_int_eq(runs, 1);
    ck_assert_msg(!forged, "a peer's text forged a log line");
}
END_TEST

/* What a peer names reaches the log escaped: a shm name with a newline and an escape sequence
 * (refused) is logged as \x0a and \x1b, never as a line of its own. */
START_TEST(test_log_lines_cannot_be_forged)
{
    dh_daemon d;
    dh_dir_init(&d);
    dh_start(&d, (const char *)NULL);
    dh_conn c;
    dh_connect(&c, &d);
    dh_hello(&c, "forge", 0, NULL);
    dh_register(&c, 1, "/nope\nFORGED-LINE \x1b[31mred", 4096);
    char msg[512];
    ck_assert_int_ne(next_error(&c, msg, sizeof msg, 20000), -1);
    attnstat__envelope__free_unpacked(dh_status(&c), NULL);
    dh_close(&c);
    int rc = dh_stop(&d);
    char *log = slurp(d.log);
    int forged = strstr(log, "\nFORGED-LINE") != NULL, esc = strchr(log, 0x1b) != NULL;
    int escaped = strstr(log, "\\x0aFORGED-LINE \\x1b[31mred") != NULL;
    free(log);
    dh_cleanup(&d, rc != 0 || forged || esc || !escaped);
    ck_assert_int_eq(rc, 0);
    ck_assert_msg(!forged, "a peer's newline started a line of the log");
    ck_assert_msg(!esc, "a peer's escape character reached the log");
    ck_assert_msg(escaped, "the peer's text is not in the log, escaped");
}
END_TEST

/* A line that repeats (a client refused again and again; a full disk) once wrote megabytes of log:
 * each call site writes LOG_BURST lines per window, then one line says how many more there were. */
START_TEST(test_repeated_log_lines_held_back)
{
    dh_daemon d;
    dh_dir_init(&d);
    dh_start(&d, "--max-clients", "1", (const char *)NULL);
    dh_conn hold;
    hold_slot(&hold, &d, "holder");
    const int tries = 200;
    for (int i = 0; i < tries; i++) {
        dh_conn c;
        dh_connect(&c, &d);
        char msg[512];
        int code = next_error(&c, msg, sizeof msg, 20000);
        ck_assert_msg(code == ATTNSTAT__CODE__BUSY, "try %d: code %d (%s)", i, code, msg);
        dh_close(&c);
    }
    /* The summary comes when the window is over (the loop sums up once a second). */
    ck_assert_msg(log_has(&d, "refused: too many clients (max_clients 1): try again later "
                              "[repeated ", 60000),
                  "no 'repeated N more times' line for the held-back refusals");
    dh_close(&hold);
    int rc = dh_stop(&d);
    char *log = slurp(d.log);
    int lines = cli_count_text(log, "refused: too many clients");
    const char *rep = strstr(log, "[repeated ");
    long held = rep ? strtol(rep + 10, NULL, 10) : 0;
    free(log);
    dh_cleanup(&d, rc != 0);
    ck_assert_int_eq(rc, 0);
    ck_assert_msg(lines < tries, "%d refusal lines for %d refusals: none held back", lines, tries);
    ck_assert_msg(held >= 1, "the summary line counts no refusal");
}
END_TEST

/* ---- the service ---------------------------------------------------------------------------- */

/* A refused client saw "connection lost", never the reason: the daemon closed before the client
 * read it (EPIPE on its Hello). Now the reason reaches it: raw, and through libattnstat and the
 * CLI. */
START_TEST(test_refusal_reason_reaches_the_client)
{
    dh_daemon d;
    dh_dir_init(&d);
    dh_start(&d, "--max-clients", "1", (const char *)NULL);
    dh_conn hold;
    hold_slot(&hold, &d, "holder");
    for (int i = 0; i < 5; i++) { /* a client that writes its Hello first, then reads */
        dh_conn c;
        dh_connect(&c, &d);
        Attnstat__Hello h;
        Attnstat__Envelope env;
        envelope_hello(&env, &h, "late");
        dh_sleep_ms(i * 20); /* before and after the daemon's refusal */
        ck_assert_msg(dh_send(&c, &env) == 0, "the Hello met a closed socket");
        char msg[512];
        int code = next_error(&c, msg, sizeof msg, 20000);
        ck_assert_msg(code == ATTNSTAT__CODE__BUSY && strstr(msg, "too many clients"),
                      "try %d: code %d (%s)", i, code, msg);
        dh_close(&c);
    }
    cli_result r = cli_run(d.dir, "--socket", d.sock, "status");
    ck_assert_msg(r.status == 1 && strstr(r.err, "too many clients (max_clients 1)"),
                  "attnstat status did not say why it was refused (exit %d): %s", r.status, r.err);
    cli_result_free(&r);
    attnstat_connect_opts o;
    attnstat_connect_opts_init(&o);
    o.socket_path = d.sock;
    attnstat_client *cl = NULL;
    attnstat_error err;
    ck_assert_int_eq(attnstat_connect_ex(&o, &cl, &err), ATTNSTAT_OK);
    attnstat_code hc = attnstat_hello(cl, "refused-run", 0, NULL, NULL);
    ck_assert_msg(hc != ATTNSTAT_OK && strstr(attnstat_last_error(cl), "too many clients"),
                  "libattnstat's hello said: %s", attnstat_last_error(cl));
    attnstat_close(cl);
    dh_close(&hold);
    int rc = dh_stop(&d);
    dh_cleanup(&d, rc != 0);
    ck_assert_int_eq(rc, 0);
}
END_TEST

/* SIGHUP killed the daemon (exit 129, nothing logged). Now it reads the config file again, logs
 * each change, applies the live ones (thresholds, limits, log level) and keeps running; a file
 * that no longer parses changes nothing. */
START_TEST(test_sighup_reloads)
{
    dh_daemon d;
    dh_dir_init(&d);
    char conf[400];
    snprintf(conf, sizeof conf, "%s/attnstatd.conf", d.dir);
    FILE *f = fopen(conf, "w");
    ck_assert_ptr_nonnull(f);
    fprintf(f, "logit_ceiling = 100\nmax_clients_per_uid = 8\n");
    fclose(f);
    dh_start(&d, "--config", conf, (const char *)NULL);
    f = fopen(conf, "w");
    ck_assert_ptr_nonnull(f);
    fprintf(f, "# tightened\nlogit_ceiling = 42.5\nmax_clients_per_uid = 1\nmax_frame = 65536\n");
    fclose(f);
    ck_assert_int_eq(kill(d.pid, SIGHUP), 0);
    ck_assert_msg(log_has(&d, "reload: logit_ceiling: 100 -> 42.5", 30000), "no reload logged");
    ck_assert(log_has(&d, "reload: max_clients_per_uid: 8 -> 1", 30000));
    ck_assert(log_has(&d, "max_frame changed (1048576 -> 65536) but takes effect only at a restart",
                      30000));
    ck_assert_int_eq(kill(d.pid, 0), 0);
    /* Applied: one run per uid now. */
    dh_conn a, b;
    hold_slot(&a, &d, "hup");
    dh_connect(&b, &d);
    char msg[512];
    int code = hello_with(&b, "hup-2", NULL, NULL, msg, sizeof msg);
    ck_assert_msg(code == ATTNSTAT__CODE__BUSY, "the reloaded cap was not applied (%d: %s)", code,
                  msg);
    dh_close(&b);
    /* A broken file: logged, nothing changed, the daemon serves on. */
    f = fopen(conf, "w");
    ck_assert_ptr_nonnull(f);
    fprintf(f, "logit_ceiling = lots\n");
    fclose(f);
    ck_assert_int_eq(kill(d.pid, SIGHUP), 0);
    ck_assert(log_has(&d, "reload failed, settings unchanged", 30000));
    attnstat__envelope__free_unpacked(dh_status(&a), NULL);
    dh_close(&a);
    int rc = dh_stop(&d);
    dh_cleanup(&d, rc != 0);
    ck_assert_int_eq(rc, 0);
}
END_TEST

/* Two daemons once opened the same database. Now the second stops at once, naming the first's pid;
 * the database is 0600 and the log states the umask. */
START_TEST(test_one_daemon_per_database)
{
    dh_daemon d;
    dh_dir_init(&d);
    dh_start(&d, (const char *)NULL);
    char sock2[200], log2[400], want[200];
    snprintf(sock2, sizeof sock2, "%s/second.sock", d.dir);
    snprintf(log2, sizeof log2, "%s/second.log", d.dir);
    const char *args[] = {"--socket", sock2, "--db", d.db, NULL};
    int st = sh_run_daemon_to_end(log2, args, (uid_t)-1);
    char *out = slurp(log2);
    snprintf(want, sizeof want, "in use by another attnstatd (pid %d", (int)d.pid);
    int named = strstr(out, want) != NULL;
    free(out);
    struct stat sb;
    ck_assert_int_eq(stat(d.db, &sb), 0);
    int umask_logged = log_has(&d, "umask 0077", 1000);
    int rc = dh_stop(&d);
    dh_cleanup(&d, rc != 0 || st != 1 || !named);
    ck_assert_int_eq(rc, 0);
    ck_assert_msg(st == 1, "a second daemon on the same database exited %d", st);
    ck_assert_msg(named, "the second daemon did not name the first one's pid %d", (int)d.pid);
    ck_assert_msg((sb.st_mode & 0777) == 0600, "the database is mode %04o, not 0600",
                  (unsigned)(sb.st_mode & 0777));
    ck_assert_msg(umask_logged, "the daemon's umask is not stated");
}
END_TEST

/* A corrupted page in the middle of the database was accepted at start with no warning. Now the
 * daemon refuses it (quick_check) with what to do, and `attnstat check-db` finds it; a whole
 * database passes both. */
START_TEST(test_damaged_database_refused)
{
    dh_rng rng = dh_rng_new("damaged_db");
    dh_daemon d;
    dh_dir_init(&d);
    dh_start(&d, (const char *)NULL);
    char cfg[1100];
    for (int i = 0; i < 400; i++) {
        dh_conn c;
        dh_connect(&c, &d);
        char run[32], msg[512];
        snprintf(run, sizeof run, "run-%d", i);
        int n = snprintf(cfg, sizeof cfg, "{\"pad\": \"");
        for (int k = 0; k < 1000; k++)
            cfg[n++] = (char)('a' + dh_next(&rng) % 26);
        snprintf(cfg + n, sizeof cfg - (size_t)n, "\"}");
        ck_assert_int_eq(hello_with(&c, run, NULL, cfg, msg, sizeof msg), 0);
        dh_close(&c);
    }
    ck_assert_int_eq(dh_stop(&d), 0);
    cli_result r = cli_run(d.dir, "--db", d.db, "check-db");
    ck_assert_msg(r.status == 0 && strstr(r.out, ": ok (integrity_check"), "check-db on a whole "
                  "database: exit %d: %s%s", r.status, r.out, r.err);
    cli_result_free(&r);
    /* A page in the middle of the runs' table, overwritten. */
    struct stat sb;
    ck_assert_int_eq(stat(d.db, &sb), 0);
    long pages = (long)(sb.st_size / 4096);
    ck_assert_msg(pages > 20, "the database has %ld pages only", pages);
    int fd = open(d.db, O_WRONLY);
    ck_assert_int_ge(fd, 0);
    uint8_t junk[4096];
    for (size_t i = 0; i < sizeof junk; i++)
        junk[i] = (uint8_t)dh_next(&rng);
    ck_assert_int_eq(pwrite(fd, junk, sizeof junk, (off_t)(pages / 2) * 4096), 4096);
    close(fd);
    const char *args[] = {"--socket", d.sock, "--db", d.db, NULL};
    char log2[400];
    snprintf(log2, sizeof log2, "%s/damaged.log", d.dir);
    int st = sh_run_daemon_to_end(log2, args, (uid_t)-1);
    char *out = slurp(log2);
    int said = strstr(out, "is damaged") != NULL && strstr(out, "check-db") != NULL;
    free(out);
    r = cli_run(d.dir, "--db", d.db, "check-db", "--quick");
    int cli_ok = r.status == 1 && strstr(r.out, "DAMAGED (quick_check)") != NULL;
    if (!cli_ok)
        fprintf(stderr, "check-db --quick: exit %d: %s%s\n", r.status, r.out, r.err);
    cli_result_free(&r);
    dh_cleanup(&d, st != 1 || !said);
    ck_assert_msg(st == 1, "attnstatd started on a damaged database (exit %d)", st);
    ck_assert_msg(said, "the refusal does not say the database is damaged and what to do");
    ck_assert_msg(cli_ok, "attnstat check-db did not find the damage");
}
END_TEST

/* Log times were local with no zone; logs carried no priority for journald; a permission problem
 * read "No such file or directory"; no GPU read as an old driver. */
START_TEST(test_log_times_priorities_and_causes)
{
    dh_daemon d;
    dh_dir_init(&d);
    /* stderr of the daemon is its log file: JOURNAL_STREAM naming it is what systemd sets. */
    int fd = open(d.log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ck_assert_int_ge(fd, 0);
    struct stat sb;
    ck_assert_int_eq(fstat(fd, &sb), 0);
    close(fd);
    char js[64];
    snprintf(js, sizeof js, "%llu:%llu", (unsigned long long)sb.st_dev,
             (unsigned long long)sb.st_ino);
    setenv("JOURNAL_STREAM", js, 1);
    dh_start(&d, (const char *)NULL);
    unsetenv("JOURNAL_STREAM");
    int rc = dh_stop(&d);
    char *log = slurp(d.log);
    regex_t re;
    ck_assert_int_eq(regcomp(&re, "^<6>[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}\\."
                                  "[0-9]{3}Z info  \\[server\\] ", REG_EXTENDED | REG_NEWLINE), 0);
    int stamped = regexec(&re, log, 0, NULL, 0) == 0;
    regfree(&re);
    int no_driver = access("/proc/driver/nvidia/version", F_OK) != 0;
    int gpu_says_old = strstr(log, "no usable CUDA driver or device") != NULL;
    free(log);
    dh_cleanup(&d, rc != 0 || !stamped);
    ck_assert_int_eq(rc, 0);
    ck_assert_msg(stamped, "no line '<6>YYYY-MM-DDTHH:MM:SS.mmmZ info  [server] ...'");
    if (no_driver)
        ck_assert_msg(!gpu_says_old, "with no NVIDIA driver the log blames the driver's age");

    if (getuid() != 0) {
        fprintf(stderr, "log_times_priorities_and_causes: permission part SKIPPED (needs root)\n");
        return;
    }
    /* A database in a directory the daemon's uid may not write: said so, not "no such file". */
    dh_daemon e;
    dh_dir_init(&e);
    ck_assert_int_eq(chmod(e.dir, 0755), 0);
    char closed[300], db[400], sock[300], elog[400];
    snprintf(closed, sizeof closed, "%s/closed", e.dir);
    ck_assert_int_eq(mkdir(closed, 0755), 0);
    snprintf(db, sizeof db, "%s/attnstat.db", closed);
    snprintf(sock, sizeof sock, "%s/open.sock", e.dir);
    snprintf(elog, sizeof elog, "%s/perm.log", e.dir);
    ck_assert_int_eq(chmod(e.dir, 0777), 0);
    const char *args[] = {"--socket", sock, "--db", db, NULL};
    int st = sh_run_daemon_to_end(elog, args, NOBODY);
    char *out = slurp(elog);
    int perm = strstr(out, "permission denied") != NULL && strstr(out, closed) != NULL &&
               strstr(out, "No such file") == NULL;
    if (!perm)
        fprintf(stderr, "permission case said:\n%s\n", out);
    free(out);
    dh_cleanup(&e, 0);
    ck_assert_msg(st == 1, "attnstatd as uid %u with an unwritable database dir exited %d",
                  (unsigned)NOBODY, st);
    ck_assert_msg(perm, "the permission problem is not named as one");
}
END_TEST

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    Suite *s = suite_create("daemon_trust");
    TCase *iso = tcase_create("isolation");
    tcase_set_timeout(iso, 300);
    tcase_add_test(iso, test_silent_connections_lose_their_slot);
    tcase_add_test(iso, test_half_frame_loses_its_slot);
    tcase_add_test(iso, test_per_uid_cap);
    tcase_add_test(iso, test_run_belongs_to_its_uid);
    suite_add_tcase(s, iso);
    TCase *bounds = tcase_create("bounds");
    tcase_set_timeout(bounds, 300);
    tcase_add_test(bounds, test_hello_fields_checked);
    tcase_add_test(bounds, test_log_lines_cannot_be_forged);
    tcase_add_test(bounds, test_repeated_log_lines_held_back);
    suite_add_tcase(s, bounds);
    TCase *svc = tcase_create("service");
    tcase_set_timeout(svc, 300);
    tcase_add_test(svc, test_refusal_reason_reaches_the_client);
    tcase_add_test(svc, test_sighup_reloads);
    tcase_add_test(svc, test_one_daemon_per_database);
    tcase_add_test(svc, test_damaged_database_refused);
    tcase_add_test(svc, test_log_times_priorities_and_causes);
    suite_add_tcase(s, svc);
    return dh_run(s);
}
