/* test_frame.c — the wire (proto/): the framing (frame.c) and envelope decoding: frames split at
 * every byte, many frames in one read, zero and oversize lengths, truncated and garbage payloads,
 * and decoding under allocation failure (a countdown allocator fails allocation N for N = 1, 2, ...
 * until decoding succeeds; every failure is clean and the sanitizer build checks for leaks); the
 * message builders (envelope.c: each one packed, decoded and compared field by field, with random
 * values) and the enum names (names.h against the generated enums' values); a string with a NUL
 * refused with its path (frame_decode_ex), and the format characters hidden (utf8.h). */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "envelope.h"
#include "frame.h"
#include "names.h"
#include "utf8.h"

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
    Attnstat__TensorRef q, k;
    uint64_t shape[4] = {1 + rnd() % 8, 1 + rnd() % 32, 1 + rnd() % 4096, 64};
    uint64_t strides[4] = {shape[1] * shape[2] * 64, shape[2] * 64, 64, 1};
    uint32_t buffer = rnd();
    envelope_tensor(&q, buffer, rnd(), ATTNSTAT__DTYPE__BF16, shape, strides);
    envelope_tensor(&k, buffer, rnd(), ATTNSTAT__DTYPE__BF16, shape, strides);
    Attnstat__Push push;
    Attnstat__Envelope env;
    envelope_push(&env, &push, seq, (int64_t)rnd(), rnd() % 96, &q, &k);
    push.has_causal = 1, push.causal = rnd() & 1;
    int32_t cu[5] = {0, 7, 9, 30, 41};
    push.n_cu_seqlens_q = push.n_cu_seqlens_k = 5;
    push.cu_seqlens_q = push.cu_seqlens_k = cu;
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
    Attnstat__Error e;
    char msg[300];
    memset(msg, 'x', sizeof msg - 1);
    msg[sizeof msg - 1] = '\0';
    Attnstat__Envelope env;
    envelope_error(&env, &e, ATTNSTAT__CODE__INTERNAL, msg, 0, 0);
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

/* ---- envelope.c and names.h ------------------------------------------------------------------ */

/* env packed, decoded: the decoded copy (asserted to be of the same kind). */
static Attnstat__Envelope *roundtrip(const Attnstat__Envelope *env)
{
    size_t len;
    uint8_t *f = frame_pack(env, FRAME_MAX_DEFAULT, &len);
    ck_assert_ptr_nonnull(f);
    Attnstat__Envelope *d = frame_decode(f + FRAME_HEADER, (uint32_t)(len - FRAME_HEADER), NULL);
    free(f);
    ck_assert_ptr_nonnull(d);
    ck_assert_int_eq(d->msg_case, env->msg_case);
    return d;
}

/* Every builder's message comes back with the values given, and with nothing it was not told. */
START_TEST(test_envelope_builders)
{
    Attnstat__Envelope env, *d;
    char run[32];
    snprintf(run, sizeof run, "run-%u", rnd());
    uint64_t seq = ((uint64_t)rnd() << 32) | rnd(), id = rnd();

    Attnstat__Hello h;
    d = roundtrip(envelope_hello(&env, &h, run));
    ck_assert_uint_eq(d->hello->protocol_version, FRAME_PROTOCOL_VERSION);
    ck_assert_str_eq(d->hello->run, run);
    ck_assert(!d->hello->has_rank && !d->hello->thresholds);
    attnstat__envelope__free_unpacked(d, NULL);
    d = roundtrip(envelope_hello(&env, &h, ""));
    ck_assert_ptr_null(d->hello->run); /* an empty run is the daemon's default, as unset */
    attnstat__envelope__free_unpacked(d, NULL);

    Attnstat__RegisterBuffer rb;
    d = roundtrip(envelope_register_shm(&env, &rb, (uint32_t)id, "/seg", seq));
    ck_assert_uint_eq(d->register_buffer->id, (uint32_t)id);
    ck_assert_int_eq(d->register_buffer->kind, ATTNSTAT__BUFFER_KIND__HOST_SHM);
    ck_assert_uint_eq(d->register_buffer->size, seq);
    ck_assert_str_eq(d->register_buffer->shm_name, "/seg");
    ck_assert(!d->register_buffer->has_ipc_handle);
    attnstat__envelope__free_unpacked(d, NULL);

    uint8_t handle[64];
    for (size_t i = 0; i < sizeof handle; i++)
        handle[i] = (uint8_t)rnd();
    d = roundtrip(envelope_register_cuda(&env, &rb, 3, handle, sizeof handle, 4096, "GPU-x"));
    ck_assert_int_eq(d->register_buffer->kind, ATTNSTAT__BUFFER_KIND__CUDA_IPC);
    ck_assert(d->register_buffer->has_ipc_handle);
    ck_assert_uint_eq(d->register_buffer->ipc_handle.len, sizeof handle);
    ck_assert_mem_eq(d->register_buffer->ipc_handle.data, handle, sizeof handle);
    ck_assert_str_eq(d->register_buffer->device_uuid, "GPU-x");
    attnstat__envelope__free_unpacked(d, NULL);

    Attnstat__RegisterEvent re;
    d = roundtrip(envelope_register_event(&env, &re, 9, handle, sizeof handle, "GPU-y"));
    ck_assert_uint_eq(d->register_event->id, 9);
    ck_assert_mem_eq(d->register_event->ipc_handle.data, handle, sizeof handle);
    ck_assert_str_eq(d->register_event->device_uuid, "GPU-y");
    attnstat__envelope__free_unpacked(d, NULL);

    Attnstat__Forget fg;
    d = roundtrip(envelope_forget(&env, &fg, 1, (uint32_t)id, 0, 5));
    ck_assert(d->forget->has_buffer_id && !d->forget->has_event_id);
    ck_assert_uint_eq(d->forget->buffer_id, (uint32_t)id);
    attnstat__envelope__free_unpacked(d, NULL);
    d = roundtrip(envelope_forget(&env, &fg, 0, 0, 1, 5));
    ck_assert(!d->forget->has_buffer_id && d->forget->has_event_id);
    ck_assert_uint_eq(d->forget->event_id, 5);
    attnstat__envelope__free_unpacked(d, NULL);

    Attnstat__TensorRef q, k;
    uint64_t shape[4] = {1 + rnd() % 4, 1 + rnd() % 8, 1 + rnd() % 64, 64};
    uint64_t strides[4] = {shape[1] * shape[2] * 64, shape[2] * 64, 64, 1};
    envelope_tensor(&q, 1, 128, ATTNSTAT__DTYPE__F16, shape, strides);
    envelope_tensor(&k, 2, 256, ATTNSTAT__DTYPE__F16, shape, strides);
    Attnstat__Push pu;
    d = roundtrip(envelope_push(&env, &pu, seq, -7, 3, &q, &k));
    ck_assert_uint_eq(d->push->seq, seq);
    ck_assert_int_eq(d->push->step, -7);
    ck_assert_uint_eq(d->push->layer, 3);
    ck_assert_uint_eq(d->push->q->buffer_id, 1);
    ck_assert_uint_eq(d->push->k->offset, 256);
    ck_assert_int_eq(d->push->k->dtype, ATTNSTAT__DTYPE__F16);
    ck_assert_uint_eq(d->push->q->n_shape, 4);
    ck_assert_uint_eq(d->push->q->n_strides, 4);
    for (int i = 0; i < 4; i++)
        ck_assert(d->push->q->shape[i] == shape[i] && d->push->k->strides[i] == strides[i]);
    ck_assert(!d->push->v && !d->push->has_event_id && !d->push->want_results);
    attnstat__envelope__free_unpacked(d, NULL);

    Attnstat__Subscribe sb;
    d = roundtrip(envelope_subscribe(&env, &sb, 0, 1));
    ck_assert(d->subscribe->has_alerts && !d->subscribe->alerts); /* alerts defaults to true */
    ck_assert(d->subscribe->results);
    attnstat__envelope__free_unpacked(d, NULL);

    Attnstat__Status st;
    attnstat__envelope__free_unpacked(roundtrip(envelope_status(&env, &st)), NULL);

    Attnstat__HelloReply hr;
    d = roundtrip(envelope_hello_reply(&env, &hr, (int64_t)id, 1u << 20, 64));
    ck_assert_uint_eq(d->hello_reply->protocol_version, FRAME_PROTOCOL_VERSION);
    ck_assert_int_eq(d->hello_reply->run_id, (int64_t)id);
    ck_assert_uint_eq(d->hello_reply->max_frame, 1u << 20);
    ck_assert_uint_eq(d->hello_reply->queue_capacity, 64);
    attnstat__envelope__free_unpacked(d, NULL);

    Attnstat__Release rl;
    d = roundtrip(envelope_release(&env, &rl, seq));
    ck_assert_uint_eq(d->release->seq, seq);
    attnstat__envelope__free_unpacked(d, NULL);

    Attnstat__HeadStats hs[3], *hp[3];
    for (int i = 0; i < 3; i++) {
        attnstat__head_stats__init(&hs[i]);
        hs[i].head = (uint32_t)i;
        hs[i].rows = rnd();
        hp[i] = &hs[i];
    }
    Attnstat__Ack ak;
    d = roundtrip(envelope_ack(&env, &ak, seq, ATTNSTAT__CODE__DROPPED, "queue full", NULL, 3));
    ck_assert_uint_eq(d->ack->seq, seq);
    ck_assert_int_eq(d->ack->code, ATTNSTAT__CODE__DROPPED);
    ck_assert_str_eq(d->ack->message, "queue full");
    ck_assert_uint_eq(d->ack->n_heads, 0); /* no heads given, whatever the count says */
    attnstat__envelope__free_unpacked(d, NULL);
    d = roundtrip(envelope_ack(&env, &ak, seq, ATTNSTAT__CODE__OK, "", hp, 3));
    ck_assert_ptr_null(d->ack->message);
    ck_assert_uint_eq(d->ack->n_heads, 3);
    ck_assert_uint_eq(d->ack->heads[2]->rows, hs[2].rows);
    attnstat__envelope__free_unpacked(d, NULL);

    Attnstat__Error er;
    d = roundtrip(envelope_error(&env, &er, ATTNSTAT__CODE__UNKNOWN_BUFFER, "no such buffer", 1, id));
    ck_assert_int_eq(d->error->code, ATTNSTAT__CODE__UNKNOWN_BUFFER);
    ck_assert_str_eq(d->error->message, "no such buffer");
    ck_assert(d->error->has_ref);
    ck_assert_uint_eq(d->error->ref, id);
    attnstat__envelope__free_unpacked(d, NULL);
    d = roundtrip(envelope_error(&env, &er, ATTNSTAT__CODE__FRAME, "bad frame", 0, id));
    ck_assert(!d->error->has_ref);
    attnstat__envelope__free_unpacked(d, NULL);

    Attnstat__Result rs;
    d = roundtrip(envelope_result(&env, &rs, run, (int64_t)id, 12, 4, hp, 3));
    ck_assert_str_eq(d->result->run, run);
    ck_assert_int_eq(d->result->run_id, (int64_t)id);
    ck_assert_int_eq(d->result->step, 12);
    ck_assert_uint_eq(d->result->layer, 4);
    ck_assert_uint_eq(d->result->n_heads, 3);
    attnstat__envelope__free_unpacked(d, NULL);

    Attnstat__Alert al;
    d = roundtrip(envelope_alert(&env, &al, run, (int64_t)id, 5, 6, 77,
                                 ATTNSTAT__ALERT_RULE__LOGIT_CEILING, ATTNSTAT__ALERT_STATE__CLEARED));
    ck_assert_str_eq(d->alert->run, run);
    ck_assert(d->alert->layer == 5 && d->alert->head == 6 && d->alert->step == 77);
    ck_assert_int_eq(d->alert->rule, ATTNSTAT__ALERT_RULE__LOGIT_CEILING);
    ck_assert_int_eq(d->alert->state, ATTNSTAT__ALERT_STATE__CLEARED);
    ck_assert(!d->alert->has_rank && !d->alert->has_value && !d->alert->message);
    attnstat__envelope__free_unpacked(d, NULL);

    Attnstat__StatusReply sr;
    envelope_status_reply(&env, &sr);
    sr.has_clients = 1;
    sr.clients = 3;
    d = roundtrip(&env);
    ck_assert_uint_eq(d->status_reply->clients, 3);
    attnstat__envelope__free_unpacked(d, NULL);
}
END_TEST

START_TEST(test_names)
{
    ck_assert_str_eq(names_dtype(ATTNSTAT__DTYPE__BF16), "bf16");
    ck_assert_str_eq(names_dtype(ATTNSTAT__DTYPE__F32), "f32");
    ck_assert_str_eq(names_dtype(9), "unknown");
    ck_assert_str_eq(names_buffer_kind(ATTNSTAT__BUFFER_KIND__CUDA_IPC), "CUDA_IPC");
    ck_assert_str_eq(names_alert_rule(ATTNSTAT__ALERT_RULE__ENTROPY_DROP), "entropy_drop");
    ck_assert_str_eq(names_alert_rule(0), "unknown");
    ck_assert_str_eq(names_alert_state(ATTNSTAT__ALERT_STATE__RAISED), "raised");
    ck_assert_str_eq(names_code(ATTNSTAT__CODE__NO_HELLO), "NO_HELLO");
    ck_assert_str_eq(names_code(-1), "unknown");
    /* Every rule name maps back to its value; the names the generated descriptor knows agree. */
    const ProtobufCEnumDescriptor *rd = &attnstat__alert_rule__descriptor;
    for (unsigned i = 0; i < rd->n_values; i++) {
        const char *n = names_alert_rule(rd->values[i].value);
        ck_assert_int_eq(names_alert_rule_from(n), rd->values[i].value);
    }
    ck_assert_int_eq(names_alert_rule_from("no-such-rule"), 0);
    ck_assert_int_eq(names_alert_rule_from(NULL), 0);
    const ProtobufCEnumDescriptor *cd = &attnstat__code__descriptor;
    for (unsigned i = 0; i < cd->n_values; i++)
        ck_assert_str_eq(names_code(cd->values[i].value), cd->values[i].name);
    const ProtobufCEnumDescriptor *kd = &attnstat__buffer_kind__descriptor;
    for (unsigned i = 0; i < kd->n_values; i++)
        ck_assert_str_eq(names_buffer_kind(kd->values[i].value), kd->values[i].name);
}
END_TEST

/* ---- strings with a NUL, names with hidden characters ---------------------------------------- */

/* A random name of n printable ASCII bytes (no NUL, unique enough to be found in a frame). */
static void rand_name(char *out, size_t n)
{
    for (size_t i = 0; i < n; i++)
        out[i] = (char)('a' + rnd() % 26);
    out[n] = '\0';
}

/* The frame f (len bytes) with one byte of the string s (found in it) set to NUL: *at its index in
 * s. Returns a malloc'd copy. */
static uint8_t *with_nul(const uint8_t *f, size_t len, const char *s, size_t *at)
{
    size_t n = strlen(s);
    const uint8_t *hit = memmem(f, len, s, n);
    ck_assert_ptr_nonnull(hit);
    uint8_t *c = malloc(len);
    ck_assert_ptr_nonnull(c);
    memcpy(c, f, len);
    *at = rnd() % n;
    c[(size_t)(hit - f) + *at] = 0;
    return c;
}

/* protobuf-c hands strings over as C strings: a NUL inside one would cut it without a word. Every
 * string of a message, however deep (a Hello's run, host, config, a device UUID; a StatusReply's
 * worker name), is refused with its path and where the NUL is; a bytes field (a CUDA IPC handle)
 * full of NULs is not a string and decodes. */
START_TEST(test_string_with_nul_refused)
{
    char run[24], host[20], config[40], uuid[3][16];
    rand_name(run, 8 + rnd() % 12);
    rand_name(host, 6 + rnd() % 10);
    char inner[20];
    rand_name(inner, 10);
    snprintf(config, sizeof config, "{\"k\": \"%s\"}", inner);
    char *uuids[3];
    for (int i = 0; i < 3; i++) {
        rand_name(uuid[i], 12);
        uuids[i] = uuid[i];
    }
    Attnstat__Hello h;
    Attnstat__Envelope env;
    envelope_hello(&env, &h, run);
    h.host = host;
    h.config = config;
    h.n_device_uuids = 3;
    h.device_uuids = uuids;
    size_t len;
    uint8_t *f = frame_pack(&env, FRAME_MAX_DEFAULT, &len);
    ck_assert_ptr_nonnull(f);
    char err[200];
    Attnstat__Envelope *e = frame_decode_ex(f + 4, (uint32_t)(len - 4), NULL, err, sizeof err);
    ck_assert_ptr_nonnull(e);
    ck_assert_str_eq(e->hello->run, run);
    attnstat__envelope__free_unpacked(e, NULL);
    const char *strs[] = {run, host, inner, uuid[1]};
    const char *paths[] = {"hello.run", "hello.host", "hello.config", "hello.device_uuids"};
    for (int i = 0; i < 4; i++) {
        size_t at;
        uint8_t *bad = with_nul(f, len, strs[i], &at);
        err[0] = '\0';
        ck_assert_ptr_null(frame_decode_ex(bad + 4, (uint32_t)(len - 4), NULL, err, sizeof err));
        ck_assert_ptr_null(frame_decode(bad + 4, (uint32_t)(len - 4), NULL));
        char want[80];
        snprintf(want, sizeof want, "%s (a NUL at byte %zu of its %zu)", paths[i],
                 at + (i == 2 ? 7 : 0), i == 2 ? strlen(config) : strlen(strs[i]));
        ck_assert_msg(strstr(err, want) && strstr(err, "holds a NUL"), "'%s' lacks '%s'", err,
                      want);
        free(bad);
    }
    free(f);

    /* nested: a StatusReply's second worker */
    Attnstat__WorkerStatus w[2];
    Attnstat__WorkerStatus *wp[2] = {&w[0], &w[1]};
    char wname[2][16];
    for (int i = 0; i < 2; i++) {
        attnstat__worker_status__init(&w[i]);
        rand_name(wname[i], 10);
        w[i].name = wname[i];
        w[i].queue_depth = rnd() % 100;
        w[i].queue_capacity = 100;
    }
    Attnstat__StatusReply sr;
    attnstat__status_reply__init(&sr);
    sr.n_workers = 2;
    sr.workers = wp;
    attnstat__envelope__init(&env);
    env.msg_case = ATTNSTAT__ENVELOPE__MSG_STATUS_REPLY;
    env.status_reply = &sr;
    f = frame_pack(&env, FRAME_MAX_DEFAULT, &len);
    ck_assert_ptr_nonnull(f);
    size_t at;
    uint8_t *bad = with_nul(f, len, wname[1], &at);
    ck_assert_ptr_null(frame_decode_ex(bad + 4, (uint32_t)(len - 4), NULL, err, sizeof err));
    ck_assert_msg(strstr(err, "status_reply.workers.name (a NUL at byte"), "%s", err);
    free(bad);
    free(f);

    /* bytes may hold NULs: a CUDA IPC handle of random bytes, a quarter of them 0 */
    uint8_t handle[64];
    for (size_t i = 0; i < sizeof handle; i++)
        handle[i] = rnd() % 4 ? (uint8_t)(1 + rnd() % 255) : 0;
    handle[rnd() % sizeof handle] = 0;
    Attnstat__RegisterBuffer rb;
    envelope_register_cuda(&env, &rb, rnd(), handle, sizeof handle, 1 + rnd(), uuid[0]);
    f = frame_pack(&env, FRAME_MAX_DEFAULT, &len);
    ck_assert_ptr_nonnull(f);
    e = frame_decode_ex(f + 4, (uint32_t)(len - 4), NULL, err, sizeof err);
    ck_assert_msg(e != NULL, "a handle with NULs refused: %s", err);
    ck_assert_int_eq(memcmp(e->register_buffer->ipc_handle.data, handle, sizeof handle), 0);
    attnstat__envelope__free_unpacked(e, NULL);
    free(f);
}
END_TEST

/* Format characters (Unicode Cf, and the line and paragraph separators) are hidden characters, as
 * controls are: utf8_escape writes them out; their neighbours and ordinary text are kept. */
START_TEST(test_format_characters_hidden)
{
    static const uint32_t hidden[] = {0x00AD, 0x0600, 0x061C, 0x180E, 0x200B, 0x200E, 0x200F,
                                      0x2028, 0x2029, 0x202A, 0x202E, 0x2060, 0x2066, 0x2069,
                                      0x206F, 0xFEFF, 0xFFF9, 0x110BD, 0x1343F, 0x1D173, 0xE0001,
                                      0xE0020, 0xE007F, 0x1B, 0x7F, 0x9B};
    static const uint32_t shown[] = {'a', ' ', 0xE9, 0x00AC, 0x00AE, 0x200A, 0x2010, 0x2027,
                                     0x202F, 0x2065, 0x2070, 0xFEFE, 0xFF00, 0xFFFC, 0xFFFD,
                                     0x110BE, 0x13440, 0xE0000, 0xE0080, 0x10FFFF, 0x65E5};
    for (size_t i = 0; i < sizeof hidden / sizeof hidden[0]; i++)
        ck_assert_msg(utf8_is_hidden(hidden[i]), "U+%04X not hidden", (unsigned)hidden[i]);
    for (size_t i = 0; i < sizeof shown / sizeof shown[0]; i++)
        ck_assert_msg(!utf8_is_hidden(shown[i]) && !utf8_is_format(shown[i]), "U+%04X hidden",
                      (unsigned)shown[i]);
    ck_assert(utf8_is_format(0x202E) && !utf8_is_control(0x202E));
    /* escaped: a random name around U+202E, U+200B and U+2028; "é" kept */
    char name[12], in[64], want[96], out[96];
    rand_name(name, 1 + rnd() % 10);
    snprintf(in, sizeof in, "%s\xe2\x80\xae" "gpj.exe\xe2\x80\x8b\xc3\xa9\xe2\x80\xa8x", name);
    snprintf(want, sizeof want, "%s\\xe2\\x80\\xae" "gpj.exe\\xe2\\x80\\x8b\xc3\xa9\\xe2\\x80\\xa8x",
             name);
    ck_assert_str_eq(utf8_escape(out, sizeof out, in), want);
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
    tcase_add_test(tc, test_envelope_builders);
    tcase_add_test(tc, test_names);
    tcase_add_test(tc, test_string_with_nul_refused);
    tcase_add_test(tc, test_format_characters_hidden);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
