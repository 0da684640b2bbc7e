/* names.c — the lookups of names.h, and a compile-time check that each list's values are those of
 * the enums protoc-c generated from attnstat.proto. Stage: the wire; includes proto/ only. */
#include "names.h"

#include <string.h>

#include "attnstat.pb-c.h"

#define CHECK(prefix, c, v, s) _Static_assert(prefix##c == (v), "names.h: " #c " is not " #v);
#define CHECK_DTYPE(c, v, s) CHECK(ATTNSTAT__DTYPE__, c, v, s)
#define CHECK_KIND(c, v, s) CHECK(ATTNSTAT__BUFFER_KIND__, c, v, s)
#define CHECK_RULE(c, v, s) CHECK(ATTNSTAT__ALERT_RULE__, c, v, s)
#define CHECK_STATE(c, v, s) CHECK(ATTNSTAT__ALERT_STATE__, c, v, s)
#define CHECK_CODE(c, v, s) CHECK(ATTNSTAT__CODE__, c, v, s)
NAMES_DTYPE(CHECK_DTYPE)
NAMES_BUFFER_KIND(CHECK_KIND)
NAMES_ALERT_RULE(CHECK_RULE)
NAMES_ALERT_STATE(CHECK_STATE)
NAMES_CODE(CHECK_CODE)

#define CASE(c, v, s)                                                                              \
    case v:                                                                                        \
        return s;

const char *names_dtype(int v)
{
    switch (v) { NAMES_DTYPE(CASE) }
    return "unknown";
}

const char *names_buffer_kind(int v)
{
    switch (v) { NAMES_BUFFER_KIND(CASE) }
    return "unknown";
}

const char *names_alert_rule(int v)
{
    switch (v) { NAMES_ALERT_RULE(CASE) }
    return "unknown";
}

const char *names_alert_state(int v)
{
    switch (v) { NAMES_ALERT_STATE(CASE) }
    return "unknown";
}

const char *names_code(int v)
{
    switch (v) { NAMES_CODE(CASE) }
    return "unknown";
}

int names_alert_rule_from(const char *name)
{
#define FROM(c, v, s)                                                                              \
    if (strcmp(name, s) == 0)                                                                      \
        return v;
    if (name) {
        NAMES_ALERT_RULE(FROM)
    }
#undef FROM
    return 0;
}

/* The alert rules of the statistics' tables (vocab/vocab.h) are the protocol's, value for value. */
#include "vocab.h"
#define X(c, v, name, stat, cmp, th) _Static_assert(ATTNSTAT__ALERT_RULE__##c == v, #c);
VOCAB_RULES(X)
#undef X
_Static_assert(VOCAB_NRULES == 0 NAMES_ALERT_RULE(VOCAB_ONE_), "vocab.h and names.h list the same rules");
