/* live.c — the attnstat CLI's live commands (see live.h): status (the daemon's counters, workers
 * and clients) and watch (alerts printed as they happen, those of --run, --rank, --rule only
 * when asked; across daemon restarts, which libattnstat reconnects and subscribes again for).
 *
 * Stage: a command file of the CLI. Calls libattnstat (connect, status, subscribe, poll,
 * link_state) and out.c. */
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "admin.h"
#include "attnstat.h"
#include "live.h"
#include "out.h"

static attnstat_client *live_connect(const cli_args *a)
{
    attnstat_connect_opts o;
    attnstat_connect_opts_init(&o);
    o.socket_path = a->socket;
    o.timeout_ms = a->timeout_ms;
    attnstat_client *c = NULL;
    attnstat_error err;
    if (attnstat_connect_ex(&o, &c, &err) != ATTNSTAT_OK) {
        fprintf(stderr, "attnstat: %s\n", out_safe(err.msg));
        return NULL;
    }
    return c;
}

int live_status(const cli_args *a)
{
    attnstat_client *c = live_connect(a);
    if (!c)
        return CLI_EXIT_FAIL;
    attnstat_daemon_status *ds = malloc(sizeof *ds);
    if (!ds) {
        attnstat_close(c);
        fprintf(stderr, "attnstat: out of memory\n");
        return CLI_EXIT_FAIL;
    }
    attnstat_code rc = attnstat_status(c, ds, a->timeout_ms);
    if (rc != ATTNSTAT_OK) {
        fprintf(stderr, "attnstat: status from %s: %s\n", out_safe(a->socket),
                out_safe(attnstat_last_error(c)));
        free(ds);
        attnstat_close(c);
        return CLI_EXIT_FAIL;
    }
    admin_store_status ss; /* the store thread and the retention: a Status of its own */
    admin_store_status_get(a, &ss);
    if (a->fmt == OUT_JSON) {
        printf("{\"socket\": ");
        out_json_string(stdout, a->socket);
        printf(", \"daemon_version\": ");
        out_json_string(stdout, ds->daemon_version);
        printf(", \"client_version\": ");
        out_json_string(stdout, attnstat_version());
        printf(", \"db\": ");
        out_json_string(stdout, ds->db_path);
        printf(", \"uptime_s\": %.3f, \"clients\": %u, \"pushes\": %llu, \"pushes_done\": %llu, "
               "\"dropped\": %llu, \"rejected\": %llu, \"failed\": %llu, "
               "\"samples_stored\": %llu, \"store_errors\": %llu, \"alerts_active\": %u, "
               "\"push_rate\": %.3f, \"last_store_error\": ",
               ds->uptime_s, ds->clients, (unsigned long long)ds->pushes,
               (unsigned long long)ds->pushes_done, (unsigned long long)ds->dropped,
               (unsigned long long)ds->rejected, (unsigned long long)ds->failed,
               (unsigned long long)ds->samples_stored, (unsigned long long)ds->store_errors,
               ds->alerts_active, ds->push_rate);
        out_json_string(stdout, ds->last_store_error);
        printf(", \"workers\": [");
        for (uint32_t i = 0; i < ds->n_workers; i++) {
            const attnstat_worker_status *w = &ds->workers[i];
            printf("%s{\"name\": ", i ? ", " : "");
            out_json_string(stdout, w->name);
            printf(", \"queue_depth\": %u, \"queue_capacity\": %u, \"processed\": %llu, "
                   "\"dropped\": %llu, \"busy_frac\": %.4f}",
                   w->queue_depth, w->queue_capacity, (unsigned long long)w->processed,
                   (unsigned long long)w->dropped, w->busy_frac);
        }
        printf("], \"client_list\": [");
        for (uint32_t i = 0; i < ds->n_client_list; i++) {
            const attnstat_client_status *cs = &ds->client_list[i];
            printf("%s{\"id\": %llu, \"run\": ", i ? ", " : "", (unsigned long long)cs->id);
            out_json_string(stdout, cs->run);
            printf(", \"rank\": %d, \"pid\": %d, \"uid\": %u, \"pushes\": %llu, \"dropped\": %llu, "
                   "\"rejected\": %llu}",
                   cs->rank, cs->pid, cs->uid, (unsigned long long)cs->pushes,
                   (unsigned long long)cs->dropped, (unsigned long long)cs->rejected);
        }
        printf("], \"rejections\": [");
        for (uint32_t i = 0; i < ds->n_rejections; i++) {
            const attnstat_rejection *rj = &ds->rejections[i];
            printf("%s{\"code\": ", i ? ", " : "");
            out_json_string(stdout, attnstat_proto_code_name(rj->code));
            printf(", \"count\": %llu, \"last_message\": ", (unsigned long long)rj->count);
            out_json_string(stdout, rj->last_message);
            printf("}");
        }
        printf("]");
        if (ss.have) {
            printf(", \"runs_live\": %u, \"interventions_stored\": %llu, "
                   "\"interventions_refused\": %llu, \"store\": {\"queued\": %u, \"commits\": %llu, "
                   "\"durability\": ", ss.runs_live, (unsigned long long)ss.interventions_stored,
                   (unsigned long long)ss.interventions_refused, ss.queued,
                   (unsigned long long)ss.commits);
            out_json_string(stdout, ss.durability);
            printf(", \"retain_ms\": %lld, \"retain_bytes\": %lld, \"retain_steps\": %llu, "
                   "\"compacted\": %llu, \"downsampled\": %llu, \"used_bytes\": %lld, "
                   "\"over_limit\": %s, \"last_step_ms\": %.3f, \"retain_busy_frac\": %.4f, "
                   "\"checkpoints\": %llu, \"checkpoints_inline\": %llu, "
                   "\"checkpoint_errors\": %llu, \"last_checkpoint_error\": ",
                   (long long)ss.retain_ms, (long long)ss.retain_bytes,
                   (unsigned long long)ss.retain_steps, (unsigned long long)ss.compacted,
                   (unsigned long long)ss.downsampled, (long long)ss.used_bytes,
                   ss.over_limit ? "true" : "false", ss.last_step_ms, ss.retain_busy_frac,
                   (unsigned long long)ss.checkpoints, (unsigned long long)ss.checkpoints_inline,
                   (unsigned long long)ss.checkpoint_errors);
            out_json_string(stdout, ss.last_checkpoint_error);
            printf("}");
        }
        printf("}\n");
    } else {
        printf("attnstatd %s at %s, up %.0f s\n",
               ds->daemon_version[0] ? out_safe(ds->daemon_version) : "?", out_safe(a->socket),
               ds->uptime_s);
        printf("client         attnstat %s (libattnstat %s)\n", ATTNSTAT_VERSION,
               attnstat_version());
        printf("database       %s\n", ds->db_path[0] ? out_safe(ds->db_path) : "-");
        printf("clients        %u\n", ds->clients);
        printf("pushes         %llu received, %llu done, %llu dropped, %llu rejected, %llu "
               "failed\n", (unsigned long long)ds->pushes, (unsigned long long)ds->pushes_done,
               (unsigned long long)ds->dropped, (unsigned long long)ds->rejected,
               (unsigned long long)ds->failed);
        if (ds->store_errors)
            printf("store errors   %llu (last: %s)\n", (unsigned long long)ds->store_errors,
                   out_safe(ds->last_store_error));
        else
            printf("store errors   0\n");
        printf("push rate      %.1f /s (last 10 s)\n", ds->push_rate);
        printf("samples stored %llu\n", (unsigned long long)ds->samples_stored);
        printf("alerts active  %u\n", ds->alerts_active);
        if (ss.have) {
            printf("runs live      %u\n", ss.runs_live);
            printf("interventions  %llu recorded, %llu refused (attnstat interventions RUN lists "
                   "them)\n", (unsigned long long)ss.interventions_stored,
                   (unsigned long long)ss.interventions_refused);
            printf("store          durability %s, %llu commits, %u writes queued\n",
                   out_safe(ss.durability), (unsigned long long)ss.commits, ss.queued);
            printf("checkpoints    %llu on their own thread, %llu on the store thread, %llu failed",
                   (unsigned long long)ss.checkpoints, (unsigned long long)ss.checkpoints_inline,
                   (unsigned long long)ss.checkpoint_errors);
            if (ss.checkpoint_errors)
                printf(" (last: %s)", out_safe(ss.last_checkpoint_error));
            printf("\n");
            char age[64] = "no age limit", size[64] = "no size limit";
            if (ss.retain_ms > 0)
                snprintf(age, sizeof age, "full resolution %.4g days", ss.retain_ms / 86400000.0);
            if (ss.retain_bytes > 0)
                snprintf(size, sizeof size, "at most %lld bytes", (long long)ss.retain_bytes);
            printf("retention      %s, %s; %llu steps, %llu samples compacted, %llu downsampled, "
                   "%lld bytes in use%s, last step %.2f ms, %.1f%% of the time\n", age, size,
                   (unsigned long long)ss.retain_steps, (unsigned long long)ss.compacted,
                   (unsigned long long)ss.downsampled, (long long)ss.used_bytes,
                   ss.over_limit ? " (OVER THE LIMIT: nothing more to downsample)" : "",
                   ss.last_step_ms, 100.0 * ss.retain_busy_frac);
        }
        if (ds->n_workers) {
            static const out_col wc[] = {
                {"worker", NULL, OUT_STR, 0, 1},   {"queue", NULL, OUT_INT, 0, 1},
                {"capacity", NULL, OUT_INT, 0, 1}, {"processed", NULL, OUT_INT, 0, 1},
                {"dropped", NULL, OUT_INT, 0, 1},  {"busy", NULL, OUT_NUM, 2, 1}};
            out_set o;
            printf("\n");
            out_begin(&o, OUT_TABLE, stdout, wc, 6);
            for (uint32_t i = 0; i < ds->n_workers; i++) {
                const attnstat_worker_status *w = &ds->workers[i];
                out_val v[] = {out_s(w->name), out_i(w->queue_depth), out_i(w->queue_capacity),
                               out_i((int64_t)w->processed), out_i((int64_t)w->dropped),
                               out_d(w->busy_frac)};
                out_add(&o, v);
            }
            out_end(&o);
        }
        if (ds->n_rejections) { /* why pushes were not stored */
            static const out_col rjc[] = {{"answered", NULL, OUT_STR, 0, 1},
                                          {"pushes", NULL, OUT_INT, 0, 1},
                                          {"last message", NULL, OUT_STR, 0, 1}};
            out_set o;
            printf("\n");
            out_begin(&o, OUT_TABLE, stdout, rjc, 3);
            for (uint32_t i = 0; i < ds->n_rejections; i++) {
                const attnstat_rejection *rj = &ds->rejections[i];
                out_val v[] = {out_s(attnstat_proto_code_name(rj->code)),
                               out_i((int64_t)rj->count), out_s(rj->last_message)};
                out_add(&o, v);
            }
            out_end(&o);
        }
        if (ds->n_client_list) {
            static const out_col cc[] = {
                {"client", NULL, OUT_INT, 0, 1}, {"run", NULL, OUT_STR, 0, 1},
                {"rank", NULL, OUT_INT, 0, 1},   {"pid", NULL, OUT_INT, 0, 1},
                {"uid", NULL, OUT_INT, 0, 1},    {"pushes", NULL, OUT_INT, 0, 1},
                {"dropped", NULL, OUT_INT, 0, 1}, {"rejected", NULL, OUT_INT, 0, 1}};
            out_set o;
            printf("\n");
            out_begin(&o, OUT_TABLE, stdout, cc, 8);
            for (uint32_t i = 0; i < ds->n_client_list; i++) {
                const attnstat_client_status *cs = &ds->client_list[i];
                out_val v[] = {out_i((int64_t)cs->id), out_s(cs->run), out_i(cs->rank),
                               out_i(cs->pid), out_i(cs->uid), out_i((int64_t)cs->pushes),
                               out_i((int64_t)cs->dropped), out_i((int64_t)cs->rejected)};
                out_add(&o, v);
            }
            out_end(&o);
            /* A trainer that pushes nothing is a monitor that sees nothing: said, not left to be
             * read off a 0 in the table. */
            for (uint32_t i = 0; i < ds->n_client_list; i++) {
                const attnstat_client_status *cs = &ds->client_list[i];
                if (cs->run[0] && cs->pushes == 0)
                    printf("note: run %s rank %d (client %llu, pid %d) has pushed nothing since it "
                           "connected: its monitor may see no attention call (in Python, "
                           "monitor.stats()['blind'] counts such forward passes and the trainer's "
                           "log says why), or it has not reached a monitored step yet\n",
                           cs->run, cs->rank, (unsigned long long)cs->id, cs->pid);
            }
        }
    }
    free(ds);
    attnstat_close(c);
    return CLI_EXIT_OK;
}

static volatile sig_atomic_t live_stop;

static void live_on_signal(int sig)
{
    (void)sig;
    live_stop = 1;
}

/* The daemon streams every alert to a subscriber: --run (a name or an id), --rank and --rule of
 * `watch` are applied here. */
static int live_alert_kept(const cli_args *a, const attnstat_alert *al)
{
    char id[32];
    snprintf(id, sizeof id, "%lld", (long long)al->run_id);
    return (!a->run || !strcmp(al->run, a->run) || !strcmp(id, a->run)) &&
           (a->rank < 0 || al->rank == a->rank) &&
           (!a->rule || !strcmp(attnstat_rule_name(al->rule), a->rule));
}

static void live_print_alert(void *user, const attnstat_alert *al)
{
    const cli_args *a = user;
    if (!live_alert_kept(a, al))
        return;
    char t[32];
    out_time(t, sizeof t, al->time_ms);
    if (a->fmt == OUT_JSON) {
        printf("{\"time\": \"%s\", \"time_ms\": %lld, \"run\": ", t, (long long)al->time_ms);
        out_json_string(stdout, al->run);
        printf(", \"run_id\": %lld, \"rank\": %d, \"layer\": %u, \"head\": %u, \"step\": %lld, "
               "\"rule\": \"%s\", \"state\": \"%s\", \"value\": ",
               (long long)al->run_id, al->rank, al->layer, al->head, (long long)al->step,
               attnstat_rule_name(al->rule), attnstat_state_name(al->state));
        if (isfinite(al->value))
            printf("%.17g", al->value);
        else
            printf("null");
        printf(", \"threshold\": ");
        if (isfinite(al->threshold))
            printf("%.17g", al->threshold);
        else
            printf("null");
        printf(", \"message\": ");
        out_json_string(stdout, al->message);
        printf("}\n");
    } else {
        printf("%s  %-7s  %-13s  run %s rank %d  layer %u head %u  step %lld", t,
               attnstat_state_name(al->state), attnstat_rule_name(al->rule), out_safe(al->run),
               al->rank, al->layer, al->head, (long long)al->step);
        /* a resolved alert has no value (its run ended, or an operator ended it) */
        if (isfinite(al->value))
            printf("  value %.4g threshold %.4g", al->value, al->threshold);
        printf("\n");
    }
    fflush(stdout);
}

int live_watch(const cli_args *a)
{
    attnstat_client *c = live_connect(a);
    if (!c)
        return CLI_EXIT_FAIL;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = live_on_signal;
    sigemptyset(&sa.sa_mask);
    if (sigaction(SIGINT, &sa, NULL) != 0 || sigaction(SIGTERM, &sa, NULL) != 0) {
        fprintf(stderr, "attnstat: sigaction: %s\n", strerror(errno));
        attnstat_close(c);
        return CLI_EXIT_FAIL;
    }
    attnstat_set_alert_callback(c, live_print_alert, (void *)a);
    if (attnstat_subscribe(c, 1, 0) != ATTNSTAT_OK) {
        fprintf(stderr, "attnstat: subscribe: %s\n", out_safe(attnstat_last_error(c)));
        attnstat_close(c);
        return CLI_EXIT_FAIL;
    }
    /* A Status round trip: once answered, the daemon has handled the Subscribe before it, so
     * every alert from now on reaches this watcher. Then say so (on stderr: stdout stays data). */
    attnstat_daemon_status *ds = malloc(sizeof *ds);
    attnstat_code sc = ds ? attnstat_status(c, ds, a->timeout_ms) : ATTNSTAT_ENOMEM;
    free(ds);
    if (sc != ATTNSTAT_OK) {
        fprintf(stderr, "attnstat: subscribing at %s: %s\n", out_safe(a->socket),
                sc == ATTNSTAT_ENOMEM ? "out of memory" : out_safe(attnstat_last_error(c)));
        attnstat_close(c);
        return CLI_EXIT_FAIL;
    }
    char only[320] = "";
    if (a->run || a->rank >= 0 || a->rule) {
        char rank[32] = "";
        if (a->rank >= 0)
            snprintf(rank, sizeof rank, " rank %d", a->rank);
        snprintf(only, sizeof only, ", only%s%s%s%s%s", a->run ? " run " : "", a->run ? a->run : "",
                 rank, a->rule ? " rule " : "", a->rule ? a->rule : "");
    }
    fprintf(stderr, "watching alerts from %s%s (Ctrl-C to stop)\n", a->socket, only);
    /* A daemon that goes away is waited for: the library reconnects and subscribes again (its
     * link is up again once the daemon has the subscription). One line each way, on stderr. */
    int rc = CLI_EXIT_OK, up = 1;
    while (!live_stop) {
        if (attnstat_poll(c, 1000) != ATTNSTAT_OK) {
            fprintf(stderr, "attnstat: %s\n", out_safe(attnstat_last_error(c)));
            rc = CLI_EXIT_FAIL;
            break;
        }
        char why[256];
        int now_up = attnstat_link_state(c, why, sizeof why) == ATTNSTAT_LINK_UP;
        if (up && !now_up)
            fprintf(stderr, "attnstat: lost attnstatd at %s (%s); waiting for it to come back\n",
                    out_safe(a->socket), out_safe(why));
        else if (!up && now_up)
            fprintf(stderr, "attnstat: attnstatd at %s is back; watching alerts again\n",
                    a->socket);
        up = now_up;
    }
    attnstat_close(c);
    return rc;
}

