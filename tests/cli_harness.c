/* cli_harness.c — the attnstat CLI run from a test (to its end, or in the background), its output
 * read and waited for, and a trainer that pushes random steps (see cli_harness.h). */
#include "cli_harness.h"

#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#ifndef ATTNSTAT_CLI_PATH
#error "ATTNSTAT_CLI_PATH must name the attnstat binary"
#endif

const char *cli_binary(void)
{
    return ATTNSTAT_CLI_PATH;
}

char *cli_slurp(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return calloc(1, 1);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)n + 1);
    size_t got = fread(b, 1, (size_t)n, f);
    b[got] = '\0';
    fclose(f);
    return b;
}

/* Forks the attnstat binary with args, stdout and stderr into the two files; a child given
 * alarm_s > 0 dies of SIGALRM after that many seconds. */
static pid_t cli_start(const char *out_path, const char *err_path, const char *const *args,
                       unsigned alarm_s)
{
    const char *argv[64];
    int n = 0;
    argv[n++] = ATTNSTAT_CLI_PATH;
    for (int i = 0; args[i] && n < 63; i++)
        argv[n++] = args[i];
    argv[n] = NULL;
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        int fo = open(out_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        int fe = open(err_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fo < 0 || fe < 0)
            _exit(126);
        dup2(fo, 1);
        dup2(fe, 2);
        if (alarm_s)
            alarm(alarm_s);
        execv(argv[0], (char *const *)argv);
        _exit(127);
    }
    return pid;
}

cli_result cli_run_v(const char *dir, const char *const *args)
{
    char outp[400], errp[400];
    snprintf(outp, sizeof outp, "%s/cli.out", dir);
    snprintf(errp, sizeof errp, "%s/cli.err", dir);
    /* a CLI that hangs dies (SIGALRM: status -1) instead of stalling the suite */
    pid_t pid = cli_start(outp, errp, args, 120);
    int st;
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {
    }
    cli_result r = {WIFEXITED(st) ? WEXITSTATUS(st) : -1, cli_slurp(outp), cli_slurp(errp)};
    return r;
}

void cli_result_free(cli_result *r)
{
    free(r->out);
    free(r->err);
}

pid_t cli_spawn_v(const char *out_path, const char *err_path, const char *const *args)
{
    return cli_start(out_path, err_path, args, 0);
}

int cli_count_text(const char *s, const char *needle)
{
    int n = 0;
    for (const char *p = s; (p = strstr(p, needle)) != NULL; p += strlen(needle))
        n++;
    return n;
}

int cli_wait_text(const char *path, const char *needle, int n, pid_t pid, int timeout_ms)
{
    struct timespec t0, now, nap = {0, 20 * 1000 * 1000};
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (;;) {
        char *text = cli_slurp(path);
        int have = cli_count_text(text, needle);
        if (have >= n) {
            free(text);
            return have;
        }
        clock_gettime(CLOCK_MONOTONIC, &now);
        long long ms = (now.tv_sec - t0.tv_sec) * 1000LL + (now.tv_nsec - t0.tv_nsec) / 1000000;
        int st;
        int gone = pid > 0 && waitpid(pid, &st, WNOHANG) == pid;
        ck_assert_msg(!gone && ms < timeout_ms, "%s: \"%s\" %d of %d times %s; it says:\n%s",
                      path, needle, have, n, gone ? "when the process exited" : "after the deadline",
                      text);
        free(text);
        nanosleep(&nap, NULL);
    }
}

double cli_json_num(const char *line, const char *key)
{
    char pat[64];
    snprintf(pat, sizeof pat, "\"%s\": ", key);
    const char *p = strstr(line, pat);
    if (!p)
        return NAN;
    p += strlen(pat);
    if (!strncmp(p, "null", 4))
        return NAN;
    return strtod(p, NULL);
}

int cli_json_has(const char *line, const char *key, const char *strval)
{
    char pat[160];
    snprintf(pat, sizeof pat, "\"%s\": \"%s\"", key, strval);
    return strstr(line, pat) != NULL;
}

int cli_count_lines(const char *s)
{
    int n = 0;
    for (; *s; s++)
        n += *s == '\n';
    return n;
}

attnstat_client *cli_trainer(const char *sock, const char *run, int32_t rank,
                             const attnstat_thresholds *th, uint64_t ring, uint64_t queue)
{
    attnstat_connect_opts o;
    attnstat_connect_opts_init(&o);
    o.socket_path = sock;
    o.ring_bytes = ring;
    o.queue_bytes = queue;
    attnstat_client *c = NULL;
    attnstat_error err;
    ck_assert_msg(attnstat_connect_ex(&o, &c, &err) == ATTNSTAT_OK, "connect: %s", err.msg);
    ck_assert_msg(attnstat_hello(c, run, rank, th, "{\"test\": true}") == ATTNSTAT_OK, "hello: %s",
                  attnstat_last_error(c));
    return c;
}

attnstat_tensor cli_tensor(const tu_tensor *t)
{
    attnstat_tensor a;
    memset(&a, 0, sizeof a);
    a.data = t->mem;
    a.dtype = (int32_t)t->dtype;
    a.mem = ATTNSTAT_MEM_HOST;
    a.shape[0] = t->b, a.shape[1] = t->h, a.shape[2] = t->n, a.shape[3] = t->d;
    a.strides[0] = t->sb, a.strides[1] = t->sh, a.strides[2] = t->sn, a.strides[3] = 1;
    return a;
}

void cli_push_steps(attnstat_client *c, tu_rng *rng, int from, int to, int layers, double amp)
{
    for (int s = from; s < to; s++)
        for (int l = 0; l < layers; l++) {
            tu_tensor q, k;
            tu_alloc(&q, 1, 4, 32, 32, STATS_BF16, TU_BHND);
            tu_alloc(&k, 1, 4, 32, 32, STATS_BF16, TU_BNHD);
            tu_fill_gauss(&q, rng, amp);
            tu_fill_gauss(&k, rng, 1.0);
            attnstat_tensor aq = cli_tensor(&q), ak = cli_tensor(&k);
            attnstat_push_opts o;
            attnstat_push_opts_init(&o);
            o.step = s;
            o.layer = (uint32_t)l;
            ck_assert_msg(attnstat_push(c, &o, &aq, &ak, NULL) == ATTNSTAT_OK, "%s",
                          attnstat_last_error(c));
            tu_free(&q);
            tu_free(&k);
        }
    ck_assert_msg(attnstat_flush(c, 120000) == ATTNSTAT_OK, "%s", attnstat_last_error(c));
}

sqlite3 *cli_db_runs(const char *path, const char *const *names, int n, int64_t *ids)
{
    sqlite3 *db = NULL;
    ck_assert_int_eq(sqlite3_open_v2(path, &db, SQLITE_OPEN_READWRITE, NULL), SQLITE_OK);
    sqlite3_busy_timeout(db, 5000);
    sqlite3_stmt *q = NULL;
    ck_assert_int_eq(sqlite3_prepare_v2(db, "SELECT id FROM runs WHERE name = ?", -1, &q, NULL),
                     SQLITE_OK);
    for (int i = 0; i < n; i++) {
        sqlite3_bind_text(q, 1, names[i], -1, SQLITE_STATIC);
        ck_assert_msg(sqlite3_step(q) == SQLITE_ROW, "no run '%s' in %s", names[i], path);
        ids[i] = sqlite3_column_int64(q, 0);
        sqlite3_reset(q);
    }
    sqlite3_finalize(q);
    return db;
}

int cli_run_tests(const char *suite, const TTest *const *tests, int n)
{
    Suite *s = suite_create(suite);
    TCase *tc = tcase_create(suite);
    tcase_set_timeout(tc, 600);
    for (int i = 0; i < n; i++)
        tcase_add_test(tc, tests[i]);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
