/* bench_cpu.c — throughput of the CPU backends side by side: the reference (kernels/stats_cpu.c,
 * stats_cpu_ws) and the production one (kernels/stats_cpu_fast.c, stats_cpu_fast_ws), query rows
 * per second and logits per second for a few shapes and the daemon's tiny ingest push (f32, as
 * bench_ingest pushes it, and bf16), bf16 input elsewhere, random data (never zeros), each backend
 * in its own workspace as the daemon's worker holds it. The production backend runs twice: `fast4`
 * is its 4-float baseline instance, `fast` the widest one this CPU has (stats_cpu_fast_simd()).
 *   build/bench/bench_cpu [--quick]
 * Each shape runs until at least 0.5 s have passed (3 repeats, the median is printed). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "stats.h"

typedef struct {
    const char *name;
    int b, hq, hkv, n, d, causal, every, nrows, f32;
} shape;

static const shape shapes[] = {
    {"tiny push   B1 H8  N16 D16 f32 (bench_ingest)", 1, 8, 8, 16, 16, 0, 0, 0, 1},
    {"tiny push   B1 H8  N16 D16", 1, 8, 8, 16, 16, 0, 0, 0, 0},
    {"decode-ish  B1 H8  N1024 D64 causal", 1, 8, 8, 1024, 64, 1, 0, 0, 0},
    {"daemon push B1 H32 N1024 D128 causal, 64 rows", 1, 32, 32, 1024, 128, 1, 0, 64, 0},
    {"daemon push B1 H32 N1024 D128 causal, every 16th", 1, 32, 32, 1024, 128, 1, 16, 0, 0},
    {"full        B1 H4  N2048 D128 causal", 1, 4, 4, 2048, 128, 1, 0, 0, 0},
    {"GQA         B1 H16/4 N1024 D128 full", 1, 16, 4, 1024, 128, 0, 0, 0, 0},
};

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static uint16_t to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    u += 0x7fffU + ((u >> 16) & 1U);
    return (uint16_t)(u >> 16);
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv)
{
    int quick = argc > 1 && strcmp(argv[1], "--quick") == 0;
    uint64_t s = (uint64_t)time(NULL) | 1;
    stats_cpu_workspace *rws = stats_cpu_workspace_new();
    /* the production backend twice: the widest instance this CPU has, and the 4-float baseline
     * (forced for a workspace made under ATTNSTAT_CPU_SIMD=baseline) */
    stats_cpu_fast_workspace *fws = stats_cpu_fast_workspace_new();
    const char *was = getenv("ATTNSTAT_CPU_SIMD");
    char saved[64] = "";
    if (was)
        snprintf(saved, sizeof saved, "%s", was);
    setenv("ATTNSTAT_CPU_SIMD", "baseline", 1);
    stats_cpu_fast_workspace *bws = stats_cpu_fast_workspace_new();
    if (was)
        setenv("ATTNSTAT_CPU_SIMD", saved, 1);
    else
        unsetenv("ATTNSTAT_CPU_SIMD");
    if (!rws || !fws || !bws) {
        fprintf(stderr, "bench_cpu: out of memory for the workspaces\n");
        return 1;
    }
    printf("fast: %s; fast4: %s\n", stats_cpu_fast_simd(fws), stats_cpu_fast_simd(bws));
    printf("%-46s %-9s %12s %12s %12s %8s\n", "shape (bf16 unless named)", "backend", "rows/s",
           "logits/s", "us/call", "speedup");
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        const shape *sh = &shapes[si];
        size_t qn = (size_t)sh->b * sh->hq * sh->n * sh->d, kn = (size_t)sh->b * sh->hkv * sh->n * sh->d;
        size_t esz = sh->f32 ? 4 : 2;
        char *q = malloc(qn * esz), *k = malloc(kn * esz);
        for (size_t i = 0; i < qn + kn; i++) { /* xorshift, uniform in [-1.7, 1.7]: unit variance */
            s ^= s << 13, s ^= s >> 7, s ^= s << 17;
            float v = (float)((double)(s >> 11) / 9007199254740992.0 * 3.46 - 1.73);
            char *dst = i < qn ? q + i * esz : k + (i - qn) * esz;
            if (sh->f32) {
                memcpy(dst, &v, 4);
            } else {
                uint16_t h = to_bf16(v);
                memcpy(dst, &h, 2);
            }
        }
        stats_problem p;
        stats_problem_init(&p);
        p.batch = sh->b, p.heads_q = sh->hq, p.heads_kv = sh->hkv, p.len_q = p.len_k = sh->n;
        p.head_dim = sh->d, p.dtype = sh->f32 ? STATS_F32 : STATS_BF16, p.causal = sh->causal;
        p.sample_every = sh->every, p.sample_rows = sh->nrows, p.sample_seed = 7;
        p.q = (stats_tensor){q, (int64_t)sh->hq * sh->n * sh->d, (int64_t)sh->n * sh->d, sh->d};
        p.k = (stats_tensor){k, (int64_t)sh->hkv * sh->n * sh->d, (int64_t)sh->n * sh->d, sh->d};
        stats_head *heads = malloc(sizeof(stats_head) * (size_t)sh->hq);
        stats_error err;
        /* rows and logits one call computes */
        double rows = 0, logits = 0;
        int32_t ns = stats_sampled_count(&p, sh->n);
        for (int32_t j = 0; j < ns; j++) {
            uint32_t i = stats_row_of_sample((uint32_t)j, (uint32_t)sh->n, p.sample_every,
                                             p.sample_rows, p.sample_seed);
            rows += 1;
            logits += sh->causal ? (double)i + 1 : (double)sh->n;
        }
        rows *= sh->b * sh->hq, logits *= sh->b * sh->hq;
        double med[3];
        for (int be = 0; be < 3; be++) {
            double t[3];
            for (int rep = 0; rep < 3; rep++) {
                int calls = 0;
                double t0 = now(), t1;
                do {
                    stats_status st =
                        be == 0 ? stats_cpu_ws(&p, rws, heads, NULL, NULL, &err)
                                : stats_cpu_fast_ws(&p, be == 1 ? bws : fws, heads, NULL, NULL,
                                                    &err);
                    if (st != STATS_OK) {
                        fprintf(stderr, "bench_cpu: %s\n", err.msg);
                        return 1;
                    }
                    calls++;
                    t1 = now();
                } while (t1 - t0 < (quick ? 0.05 : 0.5));
                t[rep] = (t1 - t0) / calls;
            }
            qsort(t, 3, sizeof t[0], cmp_double);
            med[be] = t[1];
            if (be == 0)
                printf("%-46s %-9s %12.0f %12.3g %12.1f %8s\n", sh->name, "reference",
                       rows / med[0], logits / med[0], 1e6 * med[0], "");
            else
                printf("%-46s %-9s %12.0f %12.3g %12.1f %7.1fx\n", "", be == 1 ? "fast4" : "fast",
                       rows / med[be], logits / med[be], 1e6 * med[be], med[0] / med[be]);
        }
        free(q);
        free(k);
        free(heads);
    }
    if (stats_cpu_fast_handed_over(fws) + stats_cpu_fast_handed_over(bws) != 0)
        printf("note: %llu problems were handed to the reference\n",
               (unsigned long long)(stats_cpu_fast_handed_over(fws) +
                                    stats_cpu_fast_handed_over(bws)));
    stats_cpu_workspace_free(rws);
    stats_cpu_fast_workspace_free(fws);
    stats_cpu_fast_workspace_free(bws);
    return 0;
}
