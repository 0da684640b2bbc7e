/* bench_pipeline.c — throughput of the whole host pipeline through a real attnstatd: a client
 * copies Q/K of a realistic push (B=1, 32 heads, N=1024, D=128, bf16, causal, 64 sampled rows per
 * head) into a shared-memory ring registered once, sends Push frames over the Unix socket (raw
 * frames, up to one push per ring slot in flight, a slot reused after its Release), and waits for
 * every Ack(OK), which the daemon sends only after the per-head rows are committed to SQLite.
 *
 * Prints pushes/s, per-head rows stored/s, Ack latency (median, p95) and the client's CPU time per
 * push (getrusage: the copy into shared memory, framing and socket I/O).
 *
 *   bench_pipeline [--pushes N] [--sample-rows R] [--slots S] [--heads H] [--n N]
 *
 * It starts its own daemon (the attnstatd of this build tree) on a socket and database in a fresh
 * temporary directory, and stops it with SIGTERM at the end. */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "attnstat.pb-c.h"
#include "envelope.h"
#include "frame.h"

#ifndef ATTNSTATD_PATH
#error "ATTNSTATD_PATH must name the attnstatd binary"
#endif

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static double cpu_s(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec * 1e-6 +
           (double)ru.ru_stime.tv_sec + (double)ru.ru_stime.tv_usec * 1e-6;
}

static uint64_t rng_next(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static int send_all(int fd, const uint8_t *p, size_t n)
{
    while (n) {
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            return -1;
        }
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

static int send_env(int fd, Attnstat__Envelope *env)
{
    size_t len;
    uint8_t *buf = frame_pack(env, 1u << 20, &len);
    if (!buf)
        return -1;
    int rc = send_all(fd, buf, len);
    free(buf);
    return rc;
}

/* Next message (blocking up to 60 s); NULL on EOF / error. */
static Attnstat__Envelope *recv_env(int fd, frame_reader *rd)
{
    for (;;) {
        const uint8_t *payload;
        uint32_t len;
        char err[128];
        int r = frame_reader_next(rd, &payload, &len, err, sizeof err);
        if (r < 0) {
            fprintf(stderr, "bench: bad frame from the daemon: %s\n", err);
            return NULL;
        }
        if (r == 1) {
            Attnstat__Envelope *e = frame_decode(payload, len, NULL);
            frame_reader_consume(rd);
            return e;
        }
        struct pollfd pfd = {fd, POLLIN, 0};
        if (poll(&pfd, 1, 60000) <= 0)
            return NULL;
        size_t avail;
        uint8_t *dst = frame_reader_space(rd, 65536, &avail);
        ssize_t n = read(fd, dst, avail);
        if (n <= 0)
            return NULL;
        frame_reader_commit(rd, (size_t)n);
    }
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv)
{
    int pushes = 200, sample_rows = 64, slots = 4, heads = 32, n = 1024, d = 128;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--pushes"))
            pushes = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--sample-rows"))
            sample_rows = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--slots"))
            slots = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--heads"))
            heads = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--n"))
            n = atoi(argv[i + 1]);
        else {
            fprintf(stderr, "usage: %s [--pushes N] [--sample-rows R] [--slots S] [--heads H] [--n N]\n",
                    argv[0]);
            return 2;
        }
    }
    if (pushes < 1 || slots < 1 || slots > 64 || heads < 1 || n < 1) {
        fprintf(stderr, "bench: bad arguments\n");
        return 2;
    }

    /* The daemon. */
    char dir[] = "/tmp/attnstat-bench-XXXXXX";
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return 1;
    }
    char sock[100], db[128], logp[128];
    snprintf(sock, sizeof sock, "%s/s.sock", dir);
    snprintf(db, sizeof db, "%s/a.db", dir);
    snprintf(logp, sizeof logp, "%s/daemon.log", dir);
    pid_t dpid = fork();
    if (dpid == 0) {
        int fd = open(logp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd >= 0) {
            dup2(fd, 2);
            close(fd);
        }
        execl(ATTNSTATD_PATH, ATTNSTATD_PATH, "--socket", sock, "--db", db, "--log-level", "warn",
              (char *)NULL);
        _exit(127);
    }
    int fd = -1;
    for (int tries = 0; tries < 1000 && fd < 0; tries++) {
        fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        struct sockaddr_un a;
        memset(&a, 0, sizeof a);
        a.sun_family = AF_UNIX;
        snprintf(a.sun_path, sizeof a.sun_path, "%s", sock);
        if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
            close(fd);
            fd = -1;
            usleep(10000);
        }
    }
    if (fd < 0) {
        fprintf(stderr, "bench: attnstatd did not start (see %s)\n", logp);
        return 1;
    }
    frame_reader rd;
    frame_reader_init(&rd, 64u << 20);

    /* Source tensors (what a trainer has) and the shared-memory ring (what the client copies to). */
    size_t elems = (size_t)heads * (size_t)n * (size_t)d, tbytes = elems * 2, slot_bytes = 2 * tbytes;
    uint16_t *src = malloc(slot_bytes);
    if (!src)
        return 1;
    uint64_t seed = (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32);
    printf("seed %llu\n", (unsigned long long)seed);
    for (size_t i = 0; i < 2 * elems; i++) {
        /* bf16 of a uniform value in (-2, 2): never all zeros */
        float v = (float)((double)(rng_next(&seed) >> 11) / 9007199254740992.0 * 4.0 - 2.0);
        uint32_t b;
        memcpy(&b, &v, 4);
        src[i] = (uint16_t)(b >> 16);
    }
    char shm_name[64];
    snprintf(shm_name, sizeof shm_name, "/attnstat-bench-%d", (int)getpid());
    int sfd = shm_open(shm_name, O_RDWR | O_CREAT | O_EXCL, 0600);
    size_t ring = slot_bytes * (size_t)slots;
    if (sfd < 0 || ftruncate(sfd, (off_t)ring) != 0) {
        perror("shm");
        return 1;
    }
    uint8_t *ringp = mmap(NULL, ring, PROT_READ | PROT_WRITE, MAP_SHARED, sfd, 0);
    close(sfd);
    if (ringp == MAP_FAILED) {
        perror("mmap");
        return 1;
    }
    memset(ringp, 0, ring);

    Attnstat__Envelope env;
    Attnstat__Hello h;
    send_env(fd, envelope_hello(&env, &h, "bench"));
    Attnstat__Envelope *r = recv_env(fd, &rd);
    if (!r || r->msg_case != ATTNSTAT__ENVELOPE__MSG_HELLO_REPLY) {
        fprintf(stderr, "bench: no HelloReply\n");
        return 1;
    }
    attnstat__envelope__free_unpacked(r, NULL);
    Attnstat__RegisterBuffer rb;
    send_env(fd, envelope_register_shm(&env, &rb, 1, shm_name, ring));

    int *slot_busy = calloc((size_t)slots, sizeof *slot_busy);
    double *sent_at = calloc((size_t)pushes + 1, sizeof *sent_at);
    double *lat = calloc((size_t)pushes + 1, sizeof *lat);
    int next = 0, acked = 0, ok = 0, nlat = 0, free_slots = slots;
    double t0 = now_s(), c0 = cpu_s();
    while (acked < pushes) {
        while (next < pushes && free_slots > 0) {
            int s = 0;
            while (slot_busy[s])
                s++;
            slot_busy[s] = next + 1;
            free_slots--;
            memcpy(ringp + (size_t)s * slot_bytes, src, slot_bytes); /* the client's copy */
            uint64_t shape[4] = {1, (uint64_t)heads, (uint64_t)n, (uint64_t)d};
            uint64_t strides[4] = {(uint64_t)heads * n * d, (uint64_t)n * d, (uint64_t)d, 1};
            Attnstat__TensorRef qr, kr;
            uint64_t qoff = (uint64_t)s * slot_bytes;
            envelope_tensor(&qr, 1, qoff, ATTNSTAT__DTYPE__BF16, shape, strides);
            envelope_tensor(&kr, 1, qoff + tbytes, ATTNSTAT__DTYPE__BF16, shape, strides);
            Attnstat__Push p;
            envelope_push(&env, &p, (uint64_t)next + 1, next / 8, (uint32_t)(next % 8), &qr, &kr);
            p.has_causal = 1;
            p.causal = 1;
            if (sample_rows > 0) {
                p.has_sample_rows = 1;
                p.sample_rows = (uint32_t)sample_rows;
                p.has_sample_seed = 1;
                p.sample_seed = (uint64_t)next;
            }
            sent_at[next + 1] = now_s();
            if (send_env(fd, &env) != 0) {
                fprintf(stderr, "bench: send failed\n");
                return 1;
            }
            next++;
        }
        r = recv_env(fd, &rd);
        if (!r) {
            fprintf(stderr, "bench: the daemon went away (see %s)\n", logp);
            return 1;
        }
        uint64_t seq = 0;
        int release = 0;
        if (r->msg_case == ATTNSTAT__ENVELOPE__MSG_RELEASE) {
            seq = r->release->seq;
            release = 1;
        } else if (r->msg_case == ATTNSTAT__ENVELOPE__MSG_ACK) {
            seq = r->ack->seq;
            acked++;
            if (r->ack->code == ATTNSTAT__CODE__OK) {
                ok++;
                lat[nlat++] = now_s() - sent_at[seq];
            } else {
                release = 1; /* a failed Ack releases too */
                fprintf(stderr, "bench: push %llu: code %d %s\n", (unsigned long long)seq, r->ack->code,
                        r->ack->message ? r->ack->message : "");
            }
        } else if (r->msg_case == ATTNSTAT__ENVELOPE__MSG_ERROR) {
            fprintf(stderr, "bench: error from the daemon: %s\n", r->error->message);
            return 1;
        }
        if (release)
            for (int s = 0; s < slots; s++)
                if (slot_busy[s] == (int)seq) {
                    slot_busy[s] = 0;
                    free_slots++;
                }
        attnstat__envelope__free_unpacked(r, NULL);
    }
    double wall = now_s() - t0, cpu = cpu_s() - c0;
    qsort(lat, (size_t)nlat, sizeof *lat, cmp_double);
    printf("push: B=1 H=%d N=%d D=%d bf16 causal, sample_rows=%d; %d ring slots of %.1f MiB\n", heads,
           n, d, sample_rows, slots, (double)slot_bytes / (1 << 20));
    printf("pushes: %d sent, %d acknowledged OK in %.3f s\n", pushes, ok, wall);
    printf("pushes/s: %.2f\n", ok / wall);
    printf("per-head rows stored/s: %.1f\n", ok * (double)heads / wall);
    if (nlat)
        printf("ack latency: median %.1f ms, p95 %.1f ms\n", lat[nlat / 2] * 1e3,
               lat[(size_t)((nlat - 1) * 0.95)] * 1e3);
    printf("client CPU per push: %.3f ms (copy into shm + framing + socket I/O)\n", cpu / pushes * 1e3);

    close(fd);
    frame_reader_free(&rd);
    kill(dpid, SIGTERM);
    int st = 0;
    waitpid(dpid, &st, 0);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
        fprintf(stderr, "bench: attnstatd exit status %d (see %s)\n", st, logp);
    munmap(ringp, ring);
    shm_unlink(shm_name);
    free(src);
    free(slot_busy);
    free(sent_at);
    free(lat);
    char cmd[200];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "bench: could not remove %s\n", dir);
    return ok == pushes ? 0 : 1;
}
