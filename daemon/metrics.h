/* metrics.h — the optional Prometheus endpoint (--metrics-port: text format over plain HTTP on
 * 127.0.0.1) and the text it serves: the counters (counters.h) and the gauges (clients, active
 * alerts, queue depths). Stage: metrics, beside the flow; it reads counters and worker statistics
 * and calls nothing else of the daemon: what to render comes from a callback the loop gives it.
 * Loop thread only. */
#ifndef ATTNSTAT_METRICS_H
#define ATTNSTAT_METRICS_H

#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "counters.h"
#include "worker.h"

/* The Prometheus text of the counters and gauges into buf (at most cap bytes, NUL-terminated);
 * returns its length. */
size_t metrics_render(char *buf, size_t cap, const counters *cnt, uint32_t clients,
                      uint32_t alerts_active, worker_pool *pool);

/* Writes the text of one scrape into buf (at most cap bytes) and returns its length; called when
 * a scrape arrives, so that gauges are read then. */
typedef size_t (*metrics_render_fn)(void *ctx, char *buf, size_t cap);

typedef struct metrics_http metrics_http;

/* Listens on 127.0.0.1:port; a scrape connection is closed timeout_ms after it was accepted
 * whatever it did. Returns NULL with err set on failure. */
metrics_http *metrics_http_start(uv_loop_t *loop, int port, uint64_t timeout_ms,
                                 metrics_render_fn render, void *ctx, char *err, size_t errlen);
/* Closes the listener and every open scrape connection; frees itself in the close callbacks.
 * NULL is allowed (nothing to stop). */
void metrics_http_stop(metrics_http *h);

#endif /* ATTNSTAT_METRICS_H */
