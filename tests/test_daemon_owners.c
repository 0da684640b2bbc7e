/* test_daemon_owners.c — runs that have no owner: a database of schema version 2 (built from
 * schema/001_init.sql and 002_compact.sql as attnstatd at that version left it) holds a run
 * recorded before owners were kept, with an active alert. attnstatd migrates it; then another uid
 * admitted by --allow-group may not claim the run with a Hello, delete it, change its retention,
 * or ack, resolve or silence its alerts (each refused with PERMISSION, saying the run has no
 * owner and who may act), while its own new run is welcome; root (the daemon's uid here) may ack
 * the alert and claim the run, which is then root's in the database. Needs root to act as a
 * second uid (skipped, saying so, otherwise). Fresh random names and values each run. */
#include "daemon_harness.h"

#include <grp.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#ifndef ATTNSTAT_SCHEMA_DIR
#error "ATTNSTAT_SCHEMA_DIR (the schema/ folder) must be defined by the build"
#endif

static const uid_t NOBODY = 65534;

static void exec_sql(sqlite3 *db, const char *sql)
{
    char *msg = NULL;
    int rc = sqlite3_exec(db, sql, NULL, NULL, &msg);
    ck_assert_msg(rc == SQLITE_OK, "%.200s: %s", sql, msg ? msg : "?");
}

static void exec_file(sqlite3 *db, const char *name)
{
    char file[512];
    snprintf(file, sizeof file, "%s/%s", ATTNSTAT_SCHEMA_DIR, name);
    FILE *f = fopen(file, "rb");
    ck_assert_msg(f != NULL, "cannot read %s", file);
    static char sql[1 << 16];
    size_t n = fread(sql, 1, sizeof sql - 1, f);
    fclose(f);
    sql[n] = '\0';
    exec_sql(db, sql);
}

/* A version-2 database at path: run 4 (name, rank 0) with no owner, its alert 11 raised. */
static void make_v2(const char *path, const char *name, dh_rng *rng)
{
    sqlite3 *db = NULL;
    ck_assert_int_eq(sqlite3_open(path, &db), SQLITE_OK);
    exec_sql(db, "PRAGMA journal_mode = WAL; BEGIN IMMEDIATE");
    exec_file(db, "001_init.sql");
    exec_file(db, "002_compact.sql");
    exec_sql(db, "PRAGMA user_version = 2; PRAGMA application_id = 1635021684");
    char sql[1200];
    double floor = 0.05 + (double)(dh_next(rng) % 1000) / 4000.0;
    snprintf(sql, sizeof sql, "INSERT INTO runs (id, name, rank, started, last_hello, thresholds) "
             "VALUES (4, '%s', 0, 1, 1, '{\"entropy_floor\":%.17g,\"entropy_drop\":0.5,"
             "\"ema_alpha\":0.05,\"ema_warmup\":20,\"logit_ceiling\":100,\"raise_after\":3,"
             "\"clear_after\":5,\"collapse_threshold\":0.10000000000000001}'); "
             "INSERT INTO alerts (id, run_id, layer, head, step, rule, state, value, threshold, "
             "time) VALUES (11, 4, %u, %u, 7, 'logit_ceiling', 'raised', %g, 100, 5); COMMIT",
             name, floor, (unsigned)(dh_next(rng) % 8), (unsigned)(dh_next(rng) % 16),
             101.0 + (double)(dh_next(rng) % 100));
    exec_sql(db, sql);
    sqlite3_close(db);
}

/* Hello for run on c: 0 (HelloReply) or the Error's code, its message into msg. */
static int hello_code(dh_conn *c, const char *run, char *msg, size_t len)
{
    Attnstat__Hello h;
    Attnstat__Envelope env;
    ck_assert_int_eq(dh_send(c, envelope_hello(&env, &h, run)), 0);
    Attnstat__Envelope *r = dh_recv(c, 20000);
    ck_assert_msg(r != NULL, "no reply to a Hello");
    int code = r->msg_case == ATTNSTAT__ENVELOPE__MSG_ERROR ? (int)r->error->code : 0;
    snprintf(msg, len, "%s", code ? r->error->message : "");
    attnstat__envelope__free_unpacked(r, NULL);
    return code;
}

/* A Command on c: its reply's code, the message into msg. */
static int command_code(dh_conn *c, Attnstat__Command__Action action, int64_t alert_id,
                        int64_t run_id, char *msg, size_t len)
{
    Attnstat__Command m;
    Attnstat__Envelope env;
    envelope_command(&env, &m, action);
    m.has_alert_id = alert_id != 0, m.alert_id = alert_id;
    m.has_run_id = run_id != 0, m.run_id = run_id;
    if (action == ATTNSTAT__COMMAND__ACTION__RETENTION)
        m.has_retain_ms = 1, m.retain_ms = 3600000;
    ck_assert_int_eq(dh_send(c, &env), 0);
    Attnstat__Envelope *r = dh_expect(c, ATTNSTAT__ENVELOPE__MSG_COMMAND_REPLY, 30000);
    ck_assert_msg(r != NULL, "no CommandReply");
    int code = (int)r->command_reply->code;
    snprintf(msg, len, "%s", r->command_reply->message ? r->command_reply->message : "");
    attnstat__envelope__free_unpacked(r, NULL);
    return code;
}

/* As uid NOBODY: every action on the ownerless run, then a Hello for a run of its own. Writes
 * "CODE|message" lines to fd, one per action, in the order of the actions. */
static void as_nobody(const dh_daemon *d, const char *name, const char *own, int fd)
{
    char out[4096] = "";
    size_t o = 0;
    if (setgid(NOBODY) != 0 || setuid(NOBODY) != 0) {
        dprintf(fd, "setuid failed\n");
        _exit(1);
    }
    static const Attnstat__Command__Action acts[] = {
        ATTNSTAT__COMMAND__ACTION__ACK,        ATTNSTAT__COMMAND__ACTION__ACK,
        ATTNSTAT__COMMAND__ACTION__SILENCE,    ATTNSTAT__COMMAND__ACTION__RESOLVE,
        ATTNSTAT__COMMAND__ACTION__RETENTION,  ATTNSTAT__COMMAND__ACTION__DELETE_RUN,
    };
    dh_conn c;
    char msg[600];
    dh_connect(&c, d);
    int code = hello_code(&c, name, msg, sizeof msg);
    o += (size_t)snprintf(out + o, sizeof out - o, "%d|%s\n", code, msg);
    dh_close(&c);
    dh_connect(&c, d);
    for (size_t i = 0; i < sizeof acts / sizeof acts[0]; i++) {
        int by_alert = i == 0 || i == 2; /* alert 11 itself, else its run */
        code = command_code(&c, acts[i], by_alert ? 11 : 0, by_alert ? 0 : 4, msg, sizeof msg);
        o += (size_t)snprintf(out + o, sizeof out - o, "%d|%s\n", code, msg);
    }
    dh_close(&c);
    dh_connect(&c, d);
    code = hello_code(&c, own, msg, sizeof msg);
    o += (size_t)snprintf(out + o, sizeof out - o, "%d|%s\n", code, msg);
    dh_close(&c);
    _exit(write(fd, out, o) == (ssize_t)o ? 0 : 1);
}

START_TEST(test_ownerless_run_is_not_anyones)
{
    if (getuid() != 0) {
        fprintf(stderr, "ownerless_run_is_not_anyones: SKIPPED (needs root to act as a second "
                "uid)\n");
        return;
    }
    struct group *g = getgrgid(NOBODY);
    if (!g) {
        fprintf(stderr, "ownerless_run_is_not_anyones: SKIPPED (no group %u)\n",
                (unsigned)NOBODY);
        return;
    }
    char gname[64];
    snprintf(gname, sizeof gname, "%s", g->gr_name);
    dh_rng rng = dh_rng_new("owners");
    char name[32], own[40];
    snprintf(name, sizeof name, "legacy-%llx", (unsigned long long)(dh_next(&rng) >> 24));
    snprintf(own, sizeof own, "%s-mine", name);
    dh_daemon d;
    dh_dir_init(&d);
    ck_assert_int_eq(chmod(d.dir, 0755), 0);
    make_v2(d.db, name, &rng);
    dh_start(&d, "--allow-group", gname, (const char *)NULL);
    ck_assert_int_eq(chmod(d.sock, 0666), 0);

    int pfd[2];
    ck_assert_int_eq(pipe(pfd), 0);
    pid_t child = fork();
    ck_assert_int_ge(child, 0);
    if (child == 0) {
        close(pfd[0]);
        as_nobody(&d, name, own, pfd[1]);
    }
    close(pfd[1]);
    char got[4096];
    size_t n = 0;
    ssize_t r;
    while (n < sizeof got - 1 && (r = read(pfd[0], got + n, sizeof got - 1 - n)) > 0)
        n += (size_t)r;
    got[n] = '\0';
    close(pfd[0]);
    int st;
    waitpid(child, &st, 0);
    ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "the second uid's process failed: %s",
                  got);
    static const char *const what[] = {"Hello", "ack --id", "ack --run", "silence --id",
                                        "resolve --run", "retention", "delete-run"};
    char *line = got;
    for (int i = 0; i < 7; i++) {
        char *end = strchr(line, '\n');
        ck_assert_msg(end != NULL, "%s: no answer in '%s'", what[i], got);
        *end = '\0';
        ck_assert_msg(atoi(line) == ATTNSTAT__CODE__PERMISSION &&
                      strstr(line, "older attnstatd") && strstr(line, "uid 65534 may not") &&
                      strstr(line, name), "another uid's %s on the ownerless run got: %s",
                      what[i], line);
        ck_assert_msg(i > 0 || strstr(line, "may claim it"), "%s", line);
        line = end + 1;
    }
    ck_assert_msg(atoi(line) == 0, "the other uid could not start its own run: %s", line);

    /* nothing of it changed; root (the daemon's uid) acks the alert and claims the run */
    dh_conn c;
    dh_connect(&c, &d);
    char msg[600];
    int code = command_code(&c, ATTNSTAT__COMMAND__ACTION__ACK, 11, 0, msg, sizeof msg);
    ck_assert_msg(code == 0, "root's ack: %d %s", code, msg);
    dh_close(&c);
    dh_connect(&c, &d);
    code = hello_code(&c, name, msg, sizeof msg);
    ck_assert_msg(code == 0, "root's Hello for the ownerless run: %d %s", code, msg);
    dh_close(&c);
    ck_assert_int_eq(dh_stop(&d), 0);
    sqlite3 *db = dh_db_open(&d);
    char sql[300];
    snprintf(sql, sizeof sql, "SELECT count(*) FROM runs WHERE id = 4 AND name = '%s' AND "
             "owner_uid = 0 AND retain_ms IS NULL", name);
    int64_t claimed = dh_db_int(db, sql);
    int64_t acked = dh_db_int(db, "SELECT count(*) FROM alerts WHERE id = 11 AND ack_uid = 0 AND "
                                  "state = 'raised'");
    int64_t silences = dh_db_int(db, "SELECT count(*) FROM silences");
    snprintf(sql, sizeof sql, "SELECT count(*) FROM runs WHERE name = '%s' AND owner_uid = %u",
             own, (unsigned)NOBODY);
    int64_t mine = dh_db_int(db, sql);
    sqlite3_close(db);
    dh_cleanup(&d, 0);
    ck_assert_msg(claimed == 1, "the run is not root's, whole, with its retention unchanged");
    ck_assert_msg(acked == 1, "alert 11 not acknowledged by root alone");
    ck_assert_msg(silences == 0, "a silence was recorded");
    ck_assert_int_eq(mine, 1);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("owners");
    TCase *tc = tcase_create("owners");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_ownerless_run_is_not_anyones);
    suite_add_tcase(s, tc);
    return dh_run(s);
}
