/* store_pack.c — the compact sample format, behind store_pack.h: field encodings (binary32, the
 * two fixed-point kinds), varints, the fixed columns' layout of each version (from vocab.h's rows),
 * and a row's encoding and decoding. Pure C and libc (math.h, string.h): no SQLite, no allocation.
 * Called by the store's compact tier (store_rows.c, store_retain.c) and the tests.
 *
 * How it works
 * - A row is parsed into a view (its version's layout, where each section starts) before anything
 *   is read from it, so every read is bounds-checked once: a damaged blob is reported, never read
 *   past its end.
 * - The fixed-size columns come first, so one head's values sit at fixed offsets; the variable
 *   tail (counts, ids, time exceptions) is walked in order.
 */
#include "store_pack.h"

#include <float.h>
#include <math.h>
#include <string.h>

enum { FLAG_IDS = 1, FLAG_COUNTS = 2, FLAG_TIMES = 4, FLAG_ALL = 7 };

/* Each statistic's encoding and first version, from its row. */
#define PACK_(name, unit, pack, since, ...) {pack, since},
static const struct {
    enum vocab_pack pack;
    int since;
} stat_pack[VOCAB_NSTATS] = {VOCAB_STATS(PACK_)};
#undef PACK_
/* A row of a version past the one written would never be stored: bump STORE_PACK_VERSION with it. */
#define SINCE_(name, unit, pack, since, ...)                                                      \
    _Static_assert(since >= 1 && since <= STORE_PACK_VERSION,                                     \
                   "VOCAB_STATS row " #name ": since is past STORE_PACK_VERSION (store_pack.h)");
VOCAB_STATS(SINCE_)
#undef SINCE_

/* ---- field encodings ------------------------------------------------------------------------ */

#define U16_NAN 0xFFFFu
#define U16_TOP 65534.0
#define ENT_SCALE 2048.0 /* 1/2048 nat */

static uint32_t f32_bits(double x)
{
    float f;
    if (isnan(x))
        return 0x7fc00000u;
    if (x == 0)
        f = 0.0f; /* -0.0 becomes +0.0 */
    else if (fabs(x) >= 0x1.ffffffp127) /* the half-way point above FLT_MAX rounds to infinity */
        f = x > 0 ? INFINITY : -INFINITY;
    else
        f = (float)x;
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static double f32_value(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return (double)f;
}

/* Fixed point with `scale` steps per unit over [0, U16_TOP / scale]; 0xFFFF is NaN. */
static uint16_t fix_bits(double x, double scale)
{
    if (isnan(x))
        return U16_NAN;
    double v = x * scale;
    if (!(v > 0))
        return 0;
    if (v >= U16_TOP)
        return (uint16_t)U16_TOP;
    return (uint16_t)floor(v + 0.5);
}

static double fix_value(uint16_t u, double scale)
{
    return u == U16_NAN ? NAN : (double)u / scale;
}

/* Steps per unit of a 16-bit encoding. */
static double fix_scale(enum vocab_pack p)
{
    return p == VOCAB_PACK_NAT16 ? ENT_SCALE : U16_TOP;
}

size_t store_pack_layout(int version, long col[VOCAB_NSTATS])
{
    long at = 0;
    for (int pass = 0; pass < 2; pass++) /* the F32 fields, then the 16-bit ones */
        for (int i = 0; i < VOCAB_NSTATS; i++) {
            int f32 = stat_pack[i].pack == VOCAB_PACK_F32;
            if (f32 != (pass == 0))
                continue;
            if (stat_pack[i].since > version) {
                col[i] = -1;
                continue;
            }
            col[i] = at;
            at += f32 ? 4 : 2;
        }
    return (size_t)at;
}

/* One field encoded (the bits of its column) and decoded. */
static uint32_t enc_field(int i, double x)
{
    enum vocab_pack p = stat_pack[i].pack;
    return p == VOCAB_PACK_F32 ? f32_bits(x) : fix_bits(x, fix_scale(p));
}

static double dec_field(int i, uint32_t u)
{
    enum vocab_pack p = stat_pack[i].pack;
    return p == VOCAB_PACK_F32 ? f32_value(u) : fix_value((uint16_t)u, fix_scale(p));
}

void store_pack_round(stats_head *h)
{
    for (int i = 0; i < VOCAB_NSTATS; i++)
        *store_stat(h, i) = dec_field(i, enc_field(i, *store_stat(h, i)));
    h->sampled = h->sampled != 0;
}

/* ---- bytes and varints ----------------------------------------------------------------------- */

static void put_u16(uint8_t *p, uint16_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}

static void put_u32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static uint16_t get_u16(const uint8_t *p)
{
    return (uint16_t)(p[0] | (p[1] << 8));
}

static uint32_t get_u32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static size_t put_varint(uint8_t *p, uint64_t v)
{
    size_t n = 0;
    while (v >= 0x80) {
        p[n++] = (uint8_t)(v | 0x80);
        v >>= 7;
    }
    p[n++] = (uint8_t)v;
    return n;
}

/* Read one varint at *p (before end); advances *p. -1 when it runs past end or over 64 bits. */
static int get_varint(const uint8_t **p, const uint8_t *end, uint64_t *v)
{
    uint64_t r = 0;
    for (int shift = 0; shift < 64; shift += 7) {
        if (*p >= end)
            return -1;
        uint8_t b = *(*p)++;
        if (shift == 63 && b > 1)
            return -1;
        r |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80)) {
            *v = r;
            return 0;
        }
    }
    return -1;
}

static uint64_t zig(int64_t v)
{
    return ((uint64_t)v << 1) ^ (uint64_t)(v >> 63);
}

static int64_t unzig(uint64_t u)
{
    return (int64_t)(u >> 1) ^ -(int64_t)(u & 1);
}

static size_t put_counts(uint8_t *p, const stats_head *h)
{
    size_t n = put_varint(p, zig(h->rows));
    n += put_varint(p + n, zig(h->rows_norm));
    n += put_varint(p + n, zig(h->rows_empty));
    n += put_varint(p + n, zig(h->nonfinite_rows));
    return n;
}

static int get_counts(const uint8_t **p, const uint8_t *end, int64_t c[4])
{
    for (int i = 0; i < 4; i++) {
        uint64_t u;
        if (get_varint(p, end, &u))
            return -1;
        c[i] = unzig(u);
    }
    return 0;
}

static int same_counts(const stats_head *a, const stats_head *b)
{
    return a->rows == b->rows && a->rows_norm == b->rows_norm && a->rows_empty == b->rows_empty &&
           a->nonfinite_rows == b->nonfinite_rows;
}

static int bit(const uint8_t *map, int32_t i)
{
    return (map[i >> 3] >> (i & 7)) & 1;
}

/* ---- encoding -------------------------------------------------------------------------------- */

size_t store_pack_bound(int32_t n)
{
    size_t un = n > 0 ? (size_t)n : 0, map = (un + 7) / 8;
    long col[VOCAB_NSTATS];
    size_t fixed = store_pack_layout(STORE_PACK_VERSION, col);
    /* header, columns, sampled, first counts, then per head: 4 counts, an id, a time */
    return 1 + 10 + 1 + un * fixed + map + 40 + map + un * 40 + un * 10 + map + un * 10;
}

size_t store_pack_encode(const store_pack_head *heads, int32_t n, int64_t row_time, uint8_t *out)
{
    size_t un = (size_t)n, map = (un + 7) / 8;
    uint8_t flags = 0;
    for (int32_t i = 0; i < n; i++) {
        if (heads[i].head != i)
            flags |= FLAG_IDS;
        if (!same_counts(&heads[i].s, &heads[0].s))
            flags |= FLAG_COUNTS;
        if (heads[i].time_ms != row_time)
            flags |= FLAG_TIMES;
    }
    long col_of[VOCAB_NSTATS];
    size_t fixed = store_pack_layout(STORE_PACK_VERSION, col_of);
    size_t o = 0;
    out[o++] = STORE_PACK_VERSION;
    o += put_varint(out + o, (uint64_t)n);
    out[o++] = flags;
    uint8_t *col = out + o;
    for (int32_t i = 0; i < n; i++) {
        const stats_head *h = &heads[i].s;
        size_t ui = (size_t)i;
        for (int f = 0; f < VOCAB_NSTATS; f++) {
            if (col_of[f] < 0)
                continue; /* a row newer than STORE_PACK_VERSION: not in this format yet */
            uint8_t *p = col + (size_t)col_of[f] * un;
            uint32_t bits = enc_field(f, store_stat_get(h, f));
            if (stat_pack[f].pack == VOCAB_PACK_F32)
                put_u32(p + 4 * ui, bits);
            else
                put_u16(p + 2 * ui, (uint16_t)bits);
        }
    }
    o += fixed * un;
    memset(out + o, 0, map);
    for (int32_t i = 0; i < n; i++)
        if (heads[i].s.sampled)
            out[o + (size_t)(i >> 3)] |= (uint8_t)(1u << (i & 7));
    o += map;
    o += put_counts(out + o, &heads[0].s);
    if (flags & FLAG_COUNTS) {
        uint8_t *bm = out + o;
        memset(bm, 0, map);
        o += map;
        for (int32_t i = 0; i < n; i++)
            if (!same_counts(&heads[i].s, &heads[0].s)) {
                bm[i >> 3] |= (uint8_t)(1u << (i & 7));
                o += put_counts(out + o, &heads[i].s);
            }
    }
    if (flags & FLAG_IDS) {
        o += put_varint(out + o, (uint64_t)heads[0].head);
        for (int32_t i = 1; i < n; i++)
            o += put_varint(out + o, (uint64_t)(heads[i].head - heads[i - 1].head - 1));
    }
    if (flags & FLAG_TIMES) {
        uint8_t *bm = out + o;
        memset(bm, 0, map);
        o += map;
        for (int32_t i = 0; i < n; i++)
            if (heads[i].time_ms != row_time) {
                bm[i >> 3] |= (uint8_t)(1u << (i & 7));
                o += put_varint(out + o, zig((int64_t)((uint64_t)heads[i].time_ms -
                                                       (uint64_t)row_time)));
            }
    }
    return o;
}

/* ---- decoding -------------------------------------------------------------------------------- */

typedef struct {
    int32_t n;
    uint8_t flags;
    long col_of[VOCAB_NSTATS]; /* the version's layout (store_pack_layout) */
    const uint8_t *col, *sampled, *tail, *end;
} view;

static int parse(const uint8_t *blob, size_t len, view *v)
{
    if (!blob || len < 3 || blob[0] < 1 || blob[0] > STORE_PACK_VERSION)
        return -1;
    size_t fixed = store_pack_layout(blob[0], v->col_of);
    const uint8_t *p = blob + 1, *end = blob + len;
    uint64_t n;
    if (get_varint(&p, end, &n) || n < 1 || n > INT32_MAX || p >= end)
        return -1;
    v->n = (int32_t)n;
    v->flags = *p++;
    if (v->flags & ~FLAG_ALL)
        return -1;
    if ((uint64_t)(end - p) / fixed < n) /* n * fixed would not fit (nor overflow) */
        return -1;
    size_t need = (size_t)n * fixed + ((size_t)n + 7) / 8;
    if ((size_t)(end - p) < need)
        return -1;
    v->col = p;
    v->sampled = p + (size_t)n * fixed;
    v->tail = v->sampled + ((size_t)n + 7) / 8;
    v->end = end;
    return 0;
}

/* The fixed-column values of the i-th head. */
static void read_fixed(const view *v, int32_t i, stats_head *h)
{
    size_t un = (size_t)v->n, ui = (size_t)i;
    for (int f = 0; f < VOCAB_NSTATS; f++) {
        if (v->col_of[f] < 0) {
            *store_stat(h, f) = NAN; /* a field this version does not carry */
            continue;
        }
        const uint8_t *p = v->col + (size_t)v->col_of[f] * un;
        *store_stat(h, f) = dec_field(f, stat_pack[f].pack == VOCAB_PACK_F32
                                             ? get_u32(p + 4 * ui)
                                             : get_u16(p + 2 * ui));
    }
    h->sampled = bit(v->sampled, i);
}

static void set_counts(stats_head *h, const int64_t c[4])
{
    h->rows = c[0];
    h->rows_norm = c[1];
    h->rows_empty = c[2];
    h->nonfinite_rows = c[3];
}

/* Walk the tail. With want < 0, fill out[0 .. n-1]; otherwise fill *out for the head of id want
 * only (*found says whether the row has it). 0, or -1 when the tail is damaged. */
static int walk(const view *v, int64_t row_time, int32_t want, store_pack_head *out, int *found)
{
    const uint8_t *p = v->tail, *end = v->end;
    int32_t n = v->n;
    size_t map = ((size_t)n + 7) / 8;
    int64_t first[4], c[4];
    if (get_counts(&p, end, first))
        return -1;
    /* counts that differ from the first head's */
    const uint8_t *cmap = NULL, *cvals = NULL;
    if (v->flags & FLAG_COUNTS) {
        if ((size_t)(end - p) < map)
            return -1;
        cmap = p;
        p += map;
        cvals = p;
        for (int32_t i = 0; i < n; i++)
            if (bit(cmap, i)) {
                if (get_counts(&p, end, c))
                    return -1;
                if (want < 0)
                    set_counts(&out[i].s, c);
            }
    }
    if (want < 0)
        for (int32_t i = 0; i < n; i++)
            if (!cmap || !bit(cmap, i))
                set_counts(&out[i].s, first);
    /* head ids: the row index of the head wanted */
    int32_t idx = -1;
    if (v->flags & FLAG_IDS) {
        int64_t id = -1;
        for (int32_t i = 0; i < n; i++) {
            uint64_t d;
            if (get_varint(&p, end, &d) || d > INT32_MAX)
                return -1;
            id = i == 0 ? (int64_t)d : id + 1 + (int64_t)d;
            if (id > INT32_MAX)
                return -1;
            if (want < 0)
                out[i].head = (int32_t)id;
            else if (id == want)
                idx = i;
        }
    } else if (want < 0) {
        for (int32_t i = 0; i < n; i++)
            out[i].head = i;
    } else if (want < n) {
        idx = want;
    }
    /* times that differ from the row's */
    int64_t t_idx = row_time;
    if (want < 0)
        for (int32_t i = 0; i < n; i++)
            out[i].time_ms = row_time;
    if (v->flags & FLAG_TIMES) {
        if ((size_t)(end - p) < map)
            return -1;
        const uint8_t *tmap = p;
        p += map;
        for (int32_t i = 0; i < n; i++)
            if (bit(tmap, i)) {
                uint64_t u;
                if (get_varint(&p, end, &u))
                    return -1;
                int64_t t = (int64_t)((uint64_t)row_time + (uint64_t)unzig(u));
                if (want < 0)
                    out[i].time_ms = t;
                else if (i == idx)
                    t_idx = t;
            }
    }
    if (p != end)
        return -1; /* trailing bytes: not a row this code wrote */
    if (want < 0) {
        for (int32_t i = 0; i < n; i++)
            read_fixed(v, i, &out[i].s);
        return 0;
    }
    *found = idx >= 0;
    if (idx < 0)
        return 0;
    out->head = want;
    out->time_ms = t_idx;
    read_fixed(v, idx, &out->s);
    set_counts(&out->s, first);
    if (cmap && bit(cmap, idx)) { /* walk the exceptions again up to this head's */
        const uint8_t *q = cvals;
        for (int32_t i = 0; i <= idx; i++)
            if (bit(cmap, i) && get_counts(&q, end, c))
                return -1;
        set_counts(&out->s, c);
    }
    return 0;
}

int32_t store_pack_count(const uint8_t *blob, size_t len)
{
    view v;
    return parse(blob, len, &v) ? -1 : v.n;
}

int store_pack_decode(const uint8_t *blob, size_t len, int64_t row_time, store_pack_head *out)
{
    view v;
    if (parse(blob, len, &v))
        return -1;
    int found = 0;
    if (walk(&v, row_time, -1, out, &found))
        return -1;
    /* ids must ascend strictly (the encoder's promise; a reader relies on it to merge) */
    for (int32_t i = 1; i < v.n; i++)
        if (out[i].head <= out[i - 1].head)
            return -1;
    return 0;
}

int store_pack_decode_one(const uint8_t *blob, size_t len, int64_t row_time, int32_t head,
                          store_pack_head *out)
{
    view v;
    if (head < 0 || parse(blob, len, &v))
        return -1;
    int found = 0;
    if (walk(&v, row_time, head, out, &found))
        return -1;
    return found;
}

size_t store_pack_counts_encode(const int64_t *v, int32_t n, uint8_t *out)
{
    size_t o = 0;
    for (int32_t i = 0; i < n; i++)
        o += put_varint(out + o, (uint64_t)v[i]);
    return o;
}

int store_pack_counts_decode(const uint8_t *blob, size_t len, int64_t *v, int32_t n)
{
    const uint8_t *p = blob, *end = blob + len;
    for (int32_t i = 0; i < n; i++) {
        uint64_t u;
        if (!blob || get_varint(&p, end, &u) || u > INT64_MAX)
            return -1;
        v[i] = (int64_t)u;
    }
    return p == end ? 0 : -1;
}
