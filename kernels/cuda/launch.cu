/* launch.cu — the host side of the CUDA backend: the public API of stats_cuda.h (context,
 * workspace, plan, run) and the planner that picks a variant (variants.h) for each problem. Host
 * code only; stage: the CUDA backend of stats.h. Includes stats_cuda.h, cuda/kernels.h (the
 * kernels' tables and launchers) and cuda/variants.h; calls the CUDA runtime.
 *
 * A run, in launch order (all on the caller's stream, nothing synchronised but by stats_cuda_run):
 *   fill_rows      sampled runs with per-row outputs: every row "not computed" first (generic.cu)
 *   packed_offsets packed runs: the first block of each sequence (generic.cu)
 *   the statistics kernel of the planned variant: one CTA per (head, sequence, block of sampled
 *                  rows), one partial per CTA (wgmma_sm90.cu, wgf_sm90.cu, ws_sm90.cu, mma_sm80.cu,
 *                  generic.cu)
 *   reduce_heads   per head, the partials in a fixed order into a stats_head (generic.cu)
 *
 * The plan (make_plan): the Hopper variant asked for (or the default) when the device is Hopper,
 * the problem is bf16/f16, 16-byte aligned with strides multiple of 8, and 32 < head_dim <= 128
 * (256: variant 6);
 * else mma.sync (variant 4) when the problem is so aligned and its head_dim's instance fits the
 * device's shared memory; else the CUDA-core kernel (variant 5). Variant 6 (TMA) also needs a tensor
 * map of K that the driver accepts (encoded per run, make_plan); where it does not, variant 2. */
#include "stats_cuda.h"

#include <cuda_runtime.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"
#include "variants.h"
#include "vocab.h"

struct stats_cuda {
    int device;
    int sm_count;
    int cc_major;
    int wg_ok;               /* the Hopper kernels can run here */
    void *encode_tiled;      /* the driver's cuTensorMapEncodeTiled (variant 6), NULL without */
    int mma_fits[MMA_NDP];   /* each mma.sync instance fits the device's shared memory */
    stats_cuda_path path;
    void *ws;          /* device workspace */
    size_t ws_bytes;
    stats_head *host;  /* pinned staging for stats_cuda_run */
    size_t host_heads;
};

__attribute__((format(printf, 3, 4))) static stats_status fail(stats_error *err, stats_status st,
                                                               const char *fmt, ...)
{
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err->msg, sizeof err->msg, fmt, ap);
        va_end(ap);
    }
    return st;
}

#define CUDA_TRY(call, what)                                                                       \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess)                                                                     \
            return fail(err, STATS_EDEVICE, "stats_cuda: %s failed: %s (%s, code %d)", what,       \
                        cudaGetErrorString(e_), cudaGetErrorName(e_), (int)e_);                    \
    } while (0)

/* ---- the variants ---------------------------------------------------------------------------- */

/* The Hopper variants, by number (STATS_CUDA_PATH_WG_VARIANT + N): each a row of instances ordered
 * by head_dim; NULL for the numbers that are not Hopper variants. */
static const kernel_instance *const k_hopper[] = {
    stats_wgmma_sm90,  /* 0 */
    stats_wgf_sm90[0], /* 1 */
    stats_wgf_sm90[1], /* 2 */
    stats_wgf_sm90[2], /* 3 */
    NULL,              /* 4: mma.sync */
    NULL,              /* 5: CUDA cores */
    stats_ws_sm90[0],  /* 6 */
    stats_ws_sm90[1],  /* 7 */
    stats_ws_sm90[2],  /* 8 */
    stats_ws_sm90[3],  /* 9 */
    stats_ws_sm90[4],  /* 10 */
    stats_ws_sm90[5],  /* 11 */
    stats_ws_sm90[6],  /* 12 */
};
static_assert(sizeof k_hopper / sizeof k_hopper[0] == STATS_VARIANT_WG_END,
              "variants.h and the Hopper kernels' tables disagree");
/* Their instances with sink mass and distance in the fold (kernels.h), by the same numbers; NULL,
 * or an entry whose bf16 is NULL, where a variant has none. */
static const kernel_instance *const k_hopper_xs[] = {
    NULL, NULL, NULL, NULL, NULL, NULL,
    stats_ws_sm90_xs[0], stats_ws_sm90_xs[1], stats_ws_sm90_xs[2],
    stats_ws_sm90_xs[3], stats_ws_sm90_xs[4], stats_ws_sm90_xs[5], stats_ws_sm90_xs[6],
};
static_assert(sizeof k_hopper_xs / sizeof k_hopper_xs[0] == STATS_VARIANT_WG_END,
              "k_hopper_xs follows k_hopper");
/* Their instances with the max logit alone (FOLD_MAX), likewise. */
static const kernel_instance *const k_hopper_mo[] = {
    NULL, NULL, NULL, NULL, NULL, NULL,
    stats_ws_sm90_mo[0], stats_ws_sm90_mo[1], stats_ws_sm90_mo[2],
    stats_ws_sm90_mo[3], stats_ws_sm90_mo[4], stats_ws_sm90_mo[5], stats_ws_sm90_mo[6],
};
static_assert(sizeof k_hopper_mo / sizeof k_hopper_mo[0] == STATS_VARIANT_WG_END,
              "k_hopper_mo follows k_hopper");
/* Every table of Hopper instances: the plain ones first, then their twins. */
static const kernel_instance *const *const k_hopper_sets[] = {k_hopper, k_hopper_xs, k_hopper_mo};
#define K_HOPPER_NSETS (int)(sizeof k_hopper_sets / sizeof k_hopper_sets[0])
static_assert(STATS_VARIANT_WGMMA == 0 && STATS_VARIANT_FOLD2 == 1 &&
                  STATS_VARIANT_FOLD2_SW128 == 2 && STATS_VARIANT_FOLD2_SW128_MBAR == 3 &&
                  STATS_VARIANT_WS_TMA == 6 && STATS_VARIANT_WS_TMA_3WG_PERS_Q2 == 12,
              "the Hopper variants are asked for by number (STATS_CUDA_PATH_WG_VARIANT + N)");
static_assert(STATS_VARIANT_MMA_SYNC == 4 && STATS_VARIANT_GENERIC == 5 && STATS_VARIANT_COUNT == 13,
              "variants.h numbers its lines in order from 0 (stats_variant_get indexes them)");

extern "C" int stats_cuda_wg_variant_count(void)
{
    return STATS_VARIANT_WG_END;
}

extern "C" int stats_cuda_wg_variant_exists(int v)
{
    return v >= 0 && v < STATS_VARIANT_WG_END && k_hopper[v] != NULL;
}

extern "C" int stats_cuda_wg_variant_default(void)
{
    return STATS_VARIANT_DEFAULT;
}

/* Whether p asks for the max logit and nothing else: the FOLD_MAX instances' runs. */
static bool wants_max_only(const stats_problem *p)
{
    return stats_want(p->want) == VOCAB_BIT(max_logit);
}

/* The Hopper instance for p under ctx's path, its variant number in *variant; NULL when the path
 * does not ask for one or it does not apply. */
static const kernel_instance *pick_wg(const stats_cuda *ctx, const stats_problem *p, int *variant)
{
    int v = STATS_VARIANT_DEFAULT;
    const bool by_number = ctx->path >= STATS_CUDA_PATH_WG_VARIANT &&
                           ctx->path < STATS_CUDA_PATH_WG_VARIANT + STATS_VARIANT_WG_END &&
                           k_hopper[ctx->path - STATS_CUDA_PATH_WG_VARIANT];
    if (by_number)
        v = (int)ctx->path - STATS_CUDA_PATH_WG_VARIANT;
    else if (ctx->path != STATS_CUDA_PATH_AUTO && ctx->path != STATS_CUDA_PATH_WGMMA)
        return NULL;
    if (!ctx->wg_ok || p->head_dim <= 32)
        return NULL;
    /* AUTO among the TMA kernels, as measured in bench/kernel_notes.md round 7 (the persistent
     * ones in two runs beside 6 and 9): unsampled causal rows of up to 8192 keys take the
     * persistent kernels, variant 11 at head_dim > 64 (0.366-0.371 against variant 6's
     * 0.409-0.410 ms at (2,32,4096,128), 0.227 against 0.265-0.270 at (4,32,2048,128)), variant
     * 10 at 64 (0.311-0.314 against 0.350-0.355 at (1,16,8192,64)); longer causal rows variant 6
     * (its head-by-head order keeps K in L2: 2.26-2.32 ms at (1,32,16384,128) against 2.67 for
     * variant 10's longest-first order); unsampled full rows variant 10 (0.617-0.623 against
     * 0.630-0.631); sampled rows variant 6 (every 8th causal row 0.074 against 0.084-0.088).
     * Then (kernel_notes.md round 8, H100, 2026-11-27): head_dim 64 up to 4096 keys variant 11
     * too (0.194-0.196 against variant 10's 0.222 at (4,32/4,2048,64), the 1.1 B Llama's
     * shape); a mask with a row per query (a padded batch's [B, 1, N, N]: causal-like rows the
     * kernel learns only on the device) variant 9, whose CTAs are not persistent (0.254 against
     * 10's 0.280 at (4,32/4,2048,64), 0.381 against 0.461 at (1,16,8192,64), 0.296 against
     * 0.305 at (4,32,2048,128)); a key-padding mask ([B, 1, 1, N], full rows) as full rows.
     * After rounds 24-26 (H200, 2026-11-29, kernel_notes.md "AUTO after the deal", each in two
     * or more runs): with round 24's deal variant 11 also at head_dim 64 past 4096 keys
     * (0.2778-0.2784 against variant 10's 0.2794-0.2808 ms at (1,16,8192,64)), except for the
     * max logit alone there (variant 10's 0.1552-0.1572 against 11's 0.1637-0.1660); and every
     * 8th causal row at head_dim > 64 up to 4096 keys variant 11 (0.0693-0.0705 against variant
     * 6's 0.0710-0.0725 ms at (2,32,4096,128)). */
    const bool max_only = wants_max_only(p);
    const bool auto_path = v == STATS_VARIANT_DEFAULT && (ctx->path == STATS_CUDA_PATH_AUTO ||
                                                          ctx->path == STATS_CUDA_PATH_WGMMA);
    if (auto_path && p->sample_every <= 1 && p->sample_rows <= 0) {
        if (!p->causal && p->mask.ptr && p->mask.stride_n != 0)
            v = STATS_VARIANT_WS_TMA_3WG;
        else if (!p->causal)
            v = STATS_VARIANT_WS_TMA_PERS;
        else if (p->len_k <= 8192)
            v = p->head_dim <= 64 && p->len_k > 4096 && max_only ? STATS_VARIANT_WS_TMA_PERS
                                                                  : STATS_VARIANT_WS_TMA_3WG_PERS;
        /* The max logit alone at head_dim > 64 (the D 128 instance's) on causal rows of 1025 to
         * 2048 keys: variant 9's instance, not 11's (0.1695 against 0.1762 ms at
         * (4,32,2048,128); H200, bench_kernel ATTNSTAT_BENCH_VARIANTS_WANT, kernel_notes.md "The
         * max logit alone"). Up to 1024 keys variant 11 since round 26 started its max-only
         * blocks' K with their Q (0.1118-0.1123 against variant 9's 0.1165-0.1167 at
         * (8,32,1024,128), where 9 had led 0.1228 to 0.1311); 2048 not measured since. */
        if (v == STATS_VARIANT_WS_TMA_3WG_PERS && p->causal && p->head_dim > 64 &&
            p->len_k > 1024 && p->len_k <= 2048 && max_only)
            v = STATS_VARIANT_WS_TMA_3WG;
    } else if (auto_path && p->causal && p->sample_every > 1 && p->head_dim > 64 &&
               p->len_k <= 4096)
        v = STATS_VARIANT_WS_TMA_3WG_PERS;
    /* head_dim 129-256: variant 6's d256 instance (Q in shared memory), the one Hopper instance
     * there: 0.307-0.309 ms against mma.sync's 0.825-0.831 at (2,16,4096,256) causal (H200,
     * kernel_notes.md round 15) */
    if (p->head_dim > 128 && !by_number)
        v = STATS_VARIANT_WS_TMA;
    /* the TMA kernel takes 16-bit tensors as they are (no float32 instance) and needs the driver's
     * tensor-map encoder; else variant 2, its predecessor */
    if (v >= STATS_VARIANT_WS_TMA && (!ctx->encode_tiled || p->dtype == STATS_F32))
        v = STATS_VARIANT_FOLD2_SW128;
    const kernel_instance *best = NULL; /* the smallest instance that covers head_dim */
    for (int i = 0; i < WG_NDP; i++)
        if (p->head_dim <= k_hopper[v][i].dp && (!best || k_hopper[v][i].dp < best->dp))
            best = &k_hopper[v][i];
    if (best)
        *variant = v;
    return best;
}

/* The mma.sync instance for head_dim d, NULL when it does not fit this device. */
static const kernel_instance *pick_mma(const stats_cuda *ctx, int d)
{
    for (int i = 0; i < MMA_NDP; i++)
        if (d <= stats_mma_sm80[i].dp)
            return ctx->mma_fits[i] ? &stats_mma_sm80[i] : NULL;
    return NULL;
}

/* Whether p asks for a statistic that only the XS instances of the tensor-core kernels compute. */
static bool wants_extras(const stats_problem *p)
{
    return (stats_want(p->want) & (VOCAB_BIT(sink_mass) | VOCAB_BIT(distance))) != 0;
}

/* k's twin in the Hopper table `set` (k_hopper_xs, k_hopper_mo: the same variant and shape), NULL
 * when k is no plain Hopper instance or the variant has no twin there. */
static const kernel_instance *twin_of(const kernel_instance *k, const kernel_instance *const *set)
{
    for (int v = 0; v < STATS_VARIANT_WG_END; v++)
        if (k_hopper[v] && k >= k_hopper[v] && k < k_hopper[v] + WG_NDP) {
            const kernel_instance *x = set[v] ? &set[v][k - k_hopper[v]] : NULL;
            return x && x->bf16 ? x : NULL;
        }
    return NULL;
}

/* k's instance with sink mass and distance (the same shape), NULL when it has none. */
static const kernel_instance *xs_of(const kernel_instance *k)
{
    if (k >= stats_mma_sm80 && k < stats_mma_sm80 + MMA_NDP)
        return &stats_mma_sm80_xs[k - stats_mma_sm80];
    return twin_of(k, k_hopper_xs);
}

/* The tensor cores' operand type for p: the tensors' own 16-bit type, or for float32 tensors the
 * compute dtype (bf16 for plain float32: see stats_cuda.h). */
static stats_dtype operand_dtype(const stats_problem *p)
{
    if (p->dtype != STATS_F32)
        return p->dtype;
    return p->compute_dtype == STATS_F16 ? STATS_F16 : STATS_BF16;
}

/* Tensor-core path possible: 16-byte aligned bases, strides multiple of 8, and inputs the tiles
 * take as they are (bf16, f16) or convert as they load (float32); not a 16-bit tensor to be
 * computed in the other 16-bit type. */
static bool mma_ok(const stats_cuda *ctx, const stats_problem *p)
{
    if (p->dtype != STATS_F32 && p->compute_dtype != STATS_F32 && p->compute_dtype != p->dtype)
        return false;
    if (((uintptr_t)p->q.ptr & 15) || ((uintptr_t)p->k.ptr & 15))
        return false;
    const int64_t s[6] = {p->q.stride_b, p->q.stride_h, p->q.stride_n,
                          p->k.stride_b, p->k.stride_h, p->k.stride_n};
    for (int i = 0; i < 6; i++)
        if (s[i] % 8)
            return false;
    return pick_mma(ctx, p->head_dim) != NULL;
}

/* ---- context --------------------------------------------------------------------------------- */

extern "C" int stats_cuda_built(void)
{
    return 1;
}

extern "C" int stats_cuda_device_count(void)
{
    int n = 0, usable = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError(); /* clear the sticky-free error so later calls start clean */
        return 0;
    }
    for (int i = 0; i < n; i++) {
        int major = 0;
        if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, i) == cudaSuccess &&
            major >= 8)
            usable++;
    }
    return usable;
}

extern "C" stats_status stats_cuda_create(int device, stats_cuda **out, stats_error *err)
{
    if (err)
        err->msg[0] = '\0';
    if (!out)
        return fail(err, STATS_EINVAL, "stats_cuda_create: out is NULL");
    *out = NULL;
    int n = 0;
    CUDA_TRY(cudaGetDeviceCount(&n), "cudaGetDeviceCount (is the NVIDIA driver loaded?)");
    if (device < 0 || device >= n)
        return fail(err, STATS_EINVAL, "stats_cuda_create: device %d does not exist (%d visible)",
                    device, n);
    CUDA_TRY(cudaSetDevice(device), "cudaSetDevice");
    int major = 0, sms = 0;
    CUDA_TRY(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device),
             "cudaDeviceGetAttribute(compute capability)");
    CUDA_TRY(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device),
             "cudaDeviceGetAttribute(multiprocessor count)");
    if (major < 8)
        return fail(err, STATS_ENOTSUP,
                    "stats_cuda_create: device %d has compute capability %d.x; the kernels need 8.0 "
                    "or newer (Ampere, Hopper); use the CPU backend", device, major);
    int smem_optin = 0;
    CUDA_TRY(cudaDeviceGetAttribute(&smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device),
             "cudaDeviceGetAttribute(shared memory per block)");
    int ok[MMA_NDP];
    for (int i = 0; i < MMA_NDP * 2; i++) { /* each instance, then its XS twin */
        const kernel_instance *m = i < MMA_NDP ? &stats_mma_sm80[i] : &stats_mma_sm80_xs[i - MMA_NDP];
        if (i < MMA_NDP)
            ok[i] = m->smem + 1024 <= (size_t)smem_optin; /* + static shared memory */
        if (!ok[i % MMA_NDP])
            continue; /* that head_dim takes the CUDA-core path on this device */
        CUDA_TRY(cudaFuncSetAttribute(m->bf16, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                      (int)m->smem),
                 "cudaFuncSetAttribute(shared memory) for the bf16 kernel");
        CUDA_TRY(cudaFuncSetAttribute(m->f16, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                      (int)m->smem),
                 "cudaFuncSetAttribute(shared memory) for the f16 kernel");
        CUDA_TRY(cudaFuncSetAttribute(m->bf16_from_f32,
                                      cudaFuncAttributeMaxDynamicSharedMemorySize, (int)m->smem),
                 "cudaFuncSetAttribute(shared memory) for the bf16 kernel of float32 inputs");
        CUDA_TRY(cudaFuncSetAttribute(m->f16_from_f32,
                                      cudaFuncAttributeMaxDynamicSharedMemorySize, (int)m->smem),
                 "cudaFuncSetAttribute(shared memory) for the f16 kernel of float32 inputs");
    }
    stats_cuda *c = (stats_cuda *)calloc(1, sizeof *c);
    if (!c)
        return fail(err, STATS_ENOMEM, "stats_cuda_create: out of host memory");
    c->device = device;
    c->sm_count = sms;
    c->path = STATS_CUDA_PATH_AUTO;
    memcpy(c->mma_fits, ok, sizeof ok);
    c->cc_major = major;
    c->wg_ok = 0;
    if (major == 9) { /* the sm_90a binary: Hopper only */
        c->wg_ok = 1;
        for (int i = 0; i < STATS_VARIANT_WG_END * WG_NDP * K_HOPPER_NSETS; i++) { /* then twins */
            const int j = i % (STATS_VARIANT_WG_END * WG_NDP);
            const kernel_instance *const *tab = k_hopper_sets[i / (STATS_VARIANT_WG_END * WG_NDP)];
            if (!tab[j / WG_NDP] || !tab[j / WG_NDP][j % WG_NDP].bf16)
                continue;
            const kernel_instance *w = &tab[j / WG_NDP][j % WG_NDP];
            cudaError_t e1 = cudaFuncSetAttribute(w->bf16, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                  (int)w->smem);
            cudaError_t e2 = cudaFuncSetAttribute(w->f16, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                  (int)w->smem);
            for (stats_kernel_fn f : {w->bf16_from_f32, w->f16_from_f32})
                if (f && e1 == cudaSuccess && e2 == cudaSuccess)
                    e2 = cudaFuncSetAttribute(f, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                              (int)w->smem);
            if (e1 != cudaSuccess || e2 != cudaSuccess || w->smem + 1024 > (size_t)smem_optin) {
                cudaGetLastError();
                c->wg_ok = 0; /* mma.sync serves every head_dim then */
            }
        }
        /* Variant 6 encodes a tensor map of K per run through the driver's entry point (the
         * runtime links no libcuda); a driver without it leaves variant 6 to variant 2. */
        void *fn = NULL;
        cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
        if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault,
                                             &q) == cudaSuccess &&
            q == cudaDriverEntryPointSuccess)
            c->encode_tiled = fn;
        else
            cudaGetLastError();
    }
    *out = c;
    return STATS_OK;
}

extern "C" void stats_cuda_destroy(stats_cuda *ctx)
{
    if (!ctx)
        return;
    int prev = -1;
    cudaGetDevice(&prev);
    cudaSetDevice(ctx->device);
    if (ctx->ws)
        cudaFree(ctx->ws);
    if (ctx->host)
        cudaFreeHost(ctx->host);
    if (prev >= 0)
        cudaSetDevice(prev);
    free(ctx);
}

extern "C" void stats_cuda_set_path(stats_cuda *ctx, stats_cuda_path path)
{
    if (ctx)
        ctx->path = path;
}

/* ---- plan ------------------------------------------------------------------------------------ */

/* Launch plan of one problem. */
struct plan {
    const kernel_instance *k; /* the statistics kernel */
    stats_kernel_fn fn;       /* its instance for the problem's dtypes */
    int variant;              /* its number (variants.h) */
    int cvt;                  /* float32 tensors converted on load */
    int rows_per_cta, nblk, blocks_per_head;
    int mb, mh;               /* masked: the mask's batch and head extents (1 where broadcast) */
    tma_map ktm;              /* variant 6: K's tensor map */
    size_t parts_off, off_off, heads_off, rr_off, flag_off, bytes;
};

/* The instance of k for p's dtypes, NULL when k has none. */
static stats_kernel_fn instance_fn(const kernel_instance *k, const stats_problem *p)
{
    const bool f16 = operand_dtype(p) == STATS_F16;
    if (p->dtype == STATS_F32 && k != &stats_generic_cuda)
        return f16 ? k->f16_from_f32 : k->bf16_from_f32;
    return f16 ? k->f16 : k->bf16;
}

/* general: the mask (if any) must be read per logit, which only the CUDA-core kernel does. */
static stats_status make_plan(const stats_cuda *ctx, const stats_problem *p, plan *pl,
                              stats_error *err, int general)
{
    memset(pl, 0, sizeof *pl);
    const bool tc = ctx->path != STATS_CUDA_PATH_GENERIC && !general && mma_ok(ctx, p);
    pl->k = tc ? pick_wg(ctx, p, &pl->variant) : NULL;
    if (pl->k && pl->variant >= STATS_VARIANT_WS_TMA &&
        !ws_encode_k_map(ctx->encode_tiled, p, &pl->ktm)) {
        stats_cuda tmp = *ctx; /* a K the TMA unit does not take: variant 2 */
        tmp.path = STATS_VARIANT_PATH_WG(STATS_VARIANT_FOLD2_SW128);
        pl->k = pick_wg(&tmp, p, &pl->variant);
    }
    if (pl->k && !instance_fn(pl->k, p)) { /* float32: AUTO takes variant 2, which has them */
        stats_cuda tmp = *ctx;
        tmp.path = STATS_CUDA_PATH_AUTO;
        pl->k = pick_wg(&tmp, p, &pl->variant);
        if (pl->k && !instance_fn(pl->k, p))
            pl->k = NULL;
    }
    /* Small grids (sampled runs, mostly) take the Hopper kernel too: until round 3 of
     * bench/kernel_notes.md AUTO switched to mma.sync's 256-row blocks (variant 4) under two waves
     * of the 192-row grid (0.18 ms against 0.21 ms at every 8th row of (2,32,4096,128)); variant 2
     * takes 0.164 ms there against mma.sync's 0.180 ms, and 0.138 against 0.175 causal (round 4). */
    if (!pl->k && tc && (pl->k = pick_mma(ctx, p->head_dim)) != NULL)
        pl->variant = STATS_VARIANT_MMA_SYNC;
    /* Sink mass or distance asked for: the instance that computes them. AUTO leaves a Hopper
     * variant that has none (2: float32 inputs, or a K the TMA unit refuses) for mma.sync's; a
     * path that names a variant keeps it (they stay NaN). */
    if (pl->k && wants_extras(p)) {
        const kernel_instance *x = xs_of(pl->k);
        if (!x && pl->variant != STATS_VARIANT_MMA_SYNC &&
            (ctx->path == STATS_CUDA_PATH_AUTO || ctx->path == STATS_CUDA_PATH_WGMMA)) {
            const kernel_instance *m = pick_mma(ctx, p->head_dim);
            if (m && (x = xs_of(m)) != NULL)
                pl->variant = STATS_VARIANT_MMA_SYNC;
        }
        if (x)
            pl->k = x;
    }
    /* The max logit alone asked for: the instance without exps, where the variant has one (the
     * others compute the entropy too, which stats_head_keep() then leaves out). */
    if (pl->k && wants_max_only(p)) {
        const kernel_instance *x = twin_of(pl->k, k_hopper_mo);
        if (x)
            pl->k = x;
    }
    if (pl->k && !instance_fn(pl->k, p))
        pl->k = NULL;
    if (!pl->k) {
        pl->k = &stats_generic_cuda;
        pl->variant = STATS_VARIANT_GENERIC;
    }
    pl->fn = instance_fn(pl->k, p);
    pl->cvt = p->dtype == STATS_F32 && pl->variant != STATS_VARIANT_GENERIC;
    pl->rows_per_cta = pl->k->rows_per_cta;
    const int packed = p->cu_seqlens_q != NULL;
    long long bph;
    if (!packed) {
        long long ns = stats_sampled_count(p, p->len_q);
        pl->nblk = (int)((ns + pl->rows_per_cta - 1) / pl->rows_per_cta);
        if (pl->nblk < 1)
            pl->nblk = 1;
        bph = (long long)pl->nblk * p->batch;
    } else {
        bph = ((long long)p->len_q + pl->rows_per_cta - 1) / pl->rows_per_cta + p->batch;
    }
    if (bph > 0x7fffffffLL)
        return fail(err, STATS_EINVAL, "stats_cuda: %lld blocks per head is over the grid limit",
                    bph);
    if (p->heads_q > 65535)
        return fail(err, STATS_EINVAL, "stats_cuda: heads_q %d is over the grid limit 65535",
                    p->heads_q);
    pl->blocks_per_head = (int)bph;
    /* The heads first: at offset 0 whatever the plan, so that stats_cuda_run's staging of them
     * never overlaps what a run planned differently (a masked run re-plans) writes. */
    size_t o = 0;
    pl->heads_off = o;
    o += sizeof(stats_head) * (size_t)p->heads_q;
    o = (o + 255) & ~(size_t)255;
    pl->parts_off = o;
    o += sizeof(part) * (size_t)bph * (size_t)p->heads_q;
    o = (o + 255) & ~(size_t)255;
    pl->off_off = o;
    o += sizeof(int) * (size_t)(packed ? 3 * (p->batch + 1) : 1); /* blk_off, then the offsets
                                                                        * as the kernels read them */
    if (p->mask.ptr) {
        pl->mb = p->mask.stride_b == 0 || p->batch == 1 ? 1 : p->batch;
        pl->mh = p->mask.stride_h == 0 || p->heads_q == 1 ? 1 : p->heads_q;
        o = (o + 255) & ~(size_t)255;
        pl->rr_off = o;
        o += sizeof(int2) * (size_t)pl->mb * (size_t)pl->mh * (size_t)p->len_q;
        o = (o + 255) & ~(size_t)255;
        pl->flag_off = o;
        o += sizeof(int);
    }
    pl->bytes = o;
    return STATS_OK;
}

/* A masked run whose tensors fit the tensor cores launches both paths behind the mask's analysis
 * (kparams.gate): the tensor-core plan pl as laid out, then the CUDA-core kernel's parts at
 * *gen_parts_off, past it. Returns the workspace bytes such a run needs (pl's own otherwise), and
 * the CUDA-core plan in *gen when gen_parts_off is set. */
static stats_status run_layout(const stats_cuda *ctx, const stats_problem *p, plan *pl, plan *gen,
                               size_t *gen_parts_off, size_t *bytes, stats_error *err)
{
    stats_status st = make_plan(ctx, p, pl, err, 0);
    if (st != STATS_OK)
        return st;
    *gen_parts_off = 0;
    *bytes = pl->bytes;
    if (!p->mask.ptr || pl->variant == STATS_VARIANT_GENERIC)
        return STATS_OK;
    st = make_plan(ctx, p, gen, err, 1);
    if (st != STATS_OK)
        return st;
    *gen_parts_off = (pl->bytes + 255) & ~(size_t)255;
    *bytes = *gen_parts_off + sizeof(part) * (size_t)gen->blocks_per_head * (size_t)p->heads_q;
    return STATS_OK;
}

extern "C" int stats_cuda_plan_variant(const stats_cuda *ctx, const stats_problem *p)
{
    plan pl;
    if (!ctx || !p || stats_validate(p, NULL) != STATS_OK ||
        make_plan(ctx, p, &pl, NULL, 0) != STATS_OK)
        return -1;
    return pl.variant;
}

/* ---- workspace ------------------------------------------------------------------------------- */

static stats_status grow(stats_cuda *ctx, size_t bytes, void *stream, stats_error *err)
{
    if (bytes <= ctx->ws_bytes)
        return STATS_OK;
    if (ctx->ws) {
        /* the previous call on this stream may still read the old workspace */
        CUDA_TRY(cudaStreamSynchronize((cudaStream_t)stream), "cudaStreamSynchronize before growing");
        CUDA_TRY(cudaFree(ctx->ws), "cudaFree(workspace)");
        ctx->ws = NULL;
        ctx->ws_bytes = 0;
    }
    size_t want = bytes + bytes / 4;
    cudaError_t e = cudaMalloc(&ctx->ws, want);
    if (e != cudaSuccess) {
        ctx->ws = NULL;
        cudaGetLastError();
        return fail(err, e == cudaErrorMemoryAllocation ? STATS_ENOMEM : STATS_EDEVICE,
                    "stats_cuda: cudaMalloc of a %zu-byte workspace failed: %s", want,
                    cudaGetErrorString(e));
    }
    ctx->ws_bytes = want;
    return STATS_OK;
}

static stats_status check_problem(stats_cuda *ctx, const stats_problem *p, stats_error *err)
{
    if (!ctx)
        return fail(err, STATS_EINVAL, "stats_cuda: context is NULL");
    stats_status st = stats_validate(p, err);
    if (st != STATS_OK)
        return st;
    return STATS_OK;
}

extern "C" stats_status stats_cuda_reserve(stats_cuda *ctx, const stats_problem *p, stats_error *err)
{
    if (err)
        err->msg[0] = '\0';
    if (!ctx || !p)
        return fail(err, STATS_EINVAL, "stats_cuda_reserve: context or problem is NULL");
    CUDA_TRY(cudaSetDevice(ctx->device), "cudaSetDevice");
    /* the larger of the run's own layout and the CUDA-core path's (fewer rows per block) */
    plan pl, pg;
    size_t gen_off = 0, bytes = 0;
    stats_status st = run_layout(ctx, p, &pl, &pg, &gen_off, &bytes, err);
    if (st != STATS_OK)
        return st;
    stats_cuda tmp = *ctx;
    tmp.path = STATS_CUDA_PATH_GENERIC;
    st = make_plan(&tmp, p, &pl, err, 1);
    if (st != STATS_OK)
        return st;
    st = grow(ctx, bytes > pl.bytes ? bytes : pl.bytes, NULL, err);
    if (st != STATS_OK)
        return st;
    if (ctx->host_heads < (size_t)p->heads_q) {
        if (ctx->host)
            CUDA_TRY(cudaFreeHost(ctx->host), "cudaFreeHost");
        ctx->host = NULL;
        ctx->host_heads = 0;
        CUDA_TRY(cudaMallocHost((void **)&ctx->host, sizeof(stats_head) * (size_t)p->heads_q),
                 "cudaMallocHost(per-head staging)");
        ctx->host_heads = (size_t)p->heads_q;
    }
    return STATS_OK;
}

/* ---- run ------------------------------------------------------------------------------------- */

extern "C" const char *stats_cuda_kernel_name(const stats_cuda *ctx, const stats_problem *p)
{
    if (!ctx || !p)
        return "none";
    plan pl;
    if (make_plan(ctx, p, &pl, NULL, 0) != STATS_OK)
        return "none (invalid problem)";
    if (pl.variant != STATS_VARIANT_GENERIC) {
        const char *n = operand_dtype(p) == STATS_F16 ? pl.k->name_f16 : pl.k->name_bf16;
        if (!pl.cvt)
            return n;
        static __thread char buf[96];
        snprintf(buf, sizeof buf, "%s from f32", n);
        return buf;
    }
    return p->dtype == STATS_F32 ? "cuda-core f32" : p->dtype == STATS_F16 ? "cuda-core f16"
                                                                           : "cuda-core bf16";
}

/* The statistics kernel's grid: a CTA per (block, head), or for a persistent kernel one per SM
 * (fewer when there are fewer blocks), each taking one block of every round of G (item.h
 * item_deal). */
static dim3 grid_of(const stats_cuda *ctx, const plan &pl, int heads_q)
{
    if (!pl.k->persistent)
        return dim3((unsigned)pl.blocks_per_head, (unsigned)heads_q);
    const long long items = (long long)pl.blocks_per_head * heads_q;
    return dim3((unsigned)(items < ctx->sm_count ? items : ctx->sm_count));
}

extern "C" stats_status stats_cuda_run_async(stats_cuda *ctx, const stats_problem *p, void *stream,
                                             stats_head *heads_dev, float *row_entropy,
                                             float *row_maxlogit, stats_error *err)
{
    if (err)
        err->msg[0] = '\0';
    stats_status st = check_problem(ctx, p, err);
    if (st != STATS_OK)
        return st;
    if (!heads_dev)
        return fail(err, STATS_EINVAL, "stats_cuda: heads output is NULL");
    CUDA_TRY(cudaSetDevice(ctx->device), "cudaSetDevice");
    cudaStream_t s = (cudaStream_t)stream;
    plan pl, pg;
    size_t gen_off = 0, bytes = 0;
    st = run_layout(ctx, p, &pl, &pg, &gen_off, &bytes, err);
    if (st != STATS_OK)
        return st;
    st = grow(ctx, bytes, stream, err);
    if (st != STATS_OK)
        return st;

    kparams k;
    memset(&k, 0, sizeof k);
    const int packed = p->cu_seqlens_q != NULL;
    k.q = (const char *)p->q.ptr, k.k = (const char *)p->k.ptr;
    k.qsb = p->q.stride_b, k.qsh = p->q.stride_h, k.qsn = p->q.stride_n;
    k.ksb = p->k.stride_b, k.ksh = p->k.stride_h, k.ksn = p->k.stride_n;
    k.batch = p->batch, k.hq = p->heads_q, k.group = p->heads_q / p->heads_kv;
    k.len_q = p->len_q, k.len_k = p->len_k, k.d = p->head_dim, k.dtype = (int)p->dtype;
    k.esize = (int)stats_dtype_size(p->dtype);
    k.packed = packed;
    k.cu_q = p->cu_seqlens_q, k.cu_k = p->cu_seqlens_k;
    k.blk_off = (const int *)((char *)ctx->ws + pl.off_off);
    k.ktm = pl.ktm;
    /* longest rows first where a causal grid is a few waves (bench/kernel_notes.md, round 7: on
     * grids of many waves the CTAs that then start together lost 9% at (8,32,1024,128)) */
    k.lpt = pl.variant >= STATS_VARIANT_WS_TMA && p->causal && !packed &&
            (pl.k->persistent || (long long)pl.blocks_per_head * p->heads_q <= 4LL * ctx->sm_count);
    k.nblk = pl.nblk;
    k.blocks_per_head = pl.blocks_per_head;
    k.rows_per_cta = pl.rows_per_cta;
    const float scale = p->scale > 0.0f ? p->scale : 1.0f / sqrtf((float)p->head_dim);
    k.c = scale * LOG2E_F;
    k.softcap = p->softcap > 0.0f;
    k.sc = k.softcap ? scale / p->softcap : 0.0f;
    k.cl = k.softcap ? p->softcap * LOG2E_F : 0.0f;
    k.causal = p->causal, k.wl = p->window_left, k.wr = p->window_right;
    k.sample_every = p->sample_every, k.sample_rows = p->sample_rows, k.seed = p->sample_seed;
    k.collapse = p->collapse_threshold > 0.0f ? p->collapse_threshold : STATS_DEFAULT_COLLAPSE;
    k.row_h = row_entropy, k.row_m = row_maxlogit;
    k.sampled = p->sample_every > 1 || p->sample_rows > 0;
    /* Plain float32 is computed as bf16 on every GPU path, as on the tensor cores (operand_dtype):
     * the CUDA-core kernel a misaligned float32 push falls to gives the same values. */
    k.compute = p->dtype == STATS_F32 && p->compute_dtype == STATS_F32 ? (int)STATS_BF16
                                                                       : (int)p->compute_dtype;
    k.sinks = p->sinks, k.sinks_dtype = (int)p->sinks_dtype;
    if (p->mask.ptr) { /* the general mask, as the CUDA-core kernel reads it per logit */
        k.mask = (const char *)p->mask.ptr;
        k.msb = p->mask.stride_b, k.msh = p->mask.stride_h, k.msn = p->mask.stride_n;
        k.mdtype = (int)p->mask_dtype;
    }
    stats_head *heads_ws = (stats_head *)heads_dev;
    part *parts = (part *)((char *)ctx->ws + pl.parts_off);

    if (k.sampled && (row_entropy || row_maxlogit)) {
        long long n = (long long)(packed ? 1 : p->batch) * p->heads_q * p->len_q;
        CUDA_TRY(launch_fill_rows(row_entropy, row_maxlogit, n, ctx->sm_count, s),
                 "launch of fill_rows_kernel");
    }
    if (packed) {
        int *blk_off = (int *)((char *)ctx->ws + pl.off_off);
        CUDA_TRY(launch_packed_offsets(k, blk_off, s), "launch of packed_offsets_kernel");
        /* every kernel after it reads the offsets it wrote (running maxima, clamped) */
        k.cu_q = blk_off + p->batch + 1, k.cu_k = blk_off + 2 * (p->batch + 1);
    }

    if (gen_off) {
        /* A masked run on the tensor cores: each mask row's interval of keys, and the flag saying
         * whether some row is not one interval (or has a finite bias). Both paths are launched,
         * gated by the flag on the device: the tensor-core kernel with the per-row intervals, the
         * CUDA-core kernel reading the mask per logit; the one not chosen returns at once. No
         * synchronisation with the host, so that a run is one submission. */
        int2 *rr = (int2 *)((char *)ctx->ws + pl.rr_off);
        int *flag = (int *)((char *)ctx->ws + pl.flag_off);
        CUDA_TRY(cudaMemsetAsync(flag, 0, sizeof(int), s), "cudaMemsetAsync(mask flag)");
        CUDA_TRY(launch_mask_ranges(k, pl.mb, pl.mh, rr, flag, ctx->sm_count, s),
                 "launch of mask_ranges_kernel");
        kparams kg = k;
        kg.gate = flag, kg.gate_general = 1;
        kg.nblk = pg.nblk, kg.blocks_per_head = pg.blocks_per_head, kg.rows_per_cta = pg.rows_per_cta;
        k.mask = NULL;
        k.rr = rr, k.rr_mb = pl.mb, k.rr_mh = pl.mh;
        k.gate = flag, k.gate_general = 0;
        pl.fn<<<grid_of(ctx, pl, p->heads_q), pl.k->threads, pl.k->smem, s>>>(k, parts);
        cudaError_t le = cudaGetLastError();
        if (le != cudaSuccess)
            return fail(err, STATS_EDEVICE, "stats_cuda: launch of %s failed: %s (%s, code %d)",
                        pl.k->kernel, cudaGetErrorString(le), cudaGetErrorName(le), (int)le);
        CUDA_TRY(launch_reduce_heads(parts, pl.blocks_per_head, k.sampled, heads_ws, p->heads_q,
                                     flag, 0, s),
                 "launch of reduce_heads_kernel");
        part *gparts = (part *)((char *)ctx->ws + gen_off);
        le = launch_generic_gated(kg, gparts, p->heads_q, ctx->sm_count, s);
        if (le != cudaSuccess)
            return fail(err, STATS_EDEVICE, "stats_cuda: launch of %s failed: %s (%s, code %d)",
                        "stats_generic_gated_kernel", cudaGetErrorString(le),
                        cudaGetErrorName(le), (int)le);
        CUDA_TRY(launch_reduce_heads(gparts, pg.blocks_per_head, k.sampled, heads_ws, p->heads_q,
                                     flag, 1, s),
                 "launch of reduce_heads_kernel");
        return STATS_OK;
    }

    pl.fn<<<grid_of(ctx, pl, p->heads_q), pl.k->threads, pl.k->smem, s>>>(k, parts);
    cudaError_t le = cudaGetLastError();
    if (le != cudaSuccess)
        return fail(err, STATS_EDEVICE, "stats_cuda: launch of %s failed: %s (%s, code %d)",
                    pl.k->kernel, cudaGetErrorString(le), cudaGetErrorName(le), (int)le);
    CUDA_TRY(launch_reduce_heads(parts, pl.blocks_per_head, k.sampled, heads_ws, p->heads_q, NULL,
                                 0, s),
             "launch of reduce_heads_kernel");
    return STATS_OK;
}

/* out[h] = the larger of out[h] and head h's max logit (fmax: NaN in out counts as none), so that
 * out holds the largest of every run folded into it since its owner set it to NaN. */
__global__ void head_max_into(const stats_head *heads, double *out, int n)
{
    const int h = blockIdx.x * blockDim.x + threadIdx.x;
    if (h < n)
        out[h] = fmax(out[h], heads[h].max_logit);
}

extern "C" stats_status stats_cuda_run_to(stats_cuda *ctx, const stats_problem *p, void *stream,
                                          stats_head *heads_host, double *maxlogit_dev,
                                          float *row_entropy, float *row_maxlogit,
                                          stats_error *err)
{
    if (err)
        err->msg[0] = '\0';
    stats_status st = check_problem(ctx, p, err);
    if (st != STATS_OK)
        return st;
    if (!heads_host)
        return fail(err, STATS_EINVAL, "stats_cuda: heads output is NULL");
    CUDA_TRY(cudaSetDevice(ctx->device), "cudaSetDevice");
    plan pl, pg;
    size_t gen_off = 0, bytes = 0;
    st = run_layout(ctx, p, &pl, &pg, &gen_off, &bytes, err);
    if (st != STATS_OK)
        return st;
    /* grown here, so that run_async does not move the workspace under heads_ws */
    st = grow(ctx, bytes, stream, err);
    if (st != STATS_OK)
        return st;
    stats_head *heads_ws = (stats_head *)((char *)ctx->ws + pl.heads_off);
    st = stats_cuda_run_async(ctx, p, stream, heads_ws, row_entropy, row_maxlogit, err);
    if (st != STATS_OK)
        return st;
    cudaStream_t s = (cudaStream_t)stream;
    cudaError_t ce = cudaMemcpyAsync(heads_host, heads_ws, sizeof(stats_head) * (size_t)p->heads_q,
                                     cudaMemcpyDeviceToHost, s);
    if (ce == cudaSuccess && maxlogit_dev) {
        head_max_into<<<(p->heads_q + 127) / 128, 128, 0, s>>>(heads_ws, maxlogit_dev, p->heads_q);
        ce = cudaGetLastError();
    }
    if (ce != cudaSuccess) {
        /* The kernels are launched: wait for them before returning, so that the caller does not
         * release the memory they read while they still run. */
        cudaError_t se = cudaStreamSynchronize(s);
        return fail(err, STATS_EDEVICE,
                    "stats_cuda: copying the per-head statistics out failed: %s (%s, "
                    "code %d); cudaStreamSynchronize after it: %s", cudaGetErrorString(ce),
                    cudaGetErrorName(ce), (int)ce,
                    se == cudaSuccess ? "ok" : cudaGetErrorString(se));
    }
    return STATS_OK;
}

extern "C" stats_status stats_cuda_run(stats_cuda *ctx, const stats_problem *p, void *stream,
                                       stats_head *heads, float *row_entropy, float *row_maxlogit,
                                       stats_error *err)
{
    if (err)
        err->msg[0] = '\0';
    stats_status st = check_problem(ctx, p, err);
    if (st != STATS_OK)
        return st;
    if (!heads)
        return fail(err, STATS_EINVAL, "stats_cuda: heads output is NULL");
    CUDA_TRY(cudaSetDevice(ctx->device), "cudaSetDevice");
    if (ctx->host_heads < (size_t)p->heads_q) {
        if (ctx->host) {
            CUDA_TRY(cudaStreamSynchronize((cudaStream_t)stream), "cudaStreamSynchronize");
            CUDA_TRY(cudaFreeHost(ctx->host), "cudaFreeHost");
        }
        ctx->host = NULL;
        ctx->host_heads = 0;
        CUDA_TRY(cudaMallocHost((void **)&ctx->host, sizeof(stats_head) * (size_t)p->heads_q),
                 "cudaMallocHost(per-head staging)");
        ctx->host_heads = (size_t)p->heads_q;
    }
    st = stats_cuda_run_to(ctx, p, stream, ctx->host, NULL, row_entropy, row_maxlogit, err);
    if (st != STATS_OK)
        return st;
    CUDA_TRY(cudaStreamSynchronize((cudaStream_t)stream),
             "cudaStreamSynchronize (a kernel may have faulted)");
    memcpy(heads, ctx->host, sizeof(stats_head) * (size_t)p->heads_q);
    return STATS_OK;
}
