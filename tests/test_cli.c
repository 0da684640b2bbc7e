/* test_cli.c — the attnstat CLI's options, per command, against a real attnstatd and its database:
 *   - alerts: every filter (--run, --rank, --layer, --head, --rule, --active, --since in each of its
 *     forms, -n) keeps exactly the alerts it should, alone and together, over random alerts of
 *     several runs, ranks, layers, heads and rules written into the database with known times;
 *   - watch: --run (by name or id), --rank and --rule print exactly the live alerts they should,
 *     checked against an unfiltered watcher of the same daemon;
 *   - every option a command does not implement is a usage error (exit 2) whose message names the
 *     option and the command; global options go before or after the command; each command's help
 *     lists the options it accepts.
 * Fresh random data each run; the seed is printed (ATTNSTAT_TEST_SEED repeats a run). */
#include "daemon_harness.h"
#include "stats_testutil.h"

#include "attnstat.h"
#include "cli_harness.h"

#define NALERTS 90

static const char *const test_rules[4] = {"entropy_floor", "entropy_drop", "logit_ceiling",
                                          "nonfinite"};

/* ---- alerts: a model of the database, and what each filter must keep -------------------------*/
typedef struct {
    int64_t id, run_id, time_ms;
    int run, rank, layer, head, raised; /* run: index in the test's runs */
    const char *rule;
} model_alert;

typedef struct {
    int run, rank, layer, head;  /* -1: any */
    const char *rule;            /* NULL: any */
    int active;
    int since_set;
    int64_t since_ms;
    int64_t newest;              /* 0: all */
} model_filter;

static const model_filter no_filter = {-1, -1, -1, -1, NULL, 0, 0, 0, 0};

/* The ids (in id order) the filter keeps: --active first (per run, layer, head and rule, the
 * latest transition when it is a raise), then the other filters, then the newest N. */
static int model_expect(const model_alert *m, int n, const model_filter *f, int64_t *out)
{
    int k = 0;
    for (int i = 0; i < n; i++) {
        const model_alert *a = &m[i];
        if (f->active) {
            int later = 0;
            for (int j = i + 1; j < n; j++)
                later |= m[j].run == a->run && m[j].layer == a->layer && m[j].head == a->head &&
                         !strcmp(m[j].rule, a->rule);
            if (later || !a->raised)
                continue;
        }
        if ((f->run >= 0 && a->run != f->run) || (f->rank >= 0 && a->rank != f->rank) ||
            (f->layer >= 0 && a->layer != f->layer) || (f->head >= 0 && a->head != f->head) ||
            (f->rule && strcmp(a->rule, f->rule)) || (f->since_set && a->time_ms < f->since_ms))
            continue;
        out[k++] = a->id;
    }
    if (f->newest > 0 && k > f->newest) {
        memmove(out, out + (k - f->newest), (size_t)f->newest * sizeof *out);
        k = (int)f->newest;
    }
    return k;
}

static const char *const test_run_names[3] = {"fa", "fb", "fc"};
static const int test_run_ranks[3] = {0, 1, 1};

/* Runs `alerts --format json` with the filter's options (since: as written in since_text) and
 * checks that it prints exactly the ids the model keeps. Returns how many that is. */
static int check_alerts(const dh_daemon *d, const model_alert *m, int n, const model_filter *f,
                        const char *since_text, const char *what)
{
    const char *args[40];
    char buf[8][32];
    int k = 0;
    args[k++] = "--db";
    args[k++] = d->db;
    args[k++] = "alerts";
    if (f->run >= 0) {
        args[k++] = "--run";
        args[k++] = test_run_names[f->run];
    }
    if (f->rank >= 0) {
        snprintf(buf[0], sizeof buf[0], "%d", f->rank);
        args[k++] = "--rank";
        args[k++] = buf[0];
    }
    if (f->layer >= 0) {
        snprintf(buf[1], sizeof buf[1], "%d", f->layer);
        args[k++] = "--layer";
        args[k++] = buf[1];
    }
    if (f->head >= 0) {
        snprintf(buf[2], sizeof buf[2], "%d", f->head);
        args[k++] = "--head";
        args[k++] = buf[2];
    }
    if (f->rule) {
        args[k++] = "--rule";
        args[k++] = f->rule;
    }
    if (f->active)
        args[k++] = "--active";
    if (f->since_set) {
        args[k++] = "--since";
        args[k++] = since_text;
    }
    if (f->newest > 0) {
        snprintf(buf[3], sizeof buf[3], "%lld", (long long)f->newest);
        args[k++] = "-n";
        args[k++] = buf[3];
    }
    args[k++] = "--format";
    args[k++] = "json";
    args[k] = NULL;
    cli_result r = cli_run_v(d->dir, args);
    ck_assert_msg(r.status == 0, "%s: exit %d: %s", what, r.status, r.err);
    int64_t want[NALERTS];
    int nw = model_expect(m, n, f, want);
    int got = 0;
    for (char *line = strtok(r.out, "\n"); line; line = strtok(NULL, "\n"), got++) {
        ck_assert_msg(got < nw, "%s: more than the %d alerts expected:\n%s", what, nw, line);
        int64_t id = (int64_t)cli_json_num(line, "id");
        ck_assert_msg(id == want[got], "%s: alert %d is id %lld, expected id %lld", what, got,
                      (long long)id, (long long)want[got]);
    }
    ck_assert_msg(got == nw, "%s: %d alerts printed, %d expected", what, got, nw);
    cli_result_free(&r);
    return nw;
}

/* A filter that keeps some alerts but not all: it can be seen to work. */
static void check_narrows(const dh_daemon *d, const model_alert *m, int n, const model_filter *f,
                          const char *since_text, const char *what)
{
    int kept = check_alerts(d, m, n, f, since_text, what);
    ck_assert_msg(kept > 0 && kept < n, "%s: keeps %d of %d (the data cannot show the filter)",
                  what, kept, n);
}

static int64_t real_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

START_TEST(test_alerts_filters)
{
    tu_rng rng = {tu_seed()};
    dh_daemon d;
    dh_dir_init(&d);
    dh_start(&d, NULL);
    for (int i = 0; i < 3; i++)
        attnstat_close(cli_trainer(d.sock, test_run_names[i], test_run_ranks[i], NULL, 0, 0));
    ck_assert_int_eq(dh_stop(&d), 0);

    /* Random transitions, written straight into the database: each at a whole number of hours
     * and 20 minutes ago, so that no relative --since below falls near one. */
    int64_t run_ids[3];
    sqlite3 *db = cli_db_runs(d.db, test_run_names, 3, run_ids);
    const int64_t now = real_now_ms();
    model_alert m[NALERTS];
    for (int i = 0; i < NALERTS; i++) {
        model_alert *a = &m[i];
        a->run = (int)(tu_next(&rng) % 3);
        a->run_id = run_ids[a->run];
        a->rank = test_run_ranks[a->run];
        a->layer = (int)(tu_next(&rng) % 4);
        a->head = (int)(tu_next(&rng) % 5);
        a->rule = test_rules[tu_next(&rng) % 4];
        a->raised = (int)(tu_next(&rng) % 3 != 0);
        a->time_ms = now - (int64_t)(1 + tu_next(&rng) % 120) * 3600000 - 20 * 60000;
        char sql[512];
        snprintf(sql, sizeof sql,
                 "INSERT INTO alerts (run_id, layer, head, step, rule, state, value, threshold, "
                 "time, message) VALUES (%lld, %d, %d, %d, '%s', '%s', %.17g, 0.5, %lld, 'm%d')",
                 (long long)a->run_id, a->layer, a->head, i, a->rule,
                 a->raised ? "raised" : "cleared", tu_uniform(&rng), (long long)a->time_ms, i);
        char *msg = NULL;
        ck_assert_msg(sqlite3_exec(db, sql, NULL, NULL, &msg) == SQLITE_OK, "%s", msg);
        a->id = sqlite3_last_insert_rowid(db);
    }
    sqlite3_close(db);

    /* Each filter alone, on values the data have. */
    const model_alert *pick = &m[tu_next(&rng) % NALERTS];
    model_filter f = no_filter;
    ck_assert_int_eq(check_alerts(&d, m, NALERTS, &f, NULL, "no filter"), NALERTS);
    f = no_filter, f.layer = pick->layer;
    check_narrows(&d, m, NALERTS, &f, NULL, "--layer");
    f = no_filter, f.head = pick->head;
    check_narrows(&d, m, NALERTS, &f, NULL, "--head");
    f = no_filter, f.layer = pick->layer, f.head = pick->head;
    check_narrows(&d, m, NALERTS, &f, NULL, "--layer --head");
    f = no_filter, f.rule = pick->rule;
    check_narrows(&d, m, NALERTS, &f, NULL, "--rule");
    f = no_filter, f.run = 1;
    check_narrows(&d, m, NALERTS, &f, NULL, "--run fb");
    f = no_filter, f.rank = 1; /* fb and fc */
    check_narrows(&d, m, NALERTS, &f, NULL, "--rank 1");
    f = no_filter, f.active = 1;
    check_narrows(&d, m, NALERTS, &f, NULL, "--active");
    f = no_filter, f.newest = 7;
    ck_assert_int_eq(check_alerts(&d, m, NALERTS, &f, NULL, "-n 7"), 7);

    /* --since: times ago, and absolute times in every accepted form. */
    static const struct {
        const char *text;
        int64_t ago_ms;
    } ago[] = {{"5000s", 5000000}, {"150m", 9000000}, {"36h", 129600000}, {"2d", 172800000}};
    for (size_t i = 0; i < sizeof ago / sizeof ago[0]; i++) {
        f = no_filter, f.since_set = 1, f.since_ms = now - ago[i].ago_ms;
        char what[64];
        snprintf(what, sizeof what, "--since %s", ago[i].text);
        check_alerts(&d, m, NALERTS, &f, ago[i].text, what);
    }
    int64_t t = pick->time_ms; /* UTC, taken apart by the C library */
    time_t secs = (time_t)(t / 1000);
    struct tm u;
    gmtime_r(&secs, &u);
    time_t plus2 = secs + 7200;
    struct tm u2;
    gmtime_r(&plus2, &u2);
    char forms[6][64];
    int64_t at[6];
    strftime(forms[0], sizeof forms[0], "%Y-%m-%dT%H:%M:%SZ", &u);
    at[0] = (int64_t)secs * 1000;
    strftime(forms[1], sizeof forms[1], "%Y-%m-%d %H:%M:%S", &u);
    at[1] = at[0];
    strftime(forms[2], sizeof forms[2], "%Y-%m-%dT%H:%M:%S+02:00", &u2);
    at[2] = at[0];
    strftime(forms[3], sizeof forms[3], "%Y-%m-%d %H:%M", &u);
    at[3] = at[0] - u.tm_sec * 1000;
    strftime(forms[4], sizeof forms[4], "%Y-%m-%d", &u);
    at[4] = at[3] - ((int64_t)u.tm_hour * 60 + u.tm_min) * 60000;
    char base[40];
    strftime(base, sizeof base, "%Y-%m-%dT%H:%M:%S", &u);
    snprintf(forms[5], sizeof forms[5], "%s.250Z", base);
    at[5] = at[0] + 250;
    for (int i = 0; i < 6; i++) {
        f = no_filter, f.since_set = 1, f.since_ms = at[i];
        char what[512];
        snprintf(what, sizeof what, "--since '%s'", forms[i]);
        int kept = check_alerts(&d, m, NALERTS, &f, forms[i], what);
        ck_assert_msg(kept > 0 || i == 5, "%s keeps nothing", what);
    }

    /* Together: every filter applies. */
    f = no_filter, f.run = pick->run, f.rule = pick->rule, f.since_set = 1,
    f.since_ms = now - 129600000;
    check_alerts(&d, m, NALERTS, &f, "36h", "--run --rule --since");
    f = no_filter, f.layer = pick->layer, f.newest = 3;
    check_alerts(&d, m, NALERTS, &f, NULL, "--layer -n 3");
    f = no_filter, f.active = 1, f.rank = 1, f.layer = pick->layer;
    check_alerts(&d, m, NALERTS, &f, NULL, "--active --rank --layer");
    f = no_filter, f.rank = pick->rank, f.head = pick->head, f.rule = pick->rule;
    check_alerts(&d, m, NALERTS, &f, NULL, "--rank --head --rule");

    /* A table that matches nothing says so, naming the filters. */
    cli_result r = cli_run(d.dir, "--db", d.db, "alerts", "--layer", "77", "--head", "3");
    ck_assert_msg(r.status == 0, "%s", r.err);
    ck_assert_msg(strstr(r.out, "no alerts matching --layer 77 --head 3"), "%s", r.out);
    cli_result_free(&r);
    /* and a table that matches prints its rows under a header */
    f = no_filter, f.layer = pick->layer, f.head = pick->head;
    int64_t want[NALERTS];
    int nw = model_expect(m, NALERTS, &f, want);
    char sl[16], sh[16];
    snprintf(sl, sizeof sl, "%d", pick->layer);
    snprintf(sh, sizeof sh, "%d", pick->head);
    r = cli_run(d.dir, "--db", d.db, "alerts", "--layer", sl, "--head", sh);
    ck_assert_msg(r.status == 0, "%s", r.err);
    ck_assert_int_eq(cli_count_lines(r.out), 1 + nw);
    cli_result_free(&r);
    /* Options of a command may also come before it. */
    f = no_filter, f.layer = pick->layer;
    nw = model_expect(m, NALERTS, &f, want);
    r = cli_run(d.dir, "--layer", sl, "--db", d.db, "alerts", "--format", "csv");
    ck_assert_msg(r.status == 0, "%s", r.err);
    ck_assert_int_eq(cli_count_lines(r.out), 1 + nw);
    cli_result_free(&r);
    dh_cleanup(&d, 0);
}
END_TEST

/* ---- Options a command does not implement -----------------------------------------------------*/
/* 1 when text names opt as an option: after a space or '[', before a space, ',', ']' or a newline. */
static int names_option(const char *text, const char *opt)
{
    size_t n = strlen(opt);
    for (const char *p = strstr(text, opt); p; p = strstr(p + 1, opt))
        if (p > text && (p[-1] == ' ' || p[-1] == '[') && strchr(" ,]\n", p[n]) && p[n])
            return 1;
    return 0;
}

START_TEST(test_unknown_options_refused)
{
    dh_daemon d;
    dh_dir_init(&d);
    /* Every option of any command (and one of none), with a valid value. */
    static const struct {
        const char *opt, *val;
    } all[] = {{"--run", "x"},      {"--rank", "1"},      {"--layer", "3"},    {"--head", "6"},
               {"--from", "1"},     {"--to", "2"},        {"--every", "2"},    {"--step", "1"},
               {"--metric", "max_logit"}, {"--rule", "nonfinite"}, {"--active", NULL},
               {"--since", "1d"},   {"-n", "3"},          {"--newest", "3"},   {"--timeout", "100"},
               {"--bogus", NULL}};
    static const struct {
        const char *cmd, *accepts;
    } cmds[] = {
        {"runs", " "},
        {"trend", " --run --layer --head --from --to --every --rank --since "},
        {"heads", " --run --step --metric --rank --since "},
        {"alerts", " --run --rank --layer --head --rule --active --since -n --newest "},
        {"status", " --timeout "},
        {"watch", " --run --rank --rule --timeout "},
    };
    int refused = 0;
    for (size_t c = 0; c < sizeof cmds / sizeof cmds[0]; c++) {
        for (size_t o = 0; o < sizeof all / sizeof all[0]; o++) {
            char pat[32];
            snprintf(pat, sizeof pat, " %s ", all[o].opt);
            if (strstr(cmds[c].accepts, pat))
                continue;
            cli_result r = all[o].val
                               ? cli_run(d.dir, "--db", d.db, "--socket", d.sock, cmds[c].cmd,
                                         all[o].opt, all[o].val)
                               : cli_run(d.dir, "--db", d.db, "--socket", d.sock, cmds[c].cmd,
                                         all[o].opt);
            ck_assert_msg(r.status == 2, "%s %s: exit %d (%s)", cmds[c].cmd, all[o].opt, r.status,
                          r.err);
            char want[96];
            snprintf(want, sizeof want, "%s has no option %s", cmds[c].cmd, all[o].opt);
            ck_assert_msg(strstr(r.err, want), "%s %s: '%s' not in: %s", cmds[c].cmd, all[o].opt,
                          want, r.err);
            ck_assert_str_eq(r.out, "");
            cli_result_free(&r);
            /* before the command, the same */
            r = all[o].val ? cli_run(d.dir, all[o].opt, all[o].val, cmds[c].cmd)
                           : cli_run(d.dir, all[o].opt, cmds[c].cmd);
            ck_assert_msg(r.status == 2 && strstr(r.err, want), "%s before %s: exit %d: %s",
                          all[o].opt, cmds[c].cmd, r.status, r.err);
            cli_result_free(&r);
            refused++;
        }
    }
    ck_assert_int_eq(refused, 6 * 16 - (0 + 8 + 5 + 9 + 1 + 4));

    /* The cases of the report that started this: each exits 2 and names what it refuses. */
    cli_result r = cli_run(d.dir, "runs", "--layer", "3", "--metric", "max_logit", "--active");
    ck_assert_int_eq(r.status, 2);
    ck_assert_msg(strstr(r.err, "runs has no option --layer"), "%s", r.err);
    cli_result_free(&r);
    r = cli_run(d.dir, "--socket", d.sock, "watch", "--layer", "3");
    ck_assert_int_eq(r.status, 2);
    ck_assert_msg(strstr(r.err, "watch has no option --layer"), "%s", r.err);
    cli_result_free(&r);
    /* A value that is not one, and a flag given a value. */
    r = cli_run(d.dir, "alerts", "--rule", "entropy_flor");
    ck_assert_msg(r.status == 2 && strstr(r.err, "--rule is entropy_floor, entropy_drop, "
                                                 "logit_ceiling, nonfinite, sink_mass_ceiling or "
                                                 "distance_floor, not 'entropy_flor'"),
                  "%s", r.err);
    cli_result_free(&r);
    const char *bad_times[] = {"yesterday", "10", "10y", "2024-13-01", "2023-02-29",
                               "2024-05-01T25:00", "2024-05-01 12:00:00+2", "--5m", "-5",
                               "+5m", "nowish"};
    for (size_t i = 0; i < sizeof bad_times / sizeof bad_times[0]; i++) {
        r = cli_run(d.dir, "alerts", "--since", bad_times[i]);
        ck_assert_msg(r.status == 2 && strstr(r.err, "--since wants a time"), "--since '%s': %d %s",
                      bad_times[i], r.status, r.err);
        cli_result_free(&r);
    }
    r = cli_run(d.dir, "alerts", "-n", "0");
    ck_assert_msg(r.status == 2 && strstr(r.err, "-n wants an integer"), "%s", r.err);
    cli_result_free(&r);
    r = cli_run(d.dir, "alerts", "--active=yes");
    ck_assert_msg(r.status == 2 && strstr(r.err, "--active takes no value"), "%s", r.err);
    cli_result_free(&r);
    r = cli_run(d.dir, "--run", "x");
    ck_assert_msg(r.status == 2 && strstr(r.err, "--run is an option of a command"), "%s", r.err);
    cli_result_free(&r);

    /* Each command's help lists what it accepts, from the same tables. */
    for (size_t c = 0; c < sizeof cmds / sizeof cmds[0]; c++) {
        r = cli_run(d.dir, cmds[c].cmd, "--help");
        ck_assert_int_eq(r.status, 0);
        ck_assert_msg(strstr(r.out, "usage: attnstat"), "%s", r.out);
        for (size_t o = 0; o < sizeof all / sizeof all[0]; o++) {
            int listed = names_option(r.out, all[o].opt);
            int accepted = names_option(cmds[c].accepts, all[o].opt);
            ck_assert_msg(listed == accepted,
                          "%s --help %s %s:\n%s", cmds[c].cmd, listed ? "lists" : "omits",
                          all[o].opt, r.out);
        }
        cli_result h = cli_run(d.dir, "help", cmds[c].cmd);
        ck_assert_int_eq(h.status, 0);
        ck_assert_str_eq(h.out, r.out);
        cli_result_free(&h);
        cli_result_free(&r);
    }
    dh_cleanup(&d, 0);
}
END_TEST

/* ---- watch: --run, --rank, --rule ----------------------------------------------------------------*/
typedef struct {
    pid_t pid;
    char out[400], err[400];
} watcher;

static void watch_start(watcher *w, const dh_daemon *d, const char *name, const char *o1,
                        const char *v1)
{
    snprintf(w->out, sizeof w->out, "%s/%s.out", d->dir, name);
    snprintf(w->err, sizeof w->err, "%s/%s.err", d->dir, name);
    w->pid = fork();
    ck_assert_int_ge(w->pid, 0);
    if (w->pid == 0) {
        int fo = open(w->out, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        int fe = open(w->err, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fo < 0 || fe < 0)
            _exit(126);
        dup2(fo, 1);
        dup2(fe, 2);
        if (o1)
            execl(cli_binary(), cli_binary(), "--socket", d->sock, "watch", o1, v1,
                  "--format", "json", (char *)NULL);
        else
            execl(cli_binary(), cli_binary(), "--socket", d->sock, "watch", "--format",
                  "json", (char *)NULL);
        _exit(127);
    }
    int64_t deadline = dh_now_ms() + 60000;
    for (;;) {
        char *e = cli_slurp(w->err);
        int ready = strstr(e, "watching alerts from") != NULL;
        free(e);
        if (ready)
            break;
        int st;
        ck_assert_msg(waitpid(w->pid, &st, WNOHANG) == 0, "attnstat watch %s exited early", name);
        ck_assert_msg(dh_now_ms() < deadline, "attnstat watch %s never subscribed", name);
        dh_sleep_ms(20);
    }
}

/* Waits until the watcher has printed n lines (60 s at most); returns its output. */
static char *watch_wait(const watcher *w, int n)
{
    int64_t deadline = dh_now_ms() + 60000;
    for (;;) {
        char *o = cli_slurp(w->out);
        int have = cli_count_lines(o);
        if (have >= n)
            return o;
        free(o);
        ck_assert_msg(dh_now_ms() < deadline, "%s: %d of %d alerts after 60 s", w->out, have, n);
        dh_sleep_ms(50);
    }
}

static void watch_stop(const watcher *w)
{
    kill(w->pid, SIGINT);
    int st;
    waitpid(w->pid, &st, 0);
    ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "%s: watch exit status %d", w->out, st);
}

/* Waits (30 s at most) until n runs of the database have ended. */
static void wait_runs_ended(const dh_daemon *d, int64_t n)
{
    int64_t deadline = dh_now_ms() + 30000, got = -1;
    while (dh_now_ms() < deadline) {
        sqlite3 *db = dh_db_open(d);
        got = dh_db_int(db, "SELECT count(*) FROM runs WHERE ended IS NOT NULL");
        sqlite3_close(db);
        if (got == n)
            return;
        dh_sleep_ms(50);
    }
    ck_abort_msg("%lld runs ended, not %lld", (long long)got, (long long)n);
}

START_TEST(test_watch_filters)
{
    tu_rng rng = {tu_seed()};
    dh_daemon d;
    dh_dir_init(&d);
    dh_start(&d, NULL);
    watcher all, by_name, by_rank, by_rule, by_id;
    watch_start(&all, &d, "all", NULL, NULL);
    watch_start(&by_name, &d, "by_name", "--run", "wa");
    watch_start(&by_rank, &d, "by_rank", "--rank", "1");
    watch_start(&by_rule, &d, "by_rule", "--rule", "entropy_floor");
    char *e = cli_slurp(by_name.err);
    ck_assert_msg(strstr(e, "only run wa"), "%s", e);
    free(e);

    /* wa (rank 0): max logits over a ceiling of 1; wb (rank 1): entropy under a floor of 0.9999. */
    attnstat_thresholds ta, tb;
    attnstat_thresholds_init(&ta);
    ta.logit_ceiling = 1.0;
    ta.raise_after = 1;
    attnstat_thresholds_init(&tb);
    tb.entropy_floor = 0.9999;
    tb.logit_ceiling = 1e9;
    tb.raise_after = 1;
    attnstat_client *ca = cli_trainer(d.sock, "wa", 0, &ta, 0, 0);
    attnstat_client *cb = cli_trainer(d.sock, "wb", 1, &tb, 0, 0);
    char wb_id[32];
    snprintf(wb_id, sizeof wb_id, "%lld", (long long)attnstat_run_id(cb));
    watch_start(&by_id, &d, "by_id", "--run", wb_id);
    cli_push_steps(ca, &rng, 0, 2, 2, 3.0);
    cli_push_steps(cb, &rng, 0, 2, 2, 1.0);
    attnstat_close(ca);
    attnstat_close(cb);
    /* Each close said Goodbye: the runs end and their alerts are resolved; both ends recorded
     * means every transition is in the database. */
    wait_runs_ended(&d, 2);

    /* Every alert the database holds reaches the unfiltered watcher. */
    cli_result r = cli_run(d.dir, "--db", d.db, "alerts", "--format", "json");
    ck_assert_msg(r.status == 0, "%s", r.err);
    int total = cli_count_lines(r.out);
    cli_result_free(&r);
    ck_assert_int_gt(total, 0);
    char *everything = watch_wait(&all, total);

    /* Each filtered watcher prints exactly the unfiltered lines its filter keeps, in order. */
    const struct {
        watcher *w;
        const char *key, *val; /* a JSON field and its value that the kept lines have */
    } checks[] = {{&by_name, "run", "wa"},
                  {&by_rank, "rank", "1"},
                  {&by_rule, "rule", "entropy_floor"},
                  {&by_id, "run", "wb"}};
    for (size_t i = 0; i < sizeof checks / sizeof checks[0]; i++) {
        char *expect = calloc(1, strlen(everything) + 1);
        int n = 0;
        char *copy = strdup(everything);
        for (char *line = strtok(copy, "\n"); line; line = strtok(NULL, "\n")) {
            int kept = !strcmp(checks[i].key, "rank")
                           ? (int)cli_json_num(line, "rank") == atoi(checks[i].val)
                           : cli_json_has(line, checks[i].key, checks[i].val);
            if (kept) {
                strcat(expect, line);
                strcat(expect, "\n");
                n++;
            }
        }
        free(copy);
        ck_assert_msg(n > 0 && n < total, "%s keeps %d of %d alerts: the data cannot show it",
                      checks[i].w->out, n, total);
        char *got = watch_wait(checks[i].w, n);
        dh_sleep_ms(300); /* anything it should not print has had time to arrive */
        free(got);
        watch_stop(checks[i].w);
        got = cli_slurp(checks[i].w->out);
        if (strcmp(got, expect)) { /* long: on stderr, not in the failure message */
            fprintf(stderr, "%s printed:\n%s\nexpected:\n%s", checks[i].w->out, got, expect);
            ck_abort_msg("%s: not the %d alerts its filter keeps (both on stderr)",
                         checks[i].w->out, n);
        }
        free(got);
        free(expect);
    }
    watch_stop(&all);
    free(everything);
    ck_assert_int_eq(dh_stop(&d), 0);
    dh_cleanup(&d, 0);
}
END_TEST

static int64_t db_int(const dh_daemon *d, const char *sql)
{
    sqlite3 *db = dh_db_open(d);
    int64_t v = dh_db_int(db, sql);
    sqlite3_close(db);
    return v;
}

/* The operators' commands: alerts ack|resolve|silence keep who and when (attnstat alerts shows
 * them), bad requests are refused with the reason, delete-run is refused while the run's client is
 * connected and then deletes the run (through the daemon, and with no daemon, in the database
 * itself), status shows the store thread and the retention. */
START_TEST(test_operator_commands)
{
    tu_rng rng = {tu_seed()};
    dh_daemon d;
    dh_dir_init(&d);
    dh_start(&d, "--run-grace-ms", "600000", (const char *)NULL);
    attnstat_thresholds th;
    attnstat_thresholds_init(&th);
    th.logit_ceiling = 1.0;
    th.raise_after = 1;
    attnstat_client *c = cli_trainer(d.sock, "oa", 0, &th, 0, 0);
    cli_push_steps(c, &rng, 0, 2, 2, 3.0);
    /* the alerts are recorded after the pushes' Acks: wait for them (no timing margin) */
    cli_result r;
    int active = 0;
    for (int tries = 0;; tries++) {
        r = cli_run(d.dir, "--db", d.db, "alerts", "--active", "--format", "json");
        ck_assert_msg(r.status == 0, "%s", r.err);
        active = cli_count_lines(r.out);
        if (active >= 2 || tries == 1200)
            break;
        cli_result_free(&r);
        dh_sleep_ms(50);
    }
    ck_assert_msg(active >= 2, "%d active alerts:\n%s", active, r.out);
    int64_t id1 = (int64_t)cli_json_num(r.out, "id");
    int64_t id2 = (int64_t)cli_json_num(strchr(r.out, '\n') + 1, "id");
    cli_result_free(&r);
    char a1[32], a2[32], sql[256];
    snprintf(a1, sizeof a1, "%lld", (long long)id1);
    snprintf(a2, sizeof a2, "%lld", (long long)id2);

    r = cli_run(d.dir, "--db", d.db, "--socket", d.sock, "alerts", "ack", "--id", a1);
    ck_assert_msg(r.status == 0 && strstr(r.out, "acknowledged"), "%s%s", r.out, r.err);
    cli_result_free(&r);
    snprintf(sql, sizeof sql, "SELECT count(*) FROM alerts WHERE id=%lld AND ack_uid=%u",
             (long long)id1, (unsigned)getuid());
    ck_assert_int_eq(db_int(&d, sql), 1);
    r = cli_run(d.dir, "--db", d.db, "alerts", "--active", "--format", "json");
    ck_assert_msg(cli_json_num(r.out, "ack_uid") == (double)getuid(), "%s", r.out);
    cli_result_free(&r);

    r = cli_run(d.dir, "--db", d.db, "--socket", d.sock, "alerts", "resolve", "--id", a2,
                "--format", "json");
    ck_assert_msg(r.status == 0 && cli_json_has(r.out, "code", "OK"), "%s%s", r.out, r.err);
    cli_result_free(&r);
    snprintf(sql, sizeof sql, "SELECT count(*) FROM alerts WHERE state='resolved' AND "
             "reason='operator' AND uid=%u", (unsigned)getuid());
    ck_assert_int_eq(db_int(&d, sql), 1);
    r = cli_run(d.dir, "--db", d.db, "--socket", d.sock, "alerts", "resolve", "--id", a2);
    ck_assert_msg(r.status == 1 && strstr(r.err, "no longer active"), "%d %s", r.status, r.err);
    cli_result_free(&r);

    r = cli_run(d.dir, "--db", d.db, "--socket", d.sock, "alerts", "silence", "--run", "oa",
                "--for", "2h");
    ck_assert_msg(r.status == 0 && strstr(r.out, "silenced"), "%s%s", r.out, r.err);
    cli_result_free(&r);
    snprintf(sql, sizeof sql, "SELECT count(*) FROM silences WHERE uid=%u AND until > "
             "(strftime('%%s','now') + 3600) * 1000", (unsigned)getuid());
    ck_assert_int_eq(db_int(&d, sql), active - 1);

    /* usage and refusals */
    r = cli_run(d.dir, "--db", d.db, "--socket", d.sock, "alerts", "ack");
    ck_assert_msg(r.status == 2 && strstr(r.err, "--id"), "%d %s", r.status, r.err);
    cli_result_free(&r);
    r = cli_run(d.dir, "--db", d.db, "--socket", d.sock, "alerts", "ack", "--id", "999999");
    ck_assert_msg(r.status == 1 && strstr(r.err, "999999"), "%d %s", r.status, r.err);
    cli_result_free(&r);
    r = cli_run(d.dir, "--db", d.db, "--socket", d.sock, "delete-run", "--run", "oa");
    ck_assert_msg(r.status == 1 && strstr(r.err, "stop its job"), "%d %s", r.status, r.err);
    cli_result_free(&r);

    /* the job's clips, counted by status once stored (the store thread commits them) */
    attnstat_intervention iv;
    attnstat_intervention_init(&iv);
    const uint32_t clip_heads[2] = {0, 1};
    iv.kind = "qk_clip", iv.layer = 0, iv.nheads = 2, iv.heads = clip_heads;
    const int nclips = 2 + (int)(tu_next(&rng) % 3);
    for (int i = 0; i < nclips; i++) {
        iv.step = i;
        ck_assert_int_eq(attnstat_record_intervention(c, &iv), ATTNSTAT_OK);
    }
    for (int tries = 0;; tries++) {
        r = cli_run(d.dir, "--db", d.db, "--socket", d.sock, "status", "--format", "json");
        if (cli_json_num(r.out, "interventions_stored") == nclips || tries == 1200)
            break;
        cli_result_free(&r);
        dh_sleep_ms(50);
    }
    ck_assert_msg(r.status == 0 && strstr(r.out, "\"store\": {") &&
                      cli_json_num(r.out, "runs_live") == 1 &&
                      cli_json_num(r.out, "interventions_stored") == nclips &&
                      cli_json_num(r.out, "interventions_refused") == 0 &&
                      cli_json_has(r.out, "durability", "normal"), "%d clips: %s%s", nclips,
                  r.out, r.err);
    cli_result_free(&r);
    r = cli_run(d.dir, "--db", d.db, "--socket", d.sock, "status");
    char line[64];
    snprintf(line, sizeof line, "interventions  %d recorded, 0 refused", nclips);
    ck_assert_msg(r.status == 0 && strstr(r.out, line), "%s%s", r.out, r.err);
    cli_result_free(&r);
    r = cli_run(d.dir, "--db", d.db, "--socket", d.sock, "retention", "--run", "oa", "--days",
                "1.5");
    ck_assert_msg(r.status == 0, "%s%s", r.out, r.err);
    cli_result_free(&r);

    /* its history for analysis: CSV (a header, a row per sample) and the same as JSON lines */
    r = cli_run(d.dir, "--db", d.db, "export", "--run", "oa", "--format", "csv");
    ck_assert_msg(r.status == 0 && strstr(r.out, "step"), "%s%s", r.out, r.err);
    int rows = cli_count_lines(r.out) - 1;
    ck_assert_int_eq(rows, 2 * 2 * 4); /* steps x layers x heads */
    cli_result_free(&r);
    r = cli_run(d.dir, "--db", d.db, "export", "--run", "oa", "--format", "jsonl");
    ck_assert_msg(r.status == 0 && cli_count_lines(r.out) == rows, "%s%s", r.out, r.err);
    for (char *l = r.out; *l; l = strchr(l, '\n') + 1)
        ck_assert_msg(*l == '{' && cli_json_num(l, "step") >= 0, "not a JSON line: %.200s", l);
    cli_result_free(&r);

    /* the database by another name (a symbolic link: its DB.lock is another file) and a socket
     * where no daemon answers: the daemon holding the file is found by the file's own lock, and
     * nothing is deleted under it */
    char hard[4200], nosock[4200];
    snprintf(hard, sizeof hard, "%s/other-name.db", d.dir);
    snprintf(nosock, sizeof nosock, "%s/nobody.sock", d.dir);
    ck_assert_int_eq(symlink(d.db, hard), 0);
    r = cli_run(d.dir, "--db", hard, "--socket", nosock, "delete-run", "--run", "oa");
    ck_assert_msg(r.status == 1 && strstr(r.err, "by this name or another"), "%d %s%s", r.status,
                  r.out, r.err);
    cli_result_free(&r);
    ck_assert_int_gt(db_int(&d, "SELECT count(*) FROM runs WHERE name='oa'"), 0);
    unlink(hard);

    /* the job ends: the run is deleted, samples, alerts and all (named without --db: looked up
     * in the database the daemon names, not the default path) */
    attnstat_close(c);
    wait_runs_ended(&d, 1);
    r = cli_run(d.dir, "--socket", d.sock, "delete-run", "--run", "oa");
    ck_assert_msg(r.status == 0 && strstr(r.out, "deleted"), "%s%s", r.out, r.err);
    cli_result_free(&r);
    ck_assert_int_eq(db_int(&d, "SELECT count(*) FROM runs WHERE name='oa'"), 0);
    ck_assert_int_eq(db_int(&d, "SELECT count(*) FROM alerts"), 0);

    /* with no daemon: in the database itself */
    c = cli_trainer(d.sock, "ob", 0, NULL, 0, 0);
    cli_push_steps(c, &rng, 0, 3, 2, 1.0);
    attnstat_close(c);
    ck_assert_int_eq(dh_stop(&d), 0);
    ck_assert_int_gt(db_int(&d, "SELECT count(*) FROM runs WHERE name='ob'"), 0);
    r = cli_run(d.dir, "--db", d.db, "--socket", d.sock, "delete-run", "--run", "ob");
    ck_assert_msg(r.status == 0 && strstr(r.out, "no attnstatd"), "%s%s", r.out, r.err);
    cli_result_free(&r);
    ck_assert_int_eq(db_int(&d, "SELECT count(*) FROM runs"), 0);
    dh_cleanup(&d, 0);
}
END_TEST

/* status says which connected trainer has pushed nothing (a monitor that sees nothing), and not
 * one that has pushed. */
START_TEST(test_status_names_a_silent_trainer)
{
    tu_rng rng = {tu_seed()};
    dh_daemon d;
    dh_dir_init(&d);
    dh_start(&d, NULL);
    attnstat_client *quiet = cli_trainer(d.sock, "quiet", 3, NULL, 0, 0);
    attnstat_client *busy = cli_trainer(d.sock, "busy", 0, NULL, 0, 0);
    cli_push_steps(busy, &rng, 0, 1, 1, 1.0);
    cli_result r = cli_run(d.dir, "--socket", d.sock, "status");
    ck_assert_msg(r.status == 0 && strstr(r.out, "note: run quiet rank 3") &&
                      strstr(r.out, "has pushed nothing") && !strstr(r.out, "run busy rank 0 ("),
                  "%s%s", r.out, r.err);
    cli_result_free(&r);
    attnstat_close(quiet);
    attnstat_close(busy);
    ck_assert_int_eq(dh_stop(&d), 0);
    dh_cleanup(&d, 0);
}
END_TEST

int main(void)
{
    const TTest *tests[] = {test_alerts_filters, test_unknown_options_refused, test_watch_filters,
                            test_operator_commands, test_status_names_a_silent_trainer};
    return cli_run_tests("cli", tests, (int)(sizeof tests / sizeof tests[0]));
}
