/* options.h — the attnstat CLI's command line as data: every option (its name, argument and the
 * values it takes), the global options, and per command the options it accepts with their help.
 * main.c parses the command line and prints `attnstat --help` and `attnstat COMMAND --help` from
 * these tables alone; a manual page can be generated from them the same way. Nothing here is code
 * but two lookups.
 *
 * The rule: a command accepts exactly the options in its table (plus the global ones); any other
 * option is a usage error that names the option and the command.
 *
 * Stage: a leaf of the CLI (data); includes libc only. */
#ifndef ATTNSTAT_CLI_OPTIONS_H
#define ATTNSTAT_CLI_OPTIONS_H

#include <stdint.h>

typedef enum {
    OPT_DB,
    OPT_SOCKET,
    OPT_FORMAT,
    OPT_COLOR,
    OPT_HELP,
    OPT_RUN,
    OPT_RANK,
    OPT_LAYER,
    OPT_HEAD,
    OPT_FROM,
    OPT_TO,
    OPT_EVERY,
    OPT_STEP,
    OPT_METRIC,
    OPT_RULE,
    OPT_ACTIVE,
    OPT_SINCE,
    OPT_NEWEST,
    OPT_TIMEOUT,
    OPT_QUICK,
    OPT_VERSION,
    OPT_ID,
    OPT_FOR,
    OPT_UNTIL,
    OPT_DAYS,
    OPT_BYTES,
    OPT_DEFAULT,
    OPT_STATE,
    OPT_UNACKED,
    OPT_SILENCED,
    OPT_BUCKETS,
    OPT_PER_HEAD,
    OPT_INTERVAL,
    OPT_ITERATIONS,
    OPT_ONCE,
    OPT_LIMIT,
    OPT_KIND,
    OPT_JSON,
    OPT_INTERVENTIONS,
    OPT_COUNT
} opt_id;

/* What an option's argument is. */
typedef enum {
    OPT_FLAG,     /* no argument */
    OPT_TEXT,     /* any text (a path, a run name or id) */
    OPT_INT,      /* an integer in [lo, hi] */
    OPT_CHOICE,   /* one of choices[] */
    OPT_RULE_NAME,/* an alert rule's name (attnstat_rule_name) */
    OPT_TIME,     /* a time: RFC 3339, 'YYYY-MM-DD[ HH:MM[:SS]]' UTC, or a relative '10m', '2h', '3d' */
    OPT_SPAN,     /* a duration: '90s', '10m', '2h', '3d' */
    OPT_REAL,     /* a number >= 0 (fractions allowed) */
} opt_kind;

typedef struct {
    opt_id id;
    const char *name;            /* "--layer" */
    const char *alias;           /* a short form ("-n", "-h"), or NULL */
    const char *arg;             /* the argument's name in help ("L"); NULL for a flag */
    opt_kind kind;
    int64_t lo, hi;              /* OPT_INT */
    const char *const *choices;  /* OPT_CHOICE: NULL-terminated */
} opt_spec;

/* One option of a command (or of the global set), with the help that command gives it. */
typedef struct {
    opt_id id;
    int required;
    const char *help;
} opt_use;

typedef struct {
    const char *name;            /* "runs"; a sub-command: "alerts ack" */
    int live;                    /* 0: reads the database; 1: talks to attnstatd */
    const char *summary;         /* its line in `attnstat --help` */
    const char *description;     /* the paragraph of `attnstat COMMAND --help` */
    const char *formats;         /* the --format values it prints */
    const opt_use *opts;
    int nopts;
} opt_command;

extern const opt_spec opt_specs[OPT_COUNT]; /* indexed by opt_id */
/* --metric's choices, NULL-terminated: the statistics vocab.h's rules read (options.c). */
extern const char *opt_metrics[];
extern const opt_use opt_globals[];
extern const int opt_nglobals;
extern const opt_command opt_commands[];
extern const int opt_ncommands;

/* The option called name ("--run", or an alias such as "-n"), NULL when there is none. An alias
 * may name different options of different commands (-n: alerts --newest, top --iterations, diff
 * --limit): opt_find_for() prefers the one command c (may be NULL) takes. */
const opt_spec *opt_find(const char *name);
const opt_spec *opt_find_for(const opt_command *c, const char *name);

/* The words command c takes after its name, as its synopsis shows them ("[RUN...]": diff's
 * runs), or NULL when it takes none. */
const char *opt_operands(const opt_command *c);

/* The command called name, NULL when there is none. */
const opt_command *opt_find_command(const char *name);

#endif /* ATTNSTAT_CLI_OPTIONS_H */
