/* alerts_deliver.h — where an alert transition goes once its batch is answered: the log (one warn
 * line), the counters, every client subscribed to alerts (Alert), and --alert-exec (a shell
 * command with the alert in ATTNSTAT_* environment variables; 16 run at once, the others wait in
 * a queue of alert_exec_queue transitions shared fairly between uids and between runs, what does
 * not fit dropped, counted and logged). A silenced transition (an operator's silence holds its
 * key) goes to the log (info) and the counters only. Stage: alert delivery, the last of the flow
 * (the alert feed's sink); calls alerts (names), clients, proto/ (envelope), counters and log.
 * Loop thread only. */
#ifndef ATTNSTAT_ALERTS_DELIVER_H
#define ATTNSTAT_ALERTS_DELIVER_H

#include <uv.h>

#include "alerts_feed.h"
#include "clients.h"
#include "config.h"
#include "counters.h"

typedef struct alerts_deliver alerts_deliver;

/* NULL on no memory. */
alerts_deliver *alerts_deliver_new(uv_loop_t *loop, const cfg *c, counters *cnt, clients *reg);
/* Delivers one transition (alerts_feed_sink; data is the alerts_deliver). */
void alerts_deliver_one(void *data, const feed_alert *a);
/* The daemon stops: no command is started from now on; the transitions still queued are dropped
 * (counted, said in one line). */
void alerts_deliver_stop(alerts_deliver *d);
/* Transitions waiting for a command to be started. */
uint32_t alerts_deliver_queued(const alerts_deliver *d);
/* Frees d once the loop has run dry (every --alert-exec child reaped). */
void alerts_deliver_free(alerts_deliver *d);

#endif /* ATTNSTAT_ALERTS_DELIVER_H */
