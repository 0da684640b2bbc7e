/* metrics.h — the optional Prometheus endpoint (--metrics-port: text format over plain HTTP on
 * --metrics-bind, 127.0.0.1 by default) and the text it serves: the counters (counters.h), the
 * gauges (clients, active alerts, queue depths), the connected processes' runs and layouts
 * (attnstat_run_info), the build and the process (attnstat_build_info, process_*), and the text
 * buffer the per-head table (headtab.h) writes into. Stage: metrics, beside the flow; it reads
 * counters, worker statistics and the process's own (procstat.h) and calls nothing else of the
 * daemon: what to render comes from a callback the loop gives it. Loop thread only. */
#ifndef ATTNSTAT_METRICS_H
#define ATTNSTAT_METRICS_H

#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "counters.h"
#include "store.h"
#include "worker.h"

/* The text of one scrape: grows as it is written, up to limit bytes (then `full` is set and
 * nothing more is written: every line written is whole). */
typedef struct {
    char *p;
    size_t len, cap, limit;
    int full;                /* a line did not fit (limit, or no memory) */
} metrics_buf;

/* Appends one printf-formatted piece, all or nothing. */
void metrics_printf(metrics_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* A label value escaped as the text format wants it (backslash, double quote) into out (cut at a
 * whole character within len, NUL-terminated); a control or format character (a newline, U+202E)
 * or a byte that is not UTF-8 becomes the text \xHH per byte, as the CLI shows it. */
void metrics_label(const char *in, char *out, size_t len);
/* A sample value: "+Inf", "-Inf", "NaN", an integer with every digit (a step), else %.10g. */
void metrics_value(double v, char *out, size_t len);

/* What the scrape says of one connected process that said Hello: its run and its layout
 * (attnstat_run_info). */
typedef struct {
    const char *run;
    int32_t rank;
    int has_layout;
    store_layout layout;
} metrics_client;

/* The Prometheus text of the counters and gauges, and one attnstat_run_info line per client of
 * clients[0 .. nclients - 1], into out. */
void metrics_render(metrics_buf *out, const counters *cnt, uint32_t clients,
                    uint32_t alerts_active, worker_pool *pool, const metrics_client *cl,
                    size_t ncl);

/* What an exporter is expected to serve besides its own series, into out:
 *   attnstat_build_info{version, protocol, schema, cuda, libuv} 1: the daemon's version, the wire
 *     protocol it speaks, the database schema it writes, whether it was built with the GPU path
 *     ("true"/"false"), and the libuv it runs on;
 *   attnstat_gpu_devices: the GPUs its workers can compute on (0 without the GPU path, a driver
 *     or a device of compute capability 8.0+), gpus here;
 *   the process_* families of the Prometheus client libraries (procstat.h):
 *     process_cpu_seconds_total, process_resident_memory_bytes, process_virtual_memory_bytes,
 *     process_start_time_seconds, process_open_fds, process_max_fds; a value the kernel did not
 *     give is left out, never written as 0. */
void metrics_render_exporter(metrics_buf *out, int gpus);

/* Writes the text of one scrape into out; called when a scrape arrives, so that gauges are read
 * then. */
typedef void (*metrics_render_fn)(void *ctx, metrics_buf *out);

typedef struct metrics_http metrics_http;

/* Listens on bind:port (an IPv4 or IPv6 address: metrics_bind); a scrape connection is closed
 * timeout_ms after it was accepted whatever it did. Returns NULL with err set on failure. */
metrics_http *metrics_http_start(uv_loop_t *loop, const char *bind, int port, uint64_t timeout_ms,
                                 metrics_render_fn render, void *ctx, char *err, size_t errlen);
/* Closes the listener and every open scrape connection; frees itself in the close callbacks.
 * NULL is allowed (nothing to stop). */
void metrics_http_stop(metrics_http *h);

#endif /* ATTNSTAT_METRICS_H */
