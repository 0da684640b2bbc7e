/* test_daemon_robust.c — attnstatd under failures, with a real daemon:
 *  - a client SIGKILLed mid-stream loses nothing it was acknowledged for, and the daemon frees it
 *    (Status no longer lists it; its shared memory is no longer mapped in the daemon);
 *  - the daemon SIGKILLed mid-ingest leaves PRAGMA integrity_check = ok and every acknowledged
 *    sample present after a restart;
 *  - a fatal signal leaves which signal, a backtrace and what to do in the log, and its status;
 *  - a client that pushes and never reads cannot stall another client. */
#include "daemon_harness.h"

#include <sys/resource.h>

enum { RH = 4, RN = 64, RD = 32, WINDOW = 8 };

/* Pushes `count` pushes (steps 0..count-1, layers 0..1) with up to WINDOW in flight; for every
 * Ack(OK) writes its step to out_fd (when >= 0) and counts it. Stops early on EOF. Returns the
 * number of OK acks. Never asserts (may run in a forked child). */
static int pump(dh_conn *c, dh_tensor *q, dh_tensor *k, int count, int out_fd, int64_t *acked,
                int max_acked)
{
    int inflight = 0, ok = 0, refusals = 0;
    uint64_t seq = 0;
    for (int i = 0; i < count || inflight > 0;) {
        if (i < count && inflight < WINDOW) {
            Attnstat__TensorRef qr, kr;
            dh_tensor_ref(&qr, q);
            dh_tensor_ref(&kr, k);
            Attnstat__Push p;
            Attnstat__Envelope env;
            envelope_push(&env, &p, ++seq, i / 2, (uint32_t)(i % 2), &qr, &kr);
            p.has_causal = 1;
            p.causal = 1;
            size_t len;
            uint8_t *buf = frame_pack(&env, 1u << 20, &len);
            int rc = buf ? dh_write_all(c->fd, buf, len) : -1;
            free(buf);
            if (rc != 0)
                return ok;
            inflight++;
            i++;
            continue;
        }
        Attnstat__Envelope *e = dh_recv(c, 30000);
        if (!e) {
            fprintf(stderr, "pump: no reply within 30 s or the connection closed (%d acked OK, "
                    "%d in flight)\n", ok, inflight);
            return ok;
        }
        if (e->msg_case == ATTNSTAT__ENVELOPE__MSG_ACK) {
            inflight--;
            if (e->ack->code == ATTNSTAT__CODE__OK) {
                int64_t step_layer = (int64_t)((e->ack->seq - 1) / 2) * 2 + (int64_t)((e->ack->seq - 1) % 2);
                if (out_fd >= 0 && write(out_fd, &step_layer, sizeof step_layer) != sizeof step_layer)
                    out_fd = -1; /* the reader is gone (EPIPE): keep counting */
                if (acked && ok < max_acked)
                    acked[ok] = step_layer;
                ok++;
            } else if (refusals++ < 3) { /* the first refusals say why */
                fprintf(stderr, "pump: push %llu answered %d: %s\n",
                        (unsigned long long)e->ack->seq, (int)e->ack->code,
                        e->ack->message ? e->ack->message : "");
            }
        }
        attnstat__envelope__free_unpacked(e, NULL);
    }
    return ok;
}

static void make_tensors(dh_rng *rng, dh_shm *shm, const char *tag, dh_tensor *q, dh_tensor *k)
{
    dh_tensor_contig(q, 1, 0, ATTNSTAT__DTYPE__BF16, 1, RH, RN, RD);
    uint64_t qb = dh_tensor_elems(q) * 2;
    dh_tensor_contig(k, 1, qb, ATTNSTAT__DTYPE__BF16, 1, RH, RN, RD);
    dh_shm_create(shm, tag, qb * 2);
    dh_fill(rng, shm->ptr, dh_tensor_elems(q) * 2, q->dtype, 1.0);
}

/* Every (step, layer) in acked has its RH heads stored for run `run`. */
static void check_acked_present(sqlite3 *db, const char *run, const int64_t *acked, int n)
{
    for (int i = 0; i < n; i++) {
        char sql[256];
        snprintf(sql, sizeof sql,
                 "SELECT count(*) FROM samples JOIN runs ON runs.id = samples.run_id WHERE "
                 "runs.name='%s' AND step=%lld AND layer=%lld",
                 run, (long long)(acked[i] / 2), (long long)(acked[i] % 2));
        ck_assert_msg(dh_db_int(db, sql) == RH, "acknowledged step %lld layer %lld is missing",
                      (long long)(acked[i] / 2), (long long)(acked[i] % 2));
    }
}

static int daemon_maps(pid_t pid, const char *shm_name)
{
    char path[64], line[1024];
    snprintf(path, sizeof path, "/proc/%d/maps", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return -1;
    int found = 0;
    while (fgets(line, sizeof line, f))
        found |= strstr(line, shm_name + 1) != NULL;
    fclose(f);
    return found;
}

START_TEST(test_client_killed_mid_stream)
{
    dh_rng rng = dh_rng_new("client_killed_mid_stream");
    dh_daemon d;
    dh_dir_init(&d);
    dh_start(&d, (const char *)NULL);
    dh_shm shm;
    dh_tensor q, k;
    make_tensors(&rng, &shm, "victim", &q, &k);

    int pfd[2];
    ck_assert_int_eq(pipe(pfd), 0);
    pid_t child = fork();
    ck_assert_int_ge(child, 0);
    if (child == 0) {
        close(pfd[0]);
        dh_conn c;
        dh_connect(&c, &d);
        dh_hello(&c, "victim", 0, NULL);
        dh_register(&c, 1, shm.name, shm.size);
        pump(&c, &q, &k, 1000000, pfd[1], NULL, 0);
        _exit(0);
    }
    close(pfd[1]);
    int64_t acked[100000];
    int n = 0;
    while (n < 40) {
        ssize_t r = read(pfd[0], &acked[n], sizeof acked[n]);
        ck_assert_msg(r == sizeof acked[n], "the pushing child stopped early");
        n++;
    }
    /* The daemon maps the child's segment while the child is alive. */
    ck_assert_int_eq(daemon_maps(d.pid, shm.name), 1);
    kill(child, SIGKILL);
    int st;
    ck_assert_int_eq(waitpid(child, &st, 0), child);
    for (;;) {
        ssize_t r = read(pfd[0], &acked[n], sizeof acked[n]);
        if (r != sizeof acked[n] || n + 1 >= 100000)
            break;
        n++;
    }
    close(pfd[0]);
    fprintf(stderr, "client_killed_mid_stream: %d pushes acknowledged before the kill\n", n);

    /* The daemon forgets the client: not in Status, its segment unmapped. */
    dh_conn c;
    dh_connect(&c, &d);
    int64_t deadline = dh_now_ms() + 20000;
    for (;;) {
        Attnstat__Envelope *e = dh_status(&c);
        unsigned clients = e->status_reply->clients;
        attnstat__envelope__free_unpacked(e, NULL);
        if (clients == 1 && daemon_maps(d.pid, shm.name) == 0)
            break;
        ck_assert_msg(dh_now_ms() < deadline,
                      "20 s after the kill: %u clients, segment mapped: %d", clients,
                      daemon_maps(d.pid, shm.name));
        dh_sleep_ms(50);
    }
    sqlite3 *db = dh_db_open(&d);
    check_acked_present(db, "victim", acked, n);
    sqlite3_close(db);

    /* And serves the next client. */
    dh_hello(&c, "next", 0, NULL);
    dh_shm shm2;
    dh_tensor q2, k2;
    make_tensors(&rng, &shm2, "next", &q2, &k2);
    dh_register(&c, 1, shm2.name, shm2.size);
    ck_assert_int_eq(pump(&c, &q2, &k2, 10, -1, NULL, 0), 10);
    dh_close(&c);
    dh_shm_destroy(&shm2);
    dh_shm_destroy(&shm);
    int code = dh_stop(&d);
    dh_cleanup(&d, code != 0);
    ck_assert_int_eq(code, 0);
}
END_TEST

START_TEST(test_daemon_killed_mid_ingest)
{
    dh_rng rng = dh_rng_new("daemon_killed_mid_ingest");
    signal(SIGPIPE, SIG_IGN); /* the killer closes its end of the pipe once it has fired */
    dh_daemon d;
    dh_dir_init(&d);
    dh_start(&d, (const char *)NULL);
    dh_shm shm;
    dh_tensor q, k;
    make_tensors(&rng, &shm, "crash", &q, &k);

    /* A child kills the daemon once the client has seen 60 acks; the client keeps pushing. */
    int pfd[2];
    ck_assert_int_eq(pipe(pfd), 0);
    dh_conn c;
    dh_connect(&c, &d);
    dh_hello(&c, "crash", 0, NULL);
    dh_register(&c, 1, shm.name, shm.size);
    pid_t killer = fork();
    ck_assert_int_ge(killer, 0);
    if (killer == 0) {
        close(pfd[1]);
        int64_t v;
        for (int i = 0; i < 60; i++)
            if (read(pfd[0], &v, sizeof v) != sizeof v)
                _exit(1);
        kill(d.pid, SIGKILL);
        _exit(0);
    }
    close(pfd[0]);
    static int64_t acked[1000000];
    int n = pump(&c, &q, &k, 1000000, pfd[1], acked, 1000000);
    close(pfd[1]);
    int st;
    ck_assert_int_eq(waitpid(killer, &st, 0), killer);
    ck_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    ck_assert_int_ge(n, 60);
    st = dh_wait(&d, 20000);
    ck_assert_msg(st != -1 && WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL, "daemon status %d", st);
    dh_close(&c);
    fprintf(stderr, "daemon_killed_mid_ingest: %d pushes acknowledged before SIGKILL\n", n);

    /* Restart on the same database: it opens (recovers), and everything acknowledged is there. */
    dh_start(&d, (const char *)NULL);
    sqlite3 *db = dh_db_open(&d);
    char txt[64];
    dh_db_text(db, "PRAGMA integrity_check", txt, sizeof txt);
    ck_assert_str_eq(txt, "ok");
    check_acked_present(db, "crash", acked, n);
    sqlite3_close(db);
    dh_shm_destroy(&shm);
    int code = dh_stop(&d);
    dh_cleanup(&d, code != 0);
    ck_assert_int_eq(code, 0);
}
END_TEST

#if defined(__SANITIZE_ADDRESS__)
#define ROBUST_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define ROBUST_ASAN 1
#endif
#endif

/* A fatal signal leaves its last words in the log (which signal, a backtrace, what to do) and the
 * exit status it would have had without them (systemd's Restart=on-failure reads it). The handler
 * is left out under AddressSanitizer (its reports say more): there only that the daemon exits. */
START_TEST(test_fatal_signal_leaves_a_backtrace)
{
    struct rlimit old;
    ck_assert_int_eq(getrlimit(RLIMIT_CORE, &old), 0);
    struct rlimit none = {0, old.rlim_max};
    ck_assert_int_eq(setrlimit(RLIMIT_CORE, &none), 0); /* no core file from the daemon */
    static const int sigs[2] = {SIGSEGV, SIGFPE};
    for (int i = 0; i < 2; i++) {
        dh_daemon d;
        dh_dir_init(&d);
        dh_start(&d, (const char *)NULL);
        dh_conn c;
        dh_connect(&c, &d);
        dh_hello(&c, "fatal", 0, NULL);
        ck_assert_int_eq(kill(d.pid, sigs[i]), 0);
        int st = dh_wait(&d, 20000);
#ifdef ROBUST_ASAN /* ASan's own handler reports, then aborts (abort_on_error) or exits */
        ck_assert_msg(st != -1, "the daemon did not exit");
#else
        ck_assert_msg(st != -1 && WIFSIGNALED(st) && WTERMSIG(st) == sigs[i], "daemon status %d",
                      st);
#endif
        dh_close(&c);
        FILE *f = fopen(d.log, "r");
        ck_assert_ptr_nonnull(f);
        static char log[1 << 20];
        size_t n = fread(log, 1, sizeof log - 1, f);
        log[n] = '\0';
        fclose(f);
#ifndef ROBUST_ASAN
        char want[64];
        snprintf(want, sizeof want, "attnstatd: fatal signal %d (%s, si_code", sigs[i],
                 sigs[i] == SIGSEGV ? "SIGSEGV" : "SIGFPE");
        const char *at = strstr(log, want);
        ck_assert_msg(at != NULL, "no '%s' in the log", want);
        ck_assert_msg(strstr(at, "; backtrace") && strstr(at, "[0x"), "no backtrace: %s", at);
        ck_assert_msg(strstr(at, "please report it"), "%s", at);
#endif
        dh_cleanup(&d, 0);
    }
    ck_assert_int_eq(setrlimit(RLIMIT_CORE, &old), 0);
}
END_TEST

START_TEST(test_stuck_client_cannot_stall_others)
{
    dh_rng rng = dh_rng_new("stuck_client");
    dh_daemon d;
    dh_dir_init(&d);
    dh_start(&d, "--out-queue-bytes", "65536", (const char *)NULL);

    /* The stuck client: subscribes to every result, pushes with want_results, never reads. */
    enum { SH = 64 };
    dh_shm big;
    dh_tensor bq, bk;
    dh_tensor_contig(&bq, 1, 0, ATTNSTAT__DTYPE__F32, 1, SH, 8, 8);
    dh_tensor_contig(&bk, 1, 0, ATTNSTAT__DTYPE__F32, 1, SH, 8, 8);
    dh_shm_create(&big, "stuck", dh_tensor_elems(&bq) * 4);
    dh_fill(&rng, big.ptr, dh_tensor_elems(&bq), bq.dtype, 1.0);
    dh_conn a;
    dh_connect(&a, &d);
    dh_hello(&a, "stuck", 0, NULL);
    dh_register(&a, 1, big.name, big.size);
    dh_subscribe(&a, 1, 1); /* results, and alerts as Subscribe's default has them */
    int sent = 0;
    for (uint64_t s = 1; s <= 20000; s++) {
        Attnstat__TensorRef qr, kr;
        dh_tensor_ref(&qr, &bq);
        dh_tensor_ref(&kr, &bk);
        Attnstat__Push p;
        Attnstat__Envelope env;
        envelope_push(&env, &p, s, (int64_t)s, 0, &qr, &kr);
        p.has_want_results = 1;
        p.want_results = 1;
        size_t len;
        uint8_t *buf = frame_pack(&env, 1u << 20, &len);
        ssize_t w = send(a.fd, buf, len, MSG_DONTWAIT | MSG_NOSIGNAL);
        free(buf);
        if (w != (ssize_t)len)
            break; /* its send buffer is full: the daemon stopped reading it */
        sent++;
    }
    fprintf(stderr, "stuck_client: the stuck client got %d pushes out\n", sent);

    /* Another client is served promptly, every push acknowledged OK. */
    dh_shm shm;
    dh_tensor q, k;
    make_tensors(&rng, &shm, "other", &q, &k);
    dh_conn b;
    dh_connect(&b, &d);
    dh_hello(&b, "other", 0, NULL);
    dh_register(&b, 1, shm.name, shm.size);
    int64_t t0 = dh_now_ms();
    ck_assert_int_eq(pump(&b, &q, &k, 40, -1, NULL, 0), 40);
    fprintf(stderr, "stuck_client: 40 pushes of the other client took %lld ms\n",
            (long long)(dh_now_ms() - t0));
    Attnstat__Envelope *st = dh_status(&b);
    ck_assert_uint_ge(st->status_reply->pushes_done, 40);
    attnstat__envelope__free_unpacked(st, NULL);
    dh_close(&b);
    dh_close(&a);
    dh_shm_destroy(&shm);
    dh_shm_destroy(&big);
    int code = dh_stop(&d);
    dh_cleanup(&d, code != 0);
    ck_assert_int_eq(code, 0);
}
END_TEST

/* A client that sends many messages each answered by Errors and never reads: the replies of one
 * read go past 4x out_queue_bytes in the middle of a handler (Forget of an unknown buffer and an
 * unknown event: two Errors), which closes the connection there. The daemon must survive it (the
 * handler must not touch the freed session) and keep serving. */
START_TEST(test_connection_closed_inside_a_handler)
{
    dh_rng rng = dh_rng_new("closed_in_handler");
    dh_daemon d;
    dh_dir_init(&d);
    dh_start(&d, "--out-queue-bytes", "65536", (const char *)NULL);
    /* Where the close falls (first or second Error of a Forget) depends on the byte counts: a few
     * leading buffer-only Forgets shift it, so one of these alignments closes between the two. */
    for (int pre = 0; pre < 6; pre++) {
        dh_conn a;
        dh_connect(&a, &d);
        dh_hello(&a, "flood", 0, NULL);
        struct timeval tv = {5, 0};
        ck_assert_int_eq(setsockopt(a.fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv), 0);
        Attnstat__Forget f;
        Attnstat__Envelope env;
        envelope_forget(&env, &f, 1, 12345, 0, 0);
        size_t l1, l2;
        uint8_t *single = frame_pack(&env, 1u << 20, &l1);
        f.has_event_id = 1;
        f.event_id = 777;
        uint8_t *both = frame_pack(&env, 1u << 20, &l2);
        ck_assert(single && both);
        enum { NFRAMES = 20000 };
        uint8_t *all = malloc(l1 * (size_t)pre + l2 * NFRAMES);
        ck_assert_ptr_nonnull(all);
        size_t tot = 0;
        for (int i = 0; i < pre; i++, tot += l1)
            memcpy(all + tot, single, l1);
        for (int i = 0; i < NFRAMES; i++, tot += l2)
            memcpy(all + tot, both, l2);
        free(single);
        free(both);
        /* Fails (EPIPE, ECONNRESET, or the send timeout) once the daemon closed or paused us. */
        (void)dh_write_all(a.fd, all, tot);
        free(all);
        ck_assert_msg(dh_wait_closed(&a, 20000), "the flooding connection was not closed");
        dh_close(&a);
        int st;
        ck_assert_msg(waitpid(d.pid, &st, WNOHANG) == 0, "attnstatd died (status %d, alignment %d); "
                      "see %s", st, pre, d.log);
    }

    /* Others are still served. */
    dh_shm shm;
    dh_tensor q, k;
    make_tensors(&rng, &shm, "after-flood", &q, &k);
    dh_conn b;
    dh_connect(&b, &d);
    dh_hello(&b, "after-flood", 0, NULL);
    dh_register(&b, 1, shm.name, shm.size);
    ck_assert_int_eq(pump(&b, &q, &k, 4, -1, NULL, 0), 4);
    dh_close(&b);
    dh_shm_destroy(&shm);
    int code = dh_stop(&d);
    dh_cleanup(&d, code != 0);
    ck_assert_int_eq(code, 0);
}
END_TEST

/* A push that cannot be stored must not take the other pushes of its commit batch down with it:
 * here a layer past int32 from one client and good pushes from another, committed together. */
START_TEST(test_bad_push_does_not_poison_the_batch)
{
    dh_rng rng = dh_rng_new("poison");
    dh_daemon d;
    dh_dir_init(&d);
    dh_start(&d, "--commit-ms", "300", (const char *)NULL);
    dh_shm shm;
    dh_tensor q, k;
    make_tensors(&rng, &shm, "poison", &q, &k);
    dh_conn a, b;
    dh_connect(&a, &d);
    dh_hello(&a, "bad-layer", 0, NULL);
    dh_register(&a, 1, shm.name, shm.size);
    dh_connect(&b, &d);
    dh_hello(&b, "good", 0, NULL);
    dh_register(&b, 1, shm.name, shm.size);
    attnstat__envelope__free_unpacked(dh_status(&a), NULL);
    attnstat__envelope__free_unpacked(dh_status(&b), NULL);
    dh_push(&b, 1, 1, 0, &q, &k, 1, 0, 0);
    dh_push(&a, 1, 1, 0x80000000u, &q, &k, 1, 0, 0);
    dh_push(&b, 2, 2, 0, &q, &k, 1, 0, 0);
    char msg[512];
    int code = dh_wait_ack(&a, 1, msg, sizeof msg, 30000);
    ck_assert_msg(code == ATTNSTAT__CODE__BAD_REQUEST && strstr(msg, "layer"), "bad layer: code %d: %s",
                  code, msg);
    for (uint64_t s = 1; s <= 2; s++) {
        code = dh_wait_ack(&b, s, msg, sizeof msg, 30000);
        ck_assert_msg(code == ATTNSTAT__CODE__OK, "good push %llu: code %d: %s", (unsigned long long)s,
                      code, msg);
    }
    dh_close(&a);
    dh_close(&b);
    dh_shm_destroy(&shm);
    int rc = dh_stop(&d);
    dh_cleanup(&d, rc != 0);
    ck_assert_int_eq(rc, 0);
}
END_TEST

/* Started with a soft open-file limit of 64 (hard limit higher, as with systemd's default 1024 /
 * 512K): the daemon raises it, so 120 registered buffers (one fd each) are all accepted. */
START_TEST(test_fd_limit_raised)
{
    struct rlimit old;
    ck_assert_int_eq(getrlimit(RLIMIT_NOFILE, &old), 0);
    if (old.rlim_max != RLIM_INFINITY && old.rlim_max < 1024) {
        fprintf(stderr, "fd_limit: SKIPPED (hard open-file limit %llu)\n",
                (unsigned long long)old.rlim_max);
        return;
    }
    dh_daemon d;
    dh_dir_init(&d);
    struct rlimit low = old;
    low.rlim_cur = 64;
    ck_assert_int_eq(setrlimit(RLIMIT_NOFILE, &low), 0);
    dh_start(&d, (const char *)NULL); /* inherits the low soft limit */
    ck_assert_int_eq(setrlimit(RLIMIT_NOFILE, &old), 0);
    dh_shm shm;
    dh_shm_create(&shm, "fds", 1 << 16);
    dh_conn c[2];
    int errors = 0;
    char first[512] = "";
    for (int i = 0; i < 2; i++) {
        dh_connect(&c[i], &d);
        dh_hello(&c[i], "fds", i, NULL);
        for (uint32_t id = 1; id <= 60; id++)
            dh_register(&c[i], id, shm.name, 4096);
        dh_send_status(&c[i]);
        for (;;) {
            Attnstat__Envelope *e = dh_recv(&c[i], 20000);
            ck_assert_msg(e != NULL, "no StatusReply");
            int done = e->msg_case == ATTNSTAT__ENVELOPE__MSG_STATUS_REPLY;
            if (e->msg_case == ATTNSTAT__ENVELOPE__MSG_ERROR && errors++ == 0)
                snprintf(first, sizeof first, "%s", e->error->message);
            attnstat__envelope__free_unpacked(e, NULL);
            if (done)
                break;
        }
    }
    for (int i = 0; i < 2; i++)
        dh_close(&c[i]);
    dh_shm_destroy(&shm);
    int code = dh_stop(&d);
    dh_cleanup(&d, code != 0 || errors != 0);
    ck_assert_msg(errors == 0, "%d registrations refused; first: %s", errors, first);
    ck_assert_int_eq(code, 0);
}
END_TEST

/* SIGTERM while a very long push computes (and more are queued behind it): the daemon exits in
 * bounded time (grace, then a few seconds for the running job), saying it left the job behind. */
START_TEST(test_shutdown_bounded_with_a_long_job)
{
    dh_daemon d;
    dh_dir_init(&d);
    dh_start(&d, "--max-push-work", "1000000000000000", (const char *)NULL);
    enum { LQ = 8192, LK = 1 << 20, LD = 128 };
    dh_shm shm;
    dh_shm_create(&shm, "long", 2 * LD * 4);
    dh_fill(&(dh_rng){42}, shm.ptr, 2 * LD, ATTNSTAT__DTYPE__F32, 1.0);
    dh_conn c;
    dh_connect(&c, &d);
    dh_hello(&c, "long", 0, NULL);
    dh_register(&c, 1, shm.name, shm.size);
    dh_tensor q, k;
    dh_tensor_contig(&q, 1, 0, ATTNSTAT__DTYPE__F32, 1, 4, LQ, LD);
    dh_tensor_contig(&k, 1, LD * 4, ATTNSTAT__DTYPE__F32, 1, 4, LK, LD);
    q.strides[0] = q.strides[1] = q.strides[2] = 0; /* one row repeated: 1 KiB, and minutes of */
    /* work even at the sampled rows of a long push and the fastest CPU path */
    k.strides[0] = k.strides[1] = k.strides[2] = 0;
    for (uint64_t s = 1; s <= 3; s++)
        dh_push(&c, s, (int64_t)s, 0, &q, &k, 0, 0, 0);
    attnstat__envelope__free_unpacked(dh_status(&c), NULL);
    dh_sleep_ms(300);
    int64_t t0 = dh_now_ms();
    kill(d.pid, SIGTERM);
    int st = dh_wait(&d, 40000);
    int64_t took = dh_now_ms() - t0;
    if (st == -1)
        kill(d.pid, SIGKILL), dh_wait(&d, 5000);
    char cmd[512];
    snprintf(cmd, sizeof cmd, "grep -q 'leaving it behind' %s", d.log);
    int logged = system(cmd) == 0;
    dh_close(&c);
    dh_shm_destroy(&shm);
    dh_cleanup(&d, st == -1 || !logged);
    ck_assert_msg(st != -1, "attnstatd did not exit within 40 s of SIGTERM");
    fprintf(stderr, "long_job: exited %lld ms after SIGTERM\n", (long long)took);
    ck_assert_msg(WIFEXITED(st), "attnstatd died of signal %d", WIFSIGNALED(st) ? WTERMSIG(st) : 0);
    ck_assert_msg(logged, "the log does not say the running job was left behind");
}
END_TEST

static Suite *robust_suite(void)
{
    Suite *s = suite_create("daemon_robust");
    TCase *tc = tcase_create("robust");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, test_client_killed_mid_stream);
    tcase_add_test(tc, test_daemon_killed_mid_ingest);
    tcase_add_test(tc, test_fatal_signal_leaves_a_backtrace);
    tcase_add_test(tc, test_stuck_client_cannot_stall_others);
    tcase_add_test(tc, test_connection_closed_inside_a_handler);
    tcase_add_test(tc, test_bad_push_does_not_poison_the_batch);
    tcase_add_test(tc, test_fd_limit_raised);
    tcase_add_test(tc, test_shutdown_bounded_with_a_long_job);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return dh_run(robust_suite());
}
