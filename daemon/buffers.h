/* buffers.h — one client's registrations: shared-memory segments (mapped read-only), CUDA IPC
 * allocations and CUDA IPC events (described here, opened by their device's worker). Stage:
 * buffers, after the session (RegisterBuffer, RegisterEvent, Forget) and before the push (which
 * looks its tensors up here and pins what it reads); calls devices, gpu_worker, validate, util and
 * log. It sends nothing: each operation returns its Ack code and message, the session replies.
 *
 * Ownership. A shared-memory mapping (buffers_map) is reference-counted: its registration holds
 * one reference and each push reading it holds one (buffers_map_ref); it is unmapped and its fd
 * closed when the last goes, so Forget (or the client leaving) never pulls memory from under a
 * worker. Device memory (gpu_mem) and events (gpu_event) are counted the same way by gpu_worker.h.
 * Loop thread only. */
#ifndef ATTNSTAT_BUFFERS_H
#define ATTNSTAT_BUFFERS_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "attnstat.pb-c.h"
#include "ctx.h"
#include "gpu_worker.h"
#include "validate.h"

typedef struct buffers buffers;
typedef struct buffers_map buffers_map;

buffers *buffers_new(void);
/* Forgets every registration (pushes in flight keep what they reference) and frees b. */
void buffers_free(buffers *b);
/* Forgets every registration; b stays usable (empty). */
void buffers_forget_all(buffers *b);

/* RegisterBuffer (of a client that said Hello): checked against the limits (max_buffers,
 * max_buffer_bytes), then mapped (HOST_SHM: the segment must be a regular file of peer_uid's,
 * unless that is root, at least as large as registered) or described (CUDA_IPC: its device gets a
 * worker). Returns OK, or the code of the Error to send with msg (about buffer rb->id). conn_id
 * names the client in the log. */
Attnstat__Code buffers_register(buffers *b, const stage_ctx *x, const Attnstat__RegisterBuffer *rb,
                                uid_t peer_uid, uint64_t conn_id, char *msg, size_t msglen);
/* RegisterEvent (of a client that said Hello): the same for a CUDA IPC event. */
Attnstat__Code buffers_register_event(buffers *b, const stage_ctx *x, const Attnstat__RegisterEvent *re,
                                      char *msg, size_t msglen);
/* Forget of one buffer / one event: OK, or UNKNOWN_BUFFER with msg. */
Attnstat__Code buffers_forget_buffer(buffers *b, uint32_t id, char *msg, size_t msglen);
Attnstat__Code buffers_forget_event(buffers *b, uint32_t id, char *msg, size_t msglen);

/* What validation knows of buffer id (validate_lookup_fn; ctx is the buffers). */
const validate_buffer *buffers_lookup(void *b, uint32_t id);
/* The mapping of HOST_SHM buffer id, or NULL. */
buffers_map *buffers_host_map(buffers *b, uint32_t id);
/* The device memory of CUDA_IPC buffer id, or NULL. */
gpu_mem *buffers_device_mem(buffers *b, uint32_t id);
/* Event id, and the index of its device; NULL when not registered. */
gpu_event *buffers_event(buffers *b, uint32_t id, int *device);

void buffers_map_ref(buffers_map *m);
void buffers_map_unref(buffers_map *m);
/* The mapping's fd: workers fstat it to notice a segment shrunk under them. */
int buffers_map_fd(const buffers_map *m);

#endif /* ATTNSTAT_BUFFERS_H */
