/* test_headtab.c — unit tests of daemon/headtab.c (the per-head metrics), no daemon: samples of
 * one (job, layer, head) and step from several processes pool into the statistics of all their rows
 * (store_merge_stats), a newer step or a process's own re-push replaces; tensor-parallel ranks'
 * heads sit side by side; alerts count raises and clears per rule (every rule of vocab.h); the
 * per-head families are vocab.h's rows with a metric, sink mass and distance shown only when
 * finite; a head whose push asked for some statistics only shows those (the absent ones in no
 * family, per head or per layer); each metrics_heads mode shows
 * what it promises (top: the N lowest-entropy and N highest-logit heads per job and every alerted
 * one); run names are escaped; the table's bound counts what it refuses; expiry forgets heads
 * nobody updates and the table keeps working; the sweep drops a head as soon as none of the
 * processes that fed it is live (a job that ended), by its processes or by its run name; each run
 * holds a fair share of the table (one that floods it gives keys back to a newcomer; those left
 * out are counted per run). The text is read back line by line. Random data from a printed seed
 * (ATTNSTAT_TEST_SEED replays it). */
#include "daemon_harness.h" /* seeds, the runner, and the usual system headers */
#include "headtab.h"
#include "store_job.h"

static dh_rng R;

static double unit(void)
{
    return (double)(dh_next(&R) >> 11) / 9007199254740992.0;
}

static stats_head head(double norm, double logit)
{
    stats_head h;
    memset(&h, 0, sizeof h);
    h.rows = 50 + (int64_t)(dh_next(&R) % 200);
    h.rows_norm = h.rows - (int64_t)(dh_next(&R) % 5);
    h.entropy_mean = 0.5 + 3 * unit();
    h.entropy_std = unit();
    h.entropy_min = h.entropy_mean - unit();
    h.entropy_max = h.entropy_mean + unit();
    h.entropy_norm_mean = norm;
    h.collapsed_frac = unit();
    h.max_logit = logit;
    return h;
}

static char *render(const headtab *t, headtab_mode mode, uint32_t top)
{
    metrics_buf b = {.limit = 64u << 20};
    headtab_render(t, mode, top, &b);
    ck_assert(!b.full);
    ck_assert_ptr_nonnull(b.p);
    return b.p;
}

/* The value of the sample `name{labels}` in text; NAN when there is none. */
static double value_of(const char *text, const char *name, const char *labels)
{
    char key[512];
    snprintf(key, sizeof key, "\n%s{%s} ", name, labels);
    const char *p = strstr(text, key);
    return p ? strtod(p + strlen(key), NULL) : NAN;
}

static int count_of(const char *text, const char *name)
{
    char key[256];
    snprintf(key, sizeof key, "\n%s{", name);
    int n = 0;
    for (const char *p = text; (p = strstr(p, key)); p++)
        n++;
    return n;
}

START_TEST(test_pool_replace_repush)
{
    headtab *t = headtab_new(1000);
    stats_head a = head(0.3 + unit() * 0.5, 20), b = head(0.3 + unit() * 0.5, 40);
    headtab_observe(t, "job", 1, 2, 5, &a, 1, 100, 1000); /* replica 1 */
    headtab_observe(t, "job", 2, 2, 5, &b, 1, 100, 1001); /* replica 2, same step: pooled */
    stats_head want = a;
    store_merge_stats(&want, &b);
    char *txt = render(t, HEADTAB_ALL, 10);
    double v = value_of(txt, "attnstat_head_entropy_normalized_ratio", "run=\"job\",layer=\"2\",head=\"5\"");
    ck_assert_msg(fabs(v - want.entropy_norm_mean) < 1e-9, "%.12g vs %.12g", v, want.entropy_norm_mean);
    ck_assert(fabs(value_of(txt, "attnstat_head_entropy_nats", "run=\"job\",layer=\"2\",head=\"5\"") -
                   want.entropy_mean) < 1e-9);
    ck_assert_double_eq(value_of(txt, "attnstat_head_max_logit", "run=\"job\",layer=\"2\",head=\"5\""), 40);
    free(txt);
    /* replica 1 pushes step 100 again: its word replaces the entry */
    stats_head a2 = head(0.05, 3);
    headtab_observe(t, "job", 1, 2, 5, &a2, 1, 100, 1002);
    txt = render(t, HEADTAB_ALL, 10);
    ck_assert(fabs(value_of(txt, "attnstat_head_entropy_normalized_ratio",
                            "run=\"job\",layer=\"2\",head=\"5\"") - 0.05) < 1e-12);
    free(txt);
    /* a newer step replaces; so does an older one (a job resumed from a checkpoint) */
    stats_head c = head(0.7, 9);
    headtab_observe(t, "job", 2, 2, 5, &c, 1, 101, 1003);
    txt = render(t, HEADTAB_ALL, 10);
    ck_assert_double_eq(value_of(txt, "attnstat_head_step", "run=\"job\",layer=\"2\",head=\"5\""), 101);
    ck_assert_double_eq(value_of(txt, "attnstat_head_entropy_normalized_ratio",
                                 "run=\"job\",layer=\"2\",head=\"5\""), 0.7);
    free(txt);
    headtab_observe(t, "job", 2, 2, 5, &a, 1, 50, 1004);
    txt = render(t, HEADTAB_ALL, 10);
    ck_assert_double_eq(value_of(txt, "attnstat_head_step", "run=\"job\",layer=\"2\",head=\"5\""), 50);
    free(txt);
    ck_assert_uint_eq(headtab_count(t), 1);
    headtab_free(t);
}
END_TEST

START_TEST(test_tensor_parallel_side_by_side)
{
    headtab *t = headtab_new(1000);
    stats_head h[2][4];
    for (int r = 0; r < 2; r++) {
        for (int i = 0; i < 4; i++)
            h[r][i] = head(unit(), 10 * r + i);
        headtab_observe(t, "tp", 10 + r, 0, 4 * r, h[r], 4, 7, 1000);
    }
    ck_assert_uint_eq(headtab_count(t), 8);
    char *txt = render(t, HEADTAB_ALL, 10);
    for (int r = 0; r < 2; r++)
        for (int i = 0; i < 4; i++) {
            char lab[64];
            snprintf(lab, sizeof lab, "run=\"tp\",layer=\"0\",head=\"%d\"", 4 * r + i);
            ck_assert_double_eq(value_of(txt, "attnstat_head_max_logit", lab), 10 * r + i);
        }
    ck_assert_double_eq(value_of(txt, "attnstat_layer_heads", "run=\"tp\",layer=\"0\""), 8);
    ck_assert_double_eq(value_of(txt, "attnstat_layer_max_logit", "run=\"tp\",layer=\"0\""), 13);
    free(txt);
    headtab_free(t);
}
END_TEST

START_TEST(test_alerts)
{
    headtab *t = headtab_new(1000);
    const char *lab = "run=\"j\",layer=\"1\",head=\"2\",rule=\"logit_ceiling\"";
    headtab_alert(t, "j", 1, 2, 3, 1, 1000); /* two processes raise it */
    headtab_alert(t, "j", 1, 2, 3, 1, 1000);
    headtab_alert(t, "j", 1, 2, 3, 0, 1000); /* one clears: still raised */
    char *txt = render(t, HEADTAB_LAYERS, 10);
    ck_assert_double_eq(value_of(txt, "attnstat_head_alert", lab), 1);
    /* an entry made by an alert alone has no values */
    ck_assert_int_eq(count_of(txt, "attnstat_layer_heads"), 0);
    free(txt);
    headtab_alert(t, "j", 1, 2, 3, 0, 1000);
    headtab_alert(t, "j", 1, 2, 3, 0, 1000); /* more clears than raises: no underflow */
    headtab_alert(t, "j", 1, 2, 9, 1, 1000); /* not a rule */
    txt = render(t, HEADTAB_ALL, 10);
    ck_assert_int_eq(count_of(txt, "attnstat_head_alert"), 0);
    free(txt);
    /* the rules on sink mass and distance (5, 6) are shown by their names */
    headtab_alert(t, "j", 1, 2, 5, 1, 1000);
    headtab_alert(t, "j", 1, 3, 6, 1, 1000);
    txt = render(t, HEADTAB_ALL, 10);
    ck_assert_double_eq(value_of(txt, "attnstat_head_alert",
                                 "run=\"j\",layer=\"1\",head=\"2\",rule=\"sink_mass_ceiling\""), 1);
    ck_assert_double_eq(value_of(txt, "attnstat_head_alert",
                                 "run=\"j\",layer=\"1\",head=\"3\",rule=\"distance_floor\""), 1);
    ck_assert_int_eq(count_of(txt, "attnstat_head_alert"), 2);
    free(txt);
    headtab_free(t);
}
END_TEST

/* The per-head families are vocab.h's VOCAB_STATS rows with a metric: today's four keep their
 * names and HELP texts, and sink_mass (attnstat_head_sink_mass_ratio) and distance
 * (attnstat_head_distance_positions) come with them, each shown only for a finite value. */
START_TEST(test_families)
{
    headtab *t = headtab_new(1000);
    stats_head h[4];
    for (int i = 0; i < 4; i++)
        h[i] = head(0.2 + 0.6 * unit(), 5 + 30 * unit());
    h[0].sink_mass = unit(), h[0].distance = 100 * unit();
    h[1].sink_mass = NAN, h[1].distance = NAN;         /* not computed */
    h[2].sink_mass = 1.0, h[2].distance = 0.0;         /* the bounds: finite, shown */
    memset(&h[3], 0, sizeof h[3]);                     /* no counted row: nothing shown */
    h[3].rows_empty = 4;
    h[3].entropy_mean = h[3].entropy_std = h[3].entropy_min = h[3].entropy_max = NAN;
    h[3].entropy_norm_mean = h[3].sink_mass = h[3].distance = NAN;
    h[3].collapsed_frac = 0.0;
    h[3].max_logit = -INFINITY;
    headtab_observe(t, "fam", 1, 0, 0, h, 4, 10, 1000);
    char *txt = render(t, HEADTAB_ALL, 10);
    static const char *const help[] = {
        "# HELP attnstat_head_entropy_normalized_ratio Latest normalised attention entropy mean of "
        "a head (0..1: entropy / ln(visible keys)).\n# TYPE attnstat_head_entropy_normalized_ratio "
        "gauge\n",
        "# HELP attnstat_head_entropy_nats Latest attention entropy mean of a head, in nats.\n",
        "# HELP attnstat_head_max_logit Latest maximum scaled attention logit of a head.\n",
        "# HELP attnstat_head_collapsed_ratio Latest fraction of a head's rows whose normalised "
        "entropy is under the collapse threshold.\n",
        "# HELP attnstat_head_sink_mass_ratio Latest mean over a head's rows of the attention on "
        "the row's first visible key (the sink token).\n# TYPE attnstat_head_sink_mass_ratio gauge\n",
        "# HELP attnstat_head_distance_positions Latest mean attention distance of a head",
    };
    for (size_t i = 0; i < sizeof help / sizeof help[0]; i++)
        ck_assert_msg(strstr(txt, help[i]), "no '%s' in\n%s", help[i], txt);
    const char *lab[3] = {"run=\"fam\",layer=\"0\",head=\"0\"", "run=\"fam\",layer=\"0\",head=\"1\"",
                          "run=\"fam\",layer=\"0\",head=\"2\""};
    /* (the text has 10 significant digits) */
    ck_assert(fabs(value_of(txt, "attnstat_head_sink_mass_ratio", lab[0]) - h[0].sink_mass) <=
              1e-9 * fabs(h[0].sink_mass));
    ck_assert(fabs(value_of(txt, "attnstat_head_distance_positions", lab[0]) - h[0].distance) <=
              1e-9 * fabs(h[0].distance));
    ck_assert_double_eq(value_of(txt, "attnstat_head_sink_mass_ratio", lab[2]), 1.0);
    ck_assert_double_eq(value_of(txt, "attnstat_head_distance_positions", lab[2]), 0.0);
    ck_assert_int_eq(count_of(txt, "attnstat_head_sink_mass_ratio"), 2);
    ck_assert_int_eq(count_of(txt, "attnstat_head_distance_positions"), 2);
    /* the other families as before: heads 0..2 have them, head 3 (no counted row) none */
    ck_assert(fabs(value_of(txt, "attnstat_head_max_logit", lab[1]) - h[1].max_logit) <=
              1e-9 * fabs(h[1].max_logit));
    ck_assert(fabs(value_of(txt, "attnstat_head_collapsed_ratio", lab[1]) - h[1].collapsed_frac) <=
              1e-9);
    ck_assert_int_eq(count_of(txt, "attnstat_head_entropy_nats"), 3);
    ck_assert_int_eq(count_of(txt, "attnstat_head_collapsed_ratio"), 3);
    ck_assert_int_eq(count_of(txt, "attnstat_head_max_logit"), 3);
    ck_assert_int_eq(count_of(txt, "attnstat_head_step"), 4);
    free(txt);
    headtab_free(t);
}
END_TEST

/* A push that asked for some statistics only (Push.stats; here sink_mass alone) has the others
 * absent (NaN) over counted rows: every family of an absent statistic leaves the head out, and so
 * do the layer's entropy and max-logit aggregates (its heads are still counted); the sink mass is
 * shown, pooled over two processes' samples of the step by rows, the absent ones staying absent.
 * In the top mode such a head ranks nowhere (no entropy, no logit) and is shown once alerted. */
START_TEST(test_statistics_not_asked)
{
    headtab *t = headtab_new(1000);
    stats_head a[3], b[3], want[3];
    for (int i = 0; i < 3; i++) {
        stats_head *x[2] = {&a[i], &b[i]};
        for (int j = 0; j < 2; j++) {
            *x[j] = head(NAN, NAN);
            x[j]->entropy_mean = x[j]->entropy_std = x[j]->entropy_min = NAN;
            x[j]->entropy_max = x[j]->collapsed_frac = x[j]->distance = NAN;
            x[j]->sink_mass = 0.05 + 0.9 * unit();
        }
        want[i] = a[i];
        store_merge_stats(&want[i], &b[i]);
        ck_assert(isfinite(want[i].sink_mass) && isnan(want[i].entropy_mean) &&
                  isnan(want[i].max_logit) && isnan(want[i].collapsed_frac));
        ck_assert(want[i].sink_mass >= fmin(a[i].sink_mass, b[i].sink_mass) &&
                  want[i].sink_mass <= fmax(a[i].sink_mass, b[i].sink_mass));
    }
    headtab_observe(t, "sink", 1, 4, 0, a, 3, 8, 1000);
    headtab_observe(t, "sink", 2, 4, 0, b, 3, 8, 1001); /* another process, same step: pooled */
    char *txt = render(t, HEADTAB_ALL, 10);
    for (int i = 0; i < 3; i++) {
        char lab[64];
        snprintf(lab, sizeof lab, "run=\"sink\",layer=\"4\",head=\"%d\"", i);
        double v = value_of(txt, "attnstat_head_sink_mass_ratio", lab);
        ck_assert_msg(fabs(v - want[i].sink_mass) <= 1e-9 * want[i].sink_mass, "head %d: %.12g, "
                      "pooled %.12g", i, v, want[i].sink_mass);
    }
    static const char *const none[] = {
        "attnstat_head_entropy_nats", "attnstat_head_entropy_normalized_ratio",
        "attnstat_head_collapsed_ratio", "attnstat_head_max_logit",
        "attnstat_head_distance_positions", "attnstat_layer_min_entropy_normalized_ratio",
        "attnstat_layer_mean_entropy_normalized_ratio", "attnstat_layer_max_logit"};
    for (size_t i = 0; i < sizeof none / sizeof none[0]; i++)
        ck_assert_msg(count_of(txt, none[i]) == 0, "%s shown for absent values:\n%s", none[i], txt);
    ck_assert_double_eq(value_of(txt, "attnstat_layer_heads", "run=\"sink\",layer=\"4\""), 3);
    ck_assert_int_eq(count_of(txt, "attnstat_head_step"), 3);
    free(txt);
    txt = render(t, HEADTAB_TOP, 10);
    ck_assert_int_eq(count_of(txt, "attnstat_head_sink_mass_ratio"), 0);
    free(txt);
    headtab_alert(t, "sink", 4, 1, 5, 1, 1002); /* SINK_MASS_CEILING raised on head 1 */
    txt = render(t, HEADTAB_TOP, 10);
    ck_assert_int_eq(count_of(txt, "attnstat_head_sink_mass_ratio"), 1);
    ck_assert(!isnan(value_of(txt, "attnstat_head_sink_mass_ratio",
                              "run=\"sink\",layer=\"4\",head=\"1\"")));
    ck_assert_int_eq(count_of(txt, "attnstat_head_max_logit"), 0);
    free(txt);
    headtab_free(t);
}
END_TEST

START_TEST(test_modes)
{
    headtab *t = headtab_new(100000);
    /* job a: 4 layers x 16 heads, distinct values; job b: 1 layer x 2 heads */
    int lowest[2] = {-1, -1}, highest[2] = {-1, -1};
    double norm[64], logit[64];
    for (int k = 0; k < 64; k++) {
        norm[k] = 0.2 + 0.7 * unit() + k * 1e-6;
        logit[k] = 50 * unit() + k * 1e-6;
    }
    for (int l = 0; l < 4; l++) {
        stats_head h[16];
        for (int i = 0; i < 16; i++)
            h[i] = head(norm[l * 16 + i], logit[l * 16 + i]);
        headtab_observe(t, "a", 1, l, 0, h, 16, 3, 1000);
    }
    for (int pick = 0; pick < 2; pick++)
        for (int k = 0; k < 64; k++) {
            int used = k == lowest[0] || k == lowest[1];
            if (!used && (lowest[pick] < 0 || norm[k] < norm[lowest[pick]]))
                lowest[pick] = k;
        }
    for (int pick = 0; pick < 2; pick++)
        for (int k = 0; k < 64; k++) {
            int used = k == highest[0] || k == highest[1];
            if (!used && (highest[pick] < 0 || logit[k] > logit[highest[pick]]))
                highest[pick] = k;
        }
    stats_head hb[2] = {head(0.5, 1), head(0.6, 2)};
    headtab_observe(t, "b", 2, 0, 0, hb, 2, 3, 1000);
    headtab_alert(t, "a", 3, 15, 1, 1, 1000); /* an alerted head is always named */
    char *txt = render(t, HEADTAB_TOP, 2);
    char want[64][64];
    int nw = 0;
    int named[] = {lowest[0], lowest[1], highest[0], highest[1], 3 * 16 + 15};
    for (int i = 0; i < 5; i++) {
        snprintf(want[nw], sizeof want[nw], "run=\"a\",layer=\"%d\",head=\"%d\"", named[i] / 16,
                 named[i] % 16);
        ck_assert_msg(!isnan(value_of(txt, "attnstat_head_entropy_normalized_ratio", want[nw])),
                      "head %s not named", want[nw]);
        nw++;
    }
    int distinct = 0;
    for (int i = 0; i < 5; i++) {
        int dup = 0;
        for (int j = 0; j < i; j++)
            dup |= named[i] == named[j];
        distinct += !dup;
    }
    /* exactly those of job a, and both heads of job b (its top 2 of each ranking) */
    ck_assert_int_eq(count_of(txt, "attnstat_head_entropy_normalized_ratio"), distinct + 2);
    ck_assert_int_eq(count_of(txt, "attnstat_layer_min_entropy_normalized_ratio"), 5);
    free(txt);
    txt = render(t, HEADTAB_ALL, 2);
    ck_assert_int_eq(count_of(txt, "attnstat_head_entropy_normalized_ratio"), 66);
    ck_assert_int_eq(count_of(txt, "attnstat_head_step"), 66);
    free(txt);
    txt = render(t, HEADTAB_LAYERS, 2);
    ck_assert_int_eq(count_of(txt, "attnstat_head_entropy_normalized_ratio"), 0);
    ck_assert_int_eq(count_of(txt, "attnstat_layer_mean_entropy_normalized_ratio"), 5);
    ck_assert_int_eq(count_of(txt, "attnstat_head_alert"), 1);
    free(txt);
    txt = render(t, HEADTAB_OFF, 2);
    ck_assert_int_eq(count_of(txt, "attnstat_layer_heads"), 0);
    ck_assert_int_eq(count_of(txt, "attnstat_head_alert"), 0);
    ck_assert_ptr_nonnull(strstr(txt, "\nattnstat_metrics_heads 66\n"));
    free(txt);
    headtab_free(t);
}
END_TEST

START_TEST(test_escaping_bound_expiry)
{
    headtab *t = headtab_new(5);
    stats_head h[4] = {head(0.5, 1), head(0.5, 2), head(0.5, 3), head(0.5, 4)};
    headtab_observe(t, "a\"b\\c", 1, 0, 0, h, 3, 1, 1000);
    headtab_observe(t, "other", 2, 0, 0, h, 4, 1, 5000); /* only 2 fit */
    ck_assert_uint_eq(headtab_count(t), 5);
    ck_assert_uint_eq(headtab_untracked(t), 2);
    char *txt = render(t, HEADTAB_ALL, 10);
    ck_assert_double_eq(value_of(txt, "attnstat_head_max_logit",
                                 "run=\"a\\\"b\\\\c\",layer=\"0\",head=\"2\""), 3);
    ck_assert_ptr_nonnull(strstr(txt, "\nattnstat_metrics_heads_untracked_total 2\n"));
    free(txt);
    /* the first job's heads are old at 4000: gone; the second job's stay and grow again */
    headtab_expire(t, 4500, 3000);
    ck_assert_uint_eq(headtab_count(t), 2);
    headtab_observe(t, "other", 2, 0, 0, h, 4, 2, 5000);
    headtab_observe(t, "third", 3, 9, 100, h, 1, 12345678901, 5000); /* every digit printed */
    ck_assert_uint_eq(headtab_count(t), 5);
    txt = render(t, HEADTAB_ALL, 10);
    ck_assert(isnan(value_of(txt, "attnstat_head_max_logit", "run=\"a\\\"b\\\\c\",layer=\"0\",head=\"0\"")));
    ck_assert_double_eq(value_of(txt, "attnstat_head_max_logit", "run=\"other\",layer=\"0\",head=\"3\""), 4);
    ck_assert_double_eq(value_of(txt, "attnstat_head_step", "run=\"third\",layer=\"9\",head=\"100\""),
                        12345678901.0);
    free(txt);
    headtab_expire(t, 1000000, 3000);
    ck_assert_uint_eq(headtab_count(t), 0);
    headtab_free(t);
}
END_TEST

/* Many keys: the index grows, every key is found again (the values are the keys'). */
START_TEST(test_many_keys)
{
    headtab *t = headtab_new(1 << 16);
    stats_head h[64];
    for (int i = 0; i < 64; i++)
        h[i] = head(0.5, i);
    for (int l = 0; l < 300; l++)
        headtab_observe(t, l % 3 ? "x" : "y", 1 + l % 3, l, 64 * (l % 5), h, 64, 1, 1000);
    ck_assert_uint_eq(headtab_count(t), 300 * 64);
    for (int l = 0; l < 300; l += 37)
        headtab_observe(t, l % 3 ? "x" : "y", 1 + l % 3, l, 64 * (l % 5), h, 64, 2, 1000);
    ck_assert_uint_eq(headtab_count(t), 300 * 64);
    char *txt = render(t, HEADTAB_ALL, 10);
    ck_assert_int_eq(count_of(txt, "attnstat_head_step"), 300 * 64);
    ck_assert_double_eq(value_of(txt, "attnstat_head_step", "run=\"x\",layer=\"37\",head=\"191\""), 2);
    ck_assert_double_eq(value_of(txt, "attnstat_head_max_logit", "run=\"x\",layer=\"37\",head=\"191\""), 63);
    free(txt);
    headtab_free(t);
}
END_TEST

/* The processes live for sweep(): run ids, and names that have some live process. */
typedef struct {
    int64_t ids[16];
    int nids;
    const char *names[4];
    int nnames;
    int asked_any;           /* questions about a whole run name (run_id 0) */
} live_set;

static int is_live(void *ctx, const char *run, int64_t run_id)
{
    live_set *l = ctx;
    if (run_id == 0) {
        l->asked_any++;
        for (int i = 0; i < l->nnames; i++)
            if (strcmp(l->names[i], run) == 0)
                return 1;
        return 0;
    }
    for (int i = 0; i < l->nids; i++)
        if (l->ids[i] == run_id)
            return 1;
    return 0;
}

/* A run that ends leaves the page at the next sweep: each head goes when none of the processes
 * that fed its latest step is live, its alerts and its layer's aggregates with it; the clears that
 * follow the end make nothing again; heads of a live replica, and other jobs, stay. */
START_TEST(test_sweep_ended)
{
    headtab *t = headtab_new(1000);
    int64_t base = 100 + (int64_t)(dh_next(&R) % 1000); /* run ids as a daemon hands them out */
    int64_t rep1 = base, rep2 = base + 1, tp = base + 2, other = base + 3;
    stats_head a = head(0.2 + 0.6 * unit(), 10 + unit()), b = head(0.2 + 0.6 * unit(), 20);
    stats_head c = head(0.2 + 0.6 * unit(), 30 + unit()), d = head(0.5 * unit(), 40);
    headtab_observe(t, "job", rep1, 0, 0, &a, 1, 5, 1000); /* two replicas pool head 0 */
    headtab_observe(t, "job", rep2, 0, 0, &b, 1, 5, 1000);
    headtab_observe(t, "job", tp, 0, 4, &c, 1, 5, 1000);   /* another rank's head 4 */
    headtab_observe(t, "other", other, 3, 1, &d, 1, 9, 1000);
    headtab_alert(t, "job", 0, 4, 1, 1, 1000);
    ck_assert_uint_eq(headtab_count(t), 3);

    live_set l = {{rep2, tp, other}, 3, {"job", "other"}, 2, 0};
    ck_assert_uint_eq(headtab_sweep(t, is_live, &l), 0); /* one replica is enough */
    ck_assert_uint_eq(headtab_count(t), 3);

    l = (live_set){{rep2, other}, 2, {"job", "other"}, 2, 0}; /* the rank holding head 4 ended */
    ck_assert_uint_eq(headtab_sweep(t, is_live, &l), 1);
    headtab_alert(t, "job", 0, 4, 1, 0, 2000); /* its alert resolved by the run's end: no entry */
    ck_assert_uint_eq(headtab_count(t), 2);
    char *txt = render(t, HEADTAB_ALL, 10);
    const char *h4 = "run=\"job\",layer=\"0\",head=\"4\"";
    ck_assert(isnan(value_of(txt, "attnstat_head_max_logit", h4)));
    ck_assert_int_eq(count_of(txt, "attnstat_head_alert"), 0);
    ck_assert_double_eq(value_of(txt, "attnstat_layer_heads", "run=\"job\",layer=\"0\""), 1);
    ck_assert_double_eq(value_of(txt, "attnstat_layer_max_logit", "run=\"job\",layer=\"0\""), 20);
    free(txt);

    l = (live_set){{other}, 1, {"other"}, 1, 0}; /* the whole job ended */
    ck_assert_uint_eq(headtab_sweep(t, is_live, &l), 1);
    txt = render(t, HEADTAB_ALL, 10);
    ck_assert_ptr_null(strstr(txt, "run=\"job\""));
    ck_assert_double_eq(value_of(txt, "attnstat_head_max_logit",
                                 "run=\"other\",layer=\"3\",head=\"1\""), 40);
    free(txt);
    ck_assert_int_eq(l.asked_any, 0); /* every entry knew its processes */

    /* A new job takes the ended one's name: it is a new entry, not the old one's */
    stats_head e = head(0.9, 3);
    headtab_observe(t, "job", base + 9, 0, 4, &e, 1, 0, 3000);
    txt = render(t, HEADTAB_ALL, 10);
    ck_assert_double_eq(value_of(txt, "attnstat_head_step", h4), 0);
    ck_assert_int_eq(count_of(txt, "attnstat_head_alert"), 0);
    free(txt);
    headtab_free(t);
}
END_TEST

/* Entries whose processes are not all remembered (more than 8 pooled at one step) and entries made
 * by an alert alone are judged by their run name: they stay while any process of it is live. */
START_TEST(test_sweep_by_name)
{
    headtab *t = headtab_new(1000);
    int64_t base = 1 + (int64_t)(dh_next(&R) % 1000);
    for (int p = 0; p < 9; p++) {
        stats_head h = head(0.3 + 0.5 * unit(), 5 + p);
        headtab_observe(t, "wide", base + p, 2, 7, &h, 1, 11, 1000);
    }
    headtab_alert(t, "restored", 1, 1, 3, 1, 1000); /* raised before a restart: no sample yet */
    headtab_alert(t, "cleared", 0, 0, 2, 0, 1000);  /* a clear alone makes nothing */
    ck_assert_uint_eq(headtab_count(t), 2);
    live_set l = {{base + 8}, 1, {"wide", "restored"}, 2, 0};
    ck_assert_uint_eq(headtab_sweep(t, is_live, &l), 0);
    ck_assert_int_eq(l.asked_any, 2);
    char *txt = render(t, HEADTAB_LAYERS, 10);
    ck_assert_double_eq(value_of(txt, "attnstat_head_alert", "run=\"restored\",layer=\"1\","
                                 "head=\"1\",rule=\"logit_ceiling\""), 1);
    ck_assert_double_eq(value_of(txt, "attnstat_layer_heads", "run=\"wide\",layer=\"2\""), 1);
    free(txt);
    l = (live_set){{base + 8}, 1, {"wide"}, 1, 0};
    ck_assert_uint_eq(headtab_sweep(t, is_live, &l), 1);
    headtab_alert(t, "restored", 1, 1, 3, 1, 2000); /* raised again: back */
    headtab_alert(t, "restored", 1, 1, 3, 0, 2000); /* cleared: nothing to show, swept */
    l = (live_set){{0}, 0, {"restored"}, 1, 0};
    ck_assert_uint_eq(headtab_sweep(t, is_live, &l), 2);
    ck_assert_uint_eq(headtab_count(t), 0);
    txt = render(t, HEADTAB_ALL, 10);
    ck_assert_ptr_nonnull(strstr(txt, "\nattnstat_metrics_heads 0\n"));
    free(txt);
    headtab_free(t);
}
END_TEST

/* Pushes keys [0, n) of run as layers of 64 heads (layer k / 64, head k % 64), at step. */
static void push_keys(headtab *t, const char *run, int64_t run_id, uint32_t n, int64_t step,
                      int64_t now)
{
    stats_head h[64];
    for (int i = 0; i < 64; i++)
        h[i] = head(0.2 + 0.6 * unit(), 10 * unit());
    for (uint32_t k = 0; k < n; k += 64)
        headtab_observe(t, run, run_id, (int32_t)(k / 64), 0, h,
                        (int32_t)(n - k < 64 ? n - k : 64), step, now);
}

/* One run cannot take every key: a run that floods the table keeps it while alone, and gives back
 * its least useful keys (never one with an alert raised) when another run comes, down to an even
 * share; the newcomer's heads are all on the page; what does not fit is counted per run
 * (attnstat_metrics_run_heads_left_out) and taken back in when room comes (a run that ended). */
START_TEST(test_fair_share)
{
    uint32_t max = 64 * (uint32_t)(8 + dh_next(&R) % 24), extra = 64 * (1 + dh_next(&R) % 8);
    headtab *t = headtab_new(max);
    live_set live = {.ids = {1, 2, 3}, .nids = 3, .names = {"flood", "quiet", "late"},
                     .nnames = 3};
    push_keys(t, "flood", 1, max + extra, 1, 1000);
    headtab_alert(t, "flood", 0, 5, 3, 1, 900); /* its oldest key, with an alert raised */
    ck_assert_uint_eq(headtab_count(t), max);
    char *txt = render(t, HEADTAB_ALL, 10);
    ck_assert_double_eq(value_of(txt, "attnstat_metrics_run_heads", "run=\"flood\""), max);
    ck_assert_double_eq(value_of(txt, "attnstat_metrics_run_heads_left_out", "run=\"flood\""),
                        extra);
    ck_assert_ptr_nonnull(strstr(txt, "\nattnstat_metrics_heads_share "));
    free(txt);
    /* another run: all of its few heads are shown, the flood keeps half */
    uint32_t q = 1 + (uint32_t)(dh_next(&R) % 60);
    push_keys(t, "quiet", 2, q, 1, 2000);
    txt = render(t, HEADTAB_ALL, 10);
    ck_assert_double_eq(value_of(txt, "attnstat_metrics_run_heads", "run=\"quiet\""), q);
    ck_assert_double_eq(value_of(txt, "attnstat_metrics_run_heads_left_out", "run=\"quiet\""), 0);
    ck_assert_double_eq(value_of(txt, "attnstat_metrics_run_heads", "run=\"flood\""), max / 2);
    ck_assert_double_eq(value_of(txt, "attnstat_metrics_run_heads_left_out", "run=\"flood\""),
                        max + extra - max / 2);
    char share[64];
    snprintf(share, sizeof share, "\nattnstat_metrics_heads_share %u\n", max / 2);
    ck_assert_ptr_nonnull(strstr(txt, share));
    ck_assert_int_eq(count_of(txt, "attnstat_head_step"), (int)(max / 2 + q));
    ck_assert_double_eq(value_of(txt, "attnstat_head_alert",
                                 "run=\"flood\",layer=\"0\",head=\"5\",rule=\"logit_ceiling\""), 1);
    free(txt);
    /* the flood's next step: what it keeps is updated, what was left out stays out */
    push_keys(t, "flood", 1, max + extra, 2, 3000);
    ck_assert_uint_eq(headtab_count(t), max / 2 + q);
    /* a third run floods too: it grows to a third, the flood keeps what it holds while there is
     * room (nothing is taken back before it is needed) */
    push_keys(t, "late", 3, max, 1, 4000);
    txt = render(t, HEADTAB_ALL, 10);
    ck_assert_double_eq(value_of(txt, "attnstat_metrics_run_heads", "run=\"flood\""), max / 2);
    ck_assert_double_eq(value_of(txt, "attnstat_metrics_run_heads", "run=\"late\""), max / 3);
    ck_assert_double_eq(value_of(txt, "attnstat_metrics_run_heads", "run=\"quiet\""), q);
    ck_assert_double_eq(value_of(txt, "attnstat_metrics_run_heads_left_out", "run=\"late\""),
                        max - max / 3);
    ck_assert_double_eq(value_of(txt, "attnstat_metrics_run_heads_left_out", "run=\"flood\""),
                        max + extra - max / 2);
    free(txt);
    /* the flood ends: its keys, kept and left out, go; the late run takes the room back */
    live.ids[0] = 99;
    live.names[0] = "nobody";
    headtab_sweep(t, is_live, &live);
    push_keys(t, "late", 3, max, 2, 5000);
    txt = render(t, HEADTAB_ALL, 10);
    ck_assert(isnan(value_of(txt, "attnstat_metrics_run_heads", "run=\"flood\"")));
    ck_assert_double_eq(value_of(txt, "attnstat_metrics_run_heads", "run=\"late\""), max / 2);
    ck_assert_double_eq(value_of(txt, "attnstat_metrics_run_heads_left_out", "run=\"late\""),
                        max - max / 2);
    ck_assert_double_eq(value_of(txt, "attnstat_metrics_run_heads", "run=\"quiet\""), q);
    free(txt);
    headtab_free(t);
}
END_TEST

int main(void)
{
    R = dh_rng_new("test_headtab");
    Suite *s = suite_create("headtab");
    TCase *tc = tcase_create("headtab");
    tcase_add_test(tc, test_pool_replace_repush);
    tcase_add_test(tc, test_tensor_parallel_side_by_side);
    tcase_add_test(tc, test_alerts);
    tcase_add_test(tc, test_families);
    tcase_add_test(tc, test_statistics_not_asked);
    tcase_add_test(tc, test_modes);
    tcase_add_test(tc, test_escaping_bound_expiry);
    tcase_add_test(tc, test_many_keys);
    tcase_add_test(tc, test_sweep_ended);
    tcase_add_test(tc, test_sweep_by_name);
    tcase_add_test(tc, test_fair_share);
    suite_add_tcase(s, tc);
    return dh_run(s);
}
