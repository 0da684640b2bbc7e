/* gpu_raw_push.c — a client that lies, speaking raw frames to attnstatd (tests/gpu/test_gpu.py runs
 * it). It exports real 1 MiB cudaMalloc allocations and checks that the daemon refuses to read
 * past their ends:
 *   1. buffer registered with its true size, a push whose offset + span passes the end:
 *      Ack OUT_OF_BOUNDS at validation (registered size);
 *   2. buffer registered as 4 MiB (a lie), a push inside the lie but past the real 1 MiB:
 *      Ack OUT_OF_BOUNDS from the GPU worker's check against the opened allocation's real size;
 *   3. a push inside the allocation: Ack OK (the daemon still serves this connection).
 * Usage: gpu_raw_push SOCKET. Prints one line per case; exits 0 when all three hold, 77 without a
 * usable GPU, 1 otherwise. */
#include <cuda_runtime_api.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "envelope.h"
#include "frame.h"

static int fd = -1;
static frame_reader rd;

static int send_env(const Attnstat__Envelope *env)
{
    size_t len;
    uint8_t *buf = frame_pack(env, FRAME_MAX_DEFAULT, &len);
    if (!buf)
        return -1;
    size_t off = 0;
    while (off < len) {
        ssize_t n = send(fd, buf + off, len - off, MSG_NOSIGNAL);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            free(buf);
            return -1;
        }
        off += (size_t)n;
    }
    free(buf);
    return 0;
}

/* Next message of the wanted kind (others skipped); NULL on EOF. */
static Attnstat__Envelope *recv_kind(Attnstat__Envelope__MsgCase want)
{
    for (;;) {
        const uint8_t *payload;
        uint32_t len;
        char why[128];
        int r = frame_reader_next(&rd, &payload, &len, why, sizeof why);
        if (r < 0)
            return NULL;
        if (r > 0) {
            Attnstat__Envelope *env = frame_decode(payload, len, NULL);
            frame_reader_consume(&rd);
            if (env && env->msg_case == want)
                return env;
            if (env && env->msg_case == ATTNSTAT__ENVELOPE__MSG_ERROR)
                fprintf(stderr, "daemon error %d: %s\n", env->error->code, env->error->message);
            if (env)
                attnstat__envelope__free_unpacked(env, NULL);
            continue;
        }
        size_t avail;
        uint8_t *dst = frame_reader_space(&rd, 65536, &avail);
        ssize_t n = recv(fd, dst, avail, 0);
        if (n <= 0)
            return NULL;
        frame_reader_commit(&rd, (size_t)n);
    }
}

static int push(uint64_t seq, uint32_t buf, uint64_t offset, uint32_t n, const char *label,
                Attnstat__Code want)
{
    /* q = k = [1, 1, n, 64] f16 rows at offset. */
    uint64_t shape[4] = {1, 1, n, 64}, strides[4] = {(uint64_t)n * 64, (uint64_t)n * 64, 64, 1};
    Attnstat__TensorRef t;
    envelope_tensor(&t, buf, offset, ATTNSTAT__DTYPE__F16, shape, strides);
    Attnstat__Push p;
    Attnstat__Envelope env;
    if (send_env(envelope_push(&env, &p, seq, (int64_t)seq, 0, &t, &t)) != 0)
        return -1;
    Attnstat__Envelope *a = recv_kind(ATTNSTAT__ENVELOPE__MSG_ACK);
    if (!a) {
        printf("%s: no Ack (connection closed)\n", label);
        return -1;
    }
    int ok = a->ack->seq == seq && a->ack->code == want;
    printf("%s: Ack code %d (want %d): %s\n", label, a->ack->code, want,
           a->ack->message ? a->ack->message : "");
    attnstat__envelope__free_unpacked(a, NULL);
    return ok ? 0 : -1;
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: %s SOCKET\n", argv[0]);
        return 2;
    }
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
        printf("no usable CUDA device: skipped\n");
        return 77;
    }
    const size_t real = 1u << 20;
    void *mem[2] = {NULL, NULL};
    cudaIpcMemHandle_t hs[2];
    cudaError_t e = cudaSuccess;
    for (int i = 0; i < 2 && e == cudaSuccess; i++) {
        e = cudaMalloc(&mem[i], real);
        if (e == cudaSuccess)
            e = cudaMemset(mem[i], 0, real);
        if (e == cudaSuccess)
            e = cudaIpcGetMemHandle(&hs[i], mem[i]);
    }
    if (e == cudaSuccess) /* the memsets (asynchronous to the host) done before another process reads */
        e = cudaDeviceSynchronize();
    struct cudaDeviceProp prop;
    if (e == cudaSuccess)
        e = cudaGetDeviceProperties(&prop, 0);
    if (e != cudaSuccess) {
        fprintf(stderr, "CUDA: %s\n", cudaGetErrorString(e));
        return 1;
    }
    char uuid[48];
    const unsigned char *u = (const unsigned char *)prop.uuid.bytes;
    snprintf(uuid, sizeof uuid,
             "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", u[0], u[1],
             u[2], u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11], u[12], u[13], u[14], u[15]);

    fd = socket(AF_UNIX, SOCK_STREAM, 0);
    struct sockaddr_un sa;
    memset(&sa, 0, sizeof sa);
    sa.sun_family = AF_UNIX;
    snprintf(sa.sun_path, sizeof sa.sun_path, "%s", argv[1]);
    if (connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0) {
        perror("connect");
        return 1;
    }
    frame_reader_init(&rd, FRAME_MAX_DEFAULT);
    char *uuids[1] = {uuid};
    Attnstat__Hello hello;
    Attnstat__Envelope env;
    envelope_hello(&env, &hello, "raw-liar");
    hello.n_device_uuids = 1;
    hello.device_uuids = uuids;
    if (send_env(&env) != 0)
        return 1;
    Attnstat__Envelope *r = recv_kind(ATTNSTAT__ENVELOPE__MSG_HELLO_REPLY);
    if (!r || r->hello_reply->n_served_devices != 1) {
        printf("hello: device %s not served\n", uuid);
        return 1;
    }
    printf("hello: served %s\n", r->hello_reply->served_devices[0]);
    attnstat__envelope__free_unpacked(r, NULL);

    /* Buffer 1: the truth. Buffer 2: another 1 MiB allocation claimed as 4 MiB. */
    for (uint32_t id = 1; id <= 2; id++) {
        Attnstat__RegisterBuffer rb;
        envelope_register_cuda(&env, &rb, id, (const uint8_t *)hs[id - 1].reserved,
                               sizeof hs[id - 1].reserved, id == 1 ? real : 4 * real, uuid);
        if (send_env(&env) != 0)
            return 1;
    }
    int bad = 0;
    /* 64 rows of 64 halves = 8 KiB. */
    bad |= push(1, 1, real - 4096, 64, "past the registered end", ATTNSTAT__CODE__OUT_OF_BOUNDS);
    bad |= push(2, 2, 2 * real, 64, "past the real end, inside the lie",
                ATTNSTAT__CODE__OUT_OF_BOUNDS);
    bad |= push(3, 1, real - 8192, 64, "inside the allocation", ATTNSTAT__CODE__OK);
    close(fd);
    frame_reader_free(&rd);
    cudaFree(mem[0]);
    cudaFree(mem[1]);
    printf("%s\n", bad ? "FAILED" : "all refused as they should be");
    return bad ? 1 : 0;
}
