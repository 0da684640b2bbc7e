/* bench_client.c — the host pipeline measured through libattnstat itself: the CPU cost of
 * attnstat_push() for a realistic push, and free-running throughput as a trainer would see it.
 *
 *   bench_client [--daemon PATH/attnstatd] [--seconds S] [--heads 32] [--seq 1024] [--dim 128]
 *                  [--sample-rows 64] [--layers 4]
 *
 * Starts attnstatd (CPU worker) on a private socket and database in a temporary directory, then:
 *   1. client cost: pushes the realistic tensor (bf16 Q and K [1, H, N, D], causal, sample_rows
 *      random rows per head) and measures the thread CPU time of each attnstat_push() call
 *      (p50 / p99 / max), waiting for each push's acknowledgement between calls so the ring is
 *      never full (every measured call did the full copy);
 *   2. pipeline throughput: pushes free-running for S seconds (as a trainer would: never waiting),
 *      and reports pushes acknowledged per second, per-head rows stored per second (acknowledged
 *      pushes x heads), and how many pushes were dropped (locally or by the daemon).
 * A benchmark, not a test: it prints figures and exits 0. */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "attnstat.h"

static double bench_now(clockid_t id)
{
    struct timespec ts;
    clock_gettime(id, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int bench_cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static uint16_t bench_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

int main(int argc, char **argv)
{
    const char *daemon = ATTNSTATD_PATH;
    double seconds = 10;
    int heads = 32, seq = 1024, dim = 128, sample_rows = 64, layers = 4, cost_pushes = 200;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--daemon"))
            daemon = argv[i + 1];
        else if (!strcmp(argv[i], "--seconds"))
            seconds = atof(argv[i + 1]);
        else if (!strcmp(argv[i], "--heads"))
            heads = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--seq"))
            seq = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--dim"))
            dim = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--sample-rows"))
            sample_rows = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--layers"))
            layers = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--cost-pushes"))
            cost_pushes = atoi(argv[i + 1]);
        else {
            fprintf(stderr, "bench_client: unknown option %s\n", argv[i]);
            return 2;
        }
    }
    if (!daemon || heads < 1 || seq < 2 || dim < 1 || dim > 256 || seconds <= 0 || layers < 1 ||
        cost_pushes < 1) {
        fprintf(stderr, "usage: bench_client [--daemon PATH] [--seconds S] [--heads H] [--seq N] "
                        "[--dim D] [--sample-rows R] [--layers L] [--cost-pushes P]\n");
        return 2;
    }
    char dir[] = "/tmp/attnstat-bench-XXXXXX";
    if (!mkdtemp(dir)) {
        fprintf(stderr, "bench_client: mkdtemp: %s\n", strerror(errno));
        return 1;
    }
    char sock[128], db[128], log[128];
    snprintf(sock, sizeof sock, "%s/s.sock", dir);
    snprintf(db, sizeof db, "%s/a.db", dir);
    snprintf(log, sizeof log, "%s/d.log", dir);
    pid_t pid = fork();
    if (pid < 0) {
        fprintf(stderr, "bench_client: fork: %s\n", strerror(errno));
        return 1;
    }
    if (pid == 0) {
        int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
        }
        execl(daemon, daemon, "--socket", sock, "--db", db, "--log-level", "warn", (char *)NULL);
        _exit(127);
    }
    attnstat_client *c = NULL;
    attnstat_connect_opts co;
    attnstat_connect_opts_init(&co);
    co.socket_path = sock;
    co.ring_bytes = 256ull << 20;
    attnstat_error err;
    for (int tries = 0; tries < 200; tries++) {
        if (attnstat_connect_ex(&co, &c, &err) == ATTNSTAT_OK)
            break;
        struct timespec ts = {0, 50 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    int rc = 1;
    uint16_t *q = NULL, *k = NULL;
    double *cost = NULL;
    if (!c) {
        fprintf(stderr, "bench_client: %s (daemon log: %s)\n", err.msg, log);
        goto out;
    }
    if (attnstat_hello(c, "bench", 0, NULL, NULL) != ATTNSTAT_OK) {
        fprintf(stderr, "bench_client: %s\n", attnstat_last_error(c));
        goto out;
    }
    size_t n = (size_t)heads * seq * dim;
    q = malloc(n * sizeof *q);
    k = malloc(n * sizeof *k);
    cost = malloc((size_t)cost_pushes * sizeof *cost);
    if (!q || !k || !cost)
        goto out;
    uint64_t s = 12345;
    for (size_t i = 0; i < n; i++) {
        s = s * 6364136223846793005ULL + 1442695040888963407ULL;
        q[i] = bench_bf16((float)((int)(s >> 40 & 0xffff) - 32768) / 16384.0f);
        s = s * 6364136223846793005ULL + 1442695040888963407ULL;
        k[i] = bench_bf16((float)((int)(s >> 40 & 0xffff) - 32768) / 16384.0f);
    }
    attnstat_tensor tq, tk;
    attnstat_tensor_init(&tq, q, ATTNSTAT_BF16, 1, heads, seq, dim);
    attnstat_tensor_init(&tk, k, ATTNSTAT_BF16, 1, heads, seq, dim);
    attnstat_push_opts o;
    attnstat_push_opts_init(&o);
    o.causal = 1;
    o.sample_rows = (uint32_t)sample_rows;
    o.sample_seed = 7;

    /* 1. CPU time per push (each call copies 2 x H x N x D bf16 into the ring). */
    for (int i = 0; i < cost_pushes; i++) {
        o.step = i;
        o.layer = 0;
        double t0 = bench_now(CLOCK_THREAD_CPUTIME_ID);
        attnstat_code pc = attnstat_push(c, &o, &tq, &tk, NULL);
        cost[i] = bench_now(CLOCK_THREAD_CPUTIME_ID) - t0;
        if (pc != ATTNSTAT_OK || attnstat_flush(c, 120000) != ATTNSTAT_OK) {
            fprintf(stderr, "bench_client: push %d: %s\n", i, attnstat_last_error(c));
            goto out;
        }
    }
    qsort(cost, (size_t)cost_pushes, sizeof *cost, bench_cmp);
    printf("push: Q and K bf16 [1, %d, %d, %d] (%.1f MiB copied per push), causal, %d sampled "
           "rows per head\n", heads, seq, dim, 2.0 * n * 2 / (1 << 20), sample_rows);
    printf("client CPU time per push over %d pushes: p50 %.1f us, p99 %.1f us, max %.1f us\n",
           cost_pushes, cost[cost_pushes / 2] * 1e6, cost[(int)(cost_pushes * 0.99)] * 1e6,
           cost[cost_pushes - 1] * 1e6);

    /* 2. Free-running throughput. */
    attnstat_counters before;
    attnstat_stats(c, &before);
    double t0 = bench_now(CLOCK_MONOTONIC), cpu0 = bench_now(CLOCK_THREAD_CPUTIME_ID);
    long calls = 0;
    for (int step = 0; bench_now(CLOCK_MONOTONIC) - t0 < seconds; step++)
        for (int l = 0; l < layers; l++) {
            o.step = 1000000 + step;
            o.layer = (uint32_t)l;
            attnstat_code pc = attnstat_push(c, &o, &tq, &tk, NULL);
            calls++;
            if (pc != ATTNSTAT_OK && pc != ATTNSTAT_DROPPED) {
                fprintf(stderr, "bench_client: %s\n", attnstat_last_error(c));
                goto out;
            }
            attnstat_poll(c, 1); /* a trainer's step takes time; this one sleeps 1 ms a push */
        }
    double cpu_push = bench_now(CLOCK_THREAD_CPUTIME_ID) - cpu0;
    if (attnstat_flush(c, 300000) != ATTNSTAT_OK) {
        fprintf(stderr, "bench_client: final flush: %s\n", attnstat_last_error(c));
        goto out;
    }
    double wall = bench_now(CLOCK_MONOTONIC) - t0;
    attnstat_counters after;
    attnstat_stats(c, &after);
    uint64_t acked = after.acked - before.acked;
    printf("free-running for %.1f s (%.1f s with the final flush): %ld push calls, %llu "
           "acknowledged, %llu dropped here, %llu dropped by the daemon\n",
           seconds, wall, calls, (unsigned long long)acked,
           (unsigned long long)(after.dropped_local - before.dropped_local),
           (unsigned long long)(after.dropped_daemon - before.dropped_daemon));
    printf("throughput: %.1f pushes/s stored, %.0f per-head rows stored/s; client CPU %.1f us per "
           "push call on average\n", acked / wall, acked * (double)heads / wall,
           cpu_push / (double)calls * 1e6);
    rc = 0;
out:
    attnstat_close(c);
    free(q);
    free(k);
    free(cost);
    kill(pid, SIGTERM);
    int st;
    waitpid(pid, &st, 0);
    char cmd[200];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "bench_client: could not remove %s\n", dir);
    return rc;
}
