/* peer.c — one connected client's state and references (see peer.h). Stage: shared by session,
 * push and status; calls buffers, conn and log. */
#include "peer.h"

#include <stdio.h>
#include <stdlib.h>

#include "log.h"

peer *peer_new(const cfg *conf, conn *c)
{
    peer *p = calloc(1, sizeof *p);
    if (!p)
        return NULL;
    p->bufs = buffers_new();
    if (!p->bufs) {
        free(p);
        return NULL;
    }
    p->c = c;
    p->refs = 1;
    p->conn_id = conn_id(c);
    p->uid = conn_uid(c);
    p->pid = (int32_t)conn_pid(c);
    p->collapse_threshold = conf->thresholds.collapse_threshold;
    return p;
}

void peer_ref(peer *p)
{
    p->refs++;
}

void peer_unref(peer *p)
{
    if (--p->refs > 0)
        return;
    buffers_free(p->bufs);
    free(p);
}

void peer_detach(peer *p)
{
    if (!p)
        return;
    p->c = NULL;
    __atomic_store_n(&p->gone, 1, __ATOMIC_RELEASE);
    buffers_forget_all(p->bufs);
    if (p->inflight)
        LOG_INFO("session", "client %llu gone with %u pushes in flight: they finish and are stored",
                 (unsigned long long)p->conn_id, p->inflight);
    peer_unref(p);
}

void peer_hello(peer *p, int64_t run_id, const char *run, int32_t rank, int has_pid, int32_t pid,
                double collapse_threshold)
{
    p->hello = 1;
    p->run_id = run_id;
    snprintf(p->run, sizeof p->run, "%s", run);
    p->rank = rank;
    if (has_pid)
        p->pid = pid;
    p->collapse_threshold = collapse_threshold;
}

void peer_subscribe(peer *p, int alerts, int results)
{
    p->sub_alerts = alerts;
    p->sub_results = results;
}

void peer_reserve(peer *p)
{
    p->reserve = 1;
}

int peer_is_session(const peer *p)
{
    return p->hello || p->sub_alerts || p->sub_results;
}

void peer_goodbye(peer *p)
{
    p->goodbye = 1;
}

void peer_layout(peer *p, const store_layout *l)
{
    p->has_layout = 1;
    p->layout = *l;
}

int peer_global(const peer *p, uint32_t layer, int32_t heads_q, int64_t span, int32_t *glayer,
                int32_t *head_base, char *msg, size_t cap)
{
    int64_t gl = (int64_t)layer + (p->has_layout ? p->layout.layer_offset : 0);
    int64_t base = !p->has_layout              ? 0
                   : p->layout.head_offset >= 0 ? p->layout.head_offset
                                                : (int64_t)p->layout.tp_rank * heads_q;
    if (gl > PEER_GLOBAL_MAX || base + span > PEER_GLOBAL_MAX) {
        snprintf(msg, cap, "layer %u with layer_offset %d, query heads 0..%lld of tp_rank %d "
                 "(head_offset %d, %d query heads a push): global numbers past %d; check the "
                 "layout", layer, (int)p->layout.layer_offset, (long long)span - 1,
                 (int)p->layout.tp_rank, (int)p->layout.head_offset, (int)heads_q,
                 PEER_GLOBAL_MAX);
        return -1;
    }
    *glayer = (int32_t)gl;
    *head_base = (int32_t)base;
    return 0;
}

void peer_heads_seen(peer *p, int32_t heads_q)
{
    p->heads_q = heads_q;
}

void peer_count(peer *p, peer_counter what)
{
    switch (what) {
    case PEER_PUSHES:
        p->pushes++;
        break;
    case PEER_DROPPED:
        p->dropped++;
        break;
    case PEER_REJECTED:
        p->rejected++;
        break;
    }
}

void peer_push_start(peer *p)
{
    p->refs++;
    p->inflight++;
}

void peer_push_end(peer *p)
{
    p->inflight--;
    peer_unref(p);
}

void peer_computing(peer *p, int delta)
{
    p->computing = (uint32_t)((int64_t)p->computing + delta);
}

int peer_first_reason(peer *p, int code, const char *msg)
{
    uint32_t h = 2166136261u ^ (uint32_t)code; /* FNV-1a over the message, digits left out */
    for (const char *m = msg ? msg : ""; *m; m++)
        if (*m < '0' || *m > '9')
            h = (h ^ (unsigned char)*m) * 16777619u;
    h |= 1; /* never 0: 0 marks a free entry */
    size_t n = sizeof p->reasons_seen / sizeof p->reasons_seen[0];
    for (size_t i = 0; i < n; i++) {
        if (p->reasons_seen[i] == h)
            return 0;
        if (p->reasons_seen[i] == 0) {
            p->reasons_seen[i] = h;
            return 1;
        }
    }
    return 0;
}
