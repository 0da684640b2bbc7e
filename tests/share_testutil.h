/* share_testutil.h — what the suites of shared resources (issue 23: test_daemon_share.c,
 * test_daemon_slots.c) share besides the daemon harness: the daemon's log and files read, a
 * daemon run to its end, connections made as other uids (handed over by a child that took the
 * uid), Hellos and Errors, Computed messages (results with no tensors), what a subscriber holds
 * up to a StatusReply, and one counter of /metrics. Failures are Check assertions. */
#ifndef ATTNSTAT_SHARE_TESTUTIL_H
#define ATTNSTAT_SHARE_TESTUTIL_H

#include "daemon_harness.h"

/* ---- files and processes -------------------------------------------------------------------- */

/* The whole file at path ("" when unreadable); free it. */
char *sh_slurp(const char *path);
/* Waits until the file at path holds needle (or timeout_ms passes). 1 when it does. */
int sh_file_has(const char *path, const char *needle, int timeout_ms);
/* How many times needle occurs in the file at path. */
int sh_file_count(const char *path, const char *needle);
/* Waits until needle occurs more than `than` times in the file at path. 1 when it does. */
int sh_file_count_over(const char *path, const char *needle, int than, int timeout_ms);
/* Writes text to path (created or truncated). */
void sh_write_file(const char *path, const char *text);
/* Runs attnstatd with args (NULL-terminated, after the binary) to its end, as as_uid when it is
 * not (uid_t)-1 (root only), its output into log; returns its exit status (-1: killed by a
 * signal, or still running after 60 s: then killed). */
int sh_run_daemon_to_end(const char *log, const char *const *args, uid_t as_uid);

/* ---- connections of other uids -------------------------------------------------------------- */

/* gid 65534: the allowed group of the tests that act as other uids (a uid is admitted by its
 * primary group, as the daemon reads it from SO_PEERCRED). */
#define SH_ALLOWED_GID ((gid_t)65534)

/* The name of SH_ALLOWED_GID, for --allow-group; 0 when the test cannot act as other uids (not
 * root, no such group): the caller skips, saying so. */
int sh_other_uids_possible(char *name, size_t len, const char *who);
/* n connections to d made by uid (primary group SH_ALLOWED_GID): a child process takes the uid,
 * connects, hands the sockets over (SCM_RIGHTS) and exits; the daemon sees uid as their peer
 * (SO_PEERCRED is the connecting process's). */
void sh_connect_as(const dh_daemon *d, uid_t uid, int n, dh_conn *out);

/* ---- messages ------------------------------------------------------------------------------- */

/* The next Error on c (other messages skipped) with its code, message copied; -1 when none came
 * before the connection closed or timeout_ms passed. */
int sh_next_error(dh_conn *c, char *msg, size_t len, int timeout_ms);
/* Sends a Hello of run with config (NULL: none); returns the Error code it got, or 0 for a
 * HelloReply. */
int sh_hello_with(dh_conn *c, const char *run, int32_t rank, const char *config, char *msg,
                  size_t len);
/* Waits until the daemon counts `want` connections (w among them). */
void sh_wait_clients(dh_conn *w, uint32_t want);
/* A Computed message of n heads with random, self-consistent values; nonfinite: every head
 * reports non-finite rows (an alert at once). hs and ptrs are the caller's arrays of n. */
void sh_fill_computed(Attnstat__Computed *m, Attnstat__HeadStats *hs, Attnstat__HeadStats **ptrs,
                      size_t n, uint64_t seq, int64_t step, dh_rng *rng, int nonfinite);
void sh_send_computed(dh_conn *c, Attnstat__Computed *m);
/* The Ack of Computed seq (a Computed has no Release); its code. */
int sh_computed_ack(dh_conn *c, uint64_t seq);

/* What a subscriber holds: Status sent, then every message read up to its StatusReply (the
 * daemon's stream keeps order: every Result and Alert queued for it before the Status was read
 * comes first). Per run name (runs[0..nruns), nruns <= 4), Results and Alerts counted; bytes: the
 * frames read. */
typedef struct {
    int results[4], alerts[4];
    int other;               /* of runs not named */
    uint64_t bytes;
} sh_sub_seen;

/* Counts e into out. */
void sh_count_message(const Attnstat__Envelope *e, const char *const *runs, int nruns,
                      sh_sub_seen *out);
/* Adds to *out what c holds up to the StatusReply of a Status sent now. */
void sh_drain_subscriber(dh_conn *c, const char *const *runs, int nruns, sh_sub_seen *out);

/* ---- /metrics ------------------------------------------------------------------------------- */

/* A free TCP port of 127.0.0.1 (bound and released: the daemon takes it next). */
int sh_free_port(void);
/* The value of the counter `name` on the daemon's /metrics at port (asserted present). */
uint64_t sh_scrape_counter(int port, const char *name);

#endif /* ATTNSTAT_SHARE_TESTUTIL_H */
