/* args.h — what main.c hands to the commands of the attnstat CLI: the parsed command line (one
 * struct for every command; a command reads only the fields of the options its table in options.c
 * gives it: main.c refuses any other) and the exit codes.
 *
 * Stage: a header of the CLI, below main.c, history.c and live.c; includes out.h (the format). */
#ifndef ATTNSTAT_CLI_ARGS_H
#define ATTNSTAT_CLI_ARGS_H

#include <stdint.h>

#include "out.h"

#define CLI_EXIT_OK 0
#define CLI_EXIT_FAIL 1    /* a runtime failure: missing database, unknown run, daemon unreachable */
#define CLI_EXIT_USAGE 2   /* a usage error */

#define CLI_MAX_DB_ARGS 64 /* --db given more than once (job, export) */
#define CLI_MAX_RUN_ARGS 16 /* runs named to diff (--run several times, or after the command) */

typedef struct {
    const char *db;          /* the first --db (or the default) */
    const char *dbs[CLI_MAX_DB_ARGS]; /* every --db, in order (job, export read them all) */
    int ndbs;
    int db_given;          /* --db was on the command line (top reads the database then) */
    const char *socket;
    char db_buf[4096], sock_buf[4096];
    out_format fmt;
    int fmt_given;         /* --format was on the command line */
    int color;             /* -1 auto, 0 never, 1 always */
    const char *cmd;
    const char *run;       /* the last --run */
    const char *runs[CLI_MAX_RUN_ARGS]; /* every --run and operand, in order (diff) */
    int nruns;
    int32_t rank;          /* -1: any */
    int layer_set;
    int32_t layer;
    int32_t head;          /* -1: all */
    int64_t from, to, every;
    int step_set;          /* 0: the latest step */
    int64_t step;
    const char *metric;
    const char *rule;      /* NULL: every rule */
    const char *kind;      /* interventions --kind; NULL: every kind */
    int interventions;     /* export --interventions: the interventions, not the samples */
    int active;
    int quick;             /* check-db --quick */
    int since_set;
    int64_t since_ms;      /* Unix time in milliseconds */
    int64_t newest;        /* 0: all */
    int64_t limit;         /* diff -n; 0: all */
    int help;
    int version;           /* --version: print it and exit */
    int timeout_ms;
    int64_t alert_id;      /* --id; 0: none */
    int until_set;
    int64_t until_ms;      /* --until, or now + --for (Unix ms) */
    int days_set;
    double days;           /* --days */
    int bytes_set;
    int64_t bytes;         /* --bytes */
    int to_default;        /* --default */
    const char *state;     /* alerts --state: firing, raised, cleared or resolved; NULL: any */
    int unacked;           /* alerts --unacked */
    int silenced;          /* alerts --silenced */
    int64_t buckets;       /* trend --buckets; 0: the default */
    int per_head;          /* trend --per-head */
    double interval;       /* top --interval (seconds); 0: the default */
    int64_t iterations;    /* top -n; 0: until stopped */
    char cmd_buf[64];      /* a sub-command's full name ("alerts ack") */
} cli_args;

#endif /* ATTNSTAT_CLI_ARGS_H */
