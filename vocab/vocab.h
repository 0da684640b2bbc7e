/* vocab.h — every per-head statistic and every alert rule of attnstat, described once, as a row.
 * Stage: the ground floor (includes nothing; anything may include it).
 *
 * HINT: start here to add a statistic or a rule. README.md, "Adding a statistic or a rule", lists
 * the files that still need a hand (the math in kernels/, a migration in schema/, a field in
 * include/attnstat.h and proto/attnstat.proto) and why; every other place that converts, stores,
 * exports, pools, validates or names a statistic or a rule loops over these rows, and the Python
 * binding's field lists and the compact format's layout are generated from them at build time.
 *
 * A list is used by defining X with the list's columns and expanding it:
 *     #define X(name, ...) h->name = NAN;
 *     VOCAB_STATS(X)
 *     #undef X
 * Order matters and is fixed: a row's place is its place in the public struct
 * (attnstat_head_result), the wire (HeadStats), the store's columns and the export's columns.
 * New rows go at the end of their list.
 */
#ifndef ATTNSTAT_VOCAB_H
#define ATTNSTAT_VOCAB_H

/* ---- per-head statistics (double) ------------------------------------------------------------
 * X(name, unit, pack, since, pool, weight, lo, hi, absent, metric, help, cli, digits, ask, dflt)
 *   name    the C field (stats_head, attnstat_head_result), the wire field (HeadStats), the SQL
 *           column (samples), the export column and the Python attribute: one spelling.
 *   unit    what the number counts: VOCAB_NATS, VOCAB_RATIO (a fraction in [0, 1]), VOCAB_LOGIT,
 *           VOCAB_POSITIONS (key positions).
 *   pack    how the compact tier stores it (schema/store_pack.h): VOCAB_PACK_F32 (binary32),
 *           VOCAB_PACK_NAT16 (u16 in units of 1/2048 nat, [0, 31.9995]), VOCAB_PACK_UNIT16 (u16
 *           in units of 1/65534, [0, 1]).
 *   since   the first compact-format version that carries it (older rows read it as absent).
 *   pool    how two samples of a head (two processes of a job, or a bucket's steps) pool:
 *           VOCAB_POOL_MEAN (mean weighted by `weight`), VOCAB_POOL_STD (pooled standard deviation
 *           about the VOCAB_POOL_MEAN row before it, weighted by `weight`), VOCAB_POOL_MIN,
 *           VOCAB_POOL_MAX.
 *   weight  the count whose rows the value is over: rows or rows_norm (a VOCAB_COUNTS name).
 *   lo, hi  the range a daemon accepts from a client that computed it (NaN: absent, always
 *           accepted; the bounds are inclusive).
 *   absent  its value when no counted row defines it: VOCAB_ABSENT_NAN, VOCAB_ABSENT_ZERO (a
 *           fraction of no rows), VOCAB_ABSENT_NO_LOGIT (-inf when the head has no counted row).
 *   metric  its per-head /metrics family (attnstat_head_<metric>), "" for none.
 *   help    the family's HELP text, and what the CLI and docs say of it.
 *   cli     the CLI's column header and `--metric` name.
 *   digits  decimals the CLI shows.
 *   ask     the name a push asks for it by (attnstat_push_ext.stats, monitor(stats=...)): rows
 *           that one pass of the kernels computes together share it ("entropy").
 *   dflt    VOCAB_ON: computed and reported when a push asks for nothing in particular;
 *           VOCAB_ON_REQUEST: only when asked (what it costs the tensor-core kernels is in
 *           bench/kernel_notes.md). A statistic not asked for is absent (NaN) in the result,
 *           whichever backend computed it, so that a series never depends on the kernel taken.
 */
#define VOCAB_STATS(X)                                                                             \
    X(entropy_mean, VOCAB_NATS, VOCAB_PACK_F32, 1, VOCAB_POOL_MEAN, rows, 0.0, 1e30,               \
      VOCAB_ABSENT_NAN, "entropy_nats", "Latest attention entropy mean of a head, in nats.",       \
      "entropy", 4, "entropy", VOCAB_ON)                                                           \
    X(entropy_std, VOCAB_NATS, VOCAB_PACK_NAT16, 1, VOCAB_POOL_STD, rows, 0.0, 1e30,               \
      VOCAB_ABSENT_NAN, "", "Standard deviation of a head's per-row entropy, in nats.", "std", 4,  \
      "entropy", VOCAB_ON)                                                                         \
    X(entropy_min, VOCAB_NATS, VOCAB_PACK_NAT16, 1, VOCAB_POOL_MIN, rows, 0.0, 1e30,               \
      VOCAB_ABSENT_NAN, "", "Lowest per-row entropy of a head, in nats.", "ent_min", 4,            \
      "entropy", VOCAB_ON)                                                                         \
    X(entropy_max, VOCAB_NATS, VOCAB_PACK_NAT16, 1, VOCAB_POOL_MAX, rows, 0.0, 1e30,               \
      VOCAB_ABSENT_NAN, "", "Highest per-row entropy of a head, in nats.", "max", 4, "entropy",    \
      VOCAB_ON)                                                                                    \
    X(entropy_norm_mean, VOCAB_RATIO, VOCAB_PACK_UNIT16, 1, VOCAB_POOL_MEAN, rows_norm, 0.0, 1.0,  \
      VOCAB_ABSENT_NAN, "entropy_normalized_ratio",                                                \
      "Latest normalised attention entropy mean of a head (0..1: entropy / ln(visible keys)).",    \
      "ent_norm", 4, "entropy", VOCAB_ON)                                                          \
    X(collapsed_frac, VOCAB_RATIO, VOCAB_PACK_UNIT16, 1, VOCAB_POOL_MEAN, rows_norm, 0.0, 1.0,     \
      VOCAB_ABSENT_ZERO, "collapsed_ratio",                                                        \
      "Latest fraction of a head's rows whose normalised entropy is under the collapse "           \
      "threshold.", "collapsed", 3, "entropy", VOCAB_ON)                                           \
    X(max_logit, VOCAB_LOGIT, VOCAB_PACK_F32, 1, VOCAB_POOL_MAX, rows, -1e30, 1e30,                \
      VOCAB_ABSENT_NO_LOGIT, "max_logit", "Latest maximum scaled attention logit of a head.",      \
      "max_logit", 2, "max_logit", VOCAB_ON)                                                       \
    X(sink_mass, VOCAB_RATIO, VOCAB_PACK_UNIT16, 2, VOCAB_POOL_MEAN, rows, 0.0, 1.0,               \
      VOCAB_ABSENT_NAN, "sink_mass_ratio",                                                         \
      "Latest mean over a head's rows of the attention on the row's first visible key (the "       \
      "sink token).", "sink_mass", 4, "sink_mass", VOCAB_ON_REQUEST)                               \
    X(distance, VOCAB_POSITIONS, VOCAB_PACK_F32, 2, VOCAB_POOL_MEAN, rows, 0.0, 1e30,              \
      VOCAB_ABSENT_NAN, "distance_positions",                                                      \
      "Latest mean attention distance of a head: the mean over rows of sum_j p_ij |i - j|, in "    \
      "positions.", "distance", 2, "distance", VOCAB_ON_REQUEST)

/* ---- per-head counts (int64 in the store and stats_head, uint64 on the wire) ------------------
 * X(name, help) */
#define VOCAB_COUNTS(X)                                                                            \
    X(rows, "rows counted: sampled, at least one visible key, finite logits")                     \
    X(rows_norm, "counted rows with at least two outcomes (normalised entropy defined)")          \
    X(rows_empty, "sampled rows with no visible key (excluded)")                                  \
    X(nonfinite_rows, "sampled rows whose logits had NaN or Inf (excluded)")

/* ---- alert thresholds ------------------------------------------------------------------------
 * X(name, type, default, lo, lo_incl, hi, hi_incl, help)
 *   type  VOCAB_D (double) or VOCAB_U (uint32; both bounds are then inclusive)
 *   A threshold is finite and lies between lo and hi, each bound inclusive when its _incl is 1. Its wire field (Thresholds), its
 *   daemon option (attnstatd.conf, --name), its public field (attnstat_thresholds), its key in a
 *   run's stored thresholds and its Python keyword are all `name`. */
#define VOCAB_THRESHOLDS(X)                                                                        \
    X(entropy_floor, VOCAB_D, 0.1, 0.0, 1, 1.0, 1,                                                  \
      "normalised entropy mean under which a head is collapsing")                                 \
    X(entropy_drop, VOCAB_D, 0.5, 0.0, 0, 1.0, 0,                                                 \
      "fraction of its EMA baseline by which a head's entropy mean must fall to alert")           \
    X(ema_alpha, VOCAB_D, 0.05, 0.0, 0, 1.0, 1, "smoothing of the entropy baseline")                  \
    X(ema_warmup, VOCAB_U, 20, 1, 1, 1000000, 1,                                                 \
      "samples before the entropy baseline is trusted")                                          \
    X(logit_ceiling, VOCAB_D, 100.0, 0.0, 0, 1e30, 1,                                               \
      "max logit over which a head alerts (QK-Clip's tau)")                                       \
    X(raise_after, VOCAB_U, 3, 1, 1, 1000000, 1, "consecutive bad samples that raise an alert")   \
    X(clear_after, VOCAB_U, 5, 1, 1, 1000000, 1, "consecutive good samples that clear it")        \
    X(sink_mass_ceiling, VOCAB_D, 1.0, 0.0, 0, 1.0, 1,                                              \
      "sink mass over which a head alerts (1: off, a mass cannot exceed 1)")                      \
    X(distance_floor, VOCAB_D, 0.0, 0.0, 1, 1e30, 1,                                                \
      "mean attention distance under which a head alerts (0: off)")

/* ---- alert rules -----------------------------------------------------------------------------
 * X(CONSTANT, value, name, stat, cmp, threshold)
 *   CONSTANT, value, name   the protocol's AlertRule (proto/names.h spells the same names)
 *   stat       the statistic (a VOCAB_STATS or VOCAB_COUNTS name) the rule reads
 *   cmp        VOCAB_BELOW: bad when stat < threshold; VOCAB_ABOVE: bad when stat > threshold;
 *              VOCAB_DROP: bad when stat < (1 - threshold) x its EMA baseline (entropy_drop);
 *              VOCAB_ANY: bad when the count is > 0 (threshold: none)
 *   threshold  the VOCAB_THRESHOLDS row it compares with (or `none`) */
#define VOCAB_RULES(X)                                                                             \
    X(ENTROPY_FLOOR, 1, "entropy_floor", entropy_norm_mean, VOCAB_BELOW, entropy_floor)           \
    X(ENTROPY_DROP, 2, "entropy_drop", entropy_mean, VOCAB_DROP, entropy_drop)                    \
    X(LOGIT_CEILING, 3, "logit_ceiling", max_logit, VOCAB_ABOVE, logit_ceiling)                   \
    X(NONFINITE, 4, "nonfinite", nonfinite_rows, VOCAB_ANY, none)                                 \
    X(SINK_MASS_CEILING, 5, "sink_mass_ceiling", sink_mass, VOCAB_ABOVE, sink_mass_ceiling)       \
    X(DISTANCE_FLOOR, 6, "distance_floor", distance, VOCAB_BELOW, distance_floor)

/* The values the columns take (enums, so that a switch over them is checked). */
enum vocab_unit { VOCAB_NATS, VOCAB_RATIO, VOCAB_LOGIT, VOCAB_POSITIONS };
enum vocab_pack { VOCAB_PACK_F32, VOCAB_PACK_NAT16, VOCAB_PACK_UNIT16 };
enum vocab_pool { VOCAB_POOL_MEAN, VOCAB_POOL_STD, VOCAB_POOL_MIN, VOCAB_POOL_MAX };
enum vocab_absent { VOCAB_ABSENT_NAN, VOCAB_ABSENT_ZERO, VOCAB_ABSENT_NO_LOGIT };
enum vocab_type { VOCAB_D, VOCAB_U };
enum vocab_cmp { VOCAB_BELOW, VOCAB_ABOVE, VOCAB_DROP, VOCAB_ANY };
enum vocab_dflt { VOCAB_ON_REQUEST, VOCAB_ON };

/* Counts of the lists, for arrays sized by them. */
#define VOCAB_ONE_(...) +1
enum {
    VOCAB_NSTATS = 0 VOCAB_STATS(VOCAB_ONE_),
    VOCAB_NCOUNTS = 0 VOCAB_COUNTS(VOCAB_ONE_),
    VOCAB_NTHRESHOLDS = 0 VOCAB_THRESHOLDS(VOCAB_ONE_),
    VOCAB_NRULES = 0 VOCAB_RULES(VOCAB_ONE_)
};

/* A statistic's place in VOCAB_STATS (VOCAB_STAT_entropy_mean = 0, ...), and its bit in a set of
 * statistics (a push's `stats`, stats_problem.want): bit i is row i. */
#define VOCAB_STAT_INDEX_(name, ...) VOCAB_STAT_##name,
enum vocab_stat { VOCAB_STATS(VOCAB_STAT_INDEX_) };
#define VOCAB_BIT(name) (1u << VOCAB_STAT_##name)
#define VOCAB_DFLT_BIT_(name, unit, pack, since, pool, weight, lo, hi, absent, metric, help, cli,  \
                        digits, ask, dflt)                                                         \
    | ((dflt) == VOCAB_ON ? VOCAB_BIT(name) : 0u)
/* The statistics a push that asks for nothing in particular gets, and every one. */
#define VOCAB_STATS_DEFAULT (0u VOCAB_STATS(VOCAB_DFLT_BIT_))
#define VOCAB_STATS_ALL ((1u << VOCAB_NSTATS) - 1u)

/* ---- interventions (proto/attnstat.proto's Intervention) ----------------------------------------
 * The bounds of a record of what a job did to its model (attnstat.torch.qk_clip's clipped heads),
 * held once here for every side that checks them: libattnstat before it sends one, attnstatd when
 * it receives one, the store when it writes one. */
#define VOCAB_INTERVENTION_KIND_MAX 32 /* bytes of kind, each of VOCAB_INTERVENTION_KIND_CHARS */
#define VOCAB_INTERVENTION_KIND_CHARS "abcdefghijklmnopqrstuvwxyz0123456789_.-"
#define VOCAB_INTERVENTION_HEADS_MAX 4096      /* heads (and values) of one record */
#define VOCAB_INTERVENTION_HEAD_LIMIT (1u << 24) /* a head number is under it */
#define VOCAB_INTERVENTION_DETAIL_MAX 1024     /* bytes of detail */

#endif /* ATTNSTAT_VOCAB_H */
