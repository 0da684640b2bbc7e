/* test_validate.c — unit tests of daemon/validate.c, pure (no daemon, no socket): random valid
 * pushes give the plan they describe (problem, pointers, spans, work); the bounds are exact (a
 * tensor ending on its buffer's last byte passes, one byte more does not, for q, k and v); offsets
 * and strides that overflow 64 bits are refused; every rule of a Push gets its code and a message
 * naming the field; the work limit is exact and saturates instead of wrapping; packed offsets are
 * copied; device buffers get a placeholder and their device; the device span, shm name and
 * thresholds checks; a Push's stats becomes the problem's want, a bit past vocab.h's rows is
 * refused. Random data from a printed seed (ATTNSTAT_TEST_SEED replays it). */

#include "daemon_harness.h" /* seeds, the runner, and the usual system headers */
#include "envelope.h"
#include "validate.h"
#include "vocab.h"

static dh_rng R; /* seeded by main, printed */

static uint64_t rnd(void)
{
    return dh_next(&R);
}

static int64_t rnd_range(int64_t lo, int64_t hi)
{
    return lo + (int64_t)(rnd() % (uint64_t)(hi - lo + 1));
}

/* ---- registered buffers behind the lookup --------------------------------------------------- */

#define NBUF 4
static validate_buffer bufs[NBUF + 1]; /* by id; kind 0: not registered */
static uint8_t *mem;

static const validate_buffer *lookup(void *ctx, uint32_t id)
{
    (void)ctx;
    return id >= 1 && id <= NBUF && bufs[id].kind ? &bufs[id] : NULL;
}

/* A push of q, k (and v when with_v) in host buffer 1, contiguous, random shapes and dtype; buffer
 * 1 ends exactly where the last tensor does. The arrays live in the caller's struct. */
typedef struct {
    Attnstat__Push p;
    Attnstat__TensorRef q, k, v, sk;
    uint64_t qs[4], ks[4], vs[4], qst[4], kst[4], vst[4], sks[4], skst[4];
    uint64_t esize;
    uint64_t end[4];                /* offset + bytes of q, k, v, the sinks (with_sinks) */
} push_t;

static const uint64_t esizes[3] = {4, 2, 2};

static void contig(uint64_t *shape, uint64_t *st)
{
    st[3] = 1;
    st[2] = shape[3];
    st[1] = shape[2] * shape[3];
    st[0] = shape[1] * shape[2] * shape[3];
}

static void make_push(push_t *x, int with_v)
{
    memset(x, 0, sizeof *x);
    Attnstat__Dtype dt = (Attnstat__Dtype)rnd_range(0, 2);
    x->esize = esizes[dt];
    uint64_t b = (uint64_t)rnd_range(1, 3), hkv = (uint64_t)rnd_range(1, 4);
    uint64_t hq = hkv * (uint64_t)rnd_range(1, 4), d = (uint64_t)rnd_range(1, 128);
    uint64_t nq = (uint64_t)rnd_range(1, 40), nk = (uint64_t)rnd_range(1, 40);
    uint64_t qs[4] = {b, hq, nq, d}, ks[4] = {b, hkv, nk, d};
    memcpy(x->qs, qs, sizeof qs);
    memcpy(x->ks, ks, sizeof ks);
    memcpy(x->vs, ks, sizeof ks);
    contig(x->qs, x->qst);
    contig(x->ks, x->kst);
    contig(x->vs, x->vst);
    uint64_t qoff = x->esize * (uint64_t)rnd_range(0, 16);
    uint64_t qbytes = b * hq * nq * d * x->esize, kbytes = b * hkv * nk * d * x->esize;
    uint64_t koff = qoff + qbytes + x->esize * (uint64_t)rnd_range(0, 16);
    uint64_t voff = koff + kbytes;
    envelope_tensor(&x->q, 1, qoff, dt, x->qs, x->qst);
    envelope_tensor(&x->k, 1, koff, dt, x->ks, x->kst);
    envelope_tensor(&x->v, 1, voff, dt, x->vs, x->vst);
    x->end[0] = qoff + qbytes;
    x->end[1] = koff + kbytes;
    x->end[2] = voff + kbytes;
    attnstat__push__init(&x->p);
    x->p.seq = rnd();
    x->p.step = (int64_t)(rnd() % 100000);
    x->p.layer = (uint32_t)rnd_range(0, VALIDATE_MAX_LAYER);
    x->p.q = &x->q;
    x->p.k = &x->k;
    x->p.v = with_v ? &x->v : NULL;
    x->p.has_causal = 1;
    x->p.causal = (int)(rnd() & 1);
    memset(bufs, 0, sizeof bufs);
    bufs[1].kind = ATTNSTAT__BUFFER_KIND__HOST_SHM;
    bufs[1].size = with_v ? x->end[2] : x->end[1];
    bufs[1].base = mem;
    bufs[1].device = -1;
}

/* Gives x attention sinks: [1, Hq, 1, 1] of a random dtype, contiguous, in buffer 1 right after
 * the last tensor, which now ends exactly where they do. */
static void with_sinks(push_t *x)
{
    Attnstat__Dtype dt = (Attnstat__Dtype)rnd_range(0, 2);
    uint64_t es = esizes[dt], hq = x->qs[1];
    uint64_t shape[4] = {1, hq, 1, 1}, st[4] = {(uint64_t)rnd_range(0, 9), 1, 7, 1};
    memcpy(x->sks, shape, sizeof shape);
    memcpy(x->skst, st, sizeof st);
    uint64_t last = x->p.v ? x->end[2] : x->end[1];
    uint64_t off = (last + es - 1) / es * es + es * (uint64_t)rnd_range(0, 5);
    envelope_tensor(&x->sk, 1, off, dt, x->sks, x->skst);
    x->p.sinks = &x->sk;
    x->end[3] = off + hq * es;
    bufs[1].size = x->end[3];
}

static const validate_limits unlimited = {.max_push_work = UINT64_MAX,
                                          .max_push_work_gpu = UINT64_MAX,
                                          .collapse_threshold = 0.25f};

static Attnstat__Code check(push_t *x, const validate_limits *lim, validate_plan *plan, char *msg,
                            size_t msglen)
{
    return validate_push(&x->p, lookup, NULL, lim, plan, msg, msglen);
}

/* Expects code with needle in the message, and an empty plan. */
static void expect(push_t *x, Attnstat__Code code, const char *needle, const char *what)
{
    validate_plan plan;
    char msg[512] = "";
    Attnstat__Code got = check(x, &unlimited, &plan, msg, sizeof msg);
    ck_assert_msg(got == code, "%s: code %d (%s), expected %d", what, got, msg, code);
    ck_assert_msg(strstr(msg, needle), "%s: message '%s' lacks '%s'", what, msg, needle);
    ck_assert_msg(plan.cu_q == NULL && plan.cu_k == NULL && plan.ntensors == 0, "%s: plan kept", what);
}

/* ---- tests ---------------------------------------------------------------------------------- */

START_TEST(test_valid_pushes_give_their_plan)
{
    for (int iter = 0; iter < 300; iter++) {
        push_t x;
        int with_v = (int)(rnd() & 1);
        make_push(&x, with_v);
        uint32_t stats = (uint32_t)rnd() & VOCAB_STATS_ALL; /* any set of the table's rows */
        x.p.has_stats = iter % 3 != 0;
        x.p.stats = x.p.has_stats ? stats : 0;
        validate_plan plan;
        char msg[512] = "";
        ck_assert_msg(check(&x, &unlimited, &plan, msg, sizeof msg) == ATTNSTAT__CODE__OK, "%s", msg);
        const stats_problem *p = &plan.prob;
        ck_assert_uint_eq(p->want, x.p.stats); /* unset: 0, the defaults */
        ck_assert_int_eq(p->batch, (int32_t)x.qs[0]);
        ck_assert_int_eq(p->heads_q, (int32_t)x.qs[1]);
        ck_assert_int_eq(p->heads_kv, (int32_t)x.ks[1]);
        ck_assert_int_eq(p->len_q, (int32_t)x.qs[2]);
        ck_assert_int_eq(p->len_k, (int32_t)x.ks[2]);
        ck_assert_int_eq(p->head_dim, (int32_t)x.qs[3]);
        ck_assert_int_eq((int)p->dtype, (int)x.q.dtype);
        ck_assert_ptr_eq(p->q.ptr, mem + x.q.offset);
        ck_assert_ptr_eq(p->k.ptr, mem + x.k.offset);
        ck_assert_int_eq(p->q.stride_h, (int64_t)x.qst[1]);
        ck_assert_int_eq(p->k.stride_n, (int64_t)x.kst[2]);
        ck_assert_int_eq(p->causal, x.p.causal);
        ck_assert(p->collapse_threshold == 0.25f);
        ck_assert_int_eq(plan.ntensors, with_v ? 3 : 2);
        for (int i = 0; i < plan.ntensors; i++) {
            ck_assert_uint_eq(plan.buffer_id[i], 1);
            ck_assert_uint_eq(plan.need_bytes[i], x.end[i]);
        }
        ck_assert_uint_eq(plan.offset[1], x.k.offset);
        ck_assert_int_eq(plan.kind, ATTNSTAT__BUFFER_KIND__HOST_SHM);
        ck_assert_int_eq(plan.device, -1);
        /* every row of every sequence: rows x keys x Hq x D, plus K converted: keys x Hkv x D */
        uint64_t work = x.qs[0] * x.qs[2] * x.ks[2] * x.qs[1] * x.qs[3] + x.ks[0] * x.ks[2] * x.ks[1] * x.ks[3];
        ck_assert_uint_eq(plan.work, work);
        validate_plan_free(&plan);
    }
}
END_TEST

/* A tensor may end on its buffer's last byte, not one byte later: q, k and v, by offset or size. */
START_TEST(test_bounds_are_exact)
{
    for (int iter = 0; iter < 100; iter++) {
        push_t x;
        make_push(&x, 1);
        validate_plan plan;
        char msg[512];
        ck_assert(check(&x, &unlimited, &plan, msg, sizeof msg) == ATTNSTAT__CODE__OK);
        validate_plan_free(&plan);
        bufs[1].size--;
        expect(&x, ATTNSTAT__CODE__OUT_OF_BOUNDS, "v: offset", "v one byte past");
        bufs[1].size = x.end[1];
        x.p.v = NULL;
        ck_assert(check(&x, &unlimited, &plan, msg, sizeof msg) == ATTNSTAT__CODE__OK);
        validate_plan_free(&plan);
        x.k.offset += x.esize;
        expect(&x, ATTNSTAT__CODE__OUT_OF_BOUNDS, "past the end of buffer 1", "k one element past");
        x.k.offset -= x.esize;
        bufs[1].size = x.end[0] - 1; /* q itself past */
        expect(&x, ATTNSTAT__CODE__OUT_OF_BOUNDS, "q: offset", "q one byte past");
    }
}
END_TEST

START_TEST(test_overflow_is_refused)
{
    push_t x;
    make_push(&x, 0);
    x.qs[1] = 4;
    x.qst[1] = 1ull << 62; /* 3 x 2^62 elements: past int64 */
    expect(&x, ATTNSTAT__CODE__OUT_OF_BOUNDS, "overflows", "strides that overflow");
    make_push(&x, 0);
    x.q.offset = UINT64_MAX - (UINT64_MAX % x.esize) - x.esize * (uint64_t)rnd_range(0, 3);
    expect(&x, ATTNSTAT__CODE__OUT_OF_BOUNDS, "overflows", "offset + span over 2^64");
    make_push(&x, 0);
    x.kst[0] = (uint64_t)INT64_MAX + 1 + rnd() % 1000;
    expect(&x, ATTNSTAT__CODE__OUT_OF_BOUNDS, "k.strides[0]", "stride over int64");
    make_push(&x, 0);
    x.q.offset = 1ull << 63; /* no overflow, but past any buffer */
    expect(&x, ATTNSTAT__CODE__OUT_OF_BOUNDS, "q: offset", "offset far past");
}
END_TEST

/* Attention sinks: the plan points the problem at them (host) or at a placeholder (device), with
 * their dtype and index; they may end on the buffer's last byte and not one byte later; no sinks
 * leave the problem without. */
START_TEST(test_sinks_plan)
{
    for (int iter = 0; iter < 100; iter++) {
        push_t x;
        int with_v = (int)(rnd() & 1);
        make_push(&x, with_v);
        with_sinks(&x);
        validate_plan plan;
        char msg[512] = "";
        ck_assert_msg(check(&x, &unlimited, &plan, msg, sizeof msg) == ATTNSTAT__CODE__OK, "%s", msg);
        ck_assert_ptr_eq(plan.prob.sinks, mem + x.sk.offset);
        ck_assert_int_eq((int)plan.prob.sinks_dtype, (int)x.sk.dtype);
        ck_assert_int_eq(plan.ntensors, with_v ? 4 : 3);
        ck_assert_int_eq(plan.sinks_index, plan.ntensors - 1);
        ck_assert_int_eq(plan.mask_index, -1);
        ck_assert_uint_eq(plan.need_bytes[plan.sinks_index], x.end[3]);
        ck_assert_uint_eq(plan.offset[plan.sinks_index], x.sk.offset);
        validate_plan_free(&plan);
        bufs[1].size--;
        expect(&x, ATTNSTAT__CODE__OUT_OF_BOUNDS, "sinks: offset", "sinks one byte past");
        bufs[1].size++;
        x.sk.offset = UINT64_MAX - (UINT64_MAX % 4) - 4 * (uint64_t)rnd_range(0, 3);
        expect(&x, ATTNSTAT__CODE__OUT_OF_BOUNDS, "sinks", "sinks at an offset past 2^64");
        x.p.sinks = NULL;
        ck_assert(check(&x, &unlimited, &plan, msg, sizeof msg) == ATTNSTAT__CODE__OK);
        ck_assert_ptr_null(plan.prob.sinks);
        ck_assert_int_eq(plan.sinks_index, -1);
        validate_plan_free(&plan);
    }
    push_t x;
    make_push(&x, 0);
    with_sinks(&x);
    bufs[1].kind = ATTNSTAT__BUFFER_KIND__CUDA_IPC;
    bufs[1].base = NULL;
    bufs[1].device = 3;
    validate_plan plan;
    char msg[512] = "";
    ck_assert_msg(check(&x, &unlimited, &plan, msg, sizeof msg) == ATTNSTAT__CODE__OK, "%s", msg);
    ck_assert_ptr_nonnull(plan.prob.sinks); /* a placeholder until the GPU worker opens it */
    ck_assert_int_eq(plan.sinks_index, 2);
    validate_plan_free(&plan);
}
END_TEST

static int32_t cu_q[4], cu_k[4];

typedef struct {
    const char *what;
    void (*mutate)(push_t *x);
    Attnstat__Code code;
    const char *needle;
} rule;

static void r_no_k(push_t *x) { x->p.k = NULL; }
static void r_layer(push_t *x) { x->p.layer = VALIDATE_MAX_LAYER + 1 + (uint32_t)(rnd() % 1000); }
static void r_unknown(push_t *x) { x->k.buffer_id = 3; }
static void r_kind(push_t *x) { bufs[1].kind = 7; }
static void r_dtype(push_t *x) { x->q.dtype = (Attnstat__Dtype)(3 + rnd() % 100); }
static void r_nshape(push_t *x) { x->q.n_shape = 3; }
static void r_nstrides(push_t *x) { x->k.n_strides = 5; }
static void r_zero(push_t *x) { x->qs[rnd() % 4] = 0; }
static void r_heads(push_t *x) { x->qs[1] = VALIDATE_MAX_HEADS + 1; }
static void r_dim(push_t *x) { x->qs[3] = x->ks[3] = STATS_MAX_HEAD_DIM + 1; }
static void r_len(push_t *x) { x->ks[2] = (uint64_t)VALIDATE_MAX_LEN + 1; }
static void r_stride_d(push_t *x) { x->qst[3] = 2; }
static void r_misaligned(push_t *x) { x->q.offset += x->esize == 4 ? 2 : 1; }
static void r_v_dtype(push_t *x) { x->v.dtype = x->q.dtype == ATTNSTAT__DTYPE__F32 ? ATTNSTAT__DTYPE__BF16 : ATTNSTAT__DTYPE__F32; x->v.offset = 0; bufs[1].size = 1 << 30; }
static void r_k_dtype(push_t *x) { x->k.dtype = x->q.dtype == ATTNSTAT__DTYPE__F32 ? ATTNSTAT__DTYPE__BF16 : ATTNSTAT__DTYPE__F32; x->k.offset = 0; bufs[1].size = 1 << 30; }
static void r_kind_mix(push_t *x) { bufs[2] = bufs[1]; bufs[2].kind = ATTNSTAT__BUFFER_KIND__CUDA_IPC; bufs[2].base = NULL; bufs[2].device = 0; x->k.buffer_id = 2; }
static void r_device_mix(push_t *x) { r_kind_mix(x); bufs[1] = bufs[2]; bufs[2].device = 1; }
static void r_d_mismatch(push_t *x) { x->ks[3] = x->qs[3] + 1; x->k.offset = 0; contig(x->ks, x->kst); bufs[1].size = 1 << 30; }
static void r_heads_div(push_t *x) { x->qs[1] = 3; x->ks[1] = 2; contig(x->qs, x->qst); contig(x->ks, x->kst); x->k.offset = 0; bufs[1].size = 1 << 30; }
static void r_b_mismatch(push_t *x) { x->ks[0] = x->qs[0] + 1; x->kst[0] = 0; }
static void packed(push_t *x) { x->qs[0] = x->ks[0] = 1; x->p.n_cu_seqlens_q = x->p.n_cu_seqlens_k = 3; cu_q[0] = cu_k[0] = 0; cu_q[1] = (int32_t)x->qs[2] / 2; cu_k[1] = (int32_t)x->ks[2] / 2; cu_q[2] = (int32_t)x->qs[2]; cu_k[2] = (int32_t)x->ks[2]; x->p.cu_seqlens_q = cu_q; x->p.cu_seqlens_k = cu_k; }
static void r_cu_counts(push_t *x) { packed(x); x->p.n_cu_seqlens_k = 2; }
static void r_cu_one(push_t *x) { packed(x); x->p.n_cu_seqlens_q = x->p.n_cu_seqlens_k = 1; }
static void r_cu_many(push_t *x) { packed(x); x->p.n_cu_seqlens_q = x->p.n_cu_seqlens_k = VALIDATE_MAX_SEQS + 2; }
static void r_cu_batch(push_t *x) { packed(x); x->qs[0] = 2; bufs[1].size = 1 << 30; }
static void r_cu_order(push_t *x) { packed(x); cu_q[1] = cu_q[2] + 1; }
static void r_cu_total(push_t *x) { packed(x); cu_k[2] = (int32_t)x->ks[2] + 1; }
static void r_event(push_t *x) { x->p.has_event_id = 1; x->p.event_id = (uint32_t)rnd() % 100; }
static void r_sample(push_t *x) { x->p.has_sample_every = 1; x->p.sample_every = 0x80000000u + (uint32_t)(rnd() % 100); }
static void r_two_samplings(push_t *x) { x->p.has_sample_every = 1; x->p.sample_every = 2; x->p.has_sample_rows = 1; x->p.sample_rows = 3; }
static void r_window(push_t *x) { x->p.causal = 1; x->p.has_window_right = 1; x->p.window_right = 1 + (int32_t)(rnd() % 10); }
static void r_scale(push_t *x) { x->p.has_scale = 1; x->p.scale = -(float)(1 + rnd() % 10); }
static void r_softcap(push_t *x) { x->p.has_softcap = 1; x->p.softcap = NAN; }
static void r_stats(push_t *x) { x->p.has_stats = 1; x->p.stats = ((uint32_t)rnd() & VOCAB_STATS_ALL) | 1u << (VOCAB_NSTATS + rnd() % (32 - VOCAB_NSTATS)); }

static void r_sinks_dtype(push_t *x) { with_sinks(x); x->sk.dtype = ATTNSTAT__DTYPE__BOOL; }
static void r_sinks_heads(push_t *x) { with_sinks(x); x->sks[1] = x->qs[1] + 1 + rnd() % 3; }
static void r_sinks_shape(push_t *x) { with_sinks(x); x->sks[2] = 2; }
static void r_sinks_dims(push_t *x) { with_sinks(x); x->sk.n_shape = 2; }
static void r_sinks_stride(push_t *x) { with_sinks(x); x->qs[1] = x->ks[1] * 2; contig(x->qs, x->qst); x->sks[1] = x->qs[1]; x->skst[1] = 2; bufs[1].size = 1 << 30; }
static void r_sinks_unknown(push_t *x) { with_sinks(x); x->sk.buffer_id = 4; }
static void r_sinks_kind(push_t *x) { with_sinks(x); bufs[2] = bufs[1]; bufs[2].kind = ATTNSTAT__BUFFER_KIND__CUDA_IPC; bufs[2].base = NULL; bufs[2].device = 0; x->sk.buffer_id = 2; }
static void r_sinks_misaligned(push_t *x) { with_sinks(x); x->sk.dtype = ATTNSTAT__DTYPE__F32; x->sk.offset = 4 * (x->sk.offset / 4) + 2; bufs[1].size = 1 << 30; }

static const rule rules[] = {
    {"sinks dtype", r_sinks_dtype, ATTNSTAT__CODE__BAD_REQUEST, "sinks.dtype 3 (bool) is not a sink logit"},
    {"sinks heads", r_sinks_heads, ATTNSTAT__CODE__BAD_REQUEST, "one sink per query head"},
    {"sinks shape", r_sinks_shape, ATTNSTAT__CODE__BAD_REQUEST, "sinks.shape[2] is 2; it must be 1"},
    {"sinks dims", r_sinks_dims, ATTNSTAT__CODE__BAD_REQUEST, "sinks needs 4 dimensions"},
    {"sinks stride", r_sinks_stride, ATTNSTAT__CODE__BAD_REQUEST, "sinks.strides[1] is 2"},
    {"sinks buffer", r_sinks_unknown, ATTNSTAT__CODE__UNKNOWN_BUFFER, "sinks.buffer_id 4"},
    {"sinks kind", r_sinks_kind, ATTNSTAT__CODE__BAD_REQUEST, "the sinks are in a CUDA_IPC buffer"},
    {"sinks misaligned", r_sinks_misaligned, ATTNSTAT__CODE__BAD_REQUEST, "sinks.offset"},
    {"no k", r_no_k, ATTNSTAT__CODE__BAD_REQUEST, "needs both q and k"},
    {"layer", r_layer, ATTNSTAT__CODE__BAD_REQUEST, "out of range"},
    {"unknown buffer", r_unknown, ATTNSTAT__CODE__UNKNOWN_BUFFER, "k.buffer_id 3"},
    {"unknown kind", r_kind, ATTNSTAT__CODE__UNSUPPORTED, "buffer kind 7"},
    {"unknown dtype", r_dtype, ATTNSTAT__CODE__BAD_REQUEST, "is not a dtype"},
    {"3 dims", r_nshape, ATTNSTAT__CODE__BAD_REQUEST, "q.shape has 3 dimensions"},
    {"5 strides", r_nstrides, ATTNSTAT__CODE__BAD_REQUEST, "k.strides has 5 entries"},
    {"zero dim", r_zero, ATTNSTAT__CODE__BAD_REQUEST, "is 0; it must be in [1, "},
    {"heads", r_heads, ATTNSTAT__CODE__BAD_REQUEST, "q.shape[1] (H) is 4097"},
    {"head dim", r_dim, ATTNSTAT__CODE__BAD_REQUEST, "q.shape[3] (D) is 257"},
    {"length", r_len, ATTNSTAT__CODE__BAD_REQUEST, "k.shape[2] (N) is 1073741825"},
    {"D stride", r_stride_d, ATTNSTAT__CODE__BAD_REQUEST, "q.strides[3] is 2"},
    {"misaligned", r_misaligned, ATTNSTAT__CODE__BAD_REQUEST, "not a multiple of the"},
    {"v dtype", r_v_dtype, ATTNSTAT__CODE__BAD_REQUEST, "v.dtype"},
    {"k dtype", r_k_dtype, ATTNSTAT__CODE__BAD_REQUEST, "differs from q.dtype"},
    {"kinds mixed", r_kind_mix, ATTNSTAT__CODE__BAD_REQUEST, "k is in a CUDA_IPC buffer (device 0) but q in a HOST_SHM"},
    {"devices mixed", r_device_mix, ATTNSTAT__CODE__BAD_REQUEST, "(device 1) but q in a CUDA_IPC buffer (device 0)"},
    {"D mismatch", r_d_mismatch, ATTNSTAT__CODE__BAD_REQUEST, "k.shape[3] (D)"},
    {"heads not divisible", r_heads_div, ATTNSTAT__CODE__BAD_REQUEST, "not a multiple of k heads"},
    {"B mismatch", r_b_mismatch, ATTNSTAT__CODE__BAD_REQUEST, "k.shape[0] (B)"},
    {"cu counts", r_cu_counts, ATTNSTAT__CODE__BAD_REQUEST, "both need B + 1"},
    {"cu one", r_cu_one, ATTNSTAT__CODE__BAD_REQUEST, "it needs 2 .. 65537"},
    {"cu many", r_cu_many, ATTNSTAT__CODE__BAD_REQUEST, "it needs 2 .. 65537"},
    {"cu batch", r_cu_batch, ATTNSTAT__CODE__BAD_REQUEST, "need q.shape[0] = k.shape[0] = 1"},
    {"cu order", r_cu_order, ATTNSTAT__CODE__BAD_REQUEST, "cu_seqlens_q"},
    {"cu total", r_cu_total, ATTNSTAT__CODE__BAD_REQUEST, "cu_seqlens_k"},
    {"event on host", r_event, ATTNSTAT__CODE__UNKNOWN_BUFFER, "host buffers need no event"},
    {"sample_every", r_sample, ATTNSTAT__CODE__BAD_REQUEST, "must be under 2^31"},
    {"two samplings", r_two_samplings, ATTNSTAT__CODE__BAD_REQUEST, "choose one sampling"},
    {"causal window", r_window, ATTNSTAT__CODE__BAD_REQUEST, "window_right"},
    {"scale", r_scale, ATTNSTAT__CODE__BAD_REQUEST, "scale"},
    {"softcap", r_softcap, ATTNSTAT__CODE__BAD_REQUEST, "softcap"},
    {"stats past the table", r_stats, ATTNSTAT__CODE__BAD_REQUEST, "asks for statistics this daemon does not have"},
};

/* Every rule, on fresh random pushes: its code and a message naming the field. */
START_TEST(test_each_rule)
{
    for (size_t i = 0; i < sizeof rules / sizeof rules[0]; i++) {
        for (int iter = 0; iter < 20; iter++) {
            push_t x;
            make_push(&x, rules[i].mutate == r_v_dtype);
            rules[i].mutate(&x);
            expect(&x, rules[i].code, rules[i].needle, rules[i].what);
        }
    }
}
END_TEST

/* max_push_work: a push of exactly the limit passes, one multiply-add less refuses it. */
START_TEST(test_work_limit_is_exact)
{
    for (int iter = 0; iter < 100; iter++) {
        push_t x;
        make_push(&x, 0);
        if (rnd() & 1) {
            x.p.has_sample_rows = 1;
            x.p.sample_rows = (uint32_t)rnd_range(1, 8);
        }
        validate_plan plan;
        char msg[512];
        ck_assert(check(&x, &unlimited, &plan, msg, sizeof msg) == ATTNSTAT__CODE__OK);
        uint64_t work = plan.work;
        validate_plan_free(&plan);
        ck_assert_uint_gt(work, 0);
        validate_limits lim = {.max_push_work = work, .max_push_work_gpu = work,
                               .collapse_threshold = 0.1f};
        ck_assert(check(&x, &lim, &plan, msg, sizeof msg) == ATTNSTAT__CODE__OK);
        validate_plan_free(&plan);
        lim.max_push_work = lim.max_push_work_gpu = work - 1;
        ck_assert(check(&x, &lim, &plan, msg, sizeof msg) == ATTNSTAT__CODE__BAD_REQUEST);
        ck_assert_msg(strstr(msg, "is over max_push_work"), "%s", msg);
    }
}
END_TEST

/* Huge shapes over a tiny buffer (zero strides): the work saturates, it does not wrap to small. */
START_TEST(test_work_saturates)
{
    push_t x;
    make_push(&x, 0);
    x.qs[0] = x.ks[0] = VALIDATE_MAX_DIM;
    x.qs[1] = VALIDATE_MAX_HEADS;
    x.ks[1] = 1;
    x.qs[2] = x.ks[2] = VALIDATE_MAX_LEN;
    x.qs[3] = x.ks[3] = STATS_MAX_HEAD_DIM;
    memset(x.qst, 0, 3 * sizeof x.qst[0]);
    memset(x.kst, 0, 3 * sizeof x.kst[0]);
    x.q.offset = x.k.offset = 0;
    bufs[1].size = STATS_MAX_HEAD_DIM * 4;
    validate_limits lim = {.max_push_work = UINT64_MAX - 1, .max_push_work_gpu = UINT64_MAX - 1,
                           .collapse_threshold = 0.1f};
    validate_plan plan;
    char msg[512];
    ck_assert(check(&x, &lim, &plan, msg, sizeof msg) == ATTNSTAT__CODE__BAD_REQUEST);
    ck_assert_msg(strstr(msg, "18446744073709551615 multiply-adds"), "%s", msg);
}
END_TEST

/* Packed sequences: the offsets are copied into the plan (the message may go), the work sums the
 * sequences. */
START_TEST(test_packed_plan)
{
    for (int iter = 0; iter < 50; iter++) {
        push_t x;
        make_push(&x, 0);
        packed(&x);
        validate_plan plan;
        char msg[512];
        ck_assert_msg(check(&x, &unlimited, &plan, msg, sizeof msg) == ATTNSTAT__CODE__OK, "%s", msg);
        ck_assert_int_eq(plan.prob.batch, 2);
        ck_assert_ptr_nonnull(plan.cu_q);
        ck_assert_ptr_ne(plan.cu_q, cu_q);
        ck_assert_ptr_eq(plan.prob.cu_seqlens_q, plan.cu_q);
        ck_assert_ptr_eq(plan.prob.cu_seqlens_k, plan.cu_k);
        ck_assert_mem_eq(plan.cu_q, cu_q, 3 * sizeof cu_q[0]);
        ck_assert_mem_eq(plan.cu_k, cu_k, 3 * sizeof cu_k[0]);
        uint64_t work = 0;
        for (int s = 0; s < 2; s++) {
            uint64_t lq = (uint64_t)(cu_q[s + 1] - cu_q[s]), lk = (uint64_t)(cu_k[s + 1] - cu_k[s]);
            if (lq > 0)
                work += lq * lk * x.qs[1] * x.qs[3] + lk * x.ks[1] * x.ks[3];
        }
        ck_assert_uint_eq(plan.work, work);
        validate_plan_free(&plan);
        ck_assert_ptr_null(plan.cu_q);
    }
}
END_TEST

/* Device buffers: nothing is mapped; the problem gets placeholders, the plan the device. */
START_TEST(test_device_plan)
{
    push_t x;
    make_push(&x, 0);
    int dev = (int)rnd_range(0, 7);
    bufs[1].kind = ATTNSTAT__BUFFER_KIND__CUDA_IPC;
    bufs[1].base = NULL;
    bufs[1].device = dev;
    validate_plan plan;
    char msg[512];
    ck_assert_msg(check(&x, &unlimited, &plan, msg, sizeof msg) == ATTNSTAT__CODE__OK, "%s", msg);
    ck_assert_int_eq(plan.kind, ATTNSTAT__BUFFER_KIND__CUDA_IPC);
    ck_assert_int_eq(plan.device, dev);
    ck_assert_ptr_nonnull(plan.prob.q.ptr);
    ck_assert_uint_eq(plan.need_bytes[1], x.end[1]);
    validate_plan_free(&plan);
    x.p.has_event_id = 1; /* an event is the device push's: not refused here */
    ck_assert(check(&x, &unlimited, &plan, msg, sizeof msg) == ATTNSTAT__CODE__OK);
    validate_plan_free(&plan);
}
END_TEST

/* x's q and k with B = 1, contiguous (where they were: the buffer still holds them). */
static void batch_of_one(push_t *x)
{
    x->qs[0] = x->ks[0] = 1;
    contig(x->qs, x->qst);
    contig(x->ks, x->kst);
}

/* A dimension of 1 is never stepped along: a stride there longer than the buffer (any value a view
 * may leave) is accepted and becomes 0, so that no backend's stride x element size overflows; one
 * within the buffer is kept as given. */
START_TEST(test_unit_dimension_strides)
{
    for (int iter = 0; iter < 50; iter++) {
        push_t x;
        make_push(&x, 0);
        batch_of_one(&x);
        bufs[1].size = 1u << 30;
        uint64_t huge = (uint64_t)INT64_MAX / (uint64_t)rnd_range(1, 4), small = (uint64_t)rnd_range(1, 9);
        x.qst[0] = huge;
        x.kst[0] = small;
        validate_plan plan;
        char msg[512] = "";
        ck_assert_msg(check(&x, &unlimited, &plan, msg, sizeof msg) == ATTNSTAT__CODE__OK, "%s", msg);
        ck_assert_int_eq(plan.prob.q.stride_b, 0);
        ck_assert_int_eq(plan.prob.k.stride_b, (int64_t)small);
        ck_assert_int_eq(plan.prob.q.stride_h, (int64_t)x.qst[1]);
        validate_plan_free(&plan);
    }
}
END_TEST

/* Packed offsets on the device (cu_seqlens_*_ref, I32 [1, 1, B + 1, 1], in q's CUDA buffer after k):
 * the plan names them with their spans (4 bytes an entry), ending on the buffer's last byte and
 * not one byte later; an offset not a multiple of 4 is refused. I32 is no statistics dtype: its
 * element size once divided by zero and took the daemon down. */
START_TEST(test_device_packed_plan)
{
    for (int iter = 0; iter < 50; iter++) {
        push_t x;
        make_push(&x, 0);
        batch_of_one(&x);
        uint64_t entries = (uint64_t)rnd_range(2, 4), cus[4] = {1, 1, entries, 1}, cust[4];
        contig(cus, cust);
        Attnstat__TensorRef cq, ck;
        uint64_t qoff = (x.end[1] + 3) / 4 * 4 + 4 * (uint64_t)rnd_range(0, 8);
        uint64_t koff = qoff + 4 * entries + 4 * (uint64_t)rnd_range(0, 8);
        envelope_tensor(&cq, 1, qoff, ATTNSTAT__DTYPE__I32, cus, cust);
        envelope_tensor(&ck, 1, koff, ATTNSTAT__DTYPE__I32, cus, cust);
        x.p.cu_seqlens_q_ref = &cq;
        x.p.cu_seqlens_k_ref = &ck;
        bufs[1].kind = ATTNSTAT__BUFFER_KIND__CUDA_IPC;
        bufs[1].base = NULL;
        bufs[1].device = 0;
        bufs[1].size = koff + 4 * entries;
        validate_plan plan;
        char msg[512] = "";
        ck_assert_msg(check(&x, &unlimited, &plan, msg, sizeof msg) == ATTNSTAT__CODE__OK, "%s", msg);
        ck_assert_int_eq(plan.prob.batch, (int)entries - 1);
        ck_assert_int_eq(plan.ntensors, 4);
        ck_assert_int_eq(plan.cu_index, 2);
        ck_assert_uint_eq(plan.offset[2], qoff);
        ck_assert_uint_eq(plan.need_bytes[2], qoff + 4 * entries);
        ck_assert_uint_eq(plan.offset[3], koff);
        ck_assert_uint_eq(plan.need_bytes[3], koff + 4 * entries);
        ck_assert_ptr_nonnull(plan.prob.cu_seqlens_q); /* placeholders until the worker opens them */
        validate_plan_free(&plan);
        bufs[1].size--;
        expect(&x, ATTNSTAT__CODE__OUT_OF_BOUNDS, "cu_seqlens_k_ref: offset", "offsets one byte past");
        bufs[1].size++;
        cq.offset += 2;
        expect(&x, ATTNSTAT__CODE__BAD_REQUEST, "cu_seqlens_q_ref.offset", "offsets misaligned");
        cq.offset -= 2;
        bufs[1].size = 1u << 20;
        cust[2] = 2; /* every other entry: the kernels read consecutive ones */
        expect(&x, ATTNSTAT__CODE__BAD_REQUEST, "must be contiguous", "offsets strided");
    }
}
END_TEST

/* A mask on the device is scanned whole before the statistics (each row's interval of keys): its
 * elements, broadcast dimensions once, count in the push's work; on the host they do not (the CPU
 * backend reads the mask only where it computes). */
START_TEST(test_device_mask_work)
{
    for (int iter = 0; iter < 50; iter++) {
        push_t x;
        make_push(&x, 0);
        uint64_t mb = rnd() & 1 ? x.qs[0] : 1, mh = rnd() & 1 ? x.qs[1] : 1;
        uint64_t ms[4] = {mb, mh, x.qs[2], x.ks[2]}, mst[4];
        contig(ms, mst);
        Attnstat__TensorRef m;
        envelope_tensor(&m, 1, x.end[1], ATTNSTAT__DTYPE__BOOL, ms, mst);
        x.p.mask = &m;
        bufs[1].size = x.end[1] + mb * mh * x.qs[2] * x.ks[2];
        validate_plan host, dev;
        char msg[512] = "";
        ck_assert_msg(check(&x, &unlimited, &host, msg, sizeof msg) == ATTNSTAT__CODE__OK, "%s", msg);
        bufs[1].kind = ATTNSTAT__BUFFER_KIND__CUDA_IPC;
        bufs[1].base = NULL;
        bufs[1].device = 0;
        ck_assert_msg(check(&x, &unlimited, &dev, msg, sizeof msg) == ATTNSTAT__CODE__OK, "%s", msg);
        ck_assert_uint_eq(dev.work - host.work, mb * mh * x.qs[2] * x.ks[2]);
        validate_limits lim = unlimited;
        lim.max_push_work_gpu = dev.work - 1;
        validate_plan_free(&dev);
        ck_assert(check(&x, &lim, &dev, msg, sizeof msg) == ATTNSTAT__CODE__BAD_REQUEST);
        ck_assert_msg(strstr(msg, "for scanning a device mask: its elements"), "%s", msg);
        validate_plan_free(&host);
    }
}
END_TEST

START_TEST(test_device_span)
{
    char msg[256];
    uint64_t reg = 4096 + rnd() % 100000, real = reg + rnd() % 100;
    ck_assert(validate_device_span("q", reg, reg, real, msg, sizeof msg) == ATTNSTAT__CODE__OK);
    ck_assert(validate_device_span("k", reg + 1, reg, real + 1000, msg, sizeof msg) ==
              ATTNSTAT__CODE__OUT_OF_BOUNDS);
    ck_assert_msg(strstr(msg, "k reads up to byte") && strstr(msg, "registered size"), "%s", msg);
    ck_assert(validate_device_span("v", reg, reg + 10, reg - 1, msg, sizeof msg) ==
              ATTNSTAT__CODE__OUT_OF_BOUNDS);
    ck_assert_msg(strstr(msg, "device allocation"), "%s", msg);
}
END_TEST

START_TEST(test_shm_name)
{
    char msg[300], name[300];
    ck_assert_int_eq(validate_shm_name("/a", msg, sizeof msg), 0);
    ck_assert_int_eq(validate_shm_name("/attnstat-x.1", msg, sizeof msg), 0);
    const char *bad[] = {NULL, "", "/", "a", "a/b", "/a/b", "//"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        msg[0] = '\0';
        ck_assert_int_eq(validate_shm_name(bad[i], msg, sizeof msg), -1);
        ck_assert_msg(strstr(msg, "must be '/name'"), "'%s': %s", bad[i] ? bad[i] : "NULL", msg);
    }
    name[0] = '/';
    memset(name + 1, 'n', 254);
    name[255] = '\0';
    ck_assert_int_eq(validate_shm_name(name, msg, sizeof msg), 0); /* 255 bytes */
    name[255] = 'n';
    name[256] = '\0';
    ck_assert_int_eq(validate_shm_name(name, msg, sizeof msg), -1);
}
END_TEST

START_TEST(test_thresholds)
{
    char msg[256];
    ck_assert_int_eq(validate_thresholds(NULL, msg, sizeof msg), 0);
    Attnstat__Thresholds t = ATTNSTAT__THRESHOLDS__INIT;
    t.has_entropy_floor = t.has_entropy_drop = t.has_ema_alpha = t.has_collapse_threshold = 1;
    t.entropy_floor = (double)(rnd() % 1000) / 1000.0;
    t.entropy_drop = (double)(1 + rnd() % 999) / 1000.0; /* (0, 1) */
    t.ema_alpha = (double)(1 + rnd() % 1000) / 1000.0;   /* (0, 1] */
    t.collapse_threshold = (double)(1 + rnd() % 1000) / 1000.0;
    t.has_logit_ceiling = t.has_raise_after = t.has_clear_after = 1;
    t.logit_ceiling = 1.0 + (double)(rnd() % 100000);
    t.raise_after = (uint32_t)rnd_range(1, 1000000);
    t.clear_after = (uint32_t)rnd_range(1, 1000000);
    t.has_sink_mass_ceiling = t.has_distance_floor = 1;
    t.sink_mass_ceiling = (double)(1 + rnd() % 1000) / 1000.0; /* (0, 1] */
    t.distance_floor = (double)(rnd() % 100000) / 100.0;      /* [0, 1000) */
    ck_assert_int_eq(validate_thresholds(&t, msg, sizeof msg), 0);
    /* the bounds themselves, where they are inclusive */
    Attnstat__Thresholds edge = t;
    edge.entropy_floor = 1.0, edge.sink_mass_ceiling = 1.0, edge.distance_floor = 0.0;
    edge.ema_alpha = 1.0;
    ck_assert_msg(validate_thresholds(&edge, msg, sizeof msg) == 0, "%s", msg);
    struct {
        const char *field;
        Attnstat__Thresholds t;
    } bad[15];
    for (int i = 0; i < 15; i++)
        bad[i].t = t;
    bad[0].field = "entropy_floor", bad[0].t.entropy_floor = 1.0 + 1e-9;
    bad[1].field = "entropy_drop", bad[1].t.entropy_drop = -0.5;
    bad[2].field = "ema_alpha", bad[2].t.ema_alpha = NAN;
    bad[3].field = "collapse_threshold", bad[3].t.collapse_threshold = 0.0;
    bad[4].field = "logit_ceiling", bad[4].t.logit_ceiling = INFINITY;
    bad[5].field = "logit_ceiling", bad[5].t.logit_ceiling = 0.0;
    bad[6].field = "raise_after", bad[6].t.raise_after = 0;
    bad[7].field = "clear_after", bad[7].t.clear_after = 1000001;
    bad[8].field = "collapse_threshold", bad[8].t.collapse_threshold = 2.0;
    bad[9].field = "sink_mass_ceiling", bad[9].t.sink_mass_ceiling = 0.0;
    bad[10].field = "sink_mass_ceiling", bad[10].t.sink_mass_ceiling = 1.0 + 1e-9;
    bad[11].field = "distance_floor", bad[11].t.distance_floor = -1e-9;
    bad[12].field = "distance_floor", bad[12].t.distance_floor = NAN;
    bad[13].field = "entropy_drop", bad[13].t.entropy_drop = 0.0;
    bad[14].field = "ema_alpha", bad[14].t.ema_alpha = 0.0;
    for (int i = 0; i < 15; i++) {
        msg[0] = '\0';
        ck_assert_int_eq(validate_thresholds(&bad[i].t, msg, sizeof msg), -1);
        ck_assert_msg(strstr(msg, bad[i].field), "%d: '%s' lacks %s", i, msg, bad[i].field);
    }
}
END_TEST

int main(void)
{
    R = dh_rng_new("test_validate");
    mem = malloc(2 << 20);
    for (int i = 0; i < (2 << 20); i++)
        mem[i] = (uint8_t)rnd();
    Suite *s = suite_create("validate");
    TCase *tc = tcase_create("validate");
    tcase_add_test(tc, test_valid_pushes_give_their_plan);
    tcase_add_test(tc, test_sinks_plan);
    tcase_add_test(tc, test_bounds_are_exact);
    tcase_add_test(tc, test_overflow_is_refused);
    tcase_add_test(tc, test_each_rule);
    tcase_add_test(tc, test_work_limit_is_exact);
    tcase_add_test(tc, test_work_saturates);
    tcase_add_test(tc, test_packed_plan);
    tcase_add_test(tc, test_device_plan);
    tcase_add_test(tc, test_device_packed_plan);
    tcase_add_test(tc, test_unit_dimension_strides);
    tcase_add_test(tc, test_device_mask_work);
    tcase_add_test(tc, test_device_span);
    tcase_add_test(tc, test_shm_name);
    tcase_add_test(tc, test_thresholds);
    suite_add_tcase(s, tc);
    int failed = dh_run(s);
    free(mem);
    return failed;
}
