/* alerts.h — the alert engine: rules over per-(run, layer, head) statistics, with hysteresis.
 *
 * Stage: the rule engine, fed by alerts_feed.c. Includes kernels/ (stats.h), proto/names.h and
 * vocab/vocab.h (the rules and thresholds, as rows).
 * Pure logic: no I/O, no clock, no global state. The daemon feeds it every stored sample and sinks
 * the transitions it returns (store, log, subscribers, exec). One engine is used by one thread at
 * a time.
 *
 * Rules: the rows of VOCAB_RULES (vocab.h; values match AlertRule in proto/attnstat.proto), each
 * kept per (run, layer, head) and judged by its cmp column on its stat against its threshold:
 *   VOCAB_BELOW  bad when stat < threshold (ENTROPY_FLOOR: entropy_norm_mean < entropy_floor;
 *                DISTANCE_FLOOR: distance < distance_floor, off at its default 0).
 *                value = the stat, threshold = the threshold.
 *   VOCAB_ABOVE  bad when stat > threshold (LOGIT_CEILING: max_logit > logit_ceiling;
 *                SINK_MASS_CEILING: sink_mass > sink_mass_ceiling, off at its default 1).
 *                value = the stat, threshold = the threshold.
 *   VOCAB_DROP   ENTROPY_DROP: bad when entropy_mean < (1 - entropy_drop) * baseline, where the
 *                baseline is an EMA of entropy_mean with weight ema_alpha. The first sample sets
 *                the baseline; the rule judges nothing until ema_warmup samples have been folded
 *                in. The baseline takes a sample only while the rule is not raised and the sample
 *                is not bad, so a collapse does not drag its own reference down.
 *                value = entropy_mean, threshold = (1 - entropy_drop) * baseline.
 *   VOCAB_ANY    NONFINITE: bad when nonfinite_rows > 0. Raises on the first bad sample (whatever
 *                raise_after says), clears like the others.
 *                value = nonfinite_rows, threshold = 0.
 * Hysteresis: a rule raises after raise_after consecutive bad samples and clears after
 * clear_after consecutive good ones; one transition per edge, never repeated while the state holds.
 * An alert also ends when its run ends or an operator resolves it (ALERTS_RESOLVED): the engine
 * does not judge that, the feed does (alerts_forget_run(), alerts_resolve()).
 * Samples that say nothing: a sample with rows == 0 (no counted row: its means are NaN) changes
 * nothing for the rules on a statistic; for NONFINITE it is bad when nonfinite_rows > 0 (a head
 * whose every row was non-finite) and changes nothing otherwise. A rule whose value is NaN (e.g.
 * entropy_norm_mean when rows_norm == 0, or sink_mass and distance from a producer that does not
 * compute them) changes nothing for that rule: counters keep their streak.
 *
 * Memory: per-head state lives in an open-addressing hash table that grows geometrically when a new
 * (run, layer, head) appears; observing heads already known never allocates (see
 * alerts_allocations()). alerts_reserve() sizes it up front. A small per-run record (thresholds,
 * number of states, refusals) is made for a run's first state; room for 8 runs comes with the
 * engine.
 * Limits (alerts_limits): one run keeps at most max_heads_per_run states and the engine at most
 * max_heads, so a client pushing many distinct (layer, head) pairs cannot take the memory, nor the
 * room, that other runs' alerts need. A new head past a limit is not tracked: alerts_observe()
 * says so with its own result (not an allocation failure) and counts it (alerts_refused()).
 */
#ifndef ATTNSTAT_ALERTS_H
#define ATTNSTAT_ALERTS_H

#include <stddef.h>
#include <stdint.h>

#include "names.h"
#include "stats.h"
#include "vocab.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The rules and states are the protocol's AlertRule and AlertState, from its one table of names
 * (proto/names.h): ALERTS_ENTROPY_FLOOR = 1 ... ALERTS_DISTANCE_FLOOR = 6, ALERTS_RAISED = 1,
 * ALERTS_CLEARED = 2. proto/names.c checks them against vocab.h's VOCAB_RULES. */
typedef enum {
#define ALERTS_RULE_ID(c, v, s) ALERTS_##c = v,
    NAMES_ALERT_RULE(ALERTS_RULE_ID)
#undef ALERTS_RULE_ID
} alerts_rule;

/* Every rule of VOCAB_RULES is evaluated; rule r keeps its state in slot r - 1. */
#define ALERTS_NRULES VOCAB_NRULES

typedef enum {
#define ALERTS_STATE_ID(c, v, s) ALERTS_##c = v,
    NAMES_ALERT_STATE(ALERTS_STATE_ID)
#undef ALERTS_STATE_ID
} alerts_state;

/* The thresholds' defaults are VOCAB_THRESHOLDS' default column (vocab.h), the one place they
 * are written: alerts_config_default() and attnstatd's settings table (daemon/config.c) read it.
 * The engine's own limit's default: */
#define ALERTS_DEFAULT_MAX_HEADS_PER_RUN 65536
#define ALERTS_STR_(x) #x
#define ALERTS_STR(x) ALERTS_STR_(x) /* a default as text: ALERTS_STR(ALERTS_DEFAULT_RAISE_AFTER) */

/* A threshold's C type by its VOCAB_THRESHOLDS type: ALERTS_CTYPE_##type. */
#define ALERTS_CTYPE_VOCAB_D double
#define ALERTS_CTYPE_VOCAB_U uint32_t

/* Thresholds: one field per VOCAB_THRESHOLDS row, in its order, named as the row. Defaults
 * (alerts_config_default) and accepted bounds are the row's (vocab.h); today:
 *   entropy_floor      0.1    [0, 1]      normalised entropy: mean row attends almost one key
 *   entropy_drop       0.5    (0, 1)      entropy halves relative to its baseline
 *   ema_alpha          0.05   (0, 1]      baseline memory of about 1/alpha = 20 samples
 *   ema_warmup         20     [1, 1e6]    samples before ENTROPY_DROP can judge
 *   logit_ceiling      100    (0, 1e30]   QK-Clip's tau (Kimi K2)
 *   raise_after        3      [1, 1e6]    consecutive bad samples to raise
 *   clear_after        5      [1, 1e6]    consecutive good samples to clear
 *   sink_mass_ceiling  1      (0, 1]      1: off (a mass is never over 1)
 *   distance_floor     0      [0, 1e30]   0: off (a distance is never under 0)
 * (Thresholds.collapse_threshold of the protocol is a parameter of the computation, not of these
 * rules: it goes to stats_problem.collapse_threshold.) */
typedef struct {
#define ALERTS_CONFIG_FIELD(name, type, ...) ALERTS_CTYPE_##type name;
    VOCAB_THRESHOLDS(ALERTS_CONFIG_FIELD)
#undef ALERTS_CONFIG_FIELD
} alerts_config;

/* Per-run overrides: each field is used only when its has_ flag is set (the shape protobuf-c gives
 * the optional fields of Thresholds). */
typedef struct {
#define ALERTS_OVERRIDE_FIELD(name, type, ...)                                                     \
    int has_##name;                                                                                \
    ALERTS_CTYPE_##type name;
    VOCAB_THRESHOLDS(ALERTS_OVERRIDE_FIELD)
#undef ALERTS_OVERRIDE_FIELD
} alerts_overrides;

/* One edge of one rule of one head. */
typedef struct {
    int64_t run_id;
    int32_t layer, head;
    int64_t step;        /* the sample that caused it (for active alerts: the one that raised) */
    alerts_rule rule;
    alerts_state state;
    double value;        /* the rule's value in that sample (see the rules above) */
    double threshold;    /* the threshold it was compared with */
    uint32_t streak;     /* consecutive bad (raise) or good (clear) samples that led to it */
} alerts_transition;

typedef enum {
    ALERTS_OK = 0,
    ALERTS_EINVAL = 1,   /* bad argument or a threshold out of bounds: the message names it */
    ALERTS_ENOMEM = 2,   /* an allocation failed */
    ALERTS_ELIMIT = 3,   /* more states than the limits allow (alerts_reserve()) */
} alerts_status;

typedef struct alerts_engine alerts_engine;

/* Most (run, layer, head) states one engine can keep: the bound of alerts_limits.max_heads. A state
 * takes about 320 bytes and the table stays at most half full, so the table of 2^18 states is
 * 2^19 slots, about 160 MiB (about 240 MiB for the moment it doubles); alerts_table_bytes_max()
 * gives the exact figure. */
#define ALERTS_MAX_HEADS (1u << 18)

/* Limits of one engine (engine-wide: a run's thresholds cannot change them). Defaults
 * (alerts_limits_default) and accepted bounds:
 *   max_heads_per_run  65536             [1, ALERTS_MAX_HEADS]  distinct (layer, head) of one run
 *   max_heads          ALERTS_MAX_HEADS  [1, ALERTS_MAX_HEADS]  states of every run together */
typedef struct {
    uint32_t max_heads_per_run;
    uint32_t max_heads;
} alerts_limits;


/* alerts_observe() results other than a number of transitions (>= 0). Nothing changed with any of
 * them. */
#define ALERTS_OBSERVE_ERROR (-1)    /* a bad argument, or the new head's state could not be allocated */
#define ALERTS_OBSERVE_RUN_FULL (-2) /* new head of a run holding max_heads_per_run states: not tracked */
#define ALERTS_OBSERVE_FULL (-3)     /* new head while the engine holds max_heads states: not tracked */

const char *alerts_rule_name(alerts_rule r);   /* "entropy_floor", ...; "unknown" otherwise */
const char *alerts_state_name(alerts_state s); /* "raised", "cleared" */
/* The rule named name (as alerts_rule_name() spells it), or 0 when none. */
alerts_rule alerts_rule_from_name(const char *name);

void alerts_config_default(alerts_config *c);

/* The threshold of rule r in c (its VOCAB_RULES threshold column, as a double; for ENTROPY_DROP
 * the fraction entropy_drop, not the baseline's threshold), with its row's name in *name (may be
 * NULL). 0 when r has none (NONFINITE) or is not a rule: *value and *name are then untouched. */
int alerts_rule_threshold(const alerts_config *c, alerts_rule r, double *value, const char **name);

/* Check every field against its bounds. ALERTS_EINVAL with a message naming the field, the value
 * and the bounds. err may be NULL. */
alerts_status alerts_config_check(const alerts_config *c, char *err, size_t errlen);

/* out = base with the fields set in o replaced; checked. o may be NULL (out = base). */
alerts_status alerts_config_merge(alerts_config *out, const alerts_config *base,
                                  const alerts_overrides *o, char *err, size_t errlen);

/* The config as one line of JSON (for the runs table, logs). Returns what snprintf returns. */
int alerts_config_format(const alerts_config *c, char *buf, size_t n);

/* A config as alerts_config_format wrote it, read back by key into o (each threshold found set,
 * with its has_ flag; a key this daemon does not know is ignored, one it knows that the text
 * lacks stays unset: the daemon's value). Returns how many were found, -1 when json is not an
 * object. */
int alerts_config_parse(const char *json, alerts_overrides *o);

/* A one-line description of a transition for people (logs, the alerts table, the exec sink), e.g.
 * "entropy_floor raised: run 3 layer 2 head 7 step 1200: normalised entropy mean 0.041 < 0.1
 * for 3 samples". Returns what snprintf returns. */
int alerts_format(const alerts_transition *t, char *buf, size_t n);

/* A new engine whose runs use `defaults` (checked; NULL: alerts_config_default()), with the
 * default limits. NULL with err set on a bad config or out of memory. */
alerts_engine *alerts_new(const alerts_config *defaults, char *err, size_t errlen);
void alerts_free(alerts_engine *e);

void alerts_limits_default(alerts_limits *l);

/* Check both limits against their bounds. ALERTS_EINVAL with a message naming the field, the value
 * and the bounds. err may be NULL. */
alerts_status alerts_limits_check(const alerts_limits *l, char *err, size_t errlen);

/* Use the limits l (checked; bad values give ALERTS_EINVAL and change nothing). States already
 * kept stay, even past a lowered limit; the limits apply to new heads. Never allocates. */
alerts_status alerts_set_limits(alerts_engine *e, const alerts_limits *l, char *err, size_t errlen);
void alerts_get_limits(const alerts_engine *e, alerts_limits *out);

/* The most bytes the state table can take under the engine's limits (not counting the moment it
 * doubles, when the old table, half this size, is alive too). */
size_t alerts_table_bytes_max(const alerts_engine *e);

/* Make room for n (run, layer, head) states without further growth. ALERTS_ELIMIT when n is more
 * than max_heads. */
alerts_status alerts_reserve(alerts_engine *e, size_t n);

/* Per-run thresholds: the engine's defaults with o applied (o NULL: back to the defaults). Takes
 * effect from the next sample of that run; raised alerts and streaks are kept. Bad values give
 * ALERTS_EINVAL and change nothing. run_id > 0. */
alerts_status alerts_set_run(alerts_engine *e, int64_t run_id, const alerts_overrides *o,
                             char *err, size_t errlen);

/* New defaults (checked: a bad config gives ALERTS_EINVAL and changes nothing): every run's
 * thresholds become the new defaults with its own overrides (those alerts_set_run() was given)
 * applied. Raised alerts and streaks are kept. */
alerts_status alerts_set_defaults(alerts_engine *e, const alerts_config *c, char *err,
                                  size_t errlen);

/* The thresholds in force for run_id (its overrides, or the defaults). */
void alerts_run_config(const alerts_engine *e, int64_t run_id, alerts_config *out);

/* Observe one sample. Writes the transitions it causes (at most ALERTS_NRULES, in rule order) to
 * out and returns how many. Otherwise, with nothing changed:
 *   ALERTS_OBSERVE_ERROR     an argument is bad (run_id <= 0, layer < 0, head < 0, h NULL), or the
 *                            state of a new head cannot be allocated;
 *   ALERTS_OBSERVE_RUN_FULL  a new head of a run that has max_heads_per_run states;
 *   ALERTS_OBSERVE_FULL      a new head while the engine has max_heads states.
 * The last two are counted (alerts_refused()); heads already kept are observed as ever. */
int alerts_observe(alerts_engine *e, int64_t run_id, int32_t layer, int32_t head, int64_t step,
                   const stats_head *h, alerts_transition out[ALERTS_NRULES]);

/* Restore an alert that was raised before a restart (the store's active alerts): the state of
 * (run_id, layer, head) is made when missing, within the limits, and `rule` is marked raised by a
 * transition at `step` with `value` and `threshold`; its streaks are 0, so it clears after
 * clear_after good samples (and is not raised again while bad). For ENTROPY_DROP the baseline is
 * taken back from the threshold ((1 - entropy_drop) * baseline, with the run's thresholds in force
 * now; set them first) and counts as warmed up; a threshold that is not finite and > 0 gives
 * ALERTS_EINVAL. A rule already raised is left as it is. Returns ALERTS_OK, ALERTS_EINVAL (a bad
 * argument), ALERTS_ELIMIT (a new head past max_heads_per_run or max_heads: not restored, not
 * counted as refused) or ALERTS_ENOMEM. */
alerts_status alerts_restore(alerts_engine *e, int64_t run_id, int32_t layer, int32_t head,
                             alerts_rule rule, int64_t step, double value, double threshold);

/* An operator resolved the alert of (run_id, layer, head, rule) that was raised at step: when it
 * is raised now by that step, it is no longer raised and its streaks start again (a head still
 * bad raises again after raise_after samples). 1 when it was, else 0 (it cleared meanwhile, or was
 * raised again at another step: nothing changes). */
int alerts_resolve(alerts_engine *e, int64_t run_id, int32_t layer, int32_t head,
                   alerts_rule rule, int64_t step);

/* The alerts raised now, of one run (run_id > 0) or all (run_id == 0): writes up to max of them
 * to out (in no particular order; each as its raising transition) and returns how many there are.
 * out may be NULL when max == 0. */
size_t alerts_active(const alerts_engine *e, int64_t run_id, alerts_transition *out, size_t max);

/* Drop every state and the overrides of a run (it ended). Raised alerts are dropped without a
 * transition: the caller records the end of the run if it wants to. Never allocates. */
void alerts_forget_run(alerts_engine *e, int64_t run_id);
/* The same but the run's own thresholds stay: a run that ended for idleness, whose client is
 * still connected and may push again. */
void alerts_forget_heads(alerts_engine *e, int64_t run_id);

/* Number of (run, layer, head) states kept. */
size_t alerts_heads(const alerts_engine *e);

/* Number of states kept for one run (run_id > 0). */
size_t alerts_run_heads(const alerts_engine *e, int64_t run_id);

/* Samples of new heads not tracked because of a limit (ALERTS_OBSERVE_RUN_FULL or
 * ALERTS_OBSERVE_FULL): of one run (run_id > 0), counted while it has a record (from its first
 * state or thresholds until it is forgotten: a run refused its very first head by the engine's
 * limit has none), or of every run since alerts_new() (run_id == 0). A caller can log a limit
 * once: when observe reports it and this count is 1. */
uint64_t alerts_refused(const alerts_engine *e, int64_t run_id);

/* Allocations the engine has made since alerts_new() (constant in the steady state). */
size_t alerts_allocations(const alerts_engine *e);

#ifdef __cplusplus
}
#endif

#endif /* ATTNSTAT_ALERTS_H */
