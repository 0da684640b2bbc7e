/* trainer_synth.c — attnstat-synth, a synthetic training process: it pushes bf16 Q/K tensors for
 * several layers and heads over a few hundred steps through libattnstat, the way a training job
 * would, with attention whose health changes over the run:
 *
 *   healthy heads    queries and keys are fresh Gaussian vectors: spread-out attention.
 *   collapsing heads each query drifts towards the direction of the first key (the "sink"
 *                    token every causal row can see): q = sqrt(1-a^2) z + a G sqrt(D) u, with
 *                    a rising from 0 to 1 between 30% and 80% of the run, so the attention of
 *                    every row concentrates on one key and the entropy falls towards 0.
 *   growing head     queries and keys are scaled by s(t) = exp(t/T ln 6): the logits grow like
 *                    s^2 and the max logit passes the QK-Clip ceiling (100) late in the run.
 *
 * Nothing is faked: the daemon computes the statistics from these tensors. The data depend only
 * on --seed (and the shape flags). By default each step waits until the daemon has acknowledged
 * its pushes, so every step is stored; --free-run pushes without waiting, as a real trainer does,
 * and reports what was dropped.
 *
 * Stage: a program on top of libattnstat; calls only the public API (include/attnstat.h). */
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <time.h>

#include "attnstat.h"

typedef struct {
    const char *socket, *run;
    int steps, layers, heads, kv_heads, seq, dim, batch, rank;
    uint64_t seed;
    char collapse[256], grow[256];
    int free_run, quiet, sample_every;
    int no_goodbye;          /* leave without Goodbye: the run stays live for run_grace_ms */
    int has_layout;
    attnstat_layout layout;  /* --tp-rank ... (set after hello when any is given) */
} synth_opts;

/* ---- Deterministic random numbers --------------------------------------------------------------*/
typedef struct {
    uint64_t s;
    int have;
    double spare;
} synth_rng;

static uint64_t synth_next(synth_rng *r)
{
    r->s += 0x9e3779b97f4a7c15ULL;
    uint64_t z = r->s;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static double synth_gauss(synth_rng *r)
{
    if (r->have) {
        r->have = 0;
        return r->spare;
    }
    double u1 = ((double)(synth_next(r) >> 11) + 0.5) / 9007199254740992.0;
    double u2 = ((double)(synth_next(r) >> 11) + 0.5) / 9007199254740992.0;
    double m = sqrt(-2.0 * log(u1));
    r->spare = m * sin(2 * M_PI * u2);
    r->have = 1;
    return m * cos(2 * M_PI * u2);
}

/* float -> bf16, round to nearest even (inputs here are finite). */
static uint16_t synth_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

/* ---- Which heads do what -----------------------------------------------------------------------*/
/* "L.H,L.H" -> membership test. */
static int synth_listed(const char *list, int layer, int head)
{
    const char *p = list;
    while (*p) {
        char *end;
        long l = strtol(p, &end, 10);
        if (*end != '.')
            return 0;
        long h = strtol(end + 1, &end, 10);
        if (l == layer && h == head)
            return 1;
        p = *end == ',' ? end + 1 : end;
        if (*end && *end != ',')
            return 0;
    }
    return 0;
}

static int synth_check_list(const char *name, const char *list, int layers, int heads)
{
    const char *p = list;
    while (*p) {
        char *end;
        long l = strtol(p, &end, 10);
        if (end == p || *end != '.') {
            fprintf(stderr, "attnstat-synth: %s wants LAYER.HEAD[,LAYER.HEAD...], not '%s'\n",
                    name, list);
            return -1;
        }
        const char *hp = end + 1;
        long h = strtol(hp, &end, 10);
        if (end == hp || (*end && *end != ',') || l < 0 || l >= layers || h < 0 || h >= heads) {
            fprintf(stderr, "attnstat-synth: %s: '%s' is not LAYER.HEAD with layer < %d and head < "
                    "%d\n", name, list, layers, heads);
            return -1;
        }
        p = *end ? end + 1 : end;
    }
    return 0;
}

static void synth_usage(FILE *f)
{
    fprintf(f,
            "usage: attnstat-synth [--socket PATH] [--run NAME] [--steps N] [--layers L]\n"
            "                      [--heads H] [--kv-heads HKV] [--seq N] [--dim D] [--batch B]\n"
            "                      [--seed S] [--collapse L.H,...] [--grow L.H,...] [--rank R]\n"
            "                      [--sample-every K] [--free-run] [--quiet] [--no-goodbye]\n"
            "                      [--version]\n"
            "                      [--tp-rank R --tp-size S] [--pp-rank R --pp-size S]\n"
            "                      [--layer-offset L] [--dp-rank R --dp-size S]\n\n"
            "A synthetic training process: pushes bf16 Q/K of every layer at every step to\n"
            "attnstatd through libattnstat. The heads named by --collapse drift into entropy\n"
            "collapse (default 1.3,2.5,3.0); those named by --grow have logits growing past 100\n"
            "(default 3.6); the others stay healthy. Deterministic for a given --seed.\n"
            "Defaults: --run synth --steps 300 --layers 4 --heads 8 --seq 256 --dim 64 --batch 1\n"
            "--seed 1; socket as attnstatd's ($ATTNSTAT_SOCKET, $XDG_RUNTIME_DIR/attnstat/...).\n"
            "Each step waits for the daemon's acknowledgements unless --free-run is given.\n"
            "At its end it closes its client, which ends the run (Goodbye: its alerts are\n"
            "resolved); --no-goodbye leaves without it, as a process that crashed or restarts\n"
            "from a checkpoint would: the run and its alerts stay for attnstatd's run_grace_ms.\n"
            "The layout flags make it one process of a parallel job (attnstat_set_layout): its\n"
            "--heads are tensor-parallel rank R's share, its --layers start at --layer-offset;\n"
            "--collapse and --grow name its own (local) layers and heads.\n");
}

static int synth_int(const char *name, const char *v, long lo, long hi, int *out)
{
    char *end;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (errno || end == v || *end || x < lo || x > hi) {
        fprintf(stderr, "attnstat-synth: %s wants an integer in %ld..%ld, not '%s'\n", name, lo, hi,
                v);
        return -1;
    }
    *out = (int)x;
    return 0;
}

static int synth_parse(int argc, char **argv, synth_opts *o)
{
    memset(o, 0, sizeof *o);
    o->run = "synth";
    o->steps = 300;
    o->layers = 4;
    o->heads = 8;
    o->kv_heads = 0;
    o->seq = 256;
    o->dim = 64;
    o->batch = 1;
    o->seed = 1;
    o->sample_every = 1;
    snprintf(o->collapse, sizeof o->collapse, "1.3,2.5,3.0");
    snprintf(o->grow, sizeof o->grow, "3.6");
    attnstat_layout_init(&o->layout);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            synth_usage(stdout);
            exit(0);
        }
        if (!strcmp(a, "--version")) {
            printf("attnstat-synth %s (libattnstat %s)\n", ATTNSTAT_VERSION, attnstat_version());
            exit(0);
        }
        if (!strcmp(a, "--free-run")) {
            o->free_run = 1;
            continue;
        }
        if (!strcmp(a, "--quiet")) {
            o->quiet = 1;
            continue;
        }
        if (!strcmp(a, "--no-goodbye")) {
            o->no_goodbye = 1;
            continue;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "attnstat-synth: unknown option or missing value: '%s' (see --help)\n",
                    a);
            return -1;
        }
        const char *v = argv[++i];
        int rc = 0;
        if (!strcmp(a, "--socket"))
            o->socket = v;
        else if (!strcmp(a, "--run"))
            o->run = v;
        else if (!strcmp(a, "--collapse"))
            snprintf(o->collapse, sizeof o->collapse, "%s", v);
        else if (!strcmp(a, "--grow"))
            snprintf(o->grow, sizeof o->grow, "%s", v);
        else if (!strcmp(a, "--steps"))
            rc = synth_int(a, v, 1, 1000000, &o->steps);
        else if (!strcmp(a, "--layers"))
            rc = synth_int(a, v, 1, 1024, &o->layers);
        else if (!strcmp(a, "--heads"))
            rc = synth_int(a, v, 1, 1024, &o->heads);
        else if (!strcmp(a, "--kv-heads"))
            rc = synth_int(a, v, 1, 1024, &o->kv_heads);
        else if (!strcmp(a, "--seq"))
            rc = synth_int(a, v, 2, 1 << 20, &o->seq);
        else if (!strcmp(a, "--dim"))
            rc = synth_int(a, v, 1, 256, &o->dim);
        else if (!strcmp(a, "--batch"))
            rc = synth_int(a, v, 1, 1024, &o->batch);
        else if (!strcmp(a, "--rank"))
            rc = synth_int(a, v, 0, 1 << 20, &o->rank);
        else if (!strcmp(a, "--sample-every"))
            rc = synth_int(a, v, 1, 1 << 20, &o->sample_every);
        else if (!strcmp(a, "--tp-rank") || !strcmp(a, "--tp-size") || !strcmp(a, "--pp-rank") ||
                 !strcmp(a, "--pp-size") || !strcmp(a, "--dp-rank") || !strcmp(a, "--dp-size") ||
                 !strcmp(a, "--layer-offset")) {
            attnstat_layout *l = &o->layout;
            int32_t *f = !strcmp(a, "--tp-rank")   ? &l->tp_rank
                         : !strcmp(a, "--tp-size") ? &l->tp_size
                         : !strcmp(a, "--pp-rank") ? &l->pp_rank
                         : !strcmp(a, "--pp-size") ? &l->pp_size
                         : !strcmp(a, "--dp-rank") ? &l->dp_rank
                         : !strcmp(a, "--dp-size") ? &l->dp_size
                                                   : &l->layer_offset;
            int x = 0;
            rc = synth_int(a, v, 0, 1 << 20, &x);
            *f = x;
            o->has_layout = 1;
        }
        else if (!strcmp(a, "--seed")) {
            char *end;
            errno = 0;
            o->seed = strtoull(v, &end, 10);
            if (errno || end == v || *end) {
                fprintf(stderr, "attnstat-synth: --seed wants a non-negative integer, not '%s'\n", v);
                return -1;
            }
        } else {
            fprintf(stderr, "attnstat-synth: unknown option '%s' (see --help)\n", a);
            return -1;
        }
        if (rc)
            return -1;
    }
    if (!o->kv_heads)
        o->kv_heads = o->heads;
    if (o->heads % o->kv_heads) {
        fprintf(stderr, "attnstat-synth: --heads %d is not a multiple of --kv-heads %d\n", o->heads,
                o->kv_heads);
        return -1;
    }
    if (synth_check_list("--collapse", o->collapse, o->layers, o->heads) ||
        synth_check_list("--grow", o->grow, o->layers, o->heads))
        return -1;
    return 0;
}

static void synth_on_alert(void *user, const attnstat_alert *al)
{
    const synth_opts *o = user;
    if (o->quiet)
        return;
    printf("  alert %-7s %-13s layer %u head %u at step %lld: value %.4g, threshold %.4g\n",
           attnstat_state_name(al->state), attnstat_rule_name(al->rule), al->layer, al->head,
           (long long)al->step, al->value, al->threshold);
}

int main(int argc, char **argv)
{
    synth_opts o;
    if (synth_parse(argc, argv, &o) != 0)
        return 2;
    signal(SIGPIPE, SIG_IGN);
    const int L = o.layers, H = o.heads, HKV = o.kv_heads, N = o.seq, D = o.dim, B = o.batch;
    const size_t qn = (size_t)B * H * N * D, kn = (size_t)B * HKV * N * D;
    uint16_t *q = malloc(qn * sizeof *q), *k = malloc(kn * sizeof *k);
    float *sink = malloc((size_t)L * HKV * D * sizeof *sink); /* unit direction per K head */
    float *kbase = malloc((size_t)L * B * HKV * N * D * sizeof *kbase);
    if (!q || !k || !sink || !kbase) {
        fprintf(stderr, "attnstat-synth: out of memory for %zu-element tensors\n", qn + kn);
        return 1;
    }

    /* Fixed keys per layer (the model's "content"), with a little fresh noise each step. */
    synth_rng rng = {.s = o.seed * 0x2545F4914F6CDD1DULL + 1};
    for (size_t i = 0; i < (size_t)L * B * HKV * N * D; i++)
        kbase[i] = (float)synth_gauss(&rng);
    for (int l = 0; l < L; l++)
        for (int g = 0; g < HKV; g++) {
            /* the sink direction: key 0 of batch 0 of this K head, normalised */
            const float *k0 = &kbase[(((size_t)l * B + 0) * HKV + g) * N * D];
            double nrm = 0;
            for (int d = 0; d < D; d++)
                nrm += (double)k0[d] * k0[d];
            nrm = sqrt(nrm);
            for (int d = 0; d < D; d++)
                sink[((size_t)l * HKV + g) * D + d] = (float)(k0[d] / nrm);
        }

    attnstat_connect_opts co;
    attnstat_connect_opts_init(&co);
    co.socket_path = o.socket;
    co.ring_bytes = 64ull << 20;
    attnstat_client *c;
    attnstat_error err;
    if (attnstat_connect_ex(&co, &c, &err) != ATTNSTAT_OK) {
        fprintf(stderr, "attnstat-synth: %s\n", err.msg);
        return 1;
    }
    char config[1024];
    snprintf(config, sizeof config,
             "{\"program\": \"attnstat-synth\", \"seed\": %llu, \"steps\": %d, \"layers\": %d, "
             "\"heads\": %d, \"kv_heads\": %d, \"seq\": %d, \"dim\": %d, \"batch\": %d, "
             "\"collapse\": \"%s\", \"grow\": \"%s\"}",
             (unsigned long long)o.seed, o.steps, L, H, HKV, N, D, B, o.collapse, o.grow);
    if (attnstat_hello(c, o.run, o.rank, NULL, config) != ATTNSTAT_OK) {
        fprintf(stderr, "attnstat-synth: %s\n", attnstat_last_error(c));
        attnstat_close(c);
        return 1;
    }
    if (o.has_layout && attnstat_set_layout(c, &o.layout) != ATTNSTAT_OK) {
        fprintf(stderr, "attnstat-synth: %s\n", attnstat_last_error(c));
        attnstat_close(c);
        return 1;
    }
    attnstat_set_alert_callback(c, synth_on_alert, &o);
    if (attnstat_subscribe(c, 1, 0) != ATTNSTAT_OK)
        fprintf(stderr, "attnstat-synth: alerts will not be shown: %s\n", attnstat_last_error(c));
    if (!o.quiet)
        printf("attnstat-synth: run '%s' (id %lld): %d steps x %d layers, Q [%d,%d,%d,%d] K "
               "[%d,%d,%d,%d] bf16, causal; collapsing %s; growing %s; seed %llu\n",
               o.run, (long long)attnstat_run_id(c), o.steps, L, B, H, N, D, B, HKV, N, D,
               o.collapse, o.grow, (unsigned long long)o.seed);

    const double G = 2.5, sqrtD = sqrt((double)D);
    int rc = 0;
    for (int step = 0; step < o.steps; step++) {
        double t = o.steps > 1 ? (double)step / (o.steps - 1) : 1.0;
        double a = (t - 0.3) / 0.5;
        a = a < 0 ? 0 : a > 1 ? 1 : a;
        double grow = exp(t * log(6.0));
        for (int l = 0; l < L; l++) {
            /* K: the layer's keys plus 10% fresh noise; a growing head's K group is scaled. */
            for (int b = 0; b < B; b++)
                for (int g = 0; g < HKV; g++) {
                    int scaled = 0;
                    for (int h = g * (H / HKV); h < (g + 1) * (H / HKV); h++)
                        scaled |= synth_listed(o.grow, l, h);
                    double s = scaled ? grow : 1.0;
                    for (int n = 0; n < N; n++)
                        for (int d = 0; d < D; d++) {
                            size_t i = (((size_t)b * HKV + g) * N + n) * D + d;
                            double base = kbase[(((size_t)l * B + b) * HKV + g) * N * D +
                                                (size_t)n * D + d];
                            k[i] = synth_bf16((float)(s * (base + 0.1 * synth_gauss(&rng))));
                        }
                }
            for (int b = 0; b < B; b++)
                for (int h = 0; h < H; h++) {
                    int g = h / (H / HKV);
                    int collapsing = synth_listed(o.collapse, l, h);
                    double s = synth_listed(o.grow, l, h) ? grow : 1.0;
                    const float *u = &sink[((size_t)l * HKV + g) * D];
                    double ca = collapsing ? a : 0.0, keep = sqrt(1.0 - ca * ca);
                    for (int n = 0; n < N; n++)
                        for (int d = 0; d < D; d++) {
                            size_t i = (((size_t)b * H + h) * N + n) * D + d;
                            double z = synth_gauss(&rng);
                            double v = keep * z + ca * G * sqrtD * u[d];
                            q[i] = synth_bf16((float)(s * v));
                        }
                }
            attnstat_tensor tq, tk;
            attnstat_tensor_init(&tq, q, ATTNSTAT_BF16, B, H, N, D);
            attnstat_tensor_init(&tk, k, ATTNSTAT_BF16, B, HKV, N, D);
            attnstat_push_opts po;
            attnstat_push_opts_init(&po);
            po.step = step;
            po.layer = (uint32_t)l;
            po.causal = 1;
            po.sample_every = (uint32_t)o.sample_every;
            attnstat_code pc = attnstat_push(c, &po, &tq, &tk, NULL);
            if (pc != ATTNSTAT_OK && pc != ATTNSTAT_DROPPED) {
                fprintf(stderr, "attnstat-synth: push at step %d layer %d: %s\n", step, l,
                        attnstat_last_error(c));
                rc = 1;
                goto out;
            }
        }
        if (!o.free_run) {
            attnstat_code fc = attnstat_flush(c, 60000);
            if (fc == ATTNSTAT_ELOST) /* the daemon restarted: the run goes on */
                fprintf(stderr, "attnstat-synth: step %d: %s\n", step, attnstat_last_error(c));
            else if (fc != ATTNSTAT_OK) {
                fprintf(stderr, "attnstat-synth: waiting for step %d: %s\n", step,
                        attnstat_last_error(c));
                rc = 1;
                goto out;
            }
        } else {
            attnstat_poll(c, 0);
        }
        if (!o.quiet && ((step + 1) % 50 == 0 || step + 1 == o.steps)) {
            attnstat_counters st;
            attnstat_stats(c, &st);
            printf("step %4d: %llu pushes acknowledged, %llu dropped here, %llu dropped by the "
                   "daemon, %llu rejected\n", step + 1, (unsigned long long)st.acked,
                   (unsigned long long)st.dropped_local, (unsigned long long)st.dropped_daemon,
                   (unsigned long long)st.rejected);
            fflush(stdout);
        }
    }
    attnstat_code fc = attnstat_flush(c, 60000);
    if (fc != ATTNSTAT_OK) {
        fprintf(stderr, "attnstat-synth: final flush: %s\n", attnstat_last_error(c));
        rc = fc == ATTNSTAT_ELOST ? rc : 1;
    }
    attnstat_poll(c, 200); /* alerts of the last step */
out:;
    attnstat_counters st;
    attnstat_stats(c, &st);
    if (!o.quiet || rc)
        printf("attnstat-synth: %llu pushes sent, %llu acknowledged, %llu dropped here, %llu "
               "dropped by the daemon, %llu rejected%s%s\n",
               (unsigned long long)st.sent, (unsigned long long)st.acked,
               (unsigned long long)st.dropped_local, (unsigned long long)st.dropped_daemon,
               (unsigned long long)st.rejected, st.last_error[0] ? "; last error: " : "",
               st.last_error);
    if (o.no_goodbye) { /* everything was flushed: the process ends, its connection with it */
        fflush(stdout);
        _exit(rc);
    }
    attnstat_close(c);
    free(q);
    free(k);
    free(sink);
    free(kbase);
    return rc;
}
