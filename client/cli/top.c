/* top.c — `attnstat top --run R` (see top.h): where the view's values come from, and when a frame
 * is drawn.
 *
 * Sources
 * - Live (attnstatd answers on --socket and --db is not given): the view subscribes to the
 *   daemon's results and alerts (attnstat_subscribe) and keeps those of the run: --run names it,
 *   or its id; a job's processes share the name, and the daemon's results carry global layer and
 *   head numbers, so a name shows the whole job. The first frame comes from the database the
 *   daemon names in its status, when this user can read it (the run's latest step, the step before
 *   it for the changes, its latest alerts); a daemon that goes away is waited for (libattnstat
 *   reconnects and subscribes again), said on the frame.
 * - The database (--db given, or no daemon): the run's latest grid is read again every frame
 *   (store_grid; one read-only handle, each read a fresh snapshot), its latest alerts too.
 * Frames: every --interval seconds (2), the first at once; -n N (or --once) stops after N. On a
 * terminal (stdout a tty, -n not given) the frame is drawn in place on the alternate screen, q or
 * Ctrl-C ends the view and the terminal is given back as it was; otherwise frames follow each
 * other as plain text, a blank line between two.
 *
 * Stage: a command file of the CLI, called by main.c. Calls libattnstat, history.c, the store's
 * read half, top_view.c and out.c. */
#include "top.h"

#include <errno.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <termios.h>
#include <time.h>
#include <unistd.h>

#include "attnstat.h"
#include "history.h"
#include "out.h"
#include "store_read.h"
#include "top_view.h"

#define TOP_DEFAULT_INTERVAL 2.0
#define TOP_MIN_INTERVAL 0.1
#define TOP_PLAIN_WIDTH 100   /* plain frames: $COLUMNS, else this */

typedef struct {
    const cli_args *a;
    top_view v;
    char *run;                /* escaped */
    attnstat_client *c;       /* live; NULL: the database */
    store *st;                /* the database: the source, or the live view's first frame */
    int64_t run_id;           /* in st; 0: none */
    int failed;               /* out of memory along the way */
} top_ctx;

static volatile sig_atomic_t top_stop;

static void top_on_signal(int sig)
{
    (void)sig;
    top_stop = 1;
}

static int64_t top_now_ms(int clock)
{
    struct timespec ts;
    clock_gettime(clock, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* ---- the database -----------------------------------------------------------------------------*/
typedef struct {
    top_grid *g;
    int failed;
} top_fill;

static int top_grid_cb(void *ctx, const store_sample *s)
{
    top_fill *f = ctx;
    f->failed |= top_grid_set(f->g, s->layer, s->head, s->stats.entropy_norm_mean,
                              s->stats.max_logit) != 0;
    return f->failed;
}

/* The run's grid at step (STORE_STEP_LATEST: its latest) into g. 0; 1 when the run has no sample
 * there; -1 on an error (said in the view's note). */
static int top_read_grid(top_ctx *x, int64_t step, top_grid *g)
{
    store_error err;
    int64_t used = 0;
    g->n = 0;
    top_fill fill = {g, 0};
    store_status s = store_grid(x->st, x->run_id, step, &used, top_grid_cb, &fill, &err);
    x->failed |= fill.failed;
    if (s == STORE_NOTFOUND)
        return 1;
    if (s != STORE_OK) {
        snprintf(x->v.note, sizeof x->v.note, "cannot read the database: %s", out_safe(err.msg));
        return -1;
    }
    g->step = used;
    return 0;
}

static int top_alert_cb(void *ctx, const store_alert *al)
{
    top_view *v = ctx;
    top_alert t = {.time_ms = al->time_ms, .step = al->step, .layer = al->layer,
                   .head = al->head, .value = al->value, .threshold = al->threshold};
    snprintf(t.rule, sizeof t.rule, "%s", out_safe(al->rule));
    snprintf(t.state, sizeof t.state, "%s", attnstat_state_name(al->state));
    if (al->state == STORE_ALERT_RESOLVED)
        t.value = t.threshold = NAN;
    top_view_alert(v, &t);
    return 0;
}

/* The run's latest grid, and its alerts, read again. */
static void top_read_db(top_ctx *x)
{
    top_grid g;
    top_grid_init(&g);
    int r = top_read_grid(x, STORE_STEP_LATEST, &g);
    if (r == 0 && top_grid_copy(&x->v.now, &g) != 0)
        x->failed = 1;
    top_grid_free(&g);
    if (r < 0)
        return;
    store_error err;
    x->v.nalerts = 0;
    if (store_alerts(x->st, x->run_id, 0, top_alert_cb, &x->v, &err) != STORE_OK)
        snprintf(x->v.note, sizeof x->v.note, "cannot read the alerts: %s", out_safe(err.msg));
    else if (r == 0)
        x->v.note[0] = '\0';
}

/* The first frame's base: the run's grid at the step before its latest. */
static void top_read_base(top_ctx *x)
{
    int64_t prev;
    store_error err;
    if (x->v.now.n == 0 || store_step_before(x->st, x->run_id, x->v.now.step, &prev, &err))
        return;
    top_grid g;
    top_grid_init(&g);
    if (top_read_grid(x, prev, &g) == 0 && top_grid_copy(&x->v.shown, &g) != 0)
        x->failed = 1;
    top_grid_free(&g);
}

/* ---- attnstatd --------------------------------------------------------------------------------*/
/* A result or alert of the view's run: its name (every process of the job) or its id; with
 * --rank, the run of that rank the database names only. */
static int top_is_run(const top_ctx *x, const char *run, int64_t run_id)
{
    if (x->a->rank >= 0 && x->run_id > 0)
        return run_id == x->run_id;
    char id[32];
    snprintf(id, sizeof id, "%lld", (long long)run_id);
    return !strcmp(run, x->a->run) || !strcmp(id, x->a->run) ||
           (x->run_id > 0 && run_id == x->run_id);
}

static void top_on_result(void *user, const attnstat_result_source *src,
                          const attnstat_head_result *heads, size_t n)
{
    top_ctx *x = user;
    if (!top_is_run(x, src->run, src->run_id) || src->layer > INT32_MAX)
        return;
    for (size_t i = 0; i < n; i++)
        if (heads[i].head <= INT32_MAX &&
            top_grid_set(&x->v.now, (int32_t)src->layer, (int32_t)heads[i].head,
                         heads[i].entropy_norm_mean, heads[i].max_logit) != 0)
            x->failed = 1;
    if (x->v.now.step == INT64_MIN || src->step > x->v.now.step)
        x->v.now.step = src->step;
}

static void top_on_alert(void *user, const attnstat_alert *al)
{
    top_ctx *x = user;
    if (!top_is_run(x, al->run, al->run_id))
        return;
    top_alert t = {.time_ms = al->time_ms, .step = al->step, .layer = (int32_t)al->layer,
                   .head = (int32_t)al->head, .value = al->value, .threshold = al->threshold};
    snprintf(t.rule, sizeof t.rule, "%s", attnstat_rule_name(al->rule));
    snprintf(t.state, sizeof t.state, "%s", attnstat_state_name(al->state));
    top_view_alert(&x->v, &t);
}

/* Connects, subscribes and waits for the daemon to have the subscription (a Status answered
 * after it); *db the database the daemon names. NULL when there is no daemon to talk to. */
static attnstat_client *top_connect(top_ctx *x, char *db, size_t len, char *why, size_t wlen)
{
    attnstat_connect_opts o;
    attnstat_connect_opts_init(&o);
    o.socket_path = x->a->socket;
    o.timeout_ms = x->a->timeout_ms;
    attnstat_client *c = NULL;
    attnstat_error err;
    if (attnstat_connect_ex(&o, &c, &err) != ATTNSTAT_OK) {
        snprintf(why, wlen, "%s", out_safe(err.msg));
        return NULL;
    }
    attnstat_set_run_result_callback(c, top_on_result, x);
    attnstat_set_alert_callback(c, top_on_alert, x);
    attnstat_daemon_status *ds = malloc(sizeof *ds);
    attnstat_code rc = attnstat_subscribe(c, 1, 1);
    if (rc == ATTNSTAT_OK)
        rc = ds ? attnstat_status(c, ds, x->a->timeout_ms) : ATTNSTAT_ENOMEM;
    if (rc != ATTNSTAT_OK) {
        snprintf(why, wlen, "subscribing: %s",
                 rc == ATTNSTAT_ENOMEM ? "out of memory" : out_safe(attnstat_last_error(c)));
        free(ds);
        attnstat_close(c);
        return NULL;
    }
    snprintf(db, len, "%s", ds->db_path);
    free(ds);
    return c;
}

/* The live view's first frame from the daemon's database, quietly: a database this user cannot
 * read, or a run that is not in it yet, leaves the view to the results to come. */
static void top_seed(top_ctx *x, const char *db)
{
    store_error err;
    if (!db[0] || !(x->st = store_open_readonly(db, 5000, &err)))
        return;
    if (store_resolve_run(x->st, x->a->run, x->a->rank, &x->run_id, &err) != STORE_OK) {
        x->run_id = 0;
        return;
    }
    top_read_db(x);
    top_read_base(x);
    x->v.note[0] = '\0';
}

/* ---- the terminal -----------------------------------------------------------------------------*/
typedef struct {
    int tty;                  /* frames drawn in place */
    int keys;                 /* stdin is a terminal read key by key */
    struct termios saved;
} top_term;

static void top_term_begin(top_term *t, int tty)
{
    t->tty = tty;
    t->keys = tty && isatty(STDIN_FILENO) && tcgetattr(STDIN_FILENO, &t->saved) == 0;
    if (t->keys) {
        struct termios raw = t->saved;
        raw.c_lflag &= ~(tcflag_t)(ICANON | ECHO);
        raw.c_cc[VMIN] = 0;
        raw.c_cc[VTIME] = 0;
        if (tcsetattr(STDIN_FILENO, TCSANOW, &raw) != 0)
            t->keys = 0;
    }
    if (tty) /* the alternate screen, the cursor hidden */
        fputs("\x1b[?1049h\x1b[?25l", stdout);
}

static void top_term_end(top_term *t)
{
    if (t->tty) {
        fputs("\x1b[?25h\x1b[?1049l", stdout);
        fflush(stdout);
    }
    if (t->keys)
        tcsetattr(STDIN_FILENO, TCSANOW, &t->saved);
}

/* The frame's size: the terminal's, or for plain frames $COLUMNS (else TOP_PLAIN_WIDTH) wide and
 * as tall as it takes. */
static void top_size(const top_term *t, int *width, int *height)
{
    struct winsize ws;
    *height = 0;
    *width = TOP_PLAIN_WIDTH;
    if (t->tty && ioctl(STDOUT_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0) {
        *width = ws.ws_col;
        *height = ws.ws_row;
        return;
    }
    const char *cols = getenv("COLUMNS");
    char *end;
    long w = cols ? strtol(cols, &end, 10) : 0;
    if (cols && *cols && !*end && w >= 20 && w <= 10000)
        *width = (int)w;
}

/* Waits up to ms for the daemon's messages or a key; 1 when q was pressed. */
static int top_wait(top_ctx *x, const top_term *t, int ms)
{
    if (x->c) {
        if (attnstat_poll(x->c, ms < 100 || !t->keys ? ms : 100) != ATTNSTAT_OK) {
            snprintf(x->v.note, sizeof x->v.note, "attnstatd refused the view: %s",
                     out_safe(attnstat_last_error(x->c)));
            top_stop = 2;
            return 0;
        }
        if (!t->keys)
            return 0;
        ms = 0;
    }
    if (!t->keys) {
        struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
        nanosleep(&ts, NULL);
        return 0;
    }
    struct pollfd p = {.fd = STDIN_FILENO, .events = POLLIN};
    if (poll(&p, 1, ms) <= 0)
        return 0;
    char ch[16];
    ssize_t n = read(STDIN_FILENO, ch, sizeof ch);
    for (ssize_t i = 0; i < n; i++)
        if (ch[i] == 'q' || ch[i] == 'Q')
            return 1;
    return 0;
}

static void top_frame(top_ctx *x, const top_term *t, int color, int64_t frames)
{
    int width, height;
    top_size(t, &width, &height);
    if (x->c) {
        char why[256];
        if (attnstat_link_state(x->c, why, sizeof why) != ATTNSTAT_LINK_UP)
            snprintf(x->v.note, sizeof x->v.note, "lost attnstatd at %s (%s): waiting for it; "
                     "the values are the last seen", out_safe(x->a->socket), out_safe(why));
        else if (!strncmp(x->v.note, "lost ", 5))
            x->v.note[0] = '\0';
    } else if (frames > 0) {
        top_read_db(x);
    }
    if (top_view_advance(&x->v) != 0)
        x->failed = 1;
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f) {
        x->failed = 1;
        return;
    }
    if (t->tty)
        fputs("\x1b[H\x1b[2J", f);
    else if (frames > 0)
        fputc('\n', f);
    top_view_draw(f, &x->v, width, t->tty ? height - 1 : 0, color,
                  top_now_ms(CLOCK_REALTIME));
    fclose(f);
    fwrite(buf, 1, len, stdout);
    fflush(stdout);
    free(buf);
}

static int top_color(const cli_args *a, int tty)
{
    if (a->color >= 0)
        return a->color;
    const char *term = getenv("TERM"), *nc = getenv("NO_COLOR");
    return tty && !(nc && *nc) && term && strcmp(term, "dumb");
}

int top_run(const cli_args *a)
{
    double interval = a->interval > 0 ? a->interval : TOP_DEFAULT_INTERVAL;
    if (interval < TOP_MIN_INTERVAL || interval > 86400) {
        fprintf(stderr, "attnstat: --interval wants seconds from %.1f to 86400, not %g\n",
                TOP_MIN_INTERVAL, interval);
        return CLI_EXIT_USAGE;
    }
    top_ctx x = {.a = a};
    char db[4096] = "", why[512] = "";
    if (!a->db_given)
        x.c = top_connect(&x, db, sizeof db, why, sizeof why);
    if (x.c) {
        x.run = malloc(strlen(a->run) * 4 + 1);
        if (!x.run) {
            attnstat_close(x.c);
            fprintf(stderr, "attnstat: out of memory\n");
            return CLI_EXIT_FAIL;
        }
        out_escape(x.run, strlen(a->run) * 4 + 1, a->run);
        top_view_init(&x.v, x.run);
        snprintf(x.v.source, sizeof x.v.source, "live from attnstatd at %s",
                 out_safe(a->socket));
        top_seed(&x, db);
    } else {
        /* no daemon: the database (history_open_run says what is wrong with it) */
        if (!a->db_given)
            fprintf(stderr, "attnstat: no attnstatd at %s (%s): reading the database %s\n",
                    out_safe(a->socket), why, out_safe(a->db));
        int rc = history_open_run(a, &x.st, &x.run_id, &x.run);
        if (rc != CLI_EXIT_OK)
            return rc;
        top_view_init(&x.v, x.run);
        snprintf(x.v.source, sizeof x.v.source, "from the database %s", out_safe(a->db));
        top_read_db(&x);
        top_read_base(&x);
    }
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = top_on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    top_term t;
    int tty = isatty(STDOUT_FILENO) && a->iterations == 0;
    int color = top_color(a, tty);
    top_term_begin(&t, tty);
    int64_t frames = 0, step_ms = (int64_t)(interval * 1000 + 0.5);
    int64_t next = top_now_ms(CLOCK_MONOTONIC);
    while (!top_stop && !x.failed) {
        int64_t now = top_now_ms(CLOCK_MONOTONIC);
        if (now >= next) {
            top_frame(&x, &t, color, frames);
            frames++;
            if (a->iterations > 0 && frames >= a->iterations)
                break;
            next += step_ms;
            if (next < now) /* a frame that took longer than the interval: no catching up */
                next = now + step_ms;
            continue;
        }
        if (top_wait(&x, &t, (int)(next - now)))
            break;
    }
    top_term_end(&t);
    int rc = CLI_EXIT_OK;
    if (x.failed) {
        fprintf(stderr, "attnstat: out of memory\n");
        rc = CLI_EXIT_FAIL;
    } else if (top_stop == 2) {
        fprintf(stderr, "attnstat: %s\n", x.v.note);
        rc = CLI_EXIT_FAIL;
    }
    if (x.c)
        attnstat_close(x.c);
    if (x.st)
        store_close(x.st);
    top_view_free(&x.v);
    free(x.run);
    return rc;
}
