/* wirerow.h — vocab.h's rows on the wire: the field of a protobuf-c message that a row names, read
 * and written through the message's descriptor, so that the loops over the tables (a Hello's
 * thresholds, a Computed's heads, the heads of an Ack or a Result) need no code per field.
 *
 * Stage: conversion helpers of the client's protocol (validate.c, push.c, alerts_feed.c); calls
 * protobuf-c only. Pure: no allocation, no I/O. */
#ifndef ATTNSTAT_WIREROW_H
#define ATTNSTAT_WIREROW_H

#include <stdint.h>

#include <protobuf-c/protobuf-c.h>

/* The field `name` of m (a double, uint32, uint64 or bool field): its value in *v and 1 in *has
 * when it is set (a required field always is), 0 in *has otherwise. Returns 0, or -1 when m's
 * message has no such field or not of those types (nothing written). */
int wirerow_get(const ProtobufCMessage *m, const char *name, int *has, double *v);
/* The same for a count: uint64 or uint32 fields only, exact. */
int wirerow_get_u64(const ProtobufCMessage *m, const char *name, int *has, uint64_t *v);

/* Set the field `name` of m to v and mark it present (an optional field's has_ flag). v must fit
 * the field's type (the caller checked it: a uint32 field takes v in [0, UINT32_MAX]). Returns 0,
 * or -1 when there is no such field of those types (nothing written). */
int wirerow_set(ProtobufCMessage *m, const char *name, double v);

#endif /* ATTNSTAT_WIREROW_H */
