/* options.c — the attnstat CLI's option tables (see options.h): data, and two lookups.
 *
 * Stage: a leaf of the CLI; calls libc only. */
#include "options.h"

#include <stddef.h>
#include <string.h>

#define OPT_N(a) ((int)(sizeof(a) / sizeof((a)[0])))

static const char *const opt_formats[] = {"table", "json", "csv", "jsonl", NULL};
static const char *const opt_colors[] = {"auto", "always", "never", NULL};
static const char *const opt_metrics[] = {"entropy_norm", "entropy", "max_logit", NULL};

const opt_spec opt_specs[OPT_COUNT] = {
    [OPT_DB] = {OPT_DB, "--db", NULL, "PATH", OPT_TEXT, 0, 0, NULL},
    [OPT_SOCKET] = {OPT_SOCKET, "--socket", NULL, "PATH", OPT_TEXT, 0, 0, NULL},
    [OPT_FORMAT] = {OPT_FORMAT, "--format", NULL, "F", OPT_CHOICE, 0, 0, opt_formats},
    [OPT_COLOR] = {OPT_COLOR, "--color", NULL, "WHEN", OPT_CHOICE, 0, 0, opt_colors},
    [OPT_HELP] = {OPT_HELP, "--help", "-h", NULL, OPT_FLAG, 0, 0, NULL},
    [OPT_RUN] = {OPT_RUN, "--run", NULL, "R", OPT_TEXT, 0, 0, NULL},
    [OPT_RANK] = {OPT_RANK, "--rank", NULL, "K", OPT_INT, 0, INT32_MAX, NULL},
    [OPT_LAYER] = {OPT_LAYER, "--layer", NULL, "L", OPT_INT, 0, INT32_MAX, NULL},
    [OPT_HEAD] = {OPT_HEAD, "--head", NULL, "H", OPT_INT, 0, INT32_MAX, NULL},
    [OPT_FROM] = {OPT_FROM, "--from", NULL, "S", OPT_INT, INT64_MIN + 1, INT64_MAX, NULL},
    [OPT_TO] = {OPT_TO, "--to", NULL, "S", OPT_INT, INT64_MIN + 1, INT64_MAX, NULL},
    [OPT_EVERY] = {OPT_EVERY, "--every", NULL, "N", OPT_INT, 1, INT64_MAX, NULL},
    [OPT_STEP] = {OPT_STEP, "--step", NULL, "S", OPT_INT, INT64_MIN + 1, INT64_MAX, NULL},
    [OPT_METRIC] = {OPT_METRIC, "--metric", NULL, "M", OPT_CHOICE, 0, 0, opt_metrics},
    [OPT_RULE] = {OPT_RULE, "--rule", NULL, "RULE", OPT_RULE_NAME, 0, 0, NULL},
    [OPT_ACTIVE] = {OPT_ACTIVE, "--active", NULL, NULL, OPT_FLAG, 0, 0, NULL},
    [OPT_SINCE] = {OPT_SINCE, "--since", NULL, "TIME", OPT_TIME, 0, 0, NULL},
    [OPT_NEWEST] = {OPT_NEWEST, "--newest", "-n", "N", OPT_INT, 1, INT64_MAX, NULL},
    [OPT_TIMEOUT] = {OPT_TIMEOUT, "--timeout", NULL, "MS", OPT_INT, 1, INT32_MAX, NULL},
    [OPT_QUICK] = {OPT_QUICK, "--quick", NULL, NULL, OPT_FLAG, 0, 0, NULL},
    [OPT_VERSION] = {OPT_VERSION, "--version", NULL, NULL, OPT_FLAG, 0, 0, NULL},
    [OPT_ID] = {OPT_ID, "--id", NULL, "ID", OPT_INT, 1, INT64_MAX, NULL},
    [OPT_FOR] = {OPT_FOR, "--for", NULL, "SPAN", OPT_SPAN, 0, 0, NULL},
    [OPT_UNTIL] = {OPT_UNTIL, "--until", NULL, "TIME", OPT_TIME, 0, 0, NULL},
    [OPT_DAYS] = {OPT_DAYS, "--days", NULL, "D", OPT_REAL, 0, 0, NULL},
    [OPT_BYTES] = {OPT_BYTES, "--bytes", NULL, "B", OPT_INT, 0, INT64_MAX, NULL},
    [OPT_DEFAULT] = {OPT_DEFAULT, "--default", NULL, NULL, OPT_FLAG, 0, 0, NULL},
};

const opt_use opt_globals[] = {
    {OPT_DB, 0, "database (default $ATTNSTAT_DB, else $XDG_STATE_HOME/attnstat/attnstat.db, "
                "else /var/lib/attnstat/attnstat.db); job and export take it several times, and "
                "a directory for every *.db file in it"},
    {OPT_SOCKET, 0, "attnstatd socket (default $ATTNSTAT_SOCKET, else "
                    "$XDG_RUNTIME_DIR/attnstat/attnstatd.sock, else /run/attnstat/attnstatd.sock)"},
    {OPT_FORMAT, 0, "table (default), json (one object per line; jsonl is the same) or csv"},
    {OPT_COLOR, 0, "auto (default: when stdout is a terminal and NO_COLOR is unset), always, never"},
    {OPT_HELP, 0, "this help; 'attnstat COMMAND --help' for a command's"},
    {OPT_VERSION, 0, "print the version of attnstat and of its libattnstat, and exit"},
};
const int opt_nglobals = OPT_N(opt_globals);

static const opt_use opt_trend[] = {
    {OPT_RUN, 1, "the run, by name or id (see attnstat runs)"},
    {OPT_LAYER, 1, "the layer"},
    {OPT_HEAD, 0, "only this head (default: every head)"},
    {OPT_FROM, 0, "the first step (inclusive)"},
    {OPT_TO, 0, "the last step (inclusive)"},
    {OPT_EVERY, 0, "the first step and every N-th after it"},
    {OPT_RANK, 0, "the rank, for a run with several"},
};

static const opt_use opt_heads[] = {
    {OPT_RUN, 1, "the run, by name or id (see attnstat runs)"},
    {OPT_STEP, 0, "the step (default: the run's latest)"},
    {OPT_METRIC, 0, "entropy_norm (default; low = collapsing), entropy (nats) or max_logit "
                    "(high = logits growing)"},
    {OPT_RANK, 0, "the rank, for a run with several"},
};

static const opt_use opt_alerts[] = {
    {OPT_RUN, 0, "only the alerts of this run (a name or an id)"},
    {OPT_RANK, 0, "only the alerts of runs of this rank"},
    {OPT_LAYER, 0, "only this layer"},
    {OPT_HEAD, 0, "only this head"},
    {OPT_RULE, 0, "only this rule"},
    {OPT_ACTIVE, 0, "only the alerts firing now: per (run, layer, head, rule) the latest "
                    "transition, when it is a raise"},
    {OPT_SINCE, 0, "only transitions at or after TIME: '2024-05-01T12:00:00Z' (RFC 3339), "
                   "'2024-05-01 12:00[:00]' or '2024-05-01' (UTC), or a time ago: '90s', '10m', "
                   "'2h', '3d'"},
    {OPT_NEWEST, 0, "only the newest N (of those the other options keep)"},
};

static const opt_use opt_job[] = {
    {OPT_RUN, 1, "the job: the run name every one of its processes said hello with"},
    {OPT_STEP, 0, "the step (default: the newest step every process of the job has reached)"},
    {OPT_METRIC, 0, "entropy_norm (default; low = collapsing), entropy (nats) or max_logit "
                    "(high = logits growing)"},
};

static const opt_use opt_export[] = {
    {OPT_RUN, 1, "the job: the run name every one of its processes said hello with"},
    {OPT_LAYER, 0, "only this (global) layer"},
    {OPT_FROM, 0, "only samples of steps at or after S"},
    {OPT_TO, 0, "only samples of steps at or before S"},
};

static const opt_use opt_check_db[] = {
    {OPT_QUICK, 0, "PRAGMA quick_check (what attnstatd runs at start: every page read once) "
                   "instead of the full integrity_check"},
};

static const opt_use opt_status[] = {
    {OPT_TIMEOUT, 0, "how long to wait for attnstatd (default 5000)"},
};

static const opt_use opt_mark[] = {
    {OPT_ID, 0, "the alert (its id in attnstat alerts)"},
    {OPT_RUN, 0, "instead: every active alert of this run (a name or an id)"},
    {OPT_RANK, 0, "the rank, for a run with several"},
    {OPT_TIMEOUT, 0, "how long to wait for attnstatd (default 5000)"},
};

static const opt_use opt_silence[] = {
    {OPT_ID, 0, "the alert (its id in attnstat alerts)"},
    {OPT_RUN, 0, "instead: every active alert of this run (a name or an id)"},
    {OPT_RANK, 0, "the rank, for a run with several"},
    {OPT_FOR, 0, "for this long: '90s', '10m', '2h', '3d' (default: until the run ends)"},
    {OPT_UNTIL, 0, "until this time (as --since of alerts)"},
    {OPT_TIMEOUT, 0, "how long to wait for attnstatd (default 5000)"},
};

static const opt_use opt_delete_run[] = {
    {OPT_RUN, 1, "the run, by name or id (see attnstat runs)"},
    {OPT_RANK, 0, "the rank, for a run with several"},
    {OPT_TIMEOUT, 0, "how long to wait for attnstatd (default 5000; a big run takes longer)"},
};

static const opt_use opt_retention[] = {
    {OPT_RUN, 1, "the run, by name or id (see attnstat runs)"},
    {OPT_RANK, 0, "the rank, for a run with several"},
    {OPT_DAYS, 0, "full resolution for this many days (fractions allowed; 0: no age limit)"},
    {OPT_BYTES, 0, "at most this many bytes for the run (0: no size limit)"},
    {OPT_DEFAULT, 0, "back to the daemon's limits (retain_days, retain_bytes)"},
    {OPT_TIMEOUT, 0, "how long to wait for attnstatd (default 5000)"},
};

static const opt_use opt_watch[] = {
    {OPT_RUN, 0, "only the alerts of this run (a name or an id)"},
    {OPT_RANK, 0, "only the alerts of this rank"},
    {OPT_RULE, 0, "only this rule"},
    {OPT_TIMEOUT, 0, "how long to wait for attnstatd to answer the subscription (default 5000)"},
};

const opt_command opt_commands[] = {
    {"runs", 0, "the runs in the database",
     "Lists every run: id, name, rank, host, when it started, its step range, the number of "
     "per-head samples stored and the time of the newest one.",
     "table|json|csv", NULL, 0},
    {"trend", 0, "per-step statistics of one layer, with sparklines",
     "Per-step statistics of one layer (every head, or --head H): rows counted, entropy mean "
     "(nats), normalised entropy mean (0..1), entropy min, max logit, fraction of collapsed rows. "
     "The table ends with a sparkline per head.",
     "table|json|csv", opt_trend, OPT_N(opt_trend)},
    {"heads", 0, "the layer x head grid of one step, as a heatmap",
     "The layer x head grid of one step as a heatmap, so collapsing heads stand out, with the "
     "heads most at risk named. json/csv print one record per cell.",
     "table|json|csv", opt_heads, OPT_N(opt_heads)},
    {"alerts", 0, "alerts raised, cleared and resolved",
     "Alert transitions in the order they happened, of every run or of the ones asked for: "
     "raised, cleared (the samples became good again) or resolved (the run ended: goodbye, "
     "disconnected, idle, deleted; or an operator, by uid). The id is what alerts ack, resolve "
     "and silence take; an acknowledged raise says who and when. Every option narrows the list; "
     "together they all apply.",
     "table|json|csv", opt_alerts, OPT_N(opt_alerts)},
    {"job", 0, "one job's layer x head map across its processes and databases",
     "The layer x head map of one job (every process that said hello with its run name: "
     "tensor-, pipeline-, data- and context-parallel ranks) at one step, by global layer and head "
     "numbers, read from every database given (--db several times, or a directory of *.db files "
     "copied from the nodes). Samples of one head from several processes (data-parallel "
     "replicas, context-parallel ranks) are pooled into the statistics of all their rows. The "
     "table names each process, its ranks and what it holds; json/csv print one record per head "
     "with the ranks that produced it.",
     "table|json|csv", opt_job, OPT_N(opt_job)},
    {"export", 0, "one job's whole history as CSV or JSON lines, for offline analysis",
     "Every sample of every process of one job, from every database given, one row each: the "
     "job, the database, the process's rank, host and parallel layout, then the store's export "
     "columns (global layer and head, step, tier, counts, statistics; a downsampled bucket's "
     "minima and maxima). CSV (the default) has a header and one type per column (empty: no "
     "value), as pandas, pyarrow or DuckDB read it; json (or jsonl, the same) prints one object "
     "per line.",
     "csv|json", opt_export, OPT_N(opt_export)},
    {"check-db", 0, "check the database file for damage",
     "Runs SQLite's integrity_check (or quick_check) on the database, read-only (attnstatd may "
     "be running): prints ok, or the problems found (one a line) and what to do. A database this "
     "attnstat cannot check is said to be one, not damaged: written by a newer attnstat (check "
     "it with that version), by an older one (this attnstatd migrates it), or not attnstat's. "
     "Exit status 0 when the database is whole, 1 when it is damaged or could not be checked.",
     "table|json", opt_check_db, OPT_N(opt_check_db)},
    {"status", 1, "clients, pushes, drops, queue depths, rates",
     "Asks attnstatd for its status: uptime, clients, pushes done / dropped / rejected, push "
     "rate, samples stored, active alerts, each worker's queue, each client.",
     "table|json", opt_status, OPT_N(opt_status)},
    {"alerts ack", 1, "acknowledge an active alert (who and when are recorded)",
     "Acknowledges an active alert (--id), or every active alert of a run (--run): it stays "
     "active, and attnstatd records your uid and the time. /metrics counts the active alerts "
     "nobody acknowledged or silenced (attnstat_run_alerts_unacknowledged). Allowed to the run's "
     "owner, root and attnstatd's user.",
     "table|json", opt_mark, OPT_N(opt_mark)},
    {"alerts resolve", 1, "end an active alert now",
     "Ends an active alert (--id), or every active alert of a run (--run), with a resolved "
     "transition (reason operator, your uid). A head that is still bad raises it again after "
     "raise_after samples. Allowed to the run's owner, root and attnstatd's user.",
     "table|json", opt_mark, OPT_N(opt_mark)},
    {"alerts silence", 1, "stop sending an alert to watchers and --alert-exec for a while",
     "Silences the (run, layer, head, rule) of an active alert (--id), or of every active alert "
     "of a run (--run), until --until, for --for, or until the run ends: its transitions are "
     "still recorded and logged, not sent to attnstat watch or --alert-exec. Allowed to the "
     "run's owner, root and attnstatd's user.",
     "table|json", opt_silence, OPT_N(opt_silence)},
    {"delete-run", 1, "delete a run and all of its history",
     "Deletes a run: its samples of every tier, its alerts and silences, its record. attnstatd "
     "does it in the background, a few thousand samples per transaction between its commits, "
     "and refuses while a client of the run is connected (stop its job first); a run waiting for "
     "its client (run_grace_ms) is ended first. With no attnstatd on --socket, the database is "
     "changed directly (taking the daemon's lock, so never under a running daemon). Allowed to "
     "the run's owner, root and attnstatd's user.",
     "table|json", opt_delete_run, OPT_N(opt_delete_run)},
    {"retention", 1, "a run's own retention limits",
     "Sets a run's own limits, replacing the daemon's retain_days and retain_bytes for it: "
     "--days (full resolution that long; older data downsampled), --bytes (the run's estimated "
     "size), or --default to follow the daemon's again. attnstat runs --format json shows them.",
     "table|json", opt_retention, OPT_N(opt_retention)},
    {"watch", 1, "print alerts as they happen, until interrupted",
     "Subscribes to attnstatd's alerts and prints each as it happens (those the options keep) "
     "until interrupted (Ctrl-C). A daemon that restarts is waited for: one line on stderr when "
     "it goes, one when it is back. Exits 1 when the daemon cannot be reached at the start, or "
     "refuses the watcher when it comes back.",
     "table|json", opt_watch, OPT_N(opt_watch)},
};
const int opt_ncommands = OPT_N(opt_commands);

const opt_spec *opt_find(const char *name)
{
    for (int i = 0; i < OPT_COUNT; i++)
        if (!strcmp(opt_specs[i].name, name) ||
            (opt_specs[i].alias && !strcmp(opt_specs[i].alias, name)))
            return &opt_specs[i];
    return NULL;
}

const opt_command *opt_find_command(const char *name)
{
    for (int i = 0; i < opt_ncommands; i++)
        if (!strcmp(opt_commands[i].name, name))
            return &opt_commands[i];
    return NULL;
}
