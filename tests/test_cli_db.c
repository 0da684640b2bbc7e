/* test_cli_db.c — what the attnstat CLI says about the database it is given, against databases a
 * real attnstatd wrote:
 *   - check-db on a database of a newer schema says a newer attnstat wrote it (its schema version
 *     and this one's) and to use that version, never "DAMAGED" nor to move it aside, and leaves the
 *     file untouched; one of an older schema says to let this attnstatd migrate it; one that is
 *     not attnstat's says so; --format json names each verdict;
 *   - check-db on a damaged database prints every problem SQLite reports on a line of its own
 *     (the lines of SQLite's answers, compared with PRAGMA integrity_check run here), no "\x0a";
 *   - --db DIR on every command that reads one database says that the path is a directory, which
 *     *.db files it holds and what --db takes, instead of SQLite's "disk I/O error";
 *   - a FIFO named *.db blocks nothing: job and export over a directory skip it and say so; as
 *     --db it is refused.
 * Fresh random data each run; the seed is printed (ATTNSTAT_TEST_SEED repeats a run). */
#include "daemon_harness.h"
#include "stats_testutil.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "attnstat.h"
#include "cli_harness.h"

/* A database written by a real attnstatd: one run, steps [0, steps) of 4 layers. */
static void make_db(dh_daemon *d, tu_rng *rng, int steps)
{
    dh_dir_init(d);
    dh_start(d, (const char *)NULL);
    attnstat_client *c = cli_trainer(d->sock, "dbrun", 0, NULL, 0, 0);
    cli_push_steps(c, rng, 0, steps, 4, 1.0);
    attnstat_close(c);
    ck_assert_int_eq(dh_stop(d), 0);
}

/* dst: a copy of src, with its WAL folded in first (the daemon stopped: nothing else writes). */
static void copy_db(const char *src, const char *dst)
{
    sqlite3 *db = NULL;
    ck_assert_int_eq(sqlite3_open(src, &db), SQLITE_OK);
    ck_assert_int_eq(sqlite3_exec(db, "PRAGMA wal_checkpoint(TRUNCATE)", NULL, NULL, NULL),
                     SQLITE_OK);
    sqlite3_close(db);
    int in = open(src, O_RDONLY), out = open(dst, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    ck_assert_int_ge(in, 0);
    ck_assert_int_ge(out, 0);
    char buf[65536];
    ssize_t n;
    while ((n = read(in, buf, sizeof buf)) > 0)
        ck_assert_int_eq(write(out, buf, (size_t)n), n);
    ck_assert_int_eq(n, 0);
    close(in);
    close(out);
}

static void db_exec(const char *path, const char *sql)
{
    sqlite3 *db = NULL;
    ck_assert_int_eq(sqlite3_open(path, &db), SQLITE_OK);
    char *msg = NULL;
    int rc = sqlite3_exec(db, sql, NULL, NULL, &msg);
    ck_assert_msg(rc == SQLITE_OK, "%s: %s", sql, msg ? msg : "?");
    sqlite3_close(db);
}

static int64_t db_version(const char *path)
{
    sqlite3 *db = NULL;
    ck_assert_int_eq(sqlite3_open_v2(path, &db, SQLITE_OPEN_READONLY, NULL), SQLITE_OK);
    int64_t v = dh_db_int(db, "PRAGMA user_version");
    sqlite3_close(db);
    return v;
}

/* check-db of path: what it prints (r) and, with --format json, its one line (json). */
static void check_db(const char *dir, const char *path, cli_result *r, cli_result *json)
{
    *r = cli_run(dir, "--db", path, "check-db");
    *json = cli_run(dir, "--db", path, "check-db", "--format", "json");
}

/* A database of another schema version (or none) is not damaged: check-db says what it is. */
START_TEST(test_check_db_other_schema)
{
    tu_rng rng = {tu_seed()};
    dh_daemon d;
    make_db(&d, &rng, 3);
    const int64_t ours = db_version(d.db); /* what this attnstat writes */
    ck_assert_int_gt(ours, 0);
    char path[400], mine[64], theirs[64], sql[100];
    cli_result r, j;

    /* a whole database of this version: ok */
    check_db(d.dir, d.db, &r, &j);
    ck_assert_msg(r.status == 0 && strstr(r.out, ": ok (integrity_check"), "%s%s", r.out, r.err);
    ck_assert_msg(j.status == 0 && cli_json_has(j.out, "verdict", "ok") &&
                      cli_json_num(j.out, "schema_version") == (double)ours, "%s", j.out);
    cli_result_free(&r);
    cli_result_free(&j);

    /* newer: written by a newer attnstat, not damaged, not to be moved aside; untouched */
    int64_t newer = ours + 1 + (int64_t)(tu_next(&rng) % 20);
    snprintf(path, sizeof path, "%s/newer.db", d.dir);
    copy_db(d.db, path);
    snprintf(sql, sizeof sql, "PRAGMA user_version = %lld", (long long)newer);
    db_exec(path, sql);
    struct stat before, after;
    ck_assert_int_eq(stat(path, &before), 0);
    check_db(d.dir, path, &r, &j);
    snprintf(theirs, sizeof theirs, "schema version %lld", (long long)newer);
    snprintf(mine, sizeof mine, "reads schema version %lld", (long long)ours);
    ck_assert_msg(r.status == 1 && strstr(r.out, "written by a newer attnstat") &&
                      strstr(r.out, theirs) && strstr(r.out, mine) &&
                      strstr(r.out, "with the attnstat that wrote it") &&
                      strstr(r.out, "do not move it aside") && !strstr(r.out, "DAMAGED") &&
                      !strstr(r.out, "damaged") && !strstr(r.out, "Stop attnstatd") &&
                      !strstr(r.out, ".recover"),
                  "check-db of a newer schema: exit %d:\n%s%s", r.status, r.out, r.err);
    ck_assert_msg(j.status == 1 && cli_json_has(j.out, "verdict", "newer_schema") &&
                      cli_json_num(j.out, "schema_version") == (double)newer &&
                      cli_json_num(j.out, "reads_schema_version") == (double)ours &&
                      strstr(j.out, "\"ok\": false") && strstr(j.out, "\"problems\": null"),
                  "%s", j.out);
    cli_result_free(&r);
    cli_result_free(&j);
    ck_assert_int_eq(stat(path, &after), 0);
    ck_assert_int_eq(db_version(path), newer);
    ck_assert_msg(after.st_size == before.st_size &&
                      after.st_mtim.tv_sec == before.st_mtim.tv_sec &&
                      after.st_mtim.tv_nsec == before.st_mtim.tv_nsec,
                  "check-db wrote into a database of a newer schema");
    /* the history commands say the same, in their own words */
    r = cli_run(d.dir, "--db", path, "runs");
    ck_assert_msg(r.status == 1 && strstr(r.err, "newer than this attnstat") &&
                      strstr(r.err, "use the attnstat that wrote it"), "%s", r.err);
    cli_result_free(&r);

    /* older: this attnstatd migrates it */
    snprintf(path, sizeof path, "%s/older.db", d.dir);
    copy_db(d.db, path);
    db_exec(path, "PRAGMA user_version = 1");
    check_db(d.dir, path, &r, &j);
    ck_assert_msg(r.status == 1 && strstr(r.out, "written by an older attnstat") &&
                      strstr(r.out, "schema version 1;") && strstr(r.out, mine) &&
                      strstr(r.out, "migrate") && !strstr(r.out, "DAMAGED"),
                  "check-db of an older schema: exit %d:\n%s%s", r.status, r.out, r.err);
    ck_assert_msg(cli_json_has(j.out, "verdict", "older_schema"), "%s", j.out);
    cli_result_free(&r);
    cli_result_free(&j);

    /* another program's SQLite database */
    snprintf(path, sizeof path, "%s/other.db", d.dir);
    db_exec(path, "CREATE TABLE t (x); INSERT INTO t VALUES (1)");
    check_db(d.dir, path, &r, &j);
    ck_assert_msg(r.status == 1 && strstr(r.out, "not an attnstat database") &&
                      !strstr(r.out, "DAMAGED"), "%s%s", r.out, r.err);
    ck_assert_msg(cli_json_has(j.out, "verdict", "not_attnstat"), "%s", j.out);
    cli_result_free(&r);
    cli_result_free(&j);
    dh_cleanup(&d, 0);
}
END_TEST

/* Lines of SQLite's own integrity_check answers (as check-db must print them), into lines[]. */
static int sqlite_problem_lines(const char *path, char lines[][1024], int max)
{
    sqlite3 *db = NULL;
    ck_assert_int_eq(sqlite3_open_v2(path, &db, SQLITE_OPEN_READONLY, NULL), SQLITE_OK);
    sqlite3_stmt *s = NULL;
    ck_assert_int_eq(sqlite3_prepare_v2(db, "PRAGMA integrity_check(100)", -1, &s, NULL),
                     SQLITE_OK);
    int n = 0;
    while (sqlite3_step(s) == SQLITE_ROW) {
        const char *t = (const char *)sqlite3_column_text(s, 0);
        if (!t || !strcmp(t, "ok"))
            continue;
        for (const char *p = t; *p;) {
            size_t len = strcspn(p, "\n");
            if (len > 0 && n < max)
                snprintf(lines[n++], 1024, "%.*s", (int)len, p);
            p += len + (p[len] == '\n');
        }
    }
    sqlite3_finalize(s);
    sqlite3_close(db);
    return n;
}

/* A damaged database: every problem on a line of its own, as SQLite reports it. */
START_TEST(test_check_db_problems_one_per_line)
{
    tu_rng rng = {tu_seed()};
    dh_daemon d;
    make_db(&d, &rng, 150);
    char path[400];
    snprintf(path, sizeof path, "%s/damaged.db", d.dir);
    copy_db(d.db, path);
    struct stat sb;
    ck_assert_int_eq(stat(path, &sb), 0);
    long pages = (long)(sb.st_size / 4096);
    ck_assert_msg(pages > 20, "the database has %ld pages only", pages);
    int fd = open(path, O_WRONLY);
    ck_assert_int_ge(fd, 0);
    for (int k = 1; k <= 3; k++) { /* the middle of three pages, past their headers */
        uint8_t junk[2000];
        for (size_t i = 0; i < sizeof junk; i++)
            junk[i] = (uint8_t)tu_next(&rng);
        ck_assert_int_eq(pwrite(fd, junk, sizeof junk, (off_t)(pages * k / 4) * 4096 + 100),
                         (ssize_t)sizeof junk);
    }
    close(fd);
    static char want[256][1024];
    int n = sqlite_problem_lines(path, want, 256);
    ck_assert_msg(n >= 2, "SQLite finds %d problem lines in the damaged copy", n);

    cli_result r, j;
    check_db(d.dir, path, &r, &j);
    char head[64];
    snprintf(head, sizeof head, ": DAMAGED (integrity_check): %d problem%s\n", n,
             n == 1 ? "" : "s");
    ck_assert_msg(r.status == 1 && strstr(r.out, head), "want '%s':\n%s%s", head, r.out, r.err);
    ck_assert_msg(!strstr(r.out, "\\x0a"), "a problem line holds an escaped newline:\n%s", r.out);
    /* the lines after the verdict: one per problem, in SQLite's order, then what to do */
    char *p = strchr(strstr(r.out, head) + 1, '\n') + 1;
    for (int i = 0; i < n; i++) {
        char *nl = strchr(p, '\n');
        ck_assert_msg(nl != NULL, "problem %d of %d is missing:\n%s", i + 1, n, r.out);
        *nl = '\0';
        ck_assert_msg(strncmp(p, "  ", 2) == 0 && strcmp(p + 2, want[i]) == 0,
                      "problem %d: '%s', SQLite says '%s'", i + 1, p, want[i]);
        p = nl + 1;
    }
    ck_assert_msg(strncmp(p, "Stop attnstatd, move the database aside", 39) == 0, "%s", p);
    ck_assert_msg(cli_json_has(j.out, "verdict", "damaged"), "%s", j.out);
    /* JSON: the same lines, joined by newlines in one string */
    const char *pj = strstr(j.out, "\"problems\": \"");
    ck_assert_ptr_nonnull(pj);
    int newlines = 0;
    for (pj += 13; *pj && *pj != '"'; pj++)
        newlines += pj[0] == '\\' && pj[1] == 'n' && pj[-1] != '\\';
    ck_assert_int_eq(newlines, n - 1);
    cli_result_free(&r);
    cli_result_free(&j);

    /* --quick says the same kind of thing */
    r = cli_run(d.dir, "--db", path, "check-db", "--quick");
    ck_assert_msg(r.status == 1 && strstr(r.out, "DAMAGED (quick_check): ") &&
                      !strstr(r.out, "\\x0a"), "%s%s", r.out, r.err);
    cli_result_free(&r);
    dh_cleanup(&d, 0);
}
END_TEST

/* --db DIR: a directory is said to be one, with what --db takes, on every command that reads one
 * database. */
START_TEST(test_db_directory)
{
    tu_rng rng = {tu_seed()};
    dh_daemon d;
    make_db(&d, &rng, 2);
    char empty[400], full[400], file[500];
    snprintf(empty, sizeof empty, "%s/empty", d.dir);
    snprintf(full, sizeof full, "%s/full", d.dir);
    ck_assert_int_eq(mkdir(empty, 0700), 0);
    ck_assert_int_eq(mkdir(full, 0700), 0);
    snprintf(file, sizeof file, "%s/node-b.db", full);
    copy_db(d.db, file);
    snprintf(file, sizeof file, "%s/node-a.db", full);
    copy_db(d.db, file);
    const char *cmds[][6] = {{"runs"}, {"trend", "--run", "dbrun", "--layer", "0"},
                             {"heads", "--run", "dbrun"}, {"alerts"}, {"check-db"},
                             {"delete-run", "--run", "dbrun"}};
    for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++) {
        for (int full_dir = 0; full_dir < 2; full_dir++) {
            const char *dir = full_dir ? full : empty;
            const char *args[12] = {"--db", dir, "--socket", d.sock};
            int k = 4;
            for (int m = 0; m < 6 && cmds[i][m]; m++)
                args[k++] = cmds[i][m];
            args[k] = NULL;
            cli_result r = cli_run_v(d.dir, args);
            char is[500];
            snprintf(is, sizeof is, "--db %s is a directory, not a database", dir);
            ck_assert_msg(r.status == 1 && strstr(r.err, is) &&
                              strstr(r.err, "one database file") &&
                              !strstr(r.err, "disk I/O") && !strstr(r.out, "DAMAGED"),
                          "%s on a directory: exit %d:\n%s%s", cmds[i][0], r.status, r.out, r.err);
            if (full_dir)
                ck_assert_msg(strstr(r.err, "it holds node-a.db, node-b.db") &&
                                  strstr(r.err, file), "%s", r.err);
            else
                ck_assert_msg(strstr(r.err, "holds no *.db file"), "%s", r.err);
            cli_result_free(&r);
        }
    }
    /* job reads a directory's databases: its way, unchanged */
    cli_result r = cli_run(d.dir, "--db", full, "job", "--run", "dbrun");
    ck_assert_msg(r.status == 0, "job --db DIR: %s%s", r.out, r.err);
    cli_result_free(&r);
    dh_cleanup(&d, 0);
}
END_TEST

/* A FIFO named *.db never blocks the CLI (SQLite's open of a FIFO waits for a writer for ever):
 * job and export over a directory skip it and say so, reading the databases beside it; a FIFO
 * given as --db is refused, by job (which opens the path itself) and by a one-database command. */
START_TEST(test_db_fifo)
{
    tu_rng rng = {tu_seed()};
    dh_daemon d;
    make_db(&d, &rng, 2 + (int)(tu_next(&rng) % 3));
    char full[400], file[500], fifo[500];
    snprintf(full, sizeof full, "%s/nodes", d.dir);
    ck_assert_int_eq(mkdir(full, 0700), 0);
    snprintf(file, sizeof file, "%s/node-b.db", full);
    copy_db(d.db, file);
    snprintf(fifo, sizeof fifo, "%s/node-a.db", full); /* sorted first: read before node-b */
    ck_assert_int_eq(mkfifo(fifo, 0600), 0);
    const char *cmds[][4] = {{"job", "--run", "dbrun"}, {"export", "--run", "dbrun"}};
    for (size_t i = 0; i < 2; i++) {
        cli_result r = cli_run(d.dir, "--db", full, cmds[i][0], cmds[i][1], cmds[i][2]);
        char said[600];
        snprintf(said, sizeof said, "skipping %s: a FIFO, not a database file", fifo);
        ck_assert_msg(r.status == 0 && strstr(r.err, said) && strstr(r.out, "dbrun"),
                      "%s --db DIR with a FIFO: exit %d:\n%s%s", cmds[i][0], r.status, r.out,
                      r.err);
        cli_result_free(&r);
        r = cli_run(d.dir, "--db", fifo, cmds[i][0], cmds[i][1], cmds[i][2]);
        snprintf(said, sizeof said, "'%s' is a FIFO, not a database file", fifo);
        ck_assert_msg(r.status == 1 && strstr(r.err, said), "%s --db FIFO: exit %d:\n%s%s",
                      cmds[i][0], r.status, r.out, r.err);
        cli_result_free(&r);
    }
    cli_result r = cli_run(d.dir, "--db", fifo, "runs");
    ck_assert_msg(r.status == 1 && strstr(r.err, "not a regular file (a FIFO)"), "runs: %d %s%s",
                  r.status, r.out, r.err);
    cli_result_free(&r);
    /* a directory whose only *.db is a FIFO holds none to read */
    ck_assert_int_eq(unlink(file), 0);
    r = cli_run(d.dir, "--db", full, "job", "--run", "dbrun");
    ck_assert_msg(r.status == 1 && strstr(r.err, "holds no *.db file that is a regular file"),
                  "%d %s%s", r.status, r.out, r.err);
    cli_result_free(&r);
    dh_cleanup(&d, 0);
}
END_TEST

int main(void)
{
    const TTest *tests[] = {test_check_db_other_schema, test_check_db_problems_one_per_line,
                            test_db_directory, test_db_fifo};
    return cli_run_tests("cli_db", tests, (int)(sizeof tests / sizeof tests[0]));
}
