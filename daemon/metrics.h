/* metrics.h — attnstatd's counters: what StatusReply reports and what the optional Prometheus
 * endpoint (--metrics-port, text format over plain HTTP on 127.0.0.1) exposes. Everything here is
 * touched on the loop thread only. */
#ifndef ATTNSTAT_METRICS_H
#define ATTNSTAT_METRICS_H

#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#define METRICS_RATE_WINDOW 10 /* seconds of push-rate history */

typedef struct {
    uint64_t start_ms;          /* daemon start, Unix ms */
    uint64_t start_ns;          /* daemon start, monotonic */
    uint64_t pushes;            /* Push messages received */
    uint64_t pushes_done;       /* acknowledged OK (durable) */
    uint64_t dropped;           /* answered DROPPED (queue or per-client limit) */
    uint64_t rejected;          /* answered with a validation error */
    uint64_t failed;            /* compute or store failures (INTERNAL) */
    uint64_t samples_stored;    /* per-head rows committed */
    uint64_t commits, commit_failures;
    uint64_t alerts_raised, alerts_cleared;
    uint64_t messages_dropped;  /* results/alerts not sent to a subscriber over its cap */
    uint64_t conns_accepted, conns_refused;
    uint64_t frame_errors;      /* connections closed on framing errors */
    uint64_t exec_started, exec_failed;
    /* push rate: pushes per second, ring of one-second buckets */
    uint64_t rate_bucket[METRICS_RATE_WINDOW];
    uint64_t rate_second[METRICS_RATE_WINDOW];
} metrics;

void metrics_init(metrics *m);
void metrics_count_push(metrics *m);
/* Pushes per second over the last METRICS_RATE_WINDOW seconds. */
double metrics_push_rate(const metrics *m);
double metrics_uptime_s(const metrics *m);
uint64_t metrics_now_ms(void);

/* Prometheus endpoint. The text comes from a callback so that gauges (clients, queue depths) are
 * read when scraped: it writes at most cap bytes to buf and returns the length. */
typedef size_t (*metrics_render_fn)(void *ctx, char *buf, size_t cap);

typedef struct metrics_http metrics_http;

/* Listens on 127.0.0.1:port; a scrape connection is closed timeout_ms after it was accepted
 * whatever it did. Returns NULL with err set on failure. */
metrics_http *metrics_http_start(uv_loop_t *loop, int port, uint64_t timeout_ms,
                                 metrics_render_fn render, void *ctx, char *err, size_t errlen);
/* Closes the listener and every open scrape connection; frees itself in the close callbacks. */
void metrics_http_stop(metrics_http *h);

#endif /* ATTNSTAT_METRICS_H */
