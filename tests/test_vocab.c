/* test_vocab.c — the public structs and the wire against vocab/vocab.h's rows, and libattnstat's
 * conversions that loop over them.
 *
 * At compile time (a field a row names that a struct lacks fails the build): attnstat_head_result
 * holds head, sampled, then every VOCAB_COUNTS row (uint64) and every VOCAB_STATS row (double) in
 * table order at increasing offsets, and nothing else; attnstat_thresholds holds every
 * VOCAB_THRESHOLDS row the hello carries (double or uint32 by its type) and collapse_threshold,
 * nothing else; kernels/stats.h's stats_head holds every count (int64) and statistic (double).
 * At run time: the generated protocol's HeadStats and Thresholds carry the same rows with the same
 * types (wire_vocab.h's marks of required and daemon-only rows checked against the descriptors);
 * attnstat_thresholds_init leaves every row unset; attnstat_rule_name spells every rule as the
 * table does; and random values go stats_head -> HeadStats (local mode) -> bytes -> HeadStats ->
 * attnstat_head_result (replies.c) exactly, and attnstat_thresholds -> Thresholds (the hello)
 * field by field. The public ATTNSTAT_STATS_* masks are the table's: each the OR of VOCAB_BIT over
 * the rows whose `ask` is its name (every row's ask one of them), DEFAULT and ALL vocab.h's; a
 * want kept by stats_head_keep() and sent by HEAD_PB_FILL carries exactly the rows it asks for.
 * Random data; the seed is printed (ATTNSTAT_TEST_SEED repeats a run).
 *
 * Stage: a unit test of the client library; links attnstat_client and the protocol. */
#include <check.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attnstat.h"
#include "client_testutil.h"
#include "wire_vocab.h"
#include "link.h"
#include "head_pb.h"
#include "replies.h"
#include "stats.h"

static uint64_t g_seed;

/* ---- attnstat_head_result: head, sampled, counts, statistics; nothing else ------------------- */
#define FIELD_TYPE_IS(s, f, T) _Generic(((s *)0)->f, T: 1, default: 0)

_Static_assert(offsetof(attnstat_head_result, head) == 0, "head first");
_Static_assert(FIELD_TYPE_IS(attnstat_head_result, head, uint32_t), "head is uint32");
_Static_assert(offsetof(attnstat_head_result, sampled) == 4, "sampled second");
_Static_assert(FIELD_TYPE_IS(attnstat_head_result, sampled, int32_t), "sampled is int32");

enum { HR_COUNTS_AT = 8, HR_STATS_AT = HR_COUNTS_AT + 8 * VOCAB_NCOUNTS };
enum {
#define X(name, ...) HR_COUNT_##name,
    VOCAB_COUNTS(X)
#undef X
};
enum {
#define X(name, ...) HR_STAT_##name,
    VOCAB_STATS(X)
#undef X
};
#define X(name, ...)                                                                               \
    _Static_assert(offsetof(attnstat_head_result, name) == HR_COUNTS_AT + 8 * HR_COUNT_##name,     \
                   "attnstat_head_result." #name ": the counts in vocab.h's order after sampled"); \
    _Static_assert(FIELD_TYPE_IS(attnstat_head_result, name, uint64_t),                            \
                   "attnstat_head_result." #name " is a uint64");
VOCAB_COUNTS(X)
#undef X
#define X(name, ...)                                                                               \
    _Static_assert(offsetof(attnstat_head_result, name) == HR_STATS_AT + 8 * HR_STAT_##name,       \
                   "attnstat_head_result." #name ": the statistics in vocab.h's order");           \
    _Static_assert(FIELD_TYPE_IS(attnstat_head_result, name, double),                              \
                   "attnstat_head_result." #name " is a double");
VOCAB_STATS(X)
#undef X
_Static_assert(sizeof(attnstat_head_result) == HR_STATS_AT + 8 * VOCAB_NSTATS,
               "attnstat_head_result holds a field that is not a row of vocab.h");

/* ---- attnstat_thresholds: every row the hello carries, collapse_threshold; nothing else ------ */
#define TH_T_VOCAB_D double
#define TH_T_VOCAB_U uint32_t
#define X(name, type, ...)                                                                         \
    WIRE_VOCAB_UNLESS(DAEMON_ONLY, name)(_Static_assert(                                         \
        FIELD_TYPE_IS(attnstat_thresholds, name, TH_T_##type),                                    \
        "attnstat_thresholds." #name " has its row's type");)
VOCAB_THRESHOLDS(X)
#undef X
_Static_assert(FIELD_TYPE_IS(attnstat_thresholds, collapse_threshold, double), "collapse");
enum {
    TH_BYTES = 8 /* collapse_threshold */
#define X(name, type, ...) +(WIRE_VOCAB_HAS(DAEMON_ONLY, name) ? 0 : (int)sizeof(TH_T_##type))
               VOCAB_THRESHOLDS(X)
#undef X
};
/* No padding in it today: the sizes add up, and a field that is no row would break the sum. */
_Static_assert(sizeof(attnstat_thresholds) == TH_BYTES,
               "attnstat_thresholds holds a field that is not a row of vocab.h (or padding)");

/* ---- stats_head: every count (int64) and statistic (double) ---------------------------------- */
#define X(name, ...)                                                                               \
    _Static_assert(FIELD_TYPE_IS(stats_head, name, int64_t), "stats_head." #name " is an int64");
VOCAB_COUNTS(X)
#undef X
#define X(name, ...)                                                                               \
    _Static_assert(FIELD_TYPE_IS(stats_head, name, double), "stats_head." #name " is a double");
VOCAB_STATS(X)
#undef X

/* The field called name in a message's descriptor (NULL when none). */
static const ProtobufCFieldDescriptor *pb_field(const ProtobufCMessageDescriptor *d,
                                                const char *name)
{
    return protobuf_c_message_descriptor_get_field_by_name(d, name);
}

START_TEST(test_layout_runtime)
{
    /* What the static checks above say, at run time too (a message names the row). */
#define X(name, ...)                                                                               \
    ck_assert_msg(offsetof(attnstat_head_result, name) == HR_COUNTS_AT + 8 * HR_COUNT_##name,      \
                  "attnstat_head_result.%s", #name);
    VOCAB_COUNTS(X)
#undef X
#define X(name, ...)                                                                               \
    ck_assert_msg(offsetof(attnstat_head_result, name) == HR_STATS_AT + 8 * HR_STAT_##name,        \
                  "attnstat_head_result.%s", #name);
    VOCAB_STATS(X)
#undef X
    ck_assert_uint_eq(sizeof(attnstat_head_result), HR_STATS_AT + 8 * VOCAB_NSTATS);
}
END_TEST

START_TEST(test_wire_carries_the_rows)
{
    const ProtobufCMessageDescriptor *hs = &attnstat__head_stats__descriptor;
    const ProtobufCMessageDescriptor *th = &attnstat__thresholds__descriptor;
    /* HeadStats: head, sampled and the rows; every count a uint64 (required only where marked),
     * every statistic an optional double. */
    size_t n = 2;
#define X(name, ...)                                                                               \
    {                                                                                              \
        const ProtobufCFieldDescriptor *f = pb_field(hs, #name);                                   \
        ck_assert_msg(f != NULL, "HeadStats has no %s", #name);                                    \
        ck_assert_msg(f->type == PROTOBUF_C_TYPE_UINT64, "HeadStats.%s is not a uint64", #name);  \
        ck_assert_msg((f->label == PROTOBUF_C_LABEL_REQUIRED) == WIRE_VOCAB_HAS(REQUIRED, name), \
                      "HeadStats.%s: required on the wire %s wire_vocab.h's mark", #name,       \
                      WIRE_VOCAB_HAS(REQUIRED, name) ? "without" : "against");               \
        n++;                                                                                       \
    }
    VOCAB_COUNTS(X)
#undef X
#define X(name, ...)                                                                               \
    {                                                                                              \
        const ProtobufCFieldDescriptor *f = pb_field(hs, #name);                                   \
        ck_assert_msg(f != NULL, "HeadStats has no %s", #name);                                    \
        ck_assert_msg(f->type == PROTOBUF_C_TYPE_DOUBLE, "HeadStats.%s is not a double", #name);  \
        ck_assert_msg(f->label == PROTOBUF_C_LABEL_OPTIONAL, "HeadStats.%s is not optional",      \
                      #name);                                                                      \
        n++;                                                                                       \
    }
    VOCAB_STATS(X)
#undef X
    ck_assert_ptr_nonnull(pb_field(hs, "head"));
    ck_assert_ptr_nonnull(pb_field(hs, "sampled"));
    ck_assert_uint_eq(hs->n_fields, n);

    /* Thresholds: every row but the daemon-only ones, of its type, and collapse_threshold. */
    n = 1;
#define X(name, ty, ...)                                                                           \
    {                                                                                              \
        const ProtobufCFieldDescriptor *f = pb_field(th, #name);                                   \
        if (WIRE_VOCAB_HAS(DAEMON_ONLY, name)) {                                                 \
            ck_assert_msg(f == NULL, "Thresholds carries %s, marked daemon-only", #name);          \
        } else {                                                                                   \
            ck_assert_msg(f != NULL, "Thresholds has no %s", #name);                               \
            ck_assert_msg(f->type == (ty == VOCAB_D ? PROTOBUF_C_TYPE_DOUBLE                       \
                                                      : PROTOBUF_C_TYPE_UINT32),                   \
                          "Thresholds.%s is not of its row's type", #name);                        \
            n++;                                                                                   \
        }                                                                                          \
    }
    VOCAB_THRESHOLDS(X)
#undef X
    ck_assert_ptr_nonnull(pb_field(th, "collapse_threshold"));
    ck_assert_uint_eq(th->n_fields, n);
}
END_TEST

START_TEST(test_init_and_names)
{
    attnstat_thresholds t;
    memset(&t, 0x5a, sizeof t); /* not zero, not NaN: init must set each field */
    attnstat_thresholds_init(&t);
#define X(name, type, ...)                                                                         \
    WIRE_VOCAB_UNLESS(DAEMON_ONLY, name)(                                                        \
        if (type == VOCAB_D) ck_assert_msg(isnan((double)t.name), "%s not unset", #name);          \
        else ck_assert_msg(t.name == 0, "%s not unset", #name);)
    VOCAB_THRESHOLDS(X)
#undef X
    ck_assert(isnan(t.collapse_threshold));

#define X(c, v, name, ...) ck_assert_str_eq(attnstat_rule_name(v), name);
    VOCAB_RULES(X)
#undef X
    ck_assert_str_eq(attnstat_rule_name(0), "unknown");
    ck_assert_str_eq(attnstat_rule_name(VOCAB_NRULES + 1), "unknown");
}
END_TEST

/* A random double, never 0, of either sign and a wide range of magnitudes. */
static double rnd_double(uint64_t *s)
{
    double m = (double)(rng_next(s) >> 11) / 9007199254740992.0 + 0.5;
    int e = (int)rng_below(s, 40) - 20;
    return (rng_next(s) & 1 ? -m : m) * ldexp(1.0, e);
}

START_TEST(test_results_round_trip)
{
    uint64_t s = g_seed;
    for (int it = 0; it < 200; it++) {
        stats_head h;
        memset(&h, 0, sizeof h);
        uint64_t undefined = rng_next(&s); /* bit i: statistic i left NaN (absent) */
#define X(name, ...) h.name = (int64_t)rng_below(&s, (uint64_t)1 << 40) + 1;
        VOCAB_COUNTS(X)
#undef X
#define X(name, ...) h.name = (undefined >> HR_STAT_##name) & 1 ? NAN : rnd_double(&s);
        VOCAB_STATS(X)
#undef X
        h.sampled = (int32_t)(rng_next(&s) & 1);
        uint32_t head = (uint32_t)rng_below(&s, 4096);

        Attnstat__HeadStats pb;
        HEAD_PB_FILL(&pb, head, &h);
        uint8_t buf[1024];
        size_t len = attnstat__head_stats__get_packed_size(&pb);
        ck_assert_uint_le(len, sizeof buf);
        attnstat__head_stats__pack(&pb, buf);
        Attnstat__HeadStats *back = attnstat__head_stats__unpack(NULL, len, buf);
        ck_assert_ptr_nonnull(back);
        attnstat_head_result r;
        memset(&r, 0x5a, sizeof r);
        replies_head_result(&r, back);
        attnstat__head_stats__free_unpacked(back, NULL);

        ck_assert_uint_eq(r.head, head);
        ck_assert_int_eq(r.sampled, h.sampled);
#define X(name, ...)                                                                               \
    ck_assert_msg(r.name == (uint64_t)h.name, "seed %llu: %s %llu, sent %lld",                   \
                  (unsigned long long)g_seed, #name, (unsigned long long)r.name, (long long)h.name);
        VOCAB_COUNTS(X)
#undef X
#define X(name, ...)                                                                               \
    if (isnan(h.name))                                                                             \
        ck_assert_msg(isnan(r.name), "seed %llu: %s absent came back %.17g",                      \
                      (unsigned long long)g_seed, #name, r.name);                                  \
    else                                                                                           \
        ck_assert_msg(r.name == h.name, "seed %llu: %s %.17g, sent %.17g",                        \
                      (unsigned long long)g_seed, #name, r.name, h.name);
        VOCAB_STATS(X)
#undef X
    }
}
END_TEST

/* The masks of attnstat_push_ext.stats against the table, so that they never drift: the rows of
 * each ask name, the defaults (dflt VOCAB_ON) and every row. */
_Static_assert(ATTNSTAT_STATS_DEFAULT == VOCAB_STATS_DEFAULT,
               "ATTNSTAT_STATS_DEFAULT is vocab.h's");
_Static_assert(ATTNSTAT_STATS_ALL == VOCAB_STATS_ALL, "ATTNSTAT_STATS_ALL is vocab.h's");

START_TEST(test_stats_masks)
{
    static const struct {
        const char *ask;
        uint32_t mask;
    } pub[] = {{"entropy", ATTNSTAT_STATS_ENTROPY},
               {"max_logit", ATTNSTAT_STATS_MAX_LOGIT},
               {"sink_mass", ATTNSTAT_STATS_SINK_MASS},
               {"distance", ATTNSTAT_STATS_DISTANCE}};
    enum { NPUB = sizeof pub / sizeof pub[0] };
    uint32_t rows[NPUB] = {0}, dflt = 0;
#define X(name, unit, pack, since, pool, weight, lo, hi, absent, metric, help, cli, digits, by,    \
          on)                                                                                      \
    {                                                                                              \
        int k = 0;                                                                                 \
        while (k < NPUB && strcmp(pub[k].ask, by) != 0)                                            \
            k++;                                                                                   \
        ck_assert_msg(k < NPUB, "row %s asks by \"%s\": no ATTNSTAT_STATS_* has it", #name, by);  \
        rows[k] |= VOCAB_BIT(name);                                                                \
        if ((on) == VOCAB_ON)                                                                      \
            dflt |= VOCAB_BIT(name);                                                               \
    }
    VOCAB_STATS(X)
#undef X
    uint32_t all = 0;
    for (int k = 0; k < NPUB; k++) {
        ck_assert_msg(rows[k] == pub[k].mask, "ATTNSTAT_STATS for \"%s\" is 0x%x; the rows that "
                      "ask by it are 0x%x", pub[k].ask, pub[k].mask, rows[k]);
        ck_assert_uint_eq(all & pub[k].mask, 0); /* the masks do not overlap */
        all |= pub[k].mask;
    }
    ck_assert_uint_eq(all, ATTNSTAT_STATS_ALL);
    ck_assert_uint_eq(dflt, ATTNSTAT_STATS_DEFAULT);
    ck_assert_uint_eq(ATTNSTAT_STATS_DEFAULT & (ATTNSTAT_STATS_SINK_MASS | ATTNSTAT_STATS_DISTANCE),
                      0); /* the costly ones are asked for */
    ck_assert_uint_eq(stats_want(0), ATTNSTAT_STATS_DEFAULT);

    /* what a want keeps is what goes on the wire */
    uint64_t s = g_seed ^ 0x7374617473ULL;
    for (int it = 0; it < 200; it++) {
        uint32_t want = (uint32_t)rng_next(&s) & ATTNSTAT_STATS_ALL;
        uint32_t asked = want ? want : ATTNSTAT_STATS_DEFAULT;
        stats_head h;
        memset(&h, 0, sizeof h);
        h.rows = h.rows_norm = (int64_t)rng_below(&s, 1000) + 1;
#define X(name, ...) h.name = rnd_double(&s);
        VOCAB_STATS(X)
#undef X
        stats_head_keep(&h, 1, want);
        ck_assert_int_eq(h.rows, h.rows_norm);
        Attnstat__HeadStats pb;
        HEAD_PB_FILL(&pb, 0, &h);
        ck_assert(pb.rows == (uint64_t)h.rows);
#define X(name, ...)                                                                               \
    ck_assert_msg(pb.has_##name == ((asked & VOCAB_BIT(name)) != 0), "want 0x%x: %s %s", want,    \
                  #name, pb.has_##name ? "sent, not asked for" : "asked for, not sent");
        VOCAB_STATS(X)
#undef X
    }
}
END_TEST

START_TEST(test_hello_thresholds)
{
    uint64_t s = g_seed ^ 0x7468726573686f6cULL;
    for (int it = 0; it < 200; it++) {
        attnstat_thresholds t;
        attnstat_thresholds_init(&t);
        uint64_t set = rng_next(&s); /* bit i: row i set */
        int i = 0;
#define X(name, type, ...)                                                                         \
    WIRE_VOCAB_UNLESS(DAEMON_ONLY, name)(                                                        \
        if ((set >> i) & 1) t.name = type == VOCAB_D ? (TH_T_##type)(rng_below(&s, 1000000) + 1) / \
                                                            1048576.0                              \
                                                     : (TH_T_##type)(rng_below(&s, 999) + 1);)     \
    i++;
        VOCAB_THRESHOLDS(X)
#undef X
        int collapse = (int)(rng_next(&s) & 1);
        if (collapse)
            t.collapse_threshold = (double)(rng_below(&s, 1000) + 1) / 1024.0;

        Attnstat__Thresholds pb;
        link_thresholds_pb(&pb, &t);
        i = 0;
#define X(name, type, ...)                                                                         \
    WIRE_VOCAB_UNLESS(DAEMON_ONLY, name)(                                                        \
        ck_assert_msg(pb.has_##name == (int)((set >> i) & 1), "seed %llu: %s set %d, sent %d",   \
                      (unsigned long long)g_seed, #name, (int)((set >> i) & 1),                   \
                      (int)pb.has_##name);                                                         \
        if (pb.has_##name) ck_assert_msg(pb.name == t.name, "seed %llu: %s sent %.17g of %.17g",   \
                                         (unsigned long long)g_seed, #name, (double)pb.name,       \
                                         (double)t.name);)                                         \
    i++;
        VOCAB_THRESHOLDS(X)
#undef X
        ck_assert_int_eq(pb.has_collapse_threshold, collapse);
        if (collapse)
            ck_assert(pb.collapse_threshold == t.collapse_threshold);
    }
}
END_TEST

int main(void)
{
    g_seed = client_test_seed("test_vocab");
    Suite *su = suite_create("vocab");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, test_layout_runtime);
    tcase_add_test(tc, test_wire_carries_the_rows);
    tcase_add_test(tc, test_init_and_names);
    tcase_add_test(tc, test_results_round_trip);
    tcase_add_test(tc, test_hello_thresholds);
    tcase_add_test(tc, test_stats_masks);
    suite_add_tcase(su, tc);
    return client_test_run(su);
}
