/* client_testutil.h — shared by the libattnstat unit suites (test_client.c, test_client_ring.c): the
 * seed of a run (fresh, printed; ATTNSTAT_TEST_SEED repeats it), a splitmix64 generator, and random
 * tensor layouts (dense in any dimension order, padded, sliced, broadcast), and the runner of a
 * suite. Header-only (static inline functions) so each suite includes it without a library. */
#ifndef ATTNSTAT_CLIENT_TESTUTIL_H
#define ATTNSTAT_CLIENT_TESTUTIL_H

#include <check.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

/* Runs suite s; returns the exit status of the test program (0: every test passed). */
static inline int client_test_run(Suite *s)
{
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}

/* The seed of this run, printed with how to repeat it. */
static inline uint64_t client_test_seed(const char *suite)
{
    const char *env = getenv("ATTNSTAT_TEST_SEED");
    uint64_t seed = env ? strtoull(env, NULL, 10)
                        : (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 20);
    printf("%s: seed %llu (ATTNSTAT_TEST_SEED=%llu repeats this run)\n", suite,
           (unsigned long long)seed, (unsigned long long)seed);
    return seed;
}

static inline uint64_t rng_next(uint64_t *s)
{
    *s += 0x9e3779b97f4a7c15ULL;
    uint64_t z = *s;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static inline uint64_t rng_below(uint64_t *s, uint64_t n)
{
    return rng_next(s) % n;
}

static inline void fill_random(void *p, size_t n, uint64_t *s)
{
    uint8_t *b = p;
    for (size_t i = 0; i < n; i++)
        b[i] = (uint8_t)rng_next(s);
}

/* A random tensor layout: dense in a random dimension order, or padded, or sliced, or broadcast. */
typedef struct {
    int64_t shape[4], strides[4];
    size_t esize;
    int64_t span; /* elements the source must hold */
} layout;

static inline void random_layout(uint64_t *s, layout *l)
{
    static const size_t es[3] = {4, 2, 2};
    l->esize = es[rng_below(s, 3)];
    for (int i = 0; i < 4; i++)
        l->shape[i] = 1 + (int64_t)rng_below(s, i == 3 ? 24 : 5);
    int perm[3] = {0, 1, 2};
    for (int i = 2; i > 0; i--) {
        int j = (int)rng_below(s, (uint64_t)i + 1), t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    int kind = (int)rng_below(s, 4);
    int64_t acc = l->shape[3] + (kind == 1 ? 1 + (int64_t)rng_below(s, 3) : 0); /* padded rows */
    l->strides[3] = 1;
    for (int i = 0; i < 3; i++) {
        int d = perm[i];
        l->strides[d] = acc;
        acc *= l->shape[d] + (kind == 2 ? (int64_t)rng_below(s, 2) : 0); /* sliced dims */
    }
    if (kind == 3) /* broadcast one dimension */
        l->strides[rng_below(s, 3)] = 0;
    l->span = 1;
    for (int i = 0; i < 4; i++)
        l->span += (l->shape[i] - 1) * l->strides[i];
}

#endif /* ATTNSTAT_CLIENT_TESTUTIL_H */
