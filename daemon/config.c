/* config.c — the settings table of attnstatd and its two front ends, flags and config file.
 *
 * Each row of cfg_table says where a setting lands in the cfg struct, its type, its default, its
 * bounds and one line of help. Parsing a value checks it against the row's bounds, so nothing
 * downstream re-checks ranges; an error names the setting, the value and the accepted range (and,
 * from a file, the file and line). The alert thresholds' rows (name, default, bounds, help) are
 * vocab.h's VOCAB_THRESHOLDS, written there once.
 * Stage: start-up (main.c); calls log (levels) and reads vocab.h's thresholds and alerts.h's
 * max_heads_per_run default. */
#include "config.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alerts.h"
#include "cfgfile.h"
#include "util.h"

#define CFG_VERSION ATTNSTAT_DAEMON_VERSION

typedef enum { CFG_STR, CFG_U64, CFG_DBL, CFG_LEVEL, CFG_CHOICE } cfg_type;

typedef struct {
    const char *name;
    cfg_type type;
    size_t offset;
    const char *def;      /* default as text; NULL for computed defaults (socket, db) */
    double min, max;      /* bounds for numbers (inclusive) */
    const char *help;
    int reload;           /* 1: SIGHUP applies a new value (read on the loop thread only) */
    const char *choices;  /* CFG_CHOICE: the values, separated by '|' */
} cfg_entry;

#define F(field) offsetof(cfg, field)
#define T(field) offsetof(cfg, thresholds.field)
#define DEF(name) ALERTS_STR(ALERTS_DEFAULT_##name) /* the alert engine's default, as text */

/* A row of the table from a VOCAB_THRESHOLDS row. The table's bounds are inclusive: a threshold's
 * open bound (lo_incl or hi_incl 0) is taken CFG_OPEN_STEP inside it, which is how the settings
 * spelled (0, 1) before the thresholds were rows ([0.000001, 0.999999]); the alert engine checks
 * the open bound itself as well (alerts_config_check). */
#define CFG_OPEN_STEP 0.000001
#define CFG_TYPE_VOCAB_D CFG_DBL
#define CFG_TYPE_VOCAB_U CFG_U64
#define CFG_THRESHOLD_ROW(name, type, def, lo, lo_incl, hi, hi_incl, help)                        \
    {#name, CFG_TYPE_##type, T(name), #def, (lo_incl) ? (lo) : (lo) + CFG_OPEN_STEP,              \
     (hi_incl) ? (hi) : (hi) - CFG_OPEN_STEP, help, 1, NULL},

static const cfg_entry cfg_table[] = {
    {"socket", CFG_STR, F(socket_path), NULL, 0, 0,
     "Unix socket to listen on (default $XDG_RUNTIME_DIR/attnstat/attnstatd.sock, else "
     "/run/attnstat/attnstatd.sock)", 0, NULL},
    {"db", CFG_STR, F(db_path), NULL, 0, 0,
     "SQLite database (default $XDG_STATE_HOME/attnstat/attnstat.db, else "
     "/var/lib/attnstat/attnstat.db)", 0, NULL},
    {"allow_group", CFG_STR, F(allow_group), "", 0, 0,
     "group whose members may connect besides the daemon's own uid and root", 0, NULL},
    {"alert_exec", CFG_STR, F(alert_exec), "", 0, 0,
     "shell command run on every alert transition, the alert in ATTNSTAT_* env vars", 1, NULL},
    {"alert_exec_queue", CFG_U64, F(alert_exec_queue), "1024", 1, 1048576,
     "alert transitions waiting while 16 alert_exec commands run, at most, shared fairly between "
     "uids and between runs: when it is full, a transition of a uid (or run) holding less than "
     "the largest share takes the newest place of that share; any other is dropped (counted: "
     "attnstat_alert_exec_dropped_total, logged)", 0, NULL},
    {"alert_rate", CFG_DBL, F(alert_rate), "100", 0.001, 1000000,
     "alert raises a second that each run may record and deliver, refilling a bucket of "
     "alert_burst: past it the run's transitions (and the ends of those raises) are suppressed, "
     "counted (attnstat_alert_transitions_suppressed_total) and summarised in the log, so that a "
     "run whose heads flap can neither fill the alerts table nor crowd out alert_exec", 1, NULL},
    {"alert_burst", CFG_U64, F(alert_burst), "1000", 1, 1000000000,
     "alert raises a run may make at once before alert_rate bounds it", 1, NULL},
    {"default_run", CFG_STR, F(default_run), "default", 0, 0, "run name for a Hello that names none", 0, NULL},
    {"log_level", CFG_LEVEL, F(log_level), "info", 0, 0, "debug, info, warn or error", 1, NULL},
    {"max_frame", CFG_U64, F(max_frame), "1048576", 4096, 64 << 20, "largest frame in bytes", 0, NULL},
    {"max_clients", CFG_U64, F(max_clients), "256", 1, 65536,
     "connections served at once, of every uid and kind (the last reserved_clients kept back)", 1,
     NULL},
    {"max_buffers", CFG_U64, F(max_buffers), "64", 1, 65536,
     "registered buffers and events per connection", 0, NULL},
    {"max_buffer_bytes", CFG_U64, F(max_buffer_bytes), "17179869184", 1, 1099511627776.0,
     "largest registered buffer in bytes", 0, NULL},
    {"queue_depth", CFG_U64, F(queue_depth), "4096", 1, 1 << 20,
     "pushes queued or computing per worker at most (a bound on memory); a push finding it full "
     "is dropped", 0, NULL},
    {"queue_work", CFG_U64, F(queue_work), "4294967296", 1, 1125899906842624.0,
     "work queued or computing per CPU worker, in multiply-adds (batch x heads x sampled rows x "
     "keys x head_dim of each push; about 1-2 s of one core by default): a push that would pass "
     "it is dropped (one is always taken when the queue is empty), so the queue holds many tiny "
     "pushes or a few big ones", 0, NULL},
    {"client_inflight", CFG_U64, F(client_inflight), "1024", 1, 1 << 20,
     "pushes queued or computing per connection; more are dropped (fairness between clients: the "
     "work they may queue is bounded by queue_work, this bounds their number; one client with "
     "tiny pushes needs hundreds in flight to reach the store's rate)", 0, NULL},
    {"out_queue_bytes", CFG_U64, F(out_queue_bytes), "4194304", 65536, 1 << 30,
     "unsent bytes per connection past which reading from it pauses (until half are written; a "
     "connection 4x over it is closed); results and alerts to it stop at sub_queue_bytes", 0,
     NULL},
    {"commit_ms", CFG_U64, F(commit_ms), "5", 0, 1000,
     "the store thread commits as soon as no result waits (a lone push is stored at once); while "
     "results keep coming, a transaction is committed at least this often (0: only when none "
     "waits, or 4096 are in it)", 0, NULL},
    {"durability", CFG_CHOICE, F(durability), "normal", 0, 0,
     "normal: an acknowledged sample survives a crash of attnstatd (kill -9, OOM), not always a "
     "power loss or a kernel crash (SQLite synchronous=NORMAL: no fsync per commit); full: it "
     "survives those too (one fsync per commit, synchronous=FULL)", 0, "normal|full"},
    {"checkpoint_pages", CFG_U64, F(checkpoint_pages), "1000", 0, 1 << 24,
     "the WAL's size in pages (4 KiB) at which a thread of its own copies it back into the "
     "database (a passive checkpoint on a second connection), so that the store thread never "
     "does; past 4x that the store thread checkpoints itself; 0: the store thread checkpoints at "
     "1000 pages, as SQLite does by default", 0, NULL},
    {"cpu_workers", CFG_U64, F(cpu_workers), "0", 0, 32,
     "threads computing host pushes (each layer of a run always on the same one); 0: one per CPU "
     "this process may run on", 0, NULL},
    {"retain_days", CFG_DBL, F(retain_days), "0", 0, 36500,
     "full resolution for samples younger than this many days (fractions allowed); older ones "
     "are downsampled into buckets of retain_bucket_steps steps keeping min/mean/max (steps that "
     "raised or cleared an alert keep theirs); 0: no age limit. A run's own: attnstat retention",
     1, NULL},
    {"retain_bytes", CFG_U64, F(retain_bytes), "0", 0, 1e18,
     "while the database's bytes in use exceed this, its oldest data is downsampled (the newest "
     "steps of every run are never touched); 0: no size limit", 1, NULL},
    {"retain_exact_steps", CFG_U64, F(retain_exact_steps), "64", 1, 1000000,
     "steps behind each run's latest kept exactly as pushed; older ones are packed (about 22 "
     "bytes a sample)", 1, NULL},
    {"retain_bucket_steps", CFG_U64, F(retain_bucket_steps), "100", 2, 1000000000,
     "steps merged into one downsampled bucket", 1, NULL},
    {"retain_budget", CFG_U64, F(retain_budget), "4096", 64, 10000000,
     "samples one retention step touches, about: it holds the write lock that long (a few ms), "
     "between the store thread's commits", 1, NULL},
    {"retain_interval_ms", CFG_U64, F(retain_interval_ms), "2000", 10, 3600000,
     "a retention step at least this often while it has nothing to do (it runs without pause "
     "while it has, whenever the store thread is idle); while pushes keep the store thread busy, "
     "one step between two of its transactions this often, so that compaction is never starved",
     1, NULL},
    {"run_grace_ms", CFG_U64, F(run_grace_ms), "60000", 0, 86400000,
     "a run whose client disconnected without Goodbye (or that had not ended when attnstatd "
     "started) ends this long after, unless a client says its Hello again (libattnstat "
     "reconnects by itself); its active alerts are then resolved", 1, NULL},
    {"run_idle_ms", CFG_U64, F(run_idle_ms), "3600000", 0, 31536000000.0,
     "a run with a client connected but no push stored for this long ends (its alerts are "
     "resolved; its next push resumes it); 0: never", 1, NULL},
    {"max_push_work", CFG_U64, F(max_push_work), "17179869184", 1, 1125899906842624.0,
     "largest push of host tensors (the CPU worker): batch x heads x sampled rows x keys x head_dim multiply-adds", 0, NULL},
    {"max_push_work_gpu", CFG_U64, F(max_push_work_gpu), "17592186044416", 1, 1125899906842624.0,
     "largest push of device tensors (a GPU worker), multiply-adds as max_push_work, plus a "
     "mask's elements (scanned whole on the device); the default takes one attention layer of a "
     "70B-class model (B 1, Hq 64, Nk 32768, D 128)", 0, NULL},
    {"metrics_port", CFG_U64, F(metrics_port), "0", 0, 65535,
     "serve Prometheus metrics on metrics_bind:PORT (0: off)", 0, NULL},
    {"metrics_bind", CFG_STR, F(metrics_bind), "127.0.0.1", 0, 0,
     "address the metrics port listens on: an IPv4 or IPv6 address (0.0.0.0 or :: for every "
     "interface, e.g. for a Prometheus on another host or pod)", 0, NULL},
    {"metrics_heads", CFG_CHOICE, F(metrics_heads), "top", 0, 0,
     "per-head series on /metrics: top (per job, the metrics_top heads of lowest normalised "
     "entropy and of highest max logit, and every head with an alert raised), all (every head: "
     "a layer x head map; mind the cardinality of large models), layers (per-layer aggregates "
     "only) or off; per-layer aggregates and raised alerts come with all but off", 1,
     "top|all|layers|off"},
    {"metrics_top", CFG_U64, F(metrics_top), "10", 1, 4096,
     "with metrics_heads = top: heads named per job for each of the two rankings", 1, NULL},
    {"metrics_max_heads", CFG_U64, F(metrics_max_heads), "65536", 1, 4194304,
     "(job, layer, head) keys kept for the per-head metrics (about 200 bytes each); new ones past "
     "it are counted, not kept", 0, NULL},
    {"metrics_stale_s", CFG_U64, F(metrics_stale_s), "3600", 10, 31536000,
     "a head without a sample or an alert transition for this long leaves /metrics (a head a "
     "live job stopped pushing; the heads of a run that ended or was deleted leave at once)", 1,
     NULL},
    {"metrics_timeout_ms", CFG_U64, F(metrics_timeout_ms), "5000", 100, 600000,
     "a metrics connection is closed this long after it opened, idle or not (at most 16 are open)", 0, NULL},
    {"max_clients_per_uid", CFG_U64, F(max_clients_per_uid), "64", 1, 65536,
     "runs and subscriptions (connections that said Hello or Subscribe) one uid may hold at once, "
     "so that one user cannot take every one of max_clients: a Hello or Subscribe past it is "
     "refused with the reason; status_clients_per_uid more connections may still ask for status",
     1, NULL},
    {"hello_timeout_ms", CFG_U64, F(hello_timeout_ms), "10000", 100, 3600000,
     "a connection that has neither said Hello nor subscribed this long after it was accepted "
     "is closed with the reason (its slot is freed)", 1, NULL},
    {"frame_timeout_ms", CFG_U64, F(frame_timeout_ms), "10000", 100, 3600000,
     "a frame whose first bytes arrived must be whole this long after, else the connection is "
     "closed with the reason (half a frame holds no slot for ever)", 1, NULL},
    {"reserved_clients", CFG_U64, F(reserved_clients), "16", 0, 65536,
     "of max_clients, the last ones are kept for root and the daemon's own uid, and for status "
     "and admin commands of other uids (at most half of them): another uid's connection that "
     "takes one may ask for status and send commands only (its Hello or Subscribe is refused "
     "with the reason), so that uids holding every other slot cannot lock root out", 1, NULL},
    {"status_clients_per_uid", CFG_U64, F(status_clients_per_uid), "4", 0, 65536,
     "connections a uid may open past max_clients_per_uid for status and admin commands only (no "
     "Hello, no Subscribe): a uid whose trainers hold its whole share still gets attnstat status",
     1, NULL},
    {"idle_timeout_ms", CFG_U64, F(idle_timeout_ms), "3600000", 0, 604800000,
     "a connection that said Hello and has sent nothing for this long (no push in flight) is "
     "closed with the reason, its slot freed (its run then ends as a disconnected one does; "
     "libattnstat reconnects at its next push); 0: never. A subscriber is judged by "
     "write_timeout_ms", 1, NULL},
    {"write_timeout_ms", CFG_U64, F(write_timeout_ms), "60000", 100, 3600000,
     "a connection with replies waiting for it of which its peer has read nothing for this long "
     "is closed with the reason (a subscriber that stopped reading), its slot and memory freed",
     1, NULL},
    {"sub_queue_bytes", CFG_U64, F(sub_queue_bytes), "262144", 4096, 1 << 30,
     "unsent bytes of results and alerts per subscriber at most: past them each further one to "
     "it is dropped and counted (messages_dropped); its own replies are not", 0, NULL},
    {"max_hello_config", CFG_U64, F(max_hello_config), "65536", 2, 1048576,
     "largest run config a Hello may carry, in bytes: a JSON object, stored as sent", 1, NULL},
    {"max_runs_per_uid", CFG_U64, F(max_runs_per_uid), "10000", 1, 1e9,
     "runs (each name and rank) one uid may have in the database, ended ones included: a Hello "
     "that would make one more is refused with the reason (attnstat delete-run frees them)", 1,
     NULL},
    {"max_config_bytes_per_uid", CFG_U64, F(max_config_bytes_per_uid), "67108864", 1024, 1e12,
     "bytes of Hello configs one uid's runs may hold in the database together: a Hello whose "
     "config would pass them is refused with the reason (attnstat delete-run frees them)", 1,
     NULL},
    {"db_check", CFG_CHOICE, F(db_check), "quick", 0, 0,
     "the database check at start: quick (PRAGMA quick_check: every page read once), full "
     "(integrity_check, slower) or off; a damaged database is refused with the problems found",
     0, "quick|full|off"},
    {"shutdown_grace_ms", CFG_U64, F(shutdown_grace_ms), "10000", 100, 3600000,
     "after SIGINT/SIGTERM, queued pushes are computed, stored and acknowledged for at most this "
     "long; then the connections are closed and what is left is dropped", 1, NULL},
    {"max_heads_per_run", CFG_U64, F(max_heads_per_run), DEF(MAX_HEADS_PER_RUN), 1, 262144,
     "distinct (layer, head) pairs of one run the alerts track; heads past it are not alerted on "
     "(samples are still stored; logged once per run)", 0, NULL},
    /* The alert thresholds: one row per VOCAB_THRESHOLDS row (vocab.h), its name, default,
     * bounds and help; each reloads on SIGHUP. */
    VOCAB_THRESHOLDS(CFG_THRESHOLD_ROW)
    {"collapse_threshold", CFG_DBL, T(collapse_threshold), "0.1", 0.000001, 1,
     "per-row normalised entropy under which a row counts as collapsed", 1, NULL},
};

#define CFG_N (sizeof cfg_table / sizeof cfg_table[0])

/* Flags that spell settings of the table another way, on the command line only (a config file
 * names the settings themselves). Each sets its settings where it stands among the flags, so the
 * later of an alias and a setting's own flag wins. */
static const cfg_alias_doc cfg_aliases[] = {
    {"--web.listen-address", "[HOST]:PORT",
     "the exporters' spelling of --metrics-bind HOST --metrics-port PORT: 127.0.0.1:9464, "
     "[::1]:9464, or :9464 for every IPv4 interface (0.0.0.0), as an exporter listens; HOST is an "
     "address, not a name; PORT 1 .. 65535"},
};

#define CFG_NALIAS (sizeof cfg_aliases / sizeof cfg_aliases[0])

/* key (a flag without its "--", '-' and '_' alike) is --web.listen-address. */
static int cfg_is_listen_address(const char *key)
{
    const char *want = "web.listen-address";
    for (; *key && *want; key++, want++)
        if (*key != *want && !(*key == '_' && *want == '-'))
            return 0;
    return *key == '\0' && *want == '\0';
}

/* --web.listen-address [HOST]:PORT: metrics_bind and metrics_port, both checked before either is
 * set. */
static int cfg_listen_address(cfg *c, const char *value, char *err, size_t errlen)
{
    char host[INET6_ADDRSTRLEN];
    const char *port;
    const char *form = "[HOST]:PORT (127.0.0.1:9464, [::1]:9464, or :9464 for every IPv4 "
                       "interface)";
    if (value[0] == '[') {
        const char *close = strchr(value, ']');
        size_t n = close ? (size_t)(close - value - 1) : 0;
        struct in6_addr a6;
        if (!close || close[1] != ':' || n == 0 || n >= sizeof host)
            return util_err(err, errlen, "--web.listen-address '%s' is not %s", value, form);
        memcpy(host, value + 1, n);
        host[n] = '\0';
        if (inet_pton(AF_INET6, host, &a6) != 1)
            return util_err(err, errlen, "--web.listen-address '%s': '%s' is not an IPv6 address",
                            value, host);
        port = close + 2;
    } else {
        const char *colon = strrchr(value, ':');
        size_t n = colon ? (size_t)(colon - value) : 0;
        struct in_addr a4;
        if (!colon || n >= sizeof host)
            return util_err(err, errlen, "--web.listen-address '%s' is not %s", value, form);
        if (memchr(value, ':', n))
            return util_err(err, errlen, "--web.listen-address '%s': an IPv6 address goes in "
                            "brackets ([::1]:9464)", value);
        memcpy(host, value, n);
        host[n] = '\0';
        if (n == 0)
            snprintf(host, sizeof host, "0.0.0.0");
        else if (inet_pton(AF_INET, host, &a4) != 1)
            return util_err(err, errlen, "--web.listen-address '%s': '%s' is not an IPv4 address "
                            "(a host name is not resolved: give its address, or :PORT for every "
                            "IPv4 interface)", value, host);
        port = colon + 1;
    }
    char *end;
    errno = 0;
    unsigned long p = isdigit((unsigned char)port[0]) ? strtoul(port, &end, 10) : 0;
    if (!isdigit((unsigned char)port[0]) || errno || *end != '\0' || p < 1 || p > 65535)
        return util_err(err, errlen, "--web.listen-address '%s': the port '%s' is not in 1 .. "
                        "65535 (--metrics-port 0 turns the endpoint off)", value, port);
    char msg[512];
    if (cfg_set(c, "metrics_bind", host, msg, sizeof msg) != 0 ||
        cfg_set(c, "metrics_port", port, msg, sizeof msg) != 0)
        return util_err(err, errlen, "--web.listen-address: %s", msg);
    return 0;
}

static const cfg_entry *cfg_find(const char *key)
{
    char norm[64];
    size_t n = strlen(key);
    if (n >= sizeof norm)
        return NULL;
    for (size_t i = 0; i <= n; i++)
        norm[i] = key[i] == '-' ? '_' : key[i];
    for (size_t i = 0; i < CFG_N; i++)
        if (strcmp(cfg_table[i].name, norm) == 0)
            return &cfg_table[i];
    return NULL;
}

static int set_str(char **slot, const char *value, char *err, size_t errlen, const char *name)
{
    char *dup = strdup(value);
    if (!dup) {
        snprintf(err, errlen, "%s: out of memory", name);
        return -1;
    }
    free(*slot);
    *slot = dup;
    return 0;
}

int cfg_set(cfg *c, const char *key, const char *value, char *err, size_t errlen)
{
    const cfg_entry *e = cfg_find(key);
    if (!e && cfg_is_listen_address(key)) {
        snprintf(err, errlen, "'%s' is a command-line flag only (--web.listen-address); a config "
                 "file sets metrics_bind and metrics_port", key);
        return -1;
    }
    if (!e) {
        snprintf(err, errlen, "unknown setting '%s' (see --help)", key);
        return -1;
    }
    char *base = (char *)c + e->offset;
    switch (e->type) {
    case CFG_STR:
        return set_str((char **)base, value, err, errlen, e->name);
    case CFG_CHOICE: {
        size_t vl = strlen(value);
        for (const char *p = e->choices; vl && *p;) {
            size_t n = strcspn(p, "|");
            if (n == vl && strncmp(p, value, n) == 0)
                return set_str((char **)base, value, err, errlen, e->name);
            p += n + (p[n] == '|');
        }
        snprintf(err, errlen, "%s: '%s' is not one of %s", e->name, value, e->choices);
        return -1;
    }
    case CFG_LEVEL:
        if (log_parse_level(value, (log_level *)base) != 0) {
            snprintf(err, errlen, "%s: '%s' is not a level (debug, info, warn, error)", e->name, value);
            return -1;
        }
        return 0;
    case CFG_U64: {
        char *end;
        errno = 0;
        if (!isdigit((unsigned char)value[0])) {
            snprintf(err, errlen, "%s: '%s' is not a non-negative integer", e->name, value);
            return -1;
        }
        unsigned long long v = strtoull(value, &end, 10);
        if (errno || *end != '\0') {
            snprintf(err, errlen, "%s: '%s' is not a non-negative integer", e->name, value);
            return -1;
        }
        if ((double)v < e->min || (double)v > e->max) {
            snprintf(err, errlen, "%s: %llu is out of range [%.0f, %.0f]", e->name, v, e->min, e->max);
            return -1;
        }
        *(uint64_t *)base = v;
        return 0;
    }
    case CFG_DBL: {
        char *end;
        errno = 0;
        double v = strtod(value, &end);
        if (errno || end == value || *end != '\0' || !isfinite(v)) {
            snprintf(err, errlen, "%s: '%s' is not a number", e->name, value);
            return -1;
        }
        if (v < e->min || v > e->max) {
            snprintf(err, errlen, "%s: %g is out of range [%g, %g]", e->name, v, e->min, e->max);
            return -1;
        }
        *(double *)base = v;
        return 0;
    }
    }
    snprintf(err, errlen, "%s: bad table entry", e->name);
    return -1;
}

static char *default_path(const char *env, const char *sub, const char *fallback)
{
    const char *dir = getenv(env);
    char buf[4096];
    if (dir && dir[0] == '/')
        snprintf(buf, sizeof buf, "%s/attnstat/%s", dir, sub);
    else
        snprintf(buf, sizeof buf, "%s", fallback);
    return strdup(buf);
}

int cfg_init(cfg *c, char *err, size_t errlen)
{
    memset(c, 0, sizeof *c);
    for (size_t i = 0; i < CFG_N; i++) {
        if (!cfg_table[i].def)
            continue;
        if (cfg_set(c, cfg_table[i].name, cfg_table[i].def, err, errlen) != 0) {
            cfg_free(c);
            return -1;
        }
    }
    c->socket_path = default_path("XDG_RUNTIME_DIR", "attnstatd.sock", "/run/attnstat/attnstatd.sock");
    c->db_path = default_path("XDG_STATE_HOME", "attnstat.db", "/var/lib/attnstat/attnstat.db");
    if (!c->socket_path || !c->db_path) {
        snprintf(err, errlen, "out of memory");
        cfg_free(c);
        return -1;
    }
    return 0;
}

void cfg_free(cfg *c)
{
    free(c->config_path);
    c->config_path = NULL;
    for (size_t i = 0; i < CFG_N; i++) {
        if (cfg_table[i].type == CFG_STR || cfg_table[i].type == CFG_CHOICE) {
            char **slot = (char **)((char *)c + cfg_table[i].offset);
            free(*slot);
            *slot = NULL;
        }
    }
}

static char *trim(char *s)
{
    while (isspace((unsigned char)*s))
        s++;
    char *e = s + strlen(s);
    while (e > s && isspace((unsigned char)e[-1]))
        *--e = '\0';
    return s;
}

int cfg_load_text(cfg *c, const char *path, const char *text, char *err, size_t errlen)
{
    char line[4096], msg[512];
    int lineno = 0;
    for (const char *p = text; *p;) {
        lineno++;
        size_t n = strcspn(p, "\n");
        if (n > sizeof line - 2) {
            snprintf(err, errlen, "%s:%d: line is longer than %zu bytes", path, lineno, sizeof line - 2);
            return -1;
        }
        memcpy(line, p, n);
        line[n] = '\0';
        p += n + (p[n] == '\n');
        char *hash = strchr(line, '#');
        if (hash)
            *hash = '\0';
        char *s = trim(line);
        if (*s == '\0')
            continue;
        char *eq = strchr(s, '=');
        if (!eq) {
            snprintf(err, errlen, "%s:%d: expected 'key = value', got '%s'", path, lineno, s);
            return -1;
        }
        *eq = '\0';
        char *key = trim(s), *value = trim(eq + 1);
        if (cfg_set(c, key, value, msg, sizeof msg) != 0) {
            snprintf(err, errlen, "%s:%d: %s", path, lineno, msg);
            return -1;
        }
    }
    return 0;
}

int cfg_load_file(cfg *c, const char *path, char *err, size_t errlen)
{
    char *text;
    size_t len;
    if (cfgfile_read(path, 0, &text, &len, err, errlen) != 0)
        return -1;
    int rc = cfg_load_text(c, path, text, err, errlen);
    free(text);
    return rc;
}

void cfg_print_help(const char *argv0, void *fp)
{
    FILE *f = fp;
    fprintf(f, "usage: %s [--config FILE] [--SETTING VALUE]...\n\n"
               "attnstatd %s: receives Q/K tensors from training processes, stores per-head attention\n"
               "entropy and max-logit statistics in SQLite and raises alerts.\n\n"
               "Every setting is a flag (--max-frame 65536 or --max-frame=65536) and a config-file\n"
               "line (max_frame = 65536). Flags override the file.\n\n",
            argv0, CFG_VERSION);
    for (size_t i = 0; i < CFG_N; i++) {
        const cfg_entry *e = &cfg_table[i];
        char opt[64];
        snprintf(opt, sizeof opt, "--%s", e->name);
        for (char *p = opt + 2; *p; p++)
            if (*p == '_')
                *p = '-';
        fprintf(f, "  %-22s %s\n", opt, e->help);
        const char *hup = e->reload ? "; SIGHUP reloads it" : "";
        if (e->type == CFG_U64 || e->type == CFG_DBL)
            fprintf(f, "  %-22s default %s, range [%g, %g]%s\n", "", e->def, e->min, e->max, hup);
        else if (e->type == CFG_CHOICE)
            fprintf(f, "  %-22s default %s, one of %s%s\n", "", e->def, e->choices, hup);
        else if (e->def && e->def[0])
            fprintf(f, "  %-22s default %s%s\n", "", e->def, hup);
        else if (e->reload)
            fprintf(f, "  %-22s SIGHUP reloads it\n", "");
    }
    for (size_t i = 0; i < CFG_NALIAS; i++)
        fprintf(f, "  %s %s\n  %-22s %s\n", cfg_aliases[i].flag, cfg_aliases[i].arg, "",
                cfg_aliases[i].help);
    fprintf(f, "  %-22s %s\n  %-22s %s\n  %-22s %s\n", "--config FILE", "read settings from FILE",
            "--help", "print this help", "--version", "print the version");
}

int cfg_doc_alias(size_t i, cfg_alias_doc *out)
{
    if (i >= CFG_NALIAS)
        return -1;
    *out = cfg_aliases[i];
    return 0;
}

int cfg_doc_row(size_t i, cfg_doc *out)
{
    if (i >= CFG_N)
        return -1;
    const cfg_entry *e = &cfg_table[i];
    out->name = e->name;
    out->def = e->def;
    out->numeric = e->type == CFG_U64 || e->type == CFG_DBL;
    out->integer = e->type == CFG_U64;
    out->min = e->min;
    out->max = e->max;
    /* log.c's level names; attnstat-docgen refuses to run when cfg_set rejects one of them. */
    out->values = e->type == CFG_LEVEL ? "debug info warn error" : NULL;
    out->help = e->help;
    out->reload = e->reload;
    return 0;
}

/* argv[i] names a config file (--config FILE, --config=FILE): its path, with *i moved past it;
 * NULL when it does not. err set (and *bad) when --config lacks its file. */
static const char *config_arg(int argc, char **argv, int *i, int *bad, char *err, size_t errlen)
{
    if (strcmp(argv[*i], "--config") == 0) {
        if (*i + 1 >= argc) {
            snprintf(err, errlen, "--config needs a file name");
            *bad = 1;
            return NULL;
        }
        return argv[++*i];
    }
    return strncmp(argv[*i], "--config=", 9) == 0 ? argv[*i] + 9 : NULL;
}

size_t cfg_config_files(const cfg *c, const char **paths, size_t max)
{
    size_t n = 0;
    char err[64];
    for (int i = 1; i < c->argc; i++) {
        int bad = 0;
        const char *path = config_arg(c->argc, c->argv, &i, &bad, err, sizeof err);
        if (path && n < max)
            paths[n++] = path;
    }
    return n;
}

/* cfg_parse_args(), the config files' texts given (texts[k]: the k-th --config file) or, when
 * texts is NULL, read now. */
static int parse_args(cfg *c, int argc, char **argv, const char *const *texts, size_t ntexts,
                      char *err, size_t errlen)
{
    /* The config file first, wherever --config appears, so that flags override it. */
    size_t k = 0;
    for (int i = 1; i < argc; i++) {
        int bad = 0;
        const char *path = config_arg(argc, argv, &i, &bad, err, errlen);
        if (bad)
            return -1;
        if (!path)
            continue;
        if (texts && k >= ntexts)
            return util_err(err, errlen, "config file %s: not read", path);
        if (texts ? cfg_load_text(c, path, texts[k++], err, errlen) != 0
                  : cfg_load_file(c, path, err, errlen) != 0)
            return -1;
        if (set_str(&c->config_path, path, err, errlen, "config") != 0)
            return -1;
    }
    c->argc = argc;
    c->argv = argv;
    char msg[512];
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            cfg_print_help(argv[0], stdout);
            return 1;
        }
        if (strcmp(a, "--version") == 0) {
            printf("attnstatd %s\n", CFG_VERSION);
            return 1;
        }
        if (strcmp(a, "--config") == 0) {
            i++;
            continue;
        }
        if (strncmp(a, "--config=", 9) == 0)
            continue;
        if (strncmp(a, "--", 2) != 0) {
            snprintf(err, errlen, "unexpected argument '%s' (settings are --name value)", a);
            return -1;
        }
        char key[64];
        const char *value;
        const char *eq = strchr(a + 2, '=');
        size_t klen = eq ? (size_t)(eq - (a + 2)) : strlen(a + 2);
        if (klen >= sizeof key) {
            snprintf(err, errlen, "unknown flag '%s' (see --help)", a);
            return -1;
        }
        memcpy(key, a + 2, klen);
        key[klen] = '\0';
        int alias = cfg_is_listen_address(key);
        if (eq) {
            value = eq + 1;
        } else {
            if (!alias && !cfg_find(key)) {
                snprintf(err, errlen, "unknown flag '%s' (see --help)", a);
                return -1;
            }
            if (i + 1 >= argc) {
                snprintf(err, errlen, "%s needs a value", a);
                return -1;
            }
            value = argv[++i];
        }
        if (alias) {
            if (cfg_listen_address(c, value, err, errlen) != 0)
                return -1;
            continue;
        }
        if (cfg_set(c, key, value, msg, sizeof msg) != 0) {
            snprintf(err, errlen, "--%s", msg);
            return -1;
        }
    }
    return 0;
}

int cfg_parse_args(cfg *c, int argc, char **argv, char *err, size_t errlen)
{
    return parse_args(c, argc, argv, NULL, 0, err, errlen);
}

void cfg_log(const cfg *c)
{
    for (size_t i = 0; i < CFG_N; i++) {
        const cfg_entry *e = &cfg_table[i];
        const char *base = (const char *)c + e->offset;
        switch (e->type) {
        case CFG_STR:
        case CFG_CHOICE:
            LOG_DEBUG("config", "%s = %s", e->name, *(char *const *)base);
            break;
        case CFG_U64:
            LOG_DEBUG("config", "%s = %llu", e->name, (unsigned long long)*(const uint64_t *)base);
            break;
        case CFG_DBL:
            LOG_DEBUG("config", "%s = %g", e->name, *(const double *)base);
            break;
        case CFG_LEVEL:
            LOG_DEBUG("config", "%s = %d", e->name, (int)*(const log_level *)base);
            break;
        }
    }
}

/* ---- SIGHUP --------------------------------------------------------------------------------- */

/* The value of entry e in c, as text (for the reload's log lines and comparisons). */
static void cfg_text(const cfg *c, const cfg_entry *e, char *buf, size_t len)
{
    const char *base = (const char *)c + e->offset;
    static const char *const levels[] = {"debug", "info", "warn", "error"};
    switch (e->type) {
    case CFG_STR:
    case CFG_CHOICE: {
        const char *v = *(char *const *)base;
        snprintf(buf, len, "'%s'", v ? v : "");
        return;
    }
    case CFG_U64:
        snprintf(buf, len, "%llu", (unsigned long long)*(const uint64_t *)base);
        return;
    case CFG_DBL:
        snprintf(buf, len, "%.17g", *(const double *)base);
        return;
    case CFG_LEVEL: {
        int lv = (int)*(const log_level *)base;
        snprintf(buf, len, "%s", lv >= 0 && lv < 4 ? levels[lv] : "?");
        return;
    }
    }
    buf[0] = '\0';
}

int cfg_reload(cfg *live, const char *const *texts, size_t ntexts, char *err, size_t errlen)
{
    cfg fresh;
    if (cfg_init(&fresh, err, errlen) != 0)
        return -1;
    if (live->argc > 0 &&
        parse_args(&fresh, live->argc, live->argv, texts ? texts : (const char *const[]){""},
                   texts ? ntexts : 0, err, errlen) != 0) {
        cfg_free(&fresh);
        return -1;
    }
    int changed = 0;
    for (size_t i = 0; i < CFG_N; i++) {
        const cfg_entry *e = &cfg_table[i];
        char was[600], now[600];
        cfg_text(live, e, was, sizeof was);
        cfg_text(&fresh, e, now, sizeof now);
        if (strcmp(was, now) == 0)
            continue;
        if (!e->reload) {
            LOG_WARN("config", "reload: %s changed (%s -> %s) but takes effect only at a restart",
                     e->name, was, now);
            continue;
        }
        char *dst = (char *)live + e->offset, *src = (char *)&fresh + e->offset;
        switch (e->type) {
        case CFG_STR:
        case CFG_CHOICE: { /* the pointers change hands: fresh frees the old one */
            char *tmp = *(char **)dst;
            *(char **)dst = *(char **)src;
            *(char **)src = tmp;
            break;
        }
        case CFG_U64:
            *(uint64_t *)dst = *(uint64_t *)src;
            break;
        case CFG_DBL:
            *(double *)dst = *(double *)src;
            break;
        case CFG_LEVEL:
            *(log_level *)dst = *(log_level *)src;
            break;
        }
        LOG_INFO("config", "reload: %s: %s -> %s", e->name, was, now);
        changed++;
    }
    fresh.argc = 0;
    cfg_free(&fresh);
    return changed;
}
