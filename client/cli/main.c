/* main.c — the attnstat command-line tool: the command line parsed, the command run. History
 * commands (runs, trend, heads, alerts; history.c) read the database directly through the store's
 * read-only API, so they work with the daemon down; live commands (status, watch; live.c) talk to
 * attnstatd through libattnstat.
 * Exit status: 0 success, 1 a runtime failure (missing database, unknown run, daemon unreachable),
 * 2 a usage error.
 *
 * Stage: the CLI's entry point. Calls history.c, live.c and attnstat_default_socket. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "args.h"
#include "attnstat.h"
#include "history.h"
#include "live.h"

/* ---- Help --------------------------------------------------------------------------------------*/
static const char cli_usage[] =
    "usage: attnstat [--db PATH] [--socket PATH] COMMAND [OPTIONS]\n"
    "\n"
    "History (reads the database; works with attnstatd stopped):\n"
    "  runs                         the runs in the database\n"
    "  trend --run R --layer L      per-step statistics of one layer, with sparklines\n"
    "  heads --run R                the layer x head grid of one step, as a heatmap\n"
    "  alerts [--run R] [--active]  alerts raised and cleared\n"
    "Live (talks to attnstatd):\n"
    "  status                       clients, pushes, drops, queue depths, rates\n"
    "  watch                        print alerts as they happen, until interrupted\n"
    "\n"
    "Global options:\n"
    "  --db PATH        database (default $ATTNSTAT_DB, else $XDG_STATE_HOME/attnstat/attnstat.db,\n"
    "                   else /var/lib/attnstat/attnstat.db)\n"
    "  --socket PATH    attnstatd socket (default $ATTNSTAT_SOCKET, else\n"
    "                   $XDG_RUNTIME_DIR/attnstat/attnstatd.sock, else /run/attnstat/attnstatd.sock)\n"
    "  --format F       table (default), json (one object per line) or csv\n"
    "  --color WHEN     auto (default: when stdout is a terminal and NO_COLOR is unset), always, never\n"
    "  -h, --help       this help; 'attnstat COMMAND --help' for a command's\n"
    "\n"
    "Exit status: 0 success, 1 failure (missing database, unknown run, daemon unreachable), 2 usage.\n";

static void cli_command_help(const char *cmd)
{
    if (!strcmp(cmd, "runs"))
        printf("usage: attnstat [--db PATH] runs [--format table|json|csv]\n\n"
               "Lists every run: id, name, rank, host, when it started, its step range, the number\n"
               "of per-head samples stored and the time of the newest one.\n");
    else if (!strcmp(cmd, "trend"))
        printf("usage: attnstat [--db PATH] trend --run R --layer L [--head H] [--from S] [--to S]\n"
               "                [--every N] [--rank K] [--format table|json|csv]\n\n"
               "Per-step statistics of one layer (every head, or --head H): rows counted, entropy\n"
               "mean (nats), normalised entropy mean (0..1), entropy min, max logit, fraction of\n"
               "collapsed rows. --from/--to bound the steps (inclusive); --every N keeps the first\n"
               "step and every N-th after it. The table ends with a sparkline per head.\n"
               "R is a run name or id; --rank picks one rank of a multi-rank run.\n");
    else if (!strcmp(cmd, "heads"))
        printf("usage: attnstat [--db PATH] heads --run R [--step S] [--metric M] [--rank K]\n"
               "                [--format table|json|csv] [--color auto|always|never]\n\n"
               "The layer x head grid of one step (default: the run's latest) as a heatmap, so\n"
               "collapsing heads stand out. M is entropy_norm (default; low = collapsing), entropy\n"
               "(nats) or max_logit (high = logits growing). json/csv print one record per cell.\n");
    else if (!strcmp(cmd, "alerts"))
        printf("usage: attnstat [--db PATH] alerts [--run R] [--rank K] [--active]\n"
               "                [--format table|json|csv]\n\n"
               "Alert transitions (raised / cleared) in the order they happened, of one run or of\n"
               "all. --active keeps, per (run, layer, head, rule), the latest transition when it\n"
               "is a raise: the alerts firing now.\n");
    else if (!strcmp(cmd, "status"))
        printf("usage: attnstat [--socket PATH] status [--format table|json] [--timeout MS]\n\n"
               "Asks attnstatd for its status: uptime, clients, pushes done / dropped / rejected,\n"
               "push rate, samples stored, active alerts, each worker's queue, each client.\n");
    else if (!strcmp(cmd, "watch"))
        printf("usage: attnstat [--socket PATH] watch [--format table|json]\n\n"
               "Subscribes to attnstatd's alerts and prints each as it happens until interrupted\n"
               "(Ctrl-C). Exits 1 when the daemon goes away.\n");
    else
        fputs(cli_usage, stdout);
}

/* ---- Argument parsing --------------------------------------------------------------------------*/
static int cli_parse_i64(const char *opt, const char *s, int64_t lo, int64_t hi, int64_t *out)
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

static void cli_default_db(cli_args *a)
{
    const char *env = getenv("ATTNSTAT_DB");
    const char *xdg = getenv("XDG_STATE_HOME");
    if (env && *env)
        snprintf(a->db_buf, sizeof a->db_buf, "%s", env);
    else if (xdg && *xdg)
        snprintf(a->db_buf, sizeof a->db_buf, "%s/attnstat/attnstat.db", xdg);
    else
        snprintf(a->db_buf, sizeof a->db_buf, "/var/lib/attnstat/attnstat.db");
    a->db = a->db_buf;
}

/* Returns -1 on a usage error (already reported). */
static int cli_parse(int argc, char **argv, cli_args *a)
{
    memset(a, 0, sizeof *a);
    a->color = -1;
    a->rank = -1;
    a->head = -1;
    a->from = INT64_MIN;
    a->to = INT64_MAX;
    a->every = 1;
    a->metric = "entropy_norm";
    a->timeout_ms = 5000;
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i];
        if (arg[0] != '-' || !arg[1]) {
            if (a->cmd) {
                fprintf(stderr, "attnstat: unexpected argument '%s' (see attnstat %s --help)\n",
                        arg, a->cmd);
                return -1;
            }
            a->cmd = arg;
            continue;
        }
        if (!strcmp(arg, "-h") || !strcmp(arg, "--help")) {
            a->help = 1;
            continue;
        }
        if (!strcmp(arg, "--active")) {
            a->active = 1;
            continue;
        }
        /* Options with a value: "--opt V" or "--opt=V". */
        char name[64];
        const char *val = NULL;
        const char *eq = strchr(arg, '=');
        if (eq) {
            snprintf(name, sizeof name, "%.*s", (int)(eq - arg), arg);
            val = eq + 1;
        } else {
            snprintf(name, sizeof name, "%s", arg);
        }
        static const char *const valued[] = {"--db", "--socket", "--format", "--color", "--run",
                                             "--rank", "--layer", "--head", "--from", "--to",
                                             "--every", "--step", "--metric", "--timeout"};
        int known = 0;
        for (size_t k = 0; k < sizeof valued / sizeof valued[0]; k++)
            known |= !strcmp(name, valued[k]);
        if (!known) {
            fprintf(stderr, "attnstat: unknown option '%s' (see attnstat --help)\n", name);
            return -1;
        }
        if (!val) {
            if (i + 1 >= argc) {
                fprintf(stderr, "attnstat: %s needs a value\n", name);
                return -1;
            }
            val = argv[++i];
        }
        int64_t v;
        if (!strcmp(name, "--db")) {
            a->db = val;
        } else if (!strcmp(name, "--socket")) {
            a->socket = val;
        } else if (!strcmp(name, "--format")) {
            if (!strcmp(val, "table"))
                a->fmt = OUT_TABLE;
            else if (!strcmp(val, "json"))
                a->fmt = OUT_JSON;
            else if (!strcmp(val, "csv"))
                a->fmt = OUT_CSV;
            else {
                fprintf(stderr, "attnstat: --format is table, json or csv, not '%s'\n", val);
                return -1;
            }
        } else if (!strcmp(name, "--color")) {
            if (!strcmp(val, "auto"))
                a->color = -1;
            else if (!strcmp(val, "always"))
                a->color = 1;
            else if (!strcmp(val, "never"))
                a->color = 0;
            else {
                fprintf(stderr, "attnstat: --color is auto, always or never, not '%s'\n", val);
                return -1;
            }
        } else if (!strcmp(name, "--run")) {
            a->run = val;
        } else if (!strcmp(name, "--metric")) {
            if (strcmp(val, "entropy_norm") && strcmp(val, "entropy") && strcmp(val, "max_logit")) {
                fprintf(stderr, "attnstat: --metric is entropy_norm, entropy or max_logit, not '%s'\n",
                        val);
                return -1;
            }
            a->metric = val;
        } else {
            int64_t lo = !strcmp(name, "--every") || !strcmp(name, "--timeout") ? 1
                       : !strcmp(name, "--from") || !strcmp(name, "--to") || !strcmp(name, "--step")
                           ? INT64_MIN + 1
                           : 0;
            int64_t hi = !strcmp(name, "--layer") || !strcmp(name, "--head") ||
                                 !strcmp(name, "--rank") || !strcmp(name, "--timeout")
                             ? INT32_MAX
                             : INT64_MAX;
            if (cli_parse_i64(name, val, lo, hi, &v) != 0)
                return -1;
            if (!strcmp(name, "--rank"))
                a->rank = (int32_t)v;
            else if (!strcmp(name, "--layer")) {
                a->layer = (int32_t)v;
                a->layer_set = 1;
            } else if (!strcmp(name, "--head"))
                a->head = (int32_t)v;
            else if (!strcmp(name, "--from"))
                a->from = v;
            else if (!strcmp(name, "--to"))
                a->to = v;
            else if (!strcmp(name, "--every"))
                a->every = v;
            else if (!strcmp(name, "--step")) {
                a->step = v;
                a->step_set = 1;
            }
            else if (!strcmp(name, "--timeout"))
                a->timeout_ms = (int)v;
        }
    }
    if (!a->db)
        cli_default_db(a);
    if (!a->socket) {
        if (!attnstat_default_socket(a->sock_buf, sizeof a->sock_buf)) {
            fprintf(stderr, "attnstat: the default socket path is too long; pass --socket\n");
            return -1;
        }
        a->socket = a->sock_buf;
    }
    return 0;
}

int main(int argc, char **argv)
{
    cli_args a;
    if (cli_parse(argc, argv, &a) != 0)
        return CLI_EXIT_USAGE;
    if (!a.cmd || !strcmp(a.cmd, "help")) {
        if (a.cmd && argc > 2)
            for (int i = 2; i < argc; i++)
                if (argv[i][0] != '-') {
                    cli_command_help(argv[i]);
                    return CLI_EXIT_OK;
                }
        fputs(cli_usage, a.help || a.cmd ? stdout : stderr);
        return a.help || a.cmd ? CLI_EXIT_OK : CLI_EXIT_USAGE;
    }
    static const char *const cmds[] = {"runs", "trend", "heads", "alerts", "status", "watch"};
    int known = 0;
    for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++)
        known |= !strcmp(a.cmd, cmds[i]);
    if (!known) {
        fprintf(stderr, "attnstat: unknown command '%s' (commands: runs, trend, heads, alerts, "
                "status, watch; see attnstat --help)\n", a.cmd);
        return CLI_EXIT_USAGE;
    }
    if (a.help) {
        cli_command_help(a.cmd);
        return CLI_EXIT_OK;
    }
    if ((!strcmp(a.cmd, "status") || !strcmp(a.cmd, "watch")) && a.fmt == OUT_CSV) {
        fprintf(stderr, "attnstat: %s prints table or json, not csv\n", a.cmd);
        return CLI_EXIT_USAGE;
    }
    if (!strcmp(a.cmd, "runs"))
        return history_runs(&a);
    if (!strcmp(a.cmd, "trend"))
        return history_trend(&a);
    if (!strcmp(a.cmd, "heads"))
        return history_heads(&a);
    if (!strcmp(a.cmd, "alerts"))
        return history_alerts(&a);
    if (!strcmp(a.cmd, "status"))
        return live_status(&a);
    return live_watch(&a);
}
