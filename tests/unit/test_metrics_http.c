/* test_metrics_http.c — unit tests of the metrics port (daemon/metrics.c, metrics_http_*) on a
 * loop driven here, no daemon: a scrape is answered with what the render function wrote; a
 * connection for which no scrape could be made (its memory refused: calloc fails, through the
 * linker's --wrap) is closed at once and the port keeps answering, also when two such connections
 * arrive together (the second waits for the first one's close). libuv stops polling a listener
 * whose connection callback did not accept: before the fix the port answered nothing more after
 * one refused allocation. After each test every handle is closed and the loop closes cleanly. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <uv.h>

#include "daemon_harness.h" /* seeds, the runner, and the usual system headers */
#include "metrics.h"

/* calloc through the linker's --wrap=calloc (tests/CMakeLists.txt): fails the next fail_callocs
 * calls made by the daemon's objects linked here (libuv's own, a shared library, are not). */
void *__real_calloc(size_t n, size_t size);
void *__wrap_calloc(size_t n, size_t size);
static int fail_callocs;

void *__wrap_calloc(size_t n, size_t size)
{
    if (fail_callocs > 0) {
        fail_callocs--;
        return NULL;
    }
    return __real_calloc(n, size);
}

static dh_rng R;
static char body[64]; /* what each scrape says: fresh per test */

static void render(void *ctx, metrics_buf *out)
{
    (void)ctx;
    metrics_printf(out, "%s\n", body);
}

static uv_loop_t loop;
static metrics_http *h;
static int port;

static void start(void)
{
    ck_assert_int_eq(uv_loop_init(&loop), 0);
    snprintf(body, sizeof body, "attnstat_test_value %llu", (unsigned long long)dh_next(&R));
    char err[256] = "";
    for (int tries = 0; !h && tries < 20; tries++) {
        port = dh_free_port();
        h = metrics_http_start(&loop, "127.0.0.1", port, 10000, render, NULL, err, sizeof err);
    }
    ck_assert_msg(h != NULL, "%s", err);
}

static void stop(void)
{
    metrics_http_stop(h);
    h = NULL;
    for (int i = 0; i < 1000 && uv_run(&loop, UV_RUN_NOWAIT) != 0; i++)
        ;
    ck_assert_int_eq(uv_loop_close(&loop), 0);
}

static int connect_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    ck_assert_int_ge(fd, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ck_assert_int_eq(connect(fd, (struct sockaddr *)&a, sizeof a), 0); /* the kernel's backlog */
    return fd;
}

/* Runs the loop until fd is closed by the daemon's side; what it sent goes to buf. Returns 1 when
 * it closed within timeout_ms, 0 if not. */
static int pump_until_closed(int fd, char *buf, size_t cap, int timeout_ms)
{
    size_t len = 0;
    buf[0] = '\0';
    int64_t end = dh_now_ms() + timeout_ms;
    while (dh_now_ms() < end) {
        uv_run(&loop, UV_RUN_NOWAIT);
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (poll(&p, 1, 5) <= 0)
            continue;
        ssize_t n = recv(fd, buf + len, cap - 1 - len, 0);
        if (n <= 0)
            return 1; /* EOF, or reset: closed either way */
        len += (size_t)n;
        buf[len] = '\0';
        if (len + 1 >= cap)
            return 0;
    }
    return 0;
}

static void scrape_ok(const char *what)
{
    int fd = connect_port();
    static const char req[] = "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
    ck_assert_int_eq(dh_write_all(fd, req, sizeof req - 1), 0);
    static char buf[1 << 16];
    ck_assert_msg(pump_until_closed(fd, buf, sizeof buf, 5000), "%s: the scrape was not answered",
                  what);
    close(fd);
    ck_assert_msg(strstr(buf, "200 OK") && strstr(buf, body), "%s: the answer was:\n%s", what, buf);
}

START_TEST(test_scrape_answered)
{
    start();
    scrape_ok("a scrape");
    scrape_ok("a second scrape");
    stop();
}
END_TEST

START_TEST(test_no_memory_closes_and_keeps_serving)
{
    start();
    scrape_ok("before");
    int n = 2 + (int)(dh_next(&R) % 2); /* 2 or 3 arriving together: the later ones wait */
    int fds[3];
    for (int i = 0; i < n; i++)
        fds[i] = connect_port();
    fail_callocs = n;
    char buf[256];
    for (int i = 0; i < n; i++) {
        ck_assert_msg(pump_until_closed(fds[i], buf, sizeof buf, 5000),
                      "connection %d of %d with no scrape was left open", i + 1, n);
        ck_assert_str_eq(buf, "");
        close(fds[i]);
    }
    ck_assert_int_eq(fail_callocs, 0);
    scrape_ok("after the refused allocations");
    stop();
}
END_TEST

int main(void)
{
    R = dh_rng_new("test_metrics_http");
    signal(SIGPIPE, SIG_IGN);
    Suite *s = suite_create("metrics_http");
    TCase *tc = tcase_create("metrics_http");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_scrape_answered);
    tcase_add_test(tc, test_no_memory_closes_and_keeps_serving);
    suite_add_tcase(s, tc);
    return dh_run(s);
}
