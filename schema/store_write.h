/* store_write.h — the daemon's half of the store: begin (or resume) a run, add the samples and
 * alert transitions of pushes to the open batch, commit or roll it back, and count what was
 * written. Only a handle from store_open() / store_open_ex() writes: on a read-only handle
 * store_run_begin(), store_add_samples() and store_add_alert() return STORE_EINVAL. The batch and
 * durability rules are store.h's.
 * Includes store.h and kernels/stats.h (stats_head, the statistics of one head).
 *
 * Writing at the SQLite limit (bench/RESULTS.md, "History", measures it beside a plain SQLite
 * program with the same tables):
 * - store_add_samples() is one prepared INSERT per head into the exact tier, bound by position,
 *   appended at the end of its B-tree (the tier is keyed run, step, layer, head); the run is looked
 *   up once per batch; the runs table's summary is written once per run per batch, at the commit.
 *   Nothing is allocated per push once the handle has warmed up.
 * - The cost that remains per push is the commit's: batch. A writer thread that adds every push
 *   waiting in its queue and commits when the queue drains (or every few milliseconds) gets tens
 *   of thousands of small pushes a second; a commit per push gets what one WAL append per commit
 *   allows (and one fsync per commit with STORE_SYNC_FULL).
 * - The exact tier only grows until the retention step (store_retain.h) packs it; the daemon runs
 *   that step between batches or on a thread and handle of its own.
 */
#ifndef ATTNSTAT_STORE_WRITE_H
#define ATTNSTAT_STORE_WRITE_H

#include <stdint.h>

#include "stats.h"
#include "store.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    const char *name;        /* required, non-empty */
    int32_t rank;            /* >= 0 */
    const char *host;        /* optional (NULL) */
    int64_t pid;             /* 0: unknown */
    int64_t time_ms;         /* time of the Hello; 0: now */
    const char *config;      /* optional free text (JSON) */
    const char *thresholds;  /* optional: the run's effective thresholds as text (JSON) */
    int has_owner;           /* the uid that owns the run (kept from its first Hello: a run that
                              * has an owner keeps it; one recorded without gets this one) */
    uint32_t owner_uid;
    int64_t id;              /* > 0: the id a NEW run gets (a writer that hands out ids itself, as
                              * attnstatd does); 0: the store picks one. An existing (name, rank)
                              * keeps its id whatever this says. */
} store_run_info;

/* Begin (or resume) a run and return its id in *run_id.
 * Reconnects: a run is identified by (name, rank). When that pair exists already, its id is
 * reused (the history continues: a trainer resuming from a checkpoint or reconnecting after a
 * daemon restart keeps one trend), host/pid/config/thresholds are replaced by the new values and
 * `started` keeps the first Hello's time. A sample pushed again for a step that is already stored
 * replaces the stored one (see store_add_samples()).
 * The run is durable when this returns: an open batch is committed together with it. */
store_status store_run_begin(store *st, const store_run_info *info, int64_t *run_id,
                             store_error *err);

/* The same into the open batch: the run (new, or resumed: its `ended` cleared) is durable at the
 * batch's commit, and the batch's later writes may name it. A new run whose info->id is taken by
 * another run is refused (STORE_EINVAL, nothing written). */
store_status store_add_run(store *st, const store_run_info *info, int64_t *run_id,
                           store_error *err);

/* The run ended at time_ms (0: now) for `reason` (text, e.g. "goodbye"), into the open batch: its
 * `ended` and `end_reason` are set (store_run), and its silences that last "until the run ends"
 * end then. A later store_add_run() of the same (name, rank) clears both, and so does reason NULL
 * (the run runs again: a push after an end for idleness). STORE_NOTFOUND when there is no such
 * run. */
store_status store_run_end(store *st, int64_t run_id, int64_t time_ms, const char *reason,
                           store_error *err);

/* An operator acknowledged the active alert alert_id (a raise that no later transition of its
 * (run, layer, head, rule) ended) at time_ms (0: now): into the open batch. STORE_NOTFOUND when
 * there is no such alert, STORE_EINVAL (with what it is) when it is not an active raise; neither
 * writes anything. Acknowledging again replaces who and when. */
store_status store_ack_alert(store *st, int64_t alert_id, uint32_t uid, int64_t time_ms,
                             store_error *err);

/* Add a silence (store_silence, in store.h) to the open batch; its id to *id (may be NULL). It
 * replaces the silences of its (run, layer, head, rule) in force: they end at its time. Same
 * error rules as store_add_alert(). */
store_status store_add_silence(store *st, const store_silence *s, int64_t *id, store_error *err);

/* End silences of run run_id in force at time_ms (0: now), into the open batch: the one with id
 * silence_id, or every one of the run (silence_id 0). Their `until` becomes time_ms (the row
 * stays: when it was set and by whom). *ended (may be NULL) gets how many ended: 0 when none was
 * in force (an unknown id, another run's, one already over). STORE_NOTFOUND when there is no such
 * run. */
store_status store_end_silences(store *st, int64_t run_id, int64_t silence_id, int64_t time_ms,
                                int64_t *ended, store_error *err);

/* Add the statistics of one push (one layer, heads 0 .. nheads-1 of it) to the open batch, with
 * time time_ms (0: now). A (run, layer, head, step) that is already stored is replaced.
 * STORE_NOTFOUND when run_id is not a run; STORE_EINVAL for a negative layer, nheads < 1 or NULL
 * heads; both leave the batch as it was. */
store_status store_add_samples(store *st, int64_t run_id, int64_t step, int32_t layer,
                               const stats_head *heads, int32_t nheads, int64_t time_ms,
                               store_error *err);

/* store_add_samples() for heads numbered from head_base: heads[i] is head head_base + i (the
 * global numbers of a tensor-parallel rank's heads). head_base >= 0, and head_base + nheads - 1
 * must fit in an int32_t; STORE_EINVAL otherwise. */
store_status store_add_samples_at(store *st, int64_t run_id, int64_t step, int32_t layer,
                                  int32_t head_base, const stats_head *heads, int32_t nheads,
                                  int64_t time_ms, store_error *err);

/* Record the parallel layout of a run (store.h, store_layout; NULL: none, the columns NULL). It is
 * durable when this returns (an open batch is committed with it), like store_run_begin().
 * STORE_EINVAL for a layout whose ranks, sizes or offsets are out of range, STORE_NOTFOUND for a
 * run that does not exist. */
store_status store_run_set_layout(store *st, int64_t run_id, const store_layout *l,
                                  store_error *err);

/* Check a layout: STORE_OK, or STORE_EINVAL with err naming the field (the daemon checks a
 * client's layout with it before using it). */
store_status store_layout_check(const store_layout *l, store_error *err);

/* Add one alert transition (store_alert, in store.h) to the open batch. Same error rules as
 * store_add_samples(). */
store_status store_add_alert(store *st, const store_alert *a, store_error *err);

/* Add one intervention (store_intervention, in store.h) to the open batch; its id to *id (may be
 * NULL). STORE_EINVAL, naming the field, for a kind that is not 1..STORE_INTERVENTION_KIND_MAX of
 * [a-z0-9_.-], a negative step, a layer < -1, more than STORE_INTERVENTION_HEADS_MAX heads, a
 * negative head, a value or threshold or measured that is infinite, or a detail longer than
 * STORE_INTERVENTION_DETAIL_MAX; STORE_NOTFOUND when run_id is not a run; both leave the batch as
 * it was. heads and values are stored as JSON arrays (schema/006_interventions.sql). */
store_status store_add_intervention(store *st, const store_intervention *iv, int64_t *id,
                                    store_error *err);

/* Commit the open batch (no-op STORE_OK when none is open). On failure the batch is rolled back. */
store_status store_commit(store *st, store_error *err);

/* Roll back the open batch, if any. */
void store_rollback(store *st);

/* Samples (per-head rows) in the open batch. */
int64_t store_pending(const store *st);

/* Samples committed through this handle since it was opened (for the daemon's status). */
int64_t store_samples_written(const store *st);

/* Number of committed samples of one run (run_id > 0) or of all runs (run_id == 0): the runs'
 * summaries (a bucket counts the samples it merged; with a batch open on this handle, that batch
 * counts too). A sample pushed again after its step was compacted counts twice until the next
 * retention step merges it. */
store_status store_count_samples(store *st, int64_t run_id, int64_t *count, store_error *err);

#ifdef __cplusplus
}
#endif

#endif /* ATTNSTAT_STORE_WRITE_H */
