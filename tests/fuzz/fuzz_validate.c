/* fuzz_validate.c — libFuzzer target over validate_push() alone, with buffers of both kinds: host
 * buffers (each its own heap block of exactly its registered size, so ASan sees one byte past
 * it) and device buffers on two devices (registered sizes only: nothing to read here). fuzz_session
 * drives the whole receiving side but can register only host memory in a build without a GPU, so
 * the device pushes' checks (packed offsets by reference, the device and kind rules) ran only on
 * a GPU machine; one of them divided by zero there and took the daemon down.
 *
 * The input is not a protobuf: its bytes build a push that is valid or nearly so (shapes that
 * agree, tensors laid out one after another in one buffer, each present part chosen by a byte),
 * then apply up to three mutations (a field set to a value near a bound), so that most inputs
 * reach the deep checks and many pass. Checked on every input:
 *   - refused: a code and a message, and an empty plan;
 *   - accepted: every tensor of the plan inside its registered buffer (need <= size, offset <=
 *     need), one kind and device, the work within the limit; a host push is then computed by the
 *     daemon's CPU backend over the real buffers (ASan: every read inside them);
 *   - and by the sanitizers, every arithmetic step (UBSan: no division by zero, no overflow).
 * Stage: a test; calls the validate stage and kernels/ as the daemon does. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "stats.h"
#include "validate.h"

#define NBUF 5 /* ids 1, 4: host; 2: device 0; 3: device 1; 5: never registered */
#define HOST_MAX (1u << 18)

typedef struct {
    const uint8_t *d;
    size_t n, i;
} reader;

static uint8_t g8(reader *r)
{
    return r->i < r->n ? r->d[r->i++] : 0;
}

static uint32_t g32(reader *r)
{
    uint32_t v = 0;
    for (int i = 0; i < 4; i++)
        v = v << 8 | g8(r);
    return v;
}

static uint64_t g64(reader *r)
{
    return (uint64_t)g32(r) << 32 | g32(r);
}

/* A value near a bound, for a field that holds it in 64 bits. */
static uint64_t edge(reader *r)
{
    static const uint64_t v[] = {0, 1, 2, 3, 4, 7, 16, 255, 4096, 4097, 65536, 65537,
                                 0x7fffffffull, 0x80000000ull, 0xffffffffull, 0x100000000ull,
                                 (uint64_t)INT64_MAX, (uint64_t)INT64_MAX + 1, UINT64_MAX - 1,
                                 UINT64_MAX};
    uint8_t c = g8(r);
    return c < sizeof v / sizeof v[0] ? v[c] : g64(r);
}

static validate_buffer bufs[NBUF + 1];
static uint8_t *host[NBUF + 1];

static const validate_buffer *lookup(void *ctx, uint32_t id)
{
    (void)ctx;
    return id >= 1 && id <= NBUF && bufs[id].kind ? &bufs[id] : NULL;
}

/* The tensors a push can carry, with storage for their shapes and strides. */
enum { T_Q, T_K, T_V, T_MASK, T_CUQ, T_CUK, T_SINKS, T_N };

typedef struct {
    Attnstat__TensorRef t[T_N];
    uint64_t shape[T_N][5], strides[T_N][5];
    int32_t cu_q[8], cu_k[8];
    Attnstat__Push p;
} built;

static const uint64_t esize[5] = {4, 2, 2, 1, 4}; /* F32, F16, BF16, BOOL, I32 */

/* Lays t out contiguously (order 0: [a, b, c, d]; 1: b and c swapped, as [B, N, H, D] memory)
 * at the first multiple of its element size at or past *end, plus pad elements. */
static void place(Attnstat__TensorRef *t, uint64_t *sh, uint64_t *st, const uint64_t s[4],
                  int dtype, int order, uint32_t id, uint64_t pad, uint64_t *end)
{
    uint64_t es = esize[dtype];
    memcpy(sh, s, 4 * sizeof *sh);
    st[3] = 1;
    if (order) {
        st[1] = s[3], st[2] = s[1] * s[3];
        st[0] = s[1] * s[2] * s[3];
    } else {
        st[2] = s[3], st[1] = s[2] * s[3];
        st[0] = s[1] * s[2] * s[3];
    }
    attnstat__tensor_ref__init(t);
    t->buffer_id = id;
    t->dtype = (Attnstat__Dtype)dtype;
    t->offset = (*end + es - 1) / es * es + pad * es;
    t->n_shape = t->n_strides = 4;
    t->shape = sh;
    t->strides = st;
    *end = t->offset + s[0] * s[1] * s[2] * s[3] * es;
}

/* One packed offsets array of n + 1 entries over total rows: sorted cuts, first 0, last total. */
static void offsets(reader *r, int32_t *cu, int n, uint64_t total)
{
    cu[0] = 0;
    for (int i = 1; i < n; i++) {
        uint64_t c = total ? g8(r) % (total + 1) : 0;
        cu[i] = (int32_t)(c < (uint64_t)cu[i - 1] ? (uint64_t)cu[i - 1] : c);
    }
    cu[n] = (int32_t)total;
}

static void mutate(reader *r, built *b)
{
    Attnstat__TensorRef *t = &b->t[g8(r) % T_N];
    if (!t->shape) /* a part this push does not carry */
        t = &b->t[T_Q];
    int i = g8(r) % 4;
    switch (g8(r) % 14) {
    case 0: t->shape[i] = edge(r); break;
    case 1: t->strides[i] = edge(r); break;
    case 2: t->offset = edge(r); break;
    case 3: t->dtype = (Attnstat__Dtype)(g8(r) % 7); break;
    case 4: t->buffer_id = g8(r) % (NBUF + 2); break;
    case 5: t->n_shape = g8(r) % 6; t->n_strides = g8(r) % 6; break;
    case 6: b->p.layer = (uint32_t)edge(r); break;
    case 7: b->p.window_left = (int32_t)g32(r); b->p.has_window_left = 1; break;
    case 8: b->p.sample_every = g32(r); b->p.has_sample_every = 1;
            b->p.sample_rows = g8(r) & 1 ? g32(r) : 0; b->p.has_sample_rows = 1; break;
    case 9: if (b->p.n_cu_seqlens_q) b->cu_q[g8(r) % b->p.n_cu_seqlens_q] = (int32_t)g32(r); break;
    case 10: b->p.n_cu_seqlens_k = g8(r) % 9; b->p.cu_seqlens_k = b->cu_k; break;
    case 11: b->p.compute_dtype = (Attnstat__Dtype)(g8(r) % 6); b->p.has_compute_dtype = 1; break;
    case 12: b->p.stats = g32(r); b->p.has_stats = 1; break;
    default: { /* a buffer's registered size, one byte either side of where it was */
        uint32_t id = 1 + g8(r) % NBUF;
        if (bufs[id].kind && bufs[id].size)
            bufs[id].size += g8(r) & 1 ? 1 : (uint64_t)-1;
        break;
    }
    }
}

static void build(reader *r, built *b)
{
    memset(b, 0, sizeof *b);
    uint64_t B = 1 + g8(r) % 3, hkv = 1 + g8(r) % 4, hq = hkv * (1 + g8(r) % 4);
    uint64_t nq = 1 + g8(r) % 24, nk = 1 + g8(r) % 24, d = 1 + g8(r) % 80;
    int dt = g8(r) % 3, order = g8(r) & 1;
    uint8_t parts = g8(r), where = g8(r) % 4;
    uint32_t id = where < 2 ? 1 : where; /* host 1, device 2 (device 0) or 3 (device 1) */
    int device = id != 1;
    int packed_inline = parts & 8, packed_ref = (parts & 16) && device;
    int nseq = 1 + g8(r) % 4;
    if (packed_inline || packed_ref)
        B = 1;
    uint64_t end = 0, qs[4] = {B, hq, nq, d}, ks[4] = {B, hkv, nk, d};
    place(&b->t[T_Q], b->shape[T_Q], b->strides[T_Q], qs, dt, order, id, g8(r) % 3, &end);
    place(&b->t[T_K], b->shape[T_K], b->strides[T_K], ks, dt, order, id, g8(r) % 3, &end);
    attnstat__push__init(&b->p);
    b->p.seq = g64(r);
    b->p.step = (int64_t)g32(r);
    b->p.layer = g8(r);
    b->p.q = &b->t[T_Q];
    b->p.k = &b->t[T_K];
    if (parts & 1) {
        place(&b->t[T_V], b->shape[T_V], b->strides[T_V], ks, dt, order, id, g8(r) % 3, &end);
        b->p.v = &b->t[T_V];
    }
    if ((parts & 2) && !packed_inline && !packed_ref) {
        uint64_t ms[4] = {g8(r) & 1 ? B : 1, g8(r) & 1 ? hq : 1, nq, nk};
        place(&b->t[T_MASK], b->shape[T_MASK], b->strides[T_MASK], ms, g8(r) % 4, 0, id, 0, &end);
        b->p.mask = &b->t[T_MASK];
    }
    if (parts & 4) {
        uint64_t ss[4] = {1, hq, 1, 1};
        place(&b->t[T_SINKS], b->shape[T_SINKS], b->strides[T_SINKS], ss, g8(r) % 3, 0, id, 0,
              &end);
        b->p.sinks = &b->t[T_SINKS];
    }
    if (packed_inline) {
        offsets(r, b->cu_q, nseq, nq);
        offsets(r, b->cu_k, nseq, nk);
        b->p.cu_seqlens_q = b->cu_q;
        b->p.cu_seqlens_k = b->cu_k;
        b->p.n_cu_seqlens_q = b->p.n_cu_seqlens_k = (size_t)nseq + 1;
    }
    if (packed_ref) {
        uint64_t cs[4] = {1, 1, (uint64_t)nseq + 1, 1};
        place(&b->t[T_CUQ], b->shape[T_CUQ], b->strides[T_CUQ], cs, 4, 0, id, g8(r) % 2, &end);
        place(&b->t[T_CUK], b->shape[T_CUK], b->strides[T_CUK], cs, 4, 0, id, g8(r) % 2, &end);
        b->p.cu_seqlens_q_ref = &b->t[T_CUQ];
        b->p.cu_seqlens_k_ref = &b->t[T_CUK];
    }
    b->p.has_causal = 1;
    b->p.causal = (parts & 32) != 0;
    if (parts & 64) {
        static const int32_t w[] = {-2, -1, 0, 1, 5, 100, INT32_MIN, INT32_MAX};
        b->p.has_window_left = b->p.has_window_right = 1;
        b->p.window_left = w[g8(r) % 8];
        b->p.window_right = w[g8(r) % 8];
    }
    if (parts & 128) {
        static const float f[] = {0.0f, 0.125f, 1.0f, 30.0f, -1.0f, 1e-30f, INFINITY, NAN};
        b->p.has_softcap = b->p.has_scale = 1;
        b->p.softcap = f[g8(r) % 8];
        b->p.scale = f[g8(r) % 8];
        b->p.has_sample_every = 1;
        b->p.sample_every = g8(r) % 4;
        b->p.has_sample_seed = 1;
        b->p.sample_seed = g64(r);
    }
    memset(bufs, 0, sizeof bufs);
    for (uint32_t i = 1; i <= NBUF; i++)
        bufs[i].device = -1;
    bufs[1].kind = bufs[4].kind = ATTNSTAT__BUFFER_KIND__HOST_SHM;
    bufs[2].kind = bufs[3].kind = ATTNSTAT__BUFFER_KIND__CUDA_IPC;
    bufs[2].device = 0;
    bufs[3].device = 1;
    bufs[4].size = 1 + g8(r) % 64;
    bufs[1].size = bufs[2].size = bufs[3].size = 1;
    bufs[id].size = end;
    int muts = g8(r) % 4;
    for (int m = 0; m < muts; m++)
        mutate(r, b);
}

/* Host buffers of exactly their (final) sizes, filled with bytes from the input's tail: any
 * value a float can hold, NaN and infinities too. */
static int fill_host(reader *r)
{
    for (uint32_t i = 1; i <= NBUF; i++) {
        if (bufs[i].kind != ATTNSTAT__BUFFER_KIND__HOST_SHM)
            continue;
        if (bufs[i].size > HOST_MAX)
            return -1;
        host[i] = malloc(bufs[i].size ? bufs[i].size : 1);
        if (!host[i])
            abort();
        for (uint64_t j = 0; j < bufs[i].size; j++)
            host[i][j] = (uint8_t)(g8(r) ^ (j * 0x9e3779b1u >> 13));
        bufs[i].base = host[i];
    }
    return 0;
}

static void check_plan(const validate_plan *pl, const validate_limits *lim)
{
    if (pl->ntensors < 2 || pl->ntensors > VALIDATE_MAX_TENSORS)
        abort();
    for (int i = 0; i < pl->ntensors; i++) {
        const validate_buffer *vb = lookup(NULL, pl->buffer_id[i]);
        if (!vb || vb->kind != pl->kind || pl->need_bytes[i] > vb->size ||
            pl->offset[i] > pl->need_bytes[i] ||
            (pl->kind == ATTNSTAT__BUFFER_KIND__CUDA_IPC && vb->device != pl->device)) {
            fprintf(stderr, "fuzz_validate: tensor %d of an accepted push: buffer %u need %llu "
                    "offset %llu, registered %llu\n", i, pl->buffer_id[i],
                    (unsigned long long)pl->need_bytes[i], (unsigned long long)pl->offset[i],
                    vb ? (unsigned long long)vb->size : 0ull);
            abort();
        }
    }
    uint64_t limit = pl->kind == ATTNSTAT__BUFFER_KIND__CUDA_IPC ? lim->max_push_work_gpu
                                                                   : lim->max_push_work;
    if (pl->work > limit)
        abort();
}

static unsigned long long seen, refused, host_ok, device_ok;

static void report(void)
{
    fprintf(stderr, "fuzz_validate: %llu pushes, %llu refused, %llu host and %llu device accepted\n",
            seen, refused, host_ok, device_ok);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static stats_cpu_fast_workspace *ws;
    if (!ws) {
        if (!(ws = stats_cpu_fast_workspace_new()))
            abort();
        atexit(report); /* tests/fuzz.sh prints it: how many pushes reached each side */
    }
    seen++;
    reader r = {data, size, 0};
    built b;
    build(&r, &b);
    if (fill_host(&r) != 0)
        goto out;
    const validate_limits lim = {.max_push_work = 1u << 22, .max_push_work_gpu = 1u << 22,
                                 .collapse_threshold = 0.25f};
    validate_plan plan;
    char msg[512] = "";
    Attnstat__Code code = validate_push(&b.p, lookup, NULL, &lim, &plan, msg, sizeof msg);
    if (code != ATTNSTAT__CODE__OK) {
        if (!msg[0] || plan.ntensors != 0 || plan.cu_q || plan.cu_k)
            abort();
        refused++;
        goto out;
    }
    check_plan(&plan, &lim);
    if (plan.kind == ATTNSTAT__BUFFER_KIND__CUDA_IPC)
        device_ok++;
    if (plan.kind == ATTNSTAT__BUFFER_KIND__HOST_SHM) {
        host_ok++;
        static stats_head heads[VALIDATE_MAX_HEADS];
        stats_error err;
        (void)stats_cpu_fast_ws(&plan.prob, ws, heads, NULL, NULL, &err);
    }
    validate_plan_free(&plan);
out:
    for (uint32_t i = 1; i <= NBUF; i++) {
        free(host[i]);
        host[i] = NULL;
    }
    return 0;
}
