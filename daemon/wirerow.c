/* wirerow.c — the fields of protobuf-c messages by name (wirerow.h). Stage: conversion helpers;
 * calls protobuf-c's descriptor lookup (protobuf_c_message_descriptor_get_field_by_name). */
#include "wirerow.h"

#include <string.h>

/* The field of m's message called name, NULL when none. */
static const ProtobufCFieldDescriptor *field_of(const ProtobufCMessage *m, const char *name)
{
    if (!m || !m->descriptor || !name)
        return NULL;
    return protobuf_c_message_descriptor_get_field_by_name(m->descriptor, name);
}

/* Whether field f of m is present: a required field always; an optional scalar by its has_. */
static int present(const ProtobufCMessage *m, const ProtobufCFieldDescriptor *f)
{
    if (f->label == PROTOBUF_C_LABEL_REQUIRED)
        return 1;
    if (f->label != PROTOBUF_C_LABEL_OPTIONAL || f->quantifier_offset == 0)
        return 0;
    protobuf_c_boolean has;
    memcpy(&has, (const char *)m + f->quantifier_offset, sizeof has);
    return has != 0;
}

static void mark(ProtobufCMessage *m, const ProtobufCFieldDescriptor *f)
{
    if (f->label == PROTOBUF_C_LABEL_OPTIONAL && f->quantifier_offset != 0) {
        protobuf_c_boolean one = 1;
        memcpy((char *)m + f->quantifier_offset, &one, sizeof one);
    }
}

int wirerow_get(const ProtobufCMessage *m, const char *name, int *has, double *v)
{
    const ProtobufCFieldDescriptor *f = field_of(m, name);
    if (!f || f->label == PROTOBUF_C_LABEL_REPEATED)
        return -1;
    const char *at = (const char *)m + f->offset;
    switch (f->type) {
    case PROTOBUF_C_TYPE_DOUBLE:
        memcpy(v, at, sizeof *v);
        break;
    case PROTOBUF_C_TYPE_UINT32: {
        uint32_t u;
        memcpy(&u, at, sizeof u);
        *v = (double)u;
        break;
    }
    case PROTOBUF_C_TYPE_UINT64: {
        uint64_t u;
        memcpy(&u, at, sizeof u);
        *v = (double)u;
        break;
    }
    case PROTOBUF_C_TYPE_BOOL: {
        protobuf_c_boolean b;
        memcpy(&b, at, sizeof b);
        *v = b ? 1.0 : 0.0;
        break;
    }
    default:
        return -1;
    }
    *has = present(m, f);
    return 0;
}

int wirerow_get_u64(const ProtobufCMessage *m, const char *name, int *has, uint64_t *v)
{
    const ProtobufCFieldDescriptor *f = field_of(m, name);
    if (!f || f->label == PROTOBUF_C_LABEL_REPEATED)
        return -1;
    const char *at = (const char *)m + f->offset;
    if (f->type == PROTOBUF_C_TYPE_UINT64) {
        memcpy(v, at, sizeof *v);
    } else if (f->type == PROTOBUF_C_TYPE_UINT32) {
        uint32_t u;
        memcpy(&u, at, sizeof u);
        *v = u;
    } else {
        return -1;
    }
    *has = present(m, f);
    return 0;
}

int wirerow_set(ProtobufCMessage *m, const char *name, double v)
{
    const ProtobufCFieldDescriptor *f = field_of(m, name);
    if (!f || f->label == PROTOBUF_C_LABEL_REPEATED)
        return -1;
    char *at = (char *)m + f->offset;
    switch (f->type) {
    case PROTOBUF_C_TYPE_DOUBLE:
        memcpy(at, &v, sizeof v);
        break;
    case PROTOBUF_C_TYPE_UINT32: {
        uint32_t u = (uint32_t)v;
        memcpy(at, &u, sizeof u);
        break;
    }
    case PROTOBUF_C_TYPE_UINT64: {
        uint64_t u = (uint64_t)v;
        memcpy(at, &u, sizeof u);
        break;
    }
    default:
        return -1;
    }
    mark(m, f);
    return 0;
}
