/* alerts_limit.h — a bound on the alert transitions one run may record and deliver: without it one
 * run whose heads flap (60 000 transitions in 6 s) wrote as many alert rows and crowded every other
 * run's alerts out of --alert-exec.
 *
 * Each run has a token bucket of `burst` raises, refilled at `rate` raises a second. A raise that
 * finds a token goes on (recorded, delivered); one that finds none is suppressed, and so are the
 * clear or resolution that end it later (the alerts table never holds an end without its start,
 * nor a start without its end): an end follows its raise. A suppressed transition is counted for
 * its run and in total; each episode of suppression is summarised once it is over (none for
 * ALERTS_LIMIT_QUIET_MS), every ALERTS_LIMIT_REPORT_MS while it lasts, and when the run ends:
 * alerts_limit_summaries() hands out "run R: N transitions suppressed" once per episode. The engine
 * keeps judging a suppressed head (it is still bad: /metrics and the active counts see it).
 *
 * Memory: one entry per run with transitions (forgotten with the run), and the keys of the
 * suppressed raises still active (at most the engine's states x rules).
 * Stage: beside the alert feed (which asks it about every transition); calls libc only. Loop thread
 * only. */
#ifndef ATTNSTAT_ALERTS_LIMIT_H
#define ATTNSTAT_ALERTS_LIMIT_H

#include <stddef.h>
#include <stdint.h>

#include "alerts.h"

#define ALERTS_LIMIT_QUIET_MS 2000    /* an episode is over after this long without suppression */
#define ALERTS_LIMIT_REPORT_MS 60000  /* a long episode is summarised this often */

typedef struct alerts_limit alerts_limit;

/* rate: raises a second per run (> 0); burst: the bucket's size (>= 1). NULL on no memory. */
alerts_limit *alerts_limit_new(double rate, double burst);
void alerts_limit_free(alerts_limit *l);
/* New rate and burst (a reload): buckets keep their tokens, capped at the new burst. */
void alerts_limit_set(alerts_limit *l, double rate, double burst);

/* What becomes of a transition. */
typedef enum {
    ALERTS_LIMIT_PASS = 0,       /* it goes on */
    ALERTS_LIMIT_SUPPRESSED,     /* suppressed (counted) */
    ALERTS_LIMIT_FIRST,          /* suppressed, the first of its run's episode: say so */
} alerts_limit_verdict;

/* The verdict on transition t at now_ms. A suppressed raise's key is remembered so that its end is
 * suppressed too; on no memory for that, the raise goes on. */
alerts_limit_verdict alerts_limit_admit(alerts_limit *l, const alerts_transition *t,
                                        int64_t now_ms);

/* One summary: run_id had `suppressed` transitions suppressed from first_ms to last_ms; ended: the
 * episode is over (else it goes on and another summary follows). */
typedef struct {
    int64_t run_id;
    uint64_t suppressed;
    int64_t first_ms, last_ms;
    int ended;
} alerts_limit_summary;

/* fn for every episode due a summary at now_ms (over, or reported last ALERTS_LIMIT_REPORT_MS
 * ago); each suppressed transition is summarised once. Returns how many summaries were given. */
size_t alerts_limit_summaries(alerts_limit *l, int64_t now_ms,
                              void (*fn)(void *ctx, const alerts_limit_summary *s), void *ctx);

/* The run ended: its open episode is summarised through fn (may be NULL), its bucket and the keys
 * of its suppressed raises are forgotten (their resolutions were suppressed with them: call this
 * after the run's end went through alerts_limit_admit). */
void alerts_limit_end_run(alerts_limit *l, int64_t run_id,
                          void (*fn)(void *ctx, const alerts_limit_summary *s), void *ctx);

/* Transitions suppressed since the start: of run_id, or of every run (run_id 0). A run's own count
 * is kept while the run has an entry (until it ends). */
uint64_t alerts_limit_suppressed(const alerts_limit *l, int64_t run_id);
/* Suppressed raises still active (their end will be suppressed too). */
size_t alerts_limit_pending(const alerts_limit *l);

#endif /* ATTNSTAT_ALERTS_LIMIT_H */
