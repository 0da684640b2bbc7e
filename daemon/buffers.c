/* buffers.c — one client's registrations (see buffers.h). Stage: buffers; calls devices,
 * gpu_worker, validate, util and log. Every refusal returns the code and a message naming the
 * buffer or event and what was wrong. */
#include "buffers.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "devices.h"
#include "log.h"
#include "util.h"

#define BUFFERS_MAX_EVENTS 4096

/* Writes the message to msg[msglen] (in scope wherever it is used) and evaluates to code. */
#define FAIL(code, ...) (util_err(msg, msglen, __VA_ARGS__), (code))

struct buffers_map {
    int refs;                /* the registration + each push reading it */
    int fd;                  /* kept open: workers fstat it to notice a shrunk segment */
    void *addr;
    uint64_t size;
    char name[256];
};

typedef struct {
    uint32_t id;
    buffers_map *map;        /* HOST_SHM */
    gpu_mem *gm;             /* CUDA_IPC */
    validate_buffer vb;
} buf;

typedef struct {
    uint32_t id;
    int device;              /* index among the devices */
    gpu_event *ev;
} event;

struct buffers {
    buf *bufs;
    uint32_t nbufs, capbufs;
    event *evs;
    uint32_t nevs, capevs;
};

buffers *buffers_new(void)
{
    return calloc(1, sizeof(buffers));
}

void buffers_map_ref(buffers_map *m)
{
    m->refs++;
}

void buffers_map_unref(buffers_map *m)
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

int buffers_map_fd(const buffers_map *m)
{
    return m->fd;
}

static void buf_unref(buf *b)
{
    if (b->map)
        buffers_map_unref(b->map);
    if (b->gm)
        gpu_mem_unref(b->gm);
}

void buffers_forget_all(buffers *b)
{
    for (uint32_t i = 0; i < b->nbufs; i++)
        buf_unref(&b->bufs[i]);
    b->nbufs = 0;
    for (uint32_t i = 0; i < b->nevs; i++)
        gpu_event_unref(b->evs[i].ev);
    b->nevs = 0;
}

void buffers_free(buffers *b)
{
    if (!b)
        return;
    buffers_forget_all(b);
    free(b->bufs);
    free(b->evs);
    free(b);
}

static buf *find_buf(buffers *b, uint32_t id)
{
    for (uint32_t i = 0; i < b->nbufs; i++)
        if (b->bufs[i].id == id)
            return &b->bufs[i];
    return NULL;
}

static event *find_event(buffers *b, uint32_t id)
{
    for (uint32_t i = 0; i < b->nevs; i++)
        if (b->evs[i].id == id)
            return &b->evs[i];
    return NULL;
}

const validate_buffer *buffers_lookup(void *ctx, uint32_t id)
{
    buf *b = find_buf(ctx, id);
    return b ? &b->vb : NULL;
}

buffers_map *buffers_host_map(buffers *b, uint32_t id)
{
    buf *f = find_buf(b, id);
    return f ? f->map : NULL;
}

gpu_mem *buffers_device_mem(buffers *b, uint32_t id)
{
    buf *f = find_buf(b, id);
    return f ? f->gm : NULL;
}

gpu_event *buffers_event(buffers *b, uint32_t id, int *device)
{
    event *e = find_event(b, id);
    if (!e)
        return NULL;
    *device = e->device;
    return e->ev;
}

/* A registration, in room grow_bufs() made. */
static void add_buf(buffers *b, uint32_t id, buffers_map *map, gpu_mem *gm, int kind, uint64_t size,
                    const void *base, int device)
{
    buf *f = &b->bufs[b->nbufs++];
    f->id = id;
    f->map = map;
    f->gm = gm;
    f->vb.kind = kind;
    f->vb.size = size;
    f->vb.base = base;
    f->vb.device = device;
}

static int grow_bufs(buffers *b)
{
    if (b->nbufs < b->capbufs)
        return 0;
    uint32_t ncap = b->capbufs ? b->capbufs * 2 : 8;
    buf *nb = realloc(b->bufs, ncap * sizeof *nb);
    if (!nb)
        return -1;
    b->bufs = nb;
    b->capbufs = ncap;
    return 0;
}

/* ---- CUDA ----------------------------------------------------------------------------------- */

/* The local device (index) a CUDA registration names, its worker started; -1 with *code and msg
 * set otherwise. */
static int cuda_device_for(const stage_ctx *x, const char *what, uint32_t id, const char *uuid,
                           Attnstat__Code *code, char *msg, size_t msglen)
{
    devices *dev = x->dev;
    if (devices_count(dev) == 0) {
        *code = FAIL(ATTNSTAT__CODE__UNSUPPORTED,
                     "%s %u: CUDA_IPC needs a GPU worker and this daemon has none (%s); push host "
                     "tensors, or run attnstatd on the GPU's host with a CUDA build", what, id,
                     devices_why(dev));
        return -1;
    }
    if (!uuid || !uuid[0]) {
        *code = FAIL(ATTNSTAT__CODE__BAD_REQUEST, "%s %u: device_uuid is missing", what, id);
        return -1;
    }
    int d = devices_find(dev, uuid);
    if (d < 0) {
        char local[GPU_MAX_LOCAL * 48] = "";
        for (int i = 0; i < devices_count(dev); i++)
            snprintf(local + strlen(local), sizeof local - strlen(local), "%s%s", i ? ", " : "",
                     devices_info(dev, i)->uuid);
        *code = FAIL(ATTNSTAT__CODE__UNSUPPORTED,
                     "%s %u: device %s is not a GPU this daemon serves (it has: %s)", what, id, uuid,
                     local);
        return -1;
    }
    char err[300];
    if (!devices_gpu_worker(dev, d, err, sizeof err)) {
        *code = FAIL(ATTNSTAT__CODE__INTERNAL, "%s %u: %s", what, id, err);
        return -1;
    }
    return d;
}

/* RegisterBuffer CUDA_IPC (checked so far: unique id, count, size). The handle is opened later,
 * on the device's worker thread, at the first push that reads it. */
static Attnstat__Code register_cuda(buffers *b, const stage_ctx *x, const Attnstat__RegisterBuffer *rb,
                                    uint64_t conn_id, char *msg, size_t msglen)
{
    Attnstat__Code code;
    int d = cuda_device_for(x, "buffer", rb->id, rb->device_uuid, &code, msg, msglen);
    if (d < 0)
        return code;
    if (!rb->has_ipc_handle || rb->ipc_handle.len != GPU_IPC_HANDLE_BYTES)
        return FAIL(ATTNSTAT__CODE__BAD_REQUEST,
                    "buffer %u: a CUDA_IPC buffer needs ipc_handle of %d bytes (cudaIpcMemHandle_t), "
                    "not %zu", rb->id, GPU_IPC_HANDLE_BYTES,
                    rb->has_ipc_handle ? rb->ipc_handle.len : (size_t)0);
    gpu_mem *m = gpu_mem_new(devices_gpu_ctx(x->dev, d), rb->ipc_handle.data, rb->size);
    if (!m || grow_bufs(b) != 0) {
        if (m)
            gpu_mem_unref(m);
        return FAIL(ATTNSTAT__CODE__INTERNAL, "buffer %u: out of memory", rb->id);
    }
    add_buf(b, rb->id, NULL, m, ATTNSTAT__BUFFER_KIND__CUDA_IPC, rb->size, NULL, d);
    LOG_DEBUG("session", "client %llu: buffer %u = CUDA IPC on %s, %llu bytes",
              (unsigned long long)conn_id, rb->id, devices_info(x->dev, d)->uuid,
              (unsigned long long)rb->size);
    return ATTNSTAT__CODE__OK;
}

Attnstat__Code buffers_register_event(buffers *b, const stage_ctx *x, const Attnstat__RegisterEvent *re,
                                      char *msg, size_t msglen)
{
    if (find_event(b, re->id))
        return FAIL(ATTNSTAT__CODE__BAD_REQUEST,
                    "event id %u is already registered on this connection (Forget it first)", re->id);
    if (b->nevs >= BUFFERS_MAX_EVENTS)
        return FAIL(ATTNSTAT__CODE__BUSY, "event %u: this connection already has %u events", re->id,
                    b->nevs);
    Attnstat__Code code;
    int d = cuda_device_for(x, "event", re->id, re->device_uuid, &code, msg, msglen);
    if (d < 0)
        return code;
    if (re->ipc_handle.len != GPU_IPC_HANDLE_BYTES)
        return FAIL(ATTNSTAT__CODE__BAD_REQUEST,
                    "event %u: ipc_handle must be %d bytes (cudaIpcEventHandle_t), not %zu", re->id,
                    GPU_IPC_HANDLE_BYTES, re->ipc_handle.len);
    if (b->nevs == b->capevs) {
        uint32_t ncap = b->capevs ? b->capevs * 2 : 32;
        event *ne = realloc(b->evs, ncap * sizeof *ne);
        if (!ne)
            return FAIL(ATTNSTAT__CODE__INTERNAL, "event %u: out of memory", re->id);
        b->evs = ne;
        b->capevs = ncap;
    }
    gpu_event *e = gpu_event_new(devices_gpu_ctx(x->dev, d), re->ipc_handle.data);
    if (!e)
        return FAIL(ATTNSTAT__CODE__INTERNAL, "event %u: out of memory", re->id);
    event *ev = &b->evs[b->nevs++];
    ev->id = re->id;
    ev->device = d;
    ev->ev = e;
    return ATTNSTAT__CODE__OK;
}

/* ---- shared memory -------------------------------------------------------------------------- */

/* RegisterBuffer HOST_SHM (checked so far: unique id, count, size). */
static Attnstat__Code register_shm(buffers *b, const Attnstat__RegisterBuffer *rb, uid_t peer_uid,
                                   uint64_t conn_id, char *msg, size_t msglen)
{
    char why[300];
    if (validate_shm_name(rb->shm_name, why, sizeof why) != 0)
        return FAIL(ATTNSTAT__CODE__BAD_REQUEST, "buffer %u: %s", rb->id, why);
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
                     (unsigned long long)conn_id, rb->id, rb->shm_name, strerror(e));
            return FAIL(ATTNSTAT__CODE__BUSY, "buffer %u: shm_open(%s): %s (the daemon is out of "
                        "file descriptors)", rb->id, rb->shm_name, strerror(e));
        }
        return FAIL(ATTNSTAT__CODE__BAD_REQUEST, "buffer %u: shm_open(%s): %s", rb->id,
                    rb->shm_name, strerror(e));
    }
    Attnstat__Code code = ATTNSTAT__CODE__OK;
    struct stat sb;
    int fl;
    void *addr = MAP_FAILED;
    if (fstat(fd, &sb) != 0)
        code = FAIL(ATTNSTAT__CODE__INTERNAL, "buffer %u: fstat(%s): %s", rb->id, rb->shm_name,
                    strerror(errno));
    else if (!S_ISREG(sb.st_mode))
        code = FAIL(ATTNSTAT__CODE__BAD_REQUEST,
                    "buffer %u: shm %s is not a regular file (a shared-memory segment made with "
                    "shm_open/ftruncate is)", rb->id, rb->shm_name);
    else if ((fl = fcntl(fd, F_GETFL)) < 0 || fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) != 0)
        code = FAIL(ATTNSTAT__CODE__INTERNAL, "buffer %u: fcntl(%s): %s", rb->id, rb->shm_name,
                    strerror(errno));
    else if (peer_uid != 0 && sb.st_uid != peer_uid)
        code = FAIL(ATTNSTAT__CODE__PERMISSION,
                    "buffer %u: shm %s belongs to uid %u, not to the connecting uid %u", rb->id,
                    rb->shm_name, (unsigned)sb.st_uid, (unsigned)peer_uid);
    else if ((uint64_t)sb.st_size < rb->size)
        code = FAIL(ATTNSTAT__CODE__BAD_REQUEST,
                    "buffer %u: shm %s is %lld bytes, smaller than the registered size %llu", rb->id,
                    rb->shm_name, (long long)sb.st_size, (unsigned long long)rb->size);
    else if ((addr = mmap(NULL, rb->size, PROT_READ, MAP_SHARED, fd, 0)) == MAP_FAILED)
        code = FAIL(ATTNSTAT__CODE__INTERNAL, "buffer %u: mmap of %s (%llu bytes): %s", rb->id,
                    rb->shm_name, (unsigned long long)rb->size, strerror(errno));
    if (code != ATTNSTAT__CODE__OK) {
        close(fd);
        return code;
    }
    buffers_map *m = calloc(1, sizeof *m);
    if (!m || grow_bufs(b) != 0) {
        free(m);
        munmap(addr, rb->size);
        close(fd);
        return FAIL(ATTNSTAT__CODE__INTERNAL, "buffer %u: out of memory", rb->id);
    }
    m->refs = 1;
    m->fd = fd;
    m->addr = addr;
    m->size = rb->size;
    snprintf(m->name, sizeof m->name, "%s", rb->shm_name);
    add_buf(b, rb->id, m, NULL, ATTNSTAT__BUFFER_KIND__HOST_SHM, rb->size, addr, -1);
    LOG_DEBUG("session", "client %llu: buffer %u = shm %s, %llu bytes", (unsigned long long)conn_id,
              rb->id, rb->shm_name, (unsigned long long)rb->size);
    return ATTNSTAT__CODE__OK;
}

Attnstat__Code buffers_register(buffers *b, const stage_ctx *x, const Attnstat__RegisterBuffer *rb,
                                uid_t peer_uid, uint64_t conn_id, char *msg, size_t msglen)
{
    const cfg *c = x->cfg;
    if (rb->kind != ATTNSTAT__BUFFER_KIND__HOST_SHM && rb->kind != ATTNSTAT__BUFFER_KIND__CUDA_IPC)
        return FAIL(ATTNSTAT__CODE__BAD_REQUEST,
                    "buffer %u: kind %d is not a buffer kind (HOST_SHM=1, CUDA_IPC=2)", rb->id,
                    (int)rb->kind);
    if (find_buf(b, rb->id))
        return FAIL(ATTNSTAT__CODE__BAD_REQUEST,
                    "buffer id %u is already registered on this connection (Forget it first)",
                    rb->id);
    if (b->nbufs >= c->max_buffers)
        return FAIL(ATTNSTAT__CODE__BUSY,
                    "buffer %u: this connection already has %u buffers (max_buffers)", rb->id,
                    b->nbufs);
    if (rb->size == 0 || rb->size > c->max_buffer_bytes)
        return FAIL(ATTNSTAT__CODE__BAD_REQUEST,
                    "buffer %u: size %llu must be in [1, %llu] (max_buffer_bytes)", rb->id,
                    (unsigned long long)rb->size, (unsigned long long)c->max_buffer_bytes);
    if (rb->kind == ATTNSTAT__BUFFER_KIND__CUDA_IPC)
        return register_cuda(b, x, rb, conn_id, msg, msglen);
    return register_shm(b, rb, peer_uid, conn_id, msg, msglen);
}

Attnstat__Code buffers_forget_buffer(buffers *b, uint32_t id, char *msg, size_t msglen)
{
    buf *f = find_buf(b, id);
    if (!f)
        return FAIL(ATTNSTAT__CODE__UNKNOWN_BUFFER, "Forget: buffer %u is not registered", id);
    buf_unref(f);
    *f = b->bufs[--b->nbufs];
    return ATTNSTAT__CODE__OK;
}

Attnstat__Code buffers_forget_event(buffers *b, uint32_t id, char *msg, size_t msglen)
{
    event *e = find_event(b, id);
    if (!e)
        return FAIL(ATTNSTAT__CODE__UNKNOWN_BUFFER, "Forget: event %u is not registered", id);
    gpu_event_unref(e->ev);
    *e = b->evs[--b->nevs];
    return ATTNSTAT__CODE__OK;
}
