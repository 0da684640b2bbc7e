/* make_seeds.c — writes fuzz_session's seed corpus (tests/fuzz/corpus/): framed message streams a
 * client sends, each file one conversation, first byte the piece size fuzz_session writes them in
 * (0: at once). Run once after a protocol change: make_seeds DIR. Built with the fuzz tree.
 * Stage: a test tool; calls proto/ (envelope builders, frame_pack). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "envelope.h"
#include "frame.h"

#define SHM "/attnstat-fuzz"
#define SEED_MAX (1 << 16)

static uint8_t buf[SEED_MAX];
static size_t used;

static void put(const Attnstat__Envelope *env)
{
    size_t len;
    uint8_t *p = frame_pack(env, 1u << 20, &len);
    if (!p || used + len > sizeof buf) {
        fprintf(stderr, "make_seeds: a seed is too big\n");
        exit(1);
    }
    memcpy(buf + used, p, len);
    used += len;
    free(p);
}

static void begin(uint8_t piece)
{
    used = 0;
    buf[used++] = piece;
}

static void finish(const char *dir, const char *name)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(buf, 1, used, f) != used || fclose(f) != 0) {
        fprintf(stderr, "make_seeds: cannot write %s\n", path);
        exit(1);
    }
}

static void hello(const char *run, const char *host, const char *config)
{
    Attnstat__Hello h;
    Attnstat__Envelope env;
    envelope_hello(&env, &h, run);
    h.has_rank = 1;
    h.rank = 0;
    h.host = (char *)host;
    h.config = (char *)config;
    put(&env);
}

static void reg(uint32_t id, uint64_t size)
{
    Attnstat__RegisterBuffer rb;
    Attnstat__Envelope env;
    put(envelope_register_shm(&env, &rb, id, SHM, size));
}

/* A push of q and k [1, H, N, D] bf16, contiguous, at offsets 0 and q's bytes of buffer 1. */
static void push(uint64_t seq, int64_t step, uint32_t layer, uint64_t h, uint64_t n, uint64_t d,
                 int causal, uint32_t sample_rows)
{
    uint64_t shape[4] = {1, h, n, d}, strides[4] = {h * n * d, n * d, d, 1};
    uint64_t kshape[4] = {1, h, n, d}, kstrides[4] = {h * n * d, n * d, d, 1};
    Attnstat__TensorRef q, k;
    envelope_tensor(&q, 1, 0, ATTNSTAT__DTYPE__BF16, shape, strides);
    envelope_tensor(&k, 1, h * n * d * 2, ATTNSTAT__DTYPE__BF16, kshape, kstrides);
    Attnstat__Push p;
    Attnstat__Envelope env;
    envelope_push(&env, &p, seq, step, layer, &q, &k);
    p.has_causal = 1;
    p.causal = causal;
    if (sample_rows) {
        p.has_sample_rows = 1;
        p.sample_rows = sample_rows;
    }
    put(&env);
}

/* A Computed of n heads (at most 4) for (step, layer): entropy h (normalised hn) and max logit m
 * each, 64 rows; hn < 0 leaves the normalised entropy unset. */
static void computed(uint64_t seq, int64_t step, uint32_t layer, size_t n, double h, double hn,
                     double m)
{
    Attnstat__HeadStats hs[4], *ph[4];
    for (size_t i = 0; i < n && i < 4; i++) {
        attnstat__head_stats__init(&hs[i]);
        hs[i].head = (uint32_t)i;
        hs[i].rows = 64;
        hs[i].has_rows_norm = 1;
        hs[i].rows_norm = 64;
        hs[i].has_entropy_mean = hs[i].has_entropy_min = hs[i].has_entropy_max = 1;
        hs[i].entropy_mean = hs[i].entropy_min = hs[i].entropy_max = h;
        hs[i].has_entropy_std = 1;
        hs[i].has_entropy_norm_mean = hn >= 0;
        hs[i].entropy_norm_mean = hn;
        hs[i].has_collapsed_frac = 1;
        hs[i].collapsed_frac = hn >= 0 && hn < 0.1 ? 1.0 : 0.0;
        hs[i].has_max_logit = 1;
        hs[i].max_logit = m;
        ph[i] = &hs[i];
    }
    Attnstat__Computed c;
    Attnstat__Envelope env;
    put(envelope_computed(&env, &c, seq, step, layer, ph, n < 4 ? n : 4));
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: make_seeds DIR\n");
        return 2;
    }
    const char *dir = argv[1];
    Attnstat__Envelope env;

    begin(0); /* the common life of a trainer */
    hello("seed-run", "node-1", "{\"lr\": 0.001, \"layers\": [1, 2]}");
    reg(1, 64 * 1024);
    push(1, 0, 0, 2, 16, 16, 1, 0);
    push(2, 0, 1, 2, 16, 16, 0, 8);
    Attnstat__Status s;
    put(envelope_status(&env, &s));
    Attnstat__Forget fg;
    put(envelope_forget(&env, &fg, 1, 1, 0, 0));
    finish(dir, "trainer");

    begin(7); /* the same, a few bytes at a time */
    hello("seed-run-2", NULL, NULL);
    reg(1, 32 * 1024);
    push(1, 5, 3, 1, 8, 32, 1, 4);
    finish(dir, "trainer-pieces");

    begin(0); /* a watcher */
    Attnstat__Subscribe sub;
    put(envelope_subscribe(&env, &sub, 1, 1));
    put(envelope_status(&env, &s));
    finish(dir, "watcher");

    begin(0); /* pushes before Hello, unknown buffers, a second Hello */
    push(1, 0, 0, 1, 4, 4, 0, 0);
    hello("x", NULL, NULL);
    push(2, 0, 0, 1, 4, 4, 0, 0);
    hello("y", NULL, NULL);
    finish(dir, "out-of-order");

    begin(0); /* bad Hellos */
    hello("bad\nrun", NULL, NULL);
    hello("r", "host\x1b[2J", NULL);
    hello("r", NULL, "[1,2]");
    hello("r", NULL, "{\"a\": {\"b\": [true, false, null, -1.5e3, \"\\u00e9\"]}}");
    finish(dir, "bad-hellos");

    begin(0); /* a push past the buffer, odd strides */
    hello("bounds", NULL, NULL);
    reg(1, 4096);
    push(1, 0, 0, 4, 64, 64, 1, 0);
    finish(dir, "out-of-bounds");

    begin(0); /* parallel layouts: before Hello, good ones, refused ones, one pushes overflow */
    Attnstat__ParallelLayout lay;
    attnstat__parallel_layout__init(&lay);
    put(envelope_layout(&env, &lay));
    hello("layout", NULL, NULL);
    reg(1, 64 * 1024);
    lay.has_tp_rank = lay.has_tp_size = lay.has_layer_offset = 1;
    lay.tp_rank = 1;
    lay.tp_size = 2;
    lay.layer_offset = 12;
    put(envelope_layout(&env, &lay));
    push(1, 0, 0, 2, 16, 16, 1, 0);
    lay.tp_rank = 2; /* not under its size */
    put(envelope_layout(&env, &lay));
    lay.tp_rank = 0;
    lay.has_head_offset = 1;
    lay.head_offset = 1u << 24; /* the largest: a push's heads go past it */
    put(envelope_layout(&env, &lay));
    push(2, 1, 0, 2, 16, 16, 1, 0);
    finish(dir, "layouts");

    begin(0); /* the end of a run: operators' commands (good, refused), then Goodbye */
    hello("ending", NULL, NULL);
    reg(1, 64 * 1024);
    push(1, 0, 0, 2, 16, 16, 1, 0);
    Attnstat__Command cmd;
    put(envelope_command(&env, &cmd, ATTNSTAT__COMMAND__ACTION__ACK));           /* neither */
    cmd.has_run_id = 1;
    cmd.run_id = 1;
    put(&env);                                                                   /* the run's */
    put(envelope_command(&env, &cmd, ATTNSTAT__COMMAND__ACTION__SILENCE));
    cmd.has_run_id = cmd.has_until_ms = 1;
    cmd.run_id = 1;
    cmd.until_ms = 1;                                                            /* the past */
    put(&env);
    put(envelope_command(&env, &cmd, ATTNSTAT__COMMAND__ACTION__RESOLVE));
    cmd.has_alert_id = 1;
    cmd.alert_id = 1;
    put(&env);
    put(envelope_command(&env, &cmd, ATTNSTAT__COMMAND__ACTION__RETENTION));
    cmd.has_run_id = cmd.has_retain_ms = 1;
    cmd.run_id = 1;
    cmd.retain_ms = 86400000;
    put(&env);
    put(envelope_command(&env, &cmd, ATTNSTAT__COMMAND__ACTION__DELETE_RUN)); /* connected: busy */
    cmd.has_run_id = 1;
    cmd.run_id = 1;
    put(&env);
    Attnstat__Goodbye bye;
    put(envelope_goodbye(&env, &bye));
    push(2, 1, 0, 2, 16, 16, 1, 0);
    finish(dir, "lifecycle");

    begin(0); /* results computed in the client (fewer than the harness's client_inflight):
               * healthy, collapsed with growing logits, then ones the daemon refuses (out of
               * bounds, no heads) */
    hello("computed", NULL, NULL);
    for (int st = 0; st < 3; st++)
        computed((uint64_t)st + 1, st, 0, 4, 2.5, 0.8, 5.0);
    for (int st = 3; st < 6; st++)
        computed((uint64_t)st + 1, st, 0, 4, 0.01, 0.002, 1000.0 * st);
    computed(7, 6, 1, 2, -1.0, 2.0, 1e308);
    computed(8, 7, 1, 0, 0, 0, 0);
    finish(dir, "computed");

    begin(0); /* framing: a zero length */
    used += 4;
    memset(buf + 1, 0, 4);
    finish(dir, "zero-length");
    return 0;
}
