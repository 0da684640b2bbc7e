/* admin.c — the attnstat CLI's operator commands (see admin.h): alerts
 * ack|resolve|silence|unsilence, delete-run, retention (and a run's limits shown), and the store's
 * part of status. Each asks attnstatd with one raw frame on
 * a connection of its own and prints its one answer.
 *
 * Stage: a command file of the CLI, called by main.c and live.c; calls history.c (resolving
 * --run), the store (deleting offline, under the daemon's lock), proto/ (envelope, frame) and
 * out.c. */
#include "admin.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "attnstat.h"
#include "envelope.h"
#include "frame.h"
#include "history.h"
#include "out.h"
#include "store.h"
#include "store_lock.h"
#include "store_retain.h"

#define ADMIN_DELETE_BUDGET 4096 /* samples per transaction, offline */

/* ---- one request, one answer ----------------------------------------------------------------- */

static int64_t admin_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Connects to the socket: the descriptor, or -1 with errno set (ENOENT/ECONNREFUSED: no daemon). */
static int admin_connect(const char *path)
{
    struct sockaddr_un sa;
    memset(&sa, 0, sizeof sa);
    sa.sun_family = AF_UNIX;
    if (strlen(path) >= sizeof sa.sun_path) {
        errno = ENAMETOOLONG;
        return -1;
    }
    memcpy(sa.sun_path, path, strlen(path) + 1);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -1;
    if (connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0) {
        int e = errno;
        close(fd);
        errno = e;
        return -1;
    }
    return fd;
}

/* Sends env on fd and waits up to timeout_ms for a frame whose message is `want` (an Error is
 * taken too). The decoded envelope (free with attnstat__envelope__free_unpacked), or NULL with
 * err set. */
static Attnstat__Envelope *admin_ask(int fd, const Attnstat__Envelope *env,
                                     Attnstat__Envelope__MsgCase want, int timeout_ms, char *err,
                                     size_t errlen)
{
    size_t len;
    uint8_t *buf = frame_pack(env, FRAME_MAX_DEFAULT, &len);
    if (!buf) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    size_t off = 0;
    while (off < len) {
        ssize_t w = send(fd, buf + off, len - off, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0) {
            snprintf(err, errlen, "sending: %s", strerror(errno));
            free(buf);
            return NULL;
        }
        off += (size_t)w;
    }
    free(buf);
    frame_reader r;
    frame_reader_init(&r, 16u << 20);
    int64_t deadline = admin_now_ms() + timeout_ms;
    Attnstat__Envelope *got = NULL;
    for (;;) {
        const uint8_t *payload;
        uint32_t plen;
        int n = frame_reader_next(&r, &payload, &plen, err, errlen);
        if (n < 0)
            break;
        if (n == 1) {
            got = frame_decode(payload, plen, NULL);
            frame_reader_consume(&r);
            if (!got) {
                snprintf(err, errlen, "attnstatd sent a message this attnstat cannot decode");
                break;
            }
            if (got->msg_case == want || got->msg_case == ATTNSTAT__ENVELOPE__MSG_ERROR)
                break;
            attnstat__envelope__free_unpacked(got, NULL); /* an alert to a subscriber: not ours */
            got = NULL;
            continue;
        }
        int64_t left = deadline - admin_now_ms();
        if (left <= 0) {
            snprintf(err, errlen, "no answer from attnstatd within %d ms (--timeout)", timeout_ms);
            break;
        }
        struct pollfd pfd = {fd, POLLIN, 0};
        int pr = poll(&pfd, 1, (int)left);
        if (pr < 0 && errno == EINTR)
            continue;
        if (pr < 0) {
            snprintf(err, errlen, "poll: %s", strerror(errno));
            break;
        }
        if (pr == 0)
            continue;
        size_t avail;
        uint8_t *space = frame_reader_space(&r, 65536, &avail);
        if (!space) {
            snprintf(err, errlen, "out of memory");
            break;
        }
        ssize_t rd = recv(fd, space, avail, 0);
        if (rd < 0 && errno == EINTR)
            continue;
        if (rd <= 0) {
            snprintf(err, errlen, "attnstatd closed the connection without answering%s%s",
                     rd < 0 ? ": " : "", rd < 0 ? strerror(errno) : "");
            break;
        }
        frame_reader_commit(&r, (size_t)rd);
    }
    frame_reader_free(&r);
    return got;
}

/* ---- commands -------------------------------------------------------------------------------- */

static void admin_print(const cli_args *a, const char *what, Attnstat__Code code,
                        const char *message, uint64_t count)
{
    if (a->fmt == OUT_JSON) {
        printf("{\"command\": ");
        out_json_string(stdout, what);
        printf(", \"code\": ");
        out_json_string(stdout, attnstat_proto_code_name((int32_t)code));
        printf(", \"count\": %llu, \"message\": ", (unsigned long long)count);
        out_json_string(stdout, message ? message : "");
        printf("}\n");
    } else if (code == ATTNSTAT__CODE__OK) {
        printf("%s\n", out_safe(message ? message : "done"));
    }
    if (code != ATTNSTAT__CODE__OK)
        fprintf(stderr, "attnstat: %s: %s: %s\n", what,
                attnstat_proto_code_name((int32_t)code), out_safe(message ? message : ""));
}

/* Sends the Command m (action set, fields on it) and prints the reply. fd is connected. */
static int admin_command(const cli_args *a, int fd, Attnstat__Envelope *env)
{
    char err[512] = "";
    Attnstat__Envelope *got =
        admin_ask(fd, env, ATTNSTAT__ENVELOPE__MSG_COMMAND_REPLY, a->timeout_ms, err, sizeof err);
    close(fd);
    if (!got) {
        fprintf(stderr, "attnstat: %s: %s\n", a->cmd, out_safe(err));
        return CLI_EXIT_FAIL;
    }
    int rc = CLI_EXIT_OK;
    if (got->msg_case == ATTNSTAT__ENVELOPE__MSG_ERROR) {
        admin_print(a, a->cmd, got->error->code, got->error->message, 0);
        rc = CLI_EXIT_FAIL;
    } else {
        Attnstat__CommandReply *r = got->command_reply;
        admin_print(a, a->cmd, r->code, r->message, r->has_count ? r->count : 0);
        if (r->code != ATTNSTAT__CODE__OK)
            rc = CLI_EXIT_FAIL;
    }
    attnstat__envelope__free_unpacked(got, NULL);
    return rc;
}

/* --run resolved against the database (a name or an id): *run_id. */
/* The database the daemon on a's socket names in its status, into db; 0 when none answers. A run
 * named without --db is looked up there: the daemon may keep its database anywhere (--db of
 * attnstatd), and the default path would name another, or none. */
static int admin_daemon_db(const cli_args *a, char *db, size_t len)
{
    attnstat_connect_opts o;
    attnstat_connect_opts_init(&o);
    o.socket_path = a->socket;
    o.timeout_ms = a->timeout_ms;
    attnstat_client *c = NULL;
    attnstat_error err;
    if (attnstat_connect_ex(&o, &c, &err) != ATTNSTAT_OK)
        return 0;
    attnstat_daemon_status *ds = malloc(sizeof *ds);
    int ok = ds && attnstat_status(c, ds, a->timeout_ms) == ATTNSTAT_OK && ds->db_path[0];
    if (ok)
        snprintf(db, len, "%s", ds->db_path);
    free(ds);
    attnstat_close(c);
    return ok;
}

static int admin_run_id(const cli_args *a, int64_t *run_id)
{
    store *st = NULL;
    char *name = NULL;
    char db[4096];
    cli_args b = *a;
    if (!a->db_given && admin_daemon_db(a, db, sizeof db))
        b.db = db;
    int rc = history_open_run(&b, &st, run_id, &name);
    if (rc != CLI_EXIT_OK)
        return rc;
    free(name);
    store_close(st);
    return CLI_EXIT_OK;
}

static int admin_socket(const cli_args *a)
{
    int fd = admin_connect(a->socket);
    if (fd < 0)
        fprintf(stderr, "attnstat: %s: cannot reach attnstatd at %s: %s\n", a->cmd,
                out_safe(a->socket), strerror(errno));
    return fd;
}

/* ack, resolve, silence (--id an alert's id) and unsilence (--id a silence's id), or --run: every
 * active alert (every silence) of the run. */
static int admin_mark(const cli_args *a, Attnstat__Command__Action action)
{
    const int unsilence = action == ATTNSTAT__COMMAND__ACTION__UNSILENCE;
    if ((a->alert_id > 0) == (a->run != NULL)) {
        if (unsilence)
            fprintf(stderr, "attnstat: alerts unsilence takes --id ID (one silence: its id in "
                    "attnstat alerts silences) or --run RUN (every silence of the run), one of "
                    "the two\n");
        else
            fprintf(stderr, "attnstat: %s takes --id ID (one alert) or --run RUN (every active "
                    "alert of the run), one of the two\n", a->cmd);
        return CLI_EXIT_USAGE;
    }
    Attnstat__Command m;
    Attnstat__Envelope env;
    envelope_command(&env, &m, action);
    if (a->alert_id > 0 && unsilence) {
        m.has_silence_id = 1;
        m.silence_id = a->alert_id;
    } else if (a->alert_id > 0) {
        m.has_alert_id = 1;
        m.alert_id = a->alert_id;
    } else {
        int64_t run_id;
        int rc = admin_run_id(a, &run_id);
        if (rc != CLI_EXIT_OK)
            return rc;
        m.has_run_id = 1;
        m.run_id = run_id;
    }
    if (action == ATTNSTAT__COMMAND__ACTION__SILENCE && a->until_set) {
        m.has_until_ms = 1;
        m.until_ms = a->until_ms;
    }
    int fd = admin_socket(a);
    if (fd < 0)
        return CLI_EXIT_FAIL;
    return admin_command(a, fd, &env);
}

int admin_alerts_ack(const cli_args *a)
{
    return admin_mark(a, ATTNSTAT__COMMAND__ACTION__ACK);
}

int admin_alerts_resolve(const cli_args *a)
{
    return admin_mark(a, ATTNSTAT__COMMAND__ACTION__RESOLVE);
}

int admin_alerts_silence(const cli_args *a)
{
    return admin_mark(a, ATTNSTAT__COMMAND__ACTION__SILENCE);
}

int admin_alerts_unsilence(const cli_args *a)
{
    return admin_mark(a, ATTNSTAT__COMMAND__ACTION__UNSILENCE);
}

/* delete-run with no daemon: on the database itself, under the daemon's lock. */
static int admin_delete_offline(const cli_args *a, int64_t run_id)
{
    char lock[4200];
    snprintf(lock, sizeof lock, "%s.lock", a->db);
    int lfd = open(lock, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (lfd < 0) {
        fprintf(stderr, "attnstat: delete-run: cannot open the lock %s: %s\n", out_safe(lock),
                strerror(errno));
        return CLI_EXIT_FAIL;
    }
    if (flock(lfd, LOCK_EX | LOCK_NB) != 0) {
        fprintf(stderr, "attnstat: delete-run: attnstatd holds %s but does not answer on %s: "
                "pass its --socket\n", out_safe(lock), out_safe(a->socket));
        close(lfd);
        return CLI_EXIT_FAIL;
    }
    /* and the lock on the file itself, which a daemon holds whatever name it opened it by (a
     * hard or symbolic link: its DB.lock is beside another path) */
    long holder = 0;
    char lerr[256];
    int ffd = store_lock_take(a->db, &holder, lerr, sizeof lerr);
    if (ffd == STORE_LOCK_HELD) {
        fprintf(stderr, "attnstat: delete-run: attnstatd (pid %ld) has %s open, by this name or "
                "another, but does not answer on %s: pass its --socket\n", holder,
                out_safe(a->db), out_safe(a->socket));
        close(lfd);
        return CLI_EXIT_FAIL;
    }
    if (ffd < 0 && ffd != STORE_LOCK_UNSUPPORTED) {
        fprintf(stderr, "attnstat: delete-run: %s\n", out_safe(lerr));
        close(lfd);
        return CLI_EXIT_FAIL;
    }
    store_error se = {0, ""};
    store *st = store_open(a->db, 5000, &se);
    if (!st) {
        fprintf(stderr, "attnstat: delete-run: cannot open %s: %s\n", out_safe(a->db),
                out_safe(se.msg));
        store_lock_release(ffd);
        close(lfd);
        return CLI_EXIT_FAIL;
    }
    int done = 0;
    store_status s = STORE_OK;
    while (!done && s == STORE_OK)
        s = store_delete_run(st, run_id, ADMIN_DELETE_BUDGET, &done, &se);
    store_close(st);
    store_lock_release(ffd);
    close(lfd);
    if (s != STORE_OK) {
        fprintf(stderr, "attnstat: delete-run: %s\n", out_safe(se.msg));
        return CLI_EXIT_FAIL;
    }
    char msg[128];
    snprintf(msg, sizeof msg, "run %lld deleted (no attnstatd running: in the database itself)",
             (long long)run_id);
    admin_print(a, a->cmd, ATTNSTAT__CODE__OK, msg, 1);
    return CLI_EXIT_OK;
}

int admin_delete_run(const cli_args *a)
{
    int64_t run_id;
    int rc = admin_run_id(a, &run_id);
    if (rc != CLI_EXIT_OK)
        return rc;
    int fd = admin_connect(a->socket);
    if (fd < 0 && (errno == ENOENT || errno == ECONNREFUSED))
        return admin_delete_offline(a, run_id);
    if (fd < 0) {
        fprintf(stderr, "attnstat: delete-run: cannot reach attnstatd at %s: %s\n",
                out_safe(a->socket), strerror(errno));
        return CLI_EXIT_FAIL;
    }
    Attnstat__Command m;
    Attnstat__Envelope env;
    envelope_command(&env, &m, ATTNSTAT__COMMAND__ACTION__DELETE_RUN);
    m.has_run_id = 1;
    m.run_id = run_id;
    return admin_command(a, fd, &env);
}

/* A limit in words: < 0 the daemon's (its value when known: daemon >= 0), 0 none. */
static void admin_limit_words(char *buf, size_t len, int64_t v, int is_ms, int64_t daemon)
{
    char d[64];
    if (v >= 0 || daemon < 0) {
        if (v > 0 && is_ms)
            snprintf(buf, len, "%.4g days", (double)v / 86400000.0);
        else if (v > 0)
            snprintf(buf, len, "%lld bytes", (long long)v);
        else if (v == 0)
            snprintf(buf, len, "none");
        else
            snprintf(buf, len, "attnstatd's %s (attnstatd did not answer to say what it is)",
                     is_ms ? "retain_days" : "retain_bytes");
        return;
    }
    if (daemon == 0)
        snprintf(d, sizeof d, "none");
    else if (is_ms)
        snprintf(d, sizeof d, "%.4g days", (double)daemon / 86400000.0);
    else
        snprintf(d, sizeof d, "%lld bytes", (long long)daemon);
    snprintf(buf, len, "attnstatd's %s: %s", is_ms ? "retain_days" : "retain_bytes", d);
}

typedef struct {
    store_run r;
    int found;
} admin_run_copy;

static int admin_copy_run(void *ctx, const store_run *r)
{
    admin_run_copy *c = ctx;
    c->r = *r;
    c->r.name = c->r.host = c->r.config = c->r.thresholds = c->r.end_reason = NULL;
    c->found = 1;
    return 0;
}

/* retention --run R alone: the run's limits, its own or the daemon's (asked, when it answers). */
static int admin_retention_show(const cli_args *a)
{
    store *st;
    int64_t run_id;
    char *name;
    int rc = history_open_run(a, &st, &run_id, &name);
    if (rc != CLI_EXIT_OK)
        return rc;
    admin_run_copy c = {0};
    store_error se;
    store_status s = store_get_run(st, run_id, admin_copy_run, &c, &se);
    store_close(st);
    if (s != STORE_OK || !c.found) {
        fprintf(stderr, "attnstat: retention: cannot read run '%s': %s\n", name,
                s != STORE_OK ? out_safe(se.msg) : "not found");
        free(name);
        return CLI_EXIT_FAIL;
    }
    admin_store_status ds;
    int have = admin_store_status_get(a, &ds) == 0 && ds.have;
    int64_t dms = have ? ds.retain_ms : -1, dbytes = have ? ds.retain_bytes : -1;
    const store_run *r = &c.r;
    char age[160], size[160];
    admin_limit_words(age, sizeof age, r->retain_ms, 1, dms);
    admin_limit_words(size, sizeof size, r->retain_bytes, 0, dbytes);
    if (a->fmt == OUT_JSON) {
        printf("{\"run\": ");
        out_json_string(stdout, name);
        printf(", \"run_id\": %lld, \"rank\": %d, \"retain_ms\": %lld, \"retain_bytes\": %lld, "
               "\"bytes\": %lld", (long long)run_id, (int)r->rank, (long long)r->retain_ms,
               (long long)r->retain_bytes, (long long)r->bytes);
        if (have)
            printf(", \"daemon_retain_ms\": %lld, \"daemon_retain_bytes\": %lld",
                   (long long)dms, (long long)dbytes);
        else
            printf(", \"daemon_retain_ms\": null, \"daemon_retain_bytes\": null");
        printf(", \"age\": ");
        out_json_string(stdout, age);
        printf(", \"size\": ");
        out_json_string(stdout, size);
        printf("}\n");
    } else {
        printf("run %s rank %d (id %lld)\n", name, (int)r->rank, (long long)run_id);
        printf("  full resolution for  %s%s\n", age, r->retain_ms >= 0 ? " (its own)" : "");
        printf("  at most              %s%s\n", size, r->retain_bytes >= 0 ? " (its own)" : "");
        printf("  its samples take     about %lld bytes\n", (long long)r->bytes);
    }
    free(name);
    return CLI_EXIT_OK;
}

int admin_retention(const cli_args *a)
{
    if (a->to_default && (a->days_set || a->bytes_set)) {
        fprintf(stderr, "attnstat: retention takes --days and/or --bytes, or --default, or neither "
                "(to show the run's limits)\n");
        return CLI_EXIT_USAGE;
    }
    if (!a->to_default && !a->days_set && !a->bytes_set)
        return admin_retention_show(a);
    int64_t run_id;
    int rc = admin_run_id(a, &run_id);
    if (rc != CLI_EXIT_OK)
        return rc;
    Attnstat__Command m;
    Attnstat__Envelope env;
    envelope_command(&env, &m, ATTNSTAT__COMMAND__ACTION__RETENTION);
    m.has_run_id = 1;
    m.run_id = run_id;
    /* A limit not given is not sent: attnstatd leaves it as it is. */
    m.has_retain_ms = a->to_default || a->days_set;
    m.retain_ms = a->to_default ? -1 : (int64_t)(a->days * 86400000.0);
    m.has_retain_bytes = a->to_default || a->bytes_set;
    m.retain_bytes = a->to_default ? -1 : a->bytes;
    int fd = admin_socket(a);
    if (fd < 0)
        return CLI_EXIT_FAIL;
    return admin_command(a, fd, &env);
}

/* ---- status ---------------------------------------------------------------------------------- */

int admin_store_status_get(const cli_args *a, admin_store_status *out)
{
    memset(out, 0, sizeof *out);
    int fd = admin_connect(a->socket);
    if (fd < 0)
        return -1;
    Attnstat__Status m;
    Attnstat__Envelope env;
    char err[256];
    Attnstat__Envelope *got = admin_ask(fd, envelope_status(&env, &m),
                                        ATTNSTAT__ENVELOPE__MSG_STATUS_REPLY, a->timeout_ms, err,
                                        sizeof err);
    close(fd);
    if (!got)
        return -1;
    int rc = -1;
    if (got->msg_case == ATTNSTAT__ENVELOPE__MSG_STATUS_REPLY && got->status_reply->store) {
        const Attnstat__StatusReply *r = got->status_reply;
        const Attnstat__StoreStatus *s = r->store;
        out->have = 1;
        out->queued = s->queued;
        out->runs_live = r->runs_live;
        out->interventions_stored = r->interventions_stored;
        out->interventions_refused = r->interventions_refused;
        out->commits = s->commits;
        out->checkpoints = s->checkpoints;
        out->checkpoints_inline = s->checkpoints_inline;
        out->checkpoint_errors = s->checkpoint_errors;
        snprintf(out->last_checkpoint_error, sizeof out->last_checkpoint_error, "%s",
                 s->last_checkpoint_error ? s->last_checkpoint_error : "");
        out->retain_steps = s->retain_steps;
        out->compacted = s->compacted;
        out->downsampled = s->downsampled;
        out->retain_ms = s->retain_ms;
        out->retain_bytes = s->retain_bytes;
        out->used_bytes = s->used_bytes;
        out->over_limit = s->over_limit;
        out->last_step_ms = s->last_step_ms;
        out->retain_busy_frac = s->retain_busy_frac;
        snprintf(out->durability, sizeof out->durability, "%s",
                 s->durability ? s->durability : "");
        rc = 0;
    }
    attnstat__envelope__free_unpacked(got, NULL);
    return rc;
}
