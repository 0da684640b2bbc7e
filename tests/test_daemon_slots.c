/* test_daemon_slots.c — connection slots and subscribers, which one peer could take from everyone
 * else (issue 23), with a real attnstatd: each test is a defect once seen, and fails on the code
 * that had it.
 *  - R3: the last slots are kept for root, the daemon's uid and status commands, a uid whose share
 *    is full still gets status, and a connection that said Hello and then nothing loses its slot;
 *  - R4: a subscriber sees its own uid's runs only (root all), holds at most sub_queue_bytes
 *    unsent (the rest dropped and counted), and is closed once it reads nothing for
 *    write_timeout_ms.
 * The tests that act as other uids need root (skipped, saying so, without it). Waits are for
 * conditions, with generous deadlines: nothing here depends on a timing margin. */
#include "share_testutil.h"

/* ---- R3: slots kept back, and deadlines ---------------------------------------------------- */

/* A uid whose trainers held its whole share could not even ask for status, and uids holding every
 * slot locked root out. Now a uid gets status_clients_per_uid connections past its share (status
 * and commands only: a Hello there is refused, naming max_clients_per_uid), and the last
 * reserved_clients slots are root's and the daemon's, other uids taking at most half of them for
 * status only (their Hello refused, naming reserved_clients; past that share, refused at once);
 * root still gets status and a Hello in. Needs root (other uids). */
START_TEST(test_slots_reserved_for_status_and_root)
{
    char group[64];
    if (!sh_other_uids_possible(group, sizeof group, "slots_reserved"))
        return;
    dh_rng rng = dh_rng_new("slots_reserved");
    uid_t ua = 40000 + (uid_t)(dh_next(&rng) % 1000), ub = ua + 1000, uc = ua + 2000;
    dh_daemon d;
    dh_dir_init(&d);
    ck_assert_int_eq(chmod(d.dir, 0755), 0);
    /* 13 slots: root's watcher + 4 of A + 4 of B fill the 9 general ones; 4 kept back. */
    dh_start(&d, "--allow-group", group, "--max-clients", "13", "--reserved-clients", "4",
             "--max-clients-per-uid", "4", "--status-clients-per-uid", "1", (const char *)NULL);
    dh_conn w, a[5], b[4], cc[3], r;
    dh_connect(&w, &d);
    sh_wait_clients(&w, 1);
    char msg[512], run[64];
    sh_connect_as(&d, ua, 4, a);
    for (int i = 0; i < 4; i++) {
        snprintf(run, sizeof run, "a-%d", i);
        ck_assert_int_eq(sh_hello_with(&a[i], run, 0, NULL, msg, sizeof msg), 0);
    }
    /* A's share is full: its fifth connection still asks for status, but may not say Hello. */
    sh_connect_as(&d, ua, 1, &a[4]);
    attnstat__envelope__free_unpacked(dh_status(&a[4]), NULL);
    int code = sh_hello_with(&a[4], "a-4", 0, NULL, msg, sizeof msg);
    ck_assert_msg(code == ATTNSTAT__CODE__BUSY && strstr(msg, "max_clients_per_uid 4"),
                  "a Hello past the uid's share got %d (%s)", code, msg);
    ck_assert(dh_wait_closed(&a[4], 30000));
    dh_close(&a[4]);
    sh_wait_clients(&w, 5);
    sh_connect_as(&d, ub, 4, b);
    for (int i = 0; i < 4; i++) {
        snprintf(run, sizeof run, "b-%d", i);
        ck_assert_int_eq(sh_hello_with(&b[i], run, 0, NULL, msg, sizeof msg), 0);
    }
    /* Every general slot taken: C gets two of the four kept back (half), for status only. */
    sh_connect_as(&d, uc, 3, cc);
    code = sh_next_error(&cc[2], msg, sizeof msg, 30000);
    ck_assert_msg(code == ATTNSTAT__CODE__BUSY && strstr(msg, "reserved_clients"),
                  "a connection past the other uids' share of the reserve got %d (%s)", code, msg);
    dh_close(&cc[2]);
    attnstat__envelope__free_unpacked(dh_status(&cc[0]), NULL);
    code = sh_hello_with(&cc[1], "c-1", 0, NULL, msg, sizeof msg);
    ck_assert_msg(code == ATTNSTAT__CODE__BUSY && strstr(msg, "reserved_clients 4"),
                  "a Hello in a reserved slot got %d (%s)", code, msg);
    dh_close(&cc[1]);
    /* Root gets in: its status, and its Hello. */
    dh_connect(&r, &d);
    attnstat__envelope__free_unpacked(dh_status(&r), NULL);
    ck_assert_int_eq(sh_hello_with(&r, "root-run", 0, NULL, msg, sizeof msg), 0);
    dh_close(&r);
    dh_close(&cc[0]);
    for (int i = 0; i < 4; i++) {
        dh_close(&a[i]);
        dh_close(&b[i]);
    }
    dh_close(&w);
    int rc = dh_stop(&d);
    dh_cleanup(&d, rc != 0);
    ck_assert_int_eq(rc, 0);
}
END_TEST

/* A connection that said Hello and then nothing held its slot for ever. Now it is answered
 * Error(BUSY) naming idle_timeout_ms and closed; a subscriber, silent longer still, is judged by
 * what it reads and stays. */
START_TEST(test_idle_hello_loses_its_slot)
{
    dh_rng rng = dh_rng_new("idle_hello");
    dh_daemon d;
    dh_dir_init(&d);
    char ms[16];
    snprintf(ms, sizeof ms, "%llu", 200 + (unsigned long long)(dh_next(&rng) % 300));
    dh_start(&d, "--idle-timeout-ms", ms, (const char *)NULL);
    dh_conn s, t;
    dh_connect(&s, &d);
    dh_subscribe(&s, 1, 1);
    attnstat__envelope__free_unpacked(dh_status(&s), NULL);
    dh_connect(&t, &d);
    dh_hello(&t, "idle", 0, NULL);
    char msg[512];
    int code = sh_next_error(&t, msg, sizeof msg, 30000);
    ck_assert_msg(code == ATTNSTAT__CODE__BUSY && strstr(msg, "idle_timeout_ms"),
                  "an idle connection got %d (%s)", code, msg);
    ck_assert(dh_wait_closed(&t, 30000));
    dh_close(&t);
    attnstat__envelope__free_unpacked(dh_status(&s), NULL); /* the subscriber is still served */
    dh_close(&s);
    int rc = dh_stop(&d);
    dh_cleanup(&d, rc != 0);
    ck_assert_int_eq(rc, 0);
}
END_TEST

/* ---- R4: subscribers see their own runs, and what they do not read is bounded --------------- */

/* Any admitted uid read every run's results and alerts live. Now a subscriber of another uid than
 * root or the daemon's sees the runs its uid owns only; root sees them all. Needs root. */
START_TEST(test_subscriber_sees_its_own_runs)
{
    char group[64];
    if (!sh_other_uids_possible(group, sizeof group, "own_runs"))
        return;
    dh_rng rng = dh_rng_new("own_runs");
    uid_t ua = 40000 + (uid_t)(dh_next(&rng) % 1000);
    dh_daemon d;
    dh_dir_init(&d);
    ck_assert_int_eq(chmod(d.dir, 0755), 0);
    dh_start(&d, "--allow-group", group, (const char *)NULL);
    dh_conn sa, sr, ta, tr;
    sh_connect_as(&d, ua, 1, &sa);
    sh_connect_as(&d, ua, 1, &ta);
    dh_connect(&sr, &d);
    dh_connect(&tr, &d);
    dh_subscribe(&sa, 1, 1);
    dh_subscribe(&sr, 1, 1);
    attnstat__envelope__free_unpacked(dh_status(&sa), NULL); /* subscribed by now */
    attnstat__envelope__free_unpacked(dh_status(&sr), NULL);
    const char *runs[] = {"a-run", "root-run"};
    char msg[512];
    ck_assert_int_eq(sh_hello_with(&ta, runs[0], 0, NULL, msg, sizeof msg), 0);
    ck_assert_int_eq(sh_hello_with(&tr, runs[1], 0, NULL, msg, sizeof msg), 0);
    int k = 3 + (int)(dh_next(&rng) % 5);
    Attnstat__HeadStats hs[8], *ptrs[8];
    for (int i = 0; i < k; i++) {
        Attnstat__Computed m;
        sh_fill_computed(&m, hs, ptrs, 8, (uint64_t)i + 1, i, &rng, 0);
        sh_send_computed(&ta, &m);
        sh_fill_computed(&m, hs, ptrs, 8, (uint64_t)i + 1, i, &rng, i == k - 1);
        sh_send_computed(&tr, &m); /* its last one: non-finite rows, an alert of root's run */
    }
    for (int i = 0; i < k; i++) {
        ck_assert_int_eq(sh_computed_ack(&ta, (uint64_t)i + 1), 0);
        ck_assert_int_eq(sh_computed_ack(&tr, (uint64_t)i + 1), 0);
    }
    /* Root's subscriber gets the alert (its copy and A's are sent together, if A's were). */
    sh_sub_seen root_seen, a_seen;
    memset(&root_seen, 0, sizeof root_seen);
    memset(&a_seen, 0, sizeof a_seen);
    while (root_seen.alerts[1] == 0) {
        Attnstat__Envelope *e = dh_recv(&sr, 30000);
        ck_assert_msg(e != NULL, "root's subscriber got no alert of its run");
        sh_count_message(e, runs, 2, &root_seen);
        attnstat__envelope__free_unpacked(e, NULL);
    }
    sh_drain_subscriber(&sa, runs, 2, &a_seen);
    ck_assert_msg(a_seen.results[0] == k && a_seen.results[1] == 0 && a_seen.alerts[1] == 0,
                  "uid %u's subscriber saw %d results of its run (of %d), %d results and %d alerts "
                  "of root's", (unsigned)ua, a_seen.results[0], k, a_seen.results[1],
                  a_seen.alerts[1]);
    sh_drain_subscriber(&sr, runs, 2, &root_seen);
    ck_assert_msg(root_seen.results[0] == k && root_seen.results[1] == k,
                  "root's subscriber saw %d and %d results, not %d of each", root_seen.results[0],
                  root_seen.results[1], k);
    dh_close(&sa);
    dh_close(&sr);
    dh_close(&ta);
    dh_close(&tr);
    int rc = dh_stop(&d);
    dh_cleanup(&d, rc != 0);
    ck_assert_int_eq(rc, 0);
}
END_TEST

/* Subscribers that never read made the daemon buffer 4 MiB each (64 of them: +380 MB). Now what
 * one holds unsent is bounded by sub_queue_bytes (256 KiB): the bytes it finds once it reads are at
 * most that and what the kernel's socket buffer held, whatever was sent meanwhile, and every
 * Result it did not get is counted (messages_dropped on /metrics); the trainer is not slowed. */
START_TEST(test_subscriber_output_bounded)
{
    dh_rng rng = dh_rng_new("sub_bounded");
    int port = sh_free_port();
    char portarg[16];
    snprintf(portarg, sizeof portarg, "%d", port);
    dh_daemon d;
    dh_dir_init(&d);
    dh_start(&d, "--metrics-port", portarg, (const char *)NULL);
    dh_conn s, t;
    dh_connect(&s, &d);
    dh_subscribe(&s, 0, 1);
    attnstat__envelope__free_unpacked(dh_status(&s), NULL);
    dh_connect(&t, &d);
    const char *runs[] = {"flood"};
    dh_hello(&t, runs[0], 0, NULL);
    /* About 8 MB of Results to a subscriber that reads none of them. */
    enum { HEADS = 64, N = 1200, WINDOW = 256 };
    static Attnstat__HeadStats hs[HEADS];
    static Attnstat__HeadStats *ptrs[HEADS];
    for (int i = 0; i < N; i++) {
        Attnstat__Computed m;
        sh_fill_computed(&m, hs, ptrs, HEADS, (uint64_t)i + 1, i, &rng, 0);
        sh_send_computed(&t, &m);
        if (i >= WINDOW)
            ck_assert_int_eq(sh_computed_ack(&t, (uint64_t)(i - WINDOW) + 1), 0);
    }
    for (int i = N - WINDOW; i < N; i++)
        ck_assert_int_eq(sh_computed_ack(&t, (uint64_t)i + 1), 0);
    sh_sub_seen seen;
    memset(&seen, 0, sizeof seen);
    sh_drain_subscriber(&s, runs, 1, &seen);
    long wmem = 212992;
    FILE *f = fopen("/proc/sys/net/core/wmem_default", "r");
    if (f) {
        if (fscanf(f, "%ld", &wmem) != 1)
            wmem = 212992;
        fclose(f);
    }
    uint64_t bound = 262144 + 2 * (uint64_t)wmem + 65536;
    ck_assert_msg(seen.bytes <= bound, "the subscriber found %llu bytes waiting, over the %llu "
                  "that sub_queue_bytes and the socket buffer allow (%d of %d results)",
                  (unsigned long long)seen.bytes, (unsigned long long)bound, seen.results[0], N);
    ck_assert_msg(seen.results[0] > 0 && seen.results[0] < N, "%d of %d results came",
                  seen.results[0], N);
    uint64_t dropped = sh_scrape_counter(port, "attnstat_messages_dropped_total");
    ck_assert_msg(dropped == (uint64_t)(N - seen.results[0]), "%llu drops counted, %d results "
                  "missing", (unsigned long long)dropped, N - seen.results[0]);
    dh_close(&s);
    dh_close(&t);
    int rc = dh_stop(&d);
    dh_cleanup(&d, rc != 0);
    ck_assert_int_eq(rc, 0);
}
END_TEST

/* A subscriber that stopped reading held its slot and its queue for ever. Now, once it has read
 * none of what waits for it for write_timeout_ms, it is closed (logged with the reason). */
START_TEST(test_stalled_subscriber_closed)
{
    dh_rng rng = dh_rng_new("stalled_sub");
    dh_daemon d;
    dh_dir_init(&d);
    dh_start(&d, "--write-timeout-ms", "300", (const char *)NULL);
    dh_conn s, t, w;
    dh_connect(&s, &d);
    dh_subscribe(&s, 0, 1);
    attnstat__envelope__free_unpacked(dh_status(&s), NULL);
    dh_connect(&w, &d);
    dh_connect(&t, &d);
    dh_hello(&t, "stall", 0, NULL);
    sh_wait_clients(&w, 3);
    enum { HEADS = 64 };
    static Attnstat__HeadStats hs[HEADS];
    static Attnstat__HeadStats *ptrs[HEADS];
    /* Results until the daemon has closed the subscriber (each push fills its socket more). */
    int closed = 0;
    int64_t deadline = dh_now_ms() + 60000;
    for (uint64_t seq = 1; !closed; seq++) {
        ck_assert_msg(dh_now_ms() < deadline, "a subscriber that reads nothing was not closed");
        Attnstat__Computed m;
        sh_fill_computed(&m, hs, ptrs, HEADS, seq, (int64_t)seq, &rng, 0);
        sh_send_computed(&t, &m);
        ck_assert_int_eq(sh_computed_ack(&t, seq), 0);
        if (seq % 64 == 0) {
            Attnstat__Envelope *r = dh_status(&w);
            closed = r->status_reply->clients == 2;
            attnstat__envelope__free_unpacked(r, NULL);
        }
    }
    ck_assert(sh_file_has(d.log, "(write_timeout_ms 300)", 10000));
    dh_close(&s);
    dh_close(&t);
    dh_close(&w);
    int rc = dh_stop(&d);
    dh_cleanup(&d, rc != 0);
    ck_assert_int_eq(rc, 0);
}
END_TEST

/* ---- the suite ------------------------------------------------------------------------------ */

static Suite *slots_suite(void)
{
    Suite *s = suite_create("daemon_slots");
    TCase *slots = tcase_create("slots");
    tcase_set_timeout(slots, 300);
    tcase_add_test(slots, test_slots_reserved_for_status_and_root);
    tcase_add_test(slots, test_idle_hello_loses_its_slot);
    suite_add_tcase(s, slots);
    TCase *subs = tcase_create("subscribers");
    tcase_set_timeout(subs, 300);
    tcase_add_test(subs, test_subscriber_sees_its_own_runs);
    tcase_add_test(subs, test_subscriber_output_bounded);
    tcase_add_test(subs, test_stalled_subscriber_closed);
    suite_add_tcase(s, subs);
    return s;
}

int main(void)
{
    return dh_run(slots_suite());
}
