/* test_stats_sinks.c — attention sinks (stats.h: gpt-oss's per-head sink logit, one more outcome of
 * every row's softmax) in the CPU reference backend (kernels/stats_cpu.c), against the independent
 * two-pass computation of stats_testutil.h over the keys and the sink, on fresh random data: the
 * shapes of the random suite (GQA, causal, windows, softcap, an explicit scale, packed sequences,
 * sampling, long K, one visible key per row, masks) with sinks of every dtype; -inf equal to no
 * sink bit for bit; NaN and +inf sinks counted non-finite; sinks that dominate every row (entropies
 * of ~1e-5 nats to 1e-9 relative, exactly 0 for a sink of 1e30); normalisation by ln(n + 1).
 * Tolerances: stats_runutil.h's run_check. */
#include "stats_runutil.h"

/* Stores v, rounded to the problem's sinks dtype, as head h's sink; keeps the exact value. */
static void sink_set(run *r, int h, double v)
{
    switch (r->p.sinks_dtype) {
    case STATS_F32: {
        float f = (float)v;
        ((float *)r->sinks_mem)[h] = f;
        r->sinks_val[h] = f;
        break;
    }
    case STATS_F16: {
        uint16_t u = tu_to_f16((float)v);
        ((uint16_t *)r->sinks_mem)[h] = u;
        r->sinks_val[h] = tu_from_f16(u);
        break;
    }
    default: {
        uint16_t u = tu_to_bf16((float)v);
        ((uint16_t *)r->sinks_mem)[h] = u;
        r->sinks_val[h] = tu_from_bf16(u);
        break;
    }
    }
}

/* Gives r one sink per query head, of dtype dt, drawn from N(mean, sd^2): near the logits, so that
 * the sink sometimes dominates a row and sometimes hardly counts. */
static void run_sinks(run *r, stats_dtype dt, double mean, double sd)
{
    const int hq = r->p.heads_q;
    r->sinks_mem = malloc((size_t)hq * stats_dtype_size(dt));
    r->sinks_val = malloc(sizeof(double) * (size_t)hq);
    r->p.sinks = r->sinks_mem;
    r->p.sinks_dtype = dt;
    for (int h = 0; h < hq; h++)
        sink_set(r, h, mean + sd * tu_gauss(&g_rng));
}

/* Sinks on the shapes of the random tests (GQA, causal, windows, softcap, an explicit scale,
 * packed sequences, sampling, long K, one visible key per row, masks) against the two-pass
 * computation over the keys and the sink. ninf: the last head's sink is -inf (none). */
static const struct {
    cfg c;
    stats_dtype sdt;
    double mean, sd;
    int mask;   /* 0 none; 1 bool; 2 additive f32 with biases */
    int ninf;
} sink_cases[] = {
    /* b hq hkv nq  nk   d   dtype      layout     causal wl  wr  cap   scale pk every n amp */
    {{2, 4, 2, 33, 47, 64, STATS_BF16, TU_BNHD, 0, -1, -1, 0, 0, 0, 0, 0, 1, 0}, STATS_F32, 1.5, 2, 0, 1},
    {{3, 2, 2, 29, 71, 128, STATS_BF16, TU_PADDED, 1, -1, -1, 0, 0, 0, 0, 0, 1, 0}, STATS_BF16, 1, 2, 0, 0},
    {{1, 3, 1, 65, 31, 80, STATS_F16, TU_BHND, 1, -1, -1, 0, 0, 0, 0, 0, 1, 0}, STATS_F16, 2, 1, 0, 1},
    {{2, 2, 1, 50, 50, 64, STATS_BF16, TU_BHND, 1, 7, -1, 0, 0, 0, 0, 0, 1, 0}, STATS_BF16, 0.5, 2, 0, 0},
    {{1, 3, 3, 45, 60, 32, STATS_F32, TU_PADDED, 0, 5, 3, 0, 0, 0, 0, 0, 1, 0}, STATS_F32, 1, 3, 0, 1},
    {{2, 2, 2, 70, 70, 64, STATS_BF16, TU_BNHD, 0, -1, -1, 30.0f, 0, 0, 0, 0, 6, 0}, STATS_F32, 20, 30, 0, 0},
    {{1, 4, 4, 37, 37, 128, STATS_F16, TU_BHND, 1, -1, -1, 0, 0.3f, 0, 0, 0, 1, 0}, STATS_F32, 3, 2, 0, 0},
    {{5, 4, 2, 30, 30, 64, STATS_BF16, TU_BHND, 1, -1, -1, 0, 0, 1, 0, 0, 1, 0}, STATS_BF16, 1, 2, 0, 1},
    {{4, 2, 1, 25, 40, 80, STATS_F32, TU_BNHD, 0, 6, -1, 0, 0, 1, 0, 0, 1, 0}, STATS_F16, 1, 2, 0, 0},
    {{2, 4, 4, 100, 100, 64, STATS_BF16, TU_BHND, 1, -1, -1, 0, 0, 0, 8, 0, 1, 0}, STATS_BF16, 1, 2, 0, 1},
    {{2, 2, 1, 90, 120, 128, STATS_F16, TU_BNHD, 1, -1, -1, 0, 0, 0, 0, 13, 1, 0}, STATS_F32, 1, 2, 0, 0},
    {{1, 2, 2, 40, 40, 32, STATS_F32, TU_BHND, 1, 0, 0, 0, 0, 0, 0, 0, 1, 0}, STATS_F32, 0, 1, 0, 0},
    {{1, 2, 1, 37, 2600, 32, STATS_BF16, TU_BHND, 1, -1, -1, 0, 0, 0, 0, 0, 2, 0}, STATS_BF16, 6, 2, 0, 0},
    {{3, 4, 2, 23, 70, 40, STATS_BF16, TU_BHND, 0, -1, -1, 0, 0, 0, 0, 0, 2, 0}, STATS_F32, 2, 3, 1, 1},
    {{2, 4, 4, 23, 70, 40, STATS_F32, TU_BNHD, 1, -1, -1, 0, 0, 0, 0, 0, 2, 0}, STATS_BF16, 2, 3, 2, 0},
};

START_TEST(test_sinks_random)
{
    reseed(__LINE__, _i);
    const cfg *c = &sink_cases[_i].c;
    run r;
    run_setup(&r, c);
    if (sink_cases[_i].mask)
        run_mask(&r, c->b, sink_cases[_i].mask == 1 ? 1 : c->hq,
                 sink_cases[_i].mask == 1 ? STATS_BOOL : STATS_F32, 70,
                 sink_cases[_i].mask == 1 ? 0.0 : 2.0);
    run_sinks(&r, sink_cases[_i].sdt, sink_cases[_i].mean, sink_cases[_i].sd);
    if (sink_cases[_i].ninf)
        sink_set(&r, c->hq - 1, -INFINITY);
    char what[96];
    snprintf(what, sizeof what, "sinks case %d (%s sinks, d=%d)", _i,
             stats_dtype_name(sink_cases[_i].sdt), c->d);
    run_check(&r, what);
    int64_t counted = 0;
    for (int h = 0; h < c->hq; h++) {
        counted += r.heads[h].rows;
        /* one visible key and a sink: two outcomes, so the normalised entropy is defined */
        if (c->wl == 0 && c->wr == 0 && c->causal)
            ck_assert_msg(r.heads[h].rows_norm == r.heads[h].rows, "%s: head %d rows_norm %lld "
                          "of %lld rows", what, h, (long long)r.heads[h].rows_norm,
                          (long long)r.heads[h].rows);
    }
    ck_assert_msg(counted > 0, "%s: no row counted", what);
    run_free(&r);
}
END_TEST

/* Sinks of -inf are no sinks: the same statistics and per-row outputs, bit for bit. */
START_TEST(test_sinks_ninf_is_none)
{
    reseed(__LINE__, _i);
    cfg c = {2, 4, 2, 31, 44, 64, STATS_BF16, TU_BNHD, 1, -1, -1, 0, 0, 0, 0, 0, 1.5, 0};
    run r;
    run_setup(&r, &c);
    stats_head plain[4];
    float *pe = malloc(sizeof(float) * (size_t)r.nrows), *pm = malloc(sizeof(float) * (size_t)r.nrows);
    stats_error err;
    ck_assert_int_eq(stats_cpu(&r.p, plain, pe, pm, &err), STATS_OK);
    run_sinks(&r, _i ? STATS_F16 : STATS_F32, 0, 1);
    for (int h = 0; h < c.hq; h++)
        sink_set(&r, h, -INFINITY);
    run_check(&r, "sinks of -inf");
    ck_assert(memcmp(plain, r.heads, sizeof plain) == 0);
    ck_assert(memcmp(pe, r.rent, sizeof(float) * (size_t)r.nrows) == 0);
    ck_assert(memcmp(pm, r.rmax, sizeof(float) * (size_t)r.nrows) == 0);
    free(pe);
    free(pm);
    run_free(&r);
}
END_TEST

/* A NaN or +inf sink makes every row of its head that sees a key non-finite (counted, excluded);
 * rows without a key stay empty; the other heads are untouched. */
START_TEST(test_sinks_nonfinite)
{
    reseed(__LINE__, _i);
    cfg c = {1, 3, 3, 20, 12, 32, STATS_F32, TU_BHND, 1, -1, -1, 0, 0, 0, 0, 0, 1, 0};
    run r;
    run_setup(&r, &c);
    run_sinks(&r, (stats_dtype)_i, 1, 1); /* f32, f16, bf16 */
    sink_set(&r, 1, NAN);
    sink_set(&r, 2, INFINITY);
    run_check(&r, "NaN and +inf sinks");
    ck_assert_int_eq(r.heads[0].rows, 12);
    ck_assert_int_eq(r.heads[0].nonfinite_rows, 0);
    for (int h = 1; h < 3; h++) {
        ck_assert_int_eq(r.heads[h].rows, 0);
        ck_assert_int_eq(r.heads[h].nonfinite_rows, 12);
        ck_assert_int_eq(r.heads[h].rows_empty, 8); /* causal, Nk < Nq: rows 0..7 see no key */
        ck_assert(isnan(r.heads[h].entropy_mean) && isinf(r.heads[h].max_logit));
    }
    run_free(&r);
}
END_TEST

/* A sink far above the logits takes the weight: with logits ~1e3 and the sink 15 above them the
 * entropies are ~1e-5 nats and must match the two-pass computation to 1e-9 relative (no
 * cancellation); a sink of 1e30 makes every entropy exactly 0 (normalised 0, every row collapsed)
 * and leaves the max logit alone; a sink of -1e30 changes no entropy but is still an outcome
 * (normalised by ln(n + 1)). */
START_TEST(test_sinks_dominate)
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
        for (int64_t j = 0; j < 64; j++)
            for (int64_t e = 0; e < 64; e++)
                tu_set(&r.k, b, 0, j, e, e == 0 ? 1.0 - (j % 8 == 0 ? 0.004 * tu_uniform(&g_rng) : 0.02 + 0.1 * tu_uniform(&g_rng)) : 0.0);
    }
    stats_head plain[2];
    stats_error err;
    ck_assert_int_eq(stats_cpu(&r.p, plain, NULL, NULL, &err), STATS_OK);
    run_sinks(&r, STATS_F32, 0, 1);
    sink_set(&r, 0, 1015.0);
    sink_set(&r, 1, 1015.0 + tu_uniform(&g_rng));
    run_check(&r, "sink 15 over logits of 1e3");
    for (int h = 0; h < 2; h++) {
        ck_assert_msg(r.heads[h].entropy_mean > 1e-8 && r.heads[h].entropy_mean < 1e-3,
                      "head %d: mean %.9g", h, r.heads[h].entropy_mean);
        ck_assert_msg(tu_close(r.heads[h].entropy_mean, r.ref_heads[h].mean, 0, 1e-9),
                      "mean %.17g vs %.17g", r.heads[h].entropy_mean, r.ref_heads[h].mean);
        ck_assert(r.heads[h].max_logit == plain[h].max_logit);
    }

    for (int h = 0; h < 2; h++)
        sink_set(&r, h, 1e30);
    run_check(&r, "sink of 1e30");
    for (int h = 0; h < 2; h++) {
        const stats_head *g = &r.heads[h];
        ck_assert_msg(g->entropy_max == 0.0 && g->entropy_norm_mean == 0.0 &&
                          g->collapsed_frac == 1.0 && g->rows_norm == g->rows && g->rows == 80,
                      "head %d: max %g norm %g collapsed %g", h, g->entropy_max,
                      g->entropy_norm_mean, g->collapsed_frac);
        ck_assert(g->max_logit == plain[h].max_logit);
    }

    for (int h = 0; h < 2; h++)
        sink_set(&r, h, -1e30);
    run_check(&r, "sink of -1e30");
    for (int h = 0; h < 2; h++) {
        ck_assert(tu_close(r.heads[h].entropy_mean, plain[h].entropy_mean, 1e-15, 1e-12));
        ck_assert_msg(r.heads[h].entropy_norm_mean < plain[h].entropy_norm_mean * (1 - 1e-4),
                      "head %d: normalised %.9g, without the sink %.9g", h,
                      r.heads[h].entropy_norm_mean, plain[h].entropy_norm_mean);
    }
    run_free(&r);
}
END_TEST

/* Every visible key with one logit c and a sink of c: n_i + 1 equal outcomes, so H_i = ln(n_i + 1)
 * and the normalised mean is 1 (to 1e-9: the sink is c rounded to float32); causal row 0 sees one
 * key and still has a defined normalised entropy. */
START_TEST(test_sinks_uniform)
{
    reseed(__LINE__, _i);
    cfg c = {1, 2, 1, 30, 30, 64, STATS_F32, TU_BHND, 1, -1, -1, 0, 0, 0, 0, 0, 1, 0};
    run r;
    run_setup(&r, &c);
    for (int64_t h = 0; h < 2; h++)
        for (int64_t i = 1; i < 30; i++)
            for (int64_t e = 0; e < 64; e++)
                tu_set(&r.q, 0, h, i, e, tu_at(&r.q, 0, h, 0)[e]);
    for (int64_t j = 1; j < 30; j++)
        for (int64_t e = 0; e < 64; e++)
            tu_set(&r.k, 0, 0, j, e, tu_at(&r.k, 0, 0, 0)[e]);
    run_sinks(&r, STATS_F32, 0, 1);
    for (int h = 0; h < 2; h++) {
        double dot = 0;
        for (int e = 0; e < 64; e++)
            dot += tu_at(&r.q, 0, h, 0)[e] * tu_at(&r.k, 0, 0, 0)[e];
        sink_set(&r, h, dot / 8.0);
    }
    run_check(&r, "uniform with sinks");
    for (int h = 0; h < 2; h++) {
        for (int64_t i = 0; i < 30; i++) {
            double want = log((double)(i + 2)); /* i + 1 keys and the sink */
            float got = r.rent[h * 30 + i];
            ck_assert_msg(fabs(got - want) <= 1e-6 * (1 + want), "head %d row %lld: %.9g vs "
                          "ln(%lld)", h, (long long)i, (double)got, (long long)(i + 2));
        }
        ck_assert_msg(fabs(r.heads[h].entropy_norm_mean - 1.0) < 1e-9, "norm mean %.15g",
                      r.heads[h].entropy_norm_mean);
        ck_assert_int_eq(r.heads[h].rows_norm, 30);
    }
    run_free(&r);
}
END_TEST

/* A sinks dtype that is not a logit's is refused, naming it; sinks of each float dtype pass. */
START_TEST(test_sinks_bad_dtype)
{
    reseed(__LINE__, _i);
    cfg c = {2, 2, 2, 3, 3, 32, STATS_F32, TU_BHND, 0, -1, -1, 0, 0, 0, 0, 0, 1, 0};
    run r;
    run_setup(&r, &c);
    run_sinks(&r, STATS_F32, 0.5, 1);
    stats_error err;
    ck_assert_int_eq(stats_cpu(&r.p, r.heads, NULL, NULL, &err), STATS_OK);
    static const struct {
        int dt;
        const char *needle;
    } bad[] = {{STATS_BOOL, "sinks dtype 3"}, {-1, "sinks dtype -1"}, {9, "sinks dtype 9"}};
    for (int i = 0; i < 3; i++) {
        r.p.sinks_dtype = (stats_dtype)bad[i].dt;
        memset(&err, 0x5a, sizeof err);
        ck_assert_int_eq(stats_cpu(&r.p, r.heads, NULL, NULL, &err), STATS_EINVAL);
        ck_assert_msg(strstr(err.msg, bad[i].needle), "message '%s' lacks '%s'", err.msg,
                      bad[i].needle);
    }
    run_free(&r);
}
END_TEST

static Suite *sinks_suite(void)
{
    Suite *s = suite_create("stats_cpu_sinks");
    TCase *tc = tcase_create("sinks");
    tcase_set_timeout(tc, 120);
    tcase_add_loop_test(tc, test_sinks_random, 0, (int)(sizeof sink_cases / sizeof sink_cases[0]));
    tcase_add_loop_test(tc, test_sinks_ninf_is_none, 0, 2);
    tcase_add_loop_test(tc, test_sinks_nonfinite, 0, 3);
    tcase_add_test(tc, test_sinks_dominate);
    tcase_add_test(tc, test_sinks_uniform);
    tcase_add_test(tc, test_sinks_bad_dtype);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    g_seed = tu_seed();
    SRunner *sr = srunner_create(sinks_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
