/* main.c — the attnstat command-line tool: the command line parsed against the option tables
 * (options.c), the help printed from them, the command run. History commands (runs, trend, heads,
 * alerts; history.c; check-db, checkdb.c) read the database directly through the store's
 * read-only API, so they work with the daemon down, and so do job and export (job.c), which read
 * one job from several databases (--db given more than once); live commands (status, watch;
 * live.c) talk to attnstatd through libattnstat.
 *
 * The command line: attnstat [GLOBAL OPTIONS] COMMAND [OPTIONS]. Global options (--db, --socket,
 * --format, --color, --help, --version) go before or after the command; the others only with a
 * command whose table has them. An option a command does not implement is a usage error that
 * names it: a filter that is not applied must never look applied.
 * Exit status: 0 success, 1 a runtime failure (missing database, unknown run, daemon unreachable),
 * 2 a usage error.
 *
 * Stage: the CLI's entry point. Calls options.c, history.c, checkdb.c, job.c, live.c and
 * libattnstat (attnstat_default_socket, attnstat_rule_name). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "admin.h"
#include "alerts.h"
#include "args.h"
#include "attnstat.h"
#include "checkdb.h"
#include "diff.h"
#include "history.h"
#include "interv.h"
#include "job.h"
#include "live.h"
#include "options.h"
#include "timearg.h"
#include "top.h"
#include "vocab.h"

#define MAIN_WIDTH 98 /* help text is wrapped to this many columns */

/* What runs each command of the table. */
static const struct {
    const char *name;
    int (*run)(const cli_args *a);
} main_runs[] = {
    {"runs", history_runs},     {"trend", history_trend}, {"heads", history_heads},
    {"alerts", alerts_list}, {"status", live_status},  {"watch", live_watch},
    {"check-db", checkdb_run}, {"job", job_map}, {"export", job_export},
    {"alerts ack", admin_alerts_ack}, {"alerts resolve", admin_alerts_resolve},
    {"alerts silence", admin_alerts_silence}, {"alerts silences", alerts_silences},
    {"alerts unsilence", admin_alerts_unsilence}, {"delete-run", admin_delete_run},
    {"retention", admin_retention}, {"top", top_run}, {"diff", diff_run},
    {"interventions", interv_list},
};

/* ---- Help, from the tables --------------------------------------------------------------------*/
/* Writes text wrapped at MAIN_WIDTH, continuation lines indented by indent; col is where the
 * cursor stands. Ends with a newline. */
static void main_wrap(FILE *f, const char *text, int col, int indent)
{
    const char *p = text;
    while (*p) {
        while (*p == ' ')
            p++;
        size_t w = strcspn(p, " ");
        if (!w)
            break;
        if (col > indent && col + 1 + (int)w > MAIN_WIDTH) {
            fprintf(f, "\n%*s", indent, "");
            col = indent;
        } else if (col > indent) {
            fputc(' ', f);
            col++;
        }
        fprintf(f, "%.*s", (int)w, p);
        col += (int)w;
        p += w;
    }
    fputc('\n', f);
}

/* "-n, --newest N", "--run R", "-h, --help" */
static void main_opt_label(char *buf, size_t len, const opt_spec *s)
{
    snprintf(buf, len, "%s%s%s%s%s", s->alias ? s->alias : "", s->alias ? ", " : "", s->name,
             s->arg ? " " : "", s->arg ? s->arg : "");
}

/* The rule names, from vocab.h's rules ("entropy_floor, entropy_drop, ... or distance_floor"). */
static void main_rule_names(char *buf, size_t len)
{
    static const char *const names[] = {
#define X(c, v, name, ...) name,
        VOCAB_RULES(X)
#undef X
    };
    size_t n = 0;
    buf[0] = '\0';
    for (int r = 0; r < VOCAB_NRULES && n < len; r++)
        n += (size_t)snprintf(buf + n, len - n, "%s%s", r == 0 ? "" : r == VOCAB_NRULES - 1 ? " or "
                                                                                        : ", ",
                              names[r]);
}

static void main_opt_lines(FILE *f, const opt_use *uses, int n)
{
    for (int i = 0; i < n; i++) {
        const opt_spec *s = &opt_specs[uses[i].id];
        char label[64], names[160] = "", help[512];
        main_opt_label(label, sizeof label, s);
        if (s->kind == OPT_RULE_NAME)
            main_rule_names(names, sizeof names);
        snprintf(help, sizeof help, "%s%s%s%s", uses[i].help, names[0] ? ": " : "", names,
                 uses[i].required ? " (required)" : "");
        int col = fprintf(f, "  %-16s ", label);
        if (col > 19) {
            fprintf(f, "\n%19s", "");
            col = 19;
        }
        main_wrap(f, help, col, 19);
    }
}

static void main_usage(FILE *f)
{
    fprintf(f, "usage: attnstat [--db PATH] [--socket PATH] COMMAND [OPTIONS]\n");
    for (int live = 0; live <= 1; live++) {
        fprintf(f, "\n%s\n", live ? "Live (talks to attnstatd):"
                                  : "History (reads the database; works with attnstatd stopped):");
        for (int i = 0; i < opt_ncommands; i++) {
            const opt_command *c = &opt_commands[i];
            if (c->live != live)
                continue;
            char syn[128];
            size_t n = (size_t)snprintf(syn, sizeof syn, "%s", c->name);
            for (int k = 0; k < c->nopts; k++)
                if (c->opts[k].required && n < sizeof syn)
                    n += (size_t)snprintf(syn + n, sizeof syn - n, " %s %s",
                                          opt_specs[c->opts[k].id].name,
                                          opt_specs[c->opts[k].id].arg);
            fprintf(f, "  %-28s %s\n", syn, c->summary);
        }
    }
    fprintf(f, "\nGlobal options (before or after the command):\n");
    main_opt_lines(f, opt_globals, opt_nglobals);
    fprintf(f, "\n'attnstat COMMAND --help' (or 'attnstat help COMMAND') lists a command's "
               "options.\nExit status: 0 success, 1 failure (missing database, unknown run, "
               "daemon unreachable), 2 usage.\n");
}

/* One item of a synopsis, on this line when it fits, else on the next (under the first item). */
static void main_syn_item(FILE *f, int *col, const char *item)
{
    int w = (int)strlen(item);
    if (*col + 1 + w > MAIN_WIDTH) {
        fprintf(f, "\n%15s", "");
        *col = 15;
    }
    *col += fprintf(f, " %s", item);
}

static void main_command_help(FILE *f, const opt_command *c)
{
    char item[128];
    int col = fprintf(f, "usage: attnstat");
    main_syn_item(f, &col, c->live ? "[--socket PATH]" : "[--db PATH]");
    main_syn_item(f, &col, c->name);
    for (int k = 0; k < c->nopts; k++) {
        const opt_spec *s = &opt_specs[c->opts[k].id];
        const char *name = s->alias && s->alias[1] != '-' ? s->alias : s->name;
        int opt = !c->opts[k].required;
        snprintf(item, sizeof item, "%s%s%s%s%s", opt ? "[" : "", name, s->arg ? " " : "",
                 s->arg ? s->arg : "", opt ? "]" : "");
        main_syn_item(f, &col, item);
    }
    if (opt_operands(c))
        main_syn_item(f, &col, opt_operands(c));
    snprintf(item, sizeof item, "[--format %s]", c->formats);
    main_syn_item(f, &col, item);
    fprintf(f, "\n\n");
    main_wrap(f, c->description, 0, 0);
    if (c->nopts) {
        fprintf(f, "\nOptions:\n");
        main_opt_lines(f, c->opts, c->nopts);
    } else {
        fprintf(f, "\nNo options of its own.\n");
    }
    fprintf(f, "Global options: --db PATH, --socket PATH, --format F, --color WHEN, -h/--help "
               "(see attnstat --help).\n");
}

/* ---- Values ------------------------------------------------------------------------------------*/
static int main_parse_i64(const char *opt, const char *s, int64_t lo, int64_t hi, int64_t *out)
{
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) {
        fprintf(stderr, "attnstat: %s wants an integer in %lld..%lld, not '%s'\n", opt,
                (long long)lo, (long long)hi, s);
        return -1;
    }
    *out = v;
    return 0;
}

/* A run named by --run or after the command (diff takes several; the last is a->run). */
static int main_add_run(cli_args *a, const char *val)
{
    if (a->nruns == CLI_MAX_RUN_ARGS) {
        fprintf(stderr, "attnstat: more than %d runs named\n", CLI_MAX_RUN_ARGS);
        return -1;
    }
    a->runs[a->nruns++] = val;
    a->run = val;
    return 0;
}

static int main_choice(const char *const *choices, const char *val)
{
    for (int i = 0; choices[i]; i++)
        if (!strcmp(choices[i], val))
            return i;
    return -1;
}

/* Checks val against the option's kind and stores it. Returns -1 on a usage error (reported with
 * the option as the user wrote it: name). */
static int main_set(cli_args *a, const opt_spec *s, const char *name, const char *val)
{
    int64_t v = 0;
    double real = 0;
    int choice = -1;
    switch (s->kind) {
    case OPT_FLAG:
    case OPT_TEXT:
        break;
    case OPT_INT:
        if (main_parse_i64(name, val, s->lo, s->hi, &v) != 0)
            return -1;
        break;
    case OPT_CHOICE:
        choice = main_choice(s->choices, val);
        if (choice < 0) {
            fprintf(stderr, "attnstat: %s is ", name);
            for (int i = 0; s->choices[i]; i++)
                fprintf(stderr, "%s%s", i == 0 ? "" : s->choices[i + 1] ? ", " : " or ",
                        s->choices[i]);
            fprintf(stderr, ", not '%s'\n", val);
            return -1;
        }
        break;
    case OPT_RULE_NAME: {
        int known = 0;
#define X(c, v, rname, ...) known |= !strcmp(rname, val);
        VOCAB_RULES(X)
#undef X
        if (!known) {
            char names[160];
            main_rule_names(names, sizeof names);
            fprintf(stderr, "attnstat: %s is %s, not '%s'\n", name, names, val);
            return -1;
        }
        break;
    }
    case OPT_SPAN: {
        size_t n = strlen(val);
        int64_t ago = 0;
        if (n < 2 || val[0] == '-' || val[n - 1] < 'a' || !strcmp(val, "now") ||
            timearg_parse(val, 0, &ago) != 0 || ago > 0) {
            fprintf(stderr, "attnstat: %s wants a duration such as '90s', '10m', '2h' or '3d', "
                    "not '%s'\n", name, val);
            return -1;
        }
        v = -ago; /* timearg_parse gives now - span */
        break;
    }
    case OPT_REAL: {
        char *end;
        errno = 0;
        real = strtod(val, &end);
        if (errno || end == val || *end || !(real >= 0) || real > 1e9) {
            fprintf(stderr, "attnstat: %s wants a number >= 0, not '%s'\n", name, val);
            return -1;
        }
        break;
    }
    case OPT_TIME: {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        if (timearg_parse(val, (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000, &v) != 0) {
            fprintf(stderr, "attnstat: %s wants a time such as '2024-05-01T12:00:00Z', "
                    "'2024-05-01 12:00' (UTC), 'now' or a time ago such as '-10m' (s, m, h, d), "
                    "not '%s'\n", name, val);
            return -1;
        }
        break;
    }
    }
    switch (s->id) {
    case OPT_DB:
        if (a->ndbs == CLI_MAX_DB_ARGS) {
            fprintf(stderr, "attnstat: --db is given more than %d times (name a directory of "
                    "*.db files instead)\n", CLI_MAX_DB_ARGS);
            return -1;
        }
        a->dbs[a->ndbs++] = val;
        if (!a->db)
            a->db = val;
        a->db_given = 1;
        break;
    case OPT_SOCKET: a->socket = val; break;
    case OPT_FORMAT:
        a->fmt = choice == 1 || choice == 3 ? OUT_JSON : choice == 2 ? OUT_CSV : OUT_TABLE;
        a->fmt_given = 1;
        break;
    case OPT_COLOR: a->color = choice == 1 ? 1 : choice == 2 ? 0 : -1; break;
    case OPT_HELP: a->help = 1; break;
    case OPT_VERSION: a->version = 1; break;
    case OPT_RUN:
        if (main_add_run(a, val) != 0)
            return -1;
        break;
    case OPT_RANK: a->rank = (int32_t)v; break;
    case OPT_LAYER: a->layer = (int32_t)v; a->layer_set = 1; break;
    case OPT_HEAD: a->head = (int32_t)v; break;
    case OPT_FROM: a->from = v; break;
    case OPT_TO: a->to = v; break;
    case OPT_EVERY: a->every = v; break;
    case OPT_STEP: a->step = v; a->step_set = 1; break;
    case OPT_METRIC: a->metric = val; break;
    case OPT_RULE: a->rule = val; break;
    case OPT_ACTIVE: a->active = 1; break;
    case OPT_SINCE: a->since_ms = v; a->since_set = 1; break;
    case OPT_NEWEST: a->newest = v; break;
    case OPT_TIMEOUT: a->timeout_ms = (int)v; break;
    case OPT_QUICK: a->quick = 1; break;
    case OPT_ID: a->alert_id = v; break;
    case OPT_FOR: {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        a->until_ms = (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000 + v;
        a->until_set = 1;
        break;
    }
    case OPT_UNTIL: a->until_ms = v; a->until_set = 1; break;
    case OPT_DAYS: a->days = real; a->days_set = 1; break;
    case OPT_BYTES: a->bytes = v; a->bytes_set = 1; break;
    case OPT_DEFAULT: a->to_default = 1; break;
    case OPT_STATE: a->state = val; break;
    case OPT_UNACKED: a->unacked = 1; break;
    case OPT_SILENCED: a->silenced = 1; break;
    case OPT_BUCKETS: a->buckets = v; break;
    case OPT_PER_HEAD: a->per_head = 1; break;
    case OPT_INTERVAL: a->interval = real; break;
    case OPT_ITERATIONS: a->iterations = v; break;
    case OPT_ONCE: a->iterations = 1; break;
    case OPT_LIMIT: a->limit = v; break;
    case OPT_KIND: a->kind = val; break;
    case OPT_JSON: a->fmt = OUT_JSON; a->fmt_given = 1; break;
    case OPT_INTERVENTIONS: a->interventions = 1; break;
    case OPT_COUNT: break;
    }
    return 0;
}

/* ---- The command line --------------------------------------------------------------------------*/
static int main_uses(const opt_use *uses, int n, opt_id id)
{
    for (int i = 0; i < n; i++)
        if (uses[i].id == id)
            return 1;
    return 0;
}

/* "--run, --layer, ..." of a command, for error messages. */
static void main_list_options(char *buf, size_t len, const opt_command *c)
{
    size_t n = 0;
    buf[0] = '\0';
    for (int i = 0; i < c->nopts && n < len; i++)
        n += (size_t)snprintf(buf + n, len - n, "%s%s", i ? ", " : "",
                              opt_specs[c->opts[i].id].name);
}

/* The option arg names ("--run" of "--run=x"), with its value when written with '='; an alias
 * as command c (may be NULL) takes it. */
static const opt_spec *main_option(const opt_command *c, const char *arg, char *name, size_t len,
                                   const char **val)
{
    const char *eq = strchr(arg, '=');
    snprintf(name, len, "%.*s", eq ? (int)(eq - arg) : (int)strlen(arg), arg);
    *val = eq ? eq + 1 : NULL;
    return opt_find_for(c, name);
}

static int main_is_option(const char *arg)
{
    return arg[0] == '-' && arg[1];
}

/* The index of the first argument from i on that is neither an option nor an option's value, or
 * argc. */
static int main_next_word(int argc, char **argv, int i)
{
    for (; i < argc; i++) {
        if (!main_is_option(argv[i]))
            return i;
        char name[64];
        const char *val;
        const opt_spec *s = main_option(NULL, argv[i], name, sizeof name, &val);
        if (s && s->arg && !val)
            i++;
    }
    return argc;
}

/* The command: the first word (an argument that is neither an option nor an option's value); with
 * the next word when the two name a command ("alerts ack": *sub_i its index, else 0). *cmd_i: the
 * first word's index. */
static const char *main_find_command(int argc, char **argv, cli_args *a, int *cmd_i, int *sub_i)
{
    *cmd_i = main_next_word(argc, argv, 1);
    *sub_i = 0;
    if (*cmd_i >= argc)
        return NULL;
    int j = main_next_word(argc, argv, *cmd_i + 1);
    if (j < argc) {
        snprintf(a->cmd_buf, sizeof a->cmd_buf, "%s %s", argv[*cmd_i], argv[j]);
        if (opt_find_command(a->cmd_buf)) {
            *sub_i = j;
            return a->cmd_buf;
        }
    }
    return argv[*cmd_i];
}

/* Parses the command line into a; *topic is the command of `attnstat help COMMAND`, given[id]
 * says which options were on the line. Returns -1 on a usage error (already reported). */
static int main_parse(int argc, char **argv, cli_args *a, const opt_command **cmd,
                      const char **topic, int given[OPT_COUNT])
{
    memset(a, 0, sizeof *a);
    memset(given, 0, OPT_COUNT * sizeof *given);
    a->color = -1;
    a->rank = -1;
    a->head = -1;
    a->from = INT64_MIN;
    a->to = INT64_MAX;
    a->every = 1;
    a->metric = "entropy_norm";
    a->timeout_ms = 5000;
    *cmd = NULL;
    *topic = NULL;
    int cmd_i, sub_i;
    a->cmd = main_find_command(argc, argv, a, &cmd_i, &sub_i);
    if (a->cmd && strcmp(a->cmd, "help") && !(*cmd = opt_find_command(a->cmd))) {
        fprintf(stderr, "attnstat: unknown command '%s' (commands:", a->cmd);
        for (int i = 0; i < opt_ncommands; i++)
            fprintf(stderr, "%s %s", i ? "," : "", opt_commands[i].name);
        fprintf(stderr, "; see attnstat --help)\n");
        return -1;
    }
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i];
        if (!main_is_option(arg)) {
            if (i == cmd_i || i == sub_i) {
                continue;
            } else if (!*cmd && !*topic && a->cmd) { /* attnstat help COMMAND */
                *topic = arg;
            } else if (opt_operands(*cmd)) { /* attnstat diff RUN_A RUN_B */
                if (main_add_run(a, arg) != 0)
                    return -1;
            } else {
                fprintf(stderr, "attnstat: unexpected argument '%s' (see attnstat %s --help)\n",
                        arg, a->cmd);
                return -1;
            }
            continue;
        }
        char name[64];
        const char *val;
        const opt_spec *s = main_option(*cmd, arg, name, sizeof name, &val);
        if (!s && !*cmd) {
            fprintf(stderr, "attnstat: unknown option '%s' (see attnstat --help)\n", name);
            return -1;
        }
        int global = s && main_uses(opt_globals, opt_nglobals, s->id);
        if (s && !global && !*cmd) {
            fprintf(stderr, "attnstat: %s is an option of a command: put it after the command "
                    "(see attnstat --help)\n", name);
            return -1;
        }
        if (!s || (!global && !main_uses((*cmd)->opts, (*cmd)->nopts, s->id))) {
            char list[256];
            main_list_options(list, sizeof list, *cmd);
            fprintf(stderr, "attnstat: %s has no option %s (its options: %s; see attnstat %s "
                    "--help)\n", (*cmd)->name, name, list[0] ? list : "none", (*cmd)->name);
            return -1;
        }
        if (!s->arg && val) {
            fprintf(stderr, "attnstat: %s takes no value\n", name);
            return -1;
        }
        if (s->arg && !val) {
            if (i + 1 >= argc) {
                fprintf(stderr, "attnstat: %s needs a value\n", name);
                return -1;
            }
            val = argv[++i];
        }
        if (main_set(a, s, name, val) != 0)
            return -1;
        given[s->id] = 1;
    }
    return 0;
}

/* Defaults that come from the environment, then what every command needs. */
static int main_finish(cli_args *a, const opt_command *c, const int given[OPT_COUNT])
{
    if (!a->db) {
        const char *env = getenv("ATTNSTAT_DB");
        const char *xdg = getenv("XDG_STATE_HOME");
        if (env && *env)
            snprintf(a->db_buf, sizeof a->db_buf, "%s", env);
        else if (xdg && *xdg)
            snprintf(a->db_buf, sizeof a->db_buf, "%s/attnstat/attnstat.db", xdg);
        else
            snprintf(a->db_buf, sizeof a->db_buf, "/var/lib/attnstat/attnstat.db");
        a->db = a->db_buf;
        a->dbs[a->ndbs++] = a->db;
    }
    int many = !strcmp(c->name, "job") || !strcmp(c->name, "export");
    if (a->ndbs > 1 && !many) {
        fprintf(stderr, "attnstat: %s reads one database: --db is given %d times (job and export "
                "read several)\n", c->name, a->ndbs);
        return -1;
    }
    if (!strcmp(c->name, "export") && a->fmt == OUT_TABLE) {
        if (a->fmt_given) {
            fprintf(stderr, "attnstat: export prints csv (the default) or json, not a table\n");
            return -1;
        }
        a->fmt = OUT_CSV;
    }
    if (!a->socket) {
        if (!attnstat_default_socket(a->sock_buf, sizeof a->sock_buf)) {
            fprintf(stderr, "attnstat: the default socket path is too long; pass --socket\n");
            return -1;
        }
        a->socket = a->sock_buf;
    }
    if ((a->fmt == OUT_CSV && !strstr(c->formats, "csv")) ||
        (a->fmt == OUT_JSON && !strstr(c->formats, "json")) ||
        (a->fmt == OUT_TABLE && !strstr(c->formats, "table"))) {
        fprintf(stderr, "attnstat: %s prints %s, not %s\n", c->name, c->formats,
                a->fmt == OUT_CSV ? "csv" : a->fmt == OUT_JSON ? "json" : "a table");
        return -1;
    }
    for (int i = 0; i < c->nopts; i++) {
        const opt_spec *s = &opt_specs[c->opts[i].id];
        if (c->opts[i].required && !given[s->id]) {
            fprintf(stderr, "attnstat: %s needs %s %s (see attnstat %s --help)\n", c->name,
                    s->name, s->arg, c->name);
            return -1;
        }
    }
    return 0;
}

int main(int argc, char **argv)
{
    cli_args a;
    const opt_command *cmd;
    const char *topic;
    int given[OPT_COUNT];
    if (main_parse(argc, argv, &a, &cmd, &topic, given) != 0)
        return CLI_EXIT_USAGE;
    if (a.version) {
        printf("attnstat %s (libattnstat %s)\n", ATTNSTAT_VERSION, attnstat_version());
        return CLI_EXIT_OK;
    }
    if (!cmd) { /* no command, or `attnstat help [COMMAND]` */
        if (topic) {
            const opt_command *t = opt_find_command(topic);
            if (!t) {
                fprintf(stderr, "attnstat: no command '%s' (see attnstat --help)\n", topic);
                return CLI_EXIT_USAGE;
            }
            main_command_help(stdout, t);
            return CLI_EXIT_OK;
        }
        main_usage(a.help || a.cmd ? stdout : stderr);
        return a.help || a.cmd ? CLI_EXIT_OK : CLI_EXIT_USAGE;
    }
    if (a.help) {
        main_command_help(stdout, cmd);
        return CLI_EXIT_OK;
    }
    if (main_finish(&a, cmd, given) != 0)
        return CLI_EXIT_USAGE;
    for (size_t i = 0; i < sizeof main_runs / sizeof main_runs[0]; i++)
        if (!strcmp(main_runs[i].name, cmd->name))
            return main_runs[i].run(&a);
    fprintf(stderr, "attnstat: command '%s' has no implementation\n", cmd->name);
    return CLI_EXIT_FAIL;
}
