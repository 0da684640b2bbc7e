/* envelope.h — one builder per message of the wire protocol (attnstat.proto): the one place where
 * an Envelope and the message inside it are put together, for attnstatd, the tests, the benches
 * and (later) libattnstat. Stage: the wire (proto/); includes its generated code only.
 *
 * Every envelope_<message>() initialises the message m, sets its required fields and the optional
 * ones named in its arguments, points env at m and returns env, ready for frame_pack(). Nothing is
 * allocated and nothing copied: env, m and every string, array or sub-message given belong to the
 * caller and must live until the envelope is packed. Optional fields not named here are set by the
 * caller on m (m->has_x = 1, m->x = ...) before packing. A message string that is NULL or empty is
 * left unset. */
#ifndef ATTNSTAT_ENVELOPE_H
#define ATTNSTAT_ENVELOPE_H

#include <stddef.h>
#include <stdint.h>

#include "attnstat.pb-c.h"

/* ---- client to daemon ------------------------------------------------------------------------ */

/* Hello at the frame protocol's version (FRAME_PROTOCOL_VERSION); run may be NULL (the daemon's
 * default run). */
Attnstat__Envelope *envelope_hello(Attnstat__Envelope *env, Attnstat__Hello *m, const char *run);

/* RegisterBuffer of a POSIX shared-memory segment. */
Attnstat__Envelope *envelope_register_shm(Attnstat__Envelope *env, Attnstat__RegisterBuffer *m,
                                          uint32_t id, const char *shm_name, uint64_t size);

/* RegisterBuffer of a CUDA IPC allocation: handle of handle_len bytes (cudaIpcMemHandle_t). */
Attnstat__Envelope *envelope_register_cuda(Attnstat__Envelope *env, Attnstat__RegisterBuffer *m,
                                           uint32_t id, const uint8_t *handle, size_t handle_len,
                                           uint64_t size, const char *device_uuid);

/* RegisterEvent of a CUDA IPC event (cudaIpcEventHandle_t). */
Attnstat__Envelope *envelope_register_event(Attnstat__Envelope *env, Attnstat__RegisterEvent *m,
                                            uint32_t id, const uint8_t *handle, size_t handle_len,
                                            const char *device_uuid);

/* Forget of a buffer and/or an event: each only when its has_ flag is set. */
Attnstat__Envelope *envelope_forget(Attnstat__Envelope *env, Attnstat__Forget *m, int has_buffer,
                                    uint32_t buffer_id, int has_event, uint32_t event_id);

/* A tensor in a registered buffer: shape and strides ([B, H, N, D], elements) are the caller's
 * arrays of four. Returns t. */
Attnstat__TensorRef *envelope_tensor(Attnstat__TensorRef *t, uint32_t buffer_id, uint64_t offset,
                                     Attnstat__Dtype dtype, uint64_t *shape, uint64_t *strides);

/* Push of q and k (options such as causal, sampling, v, cu_seqlens, event_id, want_results: on m). */
Attnstat__Envelope *envelope_push(Attnstat__Envelope *env, Attnstat__Push *m, uint64_t seq,
                                  int64_t step, uint32_t layer, Attnstat__TensorRef *q,
                                  Attnstat__TensorRef *k);

/* Subscribe to alerts and/or results (both fields set explicitly). */
Attnstat__Envelope *envelope_subscribe(Attnstat__Envelope *env, Attnstat__Subscribe *m, int alerts,
                                       int results);

Attnstat__Envelope *envelope_status(Attnstat__Envelope *env, Attnstat__Status *m);

/* Computed: per-head results a client computed itself (heads: n of them, head i = query head i). */
Attnstat__Envelope *envelope_computed(Attnstat__Envelope *env, Attnstat__Computed *m, uint64_t seq,
                                      int64_t step, uint32_t layer, Attnstat__HeadStats **heads,
                                      size_t n);

/* ParallelLayout: m is the caller's, filled (attnstat__parallel_layout__init and its fields). */
Attnstat__Envelope *envelope_layout(Attnstat__Envelope *env, Attnstat__ParallelLayout *m);

/* ---- daemon to client ------------------------------------------------------------------------ */

/* HelloReply at the frame protocol's version (daemon_version, served_devices: on m). */
Attnstat__Envelope *envelope_hello_reply(Attnstat__Envelope *env, Attnstat__HelloReply *m,
                                         int64_t run_id, uint32_t max_frame,
                                         uint32_t queue_capacity);

Attnstat__Envelope *envelope_release(Attnstat__Envelope *env, Attnstat__Release *m, uint64_t seq);

/* Ack of push seq; heads (n of them) may be NULL. */
Attnstat__Envelope *envelope_ack(Attnstat__Envelope *env, Attnstat__Ack *m, uint64_t seq,
                                 Attnstat__Code code, const char *message,
                                 Attnstat__HeadStats **heads, size_t nheads);

/* Error with code and message; ref (a buffer or event id) only when has_ref. */
Attnstat__Envelope *envelope_error(Attnstat__Envelope *env, Attnstat__Error *m, Attnstat__Code code,
                                   const char *message, int has_ref, uint64_t ref);

/* Result of one push for subscribers. */
Attnstat__Envelope *envelope_result(Attnstat__Envelope *env, Attnstat__Result *m, const char *run,
                                    int64_t run_id, int64_t step, uint32_t layer,
                                    Attnstat__HeadStats **heads, size_t nheads);

/* Alert (its required fields; rank, value, threshold, time_ms, message: on m). */
Attnstat__Envelope *envelope_alert(Attnstat__Envelope *env, Attnstat__Alert *m, const char *run,
                                   int64_t run_id, uint32_t layer, uint32_t head, int64_t step,
                                   Attnstat__AlertRule rule, Attnstat__AlertState state);

/* StatusReply, every field on m (all optional). */
Attnstat__Envelope *envelope_status_reply(Attnstat__Envelope *env, Attnstat__StatusReply *m);

/* Goodbye: the run of this connection ends (attnstat_close). */
Attnstat__Envelope *envelope_goodbye(Attnstat__Envelope *env, Attnstat__Goodbye *m);
/* Command with its action; the caller sets the optional fields it needs on m. */
Attnstat__Envelope *envelope_command(Attnstat__Envelope *env, Attnstat__Command *m,
                                     Attnstat__Command__Action action);
/* CommandReply{code, message (may be NULL), count}. */
Attnstat__Envelope *envelope_command_reply(Attnstat__Envelope *env, Attnstat__CommandReply *m,
                                           Attnstat__Code code, const char *message,
                                           uint64_t count);

#endif /* ATTNSTAT_ENVELOPE_H */
