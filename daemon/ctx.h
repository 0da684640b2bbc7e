/* ctx.h — the narrow context attnstatd's stages share, instead of one server struct: the settings,
 * the counters, the store, the devices (CPU and GPU workers), the alert feed (thresholds, active
 * alerts), the registry of connected clients, the runs' owners, and whether the daemon is
 * stopping.
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
typedef struct devices devices;
typedef struct alerts_feed alerts_feed;
typedef struct clients clients;
typedef struct owners owners;

typedef struct {
    const cfg *cfg;
    counters *cnt;
    store *db;
    devices *dev;
    alerts_feed *feed;
    clients *reg;
    owners *own;             /* who owns each run name */
    int stopping;            /* shutdown requested: new pushes are dropped */
} stage_ctx;

#endif /* ATTNSTAT_CTX_H */
