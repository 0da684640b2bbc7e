/* stats_dev.c — the development harness of the CUDA statistics kernels, in the manner of llm.c's
 * dev/cuda: variant N (kernels/cuda/variants.h) against the CPU reference, validated, then timed.
 *
 *   stats_dev VARIANT|all|list [B H N D] [--causal] [--dtype bf16|f16|f32] [--repeats R]
 *                               [--seed S]
 *
 *   list      the variants and their numbers (needs no GPU)
 *   VARIANT   0..12: one variant; `all`: each in turn (those that do not apply here are skipped)
 *   B H N D   batch, heads (Hq = Hkv), sequence length (Nq = Nk), head_dim; default 2 8 1024 128
 *
 * For a shape: fresh random Q and K (Gaussian, never zeros; seed printed, --seed or
 * ATTNSTAT_TEST_SEED to replay), the reference stats_cpu() (double accumulation) on the host; then
 * for each variant: the path that asks for it (stats_variant_get), a check that the planner really
 * runs it here (stats_cuda_plan_variant: a Hopper variant on an Ampere GPU, or head_dim 256, falls
 * back to another one, which is reported and skipped), one stats_cuda_run with per-row outputs
 * (poisoned first), every per-head field and every row's entropy and max logit compared with
 * |gpu - ref| <= atol + rtol * |ref| (the tolerances of tests/test_stats_cuda.c; the first
 * mismatches printed, checking stops after ten), then the time: stats_cuda_run_async with per-head
 * output only (what the daemon asks for), CUDA events around each launch, over input copies
 * rotated so that together they exceed three times the L2 cache (no launch finds its inputs
 * cached by the one before), median of R repeats (default 50) after 3 warm-up runs.
 * Exit status: 0 all ran variants passed, 1 a mismatch or an error (no usable GPU included),
 * 2 bad arguments or a single variant that does not apply here.
 *
 * Build: part of the CUDA build (cmake --build build --target stats_dev); runs as
 * build/kernels/stats_dev. Stage: a development tool of kernels/; calls stats.h, stats_cuda.h,
 * cuda/variants.h and the CUDA runtime only. */
#include <cuda_runtime_api.h>
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cuda/variants.h"
#include "stats.h"
#include "stats_cuda.h"

enum { MAX_MISMATCHES = 10, WARMUP = 3 };

typedef struct {
    int b, h, n, d, causal, repeats;
    stats_dtype dtype;
    uint64_t seed;
} shape;

/* ---- small helpers --------------------------------------------------------------------------- */

static void cuda_check(cudaError_t e, const char *what)
{
    if (e != cudaSuccess) {
        fprintf(stderr, "stats_dev: %s failed: %s (%s)\n", what, cudaGetErrorString(e),
                cudaGetErrorName(e));
        exit(1);
    }
}

static void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (!p) {
        fprintf(stderr, "stats_dev: out of host memory (%zu bytes)\n", n);
        exit(1);
    }
    return p;
}

/* xorshift64*, and a normal deviate by Box-Muller */
static uint64_t next_u64(uint64_t *s)
{
    *s ^= *s >> 12, *s ^= *s << 25, *s ^= *s >> 27;
    return *s * 0x2545f4914f6cdd1dULL;
}

static double next_normal(uint64_t *s)
{
    double u = ((double)(next_u64(s) >> 11) + 0.5) / 9007199254740992.0;
    double v = ((double)(next_u64(s) >> 11) + 0.5) / 9007199254740992.0;
    return sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v);
}

/* f32 -> the stored element (round to nearest even) */
static void put_elem(void *base, size_t i, stats_dtype dt, float f)
{
    if (dt == STATS_F32) {
        ((float *)base)[i] = f;
    } else if (dt == STATS_F16) {
        _Float16 h = (_Float16)f;
        memcpy((uint16_t *)base + i, &h, 2);
    } else {
        uint32_t x;
        memcpy(&x, &f, 4);
        ((uint16_t *)base)[i] = (uint16_t)((x + 0x7fffU + ((x >> 16) & 1U)) >> 16); /* finite f */
    }
}

static int cmp_float(const void *a, const void *b)
{
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

/* ---- validation ------------------------------------------------------------------------------ */

typedef struct {
    int mismatches;
    double max_dh, max_dm; /* largest per-row differences seen (finite rows) */
} check;

/* |got - ref| <= atol + rtol * |ref|; NaN and infinities must match exactly. Prints the first
 * mismatches; returns 0 once MAX_MISMATCHES were seen (stop checking). */
static int expect(check *c, const char *what, long long idx, double got, double ref, double atol,
                  double rtol)
{
    int ok;
    if (isnan(ref))
        ok = isnan(got);
    else if (isinf(ref))
        ok = got == ref;
    else
        ok = fabs(got - ref) <= atol + rtol * fabs(ref);
    if (!ok) {
        c->mismatches++;
        printf("    mismatch %s[%lld]: gpu %.9g, reference %.9g (tolerance %.3g)\n", what, idx, got,
               ref, atol + rtol * fabs(ref));
        if (c->mismatches >= MAX_MISMATCHES) {
            printf("    ... stopping after %d mismatches\n", MAX_MISMATCHES);
            return 0;
        }
    }
    return 1;
}

/* logit_atol: the absolute part of the max-logit tolerance (four float32 ulps of the largest
 * product a dot product sums; tests/test_stats_cuda.c says why). */
static int validate(const stats_head *got, const stats_head *ref, int heads, const float *gh,
                    const float *gm, const float *rh, const float *rm, long long rows,
                    double logit_atol, check *c)
{
    for (long long i = 0; i < rows; i++) {
        if (!expect(c, "row_entropy", i, gh[i], rh[i], 1e-3, 0.0) ||
            !expect(c, "row_maxlogit", i, gm[i], rm[i], logit_atol, 1e-5))
            return c->mismatches == 0;
        if (isfinite(rh[i]) && isfinite(gh[i]) && fabs(gh[i] - rh[i]) > c->max_dh)
            c->max_dh = fabs(gh[i] - rh[i]);
        if (isfinite(rm[i]) && isfinite(gm[i]) && fabs(gm[i] - rm[i]) > c->max_dm)
            c->max_dm = fabs(gm[i] - rm[i]);
    }
    for (int h = 0; h < heads; h++) {
        const stats_head *a = &got[h], *b = &ref[h];
        const double one_row = b->rows_norm > 0 ? 1.0 / (double)b->rows_norm : 0.0;
        if (!expect(c, "head.rows", h, (double)a->rows, (double)b->rows, 0, 0) ||
            !expect(c, "head.rows_norm", h, (double)a->rows_norm, (double)b->rows_norm, 0, 0) ||
            !expect(c, "head.rows_empty", h, (double)a->rows_empty, (double)b->rows_empty, 0, 0) ||
            !expect(c, "head.nonfinite_rows", h, (double)a->nonfinite_rows,
                    (double)b->nonfinite_rows, 0, 0) ||
            !expect(c, "head.entropy_mean", h, a->entropy_mean, b->entropy_mean, 1e-6, 1e-4) ||
            !expect(c, "head.entropy_norm_mean", h, a->entropy_norm_mean, b->entropy_norm_mean,
                    1e-6, 1e-4) ||
            !expect(c, "head.entropy_std", h, a->entropy_std, b->entropy_std, 1e-3, 0) ||
            !expect(c, "head.entropy_min", h, a->entropy_min, b->entropy_min, 1e-3, 0) ||
            !expect(c, "head.entropy_max", h, a->entropy_max, b->entropy_max, 1e-3, 0) ||
            !expect(c, "head.max_logit", h, a->max_logit, b->max_logit, logit_atol, 1e-5) ||
            !expect(c, "head.collapsed_frac", h, a->collapsed_frac, b->collapsed_frac,
                    one_row + 1e-12, 0) ||
            !expect(c, "head.sampled", h, a->sampled, b->sampled, 0, 0))
            return 0;
    }
    return c->mismatches == 0;
}

/* ---- one shape ------------------------------------------------------------------------------- */

typedef struct {
    stats_problem host;  /* tensors in host memory (the reference) */
    stats_problem *sets; /* nsets problems on device copies of the same tensors */
    int nsets;
    size_t q_bytes, k_bytes;
    stats_head *ref;
    float *ref_h, *ref_m;
    long long rows;
    double logit_atol, flops;
} bench;

static void make_inputs(const shape *s, bench *bn)
{
    const size_t es = stats_dtype_size(s->dtype);
    const size_t nel = (size_t)s->b * s->h * s->n * s->d;
    void *q = xmalloc(nel * es), *k = xmalloc(nel * es);
    uint64_t st = s->seed | 1;
    double qmax = 0, kmax = 0, acc = 0;
    for (int t = 0; t < 2; t++) { /* Q, then K: rows' norms for the max-logit tolerance */
        for (size_t i = 0; i < nel; i++) {
            float v = (float)next_normal(&st);
            put_elem(t ? k : q, i, s->dtype, v);
            acc += (double)v * v;
            if ((i + 1) % (size_t)s->d == 0) {
                double *m = t ? &kmax : &qmax;
                *m = acc > *m ? acc : *m;
                acc = 0;
            }
        }
    }
    stats_problem *p = &bn->host;
    stats_problem_init(p);
    p->batch = s->b, p->heads_q = p->heads_kv = s->h, p->len_q = p->len_k = s->n;
    p->head_dim = s->d, p->dtype = s->dtype, p->causal = s->causal;
    p->q.stride_n = p->k.stride_n = s->d;
    p->q.stride_h = p->k.stride_h = (int64_t)s->d * s->n;
    p->q.stride_b = p->k.stride_b = (int64_t)s->d * s->n * s->h;
    p->q.ptr = q, p->k.ptr = k;
    bn->q_bytes = bn->k_bytes = nel * es;
    bn->rows = (long long)s->b * s->h * s->n;
    bn->logit_atol = 1e-5 + 4.0 * ldexp(1.0, -24) * sqrt(qmax) * sqrt(kmax) * 1.01 / sqrt(s->d);
    const double pairs = s->causal ? (double)s->n * (s->n + 1) / 2.0 : (double)s->n * s->n;
    bn->flops = 2.0 * s->d * pairs * s->b * s->h;
}

static int reference(bench *bn)
{
    const stats_problem *p = &bn->host;
    bn->ref = xmalloc(sizeof *bn->ref * (size_t)p->heads_q);
    bn->ref_h = xmalloc(sizeof(float) * (size_t)bn->rows);
    bn->ref_m = xmalloc(sizeof(float) * (size_t)bn->rows);
    stats_error err;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    if (stats_cpu(p, bn->ref, bn->ref_h, bn->ref_m, &err) != STATS_OK) {
        fprintf(stderr, "stats_dev: stats_cpu: %s\n", err.msg);
        return -1;
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    printf("reference: stats_cpu in %.2f s (%lld rows; head 0: entropy mean %.6f nats, max logit "
           "%.4f)\n", (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec),
           bn->rows, bn->ref[0].entropy_mean, bn->ref[0].max_logit);
    return 0;
}

/* Device copies of Q and K, as many as it takes to exceed three L2 caches (at least 2). */
static void upload(bench *bn, int device)
{
    int l2 = 0;
    cuda_check(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, device),
               "cudaDeviceGetAttribute(L2 size)");
    const double set = (double)(bn->q_bytes + bn->k_bytes);
    int n = (int)ceil(3.0 * l2 / set);
    n = n < 2 ? 2 : n > 64 ? 64 : n;
    size_t free_b = 0, total_b = 0;
    cuda_check(cudaMemGetInfo(&free_b, &total_b), "cudaMemGetInfo");
    while (n > 2 && set * n > 0.5 * (double)free_b)
        n--;
    bn->nsets = n;
    bn->sets = xmalloc(sizeof *bn->sets * (size_t)n);
    for (int i = 0; i < n; i++) {
        void *dq, *dk;
        cuda_check(cudaMalloc(&dq, bn->q_bytes), "cudaMalloc(q)");
        cuda_check(cudaMalloc(&dk, bn->k_bytes), "cudaMalloc(k)");
        cuda_check(cudaMemcpy(dq, bn->host.q.ptr, bn->q_bytes, cudaMemcpyHostToDevice), "copy q");
        cuda_check(cudaMemcpy(dk, bn->host.k.ptr, bn->k_bytes, cudaMemcpyHostToDevice), "copy k");
        bn->sets[i] = bn->host;
        bn->sets[i].q.ptr = dq, bn->sets[i].k.ptr = dk;
    }
}

typedef enum { RUN_PASSED, RUN_FAILED, RUN_NOT_HERE } run_result;

/* Variant v on the shape: validate, then time. *ms: the median time (NAN when not timed). */
static run_result run_variant(stats_cuda *ctx, bench *bn, const shape *s, int v, double *ms)
{
    const stats_problem *p0 = &bn->sets[0];
    *ms = NAN;
    const stats_variant_info *vi = stats_variant_get(v);
    stats_cuda_set_path(ctx, vi->path);
    const int planned = stats_cuda_plan_variant(ctx, p0);
    printf("variant %d (%s): %s\n", v, vi->name, vi->what);
    if (planned != v) {
        printf("  not here: on this device and shape the planner runs variant %d (%s) instead; "
               "skipped\n",
               planned, planned >= 0 ? stats_variant_get(planned)->name : "invalid problem");
        stats_cuda_set_path(ctx, STATS_CUDA_PATH_AUTO);
        return RUN_NOT_HERE;
    }
    const int heads = p0->heads_q;
    const size_t rb = sizeof(float) * (size_t)bn->rows;
    float *dh, *dm, *gh = xmalloc(rb), *gm = xmalloc(rb);
    stats_head *got = xmalloc(sizeof *got * (size_t)heads), *heads_dev;
    cuda_check(cudaMalloc((void **)&dh, rb), "cudaMalloc(row entropy)");
    cuda_check(cudaMalloc((void **)&dm, rb), "cudaMalloc(row max logit)");
    cuda_check(cudaMalloc((void **)&heads_dev, sizeof *got * (size_t)heads), "cudaMalloc(heads)");
    cuda_check(cudaMemset(dh, 0x4b, rb), "poison"); /* 1.3e7: an unwritten row fails */
    cuda_check(cudaMemset(dm, 0x4b, rb), "poison");
    /* the copies (from pageable memory: cudaMemcpy may return before the DMA lands) and the
     * poison, on the legacy stream, done before a run on a non-blocking stream reads them */
    cuda_check(cudaDeviceSynchronize(), "wait for the copies");
    memset(got, 0xa5, sizeof *got * (size_t)heads);
    cudaStream_t stream;
    cuda_check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
    stats_error err;
    run_result res = RUN_FAILED;
    printf("  kernel: %s\n", stats_cuda_kernel_name(ctx, p0));
    if (stats_cuda_run(ctx, p0, stream, got, dh, dm, &err) != STATS_OK) {
        printf("  stats_cuda_run: %s\n", err.msg);
        goto out;
    }
    cuda_check(cudaMemcpy(gh, dh, rb, cudaMemcpyDeviceToHost), "copy row entropy");
    cuda_check(cudaMemcpy(gm, dm, rb, cudaMemcpyDeviceToHost), "copy row max logit");
    check c = {0};
    if (!validate(got, bn->ref, heads, gh, gm, bn->ref_h, bn->ref_m, bn->rows, bn->logit_atol,
                  &c)) {
        printf("  validate: FAILED, %d mismatch(es)%s\n", c.mismatches,
               c.mismatches >= MAX_MISMATCHES ? " (stopped there)" : "");
        goto out;
    }
    printf("  validate: ok, %lld rows and %d heads (max |dH| %.2e nats, max |dmaxlogit| %.2e)\n",
           bn->rows, heads, c.max_dh, c.max_dm);

    const int reps = s->repeats;
    cudaEvent_t *ev = xmalloc(sizeof *ev * 2 * (size_t)reps);
    float *t = xmalloc(sizeof *t * (size_t)reps);
    for (int i = 0; i < 2 * reps; i++)
        cuda_check(cudaEventCreate(&ev[i]), "cudaEventCreate");
    for (int i = 0; i < WARMUP + reps; i++) {
        const int r = i - WARMUP;
        if (r >= 0)
            cuda_check(cudaEventRecord(ev[2 * r], stream), "cudaEventRecord");
        if (stats_cuda_run_async(ctx, &bn->sets[i % bn->nsets], stream, heads_dev, NULL, NULL,
                                 &err) != STATS_OK) {
            printf("  stats_cuda_run_async: %s\n", err.msg);
            goto out_events;
        }
        if (r >= 0)
            cuda_check(cudaEventRecord(ev[2 * r + 1], stream), "cudaEventRecord");
    }
    cuda_check(cudaStreamSynchronize(stream), "cudaStreamSynchronize (a kernel may have faulted)");
    for (int r = 0; r < reps; r++)
        cuda_check(cudaEventElapsedTime(&t[r], ev[2 * r], ev[2 * r + 1]), "cudaEventElapsedTime");
    qsort(t, (size_t)reps, sizeof *t, cmp_float);
    *ms = reps % 2 ? t[reps / 2] : 0.5 * (t[reps / 2 - 1] + t[reps / 2]);
    printf("  time: %.4f ms (median of %d, min %.4f; %d input copies rotated), %.0f TFLOP/s of "
           "Q.K^T\n", *ms, reps, t[0], bn->nsets, bn->flops / (*ms * 1e-3) / 1e12);
    res = RUN_PASSED;
out_events:
    for (int i = 0; i < 2 * reps; i++)
        cudaEventDestroy(ev[i]);
    free(ev), free(t);
out:
    stats_cuda_set_path(ctx, STATS_CUDA_PATH_AUTO);
    cudaStreamDestroy(stream);
    cudaFree(dh), cudaFree(dm), cudaFree(heads_dev);
    free(gh), free(gm), free(got);
    return res;
}

/* ---- main ------------------------------------------------------------------------------------ */

static int usage(const char *msg)
{
    if (msg)
        fprintf(stderr, "stats_dev: %s\n", msg);
    fprintf(stderr, "usage: stats_dev VARIANT|all|list [B H N D] [--causal] [--dtype bf16|f16|f32] "
                    "[--repeats R] [--seed S]\n  VARIANT: 0..%d (stats_dev list)\n",
            STATS_VARIANT_COUNT - 1);
    return 2;
}

static void list_variants(void)
{
    printf("variant  name              what\n");
    for (int v = 0; v < STATS_VARIANT_COUNT; v++)
        printf("%7d  %-16s  %s\n", v, stats_variant_get(v)->name, stats_variant_get(v)->what);
}

static int parse_int(const char *s, long lo, long hi, long *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi)
        return -1;
    *out = v;
    return 0;
}

int main(int argc, char **argv)
{
    if (argc < 2)
        return usage(NULL);
    int first = 0, last = -1; /* the variants to run */
    long v;
    if (!strcmp(argv[1], "list")) {
        list_variants();
        return 0;
    } else if (!strcmp(argv[1], "all")) {
        first = 0, last = STATS_VARIANT_COUNT - 1;
    } else if (parse_int(argv[1], 0, STATS_VARIANT_COUNT - 1, &v) == 0) {
        first = last = (int)v;
    } else {
        return usage("VARIANT is a number from stats_dev list, or all");
    }
    shape s = {.b = 2, .h = 8, .n = 1024, .d = 128, .repeats = 50, .dtype = STATS_BF16};
    const char *env = getenv("ATTNSTAT_TEST_SEED");
    s.seed = env && *env ? strtoull(env, NULL, 0)
                         : (uint64_t)time(NULL) ^ ((uint64_t)clock() << 32) ^ 0x9e3779b97f4a7c15ULL;
    int npos = 0;
    int *pos[4] = {&s.b, &s.h, &s.n, &s.d};
    const long pos_max[4] = {65535, 65535, 1 << 20, STATS_MAX_HEAD_DIM};
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--causal")) {
            s.causal = 1;
        } else if (!strcmp(a, "--dtype") && i + 1 < argc) {
            const char *t = argv[++i];
            if (!strcmp(t, "bf16"))
                s.dtype = STATS_BF16;
            else if (!strcmp(t, "f16"))
                s.dtype = STATS_F16;
            else if (!strcmp(t, "f32"))
                s.dtype = STATS_F32;
            else
                return usage("--dtype takes bf16, f16 or f32");
        } else if (!strcmp(a, "--repeats") && i + 1 < argc) {
            if (parse_int(argv[++i], 1, 100000, &v))
                return usage("--repeats takes a count from 1 to 100000");
            s.repeats = (int)v;
        } else if (!strcmp(a, "--seed") && i + 1 < argc) {
            s.seed = strtoull(argv[++i], NULL, 0);
        } else if (a[0] != '-' && npos < 4) {
            if (parse_int(a, 1, pos_max[npos], &v))
                return usage("B H N D are positive sizes (D at most 256)");
            *pos[npos++] = (int)v;
        } else {
            return usage("unknown argument");
        }
    }
    if (npos != 0 && npos != 4)
        return usage("give all of B H N D, or none");

    if (!stats_cuda_built()) {
        fprintf(stderr, "stats_dev: this build has no CUDA backend; nothing to run\n");
        return 1;
    }
    if (stats_cuda_device_count() == 0) {
        fprintf(stderr, "stats_dev: no CUDA device of compute capability 8.0 or newer is visible "
                        "(no GPU, or no NVIDIA driver); the harness runs the kernels, so it needs "
                        "one (`stats_dev list` works anywhere)\n");
        return 1;
    }
    stats_error err;
    stats_cuda *ctx = NULL;
    if (stats_cuda_create(0, &ctx, &err) != STATS_OK) {
        fprintf(stderr, "stats_dev: stats_cuda_create: %s\n", err.msg);
        return 1;
    }
    struct cudaDeviceProp prop;
    cuda_check(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
    printf("stats_dev: %s (sm_%d%d, %d SMs, L2 %d MiB); shape B=%d H=%d N=%d D=%d %s %s; seed %llu "
           "(ATTNSTAT_TEST_SEED=%llu replays)\n", prop.name, prop.major, prop.minor,
           prop.multiProcessorCount, prop.l2CacheSize >> 20, s.b, s.h, s.n, s.d,
           s.causal ? "causal" : "full", stats_dtype_name(s.dtype), (unsigned long long)s.seed,
           (unsigned long long)s.seed);

    bench bn;
    memset(&bn, 0, sizeof bn);
    make_inputs(&s, &bn);
    if (reference(&bn) != 0)
        return 1;
    upload(&bn, 0);
    int passed = 0, failed = 0, skipped = 0;
    double ms[STATS_VARIANT_COUNT];
    run_result res[STATS_VARIANT_COUNT];
    for (int i = first; i <= last; i++) {
        res[i] = run_variant(ctx, &bn, &s, i, &ms[i]);
        passed += res[i] == RUN_PASSED, failed += res[i] == RUN_FAILED,
            skipped += res[i] == RUN_NOT_HERE;
    }
    if (last > first) {
        printf("\n| variant | name | result | ms | TFLOP/s |\n|---|---|---|---|---|\n");
        for (int i = first; i <= last; i++)
            printf("| %d | %s | %s | %.4f | %.0f |\n", i, stats_variant_get(i)->name,
                   res[i] == RUN_PASSED ? "ok" : res[i] == RUN_FAILED ? "FAILED" : "not here",
                   ms[i], res[i] == RUN_PASSED ? bn.flops / (ms[i] * 1e-3) / 1e12 : 0.0);
    }
    printf("stats_dev: %d passed, %d failed, %d not here\n", passed, failed, skipped);
    for (int i = 0; i < bn.nsets; i++)
        cudaFree((void *)bn.sets[i].q.ptr), cudaFree((void *)bn.sets[i].k.ptr);
    free(bn.sets), free(bn.ref), free(bn.ref_h), free(bn.ref_m);
    free((void *)bn.host.q.ptr), free((void *)bn.host.k.ptr);
    stats_cuda_destroy(ctx);
    if (failed)
        return 1;
    return passed == 0 && first == last ? 2 : 0;
}
