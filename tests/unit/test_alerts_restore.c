/* test_alerts_restore.c — unit test of daemon/alerts_feed.c's start-up restore of the runs'
 * thresholds, no daemon: a database written by hand (schema/'s writer) holds a live run whose
 * thresholds were stored before sink_mass_ceiling and distance_floor existed (the 7 keys and
 * collapse_threshold, byte for byte as older daemons wrote them) and one stored with them; an
 * alert feed made over it with settings that differ from every default gives the older run the
 * daemon's sink_mass_ceiling and distance_floor and its own stored values for the rest, and the
 * newer run its own for all. Values from a printed seed (ATTNSTAT_TEST_SEED replays it). */
#include "daemon_harness.h" /* seeds, the runner, and the usual system headers */
#include "alerts_feed.h"
#include "config.h"
#include "counters.h"
#include "store.h"
#include "store_write.h"

static dh_rng R;

static double unit(void)
{
    return (double)(dh_next(&R) >> 11) / 9007199254740992.0;
}

static void sink(void *data, const feed_alert *a)
{
    (void)data;
    (void)a;
}

START_TEST(test_older_row_takes_the_daemons_new_thresholds)
{
    dh_daemon d;
    dh_dir_init(&d);
    store_error se;
    store *db = store_open(d.db, 5000, &se);
    ck_assert_msg(db != NULL, "store_open %s: %s", d.db, se.msg);
    /* the older run: its row as a daemon before the new thresholds wrote it */
    double floor = 0.05 + 0.2 * unit(), logit = 20 + 200 * unit();
    unsigned raise = 1 + (unsigned)(dh_next(&R) % 7);
    char older[512];
    snprintf(older, sizeof older,
             "{\"entropy_floor\":%.17g,\"entropy_drop\":0.5,\"ema_alpha\":0.050000000000000003,"
             "\"ema_warmup\":20,\"logit_ceiling\":%.17g,\"raise_after\":%u,\"clear_after\":5,"
             "\"collapse_threshold\":0.10000000000000001}", floor, logit, raise);
    store_run_info ri = {.name = "older", .rank = 0, .thresholds = older};
    int64_t old_id = 0, new_id = 0;
    ck_assert_int_eq(store_run_begin(db, &ri, &old_id, &se), STORE_OK);
    /* the newer run: the new keys stored too */
    alerts_config mine;
    alerts_config_default(&mine);
    mine.sink_mass_ceiling = 0.3 + 0.3 * unit();
    mine.distance_floor = 0.5 + 2 * unit();
    char newer[512];
    ck_assert_int_lt(alerts_config_format(&mine, newer, sizeof newer), (int)sizeof newer);
    ri.name = "newer";
    ri.thresholds = newer;
    ck_assert_int_eq(store_run_begin(db, &ri, &new_id, &se), STORE_OK);

    /* the daemon's settings: new thresholds unlike the defaults and unlike the newer run's */
    cfg c;
    char err[512];
    ck_assert_int_eq(cfg_init(&c, err, sizeof err), 0);
    char v[64];
    double daemon_sink = 0.7 + 0.25 * unit(), daemon_dist = 3 + 10 * unit();
    snprintf(v, sizeof v, "%.17g", daemon_sink);
    ck_assert_msg(cfg_set(&c, "sink_mass_ceiling", v, err, sizeof err) == 0, "%s", err);
    snprintf(v, sizeof v, "%.17g", daemon_dist);
    ck_assert_msg(cfg_set(&c, "distance_floor", v, err, sizeof err) == 0, "%s", err);
    counters *cnt = counters_new();
    ck_assert_ptr_nonnull(cnt);
    alerts_feed *f = alerts_feed_new(&c, db, NULL, cnt, sink, NULL, err, sizeof err);
    ck_assert_msg(f != NULL, "alerts_feed_new: %s", err);

    alerts_config got;
    alerts_feed_run_config(f, old_id, &got);
    ck_assert_msg(got.sink_mass_ceiling == daemon_sink && got.distance_floor == daemon_dist,
                  "older run: sink_mass_ceiling %.17g distance_floor %.17g (daemon's %.17g %.17g)",
                  got.sink_mass_ceiling, got.distance_floor, daemon_sink, daemon_dist);
    ck_assert(got.entropy_floor == floor && got.logit_ceiling == logit && got.raise_after == raise);
    alerts_feed_run_config(f, new_id, &got);
    ck_assert(got.sink_mass_ceiling == mine.sink_mass_ceiling &&
              got.distance_floor == mine.distance_floor);
    ck_assert(got.logit_ceiling == mine.logit_ceiling);

    alerts_feed_free(f);
    counters_free(cnt);
    cfg_free(&c);
    store_close(db);
    dh_cleanup(&d, 0);
}
END_TEST

int main(void)
{
    R = dh_rng_new("test_alerts_restore");
    Suite *s = suite_create("alerts_restore");
    TCase *tc = tcase_create("restore");
    tcase_add_test(tc, test_older_row_takes_the_daemons_new_thresholds);
    suite_add_tcase(s, tc);
    return dh_run(s);
}
