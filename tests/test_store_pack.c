/* test_store_pack.c — Check suite for the compact sample format (schema/store_pack.h): the
 * precision each field promises (checked against the bound the header states, not against the
 * code's own rounding), NaN / infinities / -0 / clamping, exact counts, times and head ids, random
 * rows decoded whole and one head at a time, the size per head, and damaged bytes (every
 * truncation, flipped bytes, trailing bytes) reported, never read past.
 *
 * Version 2's two new fields (sink_mass: UNIT16, distance: F32) at their precision; the layout rule
 * of each version against the lists the header writes out; version-1 rows built by hand from the
 * documented bytes (not by the encoder) decoded, their new fields NaN.
 *
 * Random data comes from a seed printed at start (ATTNSTAT_TEST_SEED=<n> replays a run).
 */
#include <float.h>

#include "store_pack.h"
#include "store_testutil.h"

/* ---- precision -------------------------------------------------------------------------------- */

static stats_head one_field(int field, double v)
{
    stats_head h = rand_head(0);
    double *f[9] = {&h.entropy_mean, &h.entropy_std, &h.entropy_min, &h.entropy_max,
                    &h.entropy_norm_mean, &h.collapsed_frac, &h.max_logit, &h.sink_mass,
                    &h.distance};
    *f[field] = v;
    return h;
}

static double get_field(const stats_head *h, int field)
{
    const double f[9] = {h->entropy_mean, h->entropy_std, h->entropy_min, h->entropy_max,
                         h->entropy_norm_mean, h->collapsed_frac, h->max_logit, h->sink_mass,
                         h->distance};
    return f[field];
}

/* Encode one head with field `field` = v, decode it, return what the field reads back as. */
static double pack_field(int field, double v)
{
    store_pack_head in = {.head = 0, .time_ms = 5, .s = one_field(field, v)}, out;
    uint8_t buf[256];
    size_t n = store_pack_encode(&in, 1, 5, buf);
    ck_assert_uint_le(n, store_pack_bound(1));
    ck_assert_int_eq(store_pack_count(buf, n), 1);
    ck_assert_int_eq(store_pack_decode(buf, n, 5, &out), 0);
    double got = get_field(&out.s, field);
    /* store_pack_round promises the same value */
    stats_head r = in.s;
    store_pack_round(&r);
    ck_assert_msg(same_double(get_field(&r, field), got), "field %d: round %.17g, decode %.17g",
                  field, get_field(&r, field), got);
    return got;
}

START_TEST(test_precision_binary32)
{
    const int fields[2] = {0, 6}; /* entropy_mean, max_logit */
    for (int k = 0; k < 2; k++) {
        int f = fields[k];
        for (int i = 0; i < 20000; i++) {
            /* magnitudes over the whole normal range of binary32, both signs */
            double x = ldexp(1 + rnd_unit(), (int)rnd_range(-125, 126)) * (rnd() & 1 ? -1 : 1);
            double got = pack_field(f, x);
            ck_assert_msg(fabs(got - x) <= ldexp(fabs(x), -24), "field %d: %.17g read %.17g", f,
                          x, got);
        }
        ck_assert(pack_field(f, INFINITY) == INFINITY);
        ck_assert(pack_field(f, -INFINITY) == -INFINITY);
        ck_assert(isnan(pack_field(f, NAN)));
        double z = pack_field(f, -0.0);
        ck_assert(z == 0 && !signbit(z)); /* -0.0 reads back as +0.0 */
        ck_assert(pack_field(f, 1e39) == INFINITY);
        ck_assert(pack_field(f, -1e300) == -INFINITY);
        ck_assert(pack_field(f, FLT_MAX) == FLT_MAX);
        /* just under the half-way point above FLT_MAX rounds down, at it rounds up */
        ck_assert(pack_field(f, 0x1.fffffefp127) == FLT_MAX);
        ck_assert(pack_field(f, 0x1.ffffffp127) == INFINITY);
        ck_assert(pack_field(f, 1.0) == 1.0);
    }
}
END_TEST

START_TEST(test_precision_fixed)
{
    /* entropy_std / min / max: absolute error <= 1/4096 nat over [0, 31.99] */
    for (int f = 1; f <= 3; f++) {
        for (int i = 0; i < 20000; i++) {
            double x = rnd_unit() * 31.99;
            if (i % 4 == 0)
                x = rnd_unit() * 1e-3; /* near zero, where a collapsed head sits */
            double got = pack_field(f, x);
            ck_assert_msg(fabs(got - x) <= 1.0 / 4096 + 1e-15, "field %d: %.17g read %.17g", f, x,
                          got);
        }
        ck_assert(pack_field(f, 0) == 0);
        ck_assert(pack_field(f, 21.5) == 21.5); /* ln(2^31), the largest entropy: 44032/2048 */
        ck_assert(pack_field(f, -1e-17) == 0);  /* clamped */
        ck_assert(pack_field(f, -INFINITY) == 0);
        ck_assert(pack_field(f, 40) == 65534.0 / 2048);
        ck_assert(pack_field(f, INFINITY) == 65534.0 / 2048);
        ck_assert(isnan(pack_field(f, NAN)));
    }
    /* the two fractions: absolute error <= 1/(2*65534) over [0, 1] */
    for (int f = 4; f <= 5; f++) {
        for (int i = 0; i < 20000; i++) {
            double x = rnd_unit();
            double got = pack_field(f, x);
            ck_assert_msg(fabs(got - x) <= 0.5 / 65534 + 1e-15, "field %d: %.17g read %.17g", f,
                          x, got);
        }
        ck_assert(pack_field(f, 0) == 0);
        ck_assert(pack_field(f, 1) == 1);
        ck_assert(pack_field(f, 0.5) == 0.5);
        ck_assert(pack_field(f, 1 + 1e-12) == 1);
        ck_assert(pack_field(f, -0.25) == 0);
        ck_assert(isnan(pack_field(f, NAN)));
        ck_assert(fabs(pack_field(f, 0.1) - 0.1) <= 0.5 / 65534); /* the default entropy floor */
    }
}
END_TEST

/* Version 2's fields: sink_mass (field 7) a fraction like the two above, distance (field 8) binary32
 * positions. */
START_TEST(test_precision_new_fields)
{
    for (int i = 0; i < 20000; i++) {
        double x = rnd_unit();
        double got = pack_field(7, x);
        ck_assert_msg(fabs(got - x) <= 0.5 / 65534 + 1e-15, "sink_mass %.17g read %.17g", x, got);
        double d = ldexp(1 + rnd_unit(), (int)rnd_range(-20, 31)); /* up to 2^32 positions */
        got = pack_field(8, d);
        ck_assert_msg(fabs(got - d) <= ldexp(d, -24), "distance %.17g read %.17g", d, got);
    }
    ck_assert(pack_field(7, 0) == 0);
    ck_assert(pack_field(7, 1) == 1);
    ck_assert(pack_field(7, 1.5) == 1);   /* clamped */
    ck_assert(pack_field(7, -0.25) == 0); /* clamped */
    ck_assert(pack_field(7, INFINITY) == 1);
    ck_assert(isnan(pack_field(7, NAN)));
    ck_assert(pack_field(8, 0) == 0 && !signbit(pack_field(8, -0.0))); /* -0.0 reads +0.0 */
    ck_assert(pack_field(8, 1e39) == INFINITY);
    ck_assert(pack_field(8, INFINITY) == INFINITY);
    ck_assert(pack_field(8, -INFINITY) == -INFINITY);
    ck_assert(pack_field(8, 4096.5) == 4096.5);
    ck_assert(isnan(pack_field(8, NAN)));
}
END_TEST

/* The rule (store_pack.h) against the layouts the header writes out for versions 1 and 2. */
START_TEST(test_layout_rule)
{
    long col[VOCAB_NSTATS];
    /* VOCAB_STATS order: mean std min max norm collapsed max_logit sink_mass distance */
    const long v1[9] = {0, 8, 10, 12, 14, 16, 4, -1, -1};
    const long v2[9] = {0, 12, 14, 16, 18, 20, 4, 22, 8};
    ck_assert_int_eq(VOCAB_NSTATS, 9);
    ck_assert_uint_eq(store_pack_layout(1, col), 18);
    for (int i = 0; i < 9; i++)
        ck_assert_msg(col[i] == v1[i], "version 1 field %d at %ld, not %ld", i, col[i], v1[i]);
    ck_assert_uint_eq(store_pack_layout(2, col), 24);
    for (int i = 0; i < 9; i++)
        ck_assert_msg(col[i] == v2[i], "version 2 field %d at %ld, not %ld", i, col[i], v2[i]);
    ck_assert_int_eq(STORE_PACK_VERSION, 2);
}
END_TEST

/* ---- version 1, by hand ------------------------------------------------------------------------ */

static size_t hand_varint(uint8_t *p, uint64_t v)
{
    size_t n = 0;
    for (; v >= 0x80; v >>= 7)
        p[n++] = (uint8_t)(v | 0x80);
    p[n++] = (uint8_t)v;
    return n;
}

static size_t hand_le(uint8_t *p, uint64_t v, int bytes)
{
    for (int i = 0; i < bytes; i++)
        p[i] = (uint8_t)(v >> (8 * i));
    return (size_t)bytes;
}

/* Rows written byte by byte from version 1's documented layout (f32 entropy_mean, f32 max_logit,
 * u16 entropy_std, min, max, norm_mean, collapsed_frac; sampled bits; zigzag counts; listed ids),
 * with the values each field must read as, decoded whole and one head at a time. */
START_TEST(test_version_1_by_hand)
{
    enum { CAP = 40 };
    static uint8_t buf[CAP * 64 + 64];
    for (int trial = 0; trial < 500; trial++) {
        int32_t n = (int32_t)rnd_range(1, CAP);
        int ids = rnd() & 1;
        float mean[CAP], logit[CAP];
        uint16_t u[5][CAP];
        int32_t head[CAP];
        int sampled[CAP];
        int64_t c[4] = {rnd_range(0, 1 << 20), rnd_range(0, 1000), rnd_range(0, 9),
                        -rnd_range(0, 3)}; /* a negative count: zigzag */
        int32_t id = ids ? (int32_t)rnd_range(0, 500) : 0;
        for (int32_t i = 0; i < n; i++) {
            mean[i] = (float)(rnd_unit() * 8);
            logit[i] = (float)((rnd_unit() - 0.3) * 200);
            if (rnd() % 9 == 0)
                logit[i] = -INFINITY;
            for (int k = 0; k < 5; k++)
                u[k][i] = rnd() % 11 == 0 ? 0xFFFF : (uint16_t)rnd_range(0, 65534);
            head[i] = id;
            id += ids ? (int32_t)rnd_range(1, 40) : 1;
            sampled[i] = (int)(rnd() & 1);
        }
        size_t o = 0;
        buf[o++] = 1;
        o += hand_varint(buf + o, (uint64_t)n);
        buf[o++] = ids ? 1 : 0;
        for (int32_t i = 0; i < n; i++) {
            uint32_t b;
            memcpy(&b, &mean[i], 4);
            o += hand_le(buf + o, b, 4);
        }
        for (int32_t i = 0; i < n; i++) {
            uint32_t b;
            memcpy(&b, &logit[i], 4);
            o += hand_le(buf + o, b, 4);
        }
        for (int k = 0; k < 5; k++)
            for (int32_t i = 0; i < n; i++)
                o += hand_le(buf + o, u[k][i], 2);
        size_t map = ((size_t)n + 7) / 8;
        memset(buf + o, 0, map);
        for (int32_t i = 0; i < n; i++)
            buf[o + (size_t)i / 8] |= (uint8_t)(sampled[i] << (i % 8));
        o += map;
        for (int k = 0; k < 4; k++)
            o += hand_varint(buf + o, c[k] >= 0 ? (uint64_t)c[k] * 2 : (uint64_t)(-c[k]) * 2 - 1);
        if (ids) {
            o += hand_varint(buf + o, (uint64_t)head[0]);
            for (int32_t i = 1; i < n; i++)
                o += hand_varint(buf + o, (uint64_t)(head[i] - head[i - 1] - 1));
        }
        static store_pack_head out[CAP];
        ck_assert_int_eq(store_pack_count(buf, o), n);
        ck_assert_int_eq(store_pack_decode(buf, o, 777, out), 0);
        for (int32_t i = 0; i < n; i++) {
            const double scale[5] = {2048, 2048, 2048, 65534, 65534};
            double want[5];
            for (int k = 0; k < 5; k++)
                want[k] = u[k][i] == 0xFFFF ? NAN : u[k][i] / scale[k];
            for (int pass = 0; pass < 2; pass++) {
                store_pack_head one, *g = &out[i];
                if (pass) {
                    ck_assert_int_eq(store_pack_decode_one(buf, o, 777, head[i], &one), 1);
                    g = &one;
                }
                ck_assert_int_eq(g->head, head[i]);
                ck_assert_int_eq(g->time_ms, 777);
                ck_assert(same_double(g->s.entropy_mean, (double)mean[i]));
                ck_assert(same_double(g->s.max_logit, (double)logit[i]));
                ck_assert(same_double(g->s.entropy_std, want[0]));
                ck_assert(same_double(g->s.entropy_min, want[1]));
                ck_assert(same_double(g->s.entropy_max, want[2]));
                ck_assert(same_double(g->s.entropy_norm_mean, want[3]));
                ck_assert(same_double(g->s.collapsed_frac, want[4]));
                ck_assert(isnan(g->s.sink_mass) && isnan(g->s.distance)); /* not in version 1 */
                ck_assert_int_eq(g->s.sampled, sampled[i]);
                ck_assert(g->s.rows == c[0] && g->s.rows_norm == c[1] &&
                          g->s.rows_empty == c[2] && g->s.nonfinite_rows == c[3]);
            }
        }
        /* one byte short, one byte over: refused */
        ck_assert_int_eq(store_pack_decode(buf, o - 1, 777, out), -1);
        buf[o] = 0;
        ck_assert_int_eq(store_pack_decode(buf, o + 1, 777, out), -1);
        /* the same heads written by today's encoder: version 2, the same values read back */
        static store_pack_head re[CAP], back[CAP];
        static uint8_t enc[CAP * 64 + 64];
        memcpy(re, out, (size_t)n * sizeof *re);
        size_t len = store_pack_encode(re, n, 777, enc);
        ck_assert_int_eq(enc[0], 2);
        ck_assert_int_eq(store_pack_decode(enc, len, 777, back), 0);
        for (int32_t i = 0; i < n; i++)
            assert_same_head(&back[i].s, &out[i].s, "version 1 re-encoded");
    }
}
END_TEST

/* ---- whole rows ------------------------------------------------------------------------------- */

static stats_head wild_head(void)
{
    stats_head h = rand_head(1);
    switch (rnd() % 6) { /* counts anywhere in int64 */
    case 0: h.rows = INT64_MAX; break;
    case 1: h.rows_empty = INT64_MIN; break;
    case 2: h.nonfinite_rows = -(int64_t)(rnd() >> 1); break;
    case 3: h.rows_norm = (int64_t)(rnd() >> 1); break;
    default: break;
    }
    h.sampled = (int32_t)(rnd() % 3) * (rnd() & 1 ? 7 : 1); /* 0, 1, 2, 7, 14: non-zero reads 1 */
    return h;
}

/* A random row: n heads, ids contiguous or not, counts and times shared or not. */
static int32_t rand_row(store_pack_head *v, int32_t cap, int64_t *row_time)
{
    int32_t n = (int32_t)rnd_range(1, cap);
    int ids = rnd() % 3 == 0, counts = rnd() % 3 == 0, times = rnd() % 3 == 0;
    *row_time = rnd() % 4 == 0 ? (int64_t)rnd() : 1700000000000 + rnd_range(0, 1 << 30);
    int64_t id = ids ? rnd_range(0, 1000) : 0;
    stats_head base = wild_head();
    for (int32_t i = 0; i < n; i++) {
        stats_head h = rand_head(1);
        if (!counts || rnd() % 4) {
            h.rows = base.rows;
            h.rows_norm = base.rows_norm;
            h.rows_empty = base.rows_empty;
            h.nonfinite_rows = base.nonfinite_rows;
        } else {
            stats_head w = wild_head();
            h.rows = w.rows;
            h.nonfinite_rows = w.nonfinite_rows;
        }
        h.sampled = (int32_t)(rnd() % 3);
        v[i].s = h;
        v[i].head = (int32_t)id;
        v[i].time_ms = times && rnd() % 3 == 0 ? (int64_t)rnd() : *row_time;
        id += ids ? rnd_range(1, 1 << 20) : 1;
        if (id > INT32_MAX)
            return i + 1;
    }
    if (ids && rnd() % 2)
        v[n - 1].head = INT32_MAX; /* the largest id there is */
    return n;
}

START_TEST(test_rows_round_trip)
{
    enum { CAP = 300 };
    static store_pack_head in[CAP], out[CAP];
    static uint8_t buf[CAP * 120];
    for (int trial = 0; trial < 3000; trial++) {
        int64_t t;
        int32_t n = rand_row(in, trial % 10 ? 80 : CAP, &t);
        ck_assert_uint_le(store_pack_bound(n), sizeof buf);
        size_t len = store_pack_encode(in, n, t, buf);
        ck_assert_uint_le(len, store_pack_bound(n));
        ck_assert_int_eq(store_pack_count(buf, len), n);
        ck_assert_int_eq(store_pack_decode(buf, len, t, out), 0);
        for (int32_t i = 0; i < n; i++) {
            stats_head want = in[i].s;
            store_pack_round(&want);
            ck_assert_int_eq(out[i].head, in[i].head);
            ck_assert_int_eq(out[i].time_ms, in[i].time_ms);
            ck_assert_int_eq(out[i].s.sampled, in[i].s.sampled != 0);
            char where[64];
            snprintf(where, sizeof where, "trial %d head %d of %d", trial, i, n);
            assert_same_head(&out[i].s, &want, where);
            /* one head at a time */
            store_pack_head one;
            ck_assert_int_eq(store_pack_decode_one(buf, len, t, in[i].head, &one), 1);
            ck_assert_int_eq(one.head, in[i].head);
            ck_assert_int_eq(one.time_ms, in[i].time_ms);
            assert_same_head(&one.s, &want, where);
        }
        /* heads the row does not have */
        store_pack_head one;
        if (in[0].head > 0)
            ck_assert_int_eq(store_pack_decode_one(buf, len, t, in[0].head - 1, &one), 0);
        if (in[n - 1].head < INT32_MAX)
            ck_assert_int_eq(store_pack_decode_one(buf, len, t, in[n - 1].head + 1, &one), 0);
        ck_assert_int_eq(store_pack_decode_one(buf, len, t, -1, &one), -1);
    }
}
END_TEST

START_TEST(test_row_size)
{
    /* The usual row: one push of 64 heads, ids 0..63, one time, the same counts. */
    static store_pack_head in[64];
    uint8_t buf[4096];
    stats_head base = rand_head(0);
    for (int i = 0; i < 64; i++) {
        in[i].head = i;
        in[i].time_ms = 1700000000000;
        in[i].s = rand_head(0);
        in[i].s.rows = base.rows;
        in[i].s.rows_norm = base.rows_norm;
        in[i].s.rows_empty = base.rows_empty;
        in[i].s.nonfinite_rows = base.nonfinite_rows;
    }
    size_t len = store_pack_encode(in, 64, 1700000000000, buf);
    /* version 2: 24 bytes (three f32, six u16) and a bit per head, a 3-byte header, the shared
     * counts (<= 40 bytes) */
    ck_assert_uint_le(len, 64 * 24 + 8 + 3 + 40);
    ck_assert_uint_ge(len, 64 * 24 + 8 + 3 + 4);
    fprintf(stderr, "  64 heads: %zu bytes (%.2f per head)\n", len, len / 64.0);
    /* one head whose counts differ costs its counts and a bitmap, not a copy per head */
    in[17].s.nonfinite_rows = base.nonfinite_rows + 3;
    size_t len2 = store_pack_encode(in, 64, 1700000000000, buf);
    ck_assert_uint_le(len2, len + 8 + 40);
}
END_TEST

/* ---- damaged bytes ---------------------------------------------------------------------------- */

START_TEST(test_damaged)
{
    enum { CAP = 40 };
    store_pack_head in[CAP], out[CAP + 1], one;
    uint8_t buf[CAP * 120 + 16], bad[CAP * 120 + 16];
    for (int trial = 0; trial < 300; trial++) {
        int64_t t;
        int32_t n = rand_row(in, CAP, &t);
        size_t len = store_pack_encode(in, n, t, buf);
        /* every truncation is refused; decoding reads only what it was given (ASan checks) */
        for (size_t cut = 0; cut < len; cut++) {
            uint8_t *copy = malloc(cut ? cut : 1);
            ck_assert_ptr_nonnull(copy);
            memcpy(copy, buf, cut);
            ck_assert_msg(store_pack_decode(copy, cut, t, out) == -1 ||
                              store_pack_count(copy, cut) != n,
                          "trial %d: a row cut to %zu of %zu bytes decoded", trial, cut, len);
            ck_assert_int_ne(store_pack_decode_one(copy, cut, t, in[0].head, &one), 1);
            free(copy);
        }
        /* a trailing byte, a wrong version */
        memcpy(bad, buf, len);
        bad[len] = 0;
        ck_assert_int_eq(store_pack_decode(bad, len + 1, t, out), -1);
        bad[0] = STORE_PACK_VERSION + 1;
        ck_assert_int_eq(store_pack_count(bad, len), -1);
        bad[0] = 0;
        ck_assert_int_eq(store_pack_count(bad, len), -1);
        /* flipped bytes: either refused or a row of valid shape; never a read past the end */
        for (int k = 0; k < 20; k++) {
            memcpy(bad, buf, len);
            bad[rnd() % len] ^= (uint8_t)(1 + rnd() % 255);
            int32_t c = store_pack_count(bad, len);
            if (c > 0 && c <= CAP + 1)
                (void)store_pack_decode(bad, len, t, out);
            (void)store_pack_decode_one(bad, len, t, (int32_t)(rnd() % 64), &one);
        }
    }
    ck_assert_int_eq(store_pack_count(NULL, 0), -1);
}
END_TEST

START_TEST(test_counts_list)
{
    int64_t v[50], w[51];
    uint8_t buf[50 * 10];
    for (int trial = 0; trial < 200; trial++) {
        int32_t n = (int32_t)rnd_range(1, 50);
        for (int32_t i = 0; i < n; i++)
            v[i] = rnd() % 2 ? rnd_range(1, 300) : (int64_t)(rnd() >> 1);
        size_t len = store_pack_counts_encode(v, n, buf);
        ck_assert_int_eq(store_pack_counts_decode(buf, len, w, n), 0);
        for (int32_t i = 0; i < n; i++)
            ck_assert_int_eq(w[i], v[i]);
        ck_assert_int_eq(store_pack_counts_decode(buf, len, w, n + 1), -1); /* too few */
        if (n > 1)
            ck_assert_int_eq(store_pack_counts_decode(buf, len, w, n - 1), -1); /* left over */
    }
}
END_TEST

static Suite *make_pack_suite(void)
{
    Suite *s = suite_create("store pack");
    TCase *tc = tcase_create("format");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_precision_binary32);
    tcase_add_test(tc, test_precision_fixed);
    tcase_add_test(tc, test_precision_new_fields);
    tcase_add_test(tc, test_layout_rule);
    tcase_add_test(tc, test_version_1_by_hand);
    tcase_add_test(tc, test_rows_round_trip);
    tcase_add_test(tc, test_row_size);
    tcase_add_test(tc, test_damaged);
    tcase_add_test(tc, test_counts_list);
    tcase_set_timeout(tc, 120);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    seed_init("test_store_pack");
    SRunner *sr = srunner_create(make_pack_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
