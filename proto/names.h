/* names.h — the one table of the names of the wire protocol's enums (attnstat.proto), as X-macro
 * lists: each entry is X(CONSTANT, value, "name"), CONSTANT being the enum constant's suffix in the
 * generated code (ATTNSTAT__CODE__<CONSTANT>). Stage: the wire (proto/); includes nothing.
 *
 * Who uses it: attnstatd (log lines, messages, the alert engine's rule and state names, the
 * --alert-exec environment, the store's rule column) through the functions below; the client
 * library and its Python binding are meant to use the same lists (libattnstat's
 * attnstat_rule_name() and friends implemented on them; Python reading them through those
 * exported functions), so that a name is spelled in one place. names.c checks at compile time that
 * every value here is the generated enum's. A new enum value of the protocol is added here once.
 *
 * A list is used by defining X and expanding it, e.g. a switch:
 *     #define X(c, v, s) case v: return s;
 *     switch (rule) { NAMES_ALERT_RULE(X) }
 *     #undef X
 */
#ifndef ATTNSTAT_NAMES_H
#define ATTNSTAT_NAMES_H

/* Element type of a tensor (Dtype). The names are those of the statistics library
 * (stats_dtype_name) and of the daemon's messages. */
#define NAMES_DTYPE(X)                                                                             \
    X(F32, 0, "f32")                                                                               \
    X(F16, 1, "f16")                                                                               \
    X(BF16, 2, "bf16")                                                                             \
    X(BOOL, 3, "bool")                                                                             \
    X(I32, 4, "i32")

/* Where a registered buffer lives (BufferKind). */
#define NAMES_BUFFER_KIND(X)                                                                       \
    X(HOST_SHM, 1, "HOST_SHM")                                                                     \
    X(CUDA_IPC, 2, "CUDA_IPC")

/* Alert rules (AlertRule): also the alert engine's rule names, the store's `rule` column and
 * ATTNSTAT_RULE of --alert-exec. */
#define NAMES_ALERT_RULE(X)                                                                        \
    X(ENTROPY_FLOOR, 1, "entropy_floor")                                                           \
    X(ENTROPY_DROP, 2, "entropy_drop")                                                             \
    X(LOGIT_CEILING, 3, "logit_ceiling")                                                           \
    X(NONFINITE, 4, "nonfinite")                                                                   \
    X(SINK_MASS_CEILING, 5, "sink_mass_ceiling")                                                   \
    X(DISTANCE_FLOOR, 6, "distance_floor")

/* Alert edges (AlertState). */
#define NAMES_ALERT_STATE(X)                                                                       \
    X(RAISED, 1, "raised")                                                                         \
    X(CLEARED, 2, "cleared")                                                                       \
    X(RESOLVED, 3, "resolved")

/* Result codes of Ack and Error (Code). */
#define NAMES_CODE(X)                                                                              \
    X(OK, 0, "OK")                                                                                 \
    X(DROPPED, 1, "DROPPED")                                                                       \
    X(BAD_REQUEST, 2, "BAD_REQUEST")                                                               \
    X(UNKNOWN_BUFFER, 3, "UNKNOWN_BUFFER")                                                         \
    X(OUT_OF_BOUNDS, 4, "OUT_OF_BOUNDS")                                                           \
    X(UNSUPPORTED, 5, "UNSUPPORTED")                                                               \
    X(INTERNAL, 6, "INTERNAL")                                                                     \
    X(VERSION, 7, "VERSION")                                                                       \
    X(PERMISSION, 8, "PERMISSION")                                                                 \
    X(FRAME, 9, "FRAME")                                                                           \
    X(NO_HELLO, 10, "NO_HELLO")                                                                    \
    X(BUSY, 11, "BUSY")

/* The name of value v in each list; "unknown" for a value that is not in it. */
const char *names_dtype(int v);
const char *names_buffer_kind(int v);
const char *names_alert_rule(int v);
const char *names_alert_state(int v);
const char *names_code(int v);

/* The value of the alert rule called name (as names_alert_rule() spells it), or 0 when none. */
int names_alert_rule_from(const char *name);

#endif /* ATTNSTAT_NAMES_H */
