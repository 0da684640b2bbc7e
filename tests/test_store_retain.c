/* test_store_retain.c — Check suite for the store's upkeep (schema/store_retain.h): compaction
 * within its budget, downsampling by age (buckets equal to a direct computation from the samples
 * they merged, alerts and their rows kept, trend and grid reading the buckets), downsampling by
 * size (the database's limit, oldest first across runs; a run's own limit), deleting a run a
 * budget at a time, and a sample pushed again after its window was downsampled.
 *
 * Random data comes from a seed printed at start (ATTNSTAT_TEST_SEED=<n> replays a run). Every test
 * works in its own temporary directory.
 */
#include "store_pack.h"
#include "store_retain.h"
#include "store_testutil.h"

/* Push steps [0, nsteps) of run: `layers` layers of `heads` heads (layer 1 has one head fewer on
 * odd steps); time t0 + 10 * step. */
static void fill(store *st, int64_t run, int64_t nsteps, int layers, int heads, int64_t t0)
{
    store_error err = {0};
    stats_head hs[64];
    for (int64_t s = 0; s < nsteps; s++) {
        for (int l = 0; l < layers; l++) {
            for (int h = 0; h < heads; h++)
                hs[h] = rand_head(1);
            int nh = (l == 1 && s % 2) ? heads - 1 : heads;
            ck_assert_int_eq(store_add_samples(st, run, s, l, hs, nh, t0 + 10 * s, &err),
                             STORE_OK);
        }
        if (s % 50 == 49)
            ck_assert_int_eq(store_commit(st, &err), STORE_OK);
    }
    ck_assert_int_eq(store_commit(st, &err), STORE_OK);
}

static void retain_all(store *st, const store_retention *p, int64_t budget,
                       store_retain_report *total)
{
    store_error err = {0};
    store_retain_report rep;
    memset(total, 0, sizeof *total);
    for (int calls = 0;; calls++) {
        ck_assert_msg(store_retain_step(st, p, budget, &rep, &err) == STORE_OK, "%s", err.msg);
        total->compacted += rep.compacted;
        total->downsampled += rep.downsampled;
        total->buckets += rep.buckets;
        total->kept += rep.kept;
        total->used_bytes = rep.used_bytes;
        total->over_limit |= rep.over_limit;
        if (!rep.more)
            break;
        ck_assert_msg(calls < 5000, "the retention step never finishes");
    }
}

/* A run's size estimate computed again from its rows (what runs.bytes must say). */
static int64_t est_bytes(int64_t run)
{
    char sql[512];
    snprintf(sql, sizeof sql,
             "SELECT (SELECT count(*) FROM samples WHERE run_id = %1$" PRId64 ") * 110 + "
             "(SELECT coalesce(sum(length(data) + 40), 0) FROM history WHERE run_id = %1$" PRId64
             ") + (SELECT coalesce(sum(length(merged) + length(lo) + length(mean) + length(hi) + "
             "40), 0) FROM coarse WHERE run_id = %1$" PRId64 ")", run);
    return raw_int(dbpath, sql);
}

static int64_t run_field(store *st, int64_t run, int which)
{
    rows_vec v = {0};
    store_error err = {0};
    ck_assert_int_eq(store_get_run(st, run, collect_run, &v, &err), STORE_OK);
    return which == 0 ? v.runs[0].samples : which == 1 ? v.runs[0].bytes : v.runs[0].retain_bytes;
}

/* Rows with their buckets' extremes copied (store_sample.min / .max live only during the call). */
typedef struct {
    store_sample *v;
    stats_head *lo, *hi;
    int n, cap;
} bucket_vec;

static int collect_bucket(void *ctx, const store_sample *s)
{
    bucket_vec *b = ctx;
    if (b->n == b->cap) {
        b->cap = b->cap ? 2 * b->cap : 256;
        b->v = realloc(b->v, (size_t)b->cap * sizeof *b->v);
        b->lo = realloc(b->lo, (size_t)b->cap * sizeof *b->lo);
        b->hi = realloc(b->hi, (size_t)b->cap * sizeof *b->hi);
        ck_assert(b->v && b->lo && b->hi);
    }
    b->v[b->n] = *s;
    b->lo[b->n] = s->min ? *s->min : s->stats;
    b->hi[b->n] = s->max ? *s->max : s->stats;
    b->n++;
    return 0;
}

static void bucket_vec_free(bucket_vec *b)
{
    free(b->v);
    free(b->lo);
    free(b->hi);
}

/* ---- compaction ------------------------------------------------------------------------------- */

START_TEST(test_compaction_budget)
{
    store *st = open_ok(dbpath);
    int64_t run = begin_run(st, "compact", 0);
    store_error err = {0};
    int layers = (int)rnd_range(2, 5), heads = (int)rnd_range(2, 9);
    int64_t nsteps = rnd_range(80, 200);
    fill(st, run, nsteps, layers, heads, 1000);
    int64_t count = run_field(st, run, 0), bytes0 = run_field(st, run, 1);
    ck_assert_int_eq(bytes0, count * 110);
    /* a batch open on the handle: refused, the batch untouched */
    stats_head h = rand_head(0);
    ck_assert_int_eq(store_add_samples(st, run, nsteps, 0, &h, 1, 0, &err), STORE_OK);
    ck_assert_int_eq(store_retain_step(st, NULL, 0, NULL, &err), STORE_EINVAL);
    ck_assert_msg(strstr(err.msg, "commit"), "%s", err.msg);
    ck_assert_int_eq(store_pending(st), 1);
    ck_assert_int_eq(store_commit(st, &err), STORE_OK);
    count++;
    store_retention bad = {.bucket_steps = 1};
    ck_assert_int_eq(store_retain_step(st, &bad, 0, NULL, &err), STORE_EINVAL);

    int64_t e = rnd_range(3, 20), budget = rnd_range(1, 3 * layers * heads);
    store_retention p = {.exact_steps = e};
    store_retain_report rep;
    int64_t moved = 0, per_step = (int64_t)layers * heads;
    int calls = 0;
    do {
        ck_assert_int_eq(store_retain_step(st, &p, budget, &rep, &err), STORE_OK);
        /* whole steps, stopping at the first step boundary after the budget */
        ck_assert_int_le(rep.compacted, budget - 1 + per_step);
        ck_assert_int_gt(rep.used_bytes, 0);
        ck_assert_int_ge(rep.lock_us, 0);
        moved += rep.compacted;
        ck_assert_msg(++calls < 5000, "the retention step never finishes");
    } while (rep.more);
    ck_assert_int_gt(calls, 1);
    /* the exact tier keeps the steps from the aligned block boundary on (the latest is nsteps) */
    char sql[128];
    snprintf(sql, sizeof sql, "SELECT min(step) FROM samples WHERE run_id = %" PRId64, run);
    ck_assert_int_eq(raw_int(dbpath, sql), compact_cutoff(nsteps, e));
    ck_assert_int_le(compact_cutoff(nsteps, e), nsteps - e);
    ck_assert_int_gt(compact_cutoff(nsteps, e), nsteps - 2 * e);
    ck_assert_int_eq(moved + raw_int(dbpath, "SELECT count(*) FROM samples"), count);
    ck_assert_int_eq(run_field(st, run, 0), count); /* compaction changes no count */
    ck_assert_int_lt(run_field(st, run, 1), bytes0);
    ck_assert_int_eq(run_field(st, run, 1), est_bytes(run));
    /* nothing left: a call does nothing */
    ck_assert_int_eq(store_retain_step(st, &p, budget, &rep, &err), STORE_OK);
    ck_assert_int_eq(rep.compacted, 0);
    ck_assert_int_eq(rep.more, 0);
    /* never compacting */
    store_retention never = {.exact_steps = -1, .retain_ms = 1, .retain_bytes = 1};
    ck_assert_int_eq(store_retain_step(st, &never, 0, &rep, &err), STORE_OK);
    ck_assert(rep.compacted == 0 && rep.downsampled == 0);
    ck_assert_int_eq(store_integrity_check(st, &err), STORE_OK);
    store_close(st);
}
END_TEST

/* ---- downsampling by age ---------------------------------------------------------------------- */

enum { A_LAYERS = 3, A_HEADS = 4, A_STEPS = 240 };

typedef struct {
    int have[A_STEPS][A_LAYERS][A_HEADS];
    stats_head h[A_STEPS][A_LAYERS][A_HEADS]; /* as the compact tier read them */
    int kept[A_STEPS][A_LAYERS];
} amodel;

static int collect_into_model(void *ctx, const store_sample *s)
{
    amodel *m = ctx;
    ck_assert_int_ne(s->tier, STORE_TIER_BUCKET);
    m->have[s->step][s->layer][s->head] = 1;
    m->h[s->step][s->layer][s->head] = s->stats;
    return 0;
}

/* The i-th statistic / count of vocab.h's rows (store_pack.h). */
enum { NF = VOCAB_NSTATS, NC = VOCAB_NCOUNTS };

static double fieldv(const stats_head *h, int i)
{
    return store_stat_get(h, i);
}

static int64_t countv(const stats_head *h, int i)
{
    return *store_count((stats_head *)h, i);
}

/* The bucket of (layer, head) over [lo, hi] computed directly from the model, as it reads back. */
static int64_t direct_bucket(const amodel *m, int l, int h, int64_t lo, int64_t hi,
                             stats_head *mn, stats_head *mean, stats_head *mx)
{
    int64_t n = 0, cnt[NF] = {0}, csum[NC] = {0}, clo[NC] = {0}, chi[NC] = {0};
    double sum[NF] = {0}, vlo[NF] = {0}, vhi[NF] = {0};
    int32_t slo = 0, shi = 0;
    for (int64_t s = lo; s <= hi; s++) {
        if (!m->have[s][l][h] || m->kept[s][l])
            continue;
        const stats_head *x = &m->h[s][l][h];
        for (int i = 0; i < NF; i++) {
            double v = fieldv(x, i);
            if (!isfinite(v))
                continue;
            vlo[i] = cnt[i] == 0 || v < vlo[i] ? v : vlo[i];
            vhi[i] = cnt[i] == 0 || v > vhi[i] ? v : vhi[i];
            sum[i] += v;
            cnt[i]++;
        }
        for (int i = 0; i < NC; i++) {
            int64_t v = countv(x, i);
            clo[i] = n == 0 || v < clo[i] ? v : clo[i];
            chi[i] = n == 0 || v > chi[i] ? v : chi[i];
            csum[i] += v;
        }
        slo = n == 0 || x->sampled < slo ? x->sampled : slo;
        shi = n == 0 || x->sampled > shi ? x->sampled : shi;
        n++;
    }
    if (!n)
        return 0;
    for (int i = 0; i < NF; i++) {
        *store_stat(mn, i) = cnt[i] ? vlo[i] : NAN;
        *store_stat(mean, i) = cnt[i] ? sum[i] / (double)cnt[i] : NAN;
        *store_stat(mx, i) = cnt[i] ? vhi[i] : NAN;
    }
    for (int i = 0; i < NC; i++) {
        *store_count(mn, i) = clo[i];
        *store_count(mean, i) = llround((double)csum[i] / (double)n);
        *store_count(mx, i) = chi[i];
    }
    mn->sampled = slo;
    mean->sampled = shi;
    mx->sampled = shi;
    store_pack_round(mn);
    store_pack_round(mean);
    store_pack_round(mx);
    return n;
}

START_TEST(test_downsample_age)
{
    static amodel m;
    memset(&m, 0, sizeof m);
    store *st = open_ok(dbpath);
    int64_t run = begin_run(st, "age", 0);
    store_error err = {0};
    fill(st, run, A_STEPS, A_LAYERS, A_HEADS, 100000);
    /* alerts at a few old steps: their rows stay at full resolution */
    for (int a = 0; a < 6; a++) {
        int64_t s = rnd_range(0, A_STEPS / 2);
        int l = (int)rnd_range(0, A_LAYERS - 1);
        store_alert al = {.run_id = run, .layer = l, .head = (int32_t)rnd_range(0, A_HEADS - 1),
                          .step = s, .rule = "entropy_floor", .state = STORE_ALERT_RAISED,
                          .value = 0.01, .threshold = 0.1, .time_ms = 5};
        ck_assert_int_eq(store_add_alert(st, &al, &err), STORE_OK);
        m.kept[s][l] = 1;
    }
    ck_assert_int_eq(store_commit(st, &err), STORE_OK);
    int64_t count = run_field(st, run, 0);
    /* compact everything first and read the compact values: the samples buckets will merge */
    store_retention p = {.exact_steps = 10};
    store_retain_report tot;
    retain_all(st, &p, 0, &tot);
    for (int l = 0; l < A_LAYERS; l++)
        ck_assert_int_eq(store_trend(st, run, l, -1, 0, A_STEPS, 1, collect_into_model, &m, &err),
                         STORE_OK);
    /* downsample what is older than the time of step `age_step` */
    int64_t w = rnd_range(5, 20), age_step = rnd_range(A_STEPS / 3, A_STEPS - 20);
    p.bucket_steps = w;
    p.retain_ms = rnd_range(1000, 5000);
    p.now_ms = 100000 + 10 * age_step + p.retain_ms;
    retain_all(st, &p, rnd_range(20, 400), &tot);
    ck_assert_int_gt(tot.buckets, 0);
    /* windows wholly older than the cutoff and wholly below the exact tier's first step: a
     * prefix of the run */
    int64_t hot_min = compact_cutoff(A_STEPS - 1, 10), done_hi = -1;
    for (int64_t lo = 0; lo + w - 1 < hot_min && lo + w - 1 < age_step; lo += w)
        done_hi = lo + w - 1;
    ck_assert_int_ge(done_hi, 0);
    int64_t seen = 0, kept_rows = 0;
    for (int l = 0; l < A_LAYERS; l++) {
        bucket_vec v = {0};
        ck_assert_int_eq(store_trend(st, run, l, -1, INT64_MIN, INT64_MAX, 1, collect_bucket, &v,
                                     &err), STORE_OK);
        int idx = 0;
        for (int64_t lo = 0; lo <= done_hi; lo += w) {
            for (int h = 0; h < A_HEADS; h++) { /* the bucket row of each head */
                stats_head mn, mean, mx;
                int64_t n = direct_bucket(&m, l, h, lo, lo + w - 1, &mn, &mean, &mx);
                if (!n)
                    continue;
                ck_assert_int_lt(idx, v.n);
                const store_sample *s = &v.v[idx++];
                char where[80];
                snprintf(where, sizeof where, "layer %d head %d window %" PRId64, l, h, lo);
                ck_assert_msg(s->tier == STORE_TIER_BUCKET && s->step == lo &&
                                  s->step_last == lo + w - 1 && s->head == h,
                              "%s: tier %d step %" PRId64 " head %d", where, s->tier, s->step,
                              s->head);
                ck_assert_int_eq(s->merged, n);
                seen += n;
                ck_assert_ptr_nonnull(s->min); /* copied by collect_bucket during the call */
                assert_same_head(&s->stats, &mean, where);
                assert_same_head(&v.lo[idx - 1], &mn, where);
                assert_same_head(&v.hi[idx - 1], &mx, where);
            }
            for (int64_t ks = lo; ks < lo + w; ks++) /* rows alerts kept, after the bucket */
                if (m.kept[ks][l]) {
                    kept_rows++;
                    for (int h = 0; h < A_HEADS; h++)
                        if (m.have[ks][l][h]) {
                            ck_assert_int_lt(idx, v.n);
                            const store_sample *s = &v.v[idx++];
                            ck_assert(s->tier == STORE_TIER_COMPACT && s->step == ks &&
                                      s->head == h);
                            assert_same_head(&s->stats, &m.h[ks][l][h], "kept");
                            seen++;
                        }
                }
        }
        /* then full resolution, as it read before */
        for (int64_t fs = done_hi + 1; fs < A_STEPS; fs++)
            for (int h = 0; h < A_HEADS; h++)
                if (m.have[fs][l][h]) {
                    ck_assert_int_lt(idx, v.n);
                    const store_sample *s = &v.v[idx++];
                    ck_assert(s->step == fs && s->head == h && s->tier != STORE_TIER_BUCKET);
                    assert_same_head(&s->stats, &m.h[fs][l][h], "full resolution");
                    seen++;
                }
        ck_assert_int_eq(idx, v.n);
        bucket_vec_free(&v);
    }
    ck_assert_int_eq(tot.kept, kept_rows);
    ck_assert_int_eq(seen, count); /* every sample once: in a bucket or at full resolution */
    ck_assert_int_eq(run_field(st, run, 0), count);
    ck_assert_int_eq(run_field(st, run, 1), est_bytes(run));
    /* alerts untouched */
    int64_t na = 0;
    ck_assert_int_eq(store_alerts(st, run, 0, count_alert, &na, &err), STORE_OK);
    ck_assert_int_eq(na, 6);
    /* the grid of a downsampled step (not an alert's): every layer's buckets */
    int64_t gs = rnd_range(0, done_hi);
    int any_kept = 0;
    for (int l = 0; l < A_LAYERS; l++)
        any_kept |= m.kept[gs][l];
    samples_vec g = {0};
    ck_assert_int_eq(store_grid(st, run, gs, NULL, collect_sample, &g, &err), STORE_OK);
    for (int i = 0; i < g.n && !any_kept; i++)
        ck_assert(g.v[i].tier == STORE_TIER_BUCKET && g.v[i].step <= gs &&
                  g.v[i].step_last >= gs);
    ck_assert_int_ge(g.n, any_kept ? 1 : A_LAYERS * (A_HEADS - 1));
    free(g.v);
    /* thinning counts a bucket as one step: every 2nd over [0, done_hi] of one head */
    samples_vec t = {0};
    ck_assert_int_eq(store_trend(st, run, 0, 0, 0, done_hi, 2, collect_sample, &t, &err),
                     STORE_OK);
    int64_t entries = 0;
    for (int64_t lo = 0; lo <= done_hi; lo += w)
        for (int64_t s = lo; s < lo + w; s++)
            entries += (s == lo) + m.kept[s][0];
    ck_assert_int_eq(t.n, (entries + 1) / 2);
    free(t.v);
    /* a sample pushed again after its window was downsampled: stored, read beside the bucket */
    stats_head again = rand_head(0);
    ck_assert_int_eq(store_add_samples(st, run, 1, 2, &again, 1, 0, &err), STORE_OK);
    ck_assert_int_eq(store_commit(st, &err), STORE_OK);
    retain_all(st, &p, 0, &tot);
    samples_vec one = {0};
    ck_assert_int_eq(store_trend(st, run, 2, 0, 1, 1, 1, collect_sample, &one, &err), STORE_OK);
    ck_assert_int_eq(one.n, 2); /* the bucket of [0, w-1] and the sample */
    ck_assert_int_eq(one.v[0].tier, STORE_TIER_BUCKET);
    ck_assert(one.v[1].tier == STORE_TIER_COMPACT && one.v[1].step == 1);
    stats_head want = again;
    store_pack_round(&want);
    assert_same_head(&one.v[1].stats, &want, "pushed again");
    free(one.v);
    ck_assert_int_eq(store_integrity_check(st, &err), STORE_OK);
    store_close(st);
}
END_TEST

/* ---- downsampling by size --------------------------------------------------------------------- */

static int64_t coarse_upto(int64_t run)
{
    char sql[96];
    snprintf(sql, sizeof sql, "SELECT coalesce(coarse_upto, -1) FROM runs WHERE id = %" PRId64,
             run);
    return raw_int(dbpath, sql);
}

START_TEST(test_downsample_size)
{
    store *st = open_ok(dbpath);
    int64_t a = begin_run(st, "older", 0), b = begin_run(st, "newer", 0);
    store_error err = {0};
    int64_t nsteps = rnd_range(300, 400);
    fill(st, a, nsteps, 3, 32, 1000);          /* older samples */
    fill(st, b, nsteps, 3, 32, 1000 + 100000); /* newer ones */
    store_retention p = {.exact_steps = 8, .bucket_steps = 20};
    store_retain_report tot;
    retain_all(st, &p, 0, &tot); /* compact, no limit */
    ck_assert_int_eq(tot.downsampled, 0);
    int64_t used = tot.used_bytes;
    ck_assert_int_gt(used, 0);
    /* a limit a little under the size: the older run's oldest windows go first */
    p.retain_bytes = used - used / 20;
    retain_all(st, &p, rnd_range(500, 5000), &tot);
    ck_assert_int_gt(tot.downsampled, 0);
    ck_assert_msg(tot.used_bytes <= p.retain_bytes, "%" PRId64 " bytes in use over a limit of %"
                  PRId64, tot.used_bytes, p.retain_bytes);
    ck_assert_int_eq(tot.over_limit, 0);
    ck_assert_int_gt(coarse_upto(a), 0);
    ck_assert_int_eq(coarse_upto(b), -1);
    /* a limit nothing can meet: everything the compaction passed is downsampled, the newest
     * steps stay, and the report says the limit is not met */
    p.retain_bytes = 1;
    retain_all(st, &p, 0, &tot);
    ck_assert_int_eq(tot.over_limit, 1);
    ck_assert_int_gt(coarse_upto(b), 0);
    samples_vec v = {0};
    int64_t used_step = 0;
    ck_assert_int_eq(store_grid(st, b, STORE_STEP_LATEST, &used_step, collect_sample, &v, &err),
                     STORE_OK);
    ck_assert_int_eq(used_step, nsteps - 1);
    ck_assert_int_eq(v.v[0].tier, STORE_TIER_EXACT);
    free(v.v);
    store_close(st);
}
END_TEST

START_TEST(test_downsample_run_limit)
{
    store *st = open_ok(dbpath);
    int64_t a = begin_run(st, "capped", 0), b = begin_run(st, "free", 0);
    store_error err = {0};
    fill(st, a, 300, 2, 16, 1000);
    fill(st, b, 300, 2, 16, 1000);
    store_retention p = {.exact_steps = 5, .bucket_steps = 10};
    store_retain_report tot;
    retain_all(st, &p, 0, &tot);
    int64_t bytes_a = run_field(st, a, 1), bytes_b = run_field(st, b, 1);
    ck_assert_int_gt(bytes_a, 0);
    ck_assert_int_eq(run_field(st, a, 2), -1);
    int64_t limit = bytes_a / 2;
    ck_assert_int_eq(store_run_set_retention(st, a, -1, limit, &err), STORE_OK);
    ck_assert_int_eq(run_field(st, a, 2), limit);
    ck_assert_int_eq(store_run_set_retention(st, a + b + 10, -1, 5, &err), STORE_NOTFOUND);
    retain_all(st, &p, rnd_range(100, 3000), &tot);
    ck_assert_int_le(run_field(st, a, 1), limit);
    ck_assert_int_eq(run_field(st, a, 1), est_bytes(a));
    ck_assert_int_gt(coarse_upto(a), 0);
    ck_assert_int_eq(coarse_upto(b), -1); /* the other run keeps full resolution */
    ck_assert_int_eq(run_field(st, b, 1), bytes_b);
    /* the limit given back to the policy (none): nothing more happens */
    ck_assert_int_eq(store_run_set_retention(st, a, -1, -1, &err), STORE_OK);
    ck_assert_int_eq(run_field(st, a, 2), -1);
    store_retain_report rep;
    ck_assert_int_eq(store_retain_step(st, &p, 0, &rep, &err), STORE_OK);
    ck_assert_int_eq(rep.downsampled, 0);
    /* a run's own age limit */
    ck_assert_int_eq(store_run_set_retention(st, b, 1000, -1, &err), STORE_OK);
    p.now_ms = 1000 + 10 * 100 + 1000; /* steps below 100 are older than 1000 ms */
    retain_all(st, &p, 0, &tot);
    ck_assert_int_gt(tot.downsampled, 0);
    ck_assert_int_eq(coarse_upto(b), 100);
    store_close(st);
}
END_TEST

/* ---- deleting a run --------------------------------------------------------------------------- */

static int sum_merged(void *ctx, const store_sample *s)
{
    *(int64_t *)ctx += s->merged;
    return 0;
}

static int64_t rows_of(const char *table, int64_t run)
{
    char sql[128];
    snprintf(sql, sizeof sql, "SELECT count(*) FROM %s WHERE run_id = %" PRId64, table, run);
    return raw_int(dbpath, sql);
}

START_TEST(test_delete_run)
{
    store *st = open_ok(dbpath);
    int64_t a = begin_run(st, "doomed", 0), b = begin_run(st, "kept", 0);
    store_error err = {0};
    fill(st, a, 200, 3, 8, 1000);
    fill(st, b, 50, 2, 4, 1000);
    for (int i = 0; i < 5; i++) {
        store_alert al = {.run_id = i % 2 ? a : b, .layer = 0, .head = i, .step = i,
                          .rule = "nonfinite", .state = STORE_ALERT_RAISED, .value = 1};
        ck_assert_int_eq(store_add_alert(st, &al, &err), STORE_OK);
    }
    ck_assert_int_eq(store_commit(st, &err), STORE_OK);
    store_retention p = {.exact_steps = 30, .retain_ms = 500, .bucket_steps = 10,
                         .now_ms = 1000 + 10 * 100 + 500};
    store_retain_report tot;
    retain_all(st, &p, 0, &tot);
    ck_assert(rows_of("samples", a) && rows_of("history", a) && rows_of("coarse", a));
    int64_t count_b = run_field(st, b, 0);
    int done = 0, calls = 0;
    int64_t budget = rnd_range(50, 400);
    while (!done) {
        ck_assert_msg(store_delete_run(st, a, budget, &done, &err) == STORE_OK, "%s", err.msg);
        calls++;
        ck_assert_int_lt(calls, 10000);
        if (!done) { /* still listed while it goes */
            rows_vec v = {0};
            ck_assert_int_eq(store_get_run(st, a, collect_run, &v, &err), STORE_OK);
        }
    }
    ck_assert_int_gt(calls, 2);
    ck_assert_int_eq(rows_of("samples", a) + rows_of("history", a) + rows_of("coarse", a), 0);
    ck_assert_int_eq(rows_of("alerts", a), 0);
    rows_vec v = {0};
    ck_assert_int_eq(store_get_run(st, a, collect_run, &v, &err), STORE_NOTFOUND);
    ck_assert_int_eq(store_delete_run(st, a, 0, &done, &err), STORE_NOTFOUND);
    stats_head h = rand_head(0);
    ck_assert_int_eq(store_add_samples(st, a, 1, 0, &h, 1, 0, &err), STORE_NOTFOUND);
    /* the other run is whole */
    ck_assert_int_eq(run_field(st, b, 0), count_b);
    ck_assert_int_eq(rows_of("alerts", b), 3);
    int64_t n = 0;
    ck_assert_int_eq(store_trend(st, b, 1, -1, INT64_MIN, INT64_MAX, 1, sum_merged, &n, &err),
                     STORE_OK);
    ck_assert_int_eq(n, 50 * 4 - 25); /* layer 1: a head fewer on odd steps */
    /* all at once */
    ck_assert_int_eq(store_delete_run(st, b, 0, &done, &err), STORE_OK);
    ck_assert_int_eq(done, 1);
    ck_assert_int_eq(raw_int(dbpath, "SELECT count(*) FROM runs"), 0);
    ck_assert_int_eq(raw_int(dbpath, "SELECT count(*) FROM samples"), 0);
    ck_assert_int_eq(store_integrity_check(st, &err), STORE_OK);
    store_close(st);
}
END_TEST

/* ---- runner ------------------------------------------------------------------------------------ */

static Suite *make_retain_suite(void)
{
    Suite *s = suite_create("store retention");
    TCase *tc = tcase_create("retention");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_compaction_budget);
    tcase_add_test(tc, test_downsample_age);
    tcase_add_test(tc, test_downsample_size);
    tcase_add_test(tc, test_downsample_run_limit);
    tcase_add_test(tc, test_delete_run);
    tcase_set_timeout(tc, 300);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    seed_init("test_store_retain");
    SRunner *sr = srunner_create(make_retain_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
