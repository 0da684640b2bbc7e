/* client_peer.c — the pieces the scripted peers of libattnstat's unit suites share (see
 * client_peer.h). Links proto/ (framing). */
#include "client_peer.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

int peer_read(int fd, frame_reader *rd, peer_message_fn fn, void *ctx)
{
    size_t avail;
    uint8_t *dst = frame_reader_space(rd, 65536, &avail);
    ssize_t n = dst ? recv(fd, dst, avail, 0) : -1;
    if (n <= 0)
        return -1;
    frame_reader_commit(rd, (size_t)n);
    const uint8_t *pl;
    uint32_t len;
    char why[128];
    while (frame_reader_next(rd, &pl, &len, why, sizeof why) == 1) {
        Attnstat__Envelope *env = frame_decode(pl, len, NULL);
        frame_reader_consume(rd);
        int r = env ? fn(ctx, env) : 0;
        if (env)
            attnstat__envelope__free_unpacked(env, NULL);
        if (r)
            return r < 0 ? -1 : 0;
    }
    return 0;
}

int peer_send(int fd, const Attnstat__Envelope *env)
{
    size_t len;
    uint8_t *b = frame_pack(env, 64u << 20, &len);
    if (!b)
        return -1;
    size_t off = 0;
    while (off < len) {
        ssize_t n = send(fd, b + off, len - off, MSG_NOSIGNAL);
        if (n <= 0) {
            free(b);
            return -1;
        }
        off += (size_t)n;
    }
    free(b);
    return 0;
}

int peer_compare(const uint8_t *map, uint64_t map_size, const Attnstat__TensorRef *ref,
                 const attnstat_tensor *t)
{
    if (!t || ref->n_shape != 4 || ref->n_strides != 4 || (int)ref->dtype != t->dtype)
        return 1;
    size_t es = attnstat_dtype_size((attnstat_dtype)t->dtype);
    int bad = 0;
    for (int i = 0; i < 4; i++)
        if ((int64_t)ref->shape[i] != t->shape[i])
            return 1;
    for (int64_t b = 0; b < t->shape[0]; b++)
        for (int64_t h = 0; h < t->shape[1]; h++)
            for (int64_t n = 0; n < t->shape[2]; n++)
                for (int64_t d = 0; d < t->shape[3]; d++) {
                    uint64_t ro = ref->offset + (uint64_t)(b * (int64_t)ref->strides[0] +
                                                           h * (int64_t)ref->strides[1] +
                                                           n * (int64_t)ref->strides[2] + d) * es;
                    if (ro + es > map_size)
                        return 1;
                    const uint8_t *src = (const uint8_t *)t->data +
                        (b * t->strides[0] + h * t->strides[1] + n * t->strides[2] + d) * (int64_t)es;
                    bad += memcmp(map + ro, src, es) != 0;
                }
    return bad;
}

void peer_map(const Attnstat__RegisterBuffer *rb, uint8_t **map, uint64_t *size)
{
    int sfd = shm_open(rb->shm_name, O_RDONLY, 0);
    if (sfd < 0)
        return;
    void *m = mmap(NULL, rb->size, PROT_READ, MAP_SHARED, sfd, 0);
    close(sfd);
    if (m != MAP_FAILED) {
        *map = m;
        *size = rb->size;
    }
}

int peer_listen(const char *path)
{
    unlink(path);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -1;
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    snprintf(sa.sun_path, sizeof sa.sun_path, "%s", path);
    if (bind(fd, (struct sockaddr *)&sa, sizeof sa) != 0 || listen(fd, 4) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}
