/* stats.c — what every backend shares: dtype helpers, problem validation, sampling counts and
 * tensor extents. The arithmetic lives in stats_cpu.c and cuda/ (stats_cuda.h). */
#include "stats.h"

#include "vocab.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

size_t stats_dtype_size(stats_dtype dt)
{
    switch (dt) {
    case STATS_F32: return 4;
    case STATS_F16: return 2;
    case STATS_BF16: return 2;
    case STATS_BOOL: return 1;
    }
    return 0;
}

const char *stats_dtype_name(stats_dtype dt)
{
    switch (dt) {
    case STATS_F32: return "f32";
    case STATS_F16: return "f16";
    case STATS_BF16: return "bf16";
    case STATS_BOOL: return "bool";
    }
    return "unknown";
}

const char *stats_status_name(stats_status st)
{
    switch (st) {
    case STATS_OK: return "ok";
    case STATS_EINVAL: return "invalid argument";
    case STATS_ENOMEM: return "out of memory";
    case STATS_EDEVICE: return "device error";
    case STATS_ENOTSUP: return "not supported";
    }
    return "unknown status";
}

void stats_problem_init(stats_problem *p)
{
    memset(p, 0, sizeof *p);
    p->window_left = -1;
    p->window_right = -1;
}

uint32_t stats_want(uint32_t want)
{
    return want ? want : VOCAB_STATS_DEFAULT;
}

int stats_want_valid(uint32_t want)
{
    return (want & ~VOCAB_STATS_ALL) == 0;
}

void stats_head_keep(stats_head *heads, int32_t n, uint32_t want)
{
    want = stats_want(want);
    if ((want & VOCAB_STATS_ALL) == VOCAB_STATS_ALL)
        return;
    for (int32_t i = 0; i < n; i++) {
#define STATS_KEEP_(name, ...)                                                                     \
        if (!(want & VOCAB_BIT(name)))                                                             \
            heads[i].name = NAN;
        VOCAB_STATS(STATS_KEEP_)
#undef STATS_KEEP_
    }
}

__attribute__((format(printf, 2, 3))) static stats_status fail(stats_error *err, const char *fmt, ...)
{
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err->msg, sizeof err->msg, fmt, ap);
        va_end(ap);
    }
    return STATS_EINVAL;
}

int64_t stats_tensor_extent(int64_t b, int64_t h, int64_t n, int64_t d,
                            int64_t stride_b, int64_t stride_h, int64_t stride_n)
{
    if (b <= 0 || h <= 0 || n <= 0 || d <= 0)
        return 0;
    if (stride_b < 0 || stride_h < 0 || stride_n < 0)
        return -1;
    int64_t last = d - 1, t;
    if (__builtin_mul_overflow(b - 1, stride_b, &t) || __builtin_add_overflow(last, t, &last))
        return -1;
    if (__builtin_mul_overflow(h - 1, stride_h, &t) || __builtin_add_overflow(last, t, &last))
        return -1;
    if (__builtin_mul_overflow(n - 1, stride_n, &t) || __builtin_add_overflow(last, t, &last))
        return -1;
    return last + 1;
}

static stats_status check_tensor(const char *name, const stats_tensor *t, int64_t b, int64_t h,
                                 int64_t n, int64_t d, stats_dtype dt, stats_error *err)
{
    if (!t->ptr)
        return fail(err, "%s: data pointer is NULL", name);
    if (t->stride_b < 0 || t->stride_h < 0 || t->stride_n < 0)
        return fail(err, "%s: negative stride (b=%lld h=%lld n=%lld); strides must be >= 0", name,
                    (long long)t->stride_b, (long long)t->stride_h, (long long)t->stride_n);
    int64_t ext = stats_tensor_extent(b, h, n, d, t->stride_b, t->stride_h, t->stride_n);
    int64_t bytes;
    if (ext < 0 || __builtin_mul_overflow(ext, (int64_t)stats_dtype_size(dt), &bytes))
        return fail(err, "%s: shape [%lld,%lld,%lld,%lld] with strides (%lld,%lld,%lld) overflows 64-bit "
                    "offsets", name, (long long)b, (long long)h, (long long)n, (long long)d,
                    (long long)t->stride_b, (long long)t->stride_h, (long long)t->stride_n);
    return STATS_OK;
}

stats_status stats_validate(const stats_problem *p, stats_error *err)
{
    if (err)
        err->msg[0] = '\0';
    if (!p)
        return fail(err, "problem is NULL");
    if (p->batch <= 0 || p->heads_q <= 0 || p->heads_kv <= 0 || p->len_q <= 0 || p->len_k <= 0 ||
        p->head_dim <= 0)
        return fail(err, "sizes must be positive: batch=%d heads_q=%d heads_kv=%d len_q=%d len_k=%d "
                    "head_dim=%d", p->batch, p->heads_q, p->heads_kv, p->len_q, p->len_k, p->head_dim);
    if (p->head_dim > STATS_MAX_HEAD_DIM)
        return fail(err, "head_dim %d is over the maximum %d", p->head_dim, STATS_MAX_HEAD_DIM);
    if (p->len_q > STATS_MAX_LEN || p->len_k > STATS_MAX_LEN)
        return fail(err, "len_q %d and len_k %d must be at most %d", p->len_q, p->len_k,
                    STATS_MAX_LEN);
    if (p->heads_q % p->heads_kv != 0)
        return fail(err, "heads_q (%d) is not a multiple of heads_kv (%d)", p->heads_q, p->heads_kv);
    if (p->dtype != STATS_F32 && p->dtype != STATS_F16 && p->dtype != STATS_BF16)
        return fail(err, "unknown dtype %d for q and k (expected f32=0, f16=1, bf16=2)", (int)p->dtype);
    if (p->compute_dtype != STATS_F32 && p->compute_dtype != STATS_F16 &&
        p->compute_dtype != STATS_BF16)
        return fail(err, "compute_dtype %d is not a precision of the logits (f32=0, f16=1, bf16=2)",
                    (int)p->compute_dtype);
    if (!stats_want_valid(p->want))
        return fail(err, "want 0x%x asks for statistics that do not exist (bits 0..%d are the "
                    "rows of vocab/vocab.h's VOCAB_STATS)", (unsigned)p->want, VOCAB_NSTATS - 1);
    int packed = p->cu_seqlens_q != NULL || p->cu_seqlens_k != NULL;
    if (packed && (!p->cu_seqlens_q || !p->cu_seqlens_k))
        return fail(err, "packed sequences need both cu_seqlens_q and cu_seqlens_k");
    int64_t pb = packed ? 1 : p->batch;
    stats_status st = check_tensor("q", &p->q, pb, p->heads_q, p->len_q, p->head_dim, p->dtype, err);
    if (st != STATS_OK)
        return st;
    st = check_tensor("k", &p->k, pb, p->heads_kv, p->len_k, p->head_dim, p->dtype, err);
    if (st != STATS_OK)
        return st;
    if (!(p->scale == 0.0f || (isfinite(p->scale) && p->scale > 0.0f)))
        return fail(err, "scale %g must be 0 (for 1/sqrt(head_dim)) or finite and positive",
                    (double)p->scale);
    if (!(p->softcap == 0.0f || (isfinite(p->softcap) && p->softcap > 0.0f)))
        return fail(err, "softcap %g must be 0 (off) or finite and positive", (double)p->softcap);
    if (p->causal != 0 && p->causal != 1)
        return fail(err, "causal must be 0 or 1, not %d", p->causal);
    if (p->causal && p->window_right > 0)
        return fail(err, "causal contradicts window_right=%d (a causal row sees no key to its right); "
                    "use window_right=-1 or 0 with causal", p->window_right);
    if (p->sample_every < 0 || p->sample_rows < 0)
        return fail(err, "sample_every (%d) and sample_rows (%d) must be >= 0", p->sample_every,
                    p->sample_rows);
    if (p->sample_every > 1 && p->sample_rows > 0)
        return fail(err, "choose one sampling: sample_every=%d and sample_rows=%d are both set",
                    p->sample_every, p->sample_rows);
    if (p->mask.ptr) {
        if (packed)
            return fail(err, "a mask does not combine with packed sequences (cu_seqlens): give "
                        "the sequences' bounds through cu_seqlens alone");
        if (stats_dtype_size(p->mask_dtype) == 0)
            return fail(err, "mask dtype %d is not bool=3, f32=0, f16=1 or bf16=2",
                        (int)p->mask_dtype);
        st = check_tensor("mask", &p->mask, p->batch, p->heads_q, p->len_q, p->len_k,
                          p->mask_dtype, err);
        if (st != STATS_OK)
            return st;
    }
    if (p->sinks && p->sinks_dtype != STATS_F32 && p->sinks_dtype != STATS_F16 &&
        p->sinks_dtype != STATS_BF16)
        return fail(err, "sinks dtype %d is not f32=0, f16=1 or bf16=2 (one sink logit per query "
                    "head)", (int)p->sinks_dtype);
    if (!(p->collapse_threshold == 0.0f ||
          (p->collapse_threshold > 0.0f && p->collapse_threshold <= 1.0f)))
        return fail(err, "collapse_threshold %g must be 0 (default %.2f) or in (0, 1]",
                    (double)p->collapse_threshold, (double)STATS_DEFAULT_COLLAPSE);
    return STATS_OK;
}

stats_status stats_validate_seqlens(const int32_t *cu, int32_t batch, int32_t total,
                                    const char *name, stats_error *err)
{
    if (!cu)
        return fail(err, "%s is NULL", name);
    if (cu[0] != 0)
        return fail(err, "%s[0] is %d; it must be 0", name, cu[0]);
    for (int32_t s = 0; s < batch; s++)
        if (cu[s + 1] < cu[s])
            return fail(err, "%s decreases at sequence %d (%d then %d)", name, s, cu[s], cu[s + 1]);
    if (cu[batch] != total)
        return fail(err, "%s[%d] is %d but the packed tensor has %d rows", name, batch, cu[batch], total);
    return STATS_OK;
}

int32_t stats_sampled_count(const stats_problem *p, int32_t seq_len_q)
{
    if (seq_len_q <= 0)
        return 0;
    if (p->sample_rows > 0)
        return p->sample_rows < seq_len_q ? p->sample_rows : seq_len_q;
    if (p->sample_every > 1) /* in 64 bits: seq_len_q + sample_every - 1 can pass INT32_MAX */
        return (int32_t)(((int64_t)seq_len_q + p->sample_every - 1) / p->sample_every);
    return seq_len_q;
}
