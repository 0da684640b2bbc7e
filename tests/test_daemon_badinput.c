/* test_daemon_badinput.c — bad input of every kind against a real attnstatd: each gets its clear
 * error (Error or Ack code, and a message naming the field), framing errors close only the
 * offending connection, message errors (and bad attention sinks) leave it usable, and a second
 * well-behaved client is still served afterwards. */
#include "daemon_harness.h"

typedef struct {
    dh_daemon d;
    dh_shm shm;
    dh_rng rng;
} world;

static world W;

static void setup(void)
{
    W.rng = dh_rng_new("badinput");
    dh_dir_init(&W.d);
    dh_start(&W.d, "--max-buffers", "4", "--max-push-work", "100000000", (const char *)NULL);
    dh_shm_create(&W.shm, "bad", 1 << 20);
    dh_fill(&W.rng, W.shm.ptr, (1 << 20) / 4, ATTNSTAT__DTYPE__F32, 1.0);
}

static void teardown(void)
{
    dh_shm_destroy(&W.shm);
    int code = W.d.pid > 0 ? dh_stop(&W.d) : 0;
    dh_cleanup(&W.d, code != 0);
    ck_assert_msg(code == 0, "attnstatd exit status %d after SIGTERM", code);
}

/* A good client: hello, register, push, Ack OK with results. */
static void good_client_served(const char *run)
{
    dh_conn c;
    dh_connect(&c, &W.d);
    dh_hello(&c, run, 0, NULL);
    dh_register(&c, 1, W.shm.name, W.shm.size);
    dh_tensor q, k;
    dh_tensor_contig(&q, 1, 0, ATTNSTAT__DTYPE__F32, 1, 2, 16, 8);
    dh_tensor_contig(&k, 1, 4096, ATTNSTAT__DTYPE__F32, 1, 2, 16, 8);
    dh_push(&c, 1, 1, 0, &q, &k, 1, 0, 1);
    char msg[256];
    int code = dh_wait_ack(&c, 1, msg, sizeof msg, 30000);
    ck_assert_msg(code == ATTNSTAT__CODE__OK, "good client's push: code %d: %s", code, msg);
    dh_close(&c);
}

/* Sends raw bytes; expects Error(FRAME) then the connection closed. */
static void expect_frame_error(const void *bytes, size_t n, const char *needle)
{
    dh_conn c;
    dh_connect(&c, &W.d);
    ck_assert_int_eq(dh_write_all(c.fd, bytes, n), 0);
    Attnstat__Envelope *e = dh_recv(&c, 20000);
    ck_assert_msg(e != NULL, "no Error for a framing error");
    ck_assert_int_eq(e->msg_case, ATTNSTAT__ENVELOPE__MSG_ERROR);
    ck_assert_int_eq(e->error->code, ATTNSTAT__CODE__FRAME);
    ck_assert_msg(strstr(e->error->message, needle), "message '%s' lacks '%s'", e->error->message,
                  needle);
    attnstat__envelope__free_unpacked(e, NULL);
    ck_assert_msg(dh_wait_closed(&c, 20000), "connection not closed after a framing error");
    dh_close(&c);
}

START_TEST(test_framing_errors_close_only_that_connection)
{
    uint8_t garbage[64];
    for (size_t i = 0; i < sizeof garbage; i++)
        garbage[i] = (uint8_t)(dh_next(&W.rng) | 0x80);
    garbage[3] = 0xff; /* a length far over the maximum */
    expect_frame_error(garbage, sizeof garbage, "over the limit");

    const uint8_t zero[8] = {0, 0, 0, 0, 1, 2, 3, 4};
    expect_frame_error(zero, sizeof zero, "zero");

    uint32_t over = (1u << 20) + 1; /* default max_frame + 1 */
    uint8_t hdr[4] = {(uint8_t)over, (uint8_t)(over >> 8), (uint8_t)(over >> 16), (uint8_t)(over >> 24)};
    expect_frame_error(hdr, sizeof hdr, "over the limit");

    const uint8_t undecodable[12] = {8, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff};
    expect_frame_error(undecodable, sizeof undecodable, "not a valid Envelope");

    /* A truncated frame, then the client goes away: nothing to answer, the daemon carries on. */
    dh_conn t;
    dh_connect(&t, &W.d);
    const uint8_t partial[10] = {100, 0, 0, 0, 0x0a, 0x02, 0x08, 0x01, 0, 0};
    ck_assert_int_eq(dh_write_all(t.fd, partial, sizeof partial), 0);
    dh_sleep_ms(50);
    dh_close(&t);

    good_client_served("after-framing");
}
END_TEST

static Attnstat__Envelope *expect_error(dh_conn *c, Attnstat__Code code, const char *needle)
{
    Attnstat__Envelope *e = dh_expect(c, ATTNSTAT__ENVELOPE__MSG_ERROR, 20000);
    ck_assert_msg(e != NULL, "no Error (expected code %d, '%s')", code, needle);
    ck_assert_msg(e->error->code == code, "Error code %d, expected %d: %s", e->error->code, code,
                  e->error->message);
    ck_assert_msg(strstr(e->error->message, needle), "message '%s' lacks '%s'", e->error->message,
                  needle);
    return e;
}

START_TEST(test_message_errors_keep_connection)
{
    dh_conn c;
    dh_connect(&c, &W.d);

    /* An Envelope with only an unknown field (number 99, varint 1): no known message. */
    const uint8_t unknown[7] = {3, 0, 0, 0, 0x98, 0x06, 0x01};
    ck_assert_int_eq(dh_write_all(c.fd, unknown, sizeof unknown), 0);
    attnstat__envelope__free_unpacked(expect_error(&c, ATTNSTAT__CODE__BAD_REQUEST, "unknown"), NULL);

    /* A daemon-to-client message sent to the daemon. */
    Attnstat__Release rel;
    Attnstat__Envelope env;
    ck_assert_int_eq(dh_send(&c, envelope_release(&env, &rel, 0)), 0);
    attnstat__envelope__free_unpacked(expect_error(&c, ATTNSTAT__CODE__BAD_REQUEST, "sent by the daemon"),
                                      NULL);

    /* A newer protocol version. */
    Attnstat__Hello h;
    envelope_hello(&env, &h, NULL);
    h.protocol_version = FRAME_PROTOCOL_VERSION + 1;
    ck_assert_int_eq(dh_send(&c, &env), 0);
    attnstat__envelope__free_unpacked(expect_error(&c, ATTNSTAT__CODE__VERSION, "version"), NULL);

    /* Push and RegisterBuffer before Hello. */
    dh_tensor q, k;
    dh_tensor_contig(&q, 1, 0, ATTNSTAT__DTYPE__F32, 1, 2, 16, 8);
    dh_tensor_contig(&k, 1, 4096, ATTNSTAT__DTYPE__F32, 1, 2, 16, 8);
    dh_push(&c, 100, 0, 0, &q, &k, 0, 0, 0);
    char msg[512];
    ck_assert_int_eq(dh_wait_ack(&c, 100, msg, sizeof msg, 20000), ATTNSTAT__CODE__NO_HELLO);
    dh_register(&c, 1, W.shm.name, W.shm.size);
    attnstat__envelope__free_unpacked(expect_error(&c, ATTNSTAT__CODE__NO_HELLO, "before Hello"), NULL);

    /* Bad thresholds in a Hello, then a good Hello on the same connection. */
    Attnstat__Thresholds th = ATTNSTAT__THRESHOLDS__INIT;
    th.has_entropy_floor = 1;
    th.entropy_floor = 7.0;
    envelope_hello(&env, &h, NULL);
    h.thresholds = &th;
    ck_assert_int_eq(dh_send(&c, &env), 0);
    attnstat__envelope__free_unpacked(expect_error(&c, ATTNSTAT__CODE__BAD_REQUEST, "entropy_floor"),
                                      NULL);
    dh_hello(&c, "bad-msgs", 0, NULL);

    /* Buffers: missing segment, larger than the segment, duplicate id, CUDA, too many. */
    dh_register(&c, 9, "/attnstat-test-no-such-segment", 4096);
    attnstat__envelope__free_unpacked(expect_error(&c, ATTNSTAT__CODE__BAD_REQUEST, "shm_open"), NULL);
    dh_register(&c, 9, "no-slash", 4096);
    attnstat__envelope__free_unpacked(expect_error(&c, ATTNSTAT__CODE__BAD_REQUEST, "shm_name"), NULL);
    dh_register(&c, 9, W.shm.name, W.shm.size * 2);
    attnstat__envelope__free_unpacked(expect_error(&c, ATTNSTAT__CODE__BAD_REQUEST, "smaller than"),
                                      NULL);
    dh_register(&c, 1, W.shm.name, W.shm.size);
    dh_register(&c, 1, W.shm.name, W.shm.size);
    attnstat__envelope__free_unpacked(expect_error(&c, ATTNSTAT__CODE__BAD_REQUEST, "already registered"),
                                      NULL);
    Attnstat__RegisterBuffer rb;
    uint8_t handle[64] = {1, 2, 3};
    envelope_register_cuda(&env, &rb, 5, handle, sizeof handle, 4096,
                           "GPU-00000000-0000-0000-0000-000000000000"); /* no machine has it */
    ck_assert_int_eq(dh_send(&c, &env), 0);
    /* UNSUPPORTED on every machine: without a GPU worker ("CUDA_IPC needs a GPU worker"), or with
     * GPUs that are not this one ("not a GPU this daemon serves") */
    Attnstat__Envelope *e = expect_error(&c, ATTNSTAT__CODE__UNSUPPORTED, "buffer 5");
    ck_assert(e->error->has_ref && e->error->ref == 5);
    attnstat__envelope__free_unpacked(e, NULL);
    for (uint32_t id = 2; id <= 4; id++)
        dh_register(&c, id, W.shm.name, W.shm.size); /* max_buffers is 4 */
    dh_register(&c, 6, W.shm.name, W.shm.size);
    attnstat__envelope__free_unpacked(expect_error(&c, ATTNSTAT__CODE__BUSY, "max_buffers"), NULL);
    Attnstat__Forget fg;
    ck_assert_int_eq(dh_send(&c, envelope_forget(&env, &fg, 1, 77, 0, 0)), 0);
    attnstat__envelope__free_unpacked(expect_error(&c, ATTNSTAT__CODE__UNKNOWN_BUFFER, "77"), NULL);

    /* Still usable: a good push on this very connection. */
    dh_push(&c, 101, 1, 0, &q, &k, 0, 0, 0);
    ck_assert_int_eq(dh_wait_ack(&c, 101, msg, sizeof msg, 30000), ATTNSTAT__CODE__OK);
    dh_close(&c);
    good_client_served("after-messages");
}
END_TEST

typedef struct {
    const char *what;
    void (*mutate)(dh_tensor *q, dh_tensor *k, Attnstat__Push *p);
    Attnstat__Code code;
    const char *needle;
} bad_push;

static int32_t cu_bad[3] = {0, 20, 10};
static int32_t cu_ok[3] = {0, 8, 16};

static void m_unknown_buf(dh_tensor *q, dh_tensor *k, Attnstat__Push *p) { (void)k; (void)p; q->buffer_id = 42; }
static void m_shape_past(dh_tensor *q, dh_tensor *k, Attnstat__Push *p) { (void)k; (void)p; q->shape[2] = 1 << 20; q->strides[1] = q->shape[2] * q->shape[3]; q->strides[0] = q->strides[1] * 2; }
static void m_stride_past(dh_tensor *q, dh_tensor *k, Attnstat__Push *p) { (void)q; (void)p; k->strides[2] = 1 << 20; }
static void m_offset_past(dh_tensor *q, dh_tensor *k, Attnstat__Push *p) { (void)k; (void)p; q->offset = (1 << 20) - 64; }
static void m_overflow(dh_tensor *q, dh_tensor *k, Attnstat__Push *p) { (void)k; (void)p; q->strides[1] = 1ull << 62; }
static void m_stride_huge(dh_tensor *q, dh_tensor *k, Attnstat__Push *p) { (void)k; (void)p; q->strides[0] = UINT64_MAX; }
static void m_dtype_mismatch(dh_tensor *q, dh_tensor *k, Attnstat__Push *p) { (void)q; (void)p; k->dtype = ATTNSTAT__DTYPE__BF16; }
static void m_dtype_unknown(dh_tensor *q, dh_tensor *k, Attnstat__Push *p) { (void)k; (void)p; q->dtype = (Attnstat__Dtype)9; }
static void m_heads_absurd(dh_tensor *q, dh_tensor *k, Attnstat__Push *p) { (void)k; (void)p; q->shape[1] = 1000000; q->strides[1] = 0; }
static void m_dim_absurd(dh_tensor *q, dh_tensor *k, Attnstat__Push *p) { (void)p; q->shape[3] = k->shape[3] = 1024; }
static void m_zero_dim(dh_tensor *q, dh_tensor *k, Attnstat__Push *p) { (void)k; (void)p; q->shape[2] = 0; }
static void m_work(dh_tensor *q, dh_tensor *k, Attnstat__Push *p) { (void)p; q->shape[2] = k->shape[2] = 100000; q->strides[2] = k->strides[2] = 0; q->strides[1] = k->strides[1] = 0; q->strides[0] = k->strides[0] = 0; }
/* One query row against 5M keys (zero strides: a tiny buffer): its rows cost 8e7 multiply-adds,
 * under max_push_work 1e8, but converting its K costs as much again. */
static int32_t cu_kq[3] = {0, 1, 1};
static int32_t cu_kk[3] = {0, 5000000, 5000000};
static void m_work_k(dh_tensor *q, dh_tensor *k, Attnstat__Push *p) { q->shape[2] = 1; k->shape[2] = 5000000; k->strides[2] = k->strides[1] = k->strides[0] = 0; p->n_cu_seqlens_q = 3; p->cu_seqlens_q = cu_kq; p->n_cu_seqlens_k = 3; p->cu_seqlens_k = cu_kk; }
static void m_layer(dh_tensor *q, dh_tensor *k, Attnstat__Push *p) { (void)q; (void)k; p->layer = 0x80000000u; }
static void m_heads_div(dh_tensor *q, dh_tensor *k, Attnstat__Push *p) { (void)p; q->shape[1] = 3; k->shape[1] = 2; }
static void m_d_mismatch(dh_tensor *q, dh_tensor *k, Attnstat__Push *p) { (void)q; (void)p; k->shape[3] = 4; }
static void m_b_mismatch(dh_tensor *q, dh_tensor *k, Attnstat__Push *p) { (void)q; (void)p; k->shape[0] = 2; }
static void m_stride_d(dh_tensor *q, dh_tensor *k, Attnstat__Push *p) { (void)k; (void)p; q->strides[3] = 2; }
static void m_misaligned(dh_tensor *q, dh_tensor *k, Attnstat__Push *p) { (void)k; (void)p; q->offset = 2; }
static void m_causal_window(dh_tensor *q, dh_tensor *k, Attnstat__Push *p) { (void)q; (void)k; p->has_causal = 1; p->causal = 1; p->has_window_right = 1; p->window_right = 4; }
static void m_scale(dh_tensor *q, dh_tensor *k, Attnstat__Push *p) { (void)q; (void)k; p->has_scale = 1; p->scale = -1.0f; }
static void m_seqlens(dh_tensor *q, dh_tensor *k, Attnstat__Push *p) { (void)q; (void)k; p->n_cu_seqlens_q = 3; p->cu_seqlens_q = cu_bad; p->n_cu_seqlens_k = 3; p->cu_seqlens_k = cu_ok; }
static void m_seqlens_one(dh_tensor *q, dh_tensor *k, Attnstat__Push *p) { (void)q; (void)k; p->n_cu_seqlens_q = 3; p->cu_seqlens_q = cu_ok; }
static void m_sampling(dh_tensor *q, dh_tensor *k, Attnstat__Push *p) { (void)q; (void)k; p->has_sample_every = 1; p->sample_every = 2; p->has_sample_rows = 1; p->sample_rows = 4; }
static void m_event(dh_tensor *q, dh_tensor *k, Attnstat__Push *p) { (void)q; (void)k; p->has_event_id = 1; p->event_id = 3; }

static const bad_push bad_pushes[] = {
    {"unknown buffer", m_unknown_buf, ATTNSTAT__CODE__UNKNOWN_BUFFER, "q.buffer_id 42"},
    {"shape past the buffer", m_shape_past, ATTNSTAT__CODE__OUT_OF_BOUNDS, "past the end of buffer"},
    {"stride past the buffer", m_stride_past, ATTNSTAT__CODE__OUT_OF_BOUNDS, "k: offset"},
    {"offset past the buffer", m_offset_past, ATTNSTAT__CODE__OUT_OF_BOUNDS, "q: offset"},
    {"offset overflow", m_overflow, ATTNSTAT__CODE__OUT_OF_BOUNDS, "overflows"},
    {"stride over int64", m_stride_huge, ATTNSTAT__CODE__OUT_OF_BOUNDS, "q.strides[0]"},
    {"dtype mismatch", m_dtype_mismatch, ATTNSTAT__CODE__BAD_REQUEST, "k.dtype bf16 differs"},
    {"unknown dtype", m_dtype_unknown, ATTNSTAT__CODE__BAD_REQUEST, "q.dtype 9"},
    {"absurd heads", m_heads_absurd, ATTNSTAT__CODE__BAD_REQUEST, "q.shape[1]"},
    {"absurd head dim", m_dim_absurd, ATTNSTAT__CODE__BAD_REQUEST, "q.shape[3]"},
    {"zero dimension", m_zero_dim, ATTNSTAT__CODE__BAD_REQUEST, "q.shape[2]"},
    {"too much work", m_work, ATTNSTAT__CODE__BAD_REQUEST, "max_push_work"},
    {"too much K conversion", m_work_k, ATTNSTAT__CODE__BAD_REQUEST, "converting K"},
    {"layer past int32", m_layer, ATTNSTAT__CODE__BAD_REQUEST, "layer 2147483648"},
    {"heads not divisible", m_heads_div, ATTNSTAT__CODE__BAD_REQUEST, "not a multiple"},
    {"D mismatch", m_d_mismatch, ATTNSTAT__CODE__BAD_REQUEST, "k.shape[3]"},
    {"B mismatch", m_b_mismatch, ATTNSTAT__CODE__BAD_REQUEST, "k.shape[0]"},
    {"D not contiguous", m_stride_d, ATTNSTAT__CODE__BAD_REQUEST, "q.strides[3]"},
    {"misaligned offset", m_misaligned, ATTNSTAT__CODE__BAD_REQUEST, "q.offset 2"},
    {"causal with window_right", m_causal_window, ATTNSTAT__CODE__BAD_REQUEST, "window_right"},
    {"negative scale", m_scale, ATTNSTAT__CODE__BAD_REQUEST, "scale"},
    {"bad cu_seqlens", m_seqlens, ATTNSTAT__CODE__BAD_REQUEST, "cu_seqlens_q"},
    {"one cu_seqlens", m_seqlens_one, ATTNSTAT__CODE__BAD_REQUEST, "cu_seqlens_k"},
    {"two samplings", m_sampling, ATTNSTAT__CODE__BAD_REQUEST, "sample"},
    {"unknown event", m_event, ATTNSTAT__CODE__UNKNOWN_BUFFER, "event_id 3"},
};

START_TEST(test_bad_pushes_get_their_code)
{
    dh_conn c;
    dh_connect(&c, &W.d);
    dh_hello(&c, "bad-pushes", 0, NULL);
    dh_register(&c, 1, W.shm.name, W.shm.size);
    size_t nbad = sizeof bad_pushes / sizeof bad_pushes[0];
    for (size_t i = 0; i < nbad; i++) {
        dh_tensor q, k;
        dh_tensor_contig(&q, 1, 0, ATTNSTAT__DTYPE__F32, 1, 2, 16, 8);
        dh_tensor_contig(&k, 1, 4096, ATTNSTAT__DTYPE__F32, 1, 2, 16, 8);
        Attnstat__TensorRef qr, kr;
        Attnstat__Push p;
        Attnstat__Envelope env;
        envelope_push(&env, &p, 1000 + i, (int64_t)i, 0, &qr, &kr);
        bad_pushes[i].mutate(&q, &k, &p);
        dh_tensor_ref(&qr, &q);
        dh_tensor_ref(&kr, &k);
        ck_assert_int_eq(dh_send(&c, &env), 0);
        char msg[512];
        int code = dh_wait_ack(&c, p.seq, msg, sizeof msg, 20000);
        ck_assert_msg(code == (int)bad_pushes[i].code, "%s: code %d, expected %d (%s)",
                      bad_pushes[i].what, code, bad_pushes[i].code, msg);
        ck_assert_msg(strstr(msg, bad_pushes[i].needle), "%s: message '%s' lacks '%s'",
                      bad_pushes[i].what, msg, bad_pushes[i].needle);
    }
    /* Same connection, a good push. */
    dh_tensor q, k;
    dh_tensor_contig(&q, 1, 0, ATTNSTAT__DTYPE__F32, 1, 2, 16, 8);
    dh_tensor_contig(&k, 1, 4096, ATTNSTAT__DTYPE__F32, 1, 2, 16, 8);
    dh_push(&c, 1, 1, 0, &q, &k, 0, 0, 0);
    char msg[256];
    ck_assert_int_eq(dh_wait_ack(&c, 1, msg, sizeof msg, 30000), ATTNSTAT__CODE__OK);
    Attnstat__Envelope *st = dh_status(&c);
    ck_assert_uint_eq(st->status_reply->rejected, nbad);
    ck_assert_uint_eq(st->status_reply->pushes_done, 1);
    attnstat__envelope__free_unpacked(st, NULL);
    dh_close(&c);
    good_client_served("after-pushes");

    /* Nothing of the rejected pushes reached the store. */
    sqlite3 *db = dh_db_open(&W.d);
    ck_assert_int_eq(dh_db_int(db, "SELECT count(*) FROM samples"), 2 * 2);
    sqlite3_close(db);
}
END_TEST

/* A push of the usual q and k (f32 [1, 2, 16, 8] at 0 and 4096 in buffer 1) with sinks s. */
static void push_with_sinks(dh_conn *c, uint64_t seq, dh_tensor *s, int want_results)
{
    dh_tensor q, k;
    dh_tensor_contig(&q, 1, 0, ATTNSTAT__DTYPE__F32, 1, 2, 16, 8);
    dh_tensor_contig(&k, 1, 4096, ATTNSTAT__DTYPE__F32, 1, 2, 16, 8);
    Attnstat__TensorRef qr, kr, sr;
    Attnstat__Push p;
    Attnstat__Envelope env;
    envelope_push(&env, &p, seq, (int64_t)seq, 0, &qr, &kr);
    dh_tensor_ref(&qr, &q);
    dh_tensor_ref(&kr, &k);
    dh_tensor_ref(&sr, s);
    p.sinks = &sr;
    p.has_want_results = want_results != 0;
    p.want_results = want_results != 0;
    ck_assert_int_eq(dh_send(c, &env), 0);
}

/* Attention sinks: a sinks TensorRef past the end of its buffer (by its offset, by an offset
 * whose span passes 2^64), for the wrong number of heads, or in a buffer never registered, is
 * refused with its code and a message naming the sinks; the connection goes on, and a good push
 * with sinks on it is computed with them: its stored statistics are stats_cpu()'s with the same
 * sinks, not those without. */
START_TEST(test_sinks_refused_then_served)
{
    dh_conn c;
    dh_connect(&c, &W.d);
    int64_t run_id = 0;
    dh_hello(&c, "sinks", 0, &run_id);
    dh_register(&c, 1, W.shm.name, W.shm.size);
    static const struct {
        uint32_t buf;
        uint64_t off, heads;
        Attnstat__Code code;
        const char *needle;
    } bad[] = {
        {1, (1 << 20) - 4, 2, ATTNSTAT__CODE__OUT_OF_BOUNDS,
         "sinks: offset 1048572 + 8 bytes reads up to byte 1048580, past the end of buffer 1"},
        {1, UINT64_MAX - 3, 2, ATTNSTAT__CODE__OUT_OF_BOUNDS, "sinks: its shape and strides "
         "overflow"},
        {1, 8192, 3, ATTNSTAT__CODE__BAD_REQUEST, "sinks.shape[1] is 3; it must be Hq = 2"},
        {7, 8192, 2, ATTNSTAT__CODE__UNKNOWN_BUFFER, "sinks.buffer_id 7 is not a registered buffer"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        dh_tensor s;
        dh_tensor_contig(&s, bad[i].buf, bad[i].off, ATTNSTAT__DTYPE__F32, 1, bad[i].heads, 1, 1);
        push_with_sinks(&c, 3000 + i, &s, 0);
        char msg[512];
        int code = dh_wait_ack(&c, 3000 + i, msg, sizeof msg, 20000);
        ck_assert_msg(code == (int)bad[i].code, "bad sinks %zu: code %d, expected %d (%s)", i, code,
                      bad[i].code, msg);
        ck_assert_msg(strstr(msg, bad[i].needle), "bad sinks %zu: message '%s' lacks '%s'", i, msg,
                      bad[i].needle);
    }

    /* The same connection: sinks near the logits (head 0 above most of them, head 1 below),
     * drawn until each changes its head's mean entropy by more than 1e-3 (a random sink can
     * change it by almost nothing: as a sink rises, the entropy with it counted moves one way,
     * then the other), so that the stored values, within 1e-5 of stats_cpu()'s with the sinks,
     * cannot also be those without. */
    dh_tensor q, k;
    dh_tensor_contig(&q, 1, 0, ATTNSTAT__DTYPE__F32, 1, 2, 16, 8);
    dh_tensor_contig(&k, 1, 4096, ATTNSTAT__DTYPE__F32, 1, 2, 16, 8);
    stats_problem pr;
    dh_problem(&pr, &q, W.shm.ptr, &k, W.shm.ptr);
    stats_head plain[2], ref[2];
    stats_error err;
    ck_assert_int_eq(stats_cpu(&pr, plain, NULL, NULL, &err), STATS_OK);
    float *sv = (float *)((char *)W.shm.ptr + 8192);
    pr.sinks = sv, pr.sinks_dtype = STATS_F32;
    for (int tries = 0;; tries++) {
        ck_assert_msg(tries < 100, "no sinks near the logits change both heads' entropy");
        sv[0] = (float)(1.5 + 0.5 * dh_gauss(&W.rng));
        sv[1] = (float)(-1.0 + 0.5 * dh_gauss(&W.rng));
        ck_assert_int_eq(stats_cpu(&pr, ref, NULL, NULL, &err), STATS_OK);
        if (fabs(ref[0].entropy_mean - plain[0].entropy_mean) > 1e-3 &&
            fabs(ref[1].entropy_mean - plain[1].entropy_mean) > 1e-3)
            break;
    }
    dh_tensor s;
    dh_tensor_contig(&s, 1, 8192, ATTNSTAT__DTYPE__F32, 1, 2, 1, 1);
    push_with_sinks(&c, 3100, &s, 1);
    char msg[512];
    int code = dh_wait_ack(&c, 3100, msg, sizeof msg, 30000);
    ck_assert_msg(code == ATTNSTAT__CODE__OK, "good push with sinks: code %d: %s", code, msg);
    dh_close(&c);

    sqlite3 *db = dh_db_open(&W.d);
    for (int h = 0; h < 2; h++) {
        char sql[256], v[64];
        snprintf(sql, sizeof sql, "SELECT printf('%%.17g', entropy_mean) || ' ' || "
                 "printf('%%.17g', entropy_norm_mean) FROM samples WHERE run_id = %lld AND "
                 "head = %d AND step = 3100", (long long)run_id, h);
        dh_db_text(db, sql, v, sizeof v);
        char *end;
        double mean = strtod(v, &end), norm = strtod(end, NULL);
        ck_assert_msg(dh_close_to_reference(mean, ref[h].entropy_mean) &&
                          dh_close_to_reference(norm, ref[h].entropy_norm_mean),
                      "head %d: stored %s, stats_cpu with the sinks %.9g %.9g", h, v,
                      ref[h].entropy_mean, ref[h].entropy_norm_mean);
    }
    sqlite3_close(db);
    good_client_served("after-sinks");
}
END_TEST

START_TEST(test_shrunk_segment_fails_the_push_only)
{
    /* A client truncates its registered segment: the push fails with a message, no crash. */
    dh_shm s;
    dh_shm_create(&s, "shrink", 1 << 16);
    dh_fill(&W.rng, s.ptr, (1 << 16) / 4, ATTNSTAT__DTYPE__F32, 1.0);
    dh_conn c;
    dh_connect(&c, &W.d);
    dh_hello(&c, "shrink", 0, NULL);
    dh_register(&c, 1, s.name, s.size);
    attnstat__envelope__free_unpacked(dh_status(&c), NULL); /* the registration is done */
    int fd = shm_open(s.name, O_RDWR, 0);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(ftruncate(fd, 1024), 0);
    close(fd);
    dh_tensor q, k;
    dh_tensor_contig(&q, 1, 0, ATTNSTAT__DTYPE__F32, 1, 2, 64, 32);
    dh_tensor_contig(&k, 1, 32768, ATTNSTAT__DTYPE__F32, 1, 2, 64, 32);
    dh_push(&c, 1, 1, 0, &q, &k, 0, 0, 0);
    char msg[512];
    int code = dh_wait_ack(&c, 1, msg, sizeof msg, 30000);
    ck_assert_msg(code == ATTNSTAT__CODE__BAD_REQUEST && strstr(msg, "shrank"), "code %d: %s", code,
                  msg);
    dh_close(&c);
    munmap(s.ptr, s.size);
    s.ptr = NULL;
    dh_shm_destroy(&s);
    good_client_served("after-shrink");
}
END_TEST

/* A Hello with run (host and uuid may be NULL), its reply's Error code (0: HelloReply) and
 * message. */
static int hello_names(dh_conn *c, const char *run, const char *host, char *uuid, char *msg,
                       size_t len)
{
    Attnstat__Hello h;
    Attnstat__Envelope env;
    envelope_hello(&env, &h, run);
    h.host = (char *)host;
    h.n_device_uuids = uuid ? 1 : 0;
    h.device_uuids = uuid ? &uuid : NULL;
    ck_assert_int_eq(dh_send(c, &env), 0);
    Attnstat__Envelope *r = dh_recv(c, 20000);
    ck_assert_msg(r != NULL, "no reply to a Hello");
    int code = r->msg_case == ATTNSTAT__ENVELOPE__MSG_ERROR ? (int)r->error->code : 0;
    snprintf(msg, len, "%s", code ? r->error->message : "");
    if (!code)
        ck_assert_int_eq(r->msg_case, ATTNSTAT__ENVELOPE__MSG_HELLO_REPLY);
    attnstat__envelope__free_unpacked(r, NULL);
    return code;
}

/* Names that hide text: a run name with U+202E (right-to-left override: "evil\u202Egpj.exe"
 * shows as "evilexe.jpg"), U+200B (zero width: a second "gpt" that looks like the first), U+2028
 * (a line separator), a host with U+2029 or U+FEFF, a device UUID with a tag character: each
 * refused with BAD_REQUEST naming the field and the character. A string with a NUL (protobuf-c
 * would cut it there: "a\0b" stored as "a") is refused with Error(FRAME) naming the field, in
 * the run name and in the config. None of them is stored; names in other scripts are taken. */
START_TEST(test_hidden_characters_and_nul_refused)
{
    char base[16];
    for (int i = 0; i < 8; i++)
        base[i] = (char)('a' + dh_next(&W.rng) % 26);
    base[8] = '\0';
    static const struct {
        const char *run_tail, *host, *uuid, *field, *cp;
    } bad[] = {
        {"\xe2\x80\xae" "gpj.exe", NULL, NULL, "run name", "U+202E"},
        {"\xe2\x80\x8b", NULL, NULL, "run name", "U+200B"},
        {"\xe2\x80\xa8" "x", NULL, NULL, "run name", "U+2028"},
        {"-h", "node\xe2\x80\xa9" "1", NULL, "host", "U+2029"},
        {"-h2", "\xef\xbb\xbfnode", NULL, "host", "U+FEFF"},
        {"-u", NULL, "GPU-\xf3\xa0\x80\x81", "device_uuids[0]", "U+E0001"},
    };
    dh_conn c;
    dh_connect(&c, &W.d);
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char run[64], msg[512], uuid[32];
        snprintf(run, sizeof run, "%s%s", base, bad[i].run_tail);
        if (bad[i].uuid)
            snprintf(uuid, sizeof uuid, "%s", bad[i].uuid);
        int code = hello_names(&c, run, bad[i].host, bad[i].uuid ? uuid : NULL, msg, sizeof msg);
        ck_assert_msg(code == ATTNSTAT__CODE__BAD_REQUEST && strstr(msg, bad[i].field) &&
                      strstr(msg, bad[i].cp) && strstr(msg, "format"), "bad name %zu: %d '%s'",
                      i, code, msg);
    }
    /* the connection is still usable: a name in another script (and an accent) is text */
    char run[64], msg[512];
    snprintf(run, sizeof run, "%s-\xe6\x97\xa5\xe6\x9c\xac-\xc3\xa9", base);
    ck_assert_msg(hello_names(&c, run, "n\xc3\xb6" "de", NULL, msg, sizeof msg) == 0, "%s", msg);
    dh_close(&c);

    /* a NUL inside the run name and inside the config: the frame packed, one byte set to 0 */
    for (int which = 0; which < 2; which++) {
        char name[32], cfg[64];
        snprintf(name, sizeof name, "%s-nul-%c", base, 'a' + which);
        snprintf(cfg, sizeof cfg, "{\"lr\": %u, \"tag\": \"%sZ%s\"}",
                 (unsigned)(dh_next(&W.rng) % 1000), base, base);
        Attnstat__Hello h;
        Attnstat__Envelope env;
        envelope_hello(&env, &h, name);
        h.config = cfg;
        size_t len;
        uint8_t *f = frame_pack(&env, FRAME_MAX_DEFAULT, &len);
        ck_assert_ptr_nonnull(f);
        const char *s = which ? cfg : name;
        uint8_t *at = memmem(f, len, s, strlen(s));
        ck_assert_ptr_nonnull(at);
        at[which ? strchr(cfg, 'Z') - cfg : (ptrdiff_t)strlen(base)] = 0; /* "base\0nul-a" */
        dh_connect(&c, &W.d);
        ck_assert_int_eq(dh_write_all(c.fd, f, len), 0);
        free(f);
        Attnstat__Envelope *e = dh_recv(&c, 20000);
        ck_assert_msg(e && e->msg_case == ATTNSTAT__ENVELOPE__MSG_ERROR &&
                      e->error->code == ATTNSTAT__CODE__FRAME, "a NUL in %s not refused",
                      which ? "the config" : "the run name");
        ck_assert_msg(strstr(e->error->message, which ? "hello.config" : "hello.run") &&
                      strstr(e->error->message, "NUL"), "%s", e->error->message);
        attnstat__envelope__free_unpacked(e, NULL);
        ck_assert(dh_wait_closed(&c, 20000));
        dh_close(&c);
    }
    good_client_served("after-hidden");
    ck_assert_int_eq(dh_stop(&W.d), 0);
    sqlite3 *db = dh_db_open(&W.d);
    char sql[200];
    snprintf(sql, sizeof sql, "SELECT count(*) FROM runs WHERE name LIKE '%s%%'", base);
    int64_t stored = dh_db_int(db, sql);
    snprintf(sql, sizeof sql, "SELECT count(*) FROM runs WHERE name = '%s'", base);
    int64_t cut = dh_db_int(db, sql);
    sqlite3_close(db);
    ck_assert_int_eq(stored, 1); /* the one in another script */
    ck_assert_int_eq(cut, 0);    /* no name cut at its NUL */
}
END_TEST

START_TEST(test_max_clients)
{
    /* A daemon of its own with room for two clients. */
    dh_daemon d2;
    dh_dir_init(&d2);
    dh_start(&d2, "--max-clients", "2", (const char *)NULL);
    dh_conn a, b, c;
    dh_connect(&a, &d2);
    dh_hello(&a, "one", 0, NULL);
    dh_connect(&b, &d2);
    dh_hello(&b, "two", 0, NULL);
    dh_connect(&c, &d2);
    Attnstat__Envelope *e = dh_recv(&c, 20000);
    ck_assert_msg(e && e->msg_case == ATTNSTAT__ENVELOPE__MSG_ERROR && e->error->code == ATTNSTAT__CODE__BUSY,
                  "third client not refused with BUSY");
    attnstat__envelope__free_unpacked(e, NULL);
    ck_assert(dh_wait_closed(&c, 20000));
    dh_close(&c);
    dh_close(&a);
    dh_close(&b);
    ck_assert_int_eq(dh_stop(&d2), 0);
    dh_cleanup(&d2, 0);
}
END_TEST

START_TEST(test_fifo_in_dev_shm_does_not_block)
{
    /* A client makes a FIFO where shm segments live and registers it: opening it must not block
     * the daemon (nobody ever writes to it); the registration is refused, others are served. */
    char name[64], path[96];
    snprintf(name, sizeof name, "/attnstat-test-fifo-%d", (int)getpid());
    snprintf(path, sizeof path, "/dev/shm%s", name);
    unlink(path);
    ck_assert_msg(mkfifo(path, 0600) == 0, "mkfifo %s: %s", path, strerror(errno));
    dh_conn c;
    dh_connect(&c, &W.d);
    dh_hello(&c, "fifo", 0, NULL);
    dh_register(&c, 1, name, 4096);
    Attnstat__Envelope *e = dh_expect(&c, ATTNSTAT__ENVELOPE__MSG_ERROR, 10000);
    unlink(path);
    ck_assert_msg(e != NULL, "no Error for a FIFO registration within 10 s (daemon blocked?)");
    ck_assert_int_eq(e->error->code, ATTNSTAT__CODE__BAD_REQUEST);
    ck_assert_msg(strstr(e->error->message, "regular file"), "message: %s", e->error->message);
    attnstat__envelope__free_unpacked(e, NULL);
    attnstat__envelope__free_unpacked(dh_status(&c), NULL);
    dh_close(&c);
    good_client_served("after-fifo");
}
END_TEST

START_TEST(test_segment_truncated_mid_compute)
{
    /* The segment is truncated while the worker reads it: the read faults (SIGBUS), that push
     * fails with a message, and the daemon carries on without leaking the job's workspace (the
     * sanitizer build checks the leak at exit). */
    dh_daemon d2;
    dh_dir_init(&d2);
    dh_start(&d2, "--max-push-work", "100000000000", (const char *)NULL);
    /* ~7e10 multiply-adds: seconds of the fastest CPU path, read 1024 keys at a time, so the
     * truncation below lands while K is still being read */
    enum { KN = 1 << 18, KD = 64, QN = 4096 };
    int sigbus = 0;
    for (int attempt = 0; attempt < 4 && !sigbus; attempt++) {
        dh_shm s;
        size_t kbytes = (size_t)KN * KD * 4, qbytes = (size_t)QN * KD * 4;
        dh_shm_create(&s, "trunc", qbytes + kbytes);
        dh_fill(&W.rng, s.ptr, (qbytes + kbytes) / 4, ATTNSTAT__DTYPE__F32, 1.0);
        dh_conn c;
        dh_connect(&c, &d2);
        dh_hello(&c, "trunc", 0, NULL);
        dh_register(&c, 1, s.name, s.size);
        attnstat__envelope__free_unpacked(dh_status(&c), NULL);
        dh_tensor q, k;
        dh_tensor_contig(&q, 1, 0, ATTNSTAT__DTYPE__F32, 1, 1, QN, KD);
        dh_tensor_contig(&k, 1, qbytes, ATTNSTAT__DTYPE__F32, 1, 1, KN, KD);
        dh_push(&c, 1, 1, 0, &q, &k, 0, 0, 0);
        dh_sleep_ms(150 + 150 * attempt);
        int fd = shm_open(s.name, O_RDWR, 0);
        ck_assert_int_ge(fd, 0);
        ck_assert_int_eq(ftruncate(fd, 4096), 0);
        close(fd);
        char msg[512];
        int code = dh_wait_ack(&c, 1, msg, sizeof msg, 120000);
        fprintf(stderr, "truncated mid-compute (attempt %d): code %d: %s\n", attempt, code, msg);
        sigbus = code == ATTNSTAT__CODE__BAD_REQUEST && strstr(msg, "SIGBUS") != NULL;
        dh_close(&c);
        munmap(s.ptr, s.size);
        s.ptr = NULL;
        dh_shm_destroy(&s);
    }
    ck_assert_msg(sigbus, "never truncated while the worker was reading");
    int code = dh_stop(&d2);
    dh_cleanup(&d2, code != 0);
    ck_assert_msg(code == 0, "attnstatd exit status %d (a leak report from the sanitizer?)", code);
}
END_TEST

static Suite *badinput_suite(void)
{
    Suite *s = suite_create("daemon_badinput");
    TCase *tc = tcase_create("badinput");
    tcase_set_timeout(tc, 300);
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_framing_errors_close_only_that_connection);
    tcase_add_test(tc, test_message_errors_keep_connection);
    tcase_add_test(tc, test_bad_pushes_get_their_code);
    tcase_add_test(tc, test_sinks_refused_then_served);
    tcase_add_test(tc, test_shrunk_segment_fails_the_push_only);
    tcase_add_test(tc, test_hidden_characters_and_nul_refused);
    tcase_add_test(tc, test_max_clients);
    tcase_add_test(tc, test_fifo_in_dev_shm_does_not_block);
    tcase_add_test(tc, test_segment_truncated_mid_compute);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return dh_run(badinput_suite());
}
