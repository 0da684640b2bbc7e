/* counters.h — attnstatd's counters: what StatusReply reports and the metrics endpoint exposes.
 * Stage: none (a leaf every stage may count into); includes util.h only.
 *
 * One table (COUNTERS below) names each counter once: its id, its Prometheus name and help (NULL:
 * not exported). The counters are changed through counters_add()/counters_inc() only, never as
 * fields, and read through counters_get(). Loop thread only. */
#ifndef ATTNSTAT_COUNTERS_H
#define ATTNSTAT_COUNTERS_H

#include <stdint.h>

#define COUNTERS_RATE_WINDOW 10 /* seconds of push-rate history */

/* X(ID, prometheus name without the attnstat_ prefix, help). In the order metrics_render()
 * writes them. */
#define COUNTERS(X)                                                                                \
    X(PUSHES, "pushes_total", "Push messages received.")                                          \
    X(PUSHES_DONE, "pushes_done_total", "Pushes stored and acknowledged.")                        \
    X(DROPPED, "pushes_dropped_total", "Pushes dropped (queue full).")                            \
    X(REJECTED, "pushes_rejected_total", "Pushes rejected by validation.")                        \
    X(FAILED, "pushes_failed_total", "Pushes failed in compute or store.")                        \
    X(SAMPLES_STORED, "samples_stored_total", "Per-head rows committed.")                         \
    X(COMMITS, "commits_total", "Store transactions committed.")                                  \
    X(COMMIT_FAILURES, "commit_failures_total", "Store transactions rolled back.")                \
    X(STORE_ERRORS, "store_errors_total",                                                          \
      "Store operations that failed: batches and alert records rolled back, runs not recorded.")  \
    X(ALERTS_RAISED, "alerts_raised_total", "Alert raises.")                                      \
    X(ALERTS_CLEARED, "alerts_cleared_total", "Alert clears.")                                    \
    X(ALERTS_RESOLVED, "alerts_resolved_total",                                                    \
      "Alerts resolved: their run ended, or an operator resolved them.")                           \
    X(INTERVENTIONS_STORED, "interventions_stored_total",                                          \
      "Interventions (what a job did to its model: qk_clip's scaled heads) stored.")               \
    X(INTERVENTIONS_REFUSED, "interventions_refused_total",                                        \
      "Interventions refused: before Hello, a field out of range, or the store failed.")           \
    X(RUNS_ENDED, "runs_ended_total", "Runs that ended (Goodbye, disconnected, idle, deleted).")   \
    X(MESSAGES_DROPPED, "messages_dropped_total", "Results/alerts not sent to slow subscribers.") \
    X(CONNS_ACCEPTED, "connections_total", "Connections accepted.")                               \
    X(CONNS_REFUSED, "connections_refused_total", "Connections refused.")                         \
    X(FRAME_ERRORS, "frame_errors_total", "Connections closed on framing errors.")                \
    X(CONNS_TIMED_OUT, "connections_timed_out_total",                                              \
      "Connections closed for neither saying Hello nor subscribing in time.")                      \
    X(CONNS_IDLE, "connections_idle_closed_total",                                                 \
      "Connections closed for sending nothing for idle_timeout_ms after their Hello.")             \
    X(CONNS_STALLED, "connections_stalled_total",                                                  \
      "Connections closed for reading none of their replies for write_timeout_ms.")                \
    X(HELLOS_OVER_QUOTA, "hellos_over_quota_total",                                                \
      "Hellos refused: their uid's runs or config bytes would pass max_runs_per_uid or "           \
      "max_config_bytes_per_uid.")                                                                 \
    X(ALERTS_SUPPRESSED, "alert_transitions_suppressed_total",                                    \
      "Alert transitions neither recorded nor delivered: their run raised more than alert_burst "  \
      "at alert_rate a second (each run's count: attnstat_run_alert_transitions_suppressed).")     \
    X(EXEC_STARTED, "alert_exec_started_total", "alert_exec commands started.")                   \
    X(EXEC_FAILED, "alert_exec_failed_total",                                                      \
      "alert_exec commands that could not start or exited with an error.")                         \
    X(EXEC_DROPPED, "alert_exec_dropped_total",                                                    \
      "Alert transitions not given to alert_exec: its queue (alert_exec_queue) was full and "     \
      "their uid's (or run's) share the largest, or the daemon stopped.")

typedef enum {
#define COUNTERS_ID(id, name, help) CNT_##id,
    COUNTERS(COUNTERS_ID)
#undef COUNTERS_ID
        CNT_N
} counter_id;

typedef struct counters counters;

/* Zeroed counters, the daemon's start time taken now. NULL on no memory. */
counters *counters_new(void);
void counters_free(counters *c);

void counters_add(counters *c, counter_id id, uint64_t n);
void counters_inc(counters *c, counter_id id);
uint64_t counters_get(const counters *c, counter_id id);
/* The Prometheus name and help of id (NULL for the counters not exported). */
const char *counters_name(counter_id id);
const char *counters_help(counter_id id);

/* Pushes answered with another code than OK, by code: how many, and the last message of each
 * (what `attnstat status` and the metrics list as rejections by reason). code < COUNTERS_CODES. */
#define COUNTERS_CODES 16
#define COUNTERS_MESSAGE_MAX 200
void counters_answer(counters *c, int code, const char *msg);
uint64_t counters_answered(const counters *c, int code);
const char *counters_answer_message(const counters *c, int code); /* "" when none */

/* A store operation failed (msg: why): STORE_ERRORS, and msg kept as the last one. */
void counters_store_error(counters *c, const char *msg);
const char *counters_last_store_error(const counters *c); /* "" when none */

/* A Push received: PUSHES, and the push-rate ring. */
void counters_count_push(counters *c);
/* Pushes per second over the last COUNTERS_RATE_WINDOW seconds. */
double counters_push_rate(const counters *c);
double counters_uptime_s(const counters *c);

#endif /* ATTNSTAT_COUNTERS_H */
