/* owners.c — run names and the uid that owns each (see owners.h): an open-addressing table of
 * names, grown by doubling. Stage: beside the session; calls the store's read half and log. */
#include "owners.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "store_read.h"
#include "util.h"

#define OWNERS_KEY "\"owner_uid\":"

typedef struct {
    char *name;              /* NULL: free */
    uid_t uid;
} owner_slot;

struct owners {
    owner_slot *slots;
    size_t cap, n;           /* cap: a power of two, or 0 */
};

owners *owners_new(void)
{
    return calloc(1, sizeof(owners));
}

void owners_free(owners *o)
{
    if (!o)
        return;
    for (size_t i = 0; i < o->cap; i++)
        free(o->slots[i].name);
    free(o->slots);
    free(o);
}

static uint64_t hash(const char *s)
{
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

static owner_slot *find(const owners *o, const char *name)
{
    if (!o->cap)
        return NULL;
    for (size_t i = (size_t)hash(name) & (o->cap - 1);; i = (i + 1) & (o->cap - 1))
        if (!o->slots[i].name || strcmp(o->slots[i].name, name) == 0)
            return &o->slots[i];
}

static int grow(owners *o)
{
    size_t ncap = o->cap ? o->cap * 2 : 64;
    owner_slot *ns = calloc(ncap, sizeof *ns);
    if (!ns)
        return -1;
    owners old = *o;
    o->slots = ns;
    o->cap = ncap;
    for (size_t i = 0; i < old.cap; i++)
        if (old.slots[i].name)
            *find(o, old.slots[i].name) = old.slots[i];
    free(old.slots);
    return 0;
}

int owners_get(const owners *o, const char *name, uid_t *uid)
{
    const owner_slot *s = find(o, name);
    if (!s || !s->name)
        return 0;
    *uid = s->uid;
    return 1;
}

int owners_set(owners *o, const char *name, uid_t uid)
{
    if ((o->n + 1) * 2 > o->cap && grow(o) != 0)
        return -1;
    owner_slot *s = find(o, name);
    if (!s->name) {
        s->name = strdup(name);
        if (!s->name)
            return -1;
        o->n++;
    }
    s->uid = uid;
    return 0;
}

int owners_tag(char *json, size_t len, uid_t uid)
{
    size_t jl = strlen(json);
    if (jl == 0 || json[jl - 1] != '}')
        return -1;
    int w = snprintf(json + jl - 1, len - (jl - 1), ",%s%u}", OWNERS_KEY, (unsigned)uid);
    return w > 0 && (size_t)w < len - (jl - 1) ? 0 : -1;
}

typedef struct {
    owners *o;
    int failed;
    size_t n;
} load_ctx;

static int load_run(void *ctx, const store_run *r)
{
    load_ctx *lc = ctx;
    const char *k = r->thresholds ? strstr(r->thresholds, OWNERS_KEY) : NULL;
    if (!k)
        return 0;
    char *end;
    unsigned long uid = strtoul(k + strlen(OWNERS_KEY), &end, 10);
    if (end == k + strlen(OWNERS_KEY))
        return 0;
    if (owners_set(lc->o, r->name, (uid_t)uid) != 0) {
        lc->failed = 1;
        return 1;
    }
    lc->n++;
    return 0;
}

int owners_load(owners *o, store *db, char *err, size_t errlen)
{
    load_ctx lc = {o, 0, 0};
    store_error se = {0, ""};
    if (store_list_runs(db, load_run, &lc, &se) != STORE_OK)
        return util_err(err, errlen, "reading the runs' owners: %s", se.msg);
    if (lc.failed)
        return util_err(err, errlen, "reading the runs' owners: out of memory");
    LOG_INFO("server", "%zu run name%s with a recorded owner", o->n, o->n == 1 ? "" : "s");
    return 0;
}
