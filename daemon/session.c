/* session.c — per-client protocol handling (see session.h): Hello, RegisterBuffer / Forget with
 * their shared-memory mappings, Subscribe, Status, and Push up to its submission to a worker.
 * Every reply to a bad message is an Error (or, for a Push, an Ack) naming what was wrong; the
 * connection stays usable. */
#include "session.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "log.h"
#include "pipeline.h"
#include "server.h"

struct session_map {
    int refs;                /* the registration + each push reading it */
    int fd;                  /* kept open: workers fstat it to notice a shrunk segment */
    void *addr;
    uint64_t size;
    char name[256];
};

struct session_buf {
    uint32_t id;
    session_map *map;        /* HOST_SHM */
    gpu_mem *gm;             /* CUDA_IPC */
    validate_buffer vb;
};

struct session_event {
    uint32_t id;
    int device;              /* index in srv->gpus */
    gpu_event *ev;
};

#define SESSION_MAX_EVENTS 4096

static void map_unref(session_map *m);

static void buf_unref(struct session_buf *b)
{
    if (b->map)
        map_unref(b->map);
    if (b->gm)
        gpu_mem_unref(b->gm);
}

static void map_unref(session_map *m)
{
    if (--m->refs > 0)
        return;
    if (munmap(m->addr, m->size) != 0)
        LOG_ERROR("session", "munmap of shm %s: %s", m->name, strerror(errno));
    if (close(m->fd) != 0)
        LOG_ERROR("session", "close of shm %s: %s", m->name, strerror(errno));
    LOG_DEBUG("session", "unmapped shm %s (%llu bytes)", m->name, (unsigned long long)m->size);
    free(m);
}

static void session_unref(session *s)
{
    if (--s->refs > 0)
        return;
    for (uint32_t i = 0; i < s->nbufs; i++)
        buf_unref(&s->bufs[i]);
    for (uint32_t i = 0; i < s->nevs; i++)
        gpu_event_unref(s->evs[i].ev);
    free(s->bufs);
    free(s->evs);
    free(s);
}

session *session_new(server *srv, conn *c)
{
    session *s = calloc(1, sizeof *s);
    if (!s)
        return NULL;
    s->srv = srv;
    s->c = c;
    s->refs = 1;
    s->conn_id = c->id;
    s->pid = (int32_t)c->pid;
    s->th = srv->cfg->thresholds;
    return s;
}

void session_detach(session *s)
{
    if (!s)
        return;
    s->c = NULL;
    __atomic_store_n(&s->gone, 1, __ATOMIC_RELEASE);
    for (uint32_t i = 0; i < s->nbufs; i++)
        buf_unref(&s->bufs[i]);
    s->nbufs = 0;
    for (uint32_t i = 0; i < s->nevs; i++)
        gpu_event_unref(s->evs[i].ev);
    s->nevs = 0;
    if (s->inflight)
        LOG_INFO("session", "client %llu gone with %u pushes in flight: they finish and are stored",
                 (unsigned long long)s->conn_id, s->inflight);
    session_unref(s);
}

/* ---- replies -------------------------------------------------------------------------------- */

static void send_error(session *s, Attnstat__Code code, int has_ref, uint64_t ref, const char *fmt,
                       ...) __attribute__((format(printf, 5, 6)));

static void send_error(session *s, Attnstat__Code code, int has_ref, uint64_t ref, const char *fmt,
                       ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    LOG_DEBUG("session", "client %llu: error %d: %s", (unsigned long long)s->conn_id, (int)code, msg);
    if (s->c)
        server_send_error(s->c, code, msg, has_ref, ref);
}

static void ack_now(session *s, uint64_t seq, Attnstat__Code code, const char *msg)
{
    if (!s->c)
        return;
    Attnstat__Ack ack = ATTNSTAT__ACK__INIT;
    ack.seq = seq;
    ack.code = code;
    ack.message = (char *)msg;
    Attnstat__Envelope env = ATTNSTAT__ENVELOPE__INIT;
    env.msg_case = ATTNSTAT__ENVELOPE__MSG_ACK;
    env.ack = &ack;
    server_send(s->c, &env, 1);
}

void session_send_ack(session_push *p, Attnstat__Code code, const char *msg,
                      Attnstat__HeadStats **heads, size_t nheads)
{
    session *s = p->s;
    if (!s->c)
        return;
    Attnstat__Ack ack = ATTNSTAT__ACK__INIT;
    ack.seq = p->seq;
    ack.code = code;
    ack.message = msg && msg[0] ? (char *)msg : NULL;
    ack.heads = heads;
    ack.n_heads = nheads;
    Attnstat__Envelope env = ATTNSTAT__ENVELOPE__INIT;
    env.msg_case = ATTNSTAT__ENVELOPE__MSG_ACK;
    env.ack = &ack;
    if (server_send(s->c, &env, 1) != 0 && heads && s->c) {
        /* Over max_frame with its results: acknowledge without them. (A send that closed the
         * connection, its queue far over the cap, detached the session: s->c is NULL then.) */
        ack.heads = NULL;
        ack.n_heads = 0;
        ack.message = "stored; per-head results omitted: they do not fit in max_frame";
        server_send(s->c, &env, 1);
    }
}

/* ---- Hello ---------------------------------------------------------------------------------- */

static int valid_text(const char *t, size_t max)
{
    size_t n = strlen(t);
    if (n == 0 || n > max)
        return 0;
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)t[i] < 0x20 || t[i] == 0x7f)
            return 0;
    return 1;
}

static void on_hello(session *s, const Attnstat__Hello *h)
{
    server *srv = s->srv;
    if (h->protocol_version != FRAME_PROTOCOL_VERSION) {
        send_error(s, ATTNSTAT__CODE__VERSION, 0, 0,
                   "protocol version %u is not supported: this daemon speaks version %u",
                   h->protocol_version, FRAME_PROTOCOL_VERSION);
        return;
    }
    if (s->hello) {
        send_error(s, ATTNSTAT__CODE__BAD_REQUEST, 0, 0,
                   "Hello was already received on this connection (run '%s'); open a new connection "
                   "for another run", s->run);
        return;
    }
    const char *run = h->run && h->run[0] ? h->run : srv->cfg->default_run;
    if (!valid_text(run, SESSION_RUN_MAX - 1)) {
        send_error(s, ATTNSTAT__CODE__BAD_REQUEST, 0, 0,
                   "run name must be 1..%d bytes of printable text", SESSION_RUN_MAX - 1);
        return;
    }
    if (h->has_rank && h->rank < 0) {
        send_error(s, ATTNSTAT__CODE__BAD_REQUEST, 0, 0, "rank %d must be >= 0", h->rank);
        return;
    }
    if (h->host && strlen(h->host) > 255) {
        send_error(s, ATTNSTAT__CODE__BAD_REQUEST, 0, 0, "host is longer than 255 bytes");
        return;
    }
    char msg[256];
    if (validate_thresholds(h->thresholds, msg, sizeof msg) != 0) {
        send_error(s, ATTNSTAT__CODE__BAD_REQUEST, 0, 0, "%s", msg);
        return;
    }
    cfg_thresholds th = srv->cfg->thresholds;
    const Attnstat__Thresholds *t = h->thresholds;
    if (t) {
        if (t->has_entropy_floor)
            th.entropy_floor = t->entropy_floor;
        if (t->has_entropy_drop)
            th.entropy_drop = t->entropy_drop;
        if (t->has_ema_alpha)
            th.ema_alpha = t->ema_alpha;
        if (t->has_logit_ceiling)
            th.logit_ceiling = t->logit_ceiling;
        if (t->has_raise_after)
            th.raise_after = t->raise_after;
        if (t->has_clear_after)
            th.clear_after = t->clear_after;
        if (t->has_collapse_threshold)
            th.collapse_threshold = t->collapse_threshold;
    }
    char thjson[512], aerr[256];
    if (pipeline_check_thresholds(srv->pipe, t, thjson, sizeof thjson, aerr, sizeof aerr) != 0) {
        send_error(s, ATTNSTAT__CODE__BAD_REQUEST, 0, 0, "thresholds: %s", aerr);
        return;
    }
    /* The computation's parameter travels with the rules' thresholds. */
    size_t jl = strlen(thjson);
    if (jl > 0 && thjson[jl - 1] == '}')
        snprintf(thjson + jl - 1, sizeof thjson - (jl - 1), ",\"collapse_threshold\":%.17g}",
                 th.collapse_threshold);
    store_run_info info = {
        .name = run,
        .rank = h->has_rank ? h->rank : 0,
        .host = h->host,
        .pid = h->has_pid ? h->pid : (s->c ? s->c->pid : 0),
        .time_ms = 0,
        .config = h->config,
        .thresholds = thjson,
    };
    int64_t run_id = 0;
    store_error se = {0, ""};
    store_status st = store_run_begin(srv->db, &info, &run_id, &se);
    if (st != STORE_OK) {
        LOG_ERROR("session", "client %llu: registering run '%s': %s", (unsigned long long)s->conn_id,
                  run, se.msg);
        send_error(s, ATTNSTAT__CODE__INTERNAL, 0, 0, "the store could not register run '%s': %s",
                   run, se.msg);
        return;
    }
    s->hello = 1;
    s->run_id = run_id;
    snprintf(s->run, sizeof s->run, "%s", run);
    s->rank = info.rank;
    if (h->has_pid)
        s->pid = h->pid;
    s->th = th;
    if (pipeline_set_run(srv->pipe, run_id, t, aerr, sizeof aerr) != 0)
        LOG_ERROR("session", "run %lld: thresholds refused by the alert engine: %s", (long long)run_id,
                  aerr);
    LOG_INFO("session", "client %llu: hello run '%s' (id %lld) rank %d pid %d host %s",
             (unsigned long long)s->conn_id, s->run, (long long)run_id, s->rank, (int)s->pid,
             h->host ? h->host : "-");

    /* The GPUs named: those of this host get a worker now (its context takes a while). */
    char *served[GPU_MAX_LOCAL];
    size_t nserved = 0;
    for (size_t i = 0; i < h->n_device_uuids && i < 64; i++) {
        const char *u = h->device_uuids[i];
        int d = server_gpu_find(srv, u);
        char gerr[300];
        if (d < 0) {
            LOG_WARN("session", "client %llu names device %s, which is not a usable GPU of this "
                     "host%s%s: its CUDA tensors will be refused", (unsigned long long)s->conn_id,
                     u ? u : "?", srv->ngpus ? "" : ": ", srv->ngpus ? "" : srv->gpu_why);
            continue;
        }
        if (!server_gpu_worker(srv, d, gerr, sizeof gerr)) {
            LOG_ERROR("session", "client %llu: %s", (unsigned long long)s->conn_id, gerr);
            continue;
        }
        int dup = 0;
        for (size_t j = 0; j < nserved; j++)
            dup |= served[j] == srv->gpus[d].uuid;
        if (!dup && nserved < GPU_MAX_LOCAL)
            served[nserved++] = srv->gpus[d].uuid;
    }

    Attnstat__HelloReply rep = ATTNSTAT__HELLO_REPLY__INIT;
    rep.protocol_version = FRAME_PROTOCOL_VERSION;
    rep.n_served_devices = nserved;
    rep.served_devices = served;
    rep.run_id = run_id;
    rep.max_frame = (uint32_t)srv->cfg->max_frame;
    rep.queue_capacity = (uint32_t)srv->cfg->queue_depth;
    rep.daemon_version = (char *)ATTNSTAT_DAEMON_VERSION;
    Attnstat__Envelope env = ATTNSTAT__ENVELOPE__INIT;
    env.msg_case = ATTNSTAT__ENVELOPE__MSG_HELLO_REPLY;
    env.hello_reply = &rep;
    if (s->c)
        server_send(s->c, &env, 1);
}

/* ---- buffers -------------------------------------------------------------------------------- */

static struct session_buf *find_buf(session *s, uint32_t id)
{
    for (uint32_t i = 0; i < s->nbufs; i++)
        if (s->bufs[i].id == id)
            return &s->bufs[i];
    return NULL;
}

static const validate_buffer *lookup_buf(void *ctx, uint32_t id)
{
    struct session_buf *b = find_buf(ctx, id);
    return b ? &b->vb : NULL;
}

/* The local device (index) a CUDA registration names, its worker started; -1 with an Error sent. */
static int cuda_device_for(session *s, const char *what, uint32_t id, const char *uuid)
{
    server *srv = s->srv;
    if (srv->ngpus == 0) {
        send_error(s, ATTNSTAT__CODE__UNSUPPORTED, 1, id,
                   "%s %u: CUDA_IPC needs a GPU worker and this daemon has none (%s); push host "
                   "tensors, or run attnstatd on the GPU's host with a CUDA build", what, id,
                   srv->gpu_why);
        return -1;
    }
    if (!uuid || !uuid[0]) {
        send_error(s, ATTNSTAT__CODE__BAD_REQUEST, 1, id, "%s %u: device_uuid is missing", what, id);
        return -1;
    }
    int d = server_gpu_find(srv, uuid);
    if (d < 0) {
        char local[GPU_MAX_LOCAL * 48] = "";
        for (int i = 0; i < srv->ngpus; i++)
            snprintf(local + strlen(local), sizeof local - strlen(local), "%s%s", i ? ", " : "",
                     srv->gpus[i].uuid);
        send_error(s, ATTNSTAT__CODE__UNSUPPORTED, 1, id,
                   "%s %u: device %s is not a GPU this daemon serves (it has: %s)", what, id, uuid,
                   local);
        return -1;
    }
    char err[300];
    if (!server_gpu_worker(srv, d, err, sizeof err)) {
        send_error(s, ATTNSTAT__CODE__INTERNAL, 1, id, "%s %u: %s", what, id, err);
        return -1;
    }
    return d;
}

static int grow_bufs(session *s)
{
    if (s->nbufs < s->capbufs)
        return 0;
    uint32_t ncap = s->capbufs ? s->capbufs * 2 : 8;
    struct session_buf *nb = realloc(s->bufs, ncap * sizeof *nb);
    if (!nb)
        return -1;
    s->bufs = nb;
    s->capbufs = ncap;
    return 0;
}

/* RegisterBuffer CUDA_IPC (checked so far: Hello, unique id, count, size). The handle is opened
 * later, on the device's worker thread, at the first push that reads it. */
static void register_cuda_buffer(session *s, const Attnstat__RegisterBuffer *rb)
{
    int d = cuda_device_for(s, "buffer", rb->id, rb->device_uuid);
    if (d < 0)
        return;
    if (!rb->has_ipc_handle || rb->ipc_handle.len != GPU_IPC_HANDLE_BYTES) {
        send_error(s, ATTNSTAT__CODE__BAD_REQUEST, 1, rb->id,
                   "buffer %u: a CUDA_IPC buffer needs ipc_handle of %d bytes (cudaIpcMemHandle_t), "
                   "not %zu", rb->id, GPU_IPC_HANDLE_BYTES,
                   rb->has_ipc_handle ? rb->ipc_handle.len : (size_t)0);
        return;
    }
    gpu_mem *m = gpu_mem_new(s->srv->gpu_c[d], rb->ipc_handle.data, rb->size);
    if (!m || grow_bufs(s) != 0) {
        if (m)
            gpu_mem_unref(m);
        send_error(s, ATTNSTAT__CODE__INTERNAL, 1, rb->id, "buffer %u: out of memory", rb->id);
        return;
    }
    struct session_buf *b = &s->bufs[s->nbufs++];
    b->id = rb->id;
    b->map = NULL;
    b->gm = m;
    b->vb.kind = ATTNSTAT__BUFFER_KIND__CUDA_IPC;
    b->vb.size = rb->size;
    b->vb.base = NULL;
    b->vb.device = d;
    LOG_DEBUG("session", "client %llu: buffer %u = CUDA IPC on %s, %llu bytes",
              (unsigned long long)s->conn_id, rb->id, s->srv->gpus[d].uuid,
              (unsigned long long)rb->size);
}

static struct session_event *find_event(session *s, uint32_t id)
{
    for (uint32_t i = 0; i < s->nevs; i++)
        if (s->evs[i].id == id)
            return &s->evs[i];
    return NULL;
}

static void on_register_event(session *s, const Attnstat__RegisterEvent *re)
{
    if (!s->hello) {
        send_error(s, ATTNSTAT__CODE__NO_HELLO, 1, re->id, "RegisterEvent %u before Hello", re->id);
        return;
    }
    if (find_event(s, re->id)) {
        send_error(s, ATTNSTAT__CODE__BAD_REQUEST, 1, re->id,
                   "event id %u is already registered on this connection (Forget it first)", re->id);
        return;
    }
    if (s->nevs >= SESSION_MAX_EVENTS) {
        send_error(s, ATTNSTAT__CODE__BUSY, 1, re->id, "event %u: this connection already has %u "
                   "events", re->id, s->nevs);
        return;
    }
    int d = cuda_device_for(s, "event", re->id, re->device_uuid);
    if (d < 0)
        return;
    if (re->ipc_handle.len != GPU_IPC_HANDLE_BYTES) {
        send_error(s, ATTNSTAT__CODE__BAD_REQUEST, 1, re->id,
                   "event %u: ipc_handle must be %d bytes (cudaIpcEventHandle_t), not %zu", re->id,
                   GPU_IPC_HANDLE_BYTES, re->ipc_handle.len);
        return;
    }
    if (s->nevs == s->capevs) {
        uint32_t ncap = s->capevs ? s->capevs * 2 : 32;
        struct session_event *ne = realloc(s->evs, ncap * sizeof *ne);
        if (!ne) {
            send_error(s, ATTNSTAT__CODE__INTERNAL, 1, re->id, "event %u: out of memory", re->id);
            return;
        }
        s->evs = ne;
        s->capevs = ncap;
    }
    gpu_event *e = gpu_event_new(s->srv->gpu_c[d], re->ipc_handle.data);
    if (!e) {
        send_error(s, ATTNSTAT__CODE__INTERNAL, 1, re->id, "event %u: out of memory", re->id);
        return;
    }
    struct session_event *se = &s->evs[s->nevs++];
    se->id = re->id;
    se->device = d;
    se->ev = e;
}

static void on_register_buffer(session *s, const Attnstat__RegisterBuffer *rb)
{
    const cfg *c = s->srv->cfg;
    if (!s->hello) {
        send_error(s, ATTNSTAT__CODE__NO_HELLO, 1, rb->id, "RegisterBuffer %u before Hello", rb->id);
        return;
    }
    if (rb->kind != ATTNSTAT__BUFFER_KIND__HOST_SHM && rb->kind != ATTNSTAT__BUFFER_KIND__CUDA_IPC) {
        send_error(s, ATTNSTAT__CODE__BAD_REQUEST, 1, rb->id,
                   "buffer %u: kind %d is not a buffer kind (HOST_SHM=1, CUDA_IPC=2)", rb->id,
                   (int)rb->kind);
        return;
    }
    if (find_buf(s, rb->id)) {
        send_error(s, ATTNSTAT__CODE__BAD_REQUEST, 1, rb->id,
                   "buffer id %u is already registered on this connection (Forget it first)", rb->id);
        return;
    }
    if (s->nbufs >= c->max_buffers) {
        send_error(s, ATTNSTAT__CODE__BUSY, 1, rb->id,
                   "buffer %u: this connection already has %u buffers (max_buffers)", rb->id, s->nbufs);
        return;
    }
    if (rb->size == 0 || rb->size > c->max_buffer_bytes) {
        send_error(s, ATTNSTAT__CODE__BAD_REQUEST, 1, rb->id,
                   "buffer %u: size %llu must be in [1, %llu] (max_buffer_bytes)", rb->id,
                   (unsigned long long)rb->size, (unsigned long long)c->max_buffer_bytes);
        return;
    }
    if (rb->kind == ATTNSTAT__BUFFER_KIND__CUDA_IPC) {
        register_cuda_buffer(s, rb);
        return;
    }
    char msg[300];
    if (validate_shm_name(rb->shm_name, msg, sizeof msg) != 0) {
        send_error(s, ATTNSTAT__CODE__BAD_REQUEST, 1, rb->id, "buffer %u: %s", rb->id, msg);
        return;
    }
    /* O_NONBLOCK: this runs on the loop thread, and opening a FIFO (or a device) a client put in
     * /dev/shm would otherwise block the whole daemon until a writer shows up. Only a regular
     * file is accepted, checked right after the open and before anything else reads it. */
    int fd = shm_open(rb->shm_name, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK, 0);
    if (fd < 0) {
        int e = errno;
        if (e == EMFILE || e == ENFILE) {
            LOG_WARN("session", "client %llu: buffer %u: shm_open(%s): %s (every registered buffer "
                     "holds a file descriptor: raise the open-file limit, e.g. LimitNOFILE in the "
                     "systemd unit, or lower max_buffers / max_clients)",
                     (unsigned long long)s->conn_id, rb->id, rb->shm_name, strerror(e));
            send_error(s, ATTNSTAT__CODE__BUSY, 1, rb->id, "buffer %u: shm_open(%s): %s (the daemon "
                       "is out of file descriptors)", rb->id, rb->shm_name, strerror(e));
            return;
        }
        send_error(s, ATTNSTAT__CODE__BAD_REQUEST, 1, rb->id, "buffer %u: shm_open(%s): %s", rb->id,
                   rb->shm_name, strerror(e));
        return;
    }
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        send_error(s, ATTNSTAT__CODE__INTERNAL, 1, rb->id, "buffer %u: fstat(%s): %s", rb->id,
                   rb->shm_name, strerror(errno));
        close(fd);
        return;
    }
    if (!S_ISREG(sb.st_mode)) {
        send_error(s, ATTNSTAT__CODE__BAD_REQUEST, 1, rb->id,
                   "buffer %u: shm %s is not a regular file (a shared-memory segment made with "
                   "shm_open/ftruncate is)", rb->id, rb->shm_name);
        close(fd);
        return;
    }
    int fl = fcntl(fd, F_GETFL);
    if (fl < 0 || fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) != 0) {
        send_error(s, ATTNSTAT__CODE__INTERNAL, 1, rb->id, "buffer %u: fcntl(%s): %s", rb->id,
                   rb->shm_name, strerror(errno));
        close(fd);
        return;
    }
    uid_t peer = s->c ? s->c->uid : 0;
    if (peer != 0 && sb.st_uid != peer) {
        send_error(s, ATTNSTAT__CODE__PERMISSION, 1, rb->id,
                   "buffer %u: shm %s belongs to uid %u, not to the connecting uid %u", rb->id,
                   rb->shm_name, (unsigned)sb.st_uid, (unsigned)peer);
        close(fd);
        return;
    }
    if ((uint64_t)sb.st_size < rb->size) {
        send_error(s, ATTNSTAT__CODE__BAD_REQUEST, 1, rb->id,
                   "buffer %u: shm %s is %lld bytes, smaller than the registered size %llu", rb->id,
                   rb->shm_name, (long long)sb.st_size, (unsigned long long)rb->size);
        close(fd);
        return;
    }
    void *addr = mmap(NULL, rb->size, PROT_READ, MAP_SHARED, fd, 0);
    if (addr == MAP_FAILED) {
        send_error(s, ATTNSTAT__CODE__INTERNAL, 1, rb->id, "buffer %u: mmap of %s (%llu bytes): %s",
                   rb->id, rb->shm_name, (unsigned long long)rb->size, strerror(errno));
        close(fd);
        return;
    }
    session_map *m = calloc(1, sizeof *m);
    if (s->nbufs == s->capbufs) {
        uint32_t ncap = s->capbufs ? s->capbufs * 2 : 8;
        struct session_buf *nb = m ? realloc(s->bufs, ncap * sizeof *nb) : NULL;
        if (nb) {
            s->bufs = nb;
            s->capbufs = ncap;
        } else {
            free(m);
            m = NULL;
        }
    }
    if (!m) {
        munmap(addr, rb->size);
        close(fd);
        send_error(s, ATTNSTAT__CODE__INTERNAL, 1, rb->id, "buffer %u: out of memory", rb->id);
        return;
    }
    m->refs = 1;
    m->fd = fd;
    m->addr = addr;
    m->size = rb->size;
    snprintf(m->name, sizeof m->name, "%s", rb->shm_name);
    struct session_buf *b = &s->bufs[s->nbufs++];
    b->id = rb->id;
    b->map = m;
    b->gm = NULL;
    b->vb.kind = ATTNSTAT__BUFFER_KIND__HOST_SHM;
    b->vb.size = rb->size;
    b->vb.base = addr;
    b->vb.device = -1;
    LOG_DEBUG("session", "client %llu: buffer %u = shm %s, %llu bytes", (unsigned long long)s->conn_id,
              rb->id, rb->shm_name, (unsigned long long)rb->size);
}

static void on_forget(session *s, const Attnstat__Forget *f)
{
    if (!s->hello) {
        send_error(s, ATTNSTAT__CODE__NO_HELLO, 0, 0, "Forget before Hello");
        return;
    }
    if (f->has_buffer_id) {
        struct session_buf *b = find_buf(s, f->buffer_id);
        if (!b) {
            send_error(s, ATTNSTAT__CODE__UNKNOWN_BUFFER, 1, f->buffer_id,
                       "Forget: buffer %u is not registered", f->buffer_id);
        } else {
            buf_unref(b);
            *b = s->bufs[--s->nbufs];
        }
    }
    if (f->has_event_id) {
        struct session_event *e = find_event(s, f->event_id);
        if (!e) {
            send_error(s, ATTNSTAT__CODE__UNKNOWN_BUFFER, 1, f->event_id,
                       "Forget: event %u is not registered", f->event_id);
        } else {
            gpu_event_unref(e->ev);
            *e = s->evs[--s->nevs];
        }
    }
    if (!f->has_buffer_id && !f->has_event_id)
        send_error(s, ATTNSTAT__CODE__BAD_REQUEST, 0, 0, "Forget names neither buffer_id nor event_id");
}

/* ---- Push ----------------------------------------------------------------------------------- */

void session_push_unmap(session_push *p)
{
    if (p->computing) {
        p->computing = 0;
        p->s->computing--;
    }
    for (int i = 0; i < p->nmaps; i++)
        map_unref(p->maps[i]);
    p->nmaps = 0;
    gpu_refs_drop(&p->gref);
    for (int i = 0; i < p->gref.n; i++)
        gpu_mem_unref(p->gref.mem[i]);
    p->gref.n = 0;
    if (p->gref.ev)
        gpu_event_unref(p->gref.ev);
    p->gref.ev = NULL;
}

void session_push_free(session_push *p)
{
    session_push_unmap(p);
    validate_plan_free(&p->plan);
    free(p->job.heads);
    session *s = p->s;
    s->inflight--;
    free(p);
    session_unref(s);
}

static void on_push(session *s, const Attnstat__Push *push)
{
    server *srv = s->srv;
    const cfg *c = srv->cfg;
    metrics_count_push(&srv->m);
    s->pushes++;
    if (!s->hello) {
        srv->m.rejected++;
        s->rejected++;
        ack_now(s, push->seq, ATTNSTAT__CODE__NO_HELLO, "Push before Hello");
        return;
    }
    if (srv->stopping) {
        srv->m.dropped++;
        s->dropped++;
        ack_now(s, push->seq, ATTNSTAT__CODE__DROPPED, "the daemon is shutting down");
        return;
    }
    validate_limits lim = {.max_push_work = c->max_push_work,
                           .collapse_threshold = (float)s->th.collapse_threshold};
    session_push *p = calloc(1, sizeof *p);
    if (!p) {
        srv->m.failed++;
        ack_now(s, push->seq, ATTNSTAT__CODE__INTERNAL, "out of memory");
        return;
    }
    char msg[512];
    Attnstat__Code code = validate_push(push, lookup_buf, s, &lim, &p->plan, msg, sizeof msg);
    if (code != ATTNSTAT__CODE__OK) {
        free(p);
        srv->m.rejected++;
        s->rejected++;
        LOG_DEBUG("session", "client %llu: push %llu rejected: %s", (unsigned long long)s->conn_id,
                  (unsigned long long)push->seq, msg);
        ack_now(s, push->seq, code, msg);
        return;
    }
    if (s->computing >= c->client_inflight) {
        validate_plan_free(&p->plan);
        free(p);
        srv->m.dropped++;
        s->dropped++;
        snprintf(msg, sizeof msg, "dropped: this client already has %u pushes queued or "
                 "computing (client_inflight)", s->computing);
        ack_now(s, push->seq, ATTNSTAT__CODE__DROPPED, msg);
        return;
    }
    p->job.prob = p->plan.prob;
    p->job.heads = calloc((size_t)p->plan.prob.heads_q, sizeof(stats_head));
    if (!p->job.heads) {
        validate_plan_free(&p->plan);
        free(p);
        srv->m.failed++;
        ack_now(s, push->seq, ATTNSTAT__CODE__INTERNAL, "out of memory");
        return;
    }
    p->s = s;
    s->refs++;
    s->inflight++;
    p->seq = push->seq;
    p->step = push->step;
    p->layer = push->layer;
    p->want_results = push->want_results;
    p->received_ns = worker_now_ns();
    p->time_ms = (int64_t)metrics_now_ms();
    worker *target = srv->cpu;
    if (p->plan.kind == ATTNSTAT__BUFFER_KIND__CUDA_IPC) {
        int d = p->plan.device;
        struct session_event *ev = push->has_event_id ? find_event(s, push->event_id) : NULL;
        const char *bad = NULL;
        if (push->has_event_id && !ev)
            bad = "is not a registered event (RegisterEvent it first)";
        else if (ev && ev->device != d)
            bad = "is on another device than the push's tensors";
        if (bad || !srv->gpu_w[d]) {
            Attnstat__Code code2 = bad ? ATTNSTAT__CODE__UNKNOWN_BUFFER : ATTNSTAT__CODE__INTERNAL;
            if (bad)
                snprintf(msg, sizeof msg, "event_id %u %s", push->event_id, bad);
            else
                snprintf(msg, sizeof msg, "device %s has no worker", srv->gpus[d].uuid);
            srv->m.rejected++;
            s->rejected++;
            ack_now(s, push->seq, code2, msg);
            session_push_free(p);
            return;
        }
        target = srv->gpu_w[d];
        for (int i = 0; i < p->plan.ntensors; i++) {
            p->gref.mem[i] = find_buf(s, p->plan.buffer_id[i])->gm;
            gpu_mem_ref(p->gref.mem[i]);
            p->gref.off[i] = p->plan.offset[i];
            p->gref.need[i] = p->plan.need_bytes[i];
        }
        p->gref.n = p->plan.ntensors;
        if (ev) {
            p->gref.ev = ev->ev;
            gpu_event_ref(ev->ev);
        }
        p->gref.client_gone = &s->gone;
        p->job.ext = &p->gref;
    }
    for (int i = 0; i < p->plan.ntensors && target == srv->cpu; i++) {
        session_map *m = find_buf(s, p->plan.buffer_id[i])->map;
        int j = 0;
        while (j < p->nmaps && p->maps[j] != m)
            j++;
        if (j == p->nmaps) {
            p->maps[p->nmaps++] = m;
            m->refs++;
            p->job.guard_fd[j] = m->fd;
            p->job.guard_bytes[j] = 0;
            p->job.nguards = p->nmaps;
        }
        if (p->plan.need_bytes[i] > p->job.guard_bytes[j])
            p->job.guard_bytes[j] = p->plan.need_bytes[i];
    }
    /* Routing: host buffers go to the CPU worker; device buffers to their device's. */
    if (target != srv->cpu)
        gpu_refs_hold(&p->gref); /* keeps its buffers mapped until the worker is done with it */
    if (worker_submit(target, &p->job) != 0) {
        srv->m.dropped++;
        s->dropped++;
        worker_stats ws;
        worker_stats_of(target, &ws);
        snprintf(msg, sizeof msg, "dropped: the %s worker's queue is full (%u of %u); not computed",
                 ws.name ? ws.name : "cpu", ws.queue_depth, ws.capacity);
        ack_now(s, push->seq, ATTNSTAT__CODE__DROPPED, msg);
        session_push_free(p);
        return;
    }
    p->computing = 1;
    s->computing++;
}

/* ---- dispatch ------------------------------------------------------------------------------- */

static void session_dispatch(session *s, const Attnstat__Envelope *env);

void session_handle(session *s, const Attnstat__Envelope *env)
{
    /* Any reply can close the connection (server_send closes one whose queue is far over its cap),
     * and closing drops the connection's reference: hold one for the whole handler so that the
     * session outlives it. After such a close, s->c is NULL and the buffers are forgotten, so the
     * rest of the handler sends nothing and finds nothing. */
    s->refs++;
    session_dispatch(s, env);
    session_unref(s);
}

static void session_dispatch(session *s, const Attnstat__Envelope *env)
{
    switch (env->msg_case) {
    case ATTNSTAT__ENVELOPE__MSG_HELLO:
        on_hello(s, env->hello);
        break;
    case ATTNSTAT__ENVELOPE__MSG_REGISTER_BUFFER:
        on_register_buffer(s, env->register_buffer);
        break;
    case ATTNSTAT__ENVELOPE__MSG_REGISTER_EVENT:
        if (!s->hello)
            send_error(s, ATTNSTAT__CODE__NO_HELLO, 1, env->register_event->id,
                       "RegisterEvent %u before Hello", env->register_event->id);
        else
            on_register_event(s, env->register_event);
        break;
    case ATTNSTAT__ENVELOPE__MSG_FORGET:
        on_forget(s, env->forget);
        break;
    case ATTNSTAT__ENVELOPE__MSG_PUSH:
        on_push(s, env->push);
        break;
    case ATTNSTAT__ENVELOPE__MSG_SUBSCRIBE:
        if (s->c) {
            s->c->sub_alerts = env->subscribe->alerts;
            s->c->sub_results = env->subscribe->results;
            LOG_INFO("session", "client %llu subscribed (alerts %d, results %d)",
                     (unsigned long long)s->conn_id, s->c->sub_alerts, s->c->sub_results);
        }
        break;
    case ATTNSTAT__ENVELOPE__MSG_STATUS:
        if (s->c)
            pipeline_send_status(s->srv->pipe, s->c);
        break;
    case ATTNSTAT__ENVELOPE__MSG_HELLO_REPLY:
    case ATTNSTAT__ENVELOPE__MSG_RELEASE:
    case ATTNSTAT__ENVELOPE__MSG_ACK:
    case ATTNSTAT__ENVELOPE__MSG_ALERT:
    case ATTNSTAT__ENVELOPE__MSG_RESULT:
    case ATTNSTAT__ENVELOPE__MSG_STATUS_REPLY:
    case ATTNSTAT__ENVELOPE__MSG_ERROR:
        send_error(s, ATTNSTAT__CODE__BAD_REQUEST, 0, 0,
                   "message type %d is sent by the daemon, not to it", (int)env->msg_case);
        break;
    default:
        send_error(s, ATTNSTAT__CODE__BAD_REQUEST, 0, 0,
                   "unknown or empty message (no known field of Envelope is set): this daemon speaks "
                   "protocol version %u", FRAME_PROTOCOL_VERSION);
        break;
    }
}
