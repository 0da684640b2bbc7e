/* attnstat.h — libattnstat, the client library a training process links to hand its attention
 * tensors (Q, K and optionally V) to the attnstatd daemon, which computes per-(layer, head)
 * attention entropy and max-logit statistics, stores their history and raises alerts.
 *
 * What the library promises
 *   - A push never blocks the caller. The socket is non-blocking; tensors are copied into a
 *     shared-memory ring registered once with the daemon; when the ring has no room, or the
 *     bounded outgoing queue cannot take the frame, the push is dropped, counted, and returns
 *     ATTNSTAT_DROPPED. Telemetry never stalls training.
 *   - Host tensors are copied compactly: only the bytes the shape and strides describe (strided
 *     rows are gathered). A tensor whose elements tile a dense block in any dimension order is
 *     copied with one memcpy and sent with its own strides.
 *   - The caller's memory is not referenced after attnstat_push() returns (host path).
 *   - No global state: every piece of state lives in an attnstat_client. A client is
 *     thread-compatible, not thread-safe: use one client per thread, or serialise every call on a
 *     client with your own lock. Callbacks run inside attnstat_poll(), attnstat_flush(),
 *     attnstat_status() and attnstat_push() on the calling thread; they must not call back into the
 *     same client.
 *   - The library never exits, aborts or raises signals (sockets are written with MSG_NOSIGNAL).
 *     Every failing call returns an attnstat_code and leaves a sentence in attnstat_last_error().
 *   - A daemon restart does not end monitoring: the library reconnects on its own, inside the calls
 *     the caller already makes, and resumes the run (see "Daemon restarts" at the end).
 *
 * Lifetime
 *     attnstat_client *c;
 *     attnstat_error err;
 *     if (attnstat_connect(NULL, &c, &err) != ATTNSTAT_OK) { fprintf(stderr, "%s\n", err.msg); ... }
 *     attnstat_hello(c, "my-run", rank, NULL, NULL);          // registers the ring
 *     for each step, layer:
 *         attnstat_push(c, &opts, &q, &k, NULL);              // OK or DROPPED: never blocks
 *         attnstat_poll(c, 0);                                // optional: process replies
 *     attnstat_flush(c, 10000);                               // wait for every Ack
 *     attnstat_close(c);
 *
 * ABI. Structs are plain C with fixed-width fields so that a ctypes binding can mirror them;
 * initialise each with its *_init() function before filling it in. Tensors carry a memory kind:
 * ATTNSTAT_MEM_HOST (copied into the shared-memory ring) or ATTNSTAT_MEM_CUDA (device memory, see
 * "GPU path" below; ATTNSTAT_ENOTSUP when the library was built without CUDA or the machine has
 * no CUDA driver). Fields added later go at the end of a struct; functions are only added. */
#ifndef ATTNSTAT_H
#define ATTNSTAT_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The version of attnstat: the one place it is written. The build reads it from this line (the
 * library's soname, the daemon, the CLI, the Debian packages, the Python package); keep its form. */
#define ATTNSTAT_VERSION "0.1.0"

/* ---- Results --------------------------------------------------------------------------------- */
typedef enum {
    ATTNSTAT_OK = 0,
    ATTNSTAT_DROPPED = 1,    /* push not sent (ring full or outgoing queue full); counted */
    ATTNSTAT_EINVAL = 2,     /* a bad argument; the message names it */
    ATTNSTAT_ENOMEM = 3,     /* an allocation failed */
    ATTNSTAT_ECONNECT = 4,   /* cannot reach the daemon's socket (not running? wrong path?) */
    ATTNSTAT_ECLOSED = 5,    /* the connection was lost or closed by the daemon */
    ATTNSTAT_EIO = 6,        /* a system call failed (shared memory, socket); errno text in message */
    ATTNSTAT_EPROTO = 7,     /* the daemon sent something this library cannot understand */
    ATTNSTAT_EREFUSED = 8,   /* the daemon answered with an error (version, permission, limits) */
    ATTNSTAT_ETIMEDOUT = 9,  /* the wait ran out before the daemon answered */
    ATTNSTAT_ESTATE = 10,    /* call out of order (e.g. push before hello) */
    ATTNSTAT_ENOTSUP = 11,   /* valid, but this build cannot do it (e.g. CUDA tensors) */
    ATTNSTAT_ELOST = 12,     /* attnstat_flush: pushes sent were abandoned when the connection to the
                                daemon was lost; they will never be acknowledged (see "Daemon
                                restarts") */
} attnstat_code;

/* A short constant name-and-meaning for a code, e.g. "DROPPED: ring or queue full". */
const char *attnstat_strerror(attnstat_code code);

/* Error detail for calls that have no client yet (attnstat_connect). */
typedef struct {
    int32_t code;   /* an attnstat_code */
    char msg[256];
} attnstat_error;

/* ---- Tensors ---------------------------------------------------------------------------------- */
typedef enum {
    ATTNSTAT_F32 = 0,
    ATTNSTAT_F16 = 1,
    ATTNSTAT_BF16 = 2,
    ATTNSTAT_BOOL = 3,      /* masks (attnstat_push2): one byte, nonzero = the key takes part */
    ATTNSTAT_I32 = 4,       /* packed offsets in device memory (attnstat_push2) */
} attnstat_dtype;

typedef enum {
    ATTNSTAT_MEM_HOST = 0,  /* ordinary process memory */
    ATTNSTAT_MEM_CUDA = 1,  /* device memory (the GPU path) */
} attnstat_memkind;

/* A 4-D tensor [B, H, N, D]: element [b,h,n,d] at
 *     (const char *)data + (b*strides[0] + h*strides[1] + n*strides[2] + d*strides[3]) * dtype size
 * Strides are in elements, >= 0, and strides[3] must be 1 (D contiguous); the last element must lie
 * in the address space (a push refuses a tensor whose strides reach past it: EINVAL). Q is
 * [B, Hq, Nq, D], K and V are [B, Hkv, Nk, D] with Hq % Hkv == 0. Packed sequences: B = 1 and
 * the rows of all sequences follow each other along N (see attnstat_push_opts.cu_seqlens_*). */
typedef struct {
    const void *data;
    int32_t dtype;          /* attnstat_dtype */
    int32_t mem;            /* attnstat_memkind */
    int32_t device;         /* CUDA device ordinal (ATTNSTAT_MEM_CUDA), -1: taken from the pointer;
                               ignored for host memory */
    int32_t reserved;
    int64_t shape[4];
    int64_t strides[4];
} attnstat_tensor;

/* Fills t for a tensor stored densely as [B, H, N, D] (strides H*N*D, N*D, D, 1), host memory. */
void attnstat_tensor_init(attnstat_tensor *t, const void *data, attnstat_dtype dtype, int64_t b,
                          int64_t h, int64_t n, int64_t d);

/* Size in bytes of one element, 0 for an unknown dtype. */
size_t attnstat_dtype_size(attnstat_dtype dtype);

/* ---- Push options ----------------------------------------------------------------------------- */
typedef struct {
    int64_t step;
    uint32_t layer;
    int32_t causal;          /* 0/1; bottom-right aligned when Nk > Nq */
    int32_t window_left;     /* < 0: unbounded (default -1) */
    int32_t window_right;    /* < 0: unbounded (default -1) */
    float softcap;           /* 0: off */
    float scale;             /* 0: 1/sqrt(D) */
    uint32_t sample_every;   /* 0/1: every query row; k > 1: rows 0, k, 2k, ... */
    uint32_t sample_rows;    /* 0: off; n > 0: n seeded random rows per sequence */
    uint64_t sample_seed;
    /* Packed sequences: both NULL, or both arrays of n_seqs + 1 offsets (host memory, copied). */
    const int32_t *cu_seqlens_q;
    const int32_t *cu_seqlens_k;
    int32_t n_seqs;
    int32_t want_results;    /* 1: the daemon includes per-head results in the Ack (result callback) */
    void *cuda_stream;       /* CUDA tensors: the stream (cudaStream_t) they were written on; NULL or
                                1: the legacy default stream, 2: the per-thread default stream
                                (the values of __cuda_array_interface__) */
} attnstat_push_opts;

/* Defaults: everything 0/NULL except window_left = window_right = -1. */
void attnstat_push_opts_init(attnstat_push_opts *o);

/* ---- Connection ------------------------------------------------------------------------------- */
typedef struct attnstat_client attnstat_client;

typedef struct {
    const char *socket_path;   /* NULL: attnstat_default_socket() */
    uint64_t ring_bytes;       /* shared-memory ring for host tensors; 0: 64 MiB */
    uint64_t queue_bytes;      /* bound of the outgoing byte queue; 0: 1 MiB */
    int32_t timeout_ms;        /* for connect and hello; 0: 5000 */
} attnstat_connect_opts;

void attnstat_connect_opts_init(attnstat_connect_opts *o);

/* The daemon's socket path by the same rule as attnstatd: $ATTNSTAT_SOCKET, else
 * $XDG_RUNTIME_DIR/attnstat/attnstatd.sock, else /run/attnstat/attnstatd.sock. Writes into buf
 * (at most len bytes, NUL-terminated); returns buf, or NULL when it does not fit. */
char *attnstat_default_socket(char *buf, size_t len);

/* Connects (socket_path NULL: the default). On success *out is a client to be freed with
 * attnstat_close(). On failure *out is NULL and err (may be NULL) says why. */
attnstat_code attnstat_connect(const char *socket_path, attnstat_client **out, attnstat_error *err);
attnstat_code attnstat_connect_ex(const attnstat_connect_opts *opts, attnstat_client **out,
                                  attnstat_error *err);

/* Flags of attnstat_connect2. */
#define ATTNSTAT_CONNECT_BACKGROUND 1u

/* attnstat_connect_ex with flags (0: exactly attnstat_connect_ex; an unknown flag is EINVAL).
 * ATTNSTAT_CONNECT_BACKGROUND: a daemon that is not there yet is not an error. When the socket
 * does not exist, nobody listens on it, its backlog stays full or the connect times out (a trainer
 * that starts before its sidecar, as Kubernetes may order them), the client is returned all the
 * same, not connected: attnstat_link_state says ATTNSTAT_LINK_RECONNECTING ("not connected yet:
 * waiting for attnstatd to start ..."), and the library connects as it reconnects after a daemon
 * restart (see "Daemon restarts": inside the calls the caller makes, attempts 50-100 ms apart at
 * first, the delay doubling up to 5 s). attnstat_hello on a client not connected keeps the hello
 * and returns ATTNSTAT_OK at once (an attempt already under way is given the connect timeout to
 * finish first); the attempt that connects says it, with the layout, the subscription and the
 * ring, and attnstat_run_id() is -1 until then. Pushes meanwhile return ATTNSTAT_DROPPED, counted
 * in dropped_local and dropped_disconnected; the first connection is not counted in reconnects.
 * A daemon that refuses the client when it comes (permission, version, a hello it rejects) closes
 * the link for good (ATTNSTAT_LINK_CLOSED, pushes ATTNSTAT_ECLOSED with its reason). Failures that
 * waiting cannot cure are returned at once, as by attnstat_connect_ex: a socket path too long, or
 * permission denied on the socket (EACCES). Not the default, because a wrong socket path then
 * looks like a daemon that has not started yet: the trainer runs unmonitored, saying so only in
 * attnstat_link_state, the counters and attnstat_last_error. */
attnstat_code attnstat_connect2(const attnstat_connect_opts *opts, uint32_t flags,
                                attnstat_client **out, attnstat_error *err);

/* Alert thresholds sent with the hello; a field left "unset" takes the daemon's configured value.
 * Unset is NaN for the doubles and 0 for the counts (what attnstat_thresholds_init sets). */
typedef struct {
    double entropy_floor;       /* normalised entropy mean, 0..1 */
    double entropy_drop;        /* fraction of the EMA baseline, 0..1 */
    double ema_alpha;           /* baseline smoothing, 0..1 */
    double logit_ceiling;       /* max logit */
    double collapse_threshold;  /* per-row normalised entropy counted as collapsed */
    uint32_t raise_after;       /* consecutive bad samples to raise */
    uint32_t clear_after;       /* consecutive good samples to clear */
    double sink_mass_ceiling;   /* mean attention on the first visible key, 0..1 (1: off) */
    double distance_floor;      /* mean attention distance in positions (0: off) */
} attnstat_thresholds;

void attnstat_thresholds_init(attnstat_thresholds *t);

/* Introduces this process to the daemon and registers the shared-memory ring. Waits (up to the
 * connect timeout) for the daemon's answers: it is a start-up call, not a per-step one. On a
 * client of attnstat_connect2(ATTNSTAT_CONNECT_BACKGROUND) that is not connected, the hello is
 * kept and said when the daemon comes (ATTNSTAT_OK at once; see attnstat_connect2).
 * run: the run name (NULL: the daemon's default); rank: the process's rank; thresholds and
 * config_json (free text stored with the run) may be NULL. Must be called once, before any push.
 * Once the daemon has mapped the ring, its name is removed from /dev/shm: a process that dies
 * leaves nothing behind. */
attnstat_code attnstat_hello(attnstat_client *c, const char *run, int32_t rank,
                             const attnstat_thresholds *thresholds, const char *config_json);

/* ---- Parallel layout ------------------------------------------------------------------------- *
 * Where this process's heads and layers sit in the whole model, and which ranks it is, so that
 * every process of a job (tensor, pipeline, data and context parallelism, on one node or many)
 * lands on one layer x head map with global numbers: the daemon stores query head h of a push as
 * head_offset + h (head_offset -1: tp_rank x the push's query heads, Megatron's contiguous split)
 * and layer l as layer_offset + l. Data-parallel replicas and context-parallel ranks hold the same
 * global heads over other rows; their samples merge exactly (deploy/CLUSTER.md). Give every process
 * of the job the same run name and its own rank (its global rank). */
typedef struct {
    uint32_t size;            /* sizeof(attnstat_layout): attnstat_layout_init sets it */
    int32_t tp_rank, tp_size; /* tensor parallelism (the heads of a layer split) */
    int32_t pp_rank, pp_size; /* pipeline parallelism (the layers split) */
    int32_t dp_rank, dp_size; /* data parallelism (replicas) */
    int32_t cp_rank, cp_size; /* context parallelism (the rows of a sequence split) */
    int32_t layer_offset;     /* global number of this stage's layer 0 */
    int32_t head_offset;      /* global number of query head 0; -1: tp_rank x the push's heads */
} attnstat_layout;

/* Defaults: ranks 0, sizes 1, layer_offset 0, head_offset -1 (a process that is the whole model). */
void attnstat_layout_init(attnstat_layout *l);

/* Tells the daemon this process's layout. Call it after attnstat_hello and before the pushes it is
 * for (pushes already sent keep the numbers they were sent with); it is kept and said again after
 * every reconnection. Returns ATTNSTAT_OK (sent, or kept for the connection being made again),
 * ATTNSTAT_EINVAL for a layout out of range (a rank not under its size, a size under 1, an offset
 * past 2^24: the message names the field), ATTNSTAT_ESTATE before hello, ATTNSTAT_ENOTSUP when the
 * daemon is older and cannot take one (its HelloReply does not list "layout"). */
attnstat_code attnstat_set_layout(attnstat_client *c, const attnstat_layout *l);

/* ---- Interventions --------------------------------------------------------------------------- *
 * What the job did to its model at a step because of what attnstat measured, recorded in the
 * run's history beside the samples (`attnstat interventions RUN`): attnstat.torch.qk_clip sends
 * one per layer it clips (kind "qk_clip", the query heads whose rows it scaled, the factor each
 * head's logits scale by, tau, the largest measured max logit). layer and heads are numbered as
 * the pushes' are (the layout in force makes them global). */
typedef struct {
    uint32_t size;          /* sizeof(attnstat_intervention): attnstat_intervention_init sets it */
    const char *kind;       /* what was done: 1..32 of [a-z0-9_.-] ("qk_clip") */
    int64_t step;           /* the step whose measurements it acted on, >= 0 */
    int32_t layer;          /* the layer, or -1 for none */
    const uint32_t *heads;  /* nheads query heads (each < 2^24), or NULL with nheads 0 */
    int32_t nheads;         /* 0 .. 4096 */
    const double *values;   /* NULL, or one finite value per head (qk_clip: the factor) */
    double threshold;       /* NaN: none (qk_clip: tau) */
    double measured;        /* NaN: none (qk_clip: the largest measured max logit) */
    const char *detail;     /* NULL, or free text (JSON) of at most 1024 bytes */
} attnstat_intervention;

/* Defaults: no kind (it must be set), step 0, layer -1, no heads, values or detail, threshold and
 * measured NaN. */
void attnstat_intervention_init(attnstat_intervention *iv);

/* Sends iv to the daemon, which stores it in the run's history; never waits for it. Returns
 * ATTNSTAT_OK (sent), ATTNSTAT_EINVAL for a field out of range (the message names it),
 * ATTNSTAT_ESTATE before attnstat_hello, ATTNSTAT_ENOTSUP when the daemon is older and takes none
 * (its HelloReply does not list "interventions"), ATTNSTAT_DROPPED while the library is not
 * connected (the daemon is restarting: not kept, count it; the run goes on). A daemon that refuses
 * it anyway reports an Error, which attnstat_poll's callbacks see like any other. */
attnstat_code attnstat_record_intervention(attnstat_client *c, const attnstat_intervention *iv);

/* The run id the daemon gave this connection (after hello), else -1. */
int64_t attnstat_run_id(const attnstat_client *c);

/* ---- Pushing ---------------------------------------------------------------------------------- */
/* Copies q, k (and v when not NULL) into the ring and sends a Push for (opts->step, opts->layer).
 * Returns ATTNSTAT_OK when the push is on its way, ATTNSTAT_DROPPED when it was dropped (ring or
 * queue full, or not connected while the library reconnects; counted in stats.dropped_local),
 * ATTNSTAT_EINVAL for a bad tensor or option (message names it), ATTNSTAT_ECLOSED when the
 * connection is gone for good (the daemon refused this client when it reconnected: the message
 * says why), ATTNSTAT_ESTATE before hello, ATTNSTAT_ENOTSUP for CUDA tensors. Never blocks. Also
 * processes replies already received, and moves a reconnection on. */
attnstat_code attnstat_push(attnstat_client *c, const attnstat_push_opts *opts,
                            const attnstat_tensor *q, const attnstat_tensor *k,
                            const attnstat_tensor *v);

/* ---- Replies ---------------------------------------------------------------------------------- */
typedef struct {
    uint64_t pushed;          /* push calls that passed argument checks */
    uint64_t sent;            /* pushes handed to the socket (written or queued) */
    uint64_t acked;           /* Ack OK: the results are durable in the daemon's store */
    uint64_t dropped_local;   /* dropped here: ring full, queue full or connection gone */
    uint64_t dropped_ring;    /*   of those, for want of ring space */
    uint64_t dropped_queue;   /*   of those, for want of outgoing queue space */
    uint64_t dropped_daemon;  /* Ack DROPPED: the daemon's queue was full */
    uint64_t rejected;        /* Ack with another error code (see last_error) */
    uint64_t released;        /* Release messages (ring slots handed back) */
    uint64_t in_flight;       /* sent and not yet acknowledged */
    uint64_t errors;          /* Error messages from the daemon */
    uint64_t alerts;          /* Alert messages received (after attnstat_subscribe) */
    uint64_t ring_bytes;      /* ring size */
    uint64_t ring_used;       /* bytes of the ring held by pushes in flight */
    uint64_t queue_bytes;     /* outgoing bytes waiting for the socket */
    int32_t last_code;        /* protocol code of the last rejection or Error, 0 when none */
    int32_t reserved;
    char last_error[256];     /* its message */
    /* GPU path (CUDA tensors) */
    uint64_t cuda_zero_copy;  /* pushes sent by IPC handle of the caller's own memory */
    uint64_t cuda_staged;     /* pushes copied into the device staging ring first */
    uint64_t dropped_staging; /* dropped here: no room in the device staging ring (in dropped_local) */
    uint64_t dropped_events;  /* dropped here: every interprocess event in use (in dropped_local) */
    uint64_t cuda_buffers;    /* device allocations exported to the daemon (live) */
    uint64_t releases_pending;/* pushes whose memory the daemon may still read */
    /* Daemon restarts (see "Daemon restarts" below) */
    uint64_t dropped_disconnected; /* dropped here while not connected (the library reconnects) or
                                      once the connection is gone for good (in dropped_local) */
    uint64_t abandoned;       /* sent, then abandoned when the connection was lost: never acknowledged */
    uint64_t disconnects;     /* established connections lost */
    uint64_t reconnects;      /* connections re-established by the library (the run resumed) */
} attnstat_counters;

/* Copies the client's counters into out. */
void attnstat_stats(const attnstat_client *c, attnstat_counters *out);

/* The protocol's alert rule and state numbers (proto/attnstat.proto). */
typedef enum {
    ATTNSTAT_RULE_ENTROPY_FLOOR = 1,
    ATTNSTAT_RULE_ENTROPY_DROP = 2,
    ATTNSTAT_RULE_LOGIT_CEILING = 3,
    ATTNSTAT_RULE_NONFINITE = 4,
    ATTNSTAT_RULE_SINK_MASS_CEILING = 5,
    ATTNSTAT_RULE_DISTANCE_FLOOR = 6,
} attnstat_rule;

typedef enum {
    ATTNSTAT_ALERT_RAISED = 1,
    ATTNSTAT_ALERT_CLEARED = 2,  /* its samples are good again */
    ATTNSTAT_ALERT_RESOLVED = 3, /* its run ended, or an operator resolved it */
} attnstat_alert_state;

const char *attnstat_rule_name(int32_t rule);    /* "entropy_floor", ... or "unknown" */
const char *attnstat_state_name(int32_t state);  /* "raised", "cleared", "resolved" or "unknown" */

typedef struct {
    const char *run;          /* valid during the callback only */
    const char *message;      /* may be "" */
    int64_t run_id;
    int64_t step;
    int64_t time_ms;          /* Unix time in milliseconds, 0 when not given */
    int32_t rank;
    uint32_t layer;
    uint32_t head;
    int32_t rule;             /* attnstat_rule */
    int32_t state;            /* attnstat_alert_state */
    int32_t reserved;
    double value;
    double threshold;
} attnstat_alert;

/* Per-head statistics of one push (want_results) or of a subscribed result stream. A statistic
 * the push did not ask for (attnstat_push_ext.stats; by default sink_mass and distance) is NaN. */
typedef struct {
    uint32_t head;
    int32_t sampled;
    uint64_t rows, rows_norm, rows_empty, nonfinite_rows;
    double entropy_mean, entropy_std, entropy_min, entropy_max;
    double entropy_norm_mean, collapsed_frac, max_logit;
    double sink_mass, distance;  /* NaN where not asked for, or not computed (an older attnstatd) */
} attnstat_head_result;

typedef void (*attnstat_alert_fn)(void *user, const attnstat_alert *alert);
/* step/layer identify the push (seq is the client's sequence number; 0 for subscribed results). */
typedef void (*attnstat_result_fn)(void *user, uint64_t seq, int64_t step, uint32_t layer,
                                   const attnstat_head_result *heads, size_t n_heads);
/* Called once per Ack that is not OK (dropped by the daemon or rejected). */
typedef void (*attnstat_ack_fn)(void *user, uint64_t seq, int64_t step, uint32_t layer,
                                int32_t proto_code, const char *message);

void attnstat_set_alert_callback(attnstat_client *c, attnstat_alert_fn fn, void *user);
void attnstat_set_result_callback(attnstat_client *c, attnstat_result_fn fn, void *user);
void attnstat_set_ack_callback(attnstat_client *c, attnstat_ack_fn fn, void *user);

/* Where a subscribed Result comes from: the daemon streams every run's results to a subscriber
 * (attnstat_subscribe(c, ., 1)), by global layer and head numbers. */
typedef struct {
    const char *run;          /* valid during the callback only */
    int64_t run_id;
    int64_t step;
    uint32_t layer;
    uint32_t reserved;
} attnstat_result_source;
typedef void (*attnstat_run_result_fn)(void *user, const attnstat_result_source *src,
                                       const attnstat_head_result *heads, size_t n_heads);
/* Called for each subscribed Result with its run (monitors that follow one run: attnstat top);
 * the result callback above is called for them too, with seq 0. */
void attnstat_set_run_result_callback(attnstat_client *c, attnstat_run_result_fn fn, void *user);

/* Asks the daemon to stream alerts (and per-push results) to this connection. Works without a
 * hello (monitors such as `attnstat watch`). Delivered to the callbacks by attnstat_poll. */
attnstat_code attnstat_subscribe(attnstat_client *c, int alerts, int results);

/* Sends what is queued and processes what arrived, waiting up to timeout_ms (0: do not wait,
 * < 0: until something arrives). While the library reconnects it waits for the next attempt
 * instead (at most timeout_ms) and makes it. Returns ATTNSTAT_OK (also when nothing happened, and
 * while reconnecting) or ATTNSTAT_ECLOSED when the connection is gone for good (lost before hello
 * succeeded, or the daemon refused this client when it reconnected). */
attnstat_code attnstat_poll(attnstat_client *c, int timeout_ms);

/* Waits until every push sent is acknowledged and the outgoing queue is empty, up to timeout_ms
 * (< 0: no limit). For tests and the end of training. Returns
 *   ATTNSTAT_OK         every push sent since the previous flush was acknowledged;
 *   ATTNSTAT_ELOST      nothing is pending any more, but some pushes sent since the previous flush
 *                       were abandoned when the connection was lost (stats.abandoned; the message
 *                       says how many and why): they will never be acknowledged. Reported once:
 *                       the next flush says OK unless more were lost;
 *   ATTNSTAT_ETIMEDOUT  time ran out first;
 *   ATTNSTAT_ECLOSED    only for a client whose hello failed (never for a daemon that went away).
 * It never waits for a reconnection: while the library reconnects nothing is in flight. */
attnstat_code attnstat_flush(attnstat_client *c, int timeout_ms);

/* ---- Daemon status ---------------------------------------------------------------------------- */
#define ATTNSTAT_STATUS_MAX_WORKERS 16
#define ATTNSTAT_STATUS_MAX_CLIENTS 64

typedef struct {
    char name[64];            /* "cpu" or a device UUID */
    uint32_t queue_depth, queue_capacity;
    uint64_t processed, dropped;
    double busy_frac;
} attnstat_worker_status;

typedef struct {
    uint64_t id;
    char run[128];
    int32_t rank, pid;
    uint32_t uid, reserved;
    uint64_t pushes, dropped, rejected;
} attnstat_client_status;

#define ATTNSTAT_STATUS_MAX_REJECTIONS 16
typedef struct {
    int32_t code;             /* the protocol's Code of the answer */
    uint32_t reserved;
    uint64_t count;           /* pushes answered with it since the daemon started */
    char last_message[192];   /* the daemon's words, the last time */
} attnstat_rejection;

typedef struct {
    char daemon_version[32];
    char db_path[256];
    double uptime_s;
    double push_rate;         /* pushes per second over the last 10 s */
    uint32_t clients;         /* connected clients */
    uint32_t alerts_active;
    uint64_t pushes, pushes_done, dropped, rejected, samples_stored;
    uint32_t n_workers;       /* entries filled in workers[] */
    uint32_t n_client_list;   /* entries filled in client_list[] (at most the array's size) */
    attnstat_worker_status workers[ATTNSTAT_STATUS_MAX_WORKERS];
    attnstat_client_status client_list[ATTNSTAT_STATUS_MAX_CLIENTS];
    /* Pushes the daemon answered with another code than OK, by code (its protocol Code:
     * attnstat_rule_name's neighbours; attnstat_proto_code_name names it), with each code's last
     * message: why pushes were not stored. */
    uint32_t n_rejections;
    uint32_t reserved2;
    attnstat_rejection rejections[ATTNSTAT_STATUS_MAX_REJECTIONS];
    uint64_t failed;          /* pushes failed in compute or store */
    uint64_t store_errors;    /* store operations that failed (a full disk, I/O errors...) */
    char last_store_error[256]; /* why the last one failed ("" when none) */
} attnstat_daemon_status;

/* Local mode: CUDA pushes are computed in this process, by the daemon's statistics kernel (linked
 * into libattnstat) on a stream of the lowest priority in the tensors' CUDA context, ordered after
 * the push's stream; only the per-head results go to attnstatd (which stores them and checks them
 * against the alert rules as its own). Without MPS the GPU time-slices between the trainer's
 * context and the daemon's, and the daemon's kernels stop the trainer's instead of sharing the
 * GPU: computing in the trainer's own context removes that (bench/RESULTS.md, "Overhead on a real
 * model"). A push still never synchronises the device or waits for the kernel; attnstat_push_ex
 * returns its seq, and the release callback says when the kernel has read the tensors (keep them
 * alive until then). Its Ack comes once the results reached the daemon (attnstat_flush waits for
 * both). The collapse threshold is the hello's (attnstat_thresholds) or the kernels' default 0.1,
 * not the daemon's setting. Host tensors are unaffected. on: 1 local, 0 the daemon computes (the
 * default). ENOTSUP from a libattnstat without CUDA; a daemon whose HelloReply does not list
 * "computed" refuses each local push with ENOTSUP. */
attnstat_code attnstat_set_local_compute(attnstat_client *c, int on);

/* Local mode: makes cuda_stream (a cudaStream_t; NULL the legacy default stream of the calling
 * thread's current device) wait, on the device, for every computation pushed so far (on any
 * device), without blocking the host: what is enqueued on it
 * next sees their max_logit_out (attnstat_push_ext) written. QK-Clip uses it after the optimizer
 * step to read the step's own max logits with no host synchronisation. OK when nothing is running;
 * EINVAL outside local mode or when CUDA refuses the wait (the message says why). */
attnstat_code attnstat_local_wait(attnstat_client *c, void *cuda_stream);

/* The name of a protocol Code (an Ack's or Error's: "BAD_REQUEST", "DROPPED", ...), "unknown"
 * otherwise. */
const char *attnstat_proto_code_name(int32_t code);

/* Asks the daemon for its status and waits up to timeout_ms for the reply. Works without hello.
 * ATTNSTAT_ECLOSED while not connected (the library reconnects: try again later). */
attnstat_code attnstat_status(attnstat_client *c, attnstat_daemon_status *out, int timeout_ms);

/* The message of the last failed call on c (empty when none). Valid until the next call on c. */
const char *attnstat_last_error(const attnstat_client *c);

/* The socket descriptor, to wait on it in the caller's own event loop (readable: call
 * attnstat_poll(c, 0)). Do not read, write or close it. It changes when the library reconnects,
 * and is -1 while it is not connected: ask again after each attnstat_poll, and call attnstat_poll
 * at least every few hundred milliseconds while it is -1. */
int attnstat_fd(const attnstat_client *c);

/* Sends what can be sent without waiting, then closes the connection and frees everything
 * (the ring is unmapped; its name is removed if hello did not get that far). Pushes not yet acknowledged are abandoned: call
 * attnstat_flush() first to wait for them. After a hello, it tells the daemon that the run ends
 * (Goodbye): its active alerts are resolved. A client that exits without it (a crash) leaves its
 * run to the daemon's run_grace_ms (it may reconnect). c may be NULL. */
void attnstat_close(attnstat_client *c);

/* ---- GPU path ------------------------------------------------------------------------------ *
 * CUDA tensors (mem = ATTNSTAT_MEM_CUDA) are handed over without a copy when their allocation can
 * be shared with cudaIpcGetMemHandle (cudaMalloc, PyTorch's default caching allocator): the
 * allocation is exported once (the daemon keeps it open), and each push records an interprocess
 * event on opts->cuda_stream after which the daemon reads the tensors. The caller must then keep
 * the tensors' memory unchanged until the push is released: attnstat_push_ex() tells which pushes
 * these are, and the release callback says when. Memory that cannot be exported that way
 * (PyTorch's expandable_segments, other cuMemMap pools) is copied on the caller's stream into a
 * device staging ring per device, made at the first staged push with room for four such pushes
 * (64 MiB at least, 1/32 of the device at most; ATTNSTAT_CUDA_STAGING_BYTES sets it); when the ring is
 * full the push is dropped and counted. A push never synchronises the device and never waits for
 * the daemon. The library links the CUDA runtime statically and reaches the driver only at the
 * first CUDA call: it loads on machines without a GPU driver. */

/* The library's version (ATTNSTAT_VERSION), with "+cuda" appended when it has the GPU path. */
const char *attnstat_version(void);

/* Writes the UUID of CUDA device `device` as nvidia-smi prints it ("GPU-xxxxxxxx-xxxx-...") into
 * buf. ATTNSTAT_ENOTSUP without CUDA (err says why), ATTNSTAT_EINVAL for a bad ordinal. */
attnstat_code attnstat_cuda_device_uuid(int32_t device, char *buf, size_t len, attnstat_error *err);

/* attnstat_hello that also names the GPUs (by UUID) this process will push from, so that the
 * daemon starts their workers now rather than at the first push. device_uuids may be NULL when
 * n_devices is 0. A device first used later is announced with its first buffer. */
attnstat_code attnstat_hello_ex(attnstat_client *c, const char *run, int32_t rank,
                                const attnstat_thresholds *thresholds, const char *config_json,
                                const char *const *device_uuids, int32_t n_devices);

/* attnstat_push, and *seq_out (may be NULL) = the push's sequence number when the library still
 * references the caller's memory after returning (zero-copy CUDA push), 0 otherwise (host
 * tensors, staged CUDA tensors, or a push that was not sent). */
attnstat_code attnstat_push_ex(attnstat_client *c, const attnstat_push_opts *opts,
                               const attnstat_tensor *q, const attnstat_tensor *k,
                               const attnstat_tensor *v, uint64_t *seq_out);

/* ---- Masks, the precision of the logits, device offsets, sinks: attnstat_push2 -------------- *
 * What attention calls of real models carry beyond q and k, and which statistics a push asks for.
 * A daemon that cannot take one of these (older than this library) makes attnstat_push2 fail with
 * ATTNSTAT_ENOTSUP rather than compute something else. */

/* The statistics a push asks for (attnstat_push_ext.stats), as bit masks: bit i stands for the
 * i-th statistic of attnstat_head_result (entropy_mean is bit 0, distance bit 8). Those one pass
 * of the kernels computes together go together: ATTNSTAT_STATS_ENTROPY is the six entropy
 * statistics (entropy_mean, _std, _min, _max, entropy_norm_mean, collapsed_frac). sink_mass and
 * distance are off by default: they cost the tensor-core kernels extra time, and are computed only
 * when asked. */
#define ATTNSTAT_STATS_ENTROPY 0x3fu
#define ATTNSTAT_STATS_MAX_LOGIT 0x40u
#define ATTNSTAT_STATS_SINK_MASS 0x80u
#define ATTNSTAT_STATS_DISTANCE 0x100u
#define ATTNSTAT_STATS_DEFAULT (ATTNSTAT_STATS_ENTROPY | ATTNSTAT_STATS_MAX_LOGIT)
#define ATTNSTAT_STATS_ALL                                                                         \
    (ATTNSTAT_STATS_DEFAULT | ATTNSTAT_STATS_SINK_MASS | ATTNSTAT_STATS_DISTANCE)

typedef struct {
    uint32_t size;          /* sizeof(attnstat_push_ext): attnstat_push_ext_init sets it */
    int32_t compute_dtype;  /* -1 (default): the tensors' own precision; ATTNSTAT_BF16 or
                               ATTNSTAT_F16: q and k are rounded to it before the dot products,
                               as attention under autocast computes (float32 tensors handed to a
                               bf16 attention); ATTNSTAT_F32: full float32 */
    int32_t reserved;
    /* An attention mask with scaled_dot_product_attention's conventions, or NULL: shape
     * [B or 1, Hq or 1, Nq or 1, Nk] (a dimension of 1 broadcasts), strides[3] = 1, dtype
     * ATTNSTAT_BOOL (nonzero: the key takes part) or ATTNSTAT_F32/F16/BF16 added to the logits
     * (-inf and the dtype's lowest finite value exclude the key). In the same kind of memory as
     * q; for CUDA memory the push keeps it referenced like q (until the release callback). Not
     * with packed sequences. */
    const attnstat_tensor *mask;
    /* Packed sequences' offsets in CUDA memory (where the library cannot read them without a
     * synchronisation), or NULL: contiguous int32 tensors of shape [1, 1, n_seqs + 1, 1]. Both
     * or neither; not with opts->cu_seqlens_* (host offsets stay there). Their values are read on
     * the device only (each clamped to the tensors' rows). */
    const attnstat_tensor *cu_seqlens_q;
    const attnstat_tensor *cu_seqlens_k;
    /* Attention sinks (gpt-oss's `sinks`), or NULL: one logit per query head, shape [1, Hq, 1, 1],
     * dtype ATTNSTAT_F32/F16/BF16, in the same kind of memory as q (for CUDA memory contiguous
     * along the heads, strides[1] = 1, and kept referenced like q until the release callback).
     * Each joins every row of its head as one more outcome of the softmax, taken as it is (no
     * scale, softcap or mask): the entropy and its normalisation (ln of visible keys + 1) count
     * it, the max logit does not; -inf is no sink, NaN or +inf makes the head's rows non-finite.
     * Added after the fields above: a caller built against an older attnstat.h (a smaller size)
     * simply has none. ATTNSTAT_ENOTSUP when the daemon's HelloReply does not list "sinks". */
    const attnstat_tensor *sinks;
    /* Local mode only (attnstat_set_local_compute, CUDA tensors): 1 makes the caller's stream
     * (opts->cuda_stream) wait, on the device, for this push's computation, so that what the
     * caller enqueues there next may overwrite q, k, the mask and the sinks: code that reuses its
     * buffers (a torch.compile'd graph) pushes them as they are, with no copy. The computation
     * still runs on the library's stream, but the caller's next work waits for it. 0 (default):
     * the caller keeps the tensors unchanged until their release callback. EINVAL when the daemon
     * computes (a stream cannot wait for another process's work) or the tensors are in host
     * memory. Added after sinks (a caller's older attnstat.h: 0). */
    int32_t stream_waits;
    /* 0. Holds stats past the end of the struct as it was before stats (where a 64-bit build had
     * 4 bytes of padding), so that the size of a caller's older struct never covers it. */
    int32_t reserved2;
    /* The statistics to compute and report: 0 (default) for the defaults, ATTNSTAT_STATS_DEFAULT
     * (the entropy statistics and max_logit); or an OR of ATTNSTAT_STATS_* (ATTNSTAT_STATS_ALL:
     * every one). ATTNSTAT_STATS_SINK_MASS and ATTNSTAT_STATS_DISTANCE cost the tensor-core kernels
     * extra time and are computed only when asked. A statistic not asked for is absent (NaN in
     * attnstat_head_result, not stored), whichever kernel computed the push, the counts (rows...)
     * staying. ATTNSTAT_EINVAL for bits past ATTNSTAT_STATS_ALL; ATTNSTAT_ENOTSUP for anything but
     * 0 and ATTNSTAT_STATS_DEFAULT when the daemon's HelloReply does not list "stats" (it would
     * compute the defaults). In local mode the library keeps what was asked the same way. Added
     * after stream_waits (a caller's older attnstat.h: 0). */
    uint32_t stats;
    /* Local mode only (CUDA tensors), or NULL: device memory on q's device, float64, one per query
     * head ([Hq], contiguous). The computation folds each head's max logit into it (as the
     * result's max_logit: -inf for a head with no counted row, a lower bound when rows are
     * sampled), on the device: each element becomes the larger of itself and the head's value,
     * NaN counting as none, so that memory set to NaN holds the largest of every push made into
     * it since (a step's forwards under gradient accumulation). A stream that waits for the
     * computation (stream_waits, or attnstat_local_wait) then reads the step's own max logits with
     * no host synchronisation (QK-Clip in the same step). The memory must stay valid until then; a
     * push that is dropped or refused writes nothing. EINVAL outside local mode, for host tensors,
     * or when stats does not ask for the max logit. Added after stats (a caller's older
     * attnstat.h: NULL). */
    double *max_logit_out;
} attnstat_push_ext;

/* Defaults: size set, compute_dtype -1, everything else 0/NULL. */
void attnstat_push_ext_init(attnstat_push_ext *e);

/* attnstat_push_ex with ext (may be NULL: then exactly attnstat_push_ex). */
attnstat_code attnstat_push2(attnstat_client *c, const attnstat_push_opts *opts,
                             const attnstat_push_ext *ext, const attnstat_tensor *q,
                             const attnstat_tensor *k, const attnstat_tensor *v,
                             uint64_t *seq_out);

/* Called exactly once for every non-zero seq of attnstat_push_ex() when the daemon no longer reads
 * that push's memory (its Release, a non-OK Ack, or the connection being lost: see "Daemon
 * restarts"), from inside attnstat_poll / attnstat_push / attnstat_flush / attnstat_status.
 * attnstat_close() abandons what is still pending without calling it. */
typedef void (*attnstat_release_fn)(void *user, uint64_t seq);
void attnstat_set_release_callback(attnstat_client *c, attnstat_release_fn fn, void *user);

/* ---- Daemon restarts --------------------------------------------------------------------------- *
 * When the connection to the daemon is lost after a successful attnstat_hello (or, for a client
 * that never says hello, after attnstat_connect), the library reconnects on its own. A client of
 * attnstat_connect2(ATTNSTAT_CONNECT_BACKGROUND) whose daemon was not there yet makes its first
 * connection the same way. It has no
 * thread: each attnstat_push, attnstat_poll, attnstat_flush and attnstat_status moves the
 * reconnection on without blocking (non-blocking connect; attempts 100 ms apart at first, the
 * delay doubling up to 5 s, with jitter). On a new connection it sends the same Hello again (run,
 * rank, thresholds, config, devices: the daemon continues the same run, keyed by name and rank),
 * registers a fresh host ring and every CUDA allocation, event and staging ring the client still
 * holds, subscribes again as before, and carries on; attnstat_run_id() then says the daemon's id.
 *   - Pushes made while not connected (or while the run is being resumed) return ATTNSTAT_DROPPED
 *     at once, counted in dropped_local and dropped_disconnected; attnstat_last_error() says what
 *     happened ("connection to attnstatd ... lost (...); reconnecting ..., N pushes dropped so
 *     far").
 *   - Pushes in flight when the connection broke are abandoned (counted in abandoned; so that
 *     sent = acked + dropped_daemon + rejected + in_flight + abandoned): their ring space is freed
 *     and the release callback of each zero-copy CUDA push is called, so the caller may reuse that
 *     memory. The daemon only ever reads it. A daemon that exited or was killed reads nothing more
 *     (its CUDA context ends with it); one shutting down (SIGTERM) closes connections only after
 *     every push it read from them is computed and stored, so what is still in flight then was
 *     never read. Only a daemon that closes a connection while a worker still computes one of its
 *     pushes (its 10 s shutdown grace ran out, or the connection was closed for a protocol error)
 *     may read memory the caller has already reused: the statistics of that one push may then be
 *     wrong, and its Ack can no longer reach this client. A new host ring is made for every
 *     connection, so the memory an old daemon may still map is never written again.
 *   - attnstat_flush() reports abandoned pushes with ATTNSTAT_ELOST and never fails because the
 *     daemon went away; attnstat_close() never fails.
 *   - A daemon that refuses the client when it reconnects (permission, protocol version, a hello it
 *     rejects) is not asked again: the connection is then gone for good (ATTNSTAT_LINK_CLOSED,
 *     pushes return ATTNSTAT_ECLOSED with the daemon's reason). "Too many clients" and store
 *     failures are retried. */
typedef enum {
    ATTNSTAT_LINK_UP = 0,           /* connected (and, after hello, the run established) */
    ATTNSTAT_LINK_RECONNECTING = 1, /* the connection was lost; the library is reconnecting */
    ATTNSTAT_LINK_CLOSED = 2,       /* gone for good: lost before hello succeeded, or refused */
} attnstat_link;

/* Where c stands with the daemon (an attnstat_link; ATTNSTAT_LINK_CLOSED for NULL). When it is not
 * ATTNSTAT_LINK_UP and why is not NULL, a short sentence saying what happened (the reason the
 * connection was lost, or the daemon's refusal) is written into why (len bytes, NUL-terminated);
 * else why is set to "". Makes no system call: attnstat_poll moves a reconnection on. */
int32_t attnstat_link_state(const attnstat_client *c, char *why, size_t len);

#ifdef __cplusplus
}
#endif

#endif /* ATTNSTAT_H */
