/* stats.h — attention statistics: per query row, the entropy of the attention distribution, the
 * maximum attention logit, the sink mass and the mean attention distance, reduced per query head. One problem description, three backends:
 * stats_cpu() (plain C, double accumulation; the reference every other backend is tested against),
 * stats_cpu_fast_ws() (float32 vector loops; what the daemon computes host pushes with) and
 * stats_cuda() (kernels/stats_cuda.h; device pointers, caller's stream).
 *
 * Notation. Q is [B, Hq, Nq, D], K is [B, Hkv, Nk, D], both addressed by element strides for the
 * B, H and N dimensions with D contiguous, so [B,H,N,D] and [B,N,H,D] memory both work as they are.
 * For query row i of sequence b, head h, and each key j visible to it:
 *     s_ij = softcap(scale * q_i . k_j)        softcap(x) = cap * tanh(x / cap), or x when cap = 0
 *     m_i  = max_j s_ij                       (the reported "max logit")
 *     p_ij = exp(s_ij - m_i) / sum_j exp(s_ij - m_i)
 *     H_i  = -sum_j p_ij ln p_ij              (nats; in [0, ln n_i] with n_i visible keys)
 * With attention sinks, the head's sink is one more outcome of the distribution (below).
 * Row i's first visible key f_i is the lowest key index (within its sequence when packed) that the
 * row sees under causal, window and mask together, and with pos_i = i + Lk - Lq (the causal
 * diagonal of the alignment below: the key a causal row ends on)
 *     sink_i = p_i,f_i                        (mass on the first visible key: BOS, the usual sink)
 *     dist_i = sum_j p_ij |pos_i - j|         (positions; ViT's mean attention distance)
 * in the distribution the row's H_i is taken over: with a gpt-oss sink logit the sink's own
 * probability is not the first key's and, having no position, adds nothing to dist_i (it still
 * counts in the normalisation, so sink_i and dist_i shrink as the sink takes mass).
 * K head for query head h is h / (Hq / Hkv) (grouped-query attention).
 *
 * Visibility (FlashAttention's conventions). With Lq, Lk the lengths of the row's sequence and
 * i, j positions inside it, let o = Lk - Lq (bottom-right alignment). Key j is visible to row i when
 *     causal:          j <= i + o
 *     window_left wl:  j >= i + o - wl      (wl < 0: unbounded)
 *     window_right wr: j <= i + o + wr      (wr < 0: unbounded)
 * causal together with window_right > 0 is a contradiction and is refused. A row that sees no key
 * (e.g. causal with Lk < Lq, or an empty packed sequence) has no distribution: it is excluded from
 * every statistic and counted in rows_empty.
 *
 * Packed sequences (FlashAttention's varlen layout). When cu_seqlens_q is set, Q and K hold one
 * packed batch: Q rows [cu_seqlens_q[s], cu_seqlens_q[s+1]) of sequence s attend to K rows
 * [cu_seqlens_k[s], cu_seqlens_k[s+1]); `batch` is the number of sequences, len_q and len_k are the
 * totals (cu_seqlens_*[batch]), and stride_b is not used. Both arrays have batch + 1 entries, start
 * at 0 and never decrease. They live where the tensors live (host for stats_cpu, device for CUDA).
 *
 * Sampling. Statistics over a subset of rows, chosen per sequence and identical for every head:
 *     sample_every = k > 1:  rows 0, k, 2k, ...
 *     sample_rows  = n > 0:  n distinct rows drawn by stats_sample_row() from (sample_seed); a
 *                            sequence shorter than n contributes every row.
 * Means are then unbiased estimates and max_logit a lower bound; the result says it was sampled.
 *
 * Non-finite logits. A row whose logits include NaN or +-Inf (from NaN/Inf in Q or K) is never
 * folded into a mean: it is counted in `nonfinite_rows` and excluded from every other statistic.
 *
 * Masks (scaled_dot_product_attention's conventions). When mask.ptr is set, element [b, h, i, j]
 * of the mask (i the query row, j the key, positions in Q and K; a dimension of size 1 is
 * broadcast by giving it stride 0; the key dimension is contiguous) decides key j for row i,
 * together with causal and the window (a key must pass both):
 *     STATS_BOOL:               nonzero = the key takes part;
 *     STATS_F32 / F16 / BF16:   added to the logit (after softcap); -inf, and the dtype's lowest
 *                               finite value (what frameworks write for "masked"), exclude it.
 * A finite additive value changes the attention distribution (entropy) but not the reported max
 * logit, which stays the largest softcap(scale * q.k) over the keys that take part. The visible
 * keys of a row need not be contiguous; n_i counts them. Masks do not combine with packed
 * sequences.
 *
 * Attention sinks (gpt-oss's `sinks`, `s_aux`). When sinks is set, query head h has a sink logit
 * s_h that joins every row's softmax as one more outcome (the sink takes part in the distribution
 * but is not a key): row i's distribution is over its n_i visible keys and the sink,
 *     p_ij = exp(s_ij - m') / (sum_j exp(s_ij - m') + exp(s_h - m')),   m' = max(m_i, s_h),
 * and H_i is that distribution's entropy (n_i + 1 outcomes; the sink's own term included).
 * s_h is taken as given: not multiplied by scale, not softcapped, not masked. s_h = -inf is no
 * sink (that head's rows are exactly as without sinks); a NaN or +inf s_h makes every row of the
 * head that sees a key non-finite (nonfinite_rows, excluded), like a NaN logit. The normalised
 * entropy divides by ln(n_i + 1), so a row with one visible key and a sink counts in rows_norm.
 * The reported max logit stays m_i, the largest logit over the visible keys (the sink is not one:
 * m_i is what QK-Clip compares with tau). A row with no visible key still has no distribution
 * (rows_empty). sinks is [Hq] contiguous, of sinks_dtype (F32, F16 or BF16), where the tensors
 * live (host for the CPU backends, device for CUDA).
 *
 * Precision of the logits. compute_dtype is the dtype q and k are rounded to (round to nearest
 * even) before the dot products, as attention under autocast computes them: STATS_BF16 or
 * STATS_F16 for float32 tensors that autocast hands to a bf16/f16 attention kernel; STATS_F32
 * (the default, 0) leaves the values as they are (16-bit tensors are exact in float32).
 */
#ifndef ATTNSTAT_STATS_H
#define ATTNSTAT_STATS_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    STATS_OK = 0,
    STATS_EINVAL = 1,   /* a bad argument: the message names it */
    STATS_ENOMEM = 2,   /* an allocation failed */
    STATS_EDEVICE = 3,  /* a device (CUDA) call failed: the message carries the CUDA error */
    STATS_ENOTSUP = 4,  /* valid, but not supported by this backend (e.g. no CUDA build) */
} stats_status;

typedef enum {
    STATS_F32 = 0,
    STATS_F16 = 1,
    STATS_BF16 = 2,
    STATS_BOOL = 3,     /* masks only: one byte, nonzero = true */
} stats_dtype;

/* Error detail for a failed call: a sentence a person can act on. */
typedef struct {
    char msg[256];
} stats_error;

/* A tensor in memory. Element [b, h, n, d] lives at
 * ((const char *)ptr) + (b * stride_b + h * stride_h + n * stride_n + d) * stats_dtype_size(dtype).
 * Strides are in elements and must be >= 0. */
typedef struct {
    const void *ptr;
    int64_t stride_b, stride_h, stride_n;
} stats_tensor;

typedef struct {
    int32_t batch;      /* B (number of sequences when packed) */
    int32_t heads_q;    /* Hq */
    int32_t heads_kv;   /* Hkv: Hq % Hkv == 0 */
    int32_t len_q;      /* Nq (total rows when packed), 1..STATS_MAX_LEN */
    int32_t len_k;      /* Nk (total rows when packed), 1..STATS_MAX_LEN */
    int32_t head_dim;   /* D, 1..STATS_MAX_HEAD_DIM */
    stats_dtype dtype;  /* of both Q and K */
    stats_tensor q, k;

    float scale;        /* 0: 1/sqrt(head_dim); otherwise finite and > 0 */
    float softcap;      /* 0: off; otherwise finite and > 0 */
    int32_t causal;     /* 0 or 1 */
    int32_t window_left, window_right; /* < 0: unbounded */

    const int32_t *cu_seqlens_q, *cu_seqlens_k; /* both NULL, or both [batch + 1] (packed) */

    int32_t sample_every;  /* 0 or 1: every row; k > 1: rows 0, k, 2k, ... */
    int32_t sample_rows;   /* 0: off; n > 0: n random rows per sequence (not with sample_every) */
    uint64_t sample_seed;

    float collapse_threshold; /* normalised entropy under which a row counts as collapsed;
                                 0: STATS_DEFAULT_COLLAPSE */

    stats_dtype compute_dtype; /* precision of the logits' inputs (see above); 0: STATS_F32 */
    stats_tensor mask;         /* mask.ptr NULL: none; [B|1, Hq|1, Nq, Nk] (see above) */
    stats_dtype mask_dtype;    /* STATS_BOOL, or STATS_F32 / F16 / BF16 (additive) */
    const void *sinks;         /* NULL: none; [heads_q] sink logits, one per query head (above) */
    stats_dtype sinks_dtype;   /* STATS_F32, F16 or BF16 */
    uint32_t want;             /* the statistics asked for: bit i is vocab/vocab.h's VOCAB_STATS
                                  row i (VOCAB_BIT); 0: VOCAB_STATS_DEFAULT. A backend computes at
                                  least these (the CPU backends and the CUDA-core kernel compute
                                  every row; the tensor-core kernels sink_mass and distance only
                                  when asked); stats_head_keep() blanks the others */
} stats_problem;

#define STATS_MAX_HEAD_DIM 256
/* The most rows of Q or K: the kernels' 32-bit row and key loops step past the last one by a warp
 * or a block's rows, which must not wrap. */
#define STATS_MAX_LEN (1 << 30)
#define STATS_DEFAULT_COLLAPSE 0.1f
/* Per-row entropy written for a row that was not computed (not sampled, or no visible key). */
#define STATS_ROW_SKIPPED (-1.0f)

/* Statistics of one query head over every batch entry and every counted row. */
typedef struct {
    int64_t rows;            /* rows counted: sampled, >= 1 visible key, finite logits */
    int64_t rows_norm;       /* of those, rows with >= 2 outcomes: visible keys, plus the head's
                                sink when it has one (normalised entropy defined) */
    int64_t rows_empty;      /* sampled rows with no visible key (excluded) */
    int64_t nonfinite_rows;  /* sampled rows whose logits had NaN or Inf (excluded) */
    double entropy_mean;     /* nats; NaN when rows == 0 */
    double entropy_std;      /* population standard deviation; NaN when rows == 0 */
    double entropy_min;      /* NaN when rows == 0 */
    double entropy_max;      /* NaN when rows == 0 */
    double entropy_norm_mean;/* mean of H_i / ln(n_i) (ln(n_i + 1) with a sink) over rows_norm
                                rows; NaN when rows_norm == 0 */
    double collapsed_frac;   /* fraction of rows_norm rows whose normalised entropy is under the
                                collapse threshold */
    double max_logit;        /* max of m_i over counted rows; -inf when rows == 0 */
    double sink_mass;        /* mean of sink_i (above) over counted rows; NaN when rows == 0 */
    double distance;         /* mean of dist_i = sum_j p_ij |pos_i - j| (above) over counted rows,
                                in key positions; NaN when rows == 0 */
    int32_t sampled;         /* 1 when the rows were sampled (means are estimates, max a lower bound) */
} stats_head;

size_t stats_dtype_size(stats_dtype dt);
const char *stats_dtype_name(stats_dtype dt);
const char *stats_status_name(stats_status st);

/* Fill in the defaults of a problem: every field zero except window_left/right = -1. */
void stats_problem_init(stats_problem *p);

/* The set a `want` stands for (0: VOCAB_STATS_DEFAULT), and whether it holds only known rows. */
uint32_t stats_want(uint32_t want);
int stats_want_valid(uint32_t want);

/* Make absent (NaN) every statistic of heads[0 .. n) that `want` does not ask for, whatever the
 * backend computed: a result carries what was asked, so that a series never depends on the
 * kernel a run took. The counts stay. */
void stats_head_keep(stats_head *heads, int32_t n, uint32_t want);

/* Check every field of p that can be checked without reading tensor memory (shapes, strides,
 * options, their contradictions). Packed lengths are checked by the backends that read them.
 * Returns STATS_OK or STATS_EINVAL with err->msg naming the problem. err may be NULL. */
stats_status stats_validate(const stats_problem *p, stats_error *err);

/* Check packed offsets (host memory): cu[0] == 0, never decreasing, cu[batch] == total. */
stats_status stats_validate_seqlens(const int32_t *cu, int32_t batch, int32_t total,
                                    const char *name, stats_error *err);

/* Number of query rows one (sequence, head) contributes under p's sampling, for a sequence of
 * len_q rows. */
int32_t stats_sampled_count(const stats_problem *p, int32_t seq_len_q);

/* Span of memory a tensor of the given shape touches: the largest element offset + 1, in elements
 * (0 when any dimension is 0). Lets a caller check a tensor against the buffer it lives in. */
int64_t stats_tensor_extent(int64_t b, int64_t h, int64_t n, int64_t d,
                            int64_t stride_b, int64_t stride_h, int64_t stride_n);

/* Compute on the CPU. p's tensors are host memory.
 *   heads:        [heads_q] per-head statistics (required)
 *   row_entropy:  optional, [B, Hq, Nq] (packed: [1, Hq, total]) nats, STATS_ROW_SKIPPED for rows
 *                 not computed, NaN for non-finite rows
 *   row_maxlogit: optional, same shape; -inf for rows not computed, NaN for non-finite rows
 * Rounding can make H_i a hair under 0 when one key takes all the weight; it is clamped to 0.
 * Returns STATS_OK, or an error with err->msg set (nothing is written to heads on error). */
stats_status stats_cpu(const stats_problem *p, stats_head *heads,
                       float *row_entropy, float *row_maxlogit, stats_error *err);

/* A caller-owned workspace for stats_cpu_ws(): grow-only, so a worker that computes many problems
 * allocates nothing in the steady state, and a computation abandoned midway (e.g. by a signal)
 * leaks nothing. Memory is bounded: K is converted 1024 keys at a time, whatever its length. */
typedef struct stats_cpu_workspace stats_cpu_workspace;
stats_cpu_workspace *stats_cpu_workspace_new(void);
void stats_cpu_workspace_free(stats_cpu_workspace *ws);
stats_status stats_cpu_ws(const stats_problem *p, stats_cpu_workspace *ws, stats_head *heads,
                          float *row_entropy, float *row_maxlogit, stats_error *err);

/* The production CPU backend (kernels/stats_cpu_fast.c): float32 vector loops, the same contract
 * and outputs as stats_cpu_ws(), tested against it (per-row entropy within 1e-4 nats, max logit
 * and head means within 1e-5 relative on the shapes tested). A problem with any NaN or +-Inf logit
 * among the keys its rows see is handed to the reference whole, so non-finite rows are exactly the
 * reference's. Same workspace rules as stats_cpu_workspace (grow-only, nothing leaked when a
 * computation is abandoned midway). stats_cpu_fast_handed_over() counts the problems a workspace
 * handed to the reference. The vector width is chosen per workspace when it is made: 8 floats with
 * FMA where the CPU has AVX2 and FMA (x86-64, GCC builds), else 4; ATTNSTAT_CPU_SIMD=baseline in
 * the environment forces 4 (tests run both). stats_cpu_fast_simd() names the one a workspace uses. */
typedef struct stats_cpu_fast_workspace stats_cpu_fast_workspace;
stats_cpu_fast_workspace *stats_cpu_fast_workspace_new(void);
void stats_cpu_fast_workspace_free(stats_cpu_fast_workspace *ws);
stats_status stats_cpu_fast_ws(const stats_problem *p, stats_cpu_fast_workspace *ws,
                               stats_head *heads, float *row_entropy, float *row_maxlogit,
                               stats_error *err);
stats_status stats_cpu_fast(const stats_problem *p, stats_head *heads, float *row_entropy,
                            float *row_maxlogit, stats_error *err);
uint64_t stats_cpu_fast_handed_over(const stats_cpu_fast_workspace *ws);
const char *stats_cpu_fast_simd(const stats_cpu_fast_workspace *ws);

/* ---- Row sampling, shared by every backend (plain C; usable from CUDA device code). ----------
 * stats_sample_row(j, n, seed) for j in [0, n) is a permutation of [0, n): a 4-round Feistel
 * network on the smallest even power of two >= n, cycle-walked into [0, n). The first
 * sample_rows values j = 0 .. sample_rows-1 are the sampled rows. */
#if defined(__CUDACC__)
#define STATS_HD __host__ __device__ __forceinline__
#else
#define STATS_HD static inline
#endif

STATS_HD uint32_t stats_mix32(uint32_t x, uint32_t key)
{
    x ^= key;
    x *= 0x7feb352dU;
    x ^= x >> 15;
    x *= 0x846ca68bU;
    x ^= x >> 16;
    return x;
}

STATS_HD uint32_t stats_sample_row(uint32_t j, uint32_t n, uint64_t seed)
{
    if (n <= 1)
        return 0;
    uint32_t bits = 2; /* half-width: domain is 2^(2*half) >= n */
    while (bits < 32 && (1ULL << bits) < n)
        bits += 2;
    uint32_t half = bits / 2, mask = (1U << half) - 1U;
    uint32_t k0 = (uint32_t)seed, k1 = (uint32_t)(seed >> 32);
    uint32_t x = j;
    do {
        uint32_t l = x >> half, r = x & mask;
        for (uint32_t round = 0; round < 4; round++) {
            uint32_t f = stats_mix32(r, (round & 1U ? k1 : k0) + round * 0x9e3779b9U) & mask;
            uint32_t t = r;
            r = l ^ f;
            l = t;
        }
        x = (l << half) | r;
    } while (x >= n); /* cycle walking: stays a permutation of [0, n) */
    return x;
}

/* The row (position inside its sequence of seq_len rows) of sampled index j, for
 * j < stats_sampled_count(). */
STATS_HD uint32_t stats_row_of_sample(uint32_t j, uint32_t seq_len, int32_t sample_every,
                                      int32_t sample_rows, uint64_t seed)
{
    if (sample_rows > 0)
        return (uint32_t)sample_rows >= seq_len ? j : stats_sample_row(j, seq_len, seed);
    if (sample_every > 1)
        return j * (uint32_t)sample_every;
    return j;
}

#ifdef __cplusplus
}
#endif

#endif /* ATTNSTAT_STATS_H */
