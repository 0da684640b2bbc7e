/* test_frame.c — the wire framing (proto/frame.c) and envelope decoding: frames split at every
 * byte, many frames in one read, zero and oversize lengths, truncated and garbage payloads, and
 * decoding under allocation failure (a countdown allocator fails allocation N for N = 1, 2, ...
 * until decoding succeeds; every failure is clean and the sanitizer build checks for leaks). */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "frame.h"

static uint64_t g_state;

static uint32_t rnd(void)
{
    g_state ^= g_state << 13;
    g_state ^= g_state >> 7;
    g_state ^= g_state << 17;
    return (uint32_t)(g_state >> 11);
}

/* A Push with random contents; the strings and repeated fields make the decoder allocate. */
static uint8_t *make_push_frame(uint64_t seq, size_t *len)
{
    Attnstat__TensorRef q = ATTNSTAT__TENSOR_REF__INIT, k = ATTNSTAT__TENSOR_REF__INIT;
    uint64_t shape[4] = {1 + rnd() % 8, 1 + rnd() % 32, 1 + rnd() % 4096, 64};
    uint64_t strides[4] = {shape[1] * shape[2] * 64, shape[2] * 64, 64, 1};
    q.buffer_id = rnd(), q.offset = rnd(), q.dtype = ATTNSTAT__DTYPE__BF16;
    q.n_shape = 4, q.shape = shape, q.n_strides = 4, q.strides = strides;
    k = q;
    k.offset = rnd();
    Attnstat__Push push = ATTNSTAT__PUSH__INIT;
    push.seq = seq, push.step = (int64_t)rnd(), push.layer = rnd() % 96;
    push.q = &q, push.k = &k;
    push.has_causal = 1, push.causal = rnd() & 1;
    int32_t cu[5] = {0, 7, 9, 30, 41};
    push.n_cu_seqlens_q = push.n_cu_seqlens_k = 5;
    push.cu_seqlens_q = push.cu_seqlens_k = cu;
    Attnstat__Envelope env = ATTNSTAT__ENVELOPE__INIT;
    env.msg_case = ATTNSTAT__ENVELOPE__MSG_PUSH;
    env.push = &push;
    return frame_pack(&env, FRAME_MAX_DEFAULT, len);
}

static uint64_t decode_seq(const uint8_t *payload, uint32_t n)
{
    Attnstat__Envelope *e = frame_decode(payload, n, NULL);
    ck_assert_ptr_nonnull(e);
    ck_assert_int_eq(e->msg_case, ATTNSTAT__ENVELOPE__MSG_PUSH);
    ck_assert_uint_eq(e->push->q->n_shape, 4);
    ck_assert_uint_eq(e->push->n_cu_seqlens_q, 5);
    uint64_t seq = e->push->seq;
    attnstat__envelope__free_unpacked(e, NULL);
    return seq;
}

START_TEST(test_roundtrip_bytewise_and_batched)
{
    enum { N = 40 };
    uint8_t *frames[N];
    size_t lens[N], total = 0;
    for (int i = 0; i < N; i++) {
        frames[i] = make_push_frame(1000 + (uint64_t)i, &lens[i]);
        ck_assert_ptr_nonnull(frames[i]);
        total += lens[i];
    }
    uint8_t *all = malloc(total);
    for (int i = 0, o = 0; i < N; o += (int)lens[i], i++)
        memcpy(all + o, frames[i], lens[i]);

    /* 1: feed in random-size chunks (1 byte up to 3 frames at once) */
    frame_reader r;
    frame_reader_init(&r, 0);
    size_t fed = 0;
    int got = 0;
    char err[128];
    while (got < N) {
        const uint8_t *pl;
        uint32_t n;
        int rc = frame_reader_next(&r, &pl, &n, err, sizeof err);
        ck_assert_int_ge(rc, 0);
        if (rc == 1) {
            ck_assert_uint_eq(decode_seq(pl, n), 1000 + (uint64_t)got);
            got++;
            continue;
        }
        ck_assert_uint_lt(fed, total);
        size_t chunk = 1 + rnd() % (3 * lens[0]);
        if (chunk > total - fed)
            chunk = total - fed;
        ck_assert_int_eq(frame_reader_feed(&r, all + fed, chunk), 0);
        fed += chunk;
    }
    ck_assert_uint_eq(fed, total);
    frame_reader_free(&r);

    /* 2: one byte at a time, through space/commit */
    frame_reader_init(&r, 0);
    got = 0;
    for (size_t i = 0; i < total; i++) {
        size_t avail;
        uint8_t *dst = frame_reader_space(&r, 1, &avail);
        ck_assert_ptr_nonnull(dst);
        ck_assert_uint_ge(avail, 1);
        *dst = all[i];
        frame_reader_commit(&r, 1);
        const uint8_t *pl;
        uint32_t n;
        int rc;
        while ((rc = frame_reader_next(&r, &pl, &n, err, sizeof err)) == 1) {
            ck_assert_uint_eq(decode_seq(pl, n), 1000 + (uint64_t)got);
            got++;
        }
        ck_assert_int_eq(rc, 0);
    }
    ck_assert_int_eq(got, N);
    frame_reader_free(&r);
    for (int i = 0; i < N; i++)
        free(frames[i]);
    free(all);
}
END_TEST

START_TEST(test_bad_lengths)
{
    frame_reader r;
    frame_reader_init(&r, 1024);
    const uint8_t *pl;
    uint32_t n;
    char err[128] = "";
    uint8_t zero[4] = {0, 0, 0, 0};
    ck_assert_int_eq(frame_reader_feed(&r, zero, 4), 0);
    ck_assert_int_eq(frame_reader_next(&r, &pl, &n, err, sizeof err), -1);
    ck_assert_ptr_nonnull(strstr(err, "zero"));
    frame_reader_free(&r);

    frame_reader_init(&r, 1024);
    uint8_t big[4] = {0x01, 0x04, 0, 0}; /* 1025 */
    ck_assert_int_eq(frame_reader_feed(&r, big, 4), 0);
    ck_assert_int_eq(frame_reader_next(&r, &pl, &n, err, sizeof err), -1);
    ck_assert_ptr_nonnull(strstr(err, "1025"));
    ck_assert_ptr_nonnull(strstr(err, "1024"));
    frame_reader_free(&r);

    /* a truncated frame is never handed out */
    frame_reader_init(&r, 1024);
    uint8_t part[10] = {20, 0, 0, 0, 1, 2, 3, 4, 5, 6};
    ck_assert_int_eq(frame_reader_feed(&r, part, sizeof part), 0);
    ck_assert_int_eq(frame_reader_next(&r, &pl, &n, err, sizeof err), 0);
    frame_reader_free(&r);

    /* the packer refuses a message over the limit */
    size_t len;
    Attnstat__Error e = ATTNSTAT__ERROR__INIT;
    char msg[300];
    memset(msg, 'x', sizeof msg - 1);
    msg[sizeof msg - 1] = '\0';
    e.code = ATTNSTAT__CODE__INTERNAL, e.message = msg;
    Attnstat__Envelope env = ATTNSTAT__ENVELOPE__INIT;
    env.msg_case = ATTNSTAT__ENVELOPE__MSG_ERROR, env.error = &e;
    ck_assert_ptr_null(frame_pack(&env, 100, &len));
    uint8_t *ok = frame_pack(&env, 1000, &len);
    ck_assert_ptr_nonnull(ok);
    ck_assert_uint_eq(len, 4 + (size_t)(ok[0] | ok[1] << 8));
    free(ok);
}
END_TEST

/* Garbage and truncated payloads never decode into something; random bytes never crash. */
START_TEST(test_garbage_payloads)
{
    size_t len;
    uint8_t *f = make_push_frame(7, &len);
    for (size_t cut = 5; cut < len; cut += 3) {
        Attnstat__Envelope *e = frame_decode(f + 4, (uint32_t)(cut - 4), NULL);
        if (e) { /* a prefix can be a valid message only if it ends on a field boundary */
            attnstat__envelope__free_unpacked(e, NULL);
        }
    }
    int decoded = 0;
    for (int i = 0; i < 2000; i++) {
        uint8_t junk[64];
        size_t n = 1 + rnd() % sizeof junk;
        for (size_t j = 0; j < n; j++)
            junk[j] = (uint8_t)rnd();
        Attnstat__Envelope *e = frame_decode(junk, (uint32_t)n, NULL);
        if (e) {
            decoded++;
            attnstat__envelope__free_unpacked(e, NULL);
        }
    }
    ck_assert_int_lt(decoded, 2000);
    free(f);
}
END_TEST

/* Countdown allocator: allocation number `fail_at` (1-based) fails. */
static int g_allocs, g_fail_at, g_live;

static void *cd_alloc(void *data, size_t size)
{
    (void)data;
    if (++g_allocs == g_fail_at)
        return NULL;
    g_live++;
    return malloc(size);
}

static void cd_free(void *data, void *p)
{
    (void)data;
    if (p)
        g_live--;
    free(p);
}

START_TEST(test_decode_allocation_failures)
{
    size_t len;
    uint8_t *f = make_push_frame(99, &len);
    ProtobufCAllocator a = {cd_alloc, cd_free, NULL};
    int n;
    for (n = 1; n < 1000; n++) {
        g_allocs = 0, g_fail_at = n, g_live = 0;
        Attnstat__Envelope *e = frame_decode(f + 4, (uint32_t)(len - 4), &a);
        if (e) {
            ck_assert_uint_eq(e->push->seq, 99);
            attnstat__envelope__free_unpacked(e, &a);
            ck_assert_int_eq(g_live, 0);
            break;
        }
        ck_assert_msg(g_live == 0, "allocation %d failed: %d blocks leaked", n, g_live);
    }
    ck_assert_int_gt(n, 2); /* the decoder did allocate, and each failure was clean */
    ck_assert_int_lt(n, 1000);
    free(f);
}
END_TEST

int main(void)
{
    g_state = (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32) ^ 0x9e3779b97f4a7c15ULL;
    fprintf(stderr, "random state %llu\n", (unsigned long long)g_state);
    Suite *s = suite_create("frame");
    TCase *tc = tcase_create("frame");
    tcase_add_test(tc, test_roundtrip_bytewise_and_batched);
    tcase_add_test(tc, test_bad_lengths);
    tcase_add_test(tc, test_garbage_payloads);
    tcase_add_test(tc, test_decode_allocation_failures);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
