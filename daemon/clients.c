/* clients.c — the registry of open connections (see clients.h). Stage: beside the flow; calls
 * conn. */
#include "clients.h"

#include <stdlib.h>

struct clients {
    clients_entry *head;
    uint32_t n;
    clients_filter_fn may_see;   /* NULL: every subscriber sees everything */
    void *may_see_ctx;
};

clients *clients_new(void)
{
    return calloc(1, sizeof(clients));
}

void clients_free(clients *r)
{
    free(r);
}

clients_entry *clients_add(clients *r, conn *c, void *owner)
{
    clients_entry *e = calloc(1, sizeof *e);
    if (!e)
        return NULL;
    e->c = c;
    e->owner = owner;
    e->next = r->head;
    if (r->head)
        r->head->prev = e;
    r->head = e;
    e->linked = 1;
    r->n++;
    return e;
}

void clients_remove(clients *r, clients_entry *e)
{
    if (!e->linked)
        return;
    if (e->prev)
        e->prev->next = e->next;
    else
        r->head = e->next;
    if (e->next)
        e->next->prev = e->prev;
    e->prev = e->next = NULL;
    e->linked = 0;
    r->n--;
}

void clients_entry_free(clients_entry *e)
{
    free(e);
}

uint32_t clients_count(const clients *r)
{
    return r->n;
}

void clients_tally(const clients *r, uid_t uid, uint32_t *admitted, uint32_t *of_uid,
                   uint32_t *other, uint32_t *reserve)
{
    *admitted = *of_uid = *other = *reserve = 0;
    for (const clients_entry *e = r->head; e; e = e->next) {
        if (e->p && conn_is_open(e->c)) {
            (*admitted)++;
            *of_uid += conn_uid(e->c) == uid;
            *reserve += e->p->reserve != 0;
        } else {
            (*other)++;
        }
    }
}

uint32_t clients_sessions(const clients *r, uid_t uid)
{
    uint32_t n = 0;
    for (const clients_entry *e = r->head; e; e = e->next)
        n += e->p && conn_is_open(e->c) && e->p->uid == uid && peer_is_session(e->p);
    return n;
}

void clients_set_filter(clients *r, clients_filter_fn may_see, void *ctx)
{
    r->may_see = may_see;
    r->may_see_ctx = ctx;
}

clients_entry *clients_first(const clients *r)
{
    return r->head;
}

static int subscribed(const clients_entry *e, clients_sub what)
{
    if (!e->p || !conn_is_open(e->c))
        return 0;
    return what == CLIENTS_ALERTS ? e->p->sub_alerts : e->p->sub_results;
}

int clients_any_subscribed(const clients *r, clients_sub what)
{
    for (const clients_entry *e = r->head; e; e = e->next)
        if (subscribed(e, what))
            return 1;
    return 0;
}

void clients_broadcast(clients *r, const Attnstat__Envelope *env, clients_sub what)
{
    for (clients_entry *e = r->head, *next; e; e = next) {
        next = e->next;
        if (subscribed(e, what) && (!r->may_see || r->may_see(r->may_see_ctx, e->p->uid, env)))
            conn_write(e->c, env, 0);
    }
}
