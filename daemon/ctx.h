/* ctx.h — the narrow context attnstatd's stages share, instead of one server struct: the settings,
 * the counters, the store (read at start-up; written through the store thread), the devices (CPU
 * and GPU workers), the alert feed (thresholds, active alerts), the registry of connected clients,
 * the runs (ids, owners, their life), the retention, and whether the daemon is stopping.
 *
 * loop.c fills one at start-up and is the only one to write it (`stopping` included); a stage
 * reads the pointers it needs and acts on them through their modules' functions only. The modules
 * are named here, not included: including ctx.h ties a stage to nothing it does not call.
 * Loop thread only. */
#ifndef ATTNSTAT_CTX_H
#define ATTNSTAT_CTX_H

#include "config.h"

typedef struct counters counters;
typedef struct store store;
typedef struct storer storer;
typedef struct devices devices;
typedef struct alerts_feed alerts_feed;
typedef struct clients clients;
typedef struct runs runs;
typedef struct retain retain;

typedef struct {
    const cfg *cfg;
    counters *cnt;
    store *db;               /* read at start-up; the store thread's once it runs */
    storer *st;              /* every write to the database, on the store thread */
    devices *dev;
    alerts_feed *feed;
    clients *reg;
    runs *runs;              /* every run: ids, owners, where each stands in its life */
    retain *ret;             /* the background retention (NULL: none) */
    int stopping;            /* shutdown requested: new pushes are dropped */
} stage_ctx;

#endif /* ATTNSTAT_CTX_H */
