/* validate.c — Push validation, and an Intervention's fields (see validate.h). Stage: validate
 * (pure); calls names, util and wirerow; a Hello's thresholds and a Computed's heads are checked
 * by vocab.h's rows.
 * Checks run in the order a person would fix them: the buffer exists, the tensor description is
 * well formed, it fits in its buffer, q and k agree, packed offsets are consistent, then options
 * (via stats_validate) and the work limit. */
#include "validate.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "names.h"
#include "util.h"
#include "vocab.h"
#include "wirerow.h"

/* Writes the message to msg[msglen] (in scope wherever it is used) and evaluates to code. */
#define FAIL(code, ...) (util_err(msg, msglen, __VA_ARGS__), (code))

static const char *const dim_names[4] = {"B", "H", "N", "D"};

typedef struct {
    const validate_buffer *buf;
    int64_t shape[4], stride[4];
    uint64_t need;          /* offset + bytes spanned */
    stats_dtype dtype;
} tensor_info;

/* Bytes of one element of a wire dtype: the statistics' (F32, F16, BF16, BOOL) and I32, the wire's
 * alone (device packed offsets); 0 for any other value. */
static uint64_t wire_esize(Attnstat__Dtype dt)
{
    return dt == ATTNSTAT__DTYPE__I32 ? 4 : stats_dtype_size((stats_dtype)dt);
}

static Attnstat__Code check_tensor(const char *name, const Attnstat__TensorRef *t,
                                   validate_lookup_fn lookup, void *ctx, tensor_info *ti, char *msg,
                                   size_t msglen)
{
    ti->buf = lookup(ctx, t->buffer_id);
    if (!ti->buf)
        return FAIL(ATTNSTAT__CODE__UNKNOWN_BUFFER,
                    "%s.buffer_id %u is not a registered buffer (RegisterBuffer it first)", name,
                    t->buffer_id);
    if (ti->buf->kind != ATTNSTAT__BUFFER_KIND__HOST_SHM &&
        ti->buf->kind != ATTNSTAT__BUFFER_KIND__CUDA_IPC)
        return FAIL(ATTNSTAT__CODE__UNSUPPORTED,
                    "%s.buffer_id %u: buffer kind %d cannot be computed by this daemon", name,
                    t->buffer_id, ti->buf->kind);
    if (t->dtype != ATTNSTAT__DTYPE__F32 && t->dtype != ATTNSTAT__DTYPE__F16 &&
        t->dtype != ATTNSTAT__DTYPE__BF16)
        return FAIL(ATTNSTAT__CODE__BAD_REQUEST,
                    "%s.dtype %d (%s) is not a dtype of q, k or v (F32=0, F16=1, BF16=2)", name,
                    (int)t->dtype, names_dtype((int)t->dtype));
    ti->dtype = (stats_dtype)t->dtype;
    if (t->n_shape != 4)
        return FAIL(ATTNSTAT__CODE__BAD_REQUEST,
                    "%s.shape has %zu dimensions; expected 4: [B, H, N, D]", name, t->n_shape);
    if (t->n_strides != 4)
        return FAIL(ATTNSTAT__CODE__BAD_REQUEST,
                    "%s.strides has %zu entries; expected 4 element strides for [B, H, N, D]", name,
                    t->n_strides);
    for (int i = 0; i < 4; i++) {
        uint64_t v = t->shape[i];
        uint64_t max = i == 1   ? VALIDATE_MAX_HEADS
                       : i == 2 ? VALIDATE_MAX_LEN
                       : i == 3 ? STATS_MAX_HEAD_DIM
                                : VALIDATE_MAX_DIM;
        if (v == 0 || v > max)
            return FAIL(ATTNSTAT__CODE__BAD_REQUEST,
                        "%s.shape[%d] (%s) is %llu; it must be in [1, %llu]", name, i, dim_names[i],
                        (unsigned long long)v, (unsigned long long)max);
        if (t->strides[i] > (uint64_t)INT64_MAX)
            return FAIL(ATTNSTAT__CODE__OUT_OF_BOUNDS,
                        "%s.strides[%d] (%s) is %llu, past any buffer", name, i, dim_names[i],
                        (unsigned long long)t->strides[i]);
        ti->shape[i] = (int64_t)v;
        ti->stride[i] = (int64_t)t->strides[i];
    }
    if (ti->stride[3] != 1)
        return FAIL(ATTNSTAT__CODE__BAD_REQUEST,
                    "%s.strides[3] is %lld; the head dimension D must be contiguous (stride 1)", name,
                    (long long)ti->stride[3]);
    uint64_t esize = wire_esize(t->dtype);
    if (t->offset % esize != 0)
        return FAIL(ATTNSTAT__CODE__BAD_REQUEST,
                    "%s.offset %llu is not a multiple of the %s element size (%llu bytes)", name,
                    (unsigned long long)t->offset, names_dtype((int)ti->dtype),
                    (unsigned long long)esize);
    int64_t ext = stats_tensor_extent(ti->shape[0], ti->shape[1], ti->shape[2], ti->shape[3],
                                      ti->stride[0], ti->stride[1], ti->stride[2]);
    uint64_t bytes, end;
    if (ext < 0 || __builtin_mul_overflow((uint64_t)ext, esize, &bytes) ||
        __builtin_add_overflow(t->offset, bytes, &end))
        return FAIL(ATTNSTAT__CODE__OUT_OF_BOUNDS,
                    "%s: shape [%lld,%lld,%lld,%lld] with strides [%lld,%lld,%lld,1] at offset %llu "
                    "overflows 64-bit offsets",
                    name, (long long)ti->shape[0], (long long)ti->shape[1], (long long)ti->shape[2],
                    (long long)ti->shape[3], (long long)ti->stride[0], (long long)ti->stride[1],
                    (long long)ti->stride[2], (unsigned long long)t->offset);
    if (end > ti->buf->size)
        return FAIL(ATTNSTAT__CODE__OUT_OF_BOUNDS,
                    "%s: offset %llu + %llu bytes spanned by shape [%lld,%lld,%lld,%lld] with strides "
                    "[%lld,%lld,%lld,1] reads up to byte %llu, past the end of buffer %u (%llu bytes)",
                    name, (unsigned long long)t->offset, (unsigned long long)bytes,
                    (long long)ti->shape[0], (long long)ti->shape[1], (long long)ti->shape[2],
                    (long long)ti->shape[3], (long long)ti->stride[0], (long long)ti->stride[1],
                    (long long)ti->stride[2], (unsigned long long)end, t->buffer_id,
                    (unsigned long long)ti->buf->size);
    /* A dimension of 1 is never stepped along, so its stride is free (PyTorch gives such strides
     * any value after a view); one longer than the buffer becomes 0, so that no backend's byte
     * arithmetic on it (stride x element size) can overflow. */
    for (int i = 0; i < 3; i++)
        if (ti->shape[i] == 1 && (uint64_t)ti->stride[i] > ti->buf->size / esize)
            ti->stride[i] = 0;
    ti->need = end;
    return ATTNSTAT__CODE__OK;
}

/* The span of an auxiliary tensor (the mask, device offsets): its buffer, dtype, 4 dimensions of
 * which each is 1 or want[i] (want[i] 0: any size up to VALIDATE_MAX_DIM), the last contiguous
 * unless it has one element; a dimension of 1 is broadcast (its stride is not used). Fills ti
 * (shape, strides with 0 where broadcast, need). */
static Attnstat__Code check_aux(const char *name, const Attnstat__TensorRef *t,
                                const int64_t want[4], int one_ok, validate_lookup_fn lookup,
                                void *ctx, tensor_info *ti, char *msg, size_t msglen)
{
    ti->buf = lookup(ctx, t->buffer_id);
    if (!ti->buf)
        return FAIL(ATTNSTAT__CODE__UNKNOWN_BUFFER,
                    "%s.buffer_id %u is not a registered buffer (RegisterBuffer it first)", name,
                    t->buffer_id);
    ti->dtype = (stats_dtype)t->dtype;
    if (t->n_shape != 4 || t->n_strides != 4)
        return FAIL(ATTNSTAT__CODE__BAD_REQUEST,
                    "%s needs 4 dimensions and 4 strides (it has %zu and %zu)", name, t->n_shape,
                    t->n_strides);
    for (int i = 0; i < 4; i++) {
        uint64_t v = t->shape[i];
        int ok = want[i] ? (v == (uint64_t)want[i] || (one_ok && v == 1))
                         : (v >= 1 && v <= VALIDATE_MAX_DIM);
        if (!ok)
            return FAIL(ATTNSTAT__CODE__BAD_REQUEST,
                        "%s.shape[%d] is %llu; it must be %lld%s", name, i, (unsigned long long)v,
                        (long long)want[i], one_ok ? " or 1 (broadcast)" : "");
        if (t->strides[i] > (uint64_t)INT64_MAX)
            return FAIL(ATTNSTAT__CODE__OUT_OF_BOUNDS, "%s.strides[%d] is %llu, past any buffer",
                        name, i, (unsigned long long)t->strides[i]);
        ti->shape[i] = (int64_t)v;
        ti->stride[i] = v == 1 ? 0 : (int64_t)t->strides[i];
    }
    if (ti->shape[3] > 1 && ti->stride[3] != 1)
        return FAIL(ATTNSTAT__CODE__BAD_REQUEST,
                    "%s.strides[3] is %lld: its last dimension must be contiguous (stride 1)", name,
                    (long long)ti->stride[3]);
    ti->stride[3] = 1;
    uint64_t esize = wire_esize(t->dtype);
    if (esize == 0)
        return FAIL(ATTNSTAT__CODE__BAD_REQUEST, "%s.dtype %d (%s) has no element size here", name,
                    (int)t->dtype, names_dtype((int)t->dtype));
    if (t->offset % esize != 0)
        return FAIL(ATTNSTAT__CODE__BAD_REQUEST, "%s.offset %llu is not a multiple of %llu bytes",
                    name, (unsigned long long)t->offset, (unsigned long long)esize);
    int64_t ext = stats_tensor_extent(ti->shape[0], ti->shape[1], ti->shape[2], ti->shape[3],
                                      ti->stride[0], ti->stride[1], ti->stride[2]);
    uint64_t bytes, end;
    if (ext < 0 || __builtin_mul_overflow((uint64_t)ext, esize, &bytes) ||
        __builtin_add_overflow(t->offset, bytes, &end))
        return FAIL(ATTNSTAT__CODE__OUT_OF_BOUNDS, "%s: its shape and strides overflow 64-bit "
                    "offsets", name);
    if (end > ti->buf->size)
        return FAIL(ATTNSTAT__CODE__OUT_OF_BOUNDS,
                    "%s: offset %llu + %llu bytes reads up to byte %llu, past the end of buffer %u "
                    "(%llu bytes)", name, (unsigned long long)t->offset, (unsigned long long)bytes,
                    (unsigned long long)end, t->buffer_id, (unsigned long long)ti->buf->size);
    ti->need = end;
    return ATTNSTAT__CODE__OK;
}

static int32_t *copy_seqlens(const int32_t *src, size_t n)
{
    int32_t *dst = malloc(n * sizeof *dst);
    if (dst)
        memcpy(dst, src, n * sizeof *dst);
    return dst;
}

void validate_plan_free(validate_plan *plan)
{
    free(plan->cu_q);
    free(plan->cu_k);
    memset(plan, 0, sizeof *plan);
}

/* Saturating a * b for the work estimate. */
static uint64_t sat_mul(uint64_t a, uint64_t b)
{
    uint64_t r;
    return __builtin_mul_overflow(a, b, &r) ? UINT64_MAX : r;
}

static uint64_t sat_add(uint64_t a, uint64_t b)
{
    uint64_t r;
    return __builtin_add_overflow(a, b, &r) ? UINT64_MAX : r;
}

Attnstat__Code validate_push(const Attnstat__Push *push, validate_lookup_fn lookup, void *ctx,
                             const validate_limits *lim, validate_plan *plan, char *msg,
                             size_t msglen)
{
    memset(plan, 0, sizeof *plan);
    if (!push->q || !push->k)
        return FAIL(ATTNSTAT__CODE__BAD_REQUEST, "push needs both q and k");
    if (push->layer > VALIDATE_MAX_LAYER)
        return FAIL(ATTNSTAT__CODE__BAD_REQUEST,
                    "layer %u is out of range: it must be in [0, %u]", push->layer,
                    VALIDATE_MAX_LAYER);
    tensor_info q, k, v;
    Attnstat__Code code = check_tensor("q", push->q, lookup, ctx, &q, msg, msglen);
    if (code != ATTNSTAT__CODE__OK)
        return code;
    code = check_tensor("k", push->k, lookup, ctx, &k, msg, msglen);
    if (code != ATTNSTAT__CODE__OK)
        return code;
    if (push->v) {
        code = check_tensor("v", push->v, lookup, ctx, &v, msg, msglen);
        if (code != ATTNSTAT__CODE__OK)
            return code;
        if (v.dtype != q.dtype)
            return FAIL(ATTNSTAT__CODE__BAD_REQUEST,
                        "v.dtype %s differs from q.dtype %s", names_dtype((int)v.dtype),
                        names_dtype((int)q.dtype));
    }
    const tensor_info *all[3] = {&q, &k, push->v ? &v : NULL};
    for (int i = 1; i < 3; i++)
        if (all[i] && (all[i]->buf->kind != q.buf->kind || all[i]->buf->device != q.buf->device))
            return FAIL(ATTNSTAT__CODE__BAD_REQUEST,
                        "%s is in a %s buffer (device %d) but q in a %s buffer (device %d): the "
                        "tensors of one push live in one kind of memory, on one device",
                        i == 1 ? "k" : "v",
                        names_buffer_kind(all[i]->buf->kind), all[i]->buf->device,
                        names_buffer_kind(q.buf->kind), q.buf->device);
    int cuda = q.buf->kind == ATTNSTAT__BUFFER_KIND__CUDA_IPC;
    if (k.dtype != q.dtype)
        return FAIL(ATTNSTAT__CODE__BAD_REQUEST,
                    "k.dtype %s differs from q.dtype %s (both must have one dtype)",
                    names_dtype((int)k.dtype), names_dtype((int)q.dtype));
    if (k.shape[3] != q.shape[3])
        return FAIL(ATTNSTAT__CODE__BAD_REQUEST,
                    "k.shape[3] (D) is %lld but q.shape[3] is %lld", (long long)k.shape[3],
                    (long long)q.shape[3]);
    if (q.shape[1] % k.shape[1] != 0)
        return FAIL(ATTNSTAT__CODE__BAD_REQUEST,
                    "q heads (%lld) are not a multiple of k heads (%lld)", (long long)q.shape[1],
                    (long long)k.shape[1]);

    /* Packed offsets in device buffers (their values are not readable here: the kernels clamp
     * each into the tensors' rows). */
    int cu_ref = push->cu_seqlens_q_ref != NULL || push->cu_seqlens_k_ref != NULL;
    tensor_info cuq, cuk;
    int64_t batch = q.shape[0];
    if (cu_ref) {
        if (!push->cu_seqlens_q_ref || !push->cu_seqlens_k_ref)
            return FAIL(ATTNSTAT__CODE__BAD_REQUEST,
                        "cu_seqlens_q_ref and cu_seqlens_k_ref go together");
        if (push->n_cu_seqlens_q || push->n_cu_seqlens_k)
            return FAIL(ATTNSTAT__CODE__BAD_REQUEST,
                        "give packed offsets either inline (cu_seqlens_q/k) or by reference "
                        "(cu_seqlens_q_ref/k_ref), not both");
        if (!cuda)
            return FAIL(ATTNSTAT__CODE__BAD_REQUEST,
                        "cu_seqlens_*_ref is for tensors in device buffers; host pushes give the "
                        "offsets inline (cu_seqlens_q/k)");
        const int64_t any[4] = {1, 1, 0, 1};
        const Attnstat__TensorRef *r2[2] = {push->cu_seqlens_q_ref, push->cu_seqlens_k_ref};
        tensor_info *t2[2] = {&cuq, &cuk};
        for (int i = 0; i < 2; i++) {
            const char *nm = i ? "cu_seqlens_k_ref" : "cu_seqlens_q_ref";
            if (r2[i]->dtype != ATTNSTAT__DTYPE__I32)
                return FAIL(ATTNSTAT__CODE__BAD_REQUEST, "%s.dtype must be I32 (4), not %d", nm,
                            (int)r2[i]->dtype);
            code = check_aux(nm, r2[i], any, 0, lookup, ctx, t2[i], msg, msglen);
            if (code != ATTNSTAT__CODE__OK)
                return code;
            if (t2[i]->buf->kind != q.buf->kind || t2[i]->buf->device != q.buf->device)
                return FAIL(ATTNSTAT__CODE__BAD_REQUEST, "%s is not on q's device", nm);
            if (t2[i]->shape[2] > 1 && t2[i]->stride[2] != 1)
                return FAIL(ATTNSTAT__CODE__BAD_REQUEST,
                            "%s.strides[2] is %lld: the offsets must be contiguous (the kernels "
                            "read B + 1 consecutive entries); pass cu_seqlens.contiguous()", nm,
                            (long long)t2[i]->stride[2]);
        }
        if (cuq.shape[2] != cuk.shape[2] || cuq.shape[2] < 2 || cuq.shape[2] > VALIDATE_MAX_SEQS + 1)
            return FAIL(ATTNSTAT__CODE__BAD_REQUEST,
                        "cu_seqlens_q_ref and cu_seqlens_k_ref need the same B + 1 entries, 2 .. "
                        "%d (they have %lld and %lld)", VALIDATE_MAX_SEQS + 1,
                        (long long)cuq.shape[2], (long long)cuk.shape[2]);
        if (q.shape[0] != 1 || k.shape[0] != 1)
            return FAIL(ATTNSTAT__CODE__BAD_REQUEST,
                        "packed sequences need q.shape[0] = k.shape[0] = 1, not %lld and %lld",
                        (long long)q.shape[0], (long long)k.shape[0]);
        batch = cuq.shape[2] - 1;
    }
    int packed = push->n_cu_seqlens_q > 0 || push->n_cu_seqlens_k > 0;
    if (packed) {
        if (push->n_cu_seqlens_q != push->n_cu_seqlens_k)
            return FAIL(ATTNSTAT__CODE__BAD_REQUEST,
                        "cu_seqlens_q has %zu entries and cu_seqlens_k %zu; both need B + 1",
                        push->n_cu_seqlens_q, push->n_cu_seqlens_k);
        if (push->n_cu_seqlens_q < 2 || push->n_cu_seqlens_q > VALIDATE_MAX_SEQS + 1)
            return FAIL(ATTNSTAT__CODE__BAD_REQUEST,
                        "cu_seqlens_q has %zu entries; it needs 2 .. %d (B + 1)",
                        push->n_cu_seqlens_q, VALIDATE_MAX_SEQS + 1);
        if (q.shape[0] != 1 || k.shape[0] != 1)
            return FAIL(ATTNSTAT__CODE__BAD_REQUEST,
                        "packed sequences (cu_seqlens) need q.shape[0] = k.shape[0] = 1, not %lld "
                        "and %lld", (long long)q.shape[0], (long long)k.shape[0]);
        batch = (int64_t)push->n_cu_seqlens_q - 1;
        stats_error se;
        if (stats_validate_seqlens(push->cu_seqlens_q, (int32_t)batch, (int32_t)q.shape[2],
                                   "cu_seqlens_q", &se) != STATS_OK ||
            stats_validate_seqlens(push->cu_seqlens_k, (int32_t)batch, (int32_t)k.shape[2],
                                   "cu_seqlens_k", &se) != STATS_OK)
            return FAIL(ATTNSTAT__CODE__BAD_REQUEST, "%s", se.msg);
    } else if (!cu_ref && k.shape[0] != q.shape[0]) {
        return FAIL(ATTNSTAT__CODE__BAD_REQUEST,
                    "k.shape[0] (B) is %lld but q.shape[0] is %lld", (long long)k.shape[0],
                    (long long)q.shape[0]);
    }
    tensor_info mk;
    if (push->mask) {
        const Attnstat__TensorRef *t = push->mask;
        if (packed || cu_ref)
            return FAIL(ATTNSTAT__CODE__BAD_REQUEST,
                        "a mask does not combine with packed sequences: give their bounds by "
                        "cu_seqlens alone");
        if (t->dtype != ATTNSTAT__DTYPE__BOOL && t->dtype != ATTNSTAT__DTYPE__F32 &&
            t->dtype != ATTNSTAT__DTYPE__F16 && t->dtype != ATTNSTAT__DTYPE__BF16)
            return FAIL(ATTNSTAT__CODE__BAD_REQUEST,
                        "mask.dtype %d (%s) is not a mask's: BOOL (3), or F32/F16/BF16 added to "
                        "the logits", (int)t->dtype, names_dtype((int)t->dtype));
        const int64_t want[4] = {q.shape[0], q.shape[1], q.shape[2], k.shape[2]};
        if (t->n_shape == 4 && t->shape[3] != (uint64_t)k.shape[2])
            return FAIL(ATTNSTAT__CODE__BAD_REQUEST,
                        "mask.shape[3] is %llu; it must be Nk = %lld (the keys)",
                        (unsigned long long)t->shape[3], (long long)k.shape[2]);
        code = check_aux("mask", t, want, 1, lookup, ctx, &mk, msg, msglen);
        if (code != ATTNSTAT__CODE__OK)
            return code;
        if (mk.buf->kind != q.buf->kind || mk.buf->device != q.buf->device)
            return FAIL(ATTNSTAT__CODE__BAD_REQUEST,
                        "the mask is in a %s buffer (device %d) but q in a %s buffer (device %d): "
                        "the tensors of one push live in one kind of memory, on one device",
                        names_buffer_kind(mk.buf->kind), mk.buf->device,
                        names_buffer_kind(q.buf->kind), q.buf->device);
    }
    tensor_info sk;
    if (push->sinks) {
        const Attnstat__TensorRef *t = push->sinks;
        if (t->dtype != ATTNSTAT__DTYPE__F32 && t->dtype != ATTNSTAT__DTYPE__F16 &&
            t->dtype != ATTNSTAT__DTYPE__BF16)
            return FAIL(ATTNSTAT__CODE__BAD_REQUEST,
                        "sinks.dtype %d (%s) is not a sink logit's: F32, F16 or BF16", (int)t->dtype,
                        names_dtype((int)t->dtype));
        if (t->n_shape == 4 && t->shape[1] != (uint64_t)q.shape[1])
            return FAIL(ATTNSTAT__CODE__BAD_REQUEST,
                        "sinks.shape[1] is %llu; it must be Hq = %lld (one sink per query head)",
                        (unsigned long long)t->shape[1], (long long)q.shape[1]);
        const int64_t want[4] = {1, q.shape[1], 1, 1};
        code = check_aux("sinks", t, want, 0, lookup, ctx, &sk, msg, msglen);
        if (code != ATTNSTAT__CODE__OK)
            return code;
        if (sk.shape[1] > 1 && sk.stride[1] != 1)
            return FAIL(ATTNSTAT__CODE__BAD_REQUEST,
                        "sinks.strides[1] is %lld: the query heads' sinks must be contiguous "
                        "(stride 1)", (long long)sk.stride[1]);
        if (sk.buf->kind != q.buf->kind || sk.buf->device != q.buf->device)
            return FAIL(ATTNSTAT__CODE__BAD_REQUEST,
                        "the sinks are in a %s buffer (device %d) but q in a %s buffer (device %d): "
                        "the tensors of one push live in one kind of memory, on one device",
                        names_buffer_kind(sk.buf->kind), sk.buf->device,
                        names_buffer_kind(q.buf->kind), q.buf->device);
    }
    if (push->has_compute_dtype && push->compute_dtype != ATTNSTAT__DTYPE__F32 &&
        push->compute_dtype != ATTNSTAT__DTYPE__F16 && push->compute_dtype != ATTNSTAT__DTYPE__BF16)
        return FAIL(ATTNSTAT__CODE__BAD_REQUEST,
                    "compute_dtype %d (%s) is not a precision of the logits (F32, F16, BF16)",
                    (int)push->compute_dtype, names_dtype((int)push->compute_dtype));
    if (push->has_event_id && !cuda)
        return FAIL(ATTNSTAT__CODE__UNKNOWN_BUFFER,
                    "event_id %u is not a registered event (host buffers need no event)",
                    push->event_id);
    if (push->sample_every > INT32_MAX || push->sample_rows > INT32_MAX)
        return FAIL(ATTNSTAT__CODE__BAD_REQUEST,
                    "sample_every (%u) and sample_rows (%u) must be under 2^31", push->sample_every,
                    push->sample_rows);
    if (push->has_stats && !stats_want_valid(push->stats))
        return FAIL(ATTNSTAT__CODE__BAD_REQUEST,
                    "stats 0x%x asks for statistics this daemon does not have (bits 0x%x): bit i "
                    "asks for row i of vocab.h's VOCAB_STATS, rows 0..%d here (a mask within "
                    "0x%x; 0: the defaults); a client newer than this daemon: upgrade attnstatd",
                    push->stats, push->stats & ~(uint32_t)VOCAB_STATS_ALL, VOCAB_NSTATS - 1,
                    (uint32_t)VOCAB_STATS_ALL);

    stats_problem *p = &plan->prob;
    stats_problem_init(p);
    p->batch = (int32_t)batch;
    p->heads_q = (int32_t)q.shape[1];
    p->heads_kv = (int32_t)k.shape[1];
    p->len_q = (int32_t)q.shape[2];
    p->len_k = (int32_t)k.shape[2];
    p->head_dim = (int32_t)q.shape[3];
    p->dtype = q.dtype;
    /* Device memory is not mapped here: a placeholder until the GPU worker opens the buffer. */
    static const char device_placeholder[1];
    p->q.ptr = cuda ? (const void *)device_placeholder : (const char *)q.buf->base + push->q->offset;
    p->q.stride_b = q.stride[0];
    p->q.stride_h = q.stride[1];
    p->q.stride_n = q.stride[2];
    p->k.ptr = cuda ? (const void *)device_placeholder : (const char *)k.buf->base + push->k->offset;
    p->k.stride_b = k.stride[0];
    p->k.stride_h = k.stride[1];
    p->k.stride_n = k.stride[2];
    p->scale = push->scale;
    p->softcap = push->softcap;
    p->causal = push->causal ? 1 : 0;
    p->window_left = push->window_left;
    p->window_right = push->window_right;
    p->sample_every = (int32_t)push->sample_every;
    p->sample_rows = (int32_t)push->sample_rows;
    p->sample_seed = push->sample_seed;
    p->collapse_threshold = lim->collapse_threshold;
    p->compute_dtype = push->has_compute_dtype ? (stats_dtype)push->compute_dtype : STATS_F32;
    p->want = push->has_stats ? push->stats : 0;
    if (push->mask) {
        p->mask.ptr = cuda ? (const void *)device_placeholder
                           : (const char *)mk.buf->base + push->mask->offset;
        p->mask.stride_b = mk.stride[0];
        p->mask.stride_h = mk.stride[1];
        p->mask.stride_n = mk.stride[2];
        p->mask_dtype = mk.dtype;
    }
    if (push->sinks) {
        p->sinks = cuda ? (const void *)device_placeholder
                        : (const char *)sk.buf->base + push->sinks->offset;
        p->sinks_dtype = sk.dtype;
    }
    if (cu_ref) { /* placeholders until the GPU worker opens the buffers */
        p->cu_seqlens_q = (const int32_t *)device_placeholder;
        p->cu_seqlens_k = (const int32_t *)device_placeholder;
    }
    stats_error se;
    if (stats_validate(p, &se) != STATS_OK)
        return FAIL(ATTNSTAT__CODE__BAD_REQUEST, "%s", se.msg);

    /* Work, in multiply-adds: for every sequence with sampled rows, its sampled query rows x its
     * keys x Hq x D (the dot products) plus Hkv x its keys x D (the CPU backend converts that
     * sequence's K to double once per KV head, whether or not a row sees every key). A sequence
     * with no sampled row costs nothing: its K is never read. */
    uint64_t rows_work = 0, k_work = 0;
    if (packed) {
        for (int64_t s = 0; s < batch; s++) {
            int32_t lq = push->cu_seqlens_q[s + 1] - push->cu_seqlens_q[s];
            int32_t lk = push->cu_seqlens_k[s + 1] - push->cu_seqlens_k[s];
            int32_t ns = stats_sampled_count(p, lq);
            if (ns <= 0)
                continue;
            rows_work = sat_add(rows_work, sat_mul((uint64_t)ns, (uint64_t)lk));
            k_work = sat_add(k_work, (uint64_t)lk);
        }
    } else if (cu_ref) {
        /* The sequences' lengths are on the device: a bound, every sampled row of the packed
         * batch against every key. */
        uint64_t ns = (uint64_t)stats_sampled_count(p, p->len_q);
        if (p->sample_rows > 0)
            ns = sat_mul((uint64_t)batch, (uint64_t)p->sample_rows) < (uint64_t)p->len_q
                     ? sat_mul((uint64_t)batch, (uint64_t)p->sample_rows)
                     : (uint64_t)p->len_q;
        rows_work = sat_mul(ns, (uint64_t)p->len_k);
        k_work = (uint64_t)p->len_k;
    } else {
        int32_t ns = stats_sampled_count(p, p->len_q);
        if (ns > 0) {
            rows_work = sat_mul((uint64_t)batch, sat_mul((uint64_t)ns, (uint64_t)p->len_k));
            k_work = sat_mul((uint64_t)batch, (uint64_t)p->len_k);
        }
    }
    rows_work = sat_mul(rows_work, sat_mul((uint64_t)p->heads_q, (uint64_t)p->head_dim));
    k_work = sat_mul(k_work, sat_mul((uint64_t)p->heads_kv, (uint64_t)p->head_dim));
    uint64_t work = sat_add(rows_work, k_work);
    /* A device mask is first scanned whole (each row's interval of keys), every row, sampled or
     * not: its elements count too. The CPU backend reads it only for the logits it computes. */
    uint64_t mask_work = 0;
    if (cuda && push->mask)
        mask_work = sat_mul(sat_mul((uint64_t)mk.shape[0], (uint64_t)mk.shape[1]),
                            sat_mul((uint64_t)p->len_q, (uint64_t)p->len_k));
    work = sat_add(work, mask_work);
    uint64_t max_work = cuda ? lim->max_push_work_gpu : lim->max_push_work;
    if (work > max_work) {
        char scan[80] = "";
        if (mask_work)
            snprintf(scan, sizeof scan, ", %llu for scanning a device mask: its elements",
                     (unsigned long long)mask_work);
        return FAIL(ATTNSTAT__CODE__BAD_REQUEST,
                    "push is too large: %llu multiply-adds (%llu for sampled rows x keys x Hq x D, "
                    "%llu for converting K: keys x Hkv x D of each sequence with sampled rows%s) "
                    "is over %s %llu; sample fewer rows (sample_rows / sample_every), push fewer "
                    "keys, or raise the limit", (unsigned long long)work,
                    (unsigned long long)rows_work, (unsigned long long)k_work, scan,
                    cuda ? "max_push_work_gpu" : "max_push_work", (unsigned long long)max_work);
    }
    plan->work = work;

    if (packed) {
        plan->cu_q = copy_seqlens(push->cu_seqlens_q, push->n_cu_seqlens_q);
        plan->cu_k = copy_seqlens(push->cu_seqlens_k, push->n_cu_seqlens_k);
        if (!plan->cu_q || !plan->cu_k) {
            validate_plan_free(plan);
            return FAIL(ATTNSTAT__CODE__INTERNAL, "out of memory copying cu_seqlens");
        }
        p->cu_seqlens_q = plan->cu_q;
        p->cu_seqlens_k = plan->cu_k;
    }
    plan->buffer_id[0] = push->q->buffer_id;
    plan->need_bytes[0] = q.need;
    plan->offset[0] = push->q->offset;
    plan->buffer_id[1] = push->k->buffer_id;
    plan->need_bytes[1] = k.need;
    plan->offset[1] = push->k->offset;
    plan->ntensors = 2;
    plan->mask_index = plan->cu_index = plan->sinks_index = -1;
    const Attnstat__TensorRef *more[5] = {push->v, push->mask, cu_ref ? push->cu_seqlens_q_ref : NULL,
                                          cu_ref ? push->cu_seqlens_k_ref : NULL, push->sinks};
    const tensor_info *info[5] = {&v, &mk, &cuq, &cuk, &sk};
    for (int i = 0; i < 5; i++) {
        if (!more[i])
            continue;
        if (i == 1)
            plan->mask_index = plan->ntensors;
        if (i == 2)
            plan->cu_index = plan->ntensors;
        if (i == 4)
            plan->sinks_index = plan->ntensors;
        plan->buffer_id[plan->ntensors] = more[i]->buffer_id;
        plan->need_bytes[plan->ntensors] = info[i]->need;
        plan->offset[plan->ntensors] = more[i]->offset;
        plan->ntensors++;
    }
    plan->kind = q.buf->kind;
    plan->device = cuda ? q.buf->device : -1;
    return ATTNSTAT__CODE__OK;
}

Attnstat__Code validate_device_span(const char *name, uint64_t need, uint64_t registered,
                                    uint64_t real, char *msg, size_t msglen)
{
    if (need > registered)
        return FAIL(ATTNSTAT__CODE__OUT_OF_BOUNDS,
                    "%s reads up to byte %llu, past the registered size %llu of its buffer", name,
                    (unsigned long long)need, (unsigned long long)registered);
    if (need > real)
        return FAIL(ATTNSTAT__CODE__OUT_OF_BOUNDS,
                    "%s reads up to byte %llu, past the end of the device allocation it names "
                    "(%llu bytes when opened; the buffer was registered as %llu bytes)", name,
                    (unsigned long long)need, (unsigned long long)real,
                    (unsigned long long)registered);
    return ATTNSTAT__CODE__OK;
}

int validate_shm_name(const char *name, char *msg, size_t msglen)
{
    size_t n = name ? strlen(name) : 0;
    if (n < 2 || n > 255 || name[0] != '/' || strchr(name + 1, '/')) {
        return util_err(msg, msglen, "shm_name '%s' must be '/name': a leading '/', 1..254 more "
                        "bytes, no other '/'", name ? name : "");
    }
    return 0;
}

/* A Hello's thresholds: every VOCAB_THRESHOLDS row the wire carries (by its name in Thresholds),
 * when set, finite and within the row's bounds; then the computation's collapse_threshold, in
 * (0, 1]. */
int validate_thresholds(const Attnstat__Thresholds *t, char *msg, size_t msglen)
{
    if (!t)
        return 0;
    int has;
    double v;
#define VALIDATE_THRESHOLD(name, type, def, lo, lo_incl, hi, hi_incl, help)                       \
    if (wirerow_get(&t->base, #name, &has, &v) == 0 && has &&                                     \
        !(isfinite(v) && ((lo_incl) ? v >= (lo) : v > (lo)) &&                                    \
          ((hi_incl) ? v <= (hi) : v < (hi)))) {                                                  \
        snprintf(msg, msglen, "thresholds.%s %g must be in %c%g, %g%c", #name, v,                  \
                 (lo_incl) ? '[' : '(', (double)(lo), (double)(hi), (hi_incl) ? ']' : ')');       \
        return -1;                                                                                \
    }
    VOCAB_THRESHOLDS(VALIDATE_THRESHOLD)
#undef VALIDATE_THRESHOLD
    if (t->has_collapse_threshold && !(t->collapse_threshold > 0.0 && t->collapse_threshold <= 1.0)) {
        snprintf(msg, msglen, "thresholds.collapse_threshold %g must be in (0, 1]",
                 t->collapse_threshold);
        return -1;
    }
    return 0;
}

/* ---- Intervention: what a job did because of what was measured ------------------------------- */

int validate_intervention(const Attnstat__Intervention *m, char *msg, size_t msglen)
{
    size_t klen = m->kind ? strlen(m->kind) : 0;
    if (klen < 1 || klen > VALIDATE_INTERVENTION_KIND_MAX) {
        util_err(msg, msglen, "intervention.kind is %zu bytes: it must be 1..%d of a-z, 0-9, '_', "
                 "'.', '-' (e.g. \"qk_clip\")", klen, VALIDATE_INTERVENTION_KIND_MAX);
        return -1;
    }
    size_t ok = strspn(m->kind, VOCAB_INTERVENTION_KIND_CHARS);
    if (ok != klen) {
        util_err(msg, msglen, "intervention.kind: byte %zu (0x%02x) is not one of a-z, 0-9, '_', "
                 "'.', '-' (e.g. \"qk_clip\")", ok, (unsigned)(unsigned char)m->kind[ok]);
        return -1;
    }
    if (m->step < 0) {
        util_err(msg, msglen, "intervention.step %lld must be >= 0 (the step whose measurements "
                 "it acted on)", (long long)m->step);
        return -1;
    }
    if (m->has_layer && m->layer > VALIDATE_MAX_LAYER) {
        util_err(msg, msglen, "intervention.layer %u is past %u, the largest layer a push may "
                 "name", m->layer, VALIDATE_MAX_LAYER);
        return -1;
    }
    if (m->n_heads > VALIDATE_MAX_HEADS) {
        util_err(msg, msglen, "intervention.heads has %zu entries, more than %d: send one "
                 "Intervention per layer", m->n_heads, VALIDATE_MAX_HEADS);
        return -1;
    }
    for (size_t i = 0; i < m->n_heads; i++)
        if (m->heads[i] >= VALIDATE_INTERVENTION_HEAD_LIMIT) {
            util_err(msg, msglen, "intervention.heads[%zu] is %u: a head number must be < %u",
                     i, m->heads[i], VALIDATE_INTERVENTION_HEAD_LIMIT);
            return -1;
        }
    if (m->n_values != 0 && m->n_values != m->n_heads) {
        util_err(msg, msglen, "intervention.values has %zu entries for %zu heads: send none, or "
                 "exactly one per head", m->n_values, m->n_heads);
        return -1;
    }
    for (size_t i = 0; i < m->n_values; i++)
        if (!isfinite(m->values[i])) {
            util_err(msg, msglen, "intervention.values[%zu] is %g: each value must be finite", i,
                     m->values[i]);
            return -1;
        }
    if (m->has_threshold && !isfinite(m->threshold)) {
        util_err(msg, msglen, "intervention.threshold is %g: it must be finite (or left unset)",
                 m->threshold);
        return -1;
    }
    if (m->has_measured && !isfinite(m->measured)) {
        util_err(msg, msglen, "intervention.measured is %g: it must be finite (or left unset)",
                 m->measured);
        return -1;
    }
    size_t dlen = m->detail ? strlen(m->detail) : 0;
    if (dlen > VALIDATE_INTERVENTION_DETAIL_MAX) {
        util_err(msg, msglen, "intervention.detail is %zu bytes, more than %d: keep it to a short "
                 "JSON note", dlen, VALIDATE_INTERVENTION_DETAIL_MAX);
        return -1;
    }
    return 0;
}

/* ---- Computed: statistics a client computed itself -------------------------------------------- */
/* A statistic's value when no counted row defines it (its row's `absent` column). */
static double absent_value(enum vocab_absent a, uint64_t rows)
{
    switch (a) {
    case VOCAB_ABSENT_ZERO:
        return 0.0;
    case VOCAB_ABSENT_NO_LOGIT:
        return rows ? NAN : -INFINITY;
    case VOCAB_ABSENT_NAN:
        break;
    }
    return NAN;
}

/* A client's statistic against its row's bounds (inclusive): 1 with the value in *out when it lies
 * within them, or past one by no more than rounding can take a value computed in float32 or
 * float64 (VALIDATE_STAT_SLACK of the bound's size, at least of 1: a normalised entropy of
 * 1 + 1e-7 from a head that attends uniformly), then clamped to that bound; else 0. */
#define VALIDATE_STAT_SLACK 1e-6
static int in_row_bounds(double v, double lo, double hi, double *out)
{
    if (v >= lo && v <= hi) {
        *out = v;
        return 1;
    }
    if (v < lo && v >= lo - VALIDATE_STAT_SLACK * fmax(1.0, fabs(lo))) {
        *out = lo;
        return 1;
    }
    if (v > hi && v <= hi + VALIDATE_STAT_SLACK * fmax(1.0, fabs(hi))) {
        *out = hi;
        return 1;
    }
    return 0;
}

/* Sets msg and returns BAD_REQUEST. */
#define COMPUTED_BAD(...) (util_err(msg, msglen, __VA_ARGS__), ATTNSTAT__CODE__BAD_REQUEST)

Attnstat__Code validate_computed(const Attnstat__Computed *m, stats_head *out, char *msg,
                                 size_t msglen)
{
    if (m->n_heads == 0 || m->n_heads > VALIDATE_MAX_HEADS)
        return COMPUTED_BAD("a Computed message carries %zu heads: 1 to %d", m->n_heads,
                        VALIDATE_MAX_HEADS);
    if (m->layer > VALIDATE_MAX_LAYER)
        return COMPUTED_BAD("layer %u is over %u", m->layer, VALIDATE_MAX_LAYER);
    for (size_t i = 0; i < m->n_heads; i++) {
        const Attnstat__HeadStats *h = m->heads[i];
        if (!h || h->head != i)
            return COMPUTED_BAD("heads[%zu] is head %u: the heads come in order 0..n-1",
                            i, h ? h->head : 0u);
        if (h->rows > (uint64_t)INT64_MAX || h->rows_norm > h->rows ||
            h->rows_empty > (uint64_t)INT64_MAX || h->nonfinite_rows > (uint64_t)INT64_MAX)
            return COMPUTED_BAD("head %zu: row counts that do not agree (rows %llu, "
                            "rows_norm %llu)", i, (unsigned long long)h->rows,
                            (unsigned long long)h->rows_norm);
        /* Every statistic of the table: absent (unset, or NaN) it takes the row's `absent`
         * value; present it lies within the row's bounds, inclusive. */
        stats_head *o = &out[i];
        memset(o, 0, sizeof *o);
#define COMPUTED_COUNT(name, help) o->name = (int64_t)h->name;
        VOCAB_COUNTS(COMPUTED_COUNT)
#undef COMPUTED_COUNT
#define COMPUTED_STAT(name, unit, pack, since, pool, weight, lo, hi, absent, ...)                  \
        if (h->has_##name && !isnan(h->name)) {                                                   \
            if (!in_row_bounds(h->name, lo, hi, &o->name))                                        \
                return COMPUTED_BAD("head %zu: %s %g is not in [%g, %g]", i, #name, h->name,      \
                                    (double)(lo), (double)(hi));                                  \
        } else {                                                                                  \
            o->name = absent_value(absent, h->rows);                                              \
        }
        VOCAB_STATS(COMPUTED_STAT)
#undef COMPUTED_STAT
        o->sampled = h->has_sampled && h->sampled;
    }
    return ATTNSTAT__CODE__OK;
}
#undef COMPUTED_BAD
