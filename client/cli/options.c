/* options.c — the attnstat CLI's option tables (see options.h): data, and two lookups.
 *
 * Stage: a leaf of the CLI; calls libc only (the --metric choices come from vocab.h's rows). */
#include "options.h"

#include <stddef.h>
#include <string.h>

#include "vocab.h"

#define OPT_N(a) ((int)(sizeof(a) / sizeof((a)[0])))

static const char *const opt_formats[] = {"table", "json", "csv", "jsonl", NULL};
static const char *const opt_colors[] = {"auto", "always", "never", NULL};
/* The --metric choices: the statistics the alert rules read (VOCAB_RULES' stat where it is a
 * VOCAB_STATS row), in the rules' order, each by its name less a trailing "_mean" (entropy_norm,
 * entropy, max_logit, sink_mass, distance: the names the option has always taken). Filled before
 * main runs, so that every program built with this table (the CLI, attnstat-docgen) has them. */
const char *opt_metrics[VOCAB_NSTATS + 1];
static char opt_metric_names[VOCAB_NSTATS][64];

__attribute__((constructor)) static void opt_metrics_init(void)
{
    static const char *const stats[] = {
#define X(name, ...) #name,
        VOCAB_STATS(X)
#undef X
    };
    static const char *const read[] = {
#define X(c, v, rname, stat, ...) #stat,
        VOCAB_RULES(X)
#undef X
    };
    int n = 0;
    for (int r = 0; r < OPT_N(read); r++) {
        int is_stat = 0;
        for (int i = 0; i < OPT_N(stats); i++)
            is_stat |= !strcmp(stats[i], read[r]);
        size_t len = strlen(read[r]);
        if (len > 5 && !strcmp(read[r] + len - 5, "_mean"))
            len -= 5;
        if (!is_stat || len >= sizeof opt_metric_names[0])
            continue;
        int seen = 0;
        for (int k = 0; k < n; k++)
            seen |= !strncmp(opt_metrics[k], read[r], len) && opt_metrics[k][len] == '\0';
        if (seen)
            continue;
        memcpy(opt_metric_names[n], read[r], len);
        opt_metric_names[n][len] = '\0';
        opt_metrics[n] = opt_metric_names[n];
        n++;
    }
    opt_metrics[n] = NULL;
}

static const char *const opt_states[] = {"firing", "raised", "cleared", "resolved", NULL};

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
    [OPT_STATE] = {OPT_STATE, "--state", NULL, "S", OPT_CHOICE, 0, 0, opt_states},
    [OPT_UNACKED] = {OPT_UNACKED, "--unacked", NULL, NULL, OPT_FLAG, 0, 0, NULL},
    [OPT_SILENCED] = {OPT_SILENCED, "--silenced", NULL, NULL, OPT_FLAG, 0, 0, NULL},
    [OPT_BUCKETS] = {OPT_BUCKETS, "--buckets", NULL, "N", OPT_INT, 1, 100000, NULL},
    [OPT_PER_HEAD] = {OPT_PER_HEAD, "--per-head", NULL, NULL, OPT_FLAG, 0, 0, NULL},
    [OPT_INTERVAL] = {OPT_INTERVAL, "--interval", "-d", "S", OPT_REAL, 0, 0, NULL},
    [OPT_ITERATIONS] = {OPT_ITERATIONS, "--iterations", "-n", "N", OPT_INT, 1, INT64_MAX, NULL},
    [OPT_ONCE] = {OPT_ONCE, "--once", NULL, NULL, OPT_FLAG, 0, 0, NULL},
    [OPT_LIMIT] = {OPT_LIMIT, "--limit", "-n", "N", OPT_INT, 1, INT64_MAX, NULL},
    [OPT_KIND] = {OPT_KIND, "--kind", NULL, "K", OPT_TEXT, 0, 0, NULL},
    [OPT_JSON] = {OPT_JSON, "--json", NULL, NULL, OPT_FLAG, 0, 0, NULL},
    [OPT_INTERVENTIONS] = {OPT_INTERVENTIONS, "--interventions", NULL, NULL, OPT_FLAG, 0, 0, NULL},
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

#define OPT_TIME_FORMS                                                                             \
    "'2024-05-01T12:00:00Z' (RFC 3339), '2024-05-01 12:00[:00]' or '2024-05-01' (UTC), 'now', " \
    "or a time ago: '-90s', '-30m', '-1h', '-2d' (the '-' may be left out)"
#define OPT_SINCE_STEPS                                                                            \
    "only the steps stored at or after TIME (those after the last step stored before it): "      \
    OPT_TIME_FORMS
#define OPT_UNTIL_STEPS "only the steps stored at or before TIME (as --since)"

static const opt_use opt_trend[] = {
    {OPT_RUN, 1, "the run, by name or id (see attnstat runs)"},
    {OPT_LAYER, 1, "the layer"},
    {OPT_HEAD, 0, "only this head, every sample of it (default: the layer summarised)"},
    {OPT_FROM, 0, "the first step (inclusive)"},
    {OPT_TO, 0, "the last step (inclusive)"},
    {OPT_SINCE, 0, OPT_SINCE_STEPS},
    {OPT_UNTIL, 0, OPT_UNTIL_STEPS},
    {OPT_BUCKETS, 0, "the layer's summary in at most N buckets of steps (default 30)"},
    {OPT_PER_HEAD, 0, "every sample of every head instead of the summary"},
    {OPT_EVERY, 0, "with --head or --per-head: the first step and every N-th after it"},
    {OPT_RANK, 0, "the rank, for a run with several"},
};

static const opt_use opt_heads[] = {
    {OPT_RUN, 1, "the run, by name or id (see attnstat runs)"},
    {OPT_STEP, 0, "the step (default: the run's latest)"},
    {OPT_SINCE, 0, "the latest step stored at or after TIME (with --until: in between): "
                   OPT_TIME_FORMS},
    {OPT_UNTIL, 0, "the latest step stored at or before TIME: the grid as it was then"},
    {OPT_METRIC, 0, "a statistic an alert rule watches: entropy_norm (default; low = "
                    "collapsing), entropy (nats), max_logit (high = logits growing), sink_mass "
                    "(high = attention parked on the first key) or distance (positions; low = "
                    "attention kept local)"},
    {OPT_RANK, 0, "the rank, for a run with several"},
};

static const opt_use opt_top[] = {
    {OPT_RUN, 1, "the run, by name or id (live: every process of the job of that name)"},
    {OPT_RANK, 0, "the rank, for a run with several: that process only (live: when the "
                  "database the daemon names has the run at the start)"},
    {OPT_INTERVAL, 0, "seconds between two frames (default 2; fractions allowed, at least 0.1)"},
    {OPT_ITERATIONS, 0, "print N frames, then exit"},
    {OPT_ONCE, 0, "print one frame and exit (-n 1)"},
    {OPT_TIMEOUT, 0, "how long to wait for attnstatd to answer (default 5000)"},
};

static const opt_use opt_diff[] = {
    {OPT_RUN, 0, "a run to compare (a name or an id), given twice or more; or name the runs "
                 "after the command"},
    {OPT_LAYER, 0, "only this layer"},
    {OPT_FROM, 0, "the first step (default: the steps every run has)"},
    {OPT_TO, 0, "the last step (default: the steps every run has)"},
    {OPT_STEP, 0, "one step only (--from S --to S)"},
    {OPT_SINCE, 0, "each run's steps stored at or after TIME: " OPT_TIME_FORMS},
    {OPT_UNTIL, 0, "each run's steps stored at or before TIME (as --since)"},
    {OPT_METRIC, 0, "the change the rows are sorted by: entropy_norm (default), entropy, "
                    "max_logit, sink_mass or distance"},
    {OPT_LIMIT, 0, "only the N largest changes"},
};

static const opt_use opt_alerts[] = {
    {OPT_RUN, 0, "only the alerts of this run (a name or an id)"},
    {OPT_RANK, 0, "only the alerts of runs of this rank"},
    {OPT_LAYER, 0, "only this layer"},
    {OPT_HEAD, 0, "only this head"},
    {OPT_RULE, 0, "only this rule"},
    {OPT_ACTIVE, 0, "only the alerts firing now: per (run, layer, head, rule) the latest "
                    "transition, when it is a raise"},
    {OPT_STATE, 0, "only this state: firing (a raise still active, as --active), raised (every "
                   "raise, firing or ended since), cleared or resolved"},
    {OPT_UNACKED, 0, "only the alerts firing now that nobody acknowledged or silenced (what "
                     "attnstat_run_alerts_unacknowledged counts)"},
    {OPT_SILENCED, 0, "only the alerts firing now whose (run, layer, head, rule) a silence holds"},
    {OPT_SINCE, 0, "only transitions at or after TIME: '2024-05-01T12:00:00Z' (RFC 3339), "
                   "'2024-05-01 12:00[:00]' or '2024-05-01' (UTC), or a time ago: '90s', '10m', "
                   "'2h', '3d'"},
    {OPT_NEWEST, 0, "only the newest N (of those the other options keep)"},
};

static const opt_use opt_job[] = {
    {OPT_RUN, 1, "the job: the run name every one of its processes said hello with"},
    {OPT_STEP, 0, "the step (default: the newest step every process of the job has reached)"},
    {OPT_METRIC, 0, "a statistic an alert rule watches: entropy_norm (default; low = "
                    "collapsing), entropy (nats), max_logit (high = logits growing), sink_mass "
                    "(high = attention parked on the first key) or distance (positions; low = "
                    "attention kept local)"},
};

static const opt_use opt_export[] = {
    {OPT_RUN, 1, "the job: the run name every one of its processes said hello with"},
    {OPT_LAYER, 0, "only this (global) layer"},
    {OPT_FROM, 0, "only samples of steps at or after S"},
    {OPT_TO, 0, "only samples of steps at or before S"},
    {OPT_SINCE, 0, "only each process's steps stored at or after TIME (those after its last step "
                   "stored before it): " OPT_TIME_FORMS},
    {OPT_UNTIL, 0, "only each process's steps stored at or before TIME (as --since)"},
    {OPT_INTERVENTIONS, 0, "the job's interventions (qk_clip's clips) instead of its samples: "
                           "one row each, the same leading columns, then time, step, layer, "
                           "kind, heads and values (JSON arrays), threshold, measured, detail, "
                           "id; --since/--until then take the time each was recorded"},
    {OPT_KIND, 0, "with --interventions: only this kind"},
};

static const opt_use opt_interventions[] = {
    {OPT_RUN, 0, "the run, by name or id (or name it after the command); a name several ranks "
                 "share lists every rank's"},
    {OPT_RANK, 0, "only this rank of the run"},
    {OPT_LAYER, 0, "only this (global) layer"},
    {OPT_KIND, 0, "only this kind (qk_clip, ...)"},
    {OPT_SINCE, 0, "only those received at or after TIME: " OPT_TIME_FORMS},
    {OPT_UNTIL, 0, "only those received at or before TIME (as --since)"},
    {OPT_JSON, 0, "one JSON object a line (--format json)"},
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

static const opt_use opt_silences[] = {
    {OPT_RUN, 0, "only the silences of this run (a name or an id)"},
    {OPT_RANK, 0, "the rank, for a run with several"},
};

static const opt_use opt_unsilence[] = {
    {OPT_ID, 0, "the silence (its id in attnstat alerts silences)"},
    {OPT_RUN, 0, "instead: every silence of this run in force (a name or an id)"},
    {OPT_RANK, 0, "the rank, for a run with several"},
    {OPT_TIMEOUT, 0, "how long to wait for attnstatd (default 5000)"},
};

static const opt_use opt_delete_run[] = {
    {OPT_RUN, 1, "the run, by name or id (see attnstat runs)"},
    {OPT_RANK, 0, "the rank, for a run with several"},
    {OPT_TIMEOUT, 0, "how long to wait for attnstatd (default 5000; a big run takes longer)"},
};

static const opt_use opt_retention[] = {
    {OPT_RUN, 1, "the run, by name or id (see attnstat runs); alone, its limits are shown"},
    {OPT_RANK, 0, "the rank, for a run with several"},
    {OPT_DAYS, 0, "full resolution for this many days (fractions allowed; 0: no age limit); "
                  "the size limit stays as it is"},
    {OPT_BYTES, 0, "at most this many bytes for the run (0: no size limit); the age limit stays "
                   "as it is"},
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
     "Lists every run: id, name, rank, host, its state (live, or ended) and why it ended "
     "(goodbye, disconnected, idle, deleted), when it started and for how long it ran (to its "
     "end, or until now), the time of its newest sample, its step range, the number of per-head "
     "samples stored, its alerts firing now and its own retention limits (default: the "
     "daemon's; attnstat retention says them in full, with the daemon's). A run attnstatd has "
     "not seen end is live: one whose daemon stopped shows so until the daemon starts again and "
     "ends it. "
     "json/csv add when it ended, the durations in ms, retain_ms / retain_bytes (-1: the "
     "daemon's, 0: none) and its estimated bytes.",
     "table|json|csv", NULL, 0},
    {"trend", 0, "one layer over steps: a summary of its heads, or one head's samples",
     "One layer over steps. By default a summary of its heads: the steps in at most --buckets "
     "buckets of equal width, and per bucket the samples and heads it holds, the minimum, mean "
     "and maximum over them of the normalised entropy (0..1; the head with the minimum named) and "
     "of the max logit, the mean entropy (nats), the collapsed fraction's mean and the non-finite "
     "rows; the table ends with sparklines of the minimum entropy and the maximum logit. With "
     "--head H (or --per-head: every head) the samples themselves, one row each: rows counted, "
     "entropy mean (nats), normalised entropy mean, entropy min, max logit, fraction of collapsed "
     "rows, and a sparkline per head. --since/--until select steps by when they were stored.",
     "table|json|csv", opt_trend, OPT_N(opt_trend)},
    {"heads", 0, "the layer x head grid of one step, as a heatmap",
     "The layer x head grid of one step as a heatmap, so collapsing heads stand out, with the "
     "heads most at risk named: the run's latest step, --step S, or the latest step stored in "
     "--since/--until. json/csv print one record per cell.",
     "table|json|csv", opt_heads, OPT_N(opt_heads)},
    {"alerts", 0, "alerts raised, cleared and resolved",
     "Alert transitions in the order they happened, of every run or of the ones asked for: "
     "raised, cleared (the samples became good again) or resolved (the run ended: goodbye, "
     "disconnected, idle, deleted; or an operator, by uid). The id is what alerts ack, resolve "
     "and silence take; a raise still active says firing (json/csv: state raised, firing 1); an "
     "acknowledged raise says who and when; a firing alert that a silence holds says until when "
     "(run end: until its run ends; json/csv: silence_id, silenced_by, silenced_until_ms, 0 for "
     "the run's end). Every option narrows the list; together they all apply.",
     "table|json|csv", opt_alerts, OPT_N(opt_alerts)},
    {"alerts silences", 0, "the silences in force",
     "Lists the silences in force, of every run or of --run: the id that alerts unsilence takes, "
     "the run, layer, head and rule they hold, who set them and when, and until when (run end: "
     "until the run ends). A new silence of the same (run, layer, head, rule) replaces the one "
     "before.",
     "table|json|csv", opt_silences, OPT_N(opt_silences)},
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
     "per line. --interventions exports the job's interventions (what it did to its model: "
     "qk_clip's clips) the same way instead.",
     "csv|json", opt_export, OPT_N(opt_export)},
    {"diff", 0, "compare runs side by side per (layer, head)",
     "Compares two runs or more (attnstat diff RUN_A RUN_B, or --run given twice or more) per "
     "(layer, head): each run's mean normalised entropy, mean entropy (nats) and largest max "
     "logit over the steps compared, and each later run's difference from the first, the rows "
     "sorted by the largest change of --metric. The steps compared: by default those every run "
     "has (from the latest first step to the earliest last step), else --from/--to, --step, or "
     "each run's own steps stored in --since/--until. A head one run lacks shows '-', and sorts "
     "last.",
     "table|json|csv", opt_diff, OPT_N(opt_diff)},
    {"interventions", 0, "what a job did to its model because of what was measured (qk_clip)",
     "What the training job did to its model because of what attnstat measured, as it told "
     "attnstatd (an Intervention: attnstat.torch.qk_clip sends one per layer it clipped), by "
     "run, then step: when attnstatd received it, the process's rank, the step whose "
     "measurements it acted on, the global layer, the kind, the global query heads with the "
     "value of each (qk_clip: the factor the head's logits scale by), the threshold (qk_clip: "
     "tau) and the measured value (qk_clip: the largest max logit among the heads). A table "
     "shows the first 12 heads of a row; json (one object a line) and csv carry them all, with "
     "the values, the detail the job sent and the time in ms.",
     "table|json|csv", opt_interventions, OPT_N(opt_interventions)},
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
     "still recorded and logged, not sent to attnstat watch or --alert-exec. It replaces a "
     "silence of the same (run, layer, head, rule); attnstat alerts silences lists them, alerts "
     "unsilence ends one. Allowed to the run's owner, root and attnstatd's user.",
     "table|json", opt_silence, OPT_N(opt_silence)},
    {"alerts unsilence", 1, "end a silence now",
     "Ends a silence in force (--id, from attnstat alerts silences), or every silence of a run "
     "(--run): the transitions of its (run, layer, head, rule) are sent to attnstat watch and "
     "--alert-exec again from now on. The silence stays in the database, ended now. Allowed to "
     "the run's owner, root and attnstatd's user.",
     "table|json", opt_unsilence, OPT_N(opt_unsilence)},
    {"delete-run", 1, "delete a run and all of its history",
     "Deletes a run: its samples of every tier, its alerts and silences, its record. attnstatd "
     "does it in the background, a few thousand samples per transaction between its commits, "
     "and refuses while a client of the run is connected (stop its job first); a run waiting for "
     "its client (run_grace_ms) is ended first. With no attnstatd on --socket, the database is "
     "changed directly (taking the daemon's lock, so never under a running daemon). Allowed to "
     "the run's owner, root and attnstatd's user.",
     "table|json", opt_delete_run, OPT_N(opt_delete_run)},
    {"retention", 1, "show or set a run's own retention limits",
     "Sets a run's own limits, replacing the daemon's retain_days and retain_bytes for it: "
     "--days (full resolution that long; older data downsampled), --bytes (the run's estimated "
     "size), or --default to follow the daemon's again (both). A limit not given stays as it "
     "is. With --run alone, shows the run's limits (its own, or the daemon's, which attnstatd is "
     "asked for) and its estimated size; attnstat runs lists every run's.",
     "table|json", opt_retention, OPT_N(opt_retention)},
    {"top", 1, "a refreshing view of one run: heatmaps, worst heads, alerts",
     "A view of one run that refreshes every --interval seconds, as nvidia-smi -l does: the "
     "layer x head heatmaps of the normalised entropy and of the max logit (a cell is the worst "
     "of the heads and layers it stands for when the grid is wider or taller than the terminal), "
     "the heads most at risk with their change since the previous frame (the first frame: since "
     "the run's previous step), and the run's latest alerts. Live from attnstatd's results and "
     "alerts (the first frame from the database it names, when readable); without a daemon on "
     "--socket, or with --db given, from the database, read again every frame. On a terminal "
     "the frame is redrawn in place (q or Ctrl-C quits); otherwise (a pipe, a file) or with "
     "--once / -n N, plain frames without escape codes follow each other, each starting with "
     "its time.",
     "table", opt_top, OPT_N(opt_top)},
    {"watch", 1, "print alerts as they happen, until interrupted",
     "Subscribes to attnstatd's alerts and prints each as it happens (those the options keep) "
     "until interrupted (Ctrl-C). A daemon that restarts is waited for: one line on stderr when "
     "it goes, one when it is back. Exits 1 when the daemon cannot be reached at the start, or "
     "refuses the watcher when it comes back.",
     "table|json", opt_watch, OPT_N(opt_watch)},
};
const int opt_ncommands = OPT_N(opt_commands);

/* The commands that take words after their name. */
static const struct {
    const char *command, *operands;
} opt_command_operands[] = {
    {"diff", "[RUN...]"},
    {"interventions", "[RUN]"},
};

const char *opt_operands(const opt_command *c)
{
    for (int i = 0; c && i < OPT_N(opt_command_operands); i++)
        if (!strcmp(opt_command_operands[i].command, c->name))
            return opt_command_operands[i].operands;
    return NULL;
}

const opt_spec *opt_find_for(const opt_command *c, const char *name)
{
    for (int i = 0; c && i < c->nopts; i++) {
        const opt_spec *s = &opt_specs[c->opts[i].id];
        if (!strcmp(s->name, name) || (s->alias && !strcmp(s->alias, name)))
            return s;
    }
    return opt_find(name);
}

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
