/* alerts_feed.h — the alert engine (alerts.h) between the store and delivery, and the life of an
 * alert: it owns the engine, checks and records the runs' thresholds, feeds it every stored sample
 * of a live run, has the transitions recorded by the store thread, and hands each one on to the
 * sink it was given (delivery: log, subscribers, --alert-exec), within each run's bound on
 * transitions (alert_rate, alert_burst: past it they are suppressed, counted and summarised in the
 * log; alerts_limit.h). An alert ends when its samples are
 * good again (CLEARED), or RESOLVED: its run ended (runs.h says when), or an operator resolved it;
 * an operator may also acknowledge it (who and when, for the metrics of alerts nobody has seen)
 * and silence its (run, layer, head, rule) for a while (its transitions are recorded and logged,
 * not sent to watchers or --alert-exec).
 * At start-up it takes back from the store the alerts raised and not ended of the runs that have
 * not ended, with their acknowledgements and the silences in force; alerts of runs that ended
 * meanwhile are resolved ("ended").
 * Stage: alerts feed, after the batch; calls alerts, runs (is a run live), the store (reads at
 * start-up; writes through the storer), counters, util and log. Loop thread only. */
#ifndef ATTNSTAT_ALERTS_FEED_H
#define ATTNSTAT_ALERTS_FEED_H

#include <stddef.h>
#include <stdint.h>

#include "alerts.h"
#include "attnstat.pb-c.h"
#include "batch.h"
#include "config.h"
#include "counters.h"
#include "runs.h"
#include "storer.h"
#include "store_read.h"
#include "store_write.h"

/* One transition with what its sinks need (copied: the push and its client may be gone by the time
 * it is delivered). */
typedef struct {
    alerts_transition t;
    char run[256];
    int32_t rank;
    int64_t time_ms;
    char message[320];       /* alerts_format() */
    char reason[16];         /* CLEARED: "samples"; RESOLVED: "goodbye", "disconnected", "idle",
                              * "deleted", "ended" (at start-up) or "operator" */
    int has_uid;             /* RESOLVED by an operator: who */
    uint32_t uid;
    int silenced;            /* a silence holds its key: the log only */
    int recorded;            /* in the store already (an operator's resolve): not recorded again */
    uint32_t owner;          /* its run's owner uid (0 when it has none): delivery's fair share */
} feed_alert;

/* Where each transition goes (after the batch's answers). */
typedef void (*alerts_feed_sink)(void *data, const feed_alert *a);

typedef struct alerts_feed alerts_feed;

/* An engine with the configured thresholds and max_heads_per_run; from db (on this thread, before
 * the store thread starts), the runs' stored thresholds, the active alerts of the runs reg says are
 * live, their acknowledgements and the silences in force (a failure to read is logged: the daemon
 * runs on without them). db may be NULL (nothing restored). NULL with err set on a bad config or
 * no memory. */
alerts_feed *alerts_feed_new(const cfg *c, store *db, runs *reg, counters *cnt,
                             alerts_feed_sink sink, void *data, char *err, size_t errlen);
/* Transitions are recorded through st from now on (NULL: not recorded); what the restore ended is
 * recorded and delivered now. */
void alerts_feed_start(alerts_feed *f, storer *st);
void alerts_feed_free(alerts_feed *f);

/* A Hello's thresholds t (may be NULL) merged over the configured ones and checked: 0 with the
 * effective set as one line of JSON (with collapse_threshold, the computation's parameter that
 * travels with them), the run's record in the store; -1 with err naming the field. */
int alerts_feed_check(alerts_feed *f, const Attnstat__Thresholds *t, double collapse_threshold,
                      char *json, size_t jsonlen, char *err, size_t errlen);
/* The run's thresholds from now on (its Hello's overrides). 0, or -1 with err set. */
int alerts_feed_set_run(alerts_feed *f, int64_t run_id, const Attnstat__Thresholds *t, char *err,
                        size_t errlen);

/* A committed batch (batch_hooks.stored): every item stored (codes[i] OK) of a live run is
 * observed; the transitions are kept for alerts_feed_deliver(). */
void alerts_feed_batch(alerts_feed *f, batch_item *const *items, const Attnstat__Code *codes,
                       size_t n);
/* Every kept transition goes to the store thread to be recorded (after the samples that caused
 * them, so an alert row never exists without its sample) and, once it is, to the sink, in order
 * (a watcher that sees an alert finds it in the table; a failure to record is logged and counted,
 * and the transitions are still delivered). */
void alerts_feed_deliver(alerts_feed *f);

/* Run e ends for reason: each of its active alerts is RESOLVED with that reason (recorded, kept
 * for alerts_feed_deliver()), its states and its silences "until the run ends" are forgotten.
 * (Samples of a run that is not live are not observed: those of its pushes still in flight.)
 * Returns how many alerts it resolved. */
uint32_t alerts_feed_end_run(alerts_feed *f, const run_entry *e, const char *reason);

/* An operator's mark, once the store recorded it (command.c): the alert a (its key and the step
 * that raised it) was acknowledged by uid, resolved by uid (then delivered as RESOLVED, reason
 * "operator": a head still bad raises again after raise_after samples), silenced by uid until
 * until_ms (0: until its run ends; it replaces a silence of the key), or its key's silence ended
 * (FEED_UNSILENCE: its transitions are delivered again). */
typedef enum { FEED_ACK, FEED_RESOLVE, FEED_SILENCE, FEED_UNSILENCE } feed_mark;
void alerts_feed_mark(alerts_feed *f, feed_mark what, const store_alert *a, uint32_t uid,
                      int64_t until_ms, const char *run, int32_t rank);

/* Alerts raised and not ended, of every run. */
uint32_t alerts_feed_active(const alerts_feed *f);
/* Transitions suppressed by the bound on each run's transitions (alert_rate, alert_burst:
 * alerts_limit.h): of run_id while it lives, or of every run since the start (run_id 0). */
uint64_t alerts_feed_suppressed(const alerts_feed *f, int64_t run_id);
/* Per run with an active alert: fn(ctx, run_id, active, unacknowledged) — unacknowledged counts
 * the active ones neither acknowledged nor silenced. */
void alerts_feed_counts(alerts_feed *f, void (*fn)(void *ctx, int64_t run_id, uint32_t active,
                                                    uint32_t unacked),
                        void *ctx);
/* The thresholds in force for run_id: its Hello's overrides over the configured ones (for
 * /metrics: attnstat_run_threshold). */
void alerts_feed_run_config(const alerts_feed *f, int64_t run_id, alerts_config *out);

/* An operator's mark in force on a key, for /metrics (attnstat_head_silenced,
 * attnstat_head_alert_acknowledged). */
typedef struct {
    int64_t run_id;
    int32_t layer, head;
    alerts_rule rule;
    int64_t until_ms;        /* FEED_SILENCE: when it ends (0: when its run ends) */
} feed_marked;
/* fn(ctx, FEED_SILENCE, m) for every silence in force, and fn(ctx, FEED_ACK, m) for every active
 * alert acknowledged (since the step that raised it), in no particular order. 0, or -1 when memory
 * ran out (the silences were given, the acknowledgements not). */
int alerts_feed_marks(alerts_feed *f, void (*fn)(void *ctx, feed_mark what, const feed_marked *m),
                      void *ctx);

/* The config's thresholds changed (a SIGHUP reload): they become the engine's defaults, under
 * every run's own overrides. 0, or -1 with err set (nothing changed). */
int alerts_feed_reload(alerts_feed *f, char *err, size_t errlen);

#endif /* ATTNSTAT_ALERTS_FEED_H */
