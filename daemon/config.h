/* config.h — every setting of attnstatd, in one table (config.c): name, default, bounds, help.
 * The same table serves the command line (`--name value` or `--name=value`, '-' or '_' alike)
 * and the optional config file (`--config FILE`: `key = value` lines, '#' comments). The command
 * line also takes --web.listen-address [HOST]:PORT, the exporters' spelling of --metrics-bind and
 * --metrics-port (cfg_doc_alias).
 * Precedence: defaults < config file < flags.
 * Stage: start-up (main.c reads it; every stage reads the result). Includes log.h (levels) and
 * vocab.h (the alert thresholds, as rows). */
#ifndef ATTNSTAT_CONFIG_H
#define ATTNSTAT_CONFIG_H

#include <stddef.h>
#include <stdint.h>

#include "log.h"
#include "vocab.h"

/* The version, from the build (daemon/CMakeLists.txt: ATTNSTAT_VERSION of include/attnstat.h). */
#ifndef ATTNSTAT_DAEMON_VERSION
#error "ATTNSTAT_DAEMON_VERSION is defined by the build (daemon/CMakeLists.txt)"
#endif

/* Alert thresholds (defaults for every run; a Hello may override each one): one field per row of
 * vocab.h's VOCAB_THRESHOLDS, named as the row (double, or uint64_t for its uint32 rows: config.c
 * checks them against the row's bounds), then the computation's collapse_threshold. */
#define CFG_CTYPE_VOCAB_D double
#define CFG_CTYPE_VOCAB_U uint64_t
typedef struct {
#define CFG_THRESHOLD_FIELD(name, type, ...) CFG_CTYPE_##type name;
    VOCAB_THRESHOLDS(CFG_THRESHOLD_FIELD)
#undef CFG_THRESHOLD_FIELD
    double collapse_threshold; /* per-row normalised entropy counted as collapsed */
} cfg_thresholds;

typedef struct {
    char *socket_path;      /* Unix socket to listen on */
    char *db_path;          /* SQLite database */
    char *allow_group;      /* peers of another uid in this group are allowed ("" = none) */
    char *alert_exec;       /* command run (sh -c) on every alert transition ("" = none) */
    uint64_t alert_exec_queue; /* transitions waiting for an alert_exec command, at most */
    double alert_rate;      /* alert raises a second one run may record (refills alert_burst) */
    uint64_t alert_burst;   /* a run's bucket of raises: past it, its transitions are suppressed */
    char *default_run;      /* run name when a Hello has none */
    log_level log_level;
    uint64_t max_frame;     /* bytes per frame */
    uint64_t max_clients;
    uint64_t max_buffers;   /* registered buffers + events per client */
    uint64_t max_buffer_bytes;
    uint64_t queue_depth;   /* per worker: queued + running pushes */
    uint64_t queue_work;    /* per CPU worker: their multiply-adds */
    uint64_t client_inflight; /* per client: pushes queued or computing */
    uint64_t out_queue_bytes; /* per connection: unsent bytes before reading pauses */
    uint64_t commit_ms;     /* longest a transaction stays open while results keep coming */
    char *durability;       /* normal or full (synchronous=NORMAL / FULL) */
    uint64_t checkpoint_pages; /* WAL pages at which the checkpoint thread runs; 0: the store thread */
    uint64_t cpu_workers;   /* CPU compute threads; 0: one per CPU of the machine */
    double retain_days;     /* full resolution for samples younger than this; 0: no age limit */
    uint64_t retain_bytes;  /* the database's bytes in use at most (older data downsampled); 0: none */
    uint64_t retain_exact_steps;  /* steps behind a run's latest kept in the exact tier */
    uint64_t retain_bucket_steps; /* a downsampled bucket's window, in steps */
    uint64_t retain_budget; /* samples one retention step touches, about */
    uint64_t retain_interval_ms; /* a retention step at least this often when there is nothing to do */
    uint64_t run_grace_ms;  /* a run whose client went away without Goodbye ends after this */
    uint64_t run_idle_ms;   /* a run with no push stored for this long ends (0: never) */
    uint64_t max_push_work; /* B * Hq * sampled rows * Nk * D multiply-adds per push (CPU) */
    uint64_t max_push_work_gpu; /* the same for pushes of device tensors (GPU workers) */
    uint64_t metrics_port;  /* Prometheus text on metrics_bind:port; 0 = off */
    char *metrics_bind;     /* the metrics port's address (127.0.0.1) */
    char *metrics_heads;    /* per-head series: top, all, layers or off (headtab.h) */
    uint64_t metrics_top;   /* heads per job in each ranking of metrics_heads = top */
    uint64_t metrics_max_heads; /* keys the per-head table keeps */
    uint64_t metrics_stale_s;   /* a key not updated this long leaves the scrape */
    uint64_t metrics_timeout_ms; /* a scrape connection is closed this long after it opened */
    uint64_t max_heads_per_run; /* distinct (layer, head) alert states of one run */
    uint64_t max_clients_per_uid; /* connections one uid may hold (of max_clients) */
    uint64_t hello_timeout_ms;  /* a connection must say Hello or subscribe within this */
    uint64_t frame_timeout_ms;  /* a frame begun must be whole within this */
    uint64_t max_hello_config;  /* bytes of a Hello's config (a JSON object) */
    uint64_t reserved_clients;  /* the last slots of max_clients: root, the daemon's uid, status */
    uint64_t status_clients_per_uid; /* a uid's connections past its share: status/commands only */
    uint64_t idle_timeout_ms;   /* a Hello'd connection that sends nothing this long is closed */
    uint64_t write_timeout_ms;  /* a connection that reads none of its replies this long: closed */
    uint64_t sub_queue_bytes;   /* per subscriber: unsent results/alerts before they are dropped */
    uint64_t max_runs_per_uid;  /* runs (name, rank) one uid may have in the database */
    uint64_t max_config_bytes_per_uid; /* Hello config bytes one uid's runs may hold together */
    char *db_check;         /* the database check at start: quick, full or off */
    uint64_t shutdown_grace_ms; /* SIGTERM: queued work may finish this long, then connections close */
    cfg_thresholds thresholds;
    char *config_path;      /* the --config file (NULL: none), read again on SIGHUP */
    int argc;               /* the command line, applied again over the file on SIGHUP */
    char **argv;
} cfg;

/* Fills c with the defaults (socket and db under $XDG_RUNTIME_DIR / $XDG_STATE_HOME when set). */
int cfg_init(cfg *c, char *err, size_t errlen);
void cfg_free(cfg *c);

/* Parses argv (and the --config file it names). Returns 0; 1 when --help or --version was
 * printed (the caller exits 0); -1 with err set on a bad flag, value or file line. */
int cfg_parse_args(cfg *c, int argc, char **argv, char *err, size_t errlen);

/* Applies one key = value (key as in the table). Returns 0 or -1 with err set. */
int cfg_set(cfg *c, const char *key, const char *value, char *err, size_t errlen);

/* Loads a config file (at most CFGFILE_MAX bytes: cfgfile.h). Returns 0 or -1 with err naming the
 * file and line. */
int cfg_load_file(cfg *c, const char *path, char *err, size_t errlen);
/* The same from the file's text, already read (path only names it in errors). */
int cfg_load_text(cfg *c, const char *path, const char *text, char *err, size_t errlen);

/* The --config files of c's command line, in order (at most max of them into paths, which point
 * into the command line). Returns how many there are. */
size_t cfg_config_files(const cfg *c, const char **paths, size_t max);

/* SIGHUP: the settings are read again (defaults < file < flags, as at start) into a copy, from
 * texts[k], the text of the k-th --config file (cfg_config_files), read beforehand off the event
 * loop (reload.h); texts may be NULL when there is none. Those marked reloadable in the table
 * (log level, thresholds, connection limits and deadlines, alert_exec) are copied into live and
 * each change is logged ("reload: X: old -> new"); a change of another setting is logged as
 * needing a restart. Returns the number of settings changed, or -1 with err set when a file no
 * longer parses (live is then untouched). Reads no file. Loop thread only. */
int cfg_reload(cfg *live, const char *const *texts, size_t ntexts, char *err, size_t errlen);

/* Writes the table (name, default, bounds, help) to f. */
void cfg_print_help(const char *argv0, void *f);

/* One row of the table as text, for what is generated from it besides --help: the manual page,
 * the shell completion and the example config file (deploy/docgen.c). */
typedef struct {
    const char *name;     /* the config-file key ("max_frame"); the flag is --max-frame */
    const char *def;      /* the default as text; NULL when computed at start (socket, db) */
    int numeric;          /* 1: a number, min and max bound it */
    int integer;          /* 1: a whole number */
    double min, max;
    const char *values;   /* the accepted words, "debug info warn error"; NULL when free */
    const char *help;
    int reload;           /* 1: SIGHUP applies a new value without a restart */
} cfg_doc;

/* Row i of the table in *out: 0, or -1 past the last row. */
int cfg_doc_row(size_t i, cfg_doc *out);

/* A flag that spells settings of the table another way (command line only): --web.listen-address
 * [HOST]:PORT sets metrics_bind and metrics_port, as exporters take their listen address. For
 * --help and what deploy/docgen.c generates. */
typedef struct {
    const char *flag;     /* "--web.listen-address" */
    const char *arg;      /* "[HOST]:PORT" */
    const char *help;
} cfg_alias_doc;

/* Alias i in *out: 0, or -1 past the last one. */
int cfg_doc_alias(size_t i, cfg_alias_doc *out);

/* Logs every setting at info level. */
void cfg_log(const cfg *c);

#endif /* ATTNSTAT_CONFIG_H */
