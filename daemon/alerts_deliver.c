/* alerts_deliver.c — an alert transition to the log, the subscribers and --alert-exec (see
 * alerts_deliver.h). Stage: alert delivery; calls alerts (rule and state names), clients,
 * envelope, counters and log.
 *
 * --alert-exec: /bin/sh -c COMMAND, stdin ignored, stdout and stderr to the daemon's log, the
 * daemon's environment without its ATTNSTAT_* variables plus the alert's; at most
 * DELIVER_MAX_CHILDREN run at once (more are skipped and counted as failed). */
#include "alerts_deliver.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "envelope.h"
#include "log.h"

#define DELIVER_MAX_CHILDREN 16

extern char **environ;

struct alerts_deliver {
    uv_loop_t *loop;
    const cfg *cfg;
    counters *cnt;
    clients *reg;
    uint32_t children;       /* --alert-exec commands running */
};

typedef struct {
    uv_process_t proc;
    alerts_deliver *d;
} exec_child;

alerts_deliver *alerts_deliver_new(uv_loop_t *loop, const cfg *c, counters *cnt, clients *reg)
{
    alerts_deliver *d = calloc(1, sizeof *d);
    if (!d)
        return NULL;
    d->loop = loop;
    d->cfg = c;
    d->cnt = cnt;
    d->reg = reg;
    return d;
}

void alerts_deliver_free(alerts_deliver *d)
{
    free(d);
}

static void exec_closed(uv_handle_t *h)
{
    exec_child *ch = h->data;
    ch->d->children--;
    free(ch);
}

static void exec_exited(uv_process_t *proc, int64_t status, int term_signal)
{
    exec_child *ch = proc->data;
    if (status != 0 || term_signal != 0) {
        counters_inc(ch->d->cnt, CNT_EXEC_FAILED);
        LOG_WARN("alerts", "alert_exec command exited with status %lld (signal %d)",
                 (long long)status, term_signal);
    }
    uv_close((uv_handle_t *)proc, exec_closed);
}

static void run_exec(alerts_deliver *d, const feed_alert *a)
{
    const char *cmd = d->cfg->alert_exec;
    if (!cmd || !cmd[0])
        return;
    if (d->children >= DELIVER_MAX_CHILDREN) {
        counters_inc(d->cnt, CNT_EXEC_FAILED);
        LOG_WARN("alerts", "alert_exec skipped: %u commands still running", d->children);
        return;
    }
    char vars[9][320];
    snprintf(vars[0], sizeof vars[0], "ATTNSTAT_RUN=%s", a->run);
    snprintf(vars[1], sizeof vars[1], "ATTNSTAT_LAYER=%d", a->t.layer);
    snprintf(vars[2], sizeof vars[2], "ATTNSTAT_HEAD=%d", a->t.head);
    snprintf(vars[3], sizeof vars[3], "ATTNSTAT_STEP=%lld", (long long)a->t.step);
    snprintf(vars[4], sizeof vars[4], "ATTNSTAT_RULE=%s", alerts_rule_name(a->t.rule));
    snprintf(vars[5], sizeof vars[5], "ATTNSTAT_STATE=%s", alerts_state_name(a->t.state));
    snprintf(vars[6], sizeof vars[6], "ATTNSTAT_VALUE=%.17g", a->t.value);
    snprintf(vars[7], sizeof vars[7], "ATTNSTAT_THRESHOLD=%.17g", a->t.threshold);
    snprintf(vars[8], sizeof vars[8], "ATTNSTAT_REASON=%s", a->reason);
    size_t nenv = 0;
    while (environ && environ[nenv])
        nenv++;
    char **env = malloc((nenv + 10) * sizeof *env);
    exec_child *ch = calloc(1, sizeof *ch);
    if (!env || !ch) {
        free(env);
        free(ch);
        counters_inc(d->cnt, CNT_EXEC_FAILED);
        LOG_WARN("alerts", "alert_exec skipped: out of memory");
        return;
    }
    size_t k = 0;
    for (size_t i = 0; i < nenv; i++)
        if (strncmp(environ[i], "ATTNSTAT_", 9) != 0)
            env[k++] = environ[i];
    for (int i = 0; i < 9; i++)
        env[k++] = vars[i];
    env[k] = NULL;
    char *args[] = {"/bin/sh", "-c", (char *)cmd, NULL};
    uv_stdio_container_t stdio[3];
    stdio[0].flags = UV_IGNORE;
    stdio[1].flags = UV_INHERIT_FD;
    stdio[1].data.fd = 2; /* the command's output goes to the daemon's log */
    stdio[2].flags = UV_INHERIT_FD;
    stdio[2].data.fd = 2;
    uv_process_options_t opt;
    memset(&opt, 0, sizeof opt);
    opt.exit_cb = exec_exited;
    opt.file = "/bin/sh";
    opt.args = args;
    opt.env = env;
    opt.stdio = stdio;
    opt.stdio_count = 3;
    ch->d = d;
    ch->proc.data = ch;
    int rc = uv_spawn(d->loop, &ch->proc, &opt);
    free(env);
    if (rc != 0) {
        counters_inc(d->cnt, CNT_EXEC_FAILED);
        LOG_WARN("alerts", "alert_exec: cannot start /bin/sh: %s", uv_strerror(rc));
        /* uv_spawn initialised the handle even on failure: it must be closed. */
        d->children++;
        uv_close((uv_handle_t *)&ch->proc, exec_closed);
        return;
    }
    d->children++;
    counters_inc(d->cnt, CNT_EXEC_STARTED);
}

void alerts_deliver_one(void *data, const feed_alert *a)
{
    alerts_deliver *d = data;
    counters_inc(d->cnt, a->t.state == ALERTS_RAISED    ? CNT_ALERTS_RAISED
                         : a->t.state == ALERTS_CLEARED ? CNT_ALERTS_CLEARED
                                                        : CNT_ALERTS_RESOLVED);
    if (a->silenced) {
        LOG_INFO("alerts", "run '%s': %s (silenced: not sent to watchers or alert_exec)", a->run,
                 a->message);
        return;
    }
    LOG_WARN("alerts", "run '%s': %s", a->run, a->message);
    Attnstat__Alert al;
    Attnstat__Envelope env;
    envelope_alert(&env, &al, a->run, a->t.run_id, (uint32_t)a->t.layer, (uint32_t)a->t.head,
                   a->t.step, (Attnstat__AlertRule)a->t.rule, (Attnstat__AlertState)a->t.state);
    al.has_rank = 1;
    al.rank = a->rank;
    if (!isnan(a->t.value)) {
        al.has_value = 1;
        al.value = a->t.value;
    }
    if (!isnan(a->t.threshold)) {
        al.has_threshold = 1;
        al.threshold = a->t.threshold;
    }
    al.has_time_ms = 1;
    al.time_ms = a->time_ms;
    al.message = a->message[0] ? (char *)a->message : NULL;
    al.reason = a->reason[0] ? (char *)a->reason : NULL;
    clients_broadcast(d->reg, &env, CLIENTS_ALERTS);
    run_exec(d, a);
}
