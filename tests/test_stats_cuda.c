/* test_stats_cuda.c — the CUDA backend (kernels/cuda/, stats_cuda.h) against the CPU reference
 * (stats_cpu) on fresh random data, one problem per configuration below (attention sinks in many
 * of them: see SINKS_*), plus the error paths.
 *
 * Seed: printed at start; set ATTNSTAT_TEST_SEED to replay a run. ATTNSTAT_TEST_VARIANTS=1 also
 * runs every Hopper variant; ATTNSTAT_TEST_WG_ONLY=v runs variant v alone (numbers:
 * kernels/cuda/variants.h). Without a usable GPU the suite prints why and exits 77 (ctest: skipped).
 *
 * Tolerances (float32 on the device against double on the host):
 *   per-row entropy      |gpu - cpu| <= 1e-3 nats
 *   per-row max logit    |gpu - cpu| <= 1e-5 * max(|cpu|, 1) + 4 * 2^-24 * A
 *                        (relative, absolute under 1; A = scale * max|q_i| * max|k_j| bounds the
 *                        size of the products a float32 dot product sums, so the second term is
 *                        four float32 ulps of the logit scale: it matters only for a row whose
 *                        max logit comes from cancellation, e.g. 3.3 out of terms of ~1e3)
 *   per-head means       |gpu - cpu| <= 1e-4 * |cpu| + 1e-6 nats (entropy and normalised entropy)
 *   entropy min/max/std  |gpu - cpu| <= 1e-3 nats;  max logit as per row
 *   sink mass            |gpu - cpu| <= 1e-4 (a probability's mean)
 *   distance             |gpu - cpu| <= 1e-4 * |cpu| + 1e-4 (key positions)
 *   max logit alone      (want = max_logit only) a kernel with a FOLD_MAX instance (its name ends
 *                        in " max") gives NaN for every entropy statistic and per-row entropy on
 *                        a counted row, no rows_norm, and rows, empty and non-finite rows and the
 *                        max logit as the reference's (to the tolerances above); the others as
 *                        every run (with a mask, either: a general one runs the CUDA-core kernel)
 *   Both are NaN exactly where the reference's are. A run that asks for them (want) gets them
 *   from every kernel but those of k_extras_never (NaN: never a wrong number); a run that does not
 *   gets NaN from every tensor-core kernel and them from the CUDA-core one. With a mask the device
 *   picks the kernel (a general mask runs the CUDA-core one), so there either is accepted.
 *   row counts exact; collapsed fraction may differ by one row sitting on the threshold.
 * Skipped rows must be exactly STATS_ROW_SKIPPED / -inf, non-finite rows NaN / NaN; every output
 * is poisoned before each run so that an unwritten element fails. */
#include <check.h>
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cuda/variants.h"
#include "stats.h"
#include "stats_cuda.h"
#include "vocab.h"

/* The variants (kernels/cuda/variants.h) that have no instance computing sink mass and distance:
 * they leave them NaN even when a run asks for them (only a path that names them takes them). */
static const int k_extras_never[] = {STATS_VARIANT_WGMMA, STATS_VARIANT_FOLD2,
                                     STATS_VARIANT_FOLD2_SW128, STATS_VARIANT_FOLD2_SW128_MBAR,
                                     STATS_VARIANT_WS_TMA_P1, STATS_VARIANT_WS_TMA_P2,
                                     STATS_VARIANT_WS_TMA_3WG_PERS_Q2};

/* Whether a run of `variant` asking for `want` leaves sink mass and distance NaN: a kernel
 * without them, or a tensor-core kernel when the run does not ask (the CUDA-core kernel, 5,
 * computes them always). */
static int extras_nan(int variant, uint32_t want)
{
    if (!(stats_want(want) & (VOCAB_BIT(sink_mass) | VOCAB_BIT(distance))))
        return variant != STATS_VARIANT_GENERIC;
    for (size_t i = 0; i < sizeof k_extras_never / sizeof k_extras_never[0]; i++)
        if (k_extras_never[i] == variant)
            return 1;
    return 0;
}

static uint64_t g_seed;
static int g_max_only_runs; /* configurations a FOLD_MAX instance ran (main checks it on Hopper) */
static int g_d256_runs;     /* ... and variant 6's head_dim 256 instance (the same) */
static int g_d96_runs;      /* ... and a head_dim 96 instance (variants 10, 11; the same) */
static stats_cuda *g_ctx;

/* ---- random numbers and dtype conversion ------------------------------------------------ */

typedef struct {
    uint64_t s;
} rng;

static uint64_t rng_next(rng *r)
{
    uint64_t z = (r->s += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static double rng_unit(rng *r) /* (0, 1) */
{
    return ((double)(rng_next(r) >> 11) + 0.5) / 9007199254740992.0;
}

static double rng_gauss(rng *r)
{
    return sqrt(-2.0 * log(rng_unit(r))) * cos(6.283185307179586 * rng_unit(r));
}

static uint16_t f32_to_bf16(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    if ((x & 0x7fffffffU) > 0x7f800000U)
        return (uint16_t)((x >> 16) | 0x40);
    return (uint16_t)((x + 0x7fffU + ((x >> 16) & 1U)) >> 16);
}

static uint16_t f32_to_f16(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    uint32_t sign = (x >> 16) & 0x8000U, man = x & 0x7fffffU;
    int32_t exp = (int32_t)((x >> 23) & 0xffU);
    if (exp == 0xff)
        return (uint16_t)(sign | 0x7c00U | (man ? 0x200U : 0U));
    int32_t e = exp - 127 + 15;
    if (e >= 0x1f)
        return (uint16_t)(sign | 0x7c00U);
    if (e <= 0) {
        if (e < -10)
            return (uint16_t)sign;
        man |= 0x800000U;
        uint32_t shift = (uint32_t)(14 - e), h = man >> shift, rem = man & ((1U << shift) - 1U),
                 half = 1U << (shift - 1U);
        if (rem > half || (rem == half && (h & 1U)))
            h++;
        return (uint16_t)(sign | h);
    }
    uint32_t h = ((uint32_t)e << 10) | (man >> 13), rem = man & 0x1fffU;
    if (rem > 0x1000U || (rem == 0x1000U && (h & 1U)))
        h++;
    return (uint16_t)(sign | h);
}

static void store(void *base, size_t idx, stats_dtype dt, float v)
{
    if (dt == STATS_F32)
        ((float *)base)[idx] = v;
    else if (dt == STATS_BF16)
        ((uint16_t *)base)[idx] = f32_to_bf16(v);
    else
        ((uint16_t *)base)[idx] = f32_to_f16(v);
}

/* ---- configurations ------------------------------------------------------------------------- */

typedef struct {
    const char *name;
    int b, hq, hkv, nq, nk, d;
    stats_dtype dt;
    int bnhd;    /* memory [B, N, H, D] instead of [B, H, N, D] */
    int pad;     /* extra elements after each row of D (8: aligned, 3: forces the CUDA-core path) */
    int causal, wl, wr;
    float softcap, scale;
    int packed;  /* lq/lk hold the b sequence lengths */
    int lq[6], lk[6];
    int every, nsample;
    double amp;  /* standard deviation of Q (K has 1): logits ~ amp */
    int nonfinite; /* plant NaN and +-Inf in Q and K */
    int heads_only; /* no per-row outputs */
    int generic;   /* force the CUDA-core path */
    float collapse;
    stats_dtype compute; /* compute_dtype (0: F32, the tensors' own precision) */
    int mask;      /* a mask (MASK_* below; 0: none) */
    int sinks;     /* attention sinks (SINKS_* below; 0: none) */
    int garble;    /* packed: the device gets offsets whose running maximum, clamped to the rows,
                    * is the layout (the first negative, the last past the end, an empty sequence's
                    * end decreasing); the reference, the layout */
} cfg;

/* Attention sinks (gpt-oss): one logit per query head, drawn near the logits (amp x (1.5 +
 * 1.5 N(0, 1)): some rows' weight goes mostly to the sink, some hardly), stored as f32, bf16 or
 * f16; SINKS_ODD (f32, Hq >= 4) also gives head 0 a NaN sink, head 1 -inf (none), head 2 +inf
 * and head 3 one of 1e4, far above every logit. Every kernel family meets them: the configurations
 * below with sinks cover the Hopper kernels at d64 and d128 (every variant under
 * ATTNSTAT_TEST_VARIANTS=1), mma.sync (d32, d256, and every configuration on that path), the
 * CUDA-core kernel (odd strides, forced), float32 loads, packed and sampled rows, and both paths
 * of a masked run (interval and general masks). */
enum { SINKS_NONE, SINKS_F32, SINKS_BF16, SINKS_F16, SINKS_ODD };

/* Masks, as real models hand them to attention: interval masks (every row sees one run of keys:
 * the tensor-core kernels take them through per-row key ranges) and general ones (read per logit
 * by the CUDA-core kernel). */
enum {
    MASK_NONE,
    MASK_KEYPAD_BOOL,      /* [B, 1, 1, Nk] bool: sequence b keeps keys < Nk - 13 b (padding) */
    MASK_CAUSAL_PAD_BOOL,  /* [B, 1, Nq, Nk] bool: causal and padding, as transformers' sdpa */
    MASK_RANDOM_BOOL,      /* [B, Hq, Nq, Nk] bool, random: general */
    MASK_WINDOW_F32,       /* [1, 1, Nq, Nk] f32, 0 / -inf: keys [i - 40, i] */
    MASK_BIAS_BF16,        /* [B, 1, Nq, Nk] bf16 finite biases, some -inf: general */
    MASK_EAGER_F32,        /* [B, 1, Nq, Nk] f32, 0 / float32 lowest: transformers' eager */
    MASK_HEAD_F16,         /* [1, Hq, Nq, Nk] f16, 0 / -inf: a window per head */
};

#define BF STATS_BF16
#define FH STATS_F16
#define FS STATS_F32
static const cfg k_cfgs[] = {
    {.name = "bf16 d128 full", .b = 2, .hq = 4, .hkv = 4, .nq = 256, .nk = 256, .d = 128, .dt = BF, .wl = -1, .wr = -1, .sinks = SINKS_BF16},
    {.name = "bf16 d128 causal odd N, [B,N,H,D]", .b = 2, .hq = 3, .hkv = 3, .nq = 333, .nk = 333, .d = 128, .dt = BF, .bnhd = 1, .causal = 1, .wl = -1, .wr = -1},
    {.name = "f16 d64 causal Nq<Nk (bottom-right)", .b = 2, .hq = 2, .hkv = 2, .nq = 200, .nk = 301, .d = 64, .dt = FH, .causal = 1, .wl = -1, .wr = -1, .sinks = SINKS_F32},
    {.name = "bf16 d64 causal Nq>Nk: empty rows", .b = 2, .hq = 2, .hkv = 2, .nq = 300, .nk = 177, .d = 64, .dt = BF, .causal = 1, .wl = -1, .wr = -1, .sinks = SINKS_BF16},
    {.name = "bf16 d128 causal sliding window 50", .b = 1, .hq = 4, .hkv = 4, .nq = 517, .nk = 517, .d = 128, .dt = BF, .causal = 1, .wl = 50, .wr = 0},
    {.name = "bf16 d128 window (31, 17) not causal, padded rows", .b = 2, .hq = 2, .hkv = 2, .nq = 190, .nk = 250, .d = 128, .dt = BF, .pad = 8, .wl = 31, .wr = 17},
    {.name = "bf16 d128 softcap 30, logits ~60", .b = 2, .hq = 2, .hkv = 2, .nq = 160, .nk = 160, .d = 128, .dt = BF, .wl = -1, .wr = -1, .softcap = 30.0f, .amp = 60.0},
    {.name = "bf16 d128 GQA 8/2 causal", .b = 2, .hq = 8, .hkv = 2, .nq = 270, .nk = 270, .d = 128, .dt = BF, .causal = 1, .wl = -1, .wr = -1, .sinks = SINKS_F32},
    {.name = "bf16 d128 packed causal (an empty sequence)", .b = 4, .hq = 2, .hkv = 2, .d = 128, .dt = BF, .causal = 1, .wl = -1, .wr = -1, .packed = 1, .lq = {100, 0, 257, 31}, .lk = {100, 5, 257, 31}, .sinks = SINKS_BF16},
    {.name = "bf16 d128 packed causal, device offsets decreasing and out of range", .b = 4, .hq = 2, .hkv = 2, .d = 128, .dt = BF, .causal = 1, .wl = -1, .wr = -1, .packed = 1, .lq = {100, 0, 257, 31}, .lk = {100, 0, 257, 31}, .garble = 1},
    {.name = "bf16 d64 packed Nk!=Nq, sequence without keys", .b = 3, .hq = 2, .hkv = 1, .d = 64, .dt = BF, .causal = 1, .wl = -1, .wr = -1, .packed = 1, .lq = {70, 40, 300}, .lk = {90, 0, 280}},
    {.name = "bf16 d128 causal sample every 8", .b = 2, .hq = 2, .hkv = 2, .nq = 611, .nk = 611, .d = 128, .dt = BF, .causal = 1, .wl = -1, .wr = -1, .every = 8},
    {.name = "bf16 d128 causal 37 random rows", .b = 2, .hq = 2, .hkv = 2, .nq = 400, .nk = 400, .d = 128, .dt = BF, .causal = 1, .wl = -1, .wr = -1, .nsample = 37, .sinks = SINKS_F32},
    {.name = "bf16 d64 large logits ~1e3", .b = 1, .hq = 4, .hkv = 4, .nq = 300, .nk = 300, .d = 64, .dt = BF, .wl = -1, .wr = -1, .amp = 300.0},
    {.name = "f16 d128 causal large logits ~1e3", .b = 1, .hq = 2, .hkv = 2, .nq = 260, .nk = 260, .d = 128, .dt = FH, .causal = 1, .wl = -1, .wr = -1, .amp = 300.0, .sinks = SINKS_F32},
    {.name = "bf16 d128 causal NaN/Inf planted", .b = 2, .hq = 2, .hkv = 2, .nq = 300, .nk = 300, .d = 128, .dt = BF, .causal = 1, .wl = -1, .wr = -1, .nonfinite = 1},
    {.name = "f16 d64 softcap 20 NaN/Inf planted", .b = 2, .hq = 2, .hkv = 2, .nq = 200, .nk = 220, .d = 64, .dt = FH, .wl = -1, .wr = -1, .softcap = 20.0f, .amp = 10.0, .nonfinite = 1},
    {.name = "bf16 d32 causal", .b = 2, .hq = 3, .hkv = 3, .nq = 300, .nk = 300, .d = 32, .dt = BF, .causal = 1, .wl = -1, .wr = -1, .sinks = SINKS_F16},
    {.name = "bf16 d80 causal [B,N,H,D]", .b = 1, .hq = 4, .hkv = 2, .nq = 290, .nk = 290, .d = 80, .dt = BF, .bnhd = 1, .causal = 1, .wl = -1, .wr = -1},
    {.name = "f16 d96 full Nk=1000", .b = 1, .hq = 2, .hkv = 2, .nq = 100, .nk = 1000, .d = 96, .dt = FH, .wl = -1, .wr = -1},
    {.name = "bf16 d256 causal", .b = 1, .hq = 2, .hkv = 2, .nq = 300, .nk = 300, .d = 256, .dt = BF, .causal = 1, .wl = -1, .wr = -1, .sinks = SINKS_BF16},
    {.name = "f32 d64 causal, plain f32 (tensor cores as bf16)", .b = 2, .hq = 2, .hkv = 2, .nq = 150, .nk = 150, .d = 64, .dt = FS, .causal = 1, .wl = -1, .wr = -1},
    {.name = "f32 d64 odd stride, plain f32 (CUDA-core path, as bf16)", .b = 1, .hq = 2, .hkv = 2, .nq = 130, .nk = 130, .d = 64, .dt = FS, .pad = 3, .causal = 1, .wl = -1, .wr = -1, .sinks = SINKS_F32},
    {.name = "bf16 d33 odd stride (CUDA-core path)", .b = 1, .hq = 2, .hkv = 2, .nq = 120, .nk = 140, .d = 33, .dt = BF, .pad = 3, .causal = 1, .wl = -1, .wr = -1},
    {.name = "bf16 d128 causal forced CUDA-core path", .b = 1, .hq = 2, .hkv = 2, .nq = 200, .nk = 200, .d = 128, .dt = BF, .causal = 1, .wl = -1, .wr = -1, .generic = 1, .sinks = SINKS_BF16},
    {.name = "bf16 d128 heads only, collapse 0.5", .b = 2, .hq = 2, .hkv = 2, .nq = 300, .nk = 300, .d = 128, .dt = BF, .causal = 1, .wl = -1, .wr = -1, .heads_only = 1, .collapse = 0.5f, .amp = 4.0, .sinks = SINKS_F32},
    {.name = "bf16 d64 packed GQA window sampled", .b = 3, .hq = 4, .hkv = 2, .d = 64, .dt = BF, .causal = 1, .wl = 64, .wr = 0, .packed = 1, .lq = {333, 17, 129}, .lk = {333, 17, 129}, .every = 3, .sinks = SINKS_BF16},
    {.name = "bf16 d128 causal N=1500 (many blocks and tiles), scale 0.05", .b = 1, .hq = 2, .hkv = 1, .nq = 1500, .nk = 1500, .d = 128, .dt = BF, .causal = 1, .wl = -1, .wr = -1, .scale = 0.05f},
    /* persistent kernels (variants 10-12) with several blocks per CTA (more blocks than a GPU has
     * SMs): their info slots, Q buffers and mbarrier phases turn over; with sequences of no keys
     * (blocks of no K tile) between them */
    {.name = "bf16 d64 causal GQA 32/8, N=768: blocks > SMs", .b = 2, .hq = 32, .hkv = 8, .nq = 768, .nk = 768, .d = 64, .dt = BF, .causal = 1, .wl = -1, .wr = -1},
    {.name = "bf16 d128 packed GQA 32/8, sequences without keys: blocks > SMs", .b = 6, .hq = 32, .hkv = 8, .d = 128, .dt = BF, .causal = 1, .wl = -1, .wr = -1, .packed = 1, .lq = {600, 40, 0, 450, 30, 200}, .lk = {600, 0, 0, 450, 0, 200}, .sinks = SINKS_BF16},
    {.name = "f16 d64 one visible key per row (window 0)", .b = 1, .hq = 2, .hkv = 2, .nq = 130, .nk = 130, .d = 64, .dt = FH, .causal = 1, .wl = 0, .wr = 0, .sinks = SINKS_F32},
    /* float32 tensors (autocast hands q and k over so), computed in bf16 / f16 on load */
    {.name = "f32 d128 causal computed as bf16 [B,N,H,D]", .b = 2, .hq = 4, .hkv = 2, .nq = 300, .nk = 300, .d = 128, .dt = FS, .bnhd = 1, .causal = 1, .wl = -1, .wr = -1, .compute = BF, .sinks = SINKS_BF16},
    {.name = "f32 d64 full computed as f16", .b = 2, .hq = 2, .hkv = 2, .nq = 200, .nk = 260, .d = 64, .dt = FS, .wl = -1, .wr = -1, .compute = FH},
    {.name = "f32 d256 causal computed as bf16 (mma.sync)", .b = 1, .hq = 2, .hkv = 2, .nq = 200, .nk = 200, .d = 256, .dt = FS, .causal = 1, .wl = -1, .wr = -1, .compute = BF, .sinks = SINKS_F32},
    {.name = "f32 d80 softcap 30 computed as bf16, padded rows", .b = 1, .hq = 3, .hkv = 3, .nq = 170, .nk = 170, .d = 80, .dt = FS, .pad = 8, .wl = -1, .wr = -1, .softcap = 30.0f, .amp = 40.0, .compute = BF},
    {.name = "f32 d64 odd stride computed as bf16 (CUDA-core)", .b = 1, .hq = 2, .hkv = 2, .nq = 120, .nk = 120, .d = 64, .dt = FS, .pad = 3, .causal = 1, .wl = -1, .wr = -1, .compute = BF},
    {.name = "f16 d64 computed as bf16 (CUDA-core)", .b = 1, .hq = 2, .hkv = 2, .nq = 140, .nk = 140, .d = 64, .dt = FH, .causal = 1, .wl = -1, .wr = -1, .compute = BF},
    /* masks */
    {.name = "bf16 d128 key padding mask + causal", .b = 3, .hq = 4, .hkv = 2, .nq = 280, .nk = 280, .d = 128, .dt = BF, .causal = 1, .wl = -1, .wr = -1, .mask = MASK_KEYPAD_BOOL, .sinks = SINKS_F32},
    {.name = "f32->bf16 d128 causal+padding bool mask (sdpa)", .b = 3, .hq = 4, .hkv = 4, .nq = 260, .nk = 260, .d = 128, .dt = FS, .bnhd = 1, .wl = -1, .wr = -1, .compute = BF, .mask = MASK_CAUSAL_PAD_BOOL},
    {.name = "bf16 d64 causal+padding bool mask, 16-byte rows (GQA)", .b = 3, .hq = 8, .hkv = 2, .nq = 512, .nk = 512, .d = 64, .dt = BF, .wl = -1, .wr = -1, .mask = MASK_CAUSAL_PAD_BOOL},
    {.name = "bf16 d64 random bool mask (general), more blocks than the gated grid", .b = 2, .hq = 16, .hkv = 4, .nq = 512, .nk = 512, .d = 64, .dt = BF, .wl = -1, .wr = -1, .mask = MASK_RANDOM_BOOL},
    {.name = "bf16 d64 random bool mask (general)", .b = 2, .hq = 2, .hkv = 2, .nq = 150, .nk = 170, .d = 64, .dt = BF, .wl = -1, .wr = -1, .mask = MASK_RANDOM_BOOL, .sinks = SINKS_BF16},
    {.name = "f16 d64 window mask f32 0/-inf", .b = 2, .hq = 2, .hkv = 1, .nq = 230, .nk = 230, .d = 64, .dt = FH, .wl = -1, .wr = -1, .mask = MASK_WINDOW_F32},
    {.name = "bf16 d128 bias mask bf16 (general)", .b = 2, .hq = 2, .hkv = 2, .nq = 130, .nk = 150, .d = 128, .dt = BF, .wl = -1, .wr = -1, .mask = MASK_BIAS_BF16},
    {.name = "f32->bf16 d64 eager mask (f32 lowest), sampled", .b = 2, .hq = 4, .hkv = 2, .nq = 310, .nk = 310, .d = 64, .dt = FS, .wl = -1, .wr = -1, .compute = BF, .mask = MASK_EAGER_F32, .every = 3},
    {.name = "bf16 d128 per-head window mask f16", .b = 1, .hq = 4, .hkv = 4, .nq = 200, .nk = 240, .d = 128, .dt = BF, .wl = -1, .wr = -1, .mask = MASK_HEAD_F16, .sinks = SINKS_F16},
    /* attention sinks with NaN, -inf, +inf and a dominating one */
    {.name = "bf16 d128 causal GQA sinks NaN/-inf/+inf/1e4", .b = 2, .hq = 4, .hkv = 2, .nq = 300, .nk = 300, .d = 128, .dt = BF, .causal = 1, .wl = -1, .wr = -1, .sinks = SINKS_ODD},
    {.name = "f16 d64 full sinks NaN/-inf/+inf/1e4, sampled", .b = 1, .hq = 6, .hkv = 6, .nq = 250, .nk = 270, .d = 64, .dt = FH, .wl = -1, .wr = -1, .every = 2, .sinks = SINKS_ODD},
    /* head_dim 256 and 192 (Gemma-class heads, DeepSeek-V3's latent attention): variant 6's d256
     * instance (Q in shared memory, AUTO's since round 15), mma.sync under test_mma_sync; with
     * "bf16 d256 causal" above */
    {.name = "f16 d256 GQA 4/2 full, sampled every 3, [B,N,H,D]", .b = 2, .hq = 4, .hkv = 2, .nq = 280, .nk = 330, .d = 256, .dt = FH, .bnhd = 1, .wl = -1, .wr = -1, .every = 3, .sinks = SINKS_F32},
    {.name = "bf16 d192 causal packed, softcap 50", .b = 3, .hq = 2, .hkv = 2, .d = 192, .dt = BF, .causal = 1, .wl = -1, .wr = -1, .packed = 1, .lq = {300, 70, 129}, .lk = {300, 70, 129}, .softcap = 50.0f, .amp = 30.0},
    /* sampled causal rows: a block spans far more positions than rows, so its first warpgroup
     * sees far fewer keys than its last, by more K tiles than the ring holds, after its own keys
     * (causal) and before them too (the window): the case a kernel that multiplies only each
     * warpgroup's own tiles must get right (bench/kernel_notes.md round 17) */
    {.name = "bf16 d128 causal N=2048 every 8th row: tiles passed", .b = 1, .hq = 4, .hkv = 2, .nq = 2048, .nk = 2048, .d = 128, .dt = BF, .causal = 1, .wl = -1, .wr = -1, .every = 8, .sinks = SINKS_F32},
    {.name = "f16 d64 causal window 300, N=2000, every 8th row", .b = 2, .hq = 2, .hkv = 1, .nq = 2000, .nk = 2000, .d = 64, .dt = FH, .causal = 1, .wl = 300, .wr = 0, .every = 8},
    {.name = "bf16 d96 causal GQA 8/2 N=700, sinks (Phi-3's head_dim)", .b = 2, .hq = 8, .hkv = 2, .nq = 700, .nk = 700, .d = 96, .dt = BF, .causal = 1, .wl = -1, .wr = -1, .sinks = SINKS_F32},
};
#define N_CFGS ((int)(sizeof k_cfgs / sizeof k_cfgs[0]))

/* ---- one run ---------------------------------------------------------------------------------- */

typedef struct {
    double max_row_h, max_row_m, max_mean;
    int64_t rows;
} errs;

#define CK_CUDA(call)                                                                              \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        ck_assert_msg(e_ == cudaSuccess, "%s: %s", #call, cudaGetErrorString(e_));                 \
    } while (0)

static int close_rel(double got, double ref, double rel, double abs_tol)
{
    if (isnan(ref))
        return isnan(got);
    if (isinf(ref))
        return got == ref;
    return fabs(got - ref) <= rel * fabs(ref) + abs_tol;
}

/* Builds c's mask in host memory for a problem of nq x nk, points p's mask at it (strides: 0 for
 * the dimensions it broadcasts) and says its size. */
static void *make_mask(const cfg *c, rng *r, int nq, int nk, stats_problem *p, size_t *bytes)
{
    int mb = c->b, mh = 1;
    stats_dtype dt = STATS_BOOL;
    switch (c->mask) {
    case MASK_RANDOM_BOOL: mh = c->hq; break;
    case MASK_WINDOW_F32: mb = 1, dt = STATS_F32; break;
    case MASK_BIAS_BF16: dt = STATS_BF16; break;
    case MASK_EAGER_F32: dt = STATS_F32; break;
    case MASK_HEAD_F16: mb = 1, mh = c->hq, dt = STATS_F16; break;
    default: break;
    }
    const int rows = c->mask == MASK_KEYPAD_BOOL ? 1 : nq; /* key padding: one row for all */
    const size_t es = stats_dtype_size(dt), n = (size_t)mb * mh * rows * nk;
    unsigned char *m = malloc(n * es);
    ck_assert(m);
    for (int b = 0; b < mb; b++)
        for (int h = 0; h < mh; h++)
            for (int i = 0; i < rows; i++)
                for (int j = 0; j < nk; j++) {
                    const size_t x = (((size_t)b * mh + h) * rows + i) * nk + j;
                    const int len = nk - 13 * b; /* sequence b's keys: the rest is padding */
                    int take = 1;
                    float bias = 0.0f;
                    switch (c->mask) {
                    case MASK_KEYPAD_BOOL: take = j < len; break;
                    case MASK_CAUSAL_PAD_BOOL:
                    case MASK_EAGER_F32: take = j <= i && j < len; break;
                    case MASK_RANDOM_BOOL: take = rng_next(r) % 100 < 60; break;
                    case MASK_WINDOW_F32: take = j <= i && j >= i - 40; break;
                    case MASK_BIAS_BF16:
                        take = rng_next(r) % 10 != 0;
                        bias = (float)(3.0 * (2.0 * rng_unit(r) - 1.0));
                        break;
                    case MASK_HEAD_F16: take = j >= i - 10 * (h + 1) && j <= i + 5 * h; break;
                    }
                    if (dt == STATS_BOOL)
                        m[x] = take ? (unsigned char)(1 + j % 5) : 0;
                    else if (dt == STATS_F32)
                        ((float *)m)[x] = take ? bias
                                               : c->mask == MASK_EAGER_F32 ? -3.402823466e38f
                                                                           : -INFINITY;
                    else
                        store(m, x, dt, take ? bias : -INFINITY);
                }
    p->mask.ptr = m;
    p->mask.stride_n = c->mask == MASK_KEYPAD_BOOL ? 0 : nk;
    p->mask.stride_h = mh > 1 ? (int64_t)rows * nk : 0;
    p->mask.stride_b = mb > 1 ? (int64_t)mh * rows * nk : 0;
    p->mask_dtype = dt;
    *bytes = n * es;
    return m;
}

/* path: the kernel family to use (WGMMA: the Hopper kernel where it applies; MMA_SYNC the other) */
static void run_cfg(const cfg *c, int iter, stats_cuda_path path, uint32_t want)
{
    rng r = {g_seed ^ (0x5851f42d4c957f2dULL * (uint64_t)(iter + 1))};
    const int packed = c->packed;
    int32_t cuq[8] = {0}, cuk[8] = {0};
    int nq = c->nq, nk = c->nk, pb = c->b;
    if (packed) {
        for (int s = 0; s < c->b; s++) {
            cuq[s + 1] = cuq[s] + c->lq[s];
            cuk[s + 1] = cuk[s] + c->lk[s];
        }
        nq = cuq[c->b], nk = cuk[c->b], pb = 1;
    }
    const size_t es = stats_dtype_size(c->dt);
    const int64_t row = c->d + c->pad;
    stats_problem p;
    stats_problem_init(&p);
    p.batch = c->b, p.heads_q = c->hq, p.heads_kv = c->hkv, p.len_q = nq, p.len_k = nk;
    p.head_dim = c->d, p.dtype = c->dt;
    if (c->bnhd) {
        p.q.stride_h = row, p.q.stride_n = row * c->hq, p.q.stride_b = p.q.stride_n * nq;
        p.k.stride_h = row, p.k.stride_n = row * c->hkv, p.k.stride_b = p.k.stride_n * nk;
    } else {
        p.q.stride_n = row, p.q.stride_h = row * nq, p.q.stride_b = p.q.stride_h * c->hq;
        p.k.stride_n = row, p.k.stride_h = row * nk, p.k.stride_b = p.k.stride_h * c->hkv;
    }
    p.causal = c->causal, p.window_left = c->wl, p.window_right = c->wr;
    p.softcap = c->softcap, p.scale = c->scale;
    p.sample_every = c->every, p.sample_rows = c->nsample, p.sample_seed = rng_next(&r);
    p.collapse_threshold = c->collapse;

    const size_t nq_el = (size_t)pb * c->hq * nq * row, nk_el = (size_t)pb * c->hkv * nk * row;
    void *hq = malloc(nq_el * es), *hk = malloc(nk_el * es);
    ck_assert(hq && hk);
    const double amp = c->amp > 0 ? c->amp : 1.0;
    double qn2 = 0, kn2 = 0, acc2 = 0; /* largest squared row norms of Q and K */
    for (size_t i = 0; i < nq_el; i++) {
        double v = amp * rng_gauss(&r);
        store(hq, i, c->dt, (float)v);
        acc2 += v * v;
        if ((i + 1) % (size_t)row == 0)
            qn2 = acc2 > qn2 ? acc2 : qn2, acc2 = 0;
    }
    for (size_t i = 0; i < nk_el; i++) {
        double v = rng_gauss(&r);
        store(hk, i, c->dt, (float)v);
        acc2 += v * v;
        if ((i + 1) % (size_t)row == 0)
            kn2 = acc2 > kn2 ? acc2 : kn2, acc2 = 0;
    }
    const double logit_scale = (c->scale > 0 ? c->scale : 1.0 / sqrt((double)c->d)) *
                               sqrt(qn2) * sqrt(kn2) * 1.01; /* 1% for the dtype's rounding */
    if (c->nonfinite) {
        const float bad[3] = {NAN, INFINITY, -INFINITY};
        for (int t = 0; t < 6; t++) { /* a few Q elements and a few K elements */
            size_t iq = (size_t)(rng_next(&r) % nq_el), ik = (size_t)(rng_next(&r) % nk_el);
            store(hq, iq, c->dt, bad[t % 3]);
            store(hk, ik, c->dt, bad[(t + 1) % 3]);
        }
    }
    p.q.ptr = hq, p.k.ptr = hk;
    if (packed)
        p.cu_seqlens_q = cuq, p.cu_seqlens_k = cuk;
    p.compute_dtype = c->compute;
    size_t mask_bytes = 0;
    void *hmask = c->mask ? make_mask(c, &r, nq, nk, &p, &mask_bytes) : NULL;
    void *hsinks = NULL;
    size_t sinks_bytes = 0;
    if (c->sinks) {
        const stats_dtype sdt = c->sinks == SINKS_BF16 ? BF : c->sinks == SINKS_F16 ? FH : FS;
        sinks_bytes = (size_t)c->hq * stats_dtype_size(sdt);
        hsinks = malloc(sinks_bytes);
        ck_assert(hsinks);
        for (int h = 0; h < c->hq; h++) {
            float v = (float)(amp * (1.5 + 1.5 * rng_gauss(&r)));
            if (c->sinks == SINKS_ODD && h < 4)
                v = h == 0 ? NAN : h == 1 ? -INFINITY : h == 2 ? INFINITY : 1e4f;
            store(hsinks, (size_t)h, sdt, v);
        }
        p.sinks = hsinks, p.sinks_dtype = sdt;
    }

    /* reference */
    const int64_t nrows = (int64_t)pb * c->hq * nq;
    stats_head *ref = calloc((size_t)c->hq, sizeof *ref), *got = malloc(sizeof *got * (size_t)c->hq);
    float *rh = malloc(sizeof(float) * (size_t)nrows), *rm = malloc(sizeof(float) * (size_t)nrows);
    float *gh = malloc(sizeof(float) * (size_t)nrows), *gm = malloc(sizeof(float) * (size_t)nrows);
    ck_assert(ref && got && rh && rm && gh && gm);
    stats_error err;
    stats_status st;

    /* device copies, on the stream the run takes: a copy from pageable memory by cudaMemcpy may
     * return before its DMA lands, and a non-blocking stream does not wait for the legacy one (a
     * run that read a previous configuration's data in part, seen with other processes on the
     * GPU) */
    cudaStream_t stream;
    CK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    void *dq = NULL, *dk = NULL;
    int32_t *dcuq = NULL, *dcuk = NULL;
    float *dh = NULL, *dm = NULL;
    CK_CUDA(cudaMalloc(&dq, nq_el * es));
    CK_CUDA(cudaMalloc(&dk, nk_el * es));
    CK_CUDA(cudaMemcpyAsync(dq, hq, nq_el * es, cudaMemcpyHostToDevice, stream));
    CK_CUDA(cudaMemcpyAsync(dk, hk, nk_el * es, cudaMemcpyHostToDevice, stream));
    static int32_t gq[8], gk[8]; /* what the device gets (static: the copies are asynchronous) */
    if (packed) {
        memcpy(gq, cuq, sizeof cuq);
        memcpy(gk, cuk, sizeof cuk);
        if (c->garble) { /* read as their running maximum, clamped to [0, rows]: the same layout */
            gq[0] = -7, gk[0] = -3;
            gq[c->b] = nq + 1000, gk[c->b] = INT32_MAX;
            for (int s = 1; s < c->b; s++)
                if (cuq[s] == cuq[s - 1]) /* an empty sequence's end: anything not above it */
                    gq[s] = cuq[s] - 60, gk[s] = cuk[s] == cuk[s - 1] ? INT32_MIN : gk[s];
        }
        CK_CUDA(cudaMalloc((void **)&dcuq, sizeof cuq));
        CK_CUDA(cudaMalloc((void **)&dcuk, sizeof cuk));
        CK_CUDA(cudaMemcpyAsync(dcuq, gq, sizeof gq, cudaMemcpyHostToDevice, stream));
        CK_CUDA(cudaMemcpyAsync(dcuk, gk, sizeof gk, cudaMemcpyHostToDevice, stream));
    }
    if (!c->heads_only) {
        CK_CUDA(cudaMalloc((void **)&dh, sizeof(float) * (size_t)nrows));
        CK_CUDA(cudaMalloc((void **)&dm, sizeof(float) * (size_t)nrows));
        CK_CUDA(cudaMemsetAsync(dh, 0x4b, sizeof(float) * (size_t)nrows, stream)); /* poison: 1.3e7 */
        CK_CUDA(cudaMemsetAsync(dm, 0x4b, sizeof(float) * (size_t)nrows, stream));
    }
    void *dmask = NULL, *dsinks = NULL;
    if (hmask) {
        CK_CUDA(cudaMalloc(&dmask, mask_bytes));
        CK_CUDA(cudaMemcpyAsync(dmask, hmask, mask_bytes, cudaMemcpyHostToDevice, stream));
    }
    if (hsinks) {
        CK_CUDA(cudaMalloc(&dsinks, sinks_bytes));
        CK_CUDA(cudaMemcpyAsync(dsinks, hsinks, sinks_bytes, cudaMemcpyHostToDevice, stream));
    }
    p.want = want;
    stats_problem pd = p;
    pd.q.ptr = dq, pd.k.ptr = dk;
    pd.cu_seqlens_q = dcuq, pd.cu_seqlens_k = dcuk;
    pd.mask.ptr = dmask;
    pd.sinks = dsinks;
    memset(got, 0xa5, sizeof *got * (size_t)c->hq);

    stats_cuda_set_path(g_ctx, c->generic ? STATS_CUDA_PATH_GENERIC : path);
    const char *kname = stats_cuda_kernel_name(g_ctx, &pd);
    const int variant = stats_cuda_plan_variant(g_ctx, &pd), no_extras = extras_nan(variant, want);
    /* the max logit alone, by a kernel without exps: no entropy at all */
    const size_t kl = strlen(kname);
    const int max_only = stats_want(want) == VOCAB_BIT(max_logit) && kl > 4 &&
                         strcmp(kname + kl - 4, " max") == 0;
    g_max_only_runs += max_only;
    g_d256_runs += strstr(kname, " d256 ws tma") != NULL;
    g_d96_runs += strstr(kname, " d96 ws tma") != NULL;
    /* The reference: plain float32 on the GPU is bf16 on the way in, on every path (stats_cuda.h),
     * so compare it with the reference computed so; the float32 error is measured in bench/. */
    if (c->dt == FS && c->compute == FS)
        p.compute_dtype = BF;
    st = stats_cpu(&p, ref, rh, rm, &err);
    ck_assert_msg(st == STATS_OK, "%s: stats_cpu: %s", c->name, err.msg);
    st = stats_cuda_run(g_ctx, &pd, stream, got, dh, dm, &err);
    ck_assert_msg(st == STATS_OK, "%s: stats_cuda_run: %s", c->name, err.msg);
    stats_cuda_set_path(g_ctx, STATS_CUDA_PATH_AUTO);
    if (!c->heads_only) {
        CK_CUDA(cudaMemcpy(gh, dh, sizeof(float) * (size_t)nrows, cudaMemcpyDeviceToHost));
        CK_CUDA(cudaMemcpy(gm, dm, sizeof(float) * (size_t)nrows, cudaMemcpyDeviceToHost));
    }

    errs e = {0, 0, 0, 0};
    int bad_rows = 0;
    for (int64_t i = 0; !c->heads_only && i < nrows; i++) {
        int ok_h, ok_m;
        if (isnan(rh[i]) || rh[i] == STATS_ROW_SKIPPED)
            ok_h = isnan(rh[i]) ? isnan(gh[i]) : gh[i] == STATS_ROW_SKIPPED;
        else if (max_only && (isnan(gh[i]) || !pd.mask.ptr))
            ok_h = isnan(gh[i]);
        else {
            double d = fabs((double)gh[i] - rh[i]);
            e.max_row_h = d > e.max_row_h ? d : e.max_row_h;
            ok_h = d <= 1e-3;
        }
        if (isnan(rm[i]) || isinf(rm[i]))
            ok_m = isnan(rm[i]) ? isnan(gm[i]) : gm[i] == rm[i];
        else {
            double d = fabs((double)gm[i] - rm[i]), sc = fabs(rm[i]) > 1.0 ? fabs(rm[i]) : 1.0;
            e.max_row_m = d / sc > e.max_row_m ? d / sc : e.max_row_m;
            ok_m = d <= 1e-5 * sc + 4.0 * 0x1p-24 * logit_scale;
        }
        if (!(ok_h && ok_m) && bad_rows++ < 8)
            fprintf(stderr, "  %s: row %lld: entropy %.7g (cpu %.7g), max logit %.9g (cpu %.9g)\n",
                    c->name, (long long)i, (double)gh[i], (double)rh[i], (double)gm[i], (double)rm[i]);
    }
    int bad_heads = 0;
    for (int h = 0; h < c->hq; h++) {
        const stats_head *a = &got[h], *b = &ref[h];
        e.rows += b->rows;
        double dmean = fabs(a->entropy_mean - b->entropy_mean) / (fabs(b->entropy_mean) + 1e-6);
        if (!isnan(b->entropy_mean) && dmean > e.max_mean)
            e.max_mean = dmean;
        const int ent_nan = a->rows_norm == 0 && isnan(a->entropy_mean) &&
                            isnan(a->entropy_norm_mean) && isnan(a->entropy_std) &&
                            isnan(a->entropy_min) && isnan(a->entropy_max) &&
                            isnan(a->collapsed_frac);
        const int ent_ok =
            max_only && (ent_nan || !pd.mask.ptr)
                ? ent_nan
                : a->rows_norm == b->rows_norm &&
                           close_rel(a->entropy_mean, b->entropy_mean, 1e-4, 1e-6) &&
                           close_rel(a->entropy_norm_mean, b->entropy_norm_mean, 1e-4, 1e-6) &&
                           close_rel(a->entropy_std, b->entropy_std, 0, 1e-3) &&
                           close_rel(a->entropy_min, b->entropy_min, 0, 1e-3) &&
                           close_rel(a->entropy_max, b->entropy_max, 0, 1e-3) &&
                           fabs(a->collapsed_frac - b->collapsed_frac) *
                                   (double)(b->rows_norm > 0 ? b->rows_norm : 1) <=
                               1.0 + 1e-9;
        int ok = a->rows == b->rows && ent_ok && a->rows_empty == b->rows_empty &&
                 a->nonfinite_rows == b->nonfinite_rows && a->sampled == b->sampled &&
                 close_rel(a->max_logit, b->max_logit, 1e-5, fabs(b->max_logit) < 1 ? 1e-5 : 0) &&
                 ((no_extras && isnan(a->sink_mass) && isnan(a->distance)) ||
                  ((!no_extras || pd.mask.ptr) && close_rel(a->sink_mass, b->sink_mass, 0, 1e-4) &&
                   close_rel(a->distance, b->distance, 1e-4, 1e-4)));
        if (!ok) {
            bad_heads++;
            fprintf(stderr,
                    "  %s: head %d: rows %lld/%lld norm %lld/%lld empty %lld/%lld nonfinite %lld/%lld "
                    "sampled %d/%d\n    mean %.9g/%.9g norm %.9g/%.9g std %.6g/%.6g min %.6g/%.6g "
                    "max %.6g/%.6g maxlogit %.9g/%.9g collapsed %.6g/%.6g\n"
                    "    sink mass %.9g/%.9g distance %.9g/%.9g (variant %d%s)\n",
                    c->name, h, (long long)a->rows, (long long)b->rows, (long long)a->rows_norm,
                    (long long)b->rows_norm, (long long)a->rows_empty, (long long)b->rows_empty,
                    (long long)a->nonfinite_rows, (long long)b->nonfinite_rows, a->sampled, b->sampled,
                    a->entropy_mean, b->entropy_mean, a->entropy_norm_mean, b->entropy_norm_mean,
                    a->entropy_std, b->entropy_std, a->entropy_min, b->entropy_min, a->entropy_max,
                    b->entropy_max, a->max_logit, b->max_logit, a->collapsed_frac, b->collapsed_frac,
                    a->sink_mass, b->sink_mass, a->distance, b->distance, variant,
                    no_extras ? ": must leave them NaN" : ": must compute them");
            if (max_only)
                fprintf(stderr, "    (the max logit alone: every entropy statistic must be NaN)\n");
        }
    }
    if (c->sinks == SINKS_ODD) /* the reference itself: NaN / +inf sinks count, 1e4 dominates */
        ck_assert_msg(ref[0].rows == 0 && ref[0].nonfinite_rows > 0 && ref[2].rows == 0 &&
                          ref[2].nonfinite_rows > 0 && ref[1].rows > 0 && ref[3].rows > 0 &&
                          ref[3].entropy_max < 1e-6,
                      "%s: the odd sinks do not give what stats.h says", c->name);
    printf("  [%2d] %-58s %-18s rows %6lld  max|dH| %.2e  max rel dmaxlogit %.2e  max rel dmean %.2e%s\n",
           iter, c->name, kname, (long long)e.rows, e.max_row_h, e.max_row_m, e.max_mean,
           bad_rows || bad_heads ? "  FAIL" : "");
    fflush(stdout);

    CK_CUDA(cudaStreamDestroy(stream));
    cudaFree(dq), cudaFree(dk), cudaFree(dcuq), cudaFree(dcuk), cudaFree(dh), cudaFree(dm);
    cudaFree(dmask), cudaFree(dsinks);
    free(hq), free(hk), free(ref), free(got), free(rh), free(rm), free(gh), free(gm), free(hmask);
    free(hsinks);
    ck_assert_msg(bad_rows == 0, "%s: %d rows out of tolerance (seed %llu)", c->name, bad_rows,
                  (unsigned long long)g_seed);
    ck_assert_msg(bad_heads == 0, "%s: %d heads out of tolerance (seed %llu)", c->name, bad_heads,
                  (unsigned long long)g_seed);
}

/* Every statistic asked for (VOCAB_STATS_ALL): the tensor-core kernels' instances with sink mass
 * and distance; and the default set, which they leave out. */
START_TEST(test_against_cpu)
{
    /* the Hopper kernel where the GPU has it (the default variant; AUTO takes it too on Hopper) */
    run_cfg(&k_cfgs[_i], _i, STATS_CUDA_PATH_WGMMA, VOCAB_STATS_ALL);
}
END_TEST

START_TEST(test_default_want_against_cpu)
{
    run_cfg(&k_cfgs[_i], _i, STATS_CUDA_PATH_WGMMA, 0);
}
END_TEST

START_TEST(test_auto_against_cpu)
{
    run_cfg(&k_cfgs[_i], _i, STATS_CUDA_PATH_AUTO, VOCAB_STATS_ALL);
}
END_TEST

/* The configuration with the most rows to compute (heads x sampled rows), where AUTO takes the
 * Hopper kernel rather than mma.sync for a small grid: found by size, not by its place in the
 * table (a literal index went stale once configurations were inserted before it). */
static int largest_grid_cfg(void)
{
    int best = 0;
    long long best_rows = -1;
    for (int i = 0; i < N_CFGS; i++) {
        const cfg *c = &k_cfgs[i];
        long long rows = 0;
        for (int s = 0; s < (c->packed ? c->b : 1); s++)
            rows += c->packed ? c->lq[s] : (long long)c->b * c->nq;
        if (c->every > 1)
            rows = (rows + c->every - 1) / c->every;
        else if (c->nsample > 0)
            rows = (long long)c->nsample * (c->packed ? 1 : c->b);
        rows *= c->hq;
        if (!c->generic && rows > best_rows)
            best = i, best_rows = rows;
    }
    return best;
}

/* Every variant of the Hopper kernel (ATTNSTAT_TEST_VARIANTS=1; the default one runs above):
 * every statistic (the instances with sink mass and distance), then the default set or the max
 * logit alone, in turn over the configurations, so that each variant's three instances run. */
START_TEST(test_wg_variants_against_cpu)
{
    const int v = _i / N_CFGS, c = _i % N_CFGS;
    if (!stats_cuda_wg_variant_exists(v))
        return; /* 4, 5: not Hopper variants (run above as themselves) */
    const stats_cuda_path path = (stats_cuda_path)(STATS_CUDA_PATH_WG_VARIANT + v);
    run_cfg(&k_cfgs[c], c, path, VOCAB_STATS_ALL);
    run_cfg(&k_cfgs[c], c, path, (c + v) & 1 ? 0 : VOCAB_BIT(max_logit));
}
END_TEST

/* The max logit alone (the FOLD_MAX instances where the default path's variant has one). */
START_TEST(test_max_only_against_cpu)
{
    run_cfg(&k_cfgs[_i], _i, STATS_CUDA_PATH_WGMMA, VOCAB_BIT(max_logit));
}
END_TEST

/* One variant alone (ATTNSTAT_TEST_WG_ONLY=v: e.g. under compute-sanitizer, where every path
 * would take too long), asking for every statistic, for the defaults and for the max logit alone. */
static int g_wg_only = -1;
START_TEST(test_wg_only_against_cpu)
{
    static const uint32_t wants[3] = {VOCAB_STATS_ALL, 0, VOCAB_BIT(max_logit)};
    run_cfg(&k_cfgs[_i % N_CFGS], _i % N_CFGS,
            (stats_cuda_path)(STATS_CUDA_PATH_WG_VARIANT + g_wg_only), wants[_i / N_CFGS]);
}
END_TEST

START_TEST(test_mma_sync_against_cpu)
{
    run_cfg(&k_cfgs[_i], _i, STATS_CUDA_PATH_MMA_SYNC, VOCAB_STATS_ALL);
}
END_TEST

/* The async variant leaves the heads on the device; same numbers as the synchronous one. */
START_TEST(test_async_matches_sync)
{
    cfg c = k_cfgs[1];
    rng r = {g_seed ^ 0xabcdefULL};
    const int n = c.nq, d = c.d, h = c.hq;
    stats_problem p;
    stats_problem_init(&p);
    p.batch = 1, p.heads_q = h, p.heads_kv = h, p.len_q = n, p.len_k = n, p.head_dim = d;
    p.dtype = STATS_BF16, p.causal = 1;
    p.q.stride_n = p.k.stride_n = d, p.q.stride_h = p.k.stride_h = (int64_t)d * n;
    p.q.stride_b = p.k.stride_b = (int64_t)d * n * h;
    size_t el = (size_t)h * n * d;
    uint16_t *buf = malloc(el * 2);
    ck_assert(buf);
    void *dq, *dk;
    CK_CUDA(cudaMalloc(&dq, el * 2));
    CK_CUDA(cudaMalloc(&dk, el * 2));
    for (size_t i = 0; i < el; i++)
        buf[i] = f32_to_bf16((float)rng_gauss(&r));
    CK_CUDA(cudaMemcpy(dq, buf, el * 2, cudaMemcpyHostToDevice));
    for (size_t i = 0; i < el; i++)
        buf[i] = f32_to_bf16((float)rng_gauss(&r));
    CK_CUDA(cudaMemcpy(dk, buf, el * 2, cudaMemcpyHostToDevice));
    p.q.ptr = dq, p.k.ptr = dk;
    /* On Hopper the TMA kernel really takes this problem when asked for (the driver accepted its
     * tensor map of K): the variant tests above would pass on its fallback too. */
    stats_cuda_set_path(g_ctx, STATS_CUDA_PATH_WGMMA);
    if (stats_cuda_plan_variant(g_ctx, &p) == stats_cuda_wg_variant_default()) {
        stats_cuda_set_path(g_ctx, STATS_VARIANT_PATH_WG(STATS_VARIANT_WS_TMA));
        ck_assert_int_eq(stats_cuda_plan_variant(g_ctx, &p), STATS_VARIANT_WS_TMA);
    }
    stats_cuda_set_path(g_ctx, STATS_CUDA_PATH_AUTO);
    stats_head *a = malloc(sizeof *a * (size_t)h), *b = malloc(sizeof *b * (size_t)h), *dh;
    CK_CUDA(cudaMalloc((void **)&dh, sizeof *dh * (size_t)h));
    stats_error err;
    ck_assert_msg(stats_cuda_run(g_ctx, &p, NULL, a, NULL, NULL, &err) == STATS_OK, "%s", err.msg);
    ck_assert_msg(stats_cuda_run_async(g_ctx, &p, NULL, dh, NULL, NULL, &err) == STATS_OK, "%s", err.msg);
    CK_CUDA(cudaMemcpy(b, dh, sizeof *b * (size_t)h, cudaMemcpyDeviceToHost));
    for (int i = 0; i < h; i++) { /* a fixed reduction order: bit-identical */
        ck_assert(a[i].rows == b[i].rows);
        ck_assert(a[i].entropy_mean == b[i].entropy_mean);
        ck_assert(a[i].max_logit == b[i].max_logit);
    }
    cudaFree(dq), cudaFree(dk), cudaFree(dh);
    free(buf), free(a), free(b);
}
END_TEST

START_TEST(test_errors)
{
    stats_error err;
    stats_cuda *c = NULL;
    ck_assert_int_eq(stats_cuda_create(1 << 20, &c, &err), STATS_EINVAL);
    ck_assert(c == NULL);
    ck_assert(strlen(err.msg) > 0);
    stats_problem p;
    stats_problem_init(&p);
    stats_head h;
    ck_assert_int_eq(stats_cuda_run(g_ctx, &p, NULL, &h, NULL, NULL, &err), STATS_EINVAL);
    ck_assert(strstr(err.msg, "sizes") != NULL);
    ck_assert_int_eq(stats_cuda_run(NULL, &p, NULL, &h, NULL, NULL, &err), STATS_EINVAL);
    ck_assert(stats_cuda_built() == 1);
}
END_TEST

int main(void)
{
    const char *env = getenv("ATTNSTAT_TEST_SEED");
    g_seed = env ? strtoull(env, NULL, 0) : (uint64_t)time(NULL) ^ ((uint64_t)clock() << 32);
    printf("test_stats_cuda: seed %llu (set ATTNSTAT_TEST_SEED=%llu to replay)\n",
           (unsigned long long)g_seed, (unsigned long long)g_seed);
    if (!stats_cuda_built()) {
        printf("test_stats_cuda: SKIPPED: this build has no CUDA backend\n");
        return 77;
    }
    if (stats_cuda_device_count() == 0) {
        printf("test_stats_cuda: SKIPPED: no CUDA device of compute capability >= 8.0 is visible "
               "(no GPU or no driver); the GPU suite runs on a machine with one\n");
        return 77;
    }
    stats_error err;
    if (stats_cuda_create(0, &g_ctx, &err) != STATS_OK) {
        printf("test_stats_cuda: FAILED to create the CUDA context: %s\n", err.msg);
        return 1;
    }
    const char *only = getenv("ATTNSTAT_TEST_WG_ONLY");
    if (only && *only) {
        g_wg_only = atoi(only);
        if (!stats_cuda_wg_variant_exists(g_wg_only)) {
            printf("test_stats_cuda: ATTNSTAT_TEST_WG_ONLY=%s is not a Hopper variant (0..%d, "
                   "kernels/cuda/variants.h)\n", only, stats_cuda_wg_variant_count() - 1);
            stats_cuda_destroy(g_ctx);
            return 1;
        }
    }
    Suite *s = suite_create("stats_cuda");
    TCase *tc = tcase_create("against_cpu");
    tcase_set_timeout(tc, 600);
    if (g_wg_only >= 0) {
        tcase_add_loop_test(tc, test_wg_only_against_cpu, 0, 3 * N_CFGS);
    } else {
        tcase_add_loop_test(tc, test_against_cpu, 0, N_CFGS);
        tcase_add_loop_test(tc, test_default_want_against_cpu, 0, N_CFGS);
        tcase_add_loop_test(tc, test_max_only_against_cpu, 0, N_CFGS);
        tcase_add_loop_test(tc, test_mma_sync_against_cpu, 0, N_CFGS);
        const int big = largest_grid_cfg();
        tcase_add_loop_test(tc, test_auto_against_cpu, big, big + 1);
        if (getenv("ATTNSTAT_TEST_VARIANTS") && atoi(getenv("ATTNSTAT_TEST_VARIANTS")) > 0)
            tcase_add_loop_test(tc, test_wg_variants_against_cpu, 0,
                                N_CFGS * stats_cuda_wg_variant_count());
        tcase_add_test(tc, test_async_matches_sync);
        tcase_add_test(tc, test_errors);
    }
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    /* one process: a CUDA context does not survive fork() */
    srunner_set_fork_status(sr, CK_NOFORK);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    /* on Hopper the max-logit-alone runs must have reached the FOLD_MAX instances (else the
     * checks above passed on kernels that compute the entropy too) */
    int major = 0;
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0) == cudaSuccess &&
        major == 9 && (g_wg_only < 0 || g_wg_only == STATS_VARIANT_WS_TMA ||
                       g_wg_only >= STATS_VARIANT_WS_TMA_3WG) && g_max_only_runs == 0) {
        printf("test_stats_cuda: no configuration ran a max-logit-alone instance on this Hopper GPU\n");
        failed++;
    }
    /* the default path (and variant 6 alone) must have taken variant 6's head_dim 256 instance
     * (else the d256 configurations passed on mma.sync) */
    if (major == 9 && (g_wg_only < 0 || g_wg_only == STATS_VARIANT_WS_TMA) && g_d256_runs == 0) {
        printf("test_stats_cuda: the head_dim 256 instance never ran on this Hopper GPU\n");
        failed++;
    }
    /* head_dim 80 and 96 on the default path (variants 10, 11) must have taken their d96 instances */
    if (major == 9 && (g_wg_only < 0 || g_wg_only == STATS_VARIANT_WS_TMA_PERS ||
                       g_wg_only == STATS_VARIANT_WS_TMA_3WG_PERS) && g_d96_runs == 0) {
        printf("test_stats_cuda: no configuration ran a head_dim 96 instance on this Hopper GPU\n");
        failed++;
    }
    stats_cuda_destroy(g_ctx);
    printf("test_stats_cuda: %d configurations, seed %llu: %s\n", N_CFGS, (unsigned long long)g_seed,
           failed ? "FAILED" : "passed");
    return failed ? 1 : 0;
}
