/* test_conn.c — unit tests of daemon/conn.c, the transport, over a socketpair (no daemon): frames
 * written in random pieces reach the handler whole and in order; a partial frame waits for its
 * end; a zero, oversize or undecodable frame is answered with Error(FRAME) and the connection
 * closed; a peer that does not read pauses reading at the write cap (non-essential messages are
 * dropped and counted) and reading resumes once it drains; a connection closed inside its handler
 * (by the handler, or by a send 4x over the cap) delivers nothing more and is freed once; a
 * half-close is the handler's to keep or close; a subscriber's results stop at sub_queue_bytes,
 * and a peer that reads none of its replies is closed after write_timeout. After each test every
 * handle is closed and the loop closes cleanly. Random data from a printed seed
 * (ATTNSTAT_TEST_SEED replays it). */
#include <uv.h>

#include "conn.h"
#include "counters.h"
#include "daemon_harness.h" /* seeds, the runner, and the usual system headers */
#include "envelope.h"
#include "frame.h"
#include "util.h"

static dh_rng R; /* seeded by main, printed */

static uint32_t rnd(void)
{
    return (uint32_t)dh_next(&R);
}

/* ---- a conn on one end of a socketpair, the test on the other ------------------------------- */

typedef struct {
    uv_loop_t loop;
    counters *cnt;
    conn *c;
    int peer;                  /* the test's end */
    frame_reader rd;           /* what the conn wrote */
    /* what the handler saw */
    uint64_t seqs[4096];
    int nmsg;
    int closes, closed, eofs;
    int keep_on_eof;
    int close_at;              /* on_message closes the conn at this message (1-based; 0: never) */
    int replies;               /* essential replies per message */
    size_t reply_bytes;        /* length of each reply's message */
    int flood;                 /* on_message sends essential replies until a send fails */
    int sends_failed;
} fixture;

static fixture F;
static uint64_t sub_cap;   /* the next open_conn()'s sub_queue_bytes (0: its out_queue_bytes) */

static void on_message(void *data, conn *c, const Attnstat__Envelope *env)
{
    fixture *f = data;
    ck_assert_ptr_eq(c, f->c);
    ck_assert_int_eq(f->closes, 0); /* nothing after the close began */
    ck_assert(env->msg_case == ATTNSTAT__ENVELOPE__MSG_RELEASE ||
              env->msg_case == ATTNSTAT__ENVELOPE__MSG_ERROR);
    uint64_t seq = env->msg_case == ATTNSTAT__ENVELOPE__MSG_RELEASE ? env->release->seq
                                                                     : env->error->ref;
    f->seqs[f->nmsg++ % 4096] = seq;
    if (f->close_at && f->nmsg == f->close_at) {
        conn_close(c, "closed by its handler");
        ck_assert_int_eq(f->closes, 1);
        ck_assert_int_eq(conn_write(c, env, 1), -1); /* sends fail from then on */
        return;
    }
    char *text = malloc(f->reply_bytes + 1);
    ck_assert_ptr_nonnull(text);
    memset(text, 'r', f->reply_bytes);
    text[f->reply_bytes] = '\0';
    for (int i = 0; i < f->replies || f->flood; i++) {
        Attnstat__Error e;
        Attnstat__Envelope out;
        if (conn_write(c, envelope_error(&out, &e, ATTNSTAT__CODE__BUSY, text, 1, seq), 1) != 0) {
            f->sends_failed++;
            break;
        }
    }
    free(text);
}

static int on_eof(void *data, conn *c)
{
    fixture *f = data;
    (void)c;
    f->eofs++;
    return f->keep_on_eof;
}

static void on_close(void *data, conn *c)
{
    fixture *f = data;
    ck_assert_ptr_eq(c, f->c);
    f->closes++;
}

static void on_closed(void *data)
{
    fixture *f = data;
    f->closed++;
    f->c = NULL;
}

static const conn_handler handler = {on_message, on_eof, on_close, on_closed};

static void open_conn(uint32_t max_frame, uint64_t out_queue_bytes, int small_buffers)
{
    memset(&F, 0, sizeof F);
    ck_assert_int_eq(uv_loop_init(&F.loop), 0);
    F.cnt = counters_new();
    ck_assert_ptr_nonnull(F.cnt);
    int sv[2];
    ck_assert_int_eq(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
    if (small_buffers) {
        int sz = 4096;
        ck_assert_int_eq(setsockopt(sv[0], SOL_SOCKET, SO_SNDBUF, &sz, sizeof sz), 0);
        ck_assert_int_eq(setsockopt(sv[1], SOL_SOCKET, SO_RCVBUF, &sz, sizeof sz), 0);
    }
    conn_limits lim = {max_frame, out_queue_bytes, sub_cap ? sub_cap : out_queue_bytes};
    sub_cap = 0;
    F.c = conn_new(&F.loop, 7, &lim, F.cnt);
    ck_assert_ptr_nonnull(F.c);
    ck_assert_int_eq(conn_adopt(F.c, sv[0]), 0);
    conn_set_handler(F.c, &handler, &F);
    ck_assert_int_eq(conn_read_start(F.c), 0);
    F.peer = sv[1];
    ck_assert_int_eq(fcntl(F.peer, F_SETFL, fcntl(F.peer, F_GETFL) | O_NONBLOCK), 0);
    frame_reader_init(&F.rd, 64u << 20);
}

static void walk_close(uv_handle_t *h, void *arg)
{
    (void)arg;
    if (!uv_is_closing(h))
        uv_close(h, NULL);
}

/* Closes what is left, runs the loop dry and checks it closes cleanly (no handle left). */
static void close_all(void)
{
    if (F.c)
        conn_close(F.c, "test over");
    uv_run(&F.loop, UV_RUN_DEFAULT);
    ck_assert_ptr_null(F.c);
    ck_assert_int_eq(F.closed, 1);
    ck_assert_int_eq(F.closes, 1);
    uv_walk(&F.loop, walk_close, NULL); /* nothing, if the conn closed all it had */
    ck_assert_int_eq(uv_run(&F.loop, UV_RUN_DEFAULT), 0);
    ck_assert_int_eq(uv_loop_close(&F.loop), 0);
    close(F.peer);
    frame_reader_free(&F.rd);
    counters_free(F.cnt);
}

/* Runs the loop (without blocking) for ms milliseconds, or until *until reaches want. */
static void spin(int ms, const int *until, int want)
{
    for (int i = 0; i < ms; i++) {
        uv_run(&F.loop, UV_RUN_NOWAIT);
        if (until && *until >= want)
            return;
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
}

static void peer_write(const void *buf, size_t n)
{
    const uint8_t *p = buf;
    while (n > 0) {
        ssize_t w = write(F.peer, p, n);
        if (w < 0 && errno == EAGAIN) {
            spin(1, NULL, 0); /* let the conn read */
            continue;
        }
        ck_assert_int_gt(w, 0);
        p += w;
        n -= (size_t)w;
    }
}

/* A frame of Release{seq}: the messages the tests send (any message will do for the transport). */
static uint8_t *release_frame(uint64_t seq, size_t *len)
{
    Attnstat__Release r;
    Attnstat__Envelope env;
    uint8_t *f = frame_pack(envelope_release(&env, &r, seq), FRAME_MAX_DEFAULT, len);
    ck_assert_ptr_nonnull(f);
    return f;
}

/* A large frame: Error{ref = seq} with pad bytes of message. */
static uint8_t *big_frame(uint64_t seq, size_t pad, size_t *len)
{
    char *text = malloc(pad + 1);
    ck_assert_ptr_nonnull(text);
    for (size_t i = 0; i < pad; i++)
        text[i] = (char)('a' + rnd() % 26);
    text[pad] = '\0';
    Attnstat__Error e;
    Attnstat__Envelope env;
    uint8_t *f = frame_pack(envelope_error(&env, &e, ATTNSTAT__CODE__OK, text, 1, seq),
                            FRAME_MAX_DEFAULT, len);
    free(text);
    ck_assert_ptr_nonnull(f);
    return f;
}

/* n frames one after the other in one buffer (*total bytes, the caller frees it): Release{seq[i]}
 * (seq NULL: 1, 2, ...), or with pad > 0 big frames of pad to 2 x pad bytes. */
static uint8_t *frames(int n, const uint64_t *seq, size_t pad, size_t *total)
{
    uint8_t *all = NULL;
    *total = 0;
    for (int i = 0; i < n; i++) {
        uint64_t s = seq ? seq[i] : (uint64_t)i + 1;
        size_t len;
        uint8_t *f = pad ? big_frame(s, pad + rnd() % pad, &len) : release_frame(s, &len);
        all = realloc(all, *total + len);
        ck_assert_ptr_nonnull(all);
        memcpy(all + *total, f, len);
        *total += len;
        free(f);
    }
    return all;
}

/* The next message the conn wrote (NULL on EOF or nothing within ms), and whether EOF was seen. */
static Attnstat__Envelope *peer_read(int ms, int *eof)
{
    *eof = 0;
    for (int i = 0; i < ms; i++) {
        const uint8_t *payload;
        uint32_t len;
        char err[160];
        int r = frame_reader_next(&F.rd, &payload, &len, err, sizeof err);
        ck_assert_msg(r >= 0, "the conn wrote a bad frame: %s", err);
        if (r == 1) {
            Attnstat__Envelope *e = frame_decode(payload, len, NULL);
            ck_assert_ptr_nonnull(e);
            frame_reader_consume(&F.rd);
            return e;
        }
        size_t avail;
        uint8_t *dst = frame_reader_space(&F.rd, 65536, &avail);
        ck_assert_ptr_nonnull(dst);
        ssize_t n = read(F.peer, dst, avail);
        if (n == 0) {
            *eof = 1;
            return NULL;
        }
        if (n > 0) {
            frame_reader_commit(&F.rd, (size_t)n);
            i--;
            continue;
        }
        ck_assert_int_eq(errno, EAGAIN);
        spin(1, NULL, 0);
    }
    return NULL;
}

/* Expects Error(FRAME) mentioning needle, then the connection closed; nmsg messages were handed
 * over before it. */
static void expect_frame_error_after(const char *needle, int nmsg)
{
    int eof;
    Attnstat__Envelope *e = peer_read(5000, &eof);
    ck_assert_msg(e != NULL, "no Error for a framing error");
    ck_assert_int_eq(e->msg_case, ATTNSTAT__ENVELOPE__MSG_ERROR);
    ck_assert_int_eq(e->error->code, ATTNSTAT__CODE__FRAME);
    ck_assert_msg(strstr(e->error->message, needle), "'%s' lacks '%s'", e->error->message, needle);
    attnstat__envelope__free_unpacked(e, NULL);
    ck_assert_ptr_null(peer_read(5000, &eof));
    ck_assert_msg(eof, "the connection was not closed after its Error");
    /* Lingering: our end is shut, but the conn reads (and drops) what the peer still sends until
     * the peer closes its end, so that a peer busy writing reads the Error instead of an EPIPE. */
    spin(100, &F.closed, 1);
    ck_assert_msg(F.closed == 0, "the conn closed before the peer closed its end: a peer that "
                  "was writing would meet EPIPE and never read the Error");
    uint8_t junk[64];
    for (size_t i = 0; i < sizeof junk; i++)
        junk[i] = (uint8_t)rnd();
    ck_assert_int_eq(write(F.peer, junk, sizeof junk), (ssize_t)sizeof junk);
    ck_assert_int_eq(shutdown(F.peer, SHUT_WR), 0);
    spin(5000, &F.closed, 1);
    ck_assert_int_eq(F.closed, 1);
    ck_assert_uint_eq(counters_get(F.cnt, CNT_FRAME_ERRORS), 1);
    ck_assert_int_eq(F.nmsg, nmsg);
}

static void expect_frame_error(const char *needle)
{
    expect_frame_error_after(needle, 0);
}

/* ---- tests ---------------------------------------------------------------------------------- */

/* Random frames in random pieces: each handed over whole, once, in order. */
START_TEST(test_frames_whole_in_order)
{
    open_conn(FRAME_MAX_DEFAULT, 1 << 20, 0);
    int n = 200 + (int)(rnd() % 300);
    uint64_t *want = malloc((size_t)n * sizeof *want);
    for (int i = 0; i < n; i++)
        want[i] = ((uint64_t)rnd() << 32) | rnd();
    size_t total;
    uint8_t *all = frames(n, want, 0, &total);
    for (size_t off = 0; off < total;) {
        size_t piece = 1 + rnd() % 40; /* often splits a header or a payload */
        if (piece > total - off)
            piece = total - off;
        peer_write(all + off, piece);
        off += piece;
        if (rnd() % 4 == 0)
            spin(1, NULL, 0);
    }
    spin(5000, &F.nmsg, n);
    ck_assert_int_eq(F.nmsg, n);
    for (int i = 0; i < n; i++)
        ck_assert_uint_eq(F.seqs[i], want[i]);
    free(all);
    free(want);
    close_all();
}
END_TEST

/* Half a frame waits; its end delivers it; a header alone waits too. */
START_TEST(test_partial_frame_waits)
{
    open_conn(FRAME_MAX_DEFAULT, 1 << 20, 0);
    uint64_t seq = ((uint64_t)rnd() << 32) | rnd() | 1;
    size_t len;
    uint8_t *f = release_frame(seq, &len);
    size_t cut = 1 + rnd() % (len - 1);
    peer_write(f, cut);
    spin(50, NULL, 0);
    ck_assert_int_eq(F.nmsg, 0);
    peer_write(f + cut, len - cut);
    spin(2000, &F.nmsg, 1);
    ck_assert_int_eq(F.nmsg, 1);
    ck_assert_uint_eq(F.seqs[0], seq);
    peer_write(f, FRAME_HEADER);
    spin(50, NULL, 0);
    ck_assert_int_eq(F.nmsg, 1);
    peer_write(f + FRAME_HEADER, len - FRAME_HEADER);
    spin(2000, &F.nmsg, 2);
    ck_assert_int_eq(F.nmsg, 2);
    free(f);
    close_all();
}
END_TEST

/* Half a frame and then nothing: conn_tick() past frame_timeout answers Error(FRAME) and closes
 * the connection (its slot freed); before the deadline, and while no bytes are pending, it does
 * nothing. The clock is the caller's: no test time passes. */
START_TEST(test_partial_frame_times_out)
{
    const uint64_t timeout = 200ull * 1000000ull;
    open_conn(FRAME_MAX_DEFAULT, 1 << 20, 0);
    size_t len;
    uint8_t *f = release_frame(((uint64_t)rnd() << 32) | rnd() | 1, &len);
    peer_write(f, len); /* a whole frame: nothing pending */
    spin(2000, &F.nmsg, 1);
    ck_assert_int_eq(F.nmsg, 1);
    conn_tick(F.c, util_mono_ns() + 100 * timeout, timeout, 0);
    spin(20, NULL, 0);
    ck_assert_int_eq(F.closes, 0);
    size_t cut = 1 + rnd() % (len - 1);
    peer_write(f, cut);
    spin(50, NULL, 0);
    uint64_t t0 = util_mono_ns();
    conn_tick(F.c, t0 + timeout / 2, timeout, 0); /* inside the deadline: nothing */
    spin(20, NULL, 0);
    ck_assert_int_eq(F.closes, 0);
    conn_tick(F.c, t0 + 10 * timeout, timeout, 0);
    free(f);
    expect_frame_error_after("incomplete", 1);
    close_all();
}
END_TEST

START_TEST(test_zero_length_closes)
{
    open_conn(FRAME_MAX_DEFAULT, 1 << 20, 0);
    uint8_t zero[8] = {0, 0, 0, 0, (uint8_t)(rnd() | 1), 2, 3, 4};
    peer_write(zero, sizeof zero);
    expect_frame_error("zero");
    close_all();
}
END_TEST

START_TEST(test_oversize_length_closes)
{
    uint32_t max = 4096 + rnd() % 65536;
    open_conn(max, 1 << 20, 0);
    uint32_t n = max + 1 + rnd() % 1000;
    uint8_t hdr[4] = {(uint8_t)n, (uint8_t)(n >> 8), (uint8_t)(n >> 16), (uint8_t)(n >> 24)};
    peer_write(hdr, sizeof hdr);
    expect_frame_error("over the limit");
    close_all();
}
END_TEST

START_TEST(test_undecodable_frame_closes)
{
    open_conn(FRAME_MAX_DEFAULT, 1 << 20, 0);
    uint8_t bad[12] = {8, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, (uint8_t)(rnd() | 0x80)};
    peer_write(bad, sizeof bad);
    expect_frame_error("not a valid Envelope");
    close_all();
}
END_TEST

/* Writes what the socket takes of buf[*off, n) without blocking; returns 1 when some went. */
static int peer_write_some(const uint8_t *buf, size_t n, size_t *off)
{
    int moved = 0;
    while (*off < n) {
        ssize_t w = write(F.peer, buf + *off, n - *off);
        if (w < 0) {
            ck_assert_msg(errno == EAGAIN, "write to the conn: %s", strerror(errno));
            break;
        }
        *off += (size_t)w;
        moved = 1;
    }
    return moved;
}

/* A peer that writes and never reads: reading pauses once the unsent replies pass the cap (and
 * non-essential messages are dropped, counted); once the peer drains, every message is handled. */
START_TEST(test_write_cap_pauses_reading)
{
    const uint64_t cap = 65536;
    open_conn(FRAME_MAX_DEFAULT, cap, 1);
    F.replies = 1;
    F.reply_bytes = 4000 + rnd() % 1000;
    const int n = 400;
    size_t total;
    uint8_t *all = frames(n, NULL, 6000, &total);
    /* Write until nothing more goes for 200 ms: the conn stopped reading. */
    size_t off = 0;
    for (int idle = 0; idle < 200 && off < total;) {
        idle = peer_write_some(all, total, &off) ? 0 : idle + 1;
        spin(1, NULL, 0);
    }
    int at_pause = F.nmsg;
    ck_assert_msg(off < total && at_pause > 0 && at_pause < n,
                  "%d of %d handled (%zu of %zu bytes in) while the peer read nothing", at_pause, n,
                  off, total);
    /* Bounded by the cap: what was handled is what the queue and the socket could take. */
    ck_assert_uint_lt((uint64_t)at_pause * F.reply_bytes, cap + 512 * 1024);
    spin(100, NULL, 0);
    ck_assert_int_eq(F.nmsg, at_pause); /* paused, not slow */
    Attnstat__Error e;
    Attnstat__Envelope out;
    ck_assert_int_eq(conn_write(F.c, envelope_error(&out, &e, ATTNSTAT__CODE__BUSY, "x", 0, 0), 0), -1);
    ck_assert_uint_eq(counters_get(F.cnt, CNT_MESSAGES_DROPPED), 1);
    ck_assert(conn_is_open(F.c));
    /* The peer reads (and writes the rest): every reply comes, every message is handled. */
    int got = 0, eof = 0;
    for (int waited = 0; got < n; waited++) {
        ck_assert_msg(waited < 5000, "reply %d of %d missing (handled %d)", got, n, F.nmsg);
        peer_write_some(all, total, &off);
        Attnstat__Envelope *r = peer_read(1, &eof);
        ck_assert(!eof);
        if (!r)
            continue;
        waited = 0;
        ck_assert_int_eq(r->msg_case, ATTNSTAT__ENVELOPE__MSG_ERROR);
        ck_assert_uint_eq(r->error->ref, (uint64_t)got + 1);
        attnstat__envelope__free_unpacked(r, NULL);
        got++;
    }
    ck_assert_uint_eq(off, total);
    ck_assert_int_eq(F.nmsg, n);
    ck_assert_int_eq(F.sends_failed, 0);
    free(all);
    close_all();
}
END_TEST

/* The handler closes its connection on a message with more frames buffered behind it: nothing
 * more is delivered, the close callbacks come once, and the loop closes cleanly. */
START_TEST(test_close_inside_handler)
{
    open_conn(FRAME_MAX_DEFAULT, 1 << 20, 0);
    int n = 5 + (int)(rnd() % 20);
    F.close_at = 1 + (int)(rnd() % (uint32_t)(n - 1));
    size_t total;
    uint8_t *all = frames(n, NULL, 0, &total);
    peer_write(all, total); /* one write: the frames arrive in one read */
    free(all);
    spin(2000, &F.closed, 1);
    ck_assert_int_eq(F.nmsg, F.close_at);
    ck_assert_int_eq(F.closes, 1);
    ck_assert_int_eq(F.closed, 1);
    close_all();
}
END_TEST

/* A send that takes the queue 4x over the cap closes the connection inside the handler (the
 * client does not read): the handler's next send fails, the loop closes cleanly. */
START_TEST(test_send_closes_inside_handler)
{
    const uint64_t cap = 65536;
    open_conn(FRAME_MAX_DEFAULT, cap, 1);
    F.flood = 1;
    F.reply_bytes = 1000 + rnd() % 3000;
    size_t len;
    uint8_t *f = release_frame(1, &len);
    peer_write(f, len);
    peer_write(f, len);
    free(f);
    spin(2000, &F.closed, 1);
    ck_assert_int_eq(F.nmsg, 1); /* the second message came after the close: not delivered */
    ck_assert_int_eq(F.sends_failed, 1);
    ck_assert_int_eq(F.closes, 1);
    ck_assert_int_eq(F.closed, 1);
    close_all();
}
END_TEST

/* A half-close: kept open when the handler says so (reading stops), closed otherwise. */
START_TEST(test_half_close)
{
    for (int keep = 0; keep < 2; keep++) {
        open_conn(FRAME_MAX_DEFAULT, 1 << 20, 0);
        F.keep_on_eof = keep;
        size_t len;
        uint8_t *f = release_frame(1 + rnd() % 1000, &len);
        peer_write(f, len);
        free(f);
        ck_assert_int_eq(shutdown(F.peer, SHUT_WR), 0);
        spin(2000, &F.eofs, 1);
        spin(50, NULL, 0);
        ck_assert_int_eq(F.nmsg, 1);
        ck_assert_int_eq(F.eofs, 1);
        if (keep) {
            ck_assert_int_eq(F.closes, 0);
            ck_assert(conn_half_closed(F.c));
            ck_assert(conn_is_open(F.c));
            conn_close_after_flush(F.c, "end of stream");
            int eof;
            Attnstat__Envelope *r = peer_read(2000, &eof); /* no reply was asked: EOF */
            ck_assert_ptr_null(r);
            ck_assert(eof || F.closed);
        } else {
            ck_assert_int_eq(F.closes, 1);
        }
        spin(2000, &F.closed, 1);
        close_all();
    }
}
END_TEST

/* A subscriber's results and alerts stop at sub_queue_bytes of unsent bytes (each further one
 * dropped and counted) while its essential replies still queue: the memory a subscriber that does
 * not read can hold is the smaller cap, not out_queue_bytes. */
START_TEST(test_sub_cap_drops_results)
{
    const uint64_t cap = 4096 + rnd() % 8192;
    sub_cap = cap;
    open_conn(FRAME_MAX_DEFAULT, 1 << 20, 1);
    char text[1500];
    memset(text, 's', sizeof text - 1);
    text[sizeof text - 1] = '\0';
    Attnstat__Error e;
    Attnstat__Envelope out;
    envelope_error(&out, &e, ATTNSTAT__CODE__BUSY, text, 0, 0);
    int queued = 0, dropped = 0;
    for (int i = 0; i < 400; i++) {
        if (conn_write(F.c, &out, 0) == 0)
            queued++;
        else
            dropped++;
    }
    ck_assert_msg(dropped > 0 && (uint64_t)queued * 1400 <= cap, /* each frame is > 1400 bytes */
                  "%d queued, %d dropped under a cap of %llu bytes", queued, dropped,
                  (unsigned long long)cap);
    ck_assert_uint_eq(counters_get(F.cnt, CNT_MESSAGES_DROPPED), (uint64_t)dropped);
    ck_assert_int_eq(conn_write(F.c, &out, 1), 0); /* an essential reply still goes */
    ck_assert(conn_is_open(F.c));
    close_all();
}
END_TEST

/* A peer that reads none of its replies: conn_tick() past write_timeout closes the connection and
 * counts it; while nothing waits, or inside the deadline, it does nothing. The clock is the
 * caller's: no test time passes. */
START_TEST(test_write_stall_closes)
{
    const uint64_t timeout = (200ull + rnd() % 800) * 1000000ull;
    open_conn(FRAME_MAX_DEFAULT, 1 << 20, 1);
    uint64_t t0 = util_mono_ns();
    conn_tick(F.c, t0, 0, timeout); /* nothing waits */
    conn_tick(F.c, t0 + 10 * timeout, 0, timeout);
    spin(20, NULL, 0);
    ck_assert_int_eq(F.closes, 0);
    char text[4000];
    memset(text, 'w', sizeof text - 1);
    text[sizeof text - 1] = '\0';
    for (int i = 0; i < 64; i++) {
        Attnstat__Error e;
        Attnstat__Envelope out;
        ck_assert_int_eq(conn_write(F.c, envelope_error(&out, &e, ATTNSTAT__CODE__BUSY, text, 1,
                                                        (uint64_t)i), 1), 0);
    }
    spin(20, NULL, 0); /* handed to the socket: most of it waits */
    conn_tick(F.c, t0 + 11 * timeout, 0, timeout);
    conn_tick(F.c, t0 + 11 * timeout + timeout / 2, 0, timeout); /* inside the deadline */
    spin(20, NULL, 0);
    ck_assert_int_eq(F.closes, 0);
    conn_tick(F.c, t0 + 13 * timeout, 0, timeout);
    spin(2000, &F.closed, 1);
    ck_assert_int_eq(F.closes, 1);
    ck_assert_uint_eq(counters_get(F.cnt, CNT_CONNS_STALLED), 1);
    close_all();
}
END_TEST

int main(void)
{
    R = dh_rng_new("test_conn");
    signal(SIGPIPE, SIG_IGN); /* as attnstatd does: a closed peer is an error to report, not a death */
    Suite *s = suite_create("conn");
    TCase *tc = tcase_create("conn");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_frames_whole_in_order);
    tcase_add_test(tc, test_partial_frame_waits);
    tcase_add_test(tc, test_partial_frame_times_out);
    tcase_add_test(tc, test_zero_length_closes);
    tcase_add_test(tc, test_oversize_length_closes);
    tcase_add_test(tc, test_undecodable_frame_closes);
    tcase_add_test(tc, test_write_cap_pauses_reading);
    tcase_add_test(tc, test_close_inside_handler);
    tcase_add_test(tc, test_send_closes_inside_handler);
    tcase_add_test(tc, test_half_close);
    tcase_add_test(tc, test_sub_cap_drops_results);
    tcase_add_test(tc, test_write_stall_closes);
    suite_add_tcase(s, tc);
    return dh_run(s);
}
