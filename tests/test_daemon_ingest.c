/* test_daemon_ingest.c — end to end through a real attnstatd: host tensors in shared memory are
 * pushed, and the per-head rows the daemon stores (read back with sqlite3 right after each Ack,
 * so the Ack proves durability) equal stats_cpu() on the same data computed here (within
 * dh_close_to_reference: the daemon computes with stats_cpu_fast_ws; collapsed_frac, a count,
 * up to the rows whose normalized entropy sits at the threshold); results in the Ack equal them
 * too. Also: Status, SIGTERM with pushes in flight (every one acknowledged, exit status 0, socket
 * removed, database intact), the work bound of a worker's queue and the per-connection bound on
 * pushes in flight (client_inflight). */
#include <math.h>
#include <sched.h>
#include <signal.h>

#include "daemon_harness.h"

typedef struct {
    dh_daemon d;
    dh_conn c;
    dh_shm shm;
} fixture;

/* Q and K both the same random f32 tensor [1, h, n, d] at the start of a new shared-memory segment
 * (named after tag), registered as buffer id on f's connection. */
static void shared_qk(fixture *f, dh_rng *rng, uint32_t id, const char *tag, uint64_t h, uint64_t n,
                      uint64_t d, dh_tensor *q, dh_tensor *k)
{
    dh_tensor_contig(q, id, 0, ATTNSTAT__DTYPE__F32, 1, h, n, d);
    dh_tensor_contig(k, id, 0, ATTNSTAT__DTYPE__F32, 1, h, n, d);
    uint64_t size = dh_tensor_elems(q) * 4;
    dh_shm_create(&f->shm, tag, size);
    dh_fill(rng, f->shm.ptr, dh_tensor_elems(q), q->dtype, 1.0);
    dh_register(&f->c, id, f->shm.name, size);
}

/* Closes f's connection and segment, stops the daemon (its log shown if it failed) and checks it
 * exited with status 0. */
static void stop_clean(fixture *f)
{
    dh_close(&f->c);
    dh_shm_destroy(&f->shm);
    int code = dh_stop(&f->d);
    dh_cleanup(&f->d, code != 0);
    ck_assert_int_eq(code, 0);
}

/* Compares the stored row of (run, layer, head, step) with the reference. */
/* Rows of head h whose normalized entropy (entropy / log of the keys the row sees) is within 1e-5
 * of the collapse threshold: the float32 backend (~1e-6 nats from the reference) may count such a
 * row as collapsed where the double reference does not, or the other way, so collapsed_frac may
 * differ by that many rows. row_h: the reference's per-row entropies [B, H, lq]. */
static int64_t borderline_rows(const float *row_h, int b, int heads, int h, int lq, int lk,
                               int causal)
{
    int64_t n = 0;
    for (int bi = 0; bi < b; bi++)
        for (int i = 0; i < lq; i++) {
            float e = row_h[((int64_t)bi * heads + h) * lq + i];
            if (e == STATS_ROW_SKIPPED || !isfinite(e))
                continue;
            int vis = causal ? (i + lk - lq + 1 < lk ? i + lk - lq + 1 : lk) : lk;
            if (vis >= 2 && fabs(e / log((double)vis) - STATS_DEFAULT_COLLAPSE) <= 1e-5)
                n++;
        }
    return n;
}

static void check_row(sqlite3 *db, int64_t run, uint32_t layer, int head, int64_t step,
                      const stats_head *ref, int64_t borderline)
{
    char sql[512];
    snprintf(sql, sizeof sql,
             "SELECT rows, rows_norm, rows_empty, nonfinite_rows, entropy_mean, entropy_std, "
             "entropy_min, entropy_max, entropy_norm_mean, collapsed_frac, max_logit, sampled "
             "FROM samples WHERE run_id=%lld AND layer=%u AND head=%d AND step=%lld",
             (long long)run, layer, head, (long long)step);
    sqlite3_stmt *st = NULL;
    ck_assert_int_eq(sqlite3_prepare_v2(db, sql, -1, &st, NULL), SQLITE_OK);
    ck_assert_msg(sqlite3_step(st) == SQLITE_ROW,
                  "no stored row for layer %u head %d step %lld right after its Ack", layer, head,
                  (long long)step);
    ck_assert_int_eq(sqlite3_column_int64(st, 0), ref->rows);
    ck_assert_int_eq(sqlite3_column_int64(st, 1), ref->rows_norm);
    ck_assert_int_eq(sqlite3_column_int64(st, 2), ref->rows_empty);
    ck_assert_int_eq(sqlite3_column_int64(st, 3), ref->nonfinite_rows);
    const double want[7] = {ref->entropy_mean, ref->entropy_std, ref->entropy_min, ref->entropy_max,
                            ref->entropy_norm_mean, ref->collapsed_frac, ref->max_logit};
    for (int i = 0; i < 7; i++) {
        double got = sqlite3_column_type(st, 4 + i) == SQLITE_NULL ? NAN
                                                                    : sqlite3_column_double(st, 4 + i);
        /* collapsed_frac (i 5): a count, exact up to the borderline rows */
        int ok = dh_close_to_reference(got, want[i]) ||
                 (i == 5 && ref->rows_norm > 0 &&
                  fabs(got - want[i]) * (double)ref->rows_norm <= (double)borderline + 1e-9);
        ck_assert_msg(ok, "layer %u head %d step %lld column %d: stored %.17g, reference %.17g "
                      "(%lld rows at the collapse threshold)", layer, head, (long long)step, 4 + i,
                      got, want[i], (long long)borderline);
    }
    ck_assert_int_eq(sqlite3_column_int(st, 11), ref->sampled);
    ck_assert_int_eq(sqlite3_step(st), SQLITE_DONE);
    sqlite3_finalize(st);
}

START_TEST(test_push_stored_equals_reference)
{
    dh_rng rng = dh_rng_new("push_stored_equals_reference");
    fixture f;
    dh_dir_init(&f.d);
    dh_start(&f.d, (const char *)NULL);
    dh_connect(&f.c, &f.d);
    int64_t run_id;
    dh_hello(&f.c, "ingest", 0, &run_id);

    /* q [2, 4, 48, 32] bf16 and k [2, 2, 56, 32] (GQA 2:1, Nk > Nq, bottom-right causal). */
    dh_tensor q, k;
    dh_tensor_contig(&q, 1, 0, ATTNSTAT__DTYPE__BF16, 2, 4, 48, 32);
    uint64_t qbytes = dh_tensor_elems(&q) * 2;
    dh_tensor_contig(&k, 1, qbytes + 64, ATTNSTAT__DTYPE__BF16, 2, 2, 56, 32);
    uint64_t size = k.offset + dh_tensor_elems(&k) * 2;
    dh_shm_create(&f.shm, "ingest", size);
    dh_register(&f.c, 1, f.shm.name, size);

    sqlite3 *db = dh_db_open(&f.d);
    uint64_t seq = 0;
    for (int step = 0; step < 6; step++) {
        for (uint32_t layer = 0; layer < 3; layer++) {
            seq++;
            double qs = 0.5 + (double)(step * 3 + layer); /* sharper and sharper attention */
            dh_fill(&rng, f.shm.ptr, dh_tensor_elems(&q), q.dtype, qs);
            dh_fill(&rng, (char *)f.shm.ptr + k.offset, dh_tensor_elems(&k), k.dtype, 1.0);
            int causal = (step + (int)layer) % 2;
            uint32_t sample = step == 5 ? 16 : 0;
            dh_push(&f.c, seq, step * 10, layer, &q, &k, causal, sample, 1);

            /* The reference, computed here on the same bytes. */
            stats_problem p;
            dh_problem(&p, &q, f.shm.ptr, &k, f.shm.ptr);
            p.causal = causal;
            if (sample) {
                p.sample_rows = (int32_t)sample;
                p.sample_seed = 0x5eed + (uint64_t)(step * 10);
            }
            stats_head ref[4];
            stats_error err;
            float row_h[2 * 4 * 48];
            ck_assert_int_eq(stats_cpu(&p, ref, row_h, NULL, &err), STATS_OK);

            /* Release, then Ack(OK) with heads; the rows are already committed. */
            int released = 0;
            Attnstat__Envelope *e;
            for (;;) {
                e = dh_recv(&f.c, 30000);
                ck_assert_msg(e != NULL, "no Ack for push %llu", (unsigned long long)seq);
                if (e->msg_case == ATTNSTAT__ENVELOPE__MSG_RELEASE) {
                    ck_assert_uint_eq(e->release->seq, seq);
                    released = 1;
                    attnstat__envelope__free_unpacked(e, NULL);
                    continue;
                }
                break;
            }
            ck_assert_int_eq(e->msg_case, ATTNSTAT__ENVELOPE__MSG_ACK);
            ck_assert_msg(e->ack->code == ATTNSTAT__CODE__OK, "push %llu: code %d: %s",
                          (unsigned long long)seq, e->ack->code,
                          e->ack->message ? e->ack->message : "");
            ck_assert(released);
            ck_assert_uint_eq(e->ack->n_heads, 4);
            for (int h = 0; h < 4; h++) {
                Attnstat__HeadStats *hs = e->ack->heads[h];
                ck_assert_uint_eq(hs->head, (uint32_t)h);
                ck_assert_uint_eq(hs->rows, (uint64_t)ref[h].rows);
                ck_assert(dh_close_to_reference(hs->entropy_mean, ref[h].entropy_mean));
                ck_assert(dh_close_to_reference(hs->max_logit, ref[h].max_logit));
                ck_assert(dh_close_to_reference(hs->entropy_norm_mean, ref[h].entropy_norm_mean));
                int64_t border = borderline_rows(row_h, 2, 4, h, 48, 56, causal);
                ck_assert_int_eq(hs->sampled, ref[h].sampled);
                ck_assert(ref[h].rows > 0 && ref[h].entropy_mean > 0.0);
                check_row(db, run_id, layer, h, step * 10, &ref[h], border);
            }
            attnstat__envelope__free_unpacked(e, NULL);
        }
    }
    ck_assert_int_eq(dh_db_int(db, "SELECT count(*) FROM samples"), 6 * 3 * 4);
    sqlite3_close(db);

    Attnstat__Envelope *st = dh_status(&f.c);
    ck_assert_uint_eq(st->status_reply->clients, 1);
    ck_assert_uint_eq(st->status_reply->pushes, seq);
    ck_assert_uint_eq(st->status_reply->pushes_done, seq);
    ck_assert_uint_eq(st->status_reply->samples_stored, seq * 4);
    /* one CPU worker per CPU this process may run on (cpu_workers 0), the first called "cpu" */
    cpu_set_t set;
    ck_assert_int_eq(sched_getaffinity(0, sizeof set, &set), 0);
    uint32_t ncpu = (uint32_t)CPU_COUNT(&set) < 32 ? (uint32_t)CPU_COUNT(&set) : 32;
    ck_assert_uint_eq(st->status_reply->n_workers, ncpu);
    ck_assert_str_eq(st->status_reply->workers[0]->name, "cpu");
    ck_assert_uint_eq(st->status_reply->n_client_list, 1);
    ck_assert_str_eq(st->status_reply->client_list[0]->run, "ingest");
    ck_assert_uint_eq(st->status_reply->client_list[0]->uid, (uint32_t)getuid());
    attnstat__envelope__free_unpacked(st, NULL);

    dh_close(&f.c);
    ck_assert_int_eq(dh_stop(&f.d), 0);
    dh_shm_destroy(&f.shm);
    dh_cleanup(&f.d, 0);
}
END_TEST

/* Every worker is listed: 32 CPU workers (the most there can be) and none left out, as the GPU
 * workers were, added after the CPU workers, when the list stopped at 16. */
START_TEST(test_status_lists_every_worker)
{
    dh_daemon d;
    dh_dir_init(&d);
    dh_start(&d, "--cpu-workers", "32", (const char *)NULL);
    dh_conn c;
    dh_connect(&c, &d);
    Attnstat__Envelope *st = dh_status(&c);
    ck_assert_uint_eq(st->status_reply->n_workers, 32);
    ck_assert_str_eq(st->status_reply->workers[0]->name, "cpu");
    ck_assert_str_eq(st->status_reply->workers[31]->name, "cpu31");
    attnstat__envelope__free_unpacked(st, NULL);
    dh_close(&c);
    ck_assert_int_eq(dh_stop(&d), 0);
    dh_cleanup(&d, 0);
}
END_TEST

START_TEST(test_sigterm_drains_queue)
{
    dh_rng rng = dh_rng_new("sigterm_drains_queue");
    fixture f;
    dh_dir_init(&f.d);
    /* The drain is bounded by the work, not by a clock: on a loaded machine under ASan the 24
     * pushes take longer than the default grace of 10 s, after which the daemon closes the
     * connections (the Acks of the last pushes never came). */
    dh_start(&f.d, "--queue-depth", "64", "--shutdown-grace-ms", "600000", (const char *)NULL);
    dh_connect(&f.c, &f.d);
    int64_t run_id;
    dh_hello(&f.c, "drain", 0, &run_id);
    dh_tensor q, k;
    shared_qk(&f, &rng, 7, "drain", 8, 256, 64, &q, &k);
    enum { N = 24 };
    for (uint64_t s = 1; s <= N; s++)
        dh_push(&f.c, s, (int64_t)s, 0, &q, &k, 1, 0, 0);
    /* Make sure the daemon has read them all (Status is answered after the pushes before it). */
    Attnstat__Envelope *st = dh_status(&f.c);
    ck_assert_uint_eq(st->status_reply->pushes, N);
    attnstat__envelope__free_unpacked(st, NULL);
    kill(f.d.pid, SIGTERM);
    int ok = 0;
    for (uint64_t s = 1; s <= N; s++) {
        char msg[256];
        int code = dh_wait_ack(&f.c, s, msg, sizeof msg, 30000);
        ok += code == ATTNSTAT__CODE__OK;
        ck_assert_msg(code == ATTNSTAT__CODE__OK || code == ATTNSTAT__CODE__DROPPED,
                      "push %llu: code %d %s", (unsigned long long)s, code, msg);
    }
    ck_assert_msg(dh_wait_closed(&f.c, 30000), "the daemon did not close the connection");
    int stw = dh_wait(&f.d, 30000);
    ck_assert_msg(stw != -1 && WIFEXITED(stw) && WEXITSTATUS(stw) == 0, "exit status %d", stw);
    struct stat sb;
    ck_assert_msg(stat(f.d.sock, &sb) != 0, "the socket file is still there after shutdown");
    sqlite3 *db = dh_db_open(&f.d);
    char txt[64];
    dh_db_text(db, "PRAGMA integrity_check", txt, sizeof txt);
    ck_assert_str_eq(txt, "ok");
    ck_assert_int_eq(dh_db_int(db, "SELECT count(DISTINCT step) FROM samples"), ok);
    sqlite3_close(db);
    dh_close(&f.c);
    dh_shm_destroy(&f.shm);
    dh_cleanup(&f.d, 0);
}
END_TEST

/* A CPU worker's queue is bounded by work, not by a count of pushes: with queue_work worth two
 * big pushes, ten big ones sent at once are mostly dropped ("queue is full"), while 30 tiny ones
 * sent at once are all taken (the count bound, queue_depth, is far away). No clock: the ten
 * arrive long before the first is computed, and a slower machine only drops more. */
START_TEST(test_queue_bounded_by_work)
{
    dh_rng rng = dh_rng_new("queue_by_work");
    fixture f;
    dh_dir_init(&f.d);
    enum { BH = 8, BN = 512, BD = 128, NBIG = 10, NTINY = 30 };
    char cap[32];
    snprintf(cap, sizeof cap, "%llu", 2ull * BH * BN * BN * BD); /* two pushes' multiply-adds */
    dh_start(&f.d, "--cpu-workers", "1", "--queue-work", cap, (const char *)NULL);
    dh_connect(&f.c, &f.d);
    dh_hello(&f.c, "by-work", 0, NULL);
    dh_tensor q, k, tq, tk;
    shared_qk(&f, &rng, 3, "by_work", BH, BN, BD, &q, &k);
    dh_tensor_contig(&tq, 3, 0, ATTNSTAT__DTYPE__F32, 1, 2, 8, 8);
    dh_tensor_contig(&tk, 3, 0, ATTNSTAT__DTYPE__F32, 1, 2, 8, 8);
    for (uint64_t s = 1; s <= NBIG; s++)
        dh_push(&f.c, s, (int64_t)s, 0, &q, &k, 0, 0, 0);
    int ok = 0, dropped = 0;
    while (ok + dropped < NBIG) { /* the drops are answered before the first push is computed */
        Attnstat__Envelope *e = dh_expect(&f.c, ATTNSTAT__ENVELOPE__MSG_ACK, 120000);
        ck_assert_msg(e != NULL, "%d OK and %d dropped of %d answered", ok, dropped, NBIG);
        ok += e->ack->code == ATTNSTAT__CODE__OK;
        if (e->ack->code == ATTNSTAT__CODE__DROPPED) {
            dropped++;
            ck_assert_msg(e->ack->message && strstr(e->ack->message, "queue_work"), "push %llu: %s",
                          (unsigned long long)e->ack->seq, e->ack->message);
        }
        attnstat__envelope__free_unpacked(e, NULL);
    }
    ck_assert_msg(ok >= 1 && ok <= 3 && ok + dropped == NBIG, "%d OK, %d dropped of %d", ok,
                  dropped, NBIG);
    for (uint64_t s = 1; s <= NTINY; s++)
        dh_push(&f.c, 100 + s, (int64_t)(100 + s), 1, &tq, &tk, 0, 0, 0);
    for (uint64_t s = 1; s <= NTINY; s++) {
        char msg[256];
        int code = dh_wait_ack(&f.c, 100 + s, msg, sizeof msg, 60000);
        ck_assert_msg(code == ATTNSTAT__CODE__OK, "tiny push %llu: code %d %s",
                      (unsigned long long)s, code, msg);
    }
    stop_clean(&f);
}
END_TEST

/* One connection holds at most client_inflight pushes queued or computing; the next are dropped
 * with the setting's name, and the others' are not. No clock: the daemon is stopped (SIGSTOP)
 * while the pushes are sent, so that it reads them in one go, before the loop can hear of any
 * computed one. */
START_TEST(test_client_inflight_cap)
{
    dh_rng rng = dh_rng_new("client_inflight");
    fixture f;
    dh_dir_init(&f.d);
    enum { CAP = 4, NP = 12 };
    dh_start(&f.d, "--client-inflight", "4", (const char *)NULL);
    dh_connect(&f.c, &f.d);
    dh_hello(&f.c, "inflight", 0, NULL);
    dh_tensor q, k;
    shared_qk(&f, &rng, 3, "inflight", 2, 16, 16, &q, &k);
    char msg[256];
    dh_push(&f.c, 1, 1, 0, &q, &k, 0, 0, 0); /* registered and served before the stop */
    ck_assert_int_eq(dh_wait_ack(&f.c, 1, msg, sizeof msg, 60000), ATTNSTAT__CODE__OK);
    ck_assert_int_eq(kill(f.d.pid, SIGSTOP), 0);
    for (uint64_t s = 0; s < NP; s++)
        dh_push(&f.c, 10 + s, (int64_t)(10 + s), 0, &q, &k, 0, 0, 0);
    ck_assert_int_eq(kill(f.d.pid, SIGCONT), 0);
    int ok = 0, dropped = 0;
    for (uint64_t i = 0; i < NP; i++) {
        uint64_t s = (i + CAP) % NP; /* the drops first: they are answered as they are read */
        int code = dh_wait_ack(&f.c, 10 + s, msg, sizeof msg, 60000);
        if (s < CAP) {
            ck_assert_msg(code == ATTNSTAT__CODE__OK, "push %llu: %d %s", (unsigned long long)s,
                          code, msg);
            ok++;
        } else {
            ck_assert_msg(code == ATTNSTAT__CODE__DROPPED && strstr(msg, "client_inflight"),
                          "push %llu: %d %s", (unsigned long long)s, code, msg);
            dropped++;
        }
    }
    ck_assert_int_eq(ok + dropped, NP);
    /* the queue drained: the connection is served again */
    dh_push(&f.c, 100, 100, 0, &q, &k, 0, 0, 0);
    ck_assert_int_eq(dh_wait_ack(&f.c, 100, msg, sizeof msg, 60000), ATTNSTAT__CODE__OK);
    stop_clean(&f);
}
END_TEST

static Suite *daemon_ingest_suite(void)
{
    Suite *s = suite_create("daemon_ingest");
    TCase *tc = tcase_create("ingest");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, test_push_stored_equals_reference);
    tcase_add_test(tc, test_status_lists_every_worker);
    tcase_add_test(tc, test_sigterm_drains_queue);
    tcase_add_test(tc, test_queue_bounded_by_work);
    tcase_add_test(tc, test_client_inflight_cap);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return dh_run(daemon_ingest_suite());
}
