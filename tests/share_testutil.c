/* share_testutil.c — the shared resources suites' helpers (see share_testutil.h). */
#include "share_testutil.h"

#include <arpa/inet.h>
#include <grp.h>
#include <math.h>
#include <netinet/in.h>
#include <sys/uio.h>

char *sh_slurp(const char *path)
{
    FILE *f = fopen(path, "r");
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    ck_assert_ptr_nonnull(buf);
    if (f) {
        size_t r;
        while ((r = fread(buf + n, 1, cap - n - 1, f)) > 0) {
            n += r;
            if (cap - n < 2) {
                cap *= 2;
                buf = realloc(buf, cap);
                ck_assert_ptr_nonnull(buf);
            }
        }
        fclose(f);
    }
    buf[n] = '\0';
    return buf;
}

int sh_file_has(const char *path, const char *needle, int timeout_ms)
{
    int64_t deadline = dh_now_ms() + timeout_ms;
    for (;;) {
        char *text = sh_slurp(path);
        int found = strstr(text, needle) != NULL;
        free(text);
        if (found || dh_now_ms() > deadline)
            return found;
        dh_sleep_ms(50);
    }
}

int sh_file_count(const char *path, const char *needle)
{
    char *text = sh_slurp(path);
    int n = 0;
    for (const char *p = text; (p = strstr(p, needle)); p += strlen(needle))
        n++;
    free(text);
    return n;
}

int sh_file_count_over(const char *path, const char *needle, int than, int timeout_ms)
{
    int64_t deadline = dh_now_ms() + timeout_ms;
    for (;;) {
        if (sh_file_count(path, needle) > than)
            return 1;
        if (dh_now_ms() > deadline)
            return 0;
        dh_sleep_ms(50);
    }
}

void sh_write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    ck_assert_msg(f != NULL, "%s: %s", path, strerror(errno));
    fputs(text, f);
    ck_assert_int_eq(fclose(f), 0);
}

int sh_run_daemon_to_end(const char *log, const char *const *args, uid_t as_uid)
{
    const char *argv[32];
    int n = 0;
    argv[n++] = ATTNSTATD_PATH;
    for (int i = 0; args[i] && n < 31; i++)
        argv[n++] = args[i];
    argv[n] = NULL;
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0666);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
            close(fd);
        }
        if (as_uid != (uid_t)-1 && (setgid(as_uid) != 0 || setuid(as_uid) != 0))
            _exit(126);
        execv(argv[0], (char *const *)argv);
        _exit(127);
    }
    int64_t deadline = dh_now_ms() + 60000;
    int st;
    while (waitpid(pid, &st, WNOHANG) != pid) {
        if (dh_now_ms() > deadline) {
            kill(pid, SIGKILL);
            waitpid(pid, &st, 0);
            return -1;
        }
        dh_sleep_ms(20);
    }
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* gid 65534: the allowed group of the tests that act as other uids (a uid is admitted by its
 * primary group, as the daemon reads it from SO_PEERCRED). */


int sh_other_uids_possible(char *name, size_t len, const char *who)
{
    struct group *g = getuid() == 0 ? getgrgid(SH_ALLOWED_GID) : NULL;
    if (!g) {
        fprintf(stderr, "%s: SKIPPED (needs root and group %u to act as other uids)\n", who,
                (unsigned)SH_ALLOWED_GID);
        return 0;
    }
    snprintf(name, len, "%s", g->gr_name);
    return 1;
}

void sh_connect_as(const dh_daemon *d, uid_t uid, int n, dh_conn *out)
{
    int sv[2];
    ck_assert_int_eq(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        close(sv[0]);
        if (setgroups(0, NULL) != 0 || setgid(SH_ALLOWED_GID) != 0 || setuid(uid) != 0)
            _exit(3);
        for (int i = 0; i < n; i++) {
            int fd = dh_try_connect(d->sock);
            if (fd < 0)
                _exit(4);
            char byte = 'c';
            struct iovec iov = {&byte, 1};
            union {
                struct cmsghdr h;
                char buf[CMSG_SPACE(sizeof(int))];
            } u;
            struct msghdr mh;
            memset(&mh, 0, sizeof mh);
            memset(&u, 0, sizeof u);
            mh.msg_iov = &iov;
            mh.msg_iovlen = 1;
            mh.msg_control = u.buf;
            mh.msg_controllen = sizeof u.buf;
            struct cmsghdr *cm = CMSG_FIRSTHDR(&mh);
            cm->cmsg_level = SOL_SOCKET;
            cm->cmsg_type = SCM_RIGHTS;
            cm->cmsg_len = CMSG_LEN(sizeof(int));
            memcpy(CMSG_DATA(cm), &fd, sizeof fd);
            if (sendmsg(sv[1], &mh, 0) != 1)
                _exit(5);
            close(fd);
        }
        _exit(0);
    }
    close(sv[1]);
    for (int i = 0; i < n; i++) {
        char byte;
        struct iovec iov = {&byte, 1};
        union {
            struct cmsghdr h;
            char buf[CMSG_SPACE(sizeof(int))];
        } u;
        struct msghdr mh;
        memset(&mh, 0, sizeof mh);
        mh.msg_iov = &iov;
        mh.msg_iovlen = 1;
        mh.msg_control = u.buf;
        mh.msg_controllen = sizeof u.buf;
        ssize_t r = recvmsg(sv[0], &mh, MSG_CMSG_CLOEXEC);
        struct cmsghdr *cm = r == 1 ? CMSG_FIRSTHDR(&mh) : NULL;
        ck_assert_msg(cm && cm->cmsg_type == SCM_RIGHTS, "connection %d of uid %u not handed over",
                      i, (unsigned)uid);
        memset(&out[i], 0, sizeof out[i]);
        memcpy(&out[i].fd, CMSG_DATA(cm), sizeof(int));
        frame_reader_init(&out[i].rd, 64u << 20);
    }
    close(sv[0]);
    int st;
    ck_assert_int_eq(waitpid(pid, &st, 0), pid);
    ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "the child of uid %u failed (%d)",
                  (unsigned)uid, st);
}

int sh_next_error(dh_conn *c, char *msg, size_t len, int timeout_ms)
{
    Attnstat__Envelope *e = dh_expect(c, ATTNSTAT__ENVELOPE__MSG_ERROR, timeout_ms);
    if (!e)
        return -1;
    int code = (int)e->error->code;
    snprintf(msg, len, "%s", e->error->message);
    attnstat__envelope__free_unpacked(e, NULL);
    return code;
}

int sh_hello_with(dh_conn *c, const char *run, int32_t rank, const char *config, char *msg,
                  size_t len)
{
    Attnstat__Hello h;
    Attnstat__Envelope env;
    envelope_hello(&env, &h, run);
    h.has_rank = 1;
    h.rank = rank;
    h.config = (char *)config;
    ck_assert_int_eq(dh_send(c, &env), 0);
    Attnstat__Envelope *r = dh_recv(c, 20000);
    ck_assert_msg(r != NULL, "no reply to a Hello");
    int code = 0;
    msg[0] = '\0';
    if (r->msg_case == ATTNSTAT__ENVELOPE__MSG_ERROR) {
        code = (int)r->error->code;
        snprintf(msg, len, "%s", r->error->message);
    } else {
        ck_assert_int_eq(r->msg_case, ATTNSTAT__ENVELOPE__MSG_HELLO_REPLY);
    }
    attnstat__envelope__free_unpacked(r, NULL);
    return code;
}

void sh_wait_clients(dh_conn *w, uint32_t want)
{
    int64_t deadline = dh_now_ms() + 30000;
    for (;;) {
        Attnstat__Envelope *r = dh_status(w);
        uint32_t n = r->status_reply->clients;
        attnstat__envelope__free_unpacked(r, NULL);
        if (n == want)
            return;
        ck_assert_msg(dh_now_ms() < deadline, "the daemon counts %u connections, not %u", n, want);
        dh_sleep_ms(50);
    }
}

void sh_fill_computed(Attnstat__Computed *m, Attnstat__HeadStats *hs, Attnstat__HeadStats **ptrs,
                      size_t n, uint64_t seq, int64_t step, dh_rng *rng, int nonfinite)
{
    attnstat__computed__init(m);
    m->seq = seq;
    m->step = step;
    m->layer = 0;
    for (size_t h = 0; h < n; h++) {
        Attnstat__HeadStats *o = &hs[h];
        attnstat__head_stats__init(o);
        o->head = (uint32_t)h;
        o->rows = 64 + dh_next(rng) % 64;
        o->has_rows_norm = 1;
        o->rows_norm = o->rows - 1;
        o->has_entropy_mean = o->has_entropy_std = o->has_entropy_min = o->has_entropy_max = 1;
        o->entropy_mean = 2.0 + 0.5 * (double)(dh_next(rng) % 1000) / 1000.0;
        o->entropy_std = 0.05 + 0.01 * fabs(dh_gauss(rng));
        o->entropy_min = o->entropy_mean * 0.5;
        o->entropy_max = o->entropy_mean * 1.5;
        o->has_entropy_norm_mean = 1;
        o->entropy_norm_mean = o->entropy_mean / 4.0;
        o->has_collapsed_frac = 1;
        o->collapsed_frac = 0.0;
        o->has_max_logit = 1;
        o->max_logit = 3.0 + dh_gauss(rng);
        if (nonfinite) {
            o->has_nonfinite_rows = 1;
            o->nonfinite_rows = 1 + dh_next(rng) % 8;
        }
        ptrs[h] = o;
    }
    m->n_heads = n;
    m->heads = ptrs;
}

void sh_send_computed(dh_conn *c, Attnstat__Computed *m)
{
    Attnstat__Envelope env = ATTNSTAT__ENVELOPE__INIT;
    env.msg_case = ATTNSTAT__ENVELOPE__MSG_COMPUTED;
    env.computed = m;
    ck_assert_int_eq(dh_send(c, &env), 0);
}

int sh_computed_ack(dh_conn *c, uint64_t seq)
{
    for (;;) {
        Attnstat__Envelope *e = dh_recv(c, 30000);
        ck_assert_msg(e != NULL, "no Ack for Computed %llu", (unsigned long long)seq);
        int code = e->msg_case == ATTNSTAT__ENVELOPE__MSG_ACK && e->ack->seq == seq
                       ? (int)e->ack->code : -1;
        attnstat__envelope__free_unpacked(e, NULL);
        if (code >= 0)
            return code;
    }
}


void sh_count_message(const Attnstat__Envelope *e, const char *const *runs, int nruns,
                      sh_sub_seen *out)
{
    out->bytes += attnstat__envelope__get_packed_size(e) + 4;
    const char *run = e->msg_case == ATTNSTAT__ENVELOPE__MSG_RESULT  ? e->result->run
                      : e->msg_case == ATTNSTAT__ENVELOPE__MSG_ALERT ? e->alert->run
                                                                     : NULL;
    if (!run)
        return;
    int k = 0;
    while (k < nruns && strcmp(runs[k], run) != 0)
        k++;
    if (k == nruns)
        out->other++;
    else if (e->msg_case == ATTNSTAT__ENVELOPE__MSG_RESULT)
        out->results[k]++;
    else
        out->alerts[k]++;
}

void sh_drain_subscriber(dh_conn *c, const char *const *runs, int nruns, sh_sub_seen *out)
{
    dh_send_status(c);
    for (;;) {
        Attnstat__Envelope *e = dh_recv(c, 30000);
        ck_assert_msg(e != NULL, "the subscriber's stream ended before its StatusReply");
        int last = e->msg_case == ATTNSTAT__ENVELOPE__MSG_STATUS_REPLY;
        sh_count_message(e, runs, nruns, out);
        attnstat__envelope__free_unpacked(e, NULL);
        if (last)
            return;
    }
}

int sh_free_port(void)
{
    int probe = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ck_assert_int_eq(bind(probe, (struct sockaddr *)&a, sizeof a), 0);
    socklen_t al = sizeof a;
    ck_assert_int_eq(getsockname(probe, (struct sockaddr *)&a, &al), 0);
    close(probe);
    return ntohs(a.sin_port);
}

uint64_t sh_scrape_counter(int port, const char *name)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    ck_assert_int_ge(fd, 0);
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_port = htons((uint16_t)port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ck_assert_msg(connect(fd, (struct sockaddr *)&a, sizeof a) == 0, "connect :%d: %s", port,
                  strerror(errno));
    const char req[] = "GET /metrics HTTP/1.0\r\n\r\n";
    ck_assert_int_eq(dh_write_all(fd, req, sizeof req - 1), 0);
    size_t cap = 1 << 20, n = 0;
    char *buf = malloc(cap);
    ck_assert_ptr_nonnull(buf);
    for (;;) {
        struct pollfd pf = {fd, POLLIN, 0};
        ck_assert_msg(poll(&pf, 1, 20000) > 0, "no /metrics page in 20 s");
        ssize_t r = read(fd, buf + n, cap - 1 - n);
        if (r <= 0)
            break;
        n += (size_t)r;
        ck_assert(n < cap - 1);
    }
    buf[n] = '\0';
    close(fd);
    char line[128];
    snprintf(line, sizeof line, "\n%s ", name);
    const char *at = strstr(buf, line);
    ck_assert_msg(at != NULL, "%s is not on /metrics", name);
    uint64_t v = strtoull(at + strlen(line), NULL, 10);
    free(buf);
    return v;
}
