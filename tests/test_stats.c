/* test_stats.c — the CPU reference backend (kernels/stats_cpu.c) against the independent two-pass
 * computation of stats_testutil.h on fresh random data of many shapes, plus the properties that
 * must hold exactly or to a stated tolerance, and every bad argument.
 *
 * Tolerances. Per-row outputs are floats: 2e-6 absolute + 2e-6 relative. Per-head statistics are
 * doubles from the same exact inputs by a different order of operations: 1e-9 absolute + 1e-9
 * relative. The collapsed fraction may differ by at most one row that sits on the threshold
 * (stats_runutil.h's run_check). Attention sinks have their suite: test_stats_sinks.c. */
#include <check.h>

#include "stats_runutil.h"

/* ---- random shapes against the two-pass reference ------------------------------------------ */

static const cfg shapes[] = {
    /* b hq hkv nq  nk   d   dtype      layout     causal wl  wr  cap   scale pk every n amp */
    {1, 1, 1, 1, 1, 32, STATS_F32, TU_BHND, 0, -1, -1, 0, 0, 0, 0, 0, 1, 0},
    {2, 3, 3, 17, 17, 32, STATS_F32, TU_BHND, 0, -1, -1, 0, 0, 0, 0, 0, 1, 0},
    {2, 4, 2, 33, 47, 64, STATS_BF16, TU_BNHD, 0, -1, -1, 0, 0, 0, 0, 0, 1, 0},
    {1, 2, 1, 65, 31, 80, STATS_F16, TU_BHND, 1, -1, -1, 0, 0, 0, 0, 0, 1, 0},   /* Nk < Nq: empty rows */
    {3, 2, 2, 29, 71, 128, STATS_BF16, TU_PADDED, 1, -1, -1, 0, 0, 0, 0, 0, 1, 0}, /* Nk > Nq */
    {1, 8, 2, 40, 40, 256, STATS_F16, TU_BNHD, 1, -1, 0, 0, 0, 0, 0, 0, 1, 0},
    {2, 2, 1, 50, 50, 64, STATS_BF16, TU_BHND, 1, 7, -1, 0, 0, 0, 0, 0, 1, 0},   /* causal sliding window */
    {1, 3, 3, 45, 60, 32, STATS_F32, TU_PADDED, 0, 5, 3, 0, 0, 0, 0, 0, 1, 0},   /* two-sided window */
    {2, 2, 2, 70, 70, 64, STATS_BF16, TU_BNHD, 0, -1, -1, 30.0f, 0, 0, 0, 0, 4, 0}, /* softcap */
    {1, 4, 4, 37, 37, 128, STATS_F16, TU_BHND, 1, -1, -1, 0, 0.3f, 0, 0, 0, 1, 0},  /* explicit scale */
    {5, 4, 2, 30, 30, 64, STATS_BF16, TU_BHND, 1, -1, -1, 0, 0, 1, 0, 0, 1, 0},   /* packed, causal */
    {4, 2, 1, 25, 40, 80, STATS_F32, TU_BNHD, 0, 6, -1, 0, 0, 1, 0, 0, 1, 0},     /* packed, Nk != Nq */
    {2, 4, 4, 100, 100, 64, STATS_BF16, TU_BHND, 1, -1, -1, 0, 0, 0, 8, 0, 1, 0}, /* every 8th row */
    {2, 2, 1, 90, 120, 128, STATS_F16, TU_BNHD, 1, -1, -1, 0, 0, 0, 0, 13, 1, 0}, /* 13 random rows */
    {3, 2, 2, 20, 20, 32, STATS_F32, TU_BHND, 0, -1, -1, 0, 0, 1, 0, 7, 1, 0},    /* packed + random rows */
    {1, 2, 2, 200, 200, 64, STATS_BF16, TU_BHND, 1, -1, -1, 0, 0, 0, 3, 0, 6, 0.5f}, /* sharp + threshold */
    {1, 1, 1, 1, 300, 256, STATS_F32, TU_PADDED, 1, -1, -1, 0, 0, 0, 0, 0, 1, 0},   /* decode: 1 query */
    /* keys over several of the backend's 1024-key chunks */
    {1, 2, 1, 37, 2600, 32, STATS_BF16, TU_BHND, 1, -1, -1, 0, 0, 0, 0, 0, 2, 0},
    {1, 2, 2, 50, 3100, 64, STATS_F16, TU_BNHD, 1, 1500, -1, 0, 0, 0, 0, 9, 1, 0},
    {2, 4, 2, 9, 2049, 32, STATS_F32, TU_PADDED, 0, -1, -1, 0, 0, 0, 0, 0, 1, 0},
};

START_TEST(test_random_shapes)
{
    reseed(__LINE__, _i);
    const cfg *c = &shapes[_i];
    run r;
    run_setup(&r, c);
    char what[96];
    snprintf(what, sizeof what, "shape %d (d=%d %s layout %d)", _i, c->d, stats_dtype_name(c->dt),
             (int)c->layout);
    run_check(&r, what);
    run_free(&r);
}
END_TEST

/* Every dtype, layout and listed head dim, random sizes. */
START_TEST(test_dtype_layout_dims)
{
    reseed(__LINE__, _i);
    static const int dims[] = {32, 64, 80, 128, 256};
    stats_dtype dt = (stats_dtype)(_i % 3);
    tu_layout lay = (tu_layout)((_i / 3) % 3);
    for (int di = 0; di < 5; di++) {
        cfg c = {0};
        c.b = 1 + (int)(tu_next(&g_rng) % 3);
        c.hkv = 1 + (int)(tu_next(&g_rng) % 2);
        c.hq = c.hkv * (1 + (int)(tu_next(&g_rng) % 3));
        c.nq = 1 + (int)(tu_next(&g_rng) % 70);
        c.nk = 1 + (int)(tu_next(&g_rng) % 90);
        c.d = dims[di], c.dt = dt, c.layout = lay;
        c.causal = (int)(tu_next(&g_rng) % 2);
        c.wl = c.wr = -1;
        c.amp = 1.5;
        run r;
        run_setup(&r, &c);
        char what[96];
        snprintf(what, sizeof what, "%s layout %d d=%d nq=%d nk=%d", stats_dtype_name(dt),
                 (int)lay, c.d, c.nq, c.nk);
        run_check(&r, what);
        run_free(&r);
    }
}
END_TEST

/* ---- properties ------------------------------------------------------------------------------ */

/* Identical keys: every visible key has the same logit, so H = ln(visible keys) exactly (1e-12). */
START_TEST(test_uniform_is_log_n)
{
    reseed(__LINE__, _i);
    cfg c = {2, 2, 1, 37, 37, 64, STATS_F32, TU_BHND, 1, -1, -1, 0, 0, 0, 0, 0, 1, 0};
    run r;
    run_setup(&r, &c);
    for (int64_t b = 0; b < 2; b++)
        for (int64_t n = 0; n < 37; n++)
            for (int64_t e = 0; e < 64; e++)
                tu_set(&r.k, b, 0, n, e, tu_at(&r.k, b, 0, 0)[e]); /* key row 0 everywhere */
    stats_error err;
    ck_assert_int_eq(stats_cpu(&r.p, r.heads, r.rent, r.rmax, &err), STATS_OK);
    double sum = 0;
    for (int64_t b = 0; b < 2; b++)
        for (int h = 0; h < 2; h++)
            for (int64_t i = 0; i < 37; i++) {
                double want = log((double)(i + 1)); /* causal: row i sees i+1 keys */
                float got = r.rent[(b * 2 + h) * 37 + i];
                ck_assert_msg(fabs(got - want) <= 1e-6 * (1 + want), "row %lld: %.9g vs ln(%lld)",
                              (long long)i, (double)got, (long long)(i + 1));
                sum += want;
            }
    /* per head: the mean over both batches of ln(i+1); normalised mean is exactly 1 */
    for (int h = 0; h < 2; h++) {
        ck_assert_msg(fabs(r.heads[h].entropy_mean - sum / 148.0) < 1e-12, "mean %.15g vs %.15g",
                      r.heads[h].entropy_mean, sum / 148.0);
        ck_assert_msg(fabs(r.heads[h].entropy_norm_mean - 1.0) < 1e-12, "norm mean %.15g",
                      r.heads[h].entropy_norm_mean);
        ck_assert_int_eq(r.heads[h].rows_norm, 2 * 36); /* row 0 sees one key */
        ck_assert(r.heads[h].collapsed_frac == 0.0);
    }
    run_free(&r);
}
END_TEST

/* Identical keys under a window (loop 0: causal with Nk > Nq, so row i's diagonal is at key
 * i + Nk - Nq; loop 1: not causal, a window on each side): each row's distribution is uniform over
 * its n visible keys [lo, hi], so its sink mass is 1/n and its distance the mean of |pos - j| over
 * them, summed here in closed form per row; both CPU backends must give their head means. */
START_TEST(test_uniform_sink_distance)
{
    reseed(__LINE__, _i);
    const int nq = 29, nk = 29 + (_i == 0 ? 11 : 0);
    const int wl = 3 + (int)(tu_next(&g_rng) % 9), wr = _i == 0 ? -1 : 1 + (int)(tu_next(&g_rng) % 6);
    cfg c = {2, 2, 1, nq, nk, 32, STATS_F32, TU_BHND, _i == 0, wl, wr, 0, 0, 0, 0, 0, 1, 0};
    run r;
    run_setup(&r, &c);
    for (int64_t b = 0; b < 2; b++)
        for (int64_t n = 0; n < nk; n++)
            for (int64_t e = 0; e < 32; e++)
                tu_set(&r.k, b, 0, n, e, tu_at(&r.k, b, 0, 0)[e]); /* key row 0 everywhere */
    double want_sink = 0, want_dist = 0;
    for (int64_t i = 0; i < nq; i++) {
        int64_t pos = i + nk - nq, lo = pos - wl > 0 ? pos - wl : 0;
        int64_t hi = wr < 0 ? pos : (pos + wr < nk - 1 ? pos + wr : nk - 1);
        double n = (double)(hi - lo + 1);
        /* sum over [lo, pos] of pos - j, and over (pos, hi] of j - pos */
        double left = (double)(pos - lo) * (double)(pos - lo + 1) / 2.0;
        double right = hi > pos ? (double)(hi - pos) * (double)(hi - pos + 1) / 2.0 : 0.0;
        want_sink += 1.0 / n;
        want_dist += (left + right) / n;
    }
    want_sink /= nq, want_dist /= nq;
    stats_error err;
    for (int be = 0; be < 2; be++) {
        stats_status st = be ? stats_cpu_fast(&r.p, r.heads, NULL, NULL, &err)
                             : stats_cpu(&r.p, r.heads, NULL, NULL, &err);
        ck_assert_int_eq(st, STATS_OK);
        const double tol = be ? 1e-6 : 1e-12;
        for (int h = 0; h < 2; h++) {
            ck_assert_msg(fabs(r.heads[h].sink_mass - want_sink) <= tol,
                          "%s: head %d sink mass %.15g vs %.15g", be ? "fast" : "reference", h,
                          r.heads[h].sink_mass, want_sink);
            ck_assert_msg(fabs(r.heads[h].distance - want_dist) <= tol * want_dist,
                          "%s: head %d distance %.15g vs %.15g", be ? "fast" : "reference", h,
                          r.heads[h].distance, want_dist);
        }
    }
    run_free(&r);
}
END_TEST

/* One key far above the others (gap ~1e3 logits): H = 0 exactly; causal row 0 is 0 exactly. */
START_TEST(test_one_hot_and_causal_row0)
{
    reseed(__LINE__, _i);
    cfg c = {1, 1, 1, 8, 40, 64, STATS_F32, TU_BHND, 0, -1, -1, 0, 1.0f, 0, 0, 0, 0.05, 0};
    run r;
    run_setup(&r, &c);
    int64_t hot = 17;
    for (int64_t i = 0; i < 8; i++)
        for (int64_t e = 0; e < 64; e++)
            tu_set(&r.q, 0, 0, i, e, e == (i % 64) ? 1.0 : 0.01 * tu_gauss(&g_rng));
    for (int64_t e = 0; e < 64; e++)
        tu_set(&r.k, 0, 0, hot, e, e < 8 ? 2000.0 : 0.0);
    stats_error err;
    ck_assert_int_eq(stats_cpu(&r.p, r.heads, r.rent, r.rmax, &err), STATS_OK);
    for (int i = 0; i < 8; i++) {
        ck_assert_msg(r.rent[i] == 0.0f, "one-hot row %d: entropy %g", i, (double)r.rent[i]);
        ck_assert_msg(r.rmax[i] > 1500.0f, "one-hot row %d: max logit %g", i, (double)r.rmax[i]);
    }
    ck_assert(r.heads[0].entropy_max == 0.0 && r.heads[0].collapsed_frac == 1.0);
    run_free(&r);

    cfg c2 = {3, 2, 2, 19, 19, 32, STATS_BF16, TU_BNHD, 1, -1, -1, 0, 0, 0, 0, 0, 2, 0};
    run_setup(&r, &c2);
    ck_assert_int_eq(stats_cpu(&r.p, r.heads, r.rent, r.rmax, &err), STATS_OK);
    for (int b = 0; b < 3; b++)
        for (int h = 0; h < 2; h++)
            ck_assert_msg(r.rent[(b * 2 + h) * 19] == 0.0f, "causal row 0 of (%d,%d): %g", b, h,
                          (double)r.rent[(b * 2 + h) * 19]);
    run_free(&r);
}
END_TEST

/* Permuting the keys (no mask) changes nothing beyond rounding: 1e-12 relative. */
START_TEST(test_key_permutation)
{
    reseed(__LINE__, _i);
    cfg c = {2, 2, 2, 23, 57, 80, STATS_BF16, TU_BHND, 0, -1, -1, 0, 0, 0, 0, 0, 2, 0};
    run a, b;
    run_setup(&a, &c);
    run_setup(&b, &c);
    int perm[57];
    for (int j = 0; j < 57; j++)
        perm[j] = j;
    for (int j = 56; j > 0; j--) {
        int t = (int)(tu_next(&g_rng) % (uint64_t)(j + 1)), x = perm[j];
        perm[j] = perm[t], perm[t] = x;
    }
    for (int64_t bb = 0; bb < 2; bb++)
        for (int64_t h = 0; h < 2; h++) {
            for (int64_t i = 0; i < 23; i++)
                for (int64_t e = 0; e < 80; e++)
                    tu_set(&b.q, bb, h, i, e, tu_at(&a.q, bb, h, i)[e]);
            for (int64_t j = 0; j < 57; j++)
                for (int64_t e = 0; e < 80; e++)
                    tu_set(&b.k, bb, h, j, e, tu_at(&a.k, bb, h, perm[j])[e]);
        }
    stats_error err;
    ck_assert_int_eq(stats_cpu(&a.p, a.heads, a.rent, a.rmax, &err), STATS_OK);
    ck_assert_int_eq(stats_cpu(&b.p, b.heads, b.rent, b.rmax, &err), STATS_OK);
    for (int h = 0; h < 2; h++) {
        ck_assert(tu_close(a.heads[h].entropy_mean, b.heads[h].entropy_mean, 0, 1e-12));
        ck_assert(tu_close(a.heads[h].entropy_std, b.heads[h].entropy_std, 1e-12, 1e-9));
        ck_assert(a.heads[h].max_logit == b.heads[h].max_logit);
    }
    for (int64_t i = 0; i < a.nrows; i++)
        ck_assert(tu_close(a.rent[i], b.rent[i], 1e-7, 1e-6));
    run_free(&a);
    run_free(&b);
}
END_TEST

/* GQA: Hq=8 over Hkv=2 equals Hq=8 over Hkv=8 with each K head repeated: bit for bit. */
START_TEST(test_gqa_equals_repeated_heads)
{
    reseed(__LINE__, _i);
    cfg cg = {2, 8, 2, 31, 44, 64, STATS_F16, TU_BNHD, 1, -1, -1, 0, 0, 0, 0, 0, 1, 0};
    cfg cr = cg;
    cr.hkv = 8;
    run g, r;
    run_setup(&g, &cg);
    run_setup(&r, &cr);
    for (int64_t b = 0; b < 2; b++)
        for (int64_t h = 0; h < 8; h++) {
            for (int64_t i = 0; i < 31; i++)
                for (int64_t e = 0; e < 64; e++)
                    tu_set(&r.q, b, h, i, e, tu_at(&g.q, b, h, i)[e]);
            for (int64_t j = 0; j < 44; j++)
                for (int64_t e = 0; e < 64; e++)
                    tu_set(&r.k, b, h, j, e, tu_at(&g.k, b, h / 4, j)[e]);
        }
    stats_error err;
    ck_assert_int_eq(stats_cpu(&g.p, g.heads, g.rent, g.rmax, &err), STATS_OK);
    ck_assert_int_eq(stats_cpu(&r.p, r.heads, r.rent, r.rmax, &err), STATS_OK);
    ck_assert(memcmp(g.rent, r.rent, sizeof(float) * (size_t)g.nrows) == 0);
    for (int h = 0; h < 8; h++)
        ck_assert(g.heads[h].entropy_mean == r.heads[h].entropy_mean &&
                  g.heads[h].max_logit == r.heads[h].max_logit);
    run_free(&g);
    run_free(&r);
}
END_TEST

/* Logits ~1e3 with a few near-ties: entropies are small (0.01..1 nats) and must be finite and
 * accurate to 1e-9 relative against the two-pass computation (the naive m + log l - r/l form
 * loses most digits here). */
START_TEST(test_large_logits)
{
    reseed(__LINE__, _i);
    cfg c = {2, 2, 1, 40, 64, 64, STATS_F32, TU_BHND, 0, -1, -1, 0, 1.0f, 0, 0, 0, 1, 0};
    run r;
    run_setup(&r, &c);
    for (int64_t b = 0; b < 2; b++) {
        for (int64_t h = 0; h < 2; h++)
            for (int64_t i = 0; i < 40; i++)
                for (int64_t e = 0; e < 64; e++)
                    tu_set(&r.q, b, h, i, e, e == 0 ? 1000.0 : 0.0);
        for (int64_t j = 0; j < 64; j++) /* logit = k[j][0] * 1000: 1000 - small gaps */
            for (int64_t e = 0; e < 64; e++)
                tu_set(&r.k, b, 0, j, e, e == 0 ? 1.0 - (j % 8 == 0 ? 0.004 * tu_uniform(&g_rng) : 0.02 + 0.1 * tu_uniform(&g_rng)) : 0.0);
    }
    run_check(&r, "large logits");
    for (int h = 0; h < 2; h++) {
        ck_assert(r.heads[h].max_logit > 990.0 && isfinite(r.heads[h].entropy_mean));
        ck_assert_msg(tu_close(r.heads[h].entropy_mean, r.ref_heads[h].mean, 0, 1e-9),
                      "mean %.17g vs %.17g", r.heads[h].entropy_mean, r.ref_heads[h].mean);
        ck_assert(r.heads[h].entropy_mean > 1e-3 && r.heads[h].entropy_mean < 3.0);
    }
    run_free(&r);
}
END_TEST

/* NaN in one query row and Inf in one key: those rows are counted, never averaged. */
START_TEST(test_nonfinite_counted)
{
    reseed(__LINE__, _i);
    stats_dtype dt = (stats_dtype)_i;
    cfg c = {2, 2, 2, 30, 30, 64, dt, TU_BHND, 1, -1, -1, 0, 0, 0, 0, 0, 1, 0};
    run r;
    run_setup(&r, &c);
    tu_set(&r.q, 0, 0, 5, 3, NAN);          /* row 5 of (b0,h0) */
    tu_set(&r.k, 1, 1, 20, 7, INFINITY);    /* every causal row >= 20 of (b1,h1) sees it */
    run_check(&r, "non-finite");
    ck_assert_int_eq(r.heads[0].nonfinite_rows, 1);
    ck_assert_int_eq(r.heads[1].nonfinite_rows, 10);
    ck_assert_int_eq(r.heads[0].rows, 59);
    ck_assert_int_eq(r.heads[1].rows, 50);
    ck_assert(isfinite(r.heads[0].entropy_mean) && isfinite(r.heads[1].entropy_mean));
    ck_assert(isfinite(r.heads[0].max_logit) && isfinite(r.heads[1].max_logit));
    run_free(&r);
}
END_TEST

/* Causal with Nk < Nq and empty packed sequences: rows with no key are counted as empty. */
START_TEST(test_empty_rows)
{
    reseed(__LINE__, _i);
    cfg c = {2, 1, 1, 20, 12, 32, STATS_F32, TU_BHND, 1, -1, -1, 0, 0, 0, 0, 0, 1, 0};
    run r;
    run_setup(&r, &c);
    run_check(&r, "causal Nk<Nq");
    ck_assert_int_eq(r.heads[0].rows_empty, 2 * 8);
    ck_assert_int_eq(r.heads[0].rows, 2 * 12);
    run_free(&r);

    /* every row empty (the queries' sequence has no keys, the keys' sequence no queries):
     * no statistics at all: NaN means, -inf max, zero rows */
    cfg e = {2, 2, 1, 0, 0, 32, STATS_F32, TU_BHND, 0, -1, -1, 0, 0, 1, 0, 0, 1, 0};
    int32_t eq[3] = {0, 5, 5}, ek[3] = {0, 0, 3};
    run_setup_cu(&r, &e, eq, ek);
    run_check(&r, "all rows empty");
    ck_assert_int_eq(r.heads[0].rows, 0);
    ck_assert_int_eq(r.heads[0].rows_empty, 5);
    ck_assert(isnan(r.heads[0].entropy_mean) && isnan(r.heads[0].entropy_norm_mean));
    ck_assert(isinf(r.heads[0].max_logit) && r.heads[0].max_logit < 0);
    run_free(&r);

    /* packed, sequence 1 has 4 queries and no keys */
    cfg pk = {3, 2, 1, 0, 0, 32, STATS_BF16, TU_BHND, 0, -1, -1, 0, 0, 1, 0, 0, 1, 0};
    int32_t cq[4] = {0, 3, 7, 9}, ck[4] = {0, 5, 5, 8};
    run_setup_cu(&r, &pk, cq, ck);
    run_check(&r, "packed with an empty key sequence");
    ck_assert_int_eq(r.heads[0].rows_empty, 4);
    ck_assert_int_eq(r.heads[0].rows, 5);
    run_free(&r);
}
END_TEST

/* Sampling: stats_sample_row is a permutation; sampled runs match the reference over the same
 * rows; every-8th costs an eighth of the rows. */
START_TEST(test_sampling)
{
    reseed(__LINE__, _i);
    for (uint32_t n = 1; n < 300; n += 1 + n / 4) {
        uint64_t seed = tu_next(&g_rng);
        char *seen = calloc(n, 1);
        for (uint32_t j = 0; j < n; j++) {
            uint32_t i = stats_sample_row(j, n, seed);
            ck_assert_msg(i < n && !seen[i], "n=%u: sample %u -> %u repeats or is out of range", n, j, i);
            seen[i] = 1;
        }
        free(seen);
    }
    /* seeds matter, and the same seed gives the same rows */
    uint32_t same = 0, other = 0;
    for (uint32_t j = 0; j < 16; j++) {
        same += stats_sample_row(j, 1000, 42) == stats_sample_row(j, 1000, 42);
        other += stats_sample_row(j, 1000, 42) == stats_sample_row(j, 1000, 43);
    }
    ck_assert_uint_eq(same, 16);
    ck_assert_uint_lt(other, 8);

    stats_problem p;
    stats_problem_init(&p);
    p.sample_every = 8;
    ck_assert_int_eq(stats_sampled_count(&p, 100), 13);
    p.sample_every = INT32_MAX; /* no overflow near the top of the range */
    ck_assert_int_eq(stats_sampled_count(&p, INT32_MAX), 1);
    ck_assert_int_eq(stats_sampled_count(&p, INT32_MAX - 5), 1);
    p.sample_every = 0, p.sample_rows = 13;
    ck_assert_int_eq(stats_sampled_count(&p, 100), 13);
    ck_assert_int_eq(stats_sampled_count(&p, 5), 5);
}
END_TEST

/* ---- bad arguments: an error code and a message, never a crash ------------------------------ */

/* ---- masks and the precision of the logits ------------------------------------------------ */


/* Masks of every dtype, broadcast over batch and heads or not, alone and with causal and a
 * window, against the two-pass reference (which reads the mask element by element). */
START_TEST(test_masks)
{
    static const struct {
        stats_dtype mdt;
        int bcast_b, bcast_h, keep, causal, wl;
        double bias;
        stats_dtype dt;
    } m[] = {
        {STATS_BOOL, 0, 1, 70, 0, -1, 0.0, STATS_BF16},  {STATS_BOOL, 1, 0, 35, 1, -1, 0.0, STATS_F32},
        {STATS_F32, 0, 0, 60, 0, -1, 2.0, STATS_F16},    {STATS_F32, 1, 1, 90, 1, 5, 0.0, STATS_BF16},
        {STATS_F16, 0, 1, 50, 0, 7, 3.0, STATS_F32},     {STATS_BF16, 0, 1, 80, 1, -1, 1.5, STATS_BF16},
        {STATS_BOOL, 0, 0, 100, 0, -1, 0.0, STATS_F16},  {STATS_BF16, 1, 1, 20, 0, -1, 0.0, STATS_F32},
    };
    reseed(__LINE__, _i);
    cfg c = {3, 4, 2, 23, 70, 40, m[_i].dt, _i % 2 ? TU_BNHD : TU_BHND, m[_i].causal, m[_i].wl, -1,
             0, 0, 0, 0, 0, 2.0, 0};
    run r;
    run_setup(&r, &c);
    run_mask(&r, m[_i].bcast_b ? 1 : c.b, m[_i].bcast_h ? 1 : c.hq, m[_i].mdt, m[_i].keep,
             m[_i].bias);
    char what[64];
    snprintf(what, sizeof what, "mask case %d", _i);
    run_check(&r, what);
    int64_t empty = 0;
    for (int h = 0; h < c.hq; h++)
        empty += r.heads[h].rows_empty;
    ck_assert_msg(empty > 0, "%s: no row was left without keys", what);
    run_free(&r);
}
END_TEST

/* A mask that lets every key through changes nothing; one that keeps a causal prefix equals
 * causal; the max logit ignores a finite bias while the entropy does not. */
START_TEST(test_mask_properties)
{
    reseed(__LINE__, _i);
    cfg c = {2, 4, 4, 17, 17, 32, STATS_F32, TU_BHND, 0, -1, -1, 0, 0, 0, 0, 0, 1.5, 0};
    run a, b;
    run_setup(&a, &c);
    stats_error err;
    stats_head plain[4], masked[4], causal[4];
    ck_assert_int_eq(stats_cpu(&a.p, plain, NULL, NULL, &err), STATS_OK);
    tu_mask_alloc(&a.mask, 1, 1, c.nq, c.nk, STATS_BOOL);
    for (int i = 0; i < c.nq; i++)
        for (int j = 0; j < c.nk; j++)
            tu_mask_set(&a.mask, 0, 0, i, j, 1, 0, 0);
    a.p.mask = (stats_tensor){a.mask.mem, 0, 0, a.mask.sn};
    a.p.mask_dtype = STATS_BOOL;
    ck_assert_int_eq(stats_cpu(&a.p, masked, NULL, NULL, &err), STATS_OK);
    ck_assert(memcmp(plain, masked, sizeof plain) == 0);
    for (int i = 0; i < c.nq; i++)
        for (int j = 0; j < c.nk; j++)
            tu_mask_set(&a.mask, 0, 0, i, j, j <= i, 0, 0);
    ck_assert_int_eq(stats_cpu(&a.p, masked, NULL, NULL, &err), STATS_OK);
    a.p.mask.ptr = NULL, a.p.causal = 1;
    ck_assert_int_eq(stats_cpu(&a.p, causal, NULL, NULL, &err), STATS_OK);
    for (int h = 0; h < 4; h++) {
        ck_assert(tu_close(masked[h].entropy_mean, causal[h].entropy_mean, 1e-12, 1e-12));
        ck_assert(masked[h].rows_norm == causal[h].rows_norm);
        ck_assert(masked[h].max_logit == causal[h].max_logit);
    }
    /* a constant bias: the same distribution and max logit; a varying one: another entropy */
    c.causal = 0;
    run_setup(&b, &c);
    ck_assert_int_eq(stats_cpu(&b.p, plain, NULL, NULL, &err), STATS_OK);
    tu_mask_alloc(&b.mask, 1, 1, c.nq, c.nk, STATS_F32);
    for (int i = 0; i < c.nq; i++)
        for (int j = 0; j < c.nk; j++)
            tu_mask_set(&b.mask, 0, 0, i, j, 1, 4.0, 0);
    b.p.mask = (stats_tensor){b.mask.mem, 0, 0, b.mask.sn};
    b.p.mask_dtype = STATS_F32;
    ck_assert_int_eq(stats_cpu(&b.p, masked, NULL, NULL, &err), STATS_OK);
    for (int h = 0; h < 4; h++) {
        ck_assert(tu_close(masked[h].entropy_mean, plain[h].entropy_mean, 1e-12, 1e-12));
        ck_assert(tu_close(masked[h].max_logit, plain[h].max_logit, 1e-12, 1e-12));
    }
    for (int i = 0; i < c.nq; i++)
        for (int j = 0; j < c.nk; j++)
            tu_mask_set(&b.mask, 0, 0, i, j, 1, j % 2 ? 3.0 : -3.0, 0);
    ck_assert_int_eq(stats_cpu(&b.p, masked, NULL, NULL, &err), STATS_OK);
    for (int h = 0; h < 4; h++) {
        ck_assert(fabs(masked[h].entropy_mean - plain[h].entropy_mean) > 1e-3);
        ck_assert(tu_close(masked[h].max_logit, plain[h].max_logit, 1e-12, 1e-12));
    }
    run_free(&a);
    run_free(&b);
}
END_TEST

/* compute_dtype: float32 tensors computed as bf16 / f16 give exactly what the same values stored
 * as bf16 / f16 give, and differ from the float32 result; the reference agrees too. */
START_TEST(test_compute_dtype)
{
    reseed(__LINE__, _i);
    stats_dtype low = _i ? STATS_F16 : STATS_BF16;
    cfg c = {2, 4, 2, 19, 33, 64, STATS_F32, TU_BNHD, 1, -1, -1, 0, 0, 0, 0, 0, 2.0, 0};
    run r;
    run_setup(&r, &c);
    stats_error err;
    stats_head full[4], rounded[4], stored[4];
    ck_assert_int_eq(stats_cpu(&r.p, full, NULL, NULL, &err), STATS_OK);
    r.p.compute_dtype = low;
    run_check(&r, low == STATS_BF16 ? "compute bf16" : "compute f16");
    memcpy(rounded, r.heads, sizeof rounded);
    /* the same values, rounded and stored as the 16-bit dtype */
    tu_tensor q2, k2;
    tu_alloc(&q2, c.b, c.hq, c.nq, c.d, low, TU_BHND);
    tu_alloc(&k2, c.b, c.hkv, c.nk, c.d, low, TU_BHND);
    for (int b = 0; b < c.b; b++)
        for (int n = 0; n < c.nq; n++)
            for (int e = 0; e < c.d; e++) {
                for (int h = 0; h < c.hq; h++)
                    tu_set(&q2, b, h, n, e, tu_at(&r.q, b, h, n)[e]);
            }
    for (int b = 0; b < c.b; b++)
        for (int n = 0; n < c.nk; n++)
            for (int e = 0; e < c.d; e++)
                for (int h = 0; h < c.hkv; h++)
                    tu_set(&k2, b, h, n, e, tu_at(&r.k, b, h, n)[e]);
    stats_problem p2 = r.p;
    p2.dtype = low, p2.compute_dtype = STATS_F32;
    p2.q = tu_view(&q2), p2.k = tu_view(&k2);
    ck_assert_int_eq(stats_cpu(&p2, stored, NULL, NULL, &err), STATS_OK);
    ck_assert(memcmp(rounded, stored, sizeof stored) == 0);
    double diff = 0;
    for (int h = 0; h < 4; h++)
        diff += fabs(rounded[h].entropy_mean - full[h].entropy_mean);
    ck_assert_msg(diff > 1e-9, "rounding to %s changed nothing", stats_dtype_name(low));
    tu_free(&q2);
    tu_free(&k2);
    run_free(&r);
}
END_TEST

static void expect_einval(stats_problem *p, const char *needle)
{
    stats_head heads[8];
    stats_error err;
    memset(&err, 0x5a, sizeof err);
    stats_status st = stats_cpu(p, heads, NULL, NULL, &err);
    ck_assert_msg(st == STATS_EINVAL, "expected EINVAL for '%s', got %d", needle, (int)st);
    ck_assert_msg(strstr(err.msg, needle) != NULL, "message '%s' does not mention '%s'", err.msg,
                  needle);
}

START_TEST(test_bad_arguments)
{
    reseed(__LINE__, _i);
    float q[4 * 2 * 3 * 32], k[4 * 2 * 3 * 32];
    for (size_t i = 0; i < sizeof q / sizeof q[0]; i++)
        q[i] = k[i] = (float)tu_gauss(&g_rng);
    stats_problem good;
    stats_problem_init(&good);
    good.batch = 2, good.heads_q = 2, good.heads_kv = 2, good.len_q = 3, good.len_k = 3;
    good.head_dim = 32, good.dtype = STATS_F32;
    good.q = (stats_tensor){q, 2 * 3 * 32, 3 * 32, 32};
    good.k = (stats_tensor){k, 2 * 3 * 32, 3 * 32, 32};
    stats_head heads[2];
    stats_error err;
    ck_assert_int_eq(stats_cpu(&good, heads, NULL, NULL, &err), STATS_OK);

    stats_problem p;
    ck_assert_int_eq(stats_cpu(NULL, heads, NULL, NULL, &err), STATS_EINVAL);
    p = good, p.q.ptr = NULL;
    expect_einval(&p, "q: data pointer is NULL");
    p = good, p.k.ptr = NULL;
    expect_einval(&p, "k: data pointer is NULL");
    ck_assert_int_eq(stats_cpu(&good, NULL, NULL, NULL, &err), STATS_EINVAL);
    ck_assert(strstr(err.msg, "heads") != NULL);
    p = good, p.batch = 0;
    expect_einval(&p, "must be positive");
    p = good, p.len_k = 0;
    expect_einval(&p, "must be positive");
    p = good, p.head_dim = -4;
    expect_einval(&p, "must be positive");
    p = good, p.head_dim = 512;
    expect_einval(&p, "head_dim 512 is over the maximum");
    p = good, p.len_k = STATS_MAX_LEN + 1, p.k.stride_n = 0; /* 32-bit key loops would wrap */
    expect_einval(&p, "must be at most 1073741824");
    p = good, p.len_q = INT32_MAX, p.q.stride_n = 0;
    expect_einval(&p, "must be at most 1073741824");
    p = good, p.heads_q = 3;
    expect_einval(&p, "not a multiple of heads_kv");
    p = good, p.dtype = (stats_dtype)7;
    expect_einval(&p, "unknown dtype");
    p = good, p.q.stride_n = -1;
    expect_einval(&p, "negative stride");
    p = good, p.k.stride_b = INT64_MAX / 2;
    expect_einval(&p, "overflows");
    p = good, p.scale = -1.0f;
    expect_einval(&p, "scale");
    p = good, p.scale = NAN;
    expect_einval(&p, "scale");
    p = good, p.softcap = INFINITY;
    expect_einval(&p, "softcap");
    p = good, p.causal = 1, p.window_right = 4;
    expect_einval(&p, "causal contradicts window_right");
    p = good, p.causal = 2;
    expect_einval(&p, "causal must be 0 or 1");
    p = good, p.sample_every = 4, p.sample_rows = 3;
    expect_einval(&p, "choose one sampling");
    p = good, p.sample_rows = -3;
    expect_einval(&p, "must be >= 0");
    p = good, p.collapse_threshold = 1.5f;
    expect_einval(&p, "collapse_threshold");
    int32_t cu_ok[3] = {0, 1, 3}, cu_bad0[3] = {1, 2, 3}, cu_dec[3] = {0, 2, 1}, cu_end[3] = {0, 1, 2};
    p = good, p.cu_seqlens_q = cu_ok;
    expect_einval(&p, "need both");
    p = good, p.cu_seqlens_q = cu_ok, p.cu_seqlens_k = cu_bad0;
    expect_einval(&p, "cu_seqlens_k[0] is 1");
    p = good, p.cu_seqlens_q = cu_dec, p.cu_seqlens_k = cu_ok;
    expect_einval(&p, "cu_seqlens_q decreases");
    p = good, p.cu_seqlens_q = cu_ok, p.cu_seqlens_k = cu_end;
    expect_einval(&p, "cu_seqlens_k[2] is 2 but the packed tensor has 3 rows");
    p = good, p.cu_seqlens_q = cu_ok, p.cu_seqlens_k = cu_ok;
    ck_assert_int_eq(stats_cpu(&p, heads, NULL, NULL, &err), STATS_OK);
    unsigned char mask[2 * 3 * 3];
    memset(mask, 1, sizeof mask);
    p = good, p.mask = (stats_tensor){mask, 9, 0, 3}, p.mask_dtype = STATS_BOOL;
    ck_assert_int_eq(stats_cpu(&p, heads, NULL, NULL, &err), STATS_OK);
    p.cu_seqlens_q = cu_ok, p.cu_seqlens_k = cu_ok;
    expect_einval(&p, "mask does not combine with packed");
    p = good, p.mask = (stats_tensor){mask, 9, 0, 3}, p.mask_dtype = (stats_dtype)9;
    expect_einval(&p, "mask dtype 9");
    p = good, p.mask = (stats_tensor){mask, 9, -1, 3}, p.mask_dtype = STATS_BOOL;
    expect_einval(&p, "mask: negative stride");
    p = good, p.compute_dtype = STATS_BOOL;
    expect_einval(&p, "compute_dtype 3");
    p = good, p.dtype = STATS_BOOL;
    expect_einval(&p, "unknown dtype 3");
}
END_TEST

/* One workspace over problems of growing and shrinking sizes gives what a fresh one gives. */
START_TEST(test_workspace_reuse)
{
    reseed(__LINE__, _i);
    stats_cpu_workspace *ws = stats_cpu_workspace_new();
    ck_assert_ptr_nonnull(ws);
    static const int sizes[][3] = {{4, 30, 40}, {8, 200, 1500}, {2, 5, 7}, {4, 90, 2100}};
    for (int t = 0; t < 4; t++) {
        cfg c = {1, sizes[t][0], 2, sizes[t][1], sizes[t][2], 64, STATS_BF16, TU_BHND, 1, -1, -1,
                 0, 0, 0, 0, 0, 1, 0};
        run r;
        run_setup(&r, &c);
        stats_head *again = malloc(sizeof(stats_head) * (size_t)c.hq);
        stats_error err;
        ck_assert_int_eq(stats_cpu_ws(&r.p, ws, again, NULL, NULL, &err), STATS_OK);
        ck_assert_int_eq(stats_cpu(&r.p, r.heads, NULL, NULL, &err), STATS_OK);
        ck_assert(memcmp(again, r.heads, sizeof(stats_head) * (size_t)c.hq) == 0);
        free(again);
        run_free(&r);
    }
    stats_cpu_workspace_free(ws);
}
END_TEST

START_TEST(test_extent)
{
    reseed(__LINE__, _i);
    ck_assert_int_eq(stats_tensor_extent(2, 3, 4, 8, 96, 32, 8), 192);
    ck_assert_int_eq(stats_tensor_extent(2, 3, 4, 8, 96, 8, 24), 192); /* [B,N,H,D] */
    ck_assert_int_eq(stats_tensor_extent(1, 1, 1, 8, 0, 0, 0), 8);
    ck_assert_int_eq(stats_tensor_extent(0, 3, 4, 8, 96, 32, 8), 0);
    ck_assert_int_eq(stats_tensor_extent(3, 1, 1, 1, INT64_MAX, 0, 0), -1);
    ck_assert_int_eq(stats_tensor_extent(2, 1, 1, 1, -1, 0, 0), -1);
}
END_TEST

static Suite *stats_suite(void)
{
    Suite *s = suite_create("stats_cpu");
    TCase *tc = tcase_create("reference");
        tcase_set_timeout(tc, 120);
    tcase_add_loop_test(tc, test_random_shapes, 0, (int)(sizeof shapes / sizeof shapes[0]));
    tcase_add_loop_test(tc, test_dtype_layout_dims, 0, 9);
    tcase_add_test(tc, test_uniform_is_log_n);
    tcase_add_loop_test(tc, test_uniform_sink_distance, 0, 2);
    tcase_add_test(tc, test_one_hot_and_causal_row0);
    tcase_add_test(tc, test_key_permutation);
    tcase_add_test(tc, test_gqa_equals_repeated_heads);
    tcase_add_test(tc, test_large_logits);
    tcase_add_loop_test(tc, test_nonfinite_counted, 0, 3);
    tcase_add_test(tc, test_empty_rows);
    tcase_add_test(tc, test_sampling);
    tcase_add_loop_test(tc, test_masks, 0, 8);
    tcase_add_test(tc, test_mask_properties);
    tcase_add_loop_test(tc, test_compute_dtype, 0, 2);
    tcase_add_test(tc, test_bad_arguments);
    tcase_add_test(tc, test_extent);
    tcase_add_test(tc, test_workspace_reuse);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    g_seed = tu_seed();
    SRunner *sr = srunner_create(stats_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
