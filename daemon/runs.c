/* runs.c — the runs attnstatd knows (see runs.h): an array of entries and two open-addressing
 * indexes into it, by id and by (name, rank); owners are found through the name's entries. Stage:
 * beside the session and the loop; calls the store's read half, util and log.
 *
 * The indexes hold positions in the array and are rebuilt whole when a run is removed (deleting a
 * run is rare; finding one happens at every Hello and every stored push). */
#include "runs.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "log.h"
#include "store_read.h"
#include "util.h"

struct runs {
    run_entry **all;
    size_t n, cap;
    size_t *by_id, *by_key;  /* [icap]: position + 1, 0 empty */
    size_t icap;             /* a power of two, at least twice n */
    int64_t next_id;
};

static uint64_t mix(uint64_t h)
{
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 33;
    return h;
}

static uint64_t key_hash(const char *name, int32_t rank)
{
    uint64_t h = 1469598103934665603ull; /* FNV-1a over the name, then the rank */
    for (const char *s = name; *s; s++)
        h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return mix(h ^ (uint64_t)(uint32_t)rank);
}

static void index_put(runs *r, size_t pos)
{
    const run_entry *e = r->all[pos];
    size_t m = r->icap - 1;
    size_t i = (size_t)mix((uint64_t)e->id) & m;
    while (r->by_id[i])
        i = (i + 1) & m;
    r->by_id[i] = pos + 1;
    i = (size_t)key_hash(e->name, e->rank) & m;
    while (r->by_key[i])
        i = (i + 1) & m;
    r->by_key[i] = pos + 1;
}

static int reindex(runs *r, size_t icap)
{
    size_t *a = calloc(icap, sizeof *a), *b = calloc(icap, sizeof *b);
    if (!a || !b) {
        free(a);
        free(b);
        return -1;
    }
    free(r->by_id);
    free(r->by_key);
    r->by_id = a;
    r->by_key = b;
    r->icap = icap;
    for (size_t i = 0; i < r->n; i++)
        index_put(r, i);
    return 0;
}

runs *runs_new(void)
{
    runs *r = calloc(1, sizeof *r);
    if (r)
        r->next_id = 1;
    return r;
}

void runs_free(runs *r)
{
    if (!r)
        return;
    for (size_t i = 0; i < r->n; i++) {
        free(r->all[i]->name);
        free(r->all[i]->unrecorded);
        free(r->all[i]);
    }
    free(r->all);
    free(r->by_id);
    free(r->by_key);
    free(r);
}

run_entry *runs_get(const runs *r, int64_t id)
{
    if (!r->icap)
        return NULL;
    size_t m = r->icap - 1;
    for (size_t i = (size_t)mix((uint64_t)id) & m; r->by_id[i]; i = (i + 1) & m)
        if (r->all[r->by_id[i] - 1]->id == id)
            return r->all[r->by_id[i] - 1];
    return NULL;
}

run_entry *runs_find(const runs *r, const char *name, int32_t rank)
{
    if (!r->icap)
        return NULL;
    size_t m = r->icap - 1;
    for (size_t i = (size_t)key_hash(name, rank) & m; r->by_key[i]; i = (i + 1) & m) {
        run_entry *e = r->all[r->by_key[i] - 1];
        if (e->rank == rank && strcmp(e->name, name) == 0)
            return e;
    }
    return NULL;
}

int runs_owner(const runs *r, const char *name, uid_t *uid)
{
    /* The name's runs: rank 0 first (the usual one), else a scan (names with no rank 0 are rare). */
    const run_entry *e = runs_find(r, name, 0);
    if (e && e->has_owner) {
        *uid = e->owner;
        return 1;
    }
    for (size_t i = 0; i < r->n; i++) {
        e = r->all[i];
        if (e->has_owner && strcmp(e->name, name) == 0) {
            *uid = e->owner;
            return 1;
        }
    }
    return 0;
}

int runs_unowned(const runs *r, const char *name)
{
    int known = 0;
    for (size_t i = 0; i < r->n; i++) {
        const run_entry *e = r->all[i];
        if (strcmp(e->name, name) != 0)
            continue;
        if (e->has_owner)
            return 0;
        known = 1;
    }
    return known;
}

int runs_privileged(uid_t uid)
{
    return uid == 0 || uid == geteuid();
}

int runs_may_act(const run_entry *e, uid_t uid)
{
    return runs_privileged(uid) || (e->has_owner && e->owner == uid);
}

/* Appends an entry (indexed). NULL on no memory. */
static run_entry *append(runs *r, int64_t id, const char *name, int32_t rank)
{
    if (r->n == r->cap) {
        size_t ncap = r->cap ? r->cap * 2 : 64;
        run_entry **na = realloc(r->all, ncap * sizeof *na);
        if (!na)
            return NULL;
        r->all = na;
        r->cap = ncap;
    }
    if ((r->n + 1) * 2 > r->icap && reindex(r, r->icap ? r->icap * 2 : 128) != 0)
        return NULL;
    run_entry *e = calloc(1, sizeof *e);
    char *nm = strdup(name);
    if (!e || !nm) {
        free(e);
        free(nm);
        return NULL;
    }
    e->id = id;
    e->name = nm;
    e->rank = rank;
    e->state = RUN_ENDED;
    r->all[r->n] = e;
    index_put(r, r->n);
    r->n++;
    if (id >= r->next_id)
        r->next_id = id + 1;
    return e;
}

run_entry *runs_add(runs *r, const char *name, int32_t rank, uid_t uid)
{
    run_entry *e = append(r, r->next_id, name, rank);
    if (e) {
        e->has_owner = 1;
        e->owner = uid;
    }
    return e;
}

void runs_remove(runs *r, run_entry *e)
{
    for (size_t i = 0; i < r->n; i++) {
        if (r->all[i] != e)
            continue;
        r->all[i] = r->all[--r->n];
        free(e->name);
        free(e->unrecorded);
        free(e);
        if (reindex(r, r->icap) != 0)
            LOG_ERROR("server", "out of memory re-indexing the runs: runs may not be found");
        return;
    }
}

typedef struct {
    runs *r;
    uint64_t now_ns;
    int failed;
} load_ctx;

static int load_run(void *ctx, const store_run *sr)
{
    load_ctx *lc = ctx;
    run_entry *e = append(lc->r, sr->id, sr->name, sr->rank);
    if (!e) {
        lc->failed = 1;
        return 1;
    }
    e->has_owner = sr->has_owner;
    e->owner = (uid_t)sr->owner_uid;
    e->config_bytes = sr->config ? strlen(sr->config) : 0;
    if (!sr->ended_ms) {
        e->state = RUN_ORPHAN;
        e->since_ns = e->active_ns = lc->now_ns;
    }
    return 0;
}

int runs_load(runs *r, store *db, uint64_t now_ns, char *err, size_t errlen)
{
    load_ctx lc = {r, now_ns, 0};
    store_error se = {0, ""};
    if (store_list_runs(db, load_run, &lc, &se) != STORE_OK)
        return util_err(err, errlen, "reading the runs: %s", se.msg);
    if (lc.failed)
        return util_err(err, errlen, "reading the runs: out of memory");
    LOG_INFO("server", "%zu run%s known, %u of them not ended (their clients have run_grace_ms "
             "to come back)", r->n, r->n == 1 ? "" : "s", runs_live(r));
    return 0;
}

void runs_attach(run_entry *e, uint64_t now_ns)
{
    e->conns++;
    e->state = RUN_LIVE;
    e->goodbye = 0;
    e->active_ns = now_ns;
}

void runs_detach(run_entry *e, int goodbye, uint64_t now_ns)
{
    if (e->conns > 0)
        e->conns--;
    if (e->conns == 0 && e->state == RUN_LIVE) {
        e->state = RUN_ORPHAN;
        e->since_ns = now_ns;
        e->goodbye = goodbye;
    }
}

int runs_touch(run_entry *e, uint64_t now_ns)
{
    e->active_ns = now_ns;
    if (e->state == RUN_ENDED && e->conns > 0) {
        e->state = RUN_LIVE;
        return 1;
    }
    return 0;
}

void runs_due(runs *r, uint64_t now_ns, uint64_t grace_ns, uint64_t idle_ns,
              void (*why)(void *ctx, run_entry *e, const char *reason), void *ctx)
{
    for (size_t i = 0; i < r->n; i++) {
        run_entry *e = r->all[i];
        const char *reason = NULL;
        if (e->state == RUN_ORPHAN && e->goodbye)
            reason = "goodbye";
        else if (e->state == RUN_ORPHAN && now_ns - e->since_ns >= grace_ns)
            reason = "disconnected";
        else if (e->state == RUN_LIVE && idle_ns && now_ns - e->active_ns >= idle_ns)
            reason = "idle";
        if (reason)
            why(ctx, e, reason);
    }
}

void runs_ended(run_entry *e)
{
    e->state = RUN_ENDED;
    e->goodbye = 0;
}

int runs_quota(const runs *r, const run_entry *e, uid_t uid, uint64_t config_bytes,
               uint64_t max_runs, uint64_t max_config_bytes, char *err, size_t errlen)
{
    uint64_t nruns = 0, bytes = 0;
    for (size_t i = 0; i < r->n; i++) {
        const run_entry *o = r->all[i];
        if (o == e || !o->has_owner || o->owner != uid)
            continue;
        nruns++;
        bytes += o->config_bytes;
    }
    if (nruns + 1 > max_runs)
        return util_err(err, errlen, "uid %u has %llu runs (each name and rank, ended ones "
                        "included), the most one uid may have (max_runs_per_uid %llu): delete "
                        "old ones (attnstat delete-run), or raise the setting", (unsigned)uid,
                        (unsigned long long)nruns, (unsigned long long)max_runs);
    if (bytes + config_bytes > max_config_bytes)
        return util_err(err, errlen, "uid %u's runs hold %llu bytes of configs; this one's %llu "
                        "more would pass max_config_bytes_per_uid %llu: send a smaller config, "
                        "delete old runs (attnstat delete-run), or raise the setting",
                        (unsigned)uid, (unsigned long long)bytes,
                        (unsigned long long)config_bytes, (unsigned long long)max_config_bytes);
    return 0;
}

void runs_each(const runs *r, void (*fn)(void *ctx, run_entry *e), void *ctx)
{
    for (size_t i = 0; i < r->n; i++)
        fn(ctx, r->all[i]);
}

uint32_t runs_live(const runs *r)
{
    uint32_t n = 0;
    for (size_t i = 0; i < r->n; i++)
        n += r->all[i]->state == RUN_LIVE || r->all[i]->state == RUN_ORPHAN;
    return n;
}
