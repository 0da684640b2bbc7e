/* metrics.c — the Prometheus text of attnstatd's counters and gauges, its build and its process
 * (and the text buffer every part of a scrape writes into), and a minimal HTTP responder for
 * scrapes: every request on --metrics-bind:--metrics-port gets the current text and the
 * connection is closed (HTTP/1.0 style). Requests are read up to the end of the headers (at most
 * 4 KiB). A scrape connection lives at most timeout_ms (metrics_timeout_ms: idle or slow peers are
 * closed), and at most HTTP_MAX_SCRAPES are open at once (more are closed as soon as they are
 * accepted).
 * Stage: metrics (see metrics.h). */
#include "metrics.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "frame.h"
#include "log.h"
#include "names.h"
#include "procstat.h"
#include "utf8.h"
#include "util.h"

/* ---- the text ------------------------------------------------------------------------------- */

void metrics_printf(metrics_buf *b, const char *fmt, ...)
{
    if (b->full)
        return;
    for (;;) {
        size_t room = b->cap - b->len;
        va_list ap;
        va_start(ap, fmt);
        int w = vsnprintf(b->p ? b->p + b->len : NULL, b->p ? room : 0, fmt, ap);
        va_end(ap);
        if (w < 0) { /* an encoding error: nothing of it */
            if (b->p)
                b->p[b->len] = '\0';
            return;
        }
        if (b->p && (size_t)w < room) {
            b->len += (size_t)w;
            return;
        }
        size_t need = b->len + (size_t)w + 1;
        size_t ncap = b->cap ? b->cap : 64 * 1024;
        while (ncap < need)
            ncap *= 2;
        if (need > b->limit || ncap > b->limit + 1)
            ncap = b->limit + 1;
        char *np = need <= ncap ? realloc(b->p, ncap) : NULL;
        if (!np) {
            if (b->p)
                b->p[b->len] = '\0';
            b->full = 1;
            return;
        }
        b->p = np;
        b->cap = ncap;
    }
}

void metrics_label(const char *in, char *out, size_t len)
{
    size_t o = 0, n = strlen(in);
    const unsigned char *p = (const unsigned char *)in;
    for (size_t i = 0; i < n;) {
        uint32_t cp = 0;
        int l = utf8_next(p + i, n - i, &cp);
        if (l > 0 && !utf8_is_hidden(cp)) { /* as it is, " and \ escaped; whole characters */
            int esc = cp == '\\' || cp == '"';
            if (o + (size_t)l + (size_t)esc >= len)
                break;
            if (esc)
                out[o++] = '\\';
            memcpy(out + o, p + i, (size_t)l);
            o += (size_t)l;
            i += (size_t)l;
            continue;
        }
        /* a control or format character (U+202E...), or a byte that is not UTF-8: each byte as
         * the text \xHH (the backslash escaped), as the CLI and the log show it */
        for (int k = 0; k < (l ? l : 1); k++) {
            if (o + 6 >= len)
                goto done;
            snprintf(out + o, len - o, "\\\\x%02x", p[i + (size_t)k]);
            o += 5;
        }
        i += (size_t)(l ? l : 1);
    }
done:
    out[o] = '\0';
}

void metrics_value(double v, char *out, size_t len)
{
    if (isnan(v))
        snprintf(out, len, "NaN");
    else if (isinf(v))
        snprintf(out, len, v > 0 ? "+Inf" : "-Inf");
    else if (v == floor(v) && fabs(v) < 1e15) /* steps, counts: every digit */
        snprintf(out, len, "%.0f", v);
    else
        snprintf(out, len, "%.10g", v);
}

/* The layout attnstat_run_info labels a client with: its own, or one process alone. */
static store_layout label_layout(const metrics_client *c)
{
    return c->has_layout ? c->layout : (store_layout){0, 1, 0, 1, 0, 1, 0, 1, 0, -1};
}

/* Whether two clients get the same attnstat_run_info labels (head_offset is not one). */
static int same_labels(const metrics_client *x, const metrics_client *y)
{
    const store_layout a = label_layout(x), b = label_layout(y);
    return x->rank == y->rank && strcmp(x->run, y->run) == 0 && a.tp_rank == b.tp_rank &&
           a.tp_size == b.tp_size && a.pp_rank == b.pp_rank && a.pp_size == b.pp_size &&
           a.dp_rank == b.dp_rank && a.dp_size == b.dp_size && a.cp_rank == b.cp_rank &&
           a.cp_size == b.cp_size && a.layer_offset == b.layer_offset;
}

void metrics_render(metrics_buf *out, const counters *cnt, uint32_t clients,
                    uint32_t alerts_active, worker_pool *pool, const metrics_client *cl,
                    size_t ncl)
{
    for (int id = 0; id < CNT_N; id++) {
        const char *name = counters_name((counter_id)id);
        if (!name)
            continue;
        metrics_printf(out, "# HELP attnstat_%s %s\n# TYPE attnstat_%s counter\nattnstat_%s %llu\n",
                       name, counters_help((counter_id)id), name, name,
                       (unsigned long long)counters_get(cnt, (counter_id)id));
    }
    metrics_printf(out, "# HELP attnstat_clients Connected clients.\n# TYPE attnstat_clients gauge\n"
                   "attnstat_clients %u\n", clients);
    metrics_printf(out, "# HELP attnstat_alerts_active Alerts raised and not cleared.\n"
                   "# TYPE attnstat_alerts_active gauge\nattnstat_alerts_active %u\n", alerts_active);
    metrics_printf(out, "# HELP attnstat_push_answers_total Pushes answered with another code "
                   "than OK, by code.\n# TYPE attnstat_push_answers_total counter\n");
    for (int code = 1; code < COUNTERS_CODES; code++)
        if (counters_answered(cnt, code))
            metrics_printf(out, "attnstat_push_answers_total{code=\"%s\"} %llu\n", names_code(code),
                           (unsigned long long)counters_answered(cnt, code));
    metrics_printf(out, "# HELP attnstat_queue_depth Pushes queued or computing.\n"
                   "# TYPE attnstat_queue_depth gauge\n");
    for (int i = 0; i < worker_pool_count(pool); i++) {
        worker_stats st;
        worker_pool_stats(pool, i, &st);
        metrics_printf(out, "attnstat_queue_depth{worker=\"%s\"} %u\n", st.name, st.queue_depth);
    }
    metrics_printf(out, "# HELP attnstat_run_info Processes of a live run connected to this daemon, "
                   "by run (the job's name), rank and parallel layout (ranks and sizes): 1, or "
                   "more where several processes said the same (ranks left at 0).\n"
                   "# TYPE attnstat_run_info gauge\n");
    /* one series per label set, its value the processes that have it: two identical series
     * would be one sample to Prometheus, and the run's process count short */
    for (size_t i = 0; i < ncl; i++) {
        unsigned same = 1, earlier = 0;
        for (size_t j = 0; j < ncl && !earlier; j++)
            if (j != i && same_labels(&cl[j], &cl[i])) {
                earlier = j < i; /* said with the first of them */
                same++;
            }
        if (earlier)
            continue;
        const store_layout l = label_layout(&cl[i]);
        char run[3 * 256];
        metrics_label(cl[i].run, run, sizeof run);
        metrics_printf(out, "attnstat_run_info{run=\"%s\",rank=\"%d\",tp_rank=\"%d\",tp_size=\"%d\","
                       "pp_rank=\"%d\",pp_size=\"%d\",dp_rank=\"%d\",dp_size=\"%d\",cp_rank=\"%d\","
                       "cp_size=\"%d\",layer_offset=\"%d\"} %u\n", run, (int)cl[i].rank,
                       (int)l.tp_rank, (int)l.tp_size, (int)l.pp_rank, (int)l.pp_size,
                       (int)l.dp_rank, (int)l.dp_size, (int)l.cp_rank, (int)l.cp_size,
                       (int)l.layer_offset, same);
    }
}

void metrics_render_exporter(metrics_buf *out, int gpus)
{
#ifdef ATTNSTAT_HAVE_CUDA
    const char *cuda = "true";
#else
    const char *cuda = "false";
#endif
    char libuv[64];
    metrics_label(uv_version_string(), libuv, sizeof libuv);
    metrics_printf(out, "# HELP attnstat_build_info The attnstatd that serves this page: its "
                   "version, the wire protocol it speaks, the database schema it writes, whether "
                   "it was built with the GPU path, its libuv.\n# TYPE attnstat_build_info gauge\n"
                   "attnstat_build_info{version=\"%s\",protocol=\"%u\",schema=\"%d\","
                   "cuda=\"%s\",libuv=\"%s\"} 1\n", ATTNSTAT_DAEMON_VERSION,
                   (unsigned)FRAME_PROTOCOL_VERSION, store_schema_version(), cuda, libuv);
    metrics_printf(out, "# HELP attnstat_gpu_devices GPUs the daemon's workers can compute on (0 "
                   "without the GPU path, a driver or a device of compute capability 8.0 or "
                   "newer).\n# TYPE attnstat_gpu_devices gauge\nattnstat_gpu_devices %d\n", gpus);

    /* The process_* families as the Prometheus client libraries name and describe them. */
    procstat ps;
    procstat_read(&ps);
    char v[64];
    if (ps.has_stat) {
        metrics_value(ps.cpu_seconds, v, sizeof v);
        metrics_printf(out, "# HELP process_cpu_seconds_total Total user and system CPU time spent "
                       "in seconds.\n# TYPE process_cpu_seconds_total counter\n"
                       "process_cpu_seconds_total %s\n", v);
        metrics_value(ps.resident_bytes, v, sizeof v);
        metrics_printf(out, "# HELP process_resident_memory_bytes Resident memory size in bytes.\n"
                       "# TYPE process_resident_memory_bytes gauge\n"
                       "process_resident_memory_bytes %s\n", v);
        metrics_value(ps.virtual_bytes, v, sizeof v);
        metrics_printf(out, "# HELP process_virtual_memory_bytes Virtual memory size in bytes.\n"
                       "# TYPE process_virtual_memory_bytes gauge\n"
                       "process_virtual_memory_bytes %s\n", v);
    }
    if (ps.has_start) { /* to the clock tick (metrics_value would keep 10 digits: whole seconds) */
        snprintf(v, sizeof v, "%.2f", ps.start_time);
        metrics_printf(out, "# HELP process_start_time_seconds Start time of the process since "
                       "unix epoch in seconds.\n# TYPE process_start_time_seconds gauge\n"
                       "process_start_time_seconds %s\n", v);
    }
    if (ps.has_fds) {
        metrics_value(ps.open_fds, v, sizeof v);
        metrics_printf(out, "# HELP process_open_fds Number of open file descriptors.\n"
                       "# TYPE process_open_fds gauge\nprocess_open_fds %s\n", v);
    }
    if (ps.has_max_fds) {
        metrics_value(ps.max_fds, v, sizeof v);
        metrics_printf(out, "# HELP process_max_fds Maximum number of open file descriptors.\n"
                       "# TYPE process_max_fds gauge\nprocess_max_fds %s\n", v);
    }
}

/* ---- HTTP ----------------------------------------------------------------------------------- */

#define HTTP_REQ_MAX 4096
#define HTTP_BODY_MAX (64u << 20) /* a scrape's text at most (every head of large models fits) */
#define HTTP_HEAD_MAX 256
#define HTTP_MAX_SCRAPES 16

typedef struct scrape scrape;

struct metrics_http {
    uv_tcp_t listener;
    metrics_render_fn render;
    void *ctx;
    uint64_t timeout_ms;     /* a scrape connection's whole life */
    scrape *conns;
    int nscrapes;            /* scrape connections open (counted until their close begins) */
    uint64_t refused;        /* accepted over HTTP_MAX_SCRAPES and closed at once */
    uint64_t dropped;        /* accepted without a scrape (out of memory) and closed at once */
    uv_tcp_t spare;          /* takes such a connection and closes it (http_drop) */
    int spare_busy;          /* spare is closing ... */
    int spare_wanted;        /* ... and another connection waits for it */
    int stopping;
    int open_handles;
};

struct scrape {
    uv_tcp_t tcp;
    uv_timer_t timer;        /* bounds the connection's life */
    int handles;             /* of tcp and timer, not yet closed */
    metrics_http *h;
    scrape *prev, *next;
    char req[HTTP_REQ_MAX];
    size_t len;
    int closing, answered;
    uv_write_t wr;
    char *out;
};

static void http_maybe_free(metrics_http *h)
{
    if (h->stopping && h->open_handles == 0)
        free(h);
}

static void scrape_closed(uv_handle_t *hd)
{
    scrape *s = hd->data;
    metrics_http *h = s->h;
    h->open_handles--;
    if (--s->handles > 0)
        return;
    if (s->prev)
        s->prev->next = s->next;
    else
        h->conns = s->next;
    if (s->next)
        s->next->prev = s->prev;
    free(s->out);
    free(s);
    http_maybe_free(h);
}

static void scrape_close(scrape *s)
{
    if (s->closing)
        return;
    s->closing = 1;
    s->h->nscrapes--; /* its peer sees the close now: it no longer counts against the cap */
    uv_close((uv_handle_t *)&s->tcp, scrape_closed);
    uv_close((uv_handle_t *)&s->timer, scrape_closed);
}

static void scrape_timeout(uv_timer_t *t)
{
    scrape *s = t->data;
    LOG_DEBUG("metrics", "a scrape connection was closed after %llu ms without a complete exchange",
              (unsigned long long)s->h->timeout_ms);
    scrape_close(s);
}

static void scrape_alloc(uv_handle_t *hd, size_t suggested, uv_buf_t *buf)
{
    (void)suggested;
    scrape *s = hd->data;
    buf->base = s->req + s->len;
    buf->len = sizeof s->req - s->len;
}

static void scrape_written(uv_write_t *req, int status)
{
    (void)status;
    scrape_close(req->data);
}

static void scrape_read(uv_stream_t *st, ssize_t nread, const uv_buf_t *buf)
{
    (void)buf;
    scrape *s = st->data;
    if (nread < 0) {
        scrape_close(s);
        return;
    }
    s->len += (size_t)nread;
    int complete = s->len >= sizeof s->req || (s->len >= 4 && memmem(s->req, s->len, "\r\n\r\n", 4)) ||
                   (s->len >= 2 && memmem(s->req, s->len, "\n\n", 2));
    if (!complete || s->answered)
        return;
    s->answered = 1;
    uv_read_stop(st);
    /* The text goes after room for the header, which is written in front of it once its length
     * is known: one buffer, one write. */
    metrics_buf body = {.limit = HTTP_BODY_MAX + HTTP_HEAD_MAX};
    metrics_printf(&body, "%*s", HTTP_HEAD_MAX, "");
    if (!body.full)
        s->h->render(s->h->ctx, &body);
    if (body.full && body.len <= HTTP_HEAD_MAX) {
        free(body.p);
        LOG_WARN("metrics", "out of memory rendering a scrape");
        scrape_close(s);
        return;
    }
    if (body.full)
        LOG_WARN("metrics", "a scrape's text reached %u bytes or memory ran out: the rest is left "
                 "out (lower metrics_heads or metrics_top)", HTTP_BODY_MAX);
    size_t blen = body.len - HTTP_HEAD_MAX;
    char head[HTTP_HEAD_MAX];
    int hlen = snprintf(head, sizeof head,
                        "HTTP/1.0 200 OK\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\n"
                        "Content-Length: %zu\r\nConnection: close\r\n\r\n",
                        blen);
    s->out = body.p;
    memcpy(s->out + HTTP_HEAD_MAX - hlen, head, (size_t)hlen);
    uv_buf_t b = uv_buf_init(s->out + HTTP_HEAD_MAX - hlen, (unsigned)((size_t)hlen + blen));
    s->wr.data = s;
    int rc = uv_write(&s->wr, st, &b, 1, scrape_written);
    if (rc != 0) {
        LOG_WARN("metrics", "writing a scrape reply: %s", uv_strerror(rc));
        scrape_close(s);
    }
}

static void http_drop(metrics_http *h);

static void spare_closed(uv_handle_t *hd)
{
    metrics_http *h = hd->data;
    h->open_handles--;
    h->spare_busy = 0;
    if (h->spare_wanted && !h->stopping) {
        h->spare_wanted = 0;
        http_drop(h);
    }
    http_maybe_free(h);
}

/* A connection no scrape could be made for (out of memory, a handle that would not start) is
 * accepted into the spare handle and closed: libuv stops polling a listener whose connection
 * callback did not accept, so leaving it there would stop the metrics port for good. The spare
 * handle needs no memory; while it is closing, the next such connection waits for it. */
static void http_drop(metrics_http *h)
{
    if (h->spare_busy) {
        h->spare_wanted = 1;
        return;
    }
    int rc = uv_tcp_init(h->listener.loop, &h->spare);
    if (rc != 0) {
        LOG_WARN("metrics", "uv_tcp_init for a connection to close: %s", uv_strerror(rc));
        return;
    }
    h->spare.data = h;
    h->spare_busy = 1;
    h->open_handles++;
    h->dropped++;
    rc = uv_accept((uv_stream_t *)&h->listener, (uv_stream_t *)&h->spare);
    if (rc != 0)
        LOG_WARN("metrics", "accepting a connection to close: %s", uv_strerror(rc));
    uv_close((uv_handle_t *)&h->spare, spare_closed);
}

static void http_accept(uv_stream_t *server, int status)
{
    metrics_http *h = server->data;
    if (status < 0) {
        LOG_WARN("metrics", "accept on the metrics port failed: %s", uv_strerror(status));
        return;
    }
    scrape *s = calloc(1, sizeof *s);
    if (!s) {
        if (h->dropped == 0 || h->dropped % 1000 == 999)
            LOG_WARN("metrics", "out of memory accepting a scrape: connection closed (%llu so "
                     "far)", (unsigned long long)h->dropped + 1);
        http_drop(h);
        return;
    }
    s->h = h;
    int rc = uv_tcp_init(server->loop, &s->tcp);
    if (rc != 0) {
        LOG_WARN("metrics", "uv_tcp_init: %s", uv_strerror(rc));
        free(s);
        http_drop(h);
        return;
    }
    rc = uv_timer_init(server->loop, &s->timer);
    if (rc != 0) {
        /* The tcp handle is initialised: it must be closed; the timer was not. */
        LOG_WARN("metrics", "uv_timer_init: %s", uv_strerror(rc));
        s->tcp.data = s;
        s->handles = 1;
        h->open_handles++;
        s->closing = 1;
        s->next = h->conns;
        if (h->conns)
            h->conns->prev = s;
        h->conns = s;
        uv_close((uv_handle_t *)&s->tcp, scrape_closed);
        http_drop(h);
        return;
    }
    s->tcp.data = s;
    s->timer.data = s;
    s->handles = 2;
    h->open_handles += 2;
    h->nscrapes++;
    s->next = h->conns;
    if (h->conns)
        h->conns->prev = s;
    h->conns = s;
    rc = uv_accept(server, (uv_stream_t *)&s->tcp);
    if (rc != 0) {
        LOG_WARN("metrics", "accepting a scrape: %s", uv_strerror(rc));
        scrape_close(s);
        return;
    }
    if (h->nscrapes > HTTP_MAX_SCRAPES) {
        h->refused++;
        if (h->refused == 1 || h->refused % 1000 == 0)
            LOG_WARN("metrics", "%d scrape connections are open: closing new ones (%llu so far)",
                     HTTP_MAX_SCRAPES, (unsigned long long)h->refused);
        scrape_close(s);
        return;
    }
    rc = uv_timer_start(&s->timer, scrape_timeout, h->timeout_ms, 0);
    if (rc == 0)
        rc = uv_read_start((uv_stream_t *)&s->tcp, scrape_alloc, scrape_read);
    if (rc != 0) {
        LOG_WARN("metrics", "starting a scrape: %s", uv_strerror(rc));
        scrape_close(s);
    }
}

static void http_listener_closed(uv_handle_t *hd)
{
    metrics_http *h = hd->data;
    h->open_handles--;
    http_maybe_free(h);
}

metrics_http *metrics_http_start(uv_loop_t *loop, const char *bind, int port, uint64_t timeout_ms,
                                 metrics_render_fn render, void *ctx, char *err, size_t errlen)
{
    metrics_http *h = calloc(1, sizeof *h);
    if (!h) {
        util_err(err, errlen, "out of memory");
        return NULL;
    }
    h->render = render;
    h->ctx = ctx;
    h->timeout_ms = timeout_ms;
    int rc = uv_tcp_init(loop, &h->listener);
    if (rc != 0) {
        snprintf(err, errlen, "uv_tcp_init: %s", uv_strerror(rc));
        free(h);
        return NULL;
    }
    h->listener.data = h;
    h->open_handles = 1;
    struct sockaddr_storage addr;
    int v6 = strchr(bind, ':') != NULL;
    rc = v6 ? uv_ip6_addr(bind, port, (struct sockaddr_in6 *)&addr)
            : uv_ip4_addr(bind, port, (struct sockaddr_in *)&addr);
    if (rc != 0) {
        snprintf(err, errlen, "metrics_bind '%s' is not an IPv4 or IPv6 address (127.0.0.1, "
                 "0.0.0.0, ::1, ...)", bind);
    } else {
        rc = uv_tcp_bind(&h->listener, (const struct sockaddr *)&addr, 0);
        if (rc == 0)
            rc = uv_listen((uv_stream_t *)&h->listener, 16, http_accept);
        if (rc != 0)
            snprintf(err, errlen, "metrics port %s%s%s:%d: %s (choose another --metrics-port or "
                     "--metrics-bind, or --metrics-port 0)", v6 ? "[" : "", bind, v6 ? "]" : "",
                     port, uv_strerror(rc));
    }
    if (rc != 0) {
        h->stopping = 1;
        uv_close((uv_handle_t *)&h->listener, http_listener_closed);
        return NULL;
    }
    return h;
}

void metrics_http_stop(metrics_http *h)
{
    if (!h || h->stopping)
        return;
    h->stopping = 1;
    for (scrape *s = h->conns; s; s = s->next)
        scrape_close(s);
    uv_close((uv_handle_t *)&h->listener, http_listener_closed);
}
