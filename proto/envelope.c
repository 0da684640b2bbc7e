/* envelope.c — the message builders of envelope.h. Stage: the wire; includes proto/ only. */
#include "envelope.h"

#include "frame.h"

/* protoc-c's const-less string and array fields point at the caller's data, which the builders
 * never write: the casts below only drop const. */
static char *text(const char *s)
{
    return s && s[0] ? (char *)s : NULL;
}

/* The envelope around m: msg_case and the one member of the oneof that points at m. */
#define WRAP(env, kase, member, m)                                                                 \
    do {                                                                                           \
        attnstat__envelope__init(env);                                                             \
        (env)->msg_case = ATTNSTAT__ENVELOPE__MSG_##kase;                                          \
        (env)->member = (m);                                                                       \
    } while (0)

Attnstat__Envelope *envelope_hello(Attnstat__Envelope *env, Attnstat__Hello *m, const char *run)
{
    attnstat__hello__init(m);
    m->protocol_version = FRAME_PROTOCOL_VERSION;
    m->run = text(run);
    WRAP(env, HELLO, hello, m);
    return env;
}

Attnstat__Envelope *envelope_register_shm(Attnstat__Envelope *env, Attnstat__RegisterBuffer *m,
                                          uint32_t id, const char *shm_name, uint64_t size)
{
    attnstat__register_buffer__init(m);
    m->id = id;
    m->kind = ATTNSTAT__BUFFER_KIND__HOST_SHM;
    m->size = size;
    m->shm_name = (char *)shm_name;
    WRAP(env, REGISTER_BUFFER, register_buffer, m);
    return env;
}

Attnstat__Envelope *envelope_register_cuda(Attnstat__Envelope *env, Attnstat__RegisterBuffer *m,
                                           uint32_t id, const uint8_t *handle, size_t handle_len,
                                           uint64_t size, const char *device_uuid)
{
    attnstat__register_buffer__init(m);
    m->id = id;
    m->kind = ATTNSTAT__BUFFER_KIND__CUDA_IPC;
    m->size = size;
    m->has_ipc_handle = 1;
    m->ipc_handle.data = (uint8_t *)handle;
    m->ipc_handle.len = handle_len;
    m->device_uuid = (char *)device_uuid;
    WRAP(env, REGISTER_BUFFER, register_buffer, m);
    return env;
}

Attnstat__Envelope *envelope_register_event(Attnstat__Envelope *env, Attnstat__RegisterEvent *m,
                                            uint32_t id, const uint8_t *handle, size_t handle_len,
                                            const char *device_uuid)
{
    attnstat__register_event__init(m);
    m->id = id;
    m->ipc_handle.data = (uint8_t *)handle;
    m->ipc_handle.len = handle_len;
    m->device_uuid = (char *)device_uuid;
    WRAP(env, REGISTER_EVENT, register_event, m);
    return env;
}

Attnstat__Envelope *envelope_forget(Attnstat__Envelope *env, Attnstat__Forget *m, int has_buffer,
                                    uint32_t buffer_id, int has_event, uint32_t event_id)
{
    attnstat__forget__init(m);
    m->has_buffer_id = has_buffer != 0;
    m->buffer_id = has_buffer ? buffer_id : 0;
    m->has_event_id = has_event != 0;
    m->event_id = has_event ? event_id : 0;
    WRAP(env, FORGET, forget, m);
    return env;
}

Attnstat__TensorRef *envelope_tensor(Attnstat__TensorRef *t, uint32_t buffer_id, uint64_t offset,
                                     Attnstat__Dtype dtype, uint64_t *shape, uint64_t *strides)
{
    attnstat__tensor_ref__init(t);
    t->buffer_id = buffer_id;
    t->offset = offset;
    t->dtype = dtype;
    t->n_shape = 4;
    t->shape = shape;
    t->n_strides = 4;
    t->strides = strides;
    return t;
}

Attnstat__Envelope *envelope_push(Attnstat__Envelope *env, Attnstat__Push *m, uint64_t seq,
                                  int64_t step, uint32_t layer, Attnstat__TensorRef *q,
                                  Attnstat__TensorRef *k)
{
    attnstat__push__init(m);
    m->seq = seq;
    m->step = step;
    m->layer = layer;
    m->q = q;
    m->k = k;
    WRAP(env, PUSH, push, m);
    return env;
}

Attnstat__Envelope *envelope_subscribe(Attnstat__Envelope *env, Attnstat__Subscribe *m, int alerts,
                                       int results)
{
    attnstat__subscribe__init(m);
    m->has_alerts = 1;
    m->alerts = alerts != 0;
    m->has_results = 1;
    m->results = results != 0;
    WRAP(env, SUBSCRIBE, subscribe, m);
    return env;
}

Attnstat__Envelope *envelope_status(Attnstat__Envelope *env, Attnstat__Status *m)
{
    attnstat__status__init(m);
    WRAP(env, STATUS, status, m);
    return env;
}

Attnstat__Envelope *envelope_computed(Attnstat__Envelope *env, Attnstat__Computed *m, uint64_t seq,
                                      int64_t step, uint32_t layer, Attnstat__HeadStats **heads,
                                      size_t n)
{
    attnstat__computed__init(m);
    m->seq = seq;
    m->step = step;
    m->layer = layer;
    m->heads = heads;
    m->n_heads = n;
    WRAP(env, COMPUTED, computed, m);
    return env;
}

Attnstat__Envelope *envelope_layout(Attnstat__Envelope *env, Attnstat__ParallelLayout *m)
{
    WRAP(env, LAYOUT, layout, m);
    return env;
}

Attnstat__Envelope *envelope_hello_reply(Attnstat__Envelope *env, Attnstat__HelloReply *m,
                                         int64_t run_id, uint32_t max_frame,
                                         uint32_t queue_capacity)
{
    attnstat__hello_reply__init(m);
    m->protocol_version = FRAME_PROTOCOL_VERSION;
    m->run_id = run_id;
    m->max_frame = max_frame;
    m->queue_capacity = queue_capacity;
    WRAP(env, HELLO_REPLY, hello_reply, m);
    return env;
}

Attnstat__Envelope *envelope_release(Attnstat__Envelope *env, Attnstat__Release *m, uint64_t seq)
{
    attnstat__release__init(m);
    m->seq = seq;
    WRAP(env, RELEASE, release, m);
    return env;
}

Attnstat__Envelope *envelope_ack(Attnstat__Envelope *env, Attnstat__Ack *m, uint64_t seq,
                                 Attnstat__Code code, const char *message,
                                 Attnstat__HeadStats **heads, size_t nheads)
{
    attnstat__ack__init(m);
    m->seq = seq;
    m->code = code;
    m->message = text(message);
    m->heads = heads;
    m->n_heads = heads ? nheads : 0;
    WRAP(env, ACK, ack, m);
    return env;
}

Attnstat__Envelope *envelope_error(Attnstat__Envelope *env, Attnstat__Error *m, Attnstat__Code code,
                                   const char *message, int has_ref, uint64_t ref)
{
    attnstat__error__init(m);
    m->code = code;
    m->message = text(message);
    m->has_ref = has_ref != 0;
    m->ref = has_ref ? ref : 0;
    WRAP(env, ERROR, error, m);
    return env;
}

Attnstat__Envelope *envelope_result(Attnstat__Envelope *env, Attnstat__Result *m, const char *run,
                                    int64_t run_id, int64_t step, uint32_t layer,
                                    Attnstat__HeadStats **heads, size_t nheads)
{
    attnstat__result__init(m);
    m->run = (char *)run;
    m->run_id = run_id;
    m->step = step;
    m->layer = layer;
    m->heads = heads;
    m->n_heads = heads ? nheads : 0;
    WRAP(env, RESULT, result, m);
    return env;
}

Attnstat__Envelope *envelope_alert(Attnstat__Envelope *env, Attnstat__Alert *m, const char *run,
                                   int64_t run_id, uint32_t layer, uint32_t head, int64_t step,
                                   Attnstat__AlertRule rule, Attnstat__AlertState state)
{
    attnstat__alert__init(m);
    m->run = (char *)run;
    m->run_id = run_id;
    m->layer = layer;
    m->head = head;
    m->step = step;
    m->rule = rule;
    m->state = state;
    WRAP(env, ALERT, alert, m);
    return env;
}

Attnstat__Envelope *envelope_status_reply(Attnstat__Envelope *env, Attnstat__StatusReply *m)
{
    attnstat__status_reply__init(m);
    WRAP(env, STATUS_REPLY, status_reply, m);
    return env;
}

Attnstat__Envelope *envelope_goodbye(Attnstat__Envelope *env, Attnstat__Goodbye *m)
{
    attnstat__goodbye__init(m);
    WRAP(env, GOODBYE, goodbye, m);
    return env;
}

Attnstat__Envelope *envelope_command(Attnstat__Envelope *env, Attnstat__Command *m,
                                     Attnstat__Command__Action action)
{
    attnstat__command__init(m);
    m->action = action;
    WRAP(env, COMMAND, command, m);
    return env;
}

Attnstat__Envelope *envelope_command_reply(Attnstat__Envelope *env, Attnstat__CommandReply *m,
                                           Attnstat__Code code, const char *message,
                                           uint64_t count)
{
    attnstat__command_reply__init(m);
    m->code = code;
    m->message = (char *)message;
    m->has_count = 1;
    m->count = count;
    WRAP(env, COMMAND_REPLY, command_reply, m);
    return env;
}
