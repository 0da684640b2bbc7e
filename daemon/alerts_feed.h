/* alerts_feed.h — the alert engine (alerts.h) between the store and delivery: it owns the engine,
 * checks and records the runs' thresholds, feeds it every stored sample, writes the transitions to
 * the store, and hands each one on to the sink it was given (delivery: log, subscribers,
 * --alert-exec). At start-up it takes back from the store the alerts raised and not cleared.
 * Stage: alerts feed, after the batch; calls alerts, the store, counters, util and log. Loop
 * thread only. */
#ifndef ATTNSTAT_ALERTS_FEED_H
#define ATTNSTAT_ALERTS_FEED_H

#include <stddef.h>
#include <stdint.h>

#include "alerts.h"
#include "attnstat.pb-c.h"
#include "batch.h"
#include "config.h"
#include "counters.h"
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
} feed_alert;

/* Where each transition goes (after the batch's answers). */
typedef void (*alerts_feed_sink)(void *data, const feed_alert *a);

typedef struct alerts_feed alerts_feed;

/* An engine with the configured thresholds and max_heads_per_run, the store's active alerts and
 * the runs' stored thresholds restored (a failure to read them is logged: the daemon runs on
 * without). db may be NULL (nothing restored or recorded). A failed commit of alert rows counts
 * in COMMIT_FAILURES. NULL with err set on a bad config or no memory. */
alerts_feed *alerts_feed_new(const cfg *c, store *db, counters *cnt, alerts_feed_sink sink,
                             void *data, char *err, size_t errlen);
void alerts_feed_free(alerts_feed *f);

/* A Hello's thresholds t (may be NULL) merged over the configured ones and checked: 0 with the
 * effective set as one line of JSON (with collapse_threshold, the computation's parameter that
 * travels with them), the run's record in the store; -1 with err naming the field. */
int alerts_feed_check(alerts_feed *f, const Attnstat__Thresholds *t, double collapse_threshold,
                      char *json, size_t jsonlen, char *err, size_t errlen);
/* The run's thresholds from now on (its Hello's overrides). 0, or -1 with err set. */
int alerts_feed_set_run(alerts_feed *f, int64_t run_id, const Attnstat__Thresholds *t, char *err,
                        size_t errlen);

/* A committed batch (batch_hooks.stored): every item stored (codes[i] OK) is observed; the
 * transitions are recorded in the store in a transaction of their own (an alert row never exists
 * without its sample; should that commit fail, the transitions are still delivered and the failure
 * is logged) and kept for alerts_feed_deliver(). */
void alerts_feed_batch(alerts_feed *f, batch_item *const *items, const Attnstat__Code *codes,
                       size_t n);
/* Hands every kept transition to the sink, in order, and forgets them. */
void alerts_feed_deliver(alerts_feed *f);

/* Alerts raised and not cleared, of every run. */
uint32_t alerts_feed_active(const alerts_feed *f);
/* The config's thresholds changed (a SIGHUP reload): they become the engine's defaults, under
 * every run's own overrides. 0, or -1 with err set (nothing changed). */
int alerts_feed_reload(alerts_feed *f, char *err, size_t errlen);

#endif /* ATTNSTAT_ALERTS_FEED_H */
