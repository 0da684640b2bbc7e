/* runs.h — the runs attnstatd knows: each (name, rank) with its id, its owner and where it stands
 * in its life. Loaded from the store at start-up; a Hello finds its run here or makes it, with an
 * id handed out here (the store thread records it: the Hello is answered without waiting on the
 * database).
 * Stage: beside the session (which asks and adds at each Hello) and the loop (which attaches and
 * detaches connections, and ends runs); calls the store's read half (at start-up only), util and
 * log. Loop thread only.
 *
 * Owners. A run name belongs to the uid whose Hello first created it (any rank): another uid's
 * Hello with that name is refused, so two users admitted by --allow-group never write into, or
 * raise alerts in, each other's run. The owner is the run's owner_uid column. A run recorded
 * without one (by an attnstatd before owners were kept, migrated) is nobody's to take: only root
 * and the daemon's own uid may claim it with a Hello or act on it (runs_may_act).
 *
 * A run's life (run_state):
 *   LIVE      a connection said Hello for it and is open;
 *   ORPHAN    its last connection closed, or the daemon (re)started and it had not ended: it is
 *             still live, waiting for its client to come back (a client reconnecting after a daemon
 *             restart says the same Hello), until run_grace_ms have passed, or at once when that
 *             connection said Goodbye;
 *   ENDED     it ended: Goodbye, its grace passed, or no push stored for run_idle_ms while a client
 *             stayed connected (a push after that resumes it; a Hello does too);
 *   DELETING  attnstat delete-run is removing it: a Hello for it is refused meanwhile.
 * runs_due() says which live runs must end now and why; the loop ends them (alerts resolved, the
 * end recorded) and calls runs_ended(). */
#ifndef ATTNSTAT_RUNS_H
#define ATTNSTAT_RUNS_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

typedef struct store store;

typedef enum { RUN_LIVE, RUN_ORPHAN, RUN_ENDED, RUN_DELETING } run_state;

typedef struct {
    int64_t id;
    char *name;
    int32_t rank;
    int has_owner;
    uid_t owner;
    run_state state;
    uint32_t conns;          /* open connections whose Hello named it */
    int goodbye;             /* ORPHAN: its last connection said Goodbye */
    uint64_t since_ns;       /* ORPHAN: since when (util_mono_ns) */
    uint64_t active_ns;      /* its Hello, or its last stored push (util_mono_ns) */
    uint64_t config_bytes;   /* its Hello's config as stored (max_config_bytes_per_uid) */
    uint64_t interventions;  /* Interventions recorded for it since this daemon started */
    uint64_t intervened_heads; /* the heads they named, summed (qk_clip: heads clipped) */
    void *unrecorded;        /* its record, when the transaction that held it was rolled back
                              * (life.c submits it again before the run's next push; freed with
                              * the entry) */
} run_entry;

typedef struct runs runs;

runs *runs_new(void);
void runs_free(runs *r);

/* Every run of db: those that ended are ENDED, the others ORPHAN since now_ns (their clients have
 * run_grace_ms to come back). New ids follow the largest. 0, or -1 with err set (nothing known:
 * the first uid to say Hello with a name takes it; ids from 1). */
int runs_load(runs *r, store *db, uint64_t now_ns, char *err, size_t errlen);

/* 1 with *uid the owner of run name (any rank), 0 when it has none. */
int runs_owner(const runs *r, const char *name, uid_t *uid);
/* 1 when run name is known and none of its ranks has an owner (recorded before owners were kept):
 * only a privileged uid may claim it. */
int runs_unowned(const runs *r, const char *name);
/* 1 for root and the daemon's own (effective) uid, who may act on every run. */
int runs_privileged(uid_t uid);
/* Whether uid may write into e, delete it, change its retention, or ack, resolve or silence its
 * alerts: a privileged uid, or e's owner (a run with no owner: the privileged only). */
int runs_may_act(const run_entry *e, uid_t uid);
run_entry *runs_find(const runs *r, const char *name, int32_t rank);
run_entry *runs_get(const runs *r, int64_t id);
/* A new run (ENDED, no connection: runs_attach() next) with the next id, owned by uid. NULL on no
 * memory. */
run_entry *runs_add(runs *r, const char *name, int32_t rank, uid_t uid);
/* Forgets e (deleted). */
void runs_remove(runs *r, run_entry *e);

/* A connection's Hello named e: LIVE (active now). */
void runs_attach(run_entry *e, uint64_t now_ns);
/* A connection of e closed (goodbye: it said Goodbye first): ORPHAN when it was the last. */
void runs_detach(run_entry *e, int goodbye, uint64_t now_ns);
/* A push of e was stored: 1 when e had ended for idleness and resumes now (LIVE again), else 0. */
int runs_touch(run_entry *e, uint64_t now_ns);

/* The live runs that must end at now_ns: why(ctx, e, reason) for each, with reason "goodbye",
 * "disconnected" (grace_ns passed) or "idle" (idle_ns passed; 0: never). The callback ends it
 * (runs_ended()). */
void runs_due(runs *r, uint64_t now_ns, uint64_t grace_ns, uint64_t idle_ns,
              void (*why)(void *ctx, run_entry *e, const char *reason), void *ctx);
/* e ended (ENDED). */
void runs_ended(run_entry *e);

/* Hellos alone must not grow the database without bound: may uid's Hello for run e (NULL: a new
 * run) with a config of config_bytes be recorded? The runs uid owns (ended ones too) may be at
 * most max_runs, their configs together at most max_config_bytes (e, when uid's already, counts
 * with its new config instead of its old one). 0, or -1 with err saying which bound and what
 * frees it. */
int runs_quota(const runs *r, const run_entry *e, uid_t uid, uint64_t config_bytes,
               uint64_t max_runs, uint64_t max_config_bytes, char *err, size_t errlen);

/* Every run, in no particular order (fn must not add or remove runs). */
void runs_each(const runs *r, void (*fn)(void *ctx, run_entry *e), void *ctx);
/* Runs LIVE or ORPHAN. */
uint32_t runs_live(const runs *r);

#endif /* ATTNSTAT_RUNS_H */
