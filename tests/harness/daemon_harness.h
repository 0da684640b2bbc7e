/* daemon_harness.h — what the end-to-end suites (test_daemon_*.c, test_client_e2e.c) share: start a
 * real attnstatd from the build tree on a socket and database in a fresh mkdtemp directory, talk
 * raw frames to it (no libattnstat; every message built by proto/envelope.h), put tensors in POSIX
 * shared memory, and read the database back with sqlite3; and, with the unit tests (tests/unit/),
 * a printed seed for random data and the suite runner. Built once (daemon_harness.c, the
 * attnstat_daemon_harness library); the suites link it.
 *
 * Failures are Check assertions (ck_assert*): call these from a test (or its fixture), where a
 * failed assertion ends the test. The daemon binary is the one the build made (ATTNSTATD_PATH,
 * given to the library by CMake). */
#ifndef ATTNSTAT_DAEMON_HARNESS_H
#define ATTNSTAT_DAEMON_HARNESS_H

/* The system headers a suite of processes, sockets, signals, files and shared memory needs: the
 * suites include this header first and get them all. */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <sqlite3.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "attnstat.pb-c.h"
#include "envelope.h"
#include "frame.h"
#include "stats.h"

/* ---- time and randomness -------------------------------------------------------------------- */

int64_t dh_now_ms(void);                 /* monotonic */
void dh_sleep_ms(int ms);

typedef struct {
    uint64_t s;
} dh_rng;

uint64_t dh_next(dh_rng *r);             /* splitmix64 */
double dh_gauss(dh_rng *r);              /* N(0, 1) */
/* A fresh seed per run, printed with who (ATTNSTAT_TEST_SEED replays one). */
dh_rng dh_rng_new(const char *who);
uint16_t dh_f32_to_bf16(float f);        /* round to nearest even (finite inputs) */

/* Runs every test of s (Check's runner, CK_NORMAL) and frees it: the exit status of a suite's
 * main, 0 when every test passed, 1 otherwise. */
int dh_run(Suite *s);

/* ---- the daemon process --------------------------------------------------------------------- */

typedef struct {
    pid_t pid;
    char dir[64];
    char sock[100];
    char db[300];
    char log[300];
} dh_daemon;

/* A fresh directory with the socket, database and log paths in it (nothing started). */
void dh_dir_init(dh_daemon *d);
/* A connected socket to path, or -1. */
int dh_try_connect(const char *path);
/* Starts attnstatd with --socket/--db in d's directory, --log-level debug and the extra flags
 * (NULL-terminated), its output in d->log; returns once it accepts connections. */
void dh_start_v(dh_daemon *d, const char *const *extra);
/* The same with the extra flags as arguments, ended by (const char *)NULL. */
void dh_start(dh_daemon *d, ...);
/* Waits for the daemon to exit (timeout_ms); returns its wait status, or -1 on timeout. */
int dh_wait(dh_daemon *d, int timeout_ms);
/* SIGTERM and wait: returns the exit status (asserts a normal exit within 30 s). */
int dh_stop(dh_daemon *d);
void dh_kill9(dh_daemon *d);
/* Kills a daemon still running, prints the end of its log to stderr when show_log (for failures)
 * and removes the directory. */
void dh_cleanup(dh_daemon *d, int show_log);

/* ---- frames --------------------------------------------------------------------------------- */

/* Every Release and Ack that dh_recv reads is remembered (rings of the last 1024), whoever asked
 * for the message: a reply read while waiting for another kind (dh_expect, dh_status) is not lost
 * to dh_wait_ack, however fast the daemon answers. */
typedef struct {
    uint64_t seq;
    int code;
    int released_first; /* the push's Release had been read before this Ack */
} dh_ack_seen;
typedef struct {
    int fd;
    frame_reader rd;
    uint64_t released[1024]; /* seqs whose Release was read, ring */
    size_t nreleased;
    dh_ack_seen acked[1024]; /* Acks read, ring */
    size_t nacked;
} dh_conn;

void dh_connect(dh_conn *c, const dh_daemon *d);
void dh_close(dh_conn *c);
int dh_write_all(int fd, const void *buf, size_t n);
/* A TCP port of 127.0.0.1 free now (for --metrics-port). */
int dh_free_port(void);
/* GET /metrics from 127.0.0.1:port into buf (the whole response, NUL-terminated; cut at cap). */
void dh_scrape(int port, char *buf, size_t cap);
/* Frames and sends env. Returns 0, or -1 when the write failed. */
int dh_send(dh_conn *c, const Attnstat__Envelope *env);
/* Next message, or NULL on timeout / EOF / bad frame. Free with attnstat__envelope__free_unpacked. */
Attnstat__Envelope *dh_recv(dh_conn *c, int timeout_ms);
/* Next message of the given kind, skipping others (Release, Result...). NULL on timeout/EOF. */
Attnstat__Envelope *dh_expect(dh_conn *c, Attnstat__Envelope__MsgCase kind, int timeout_ms);
/* True when the peer closed the connection within timeout_ms (reads and discards messages). */
int dh_wait_closed(dh_conn *c, int timeout_ms);

/* Hello (with thresholds th, may be NULL) and its HelloReply, asserted; *run_id gets the run id
 * when run_id is not NULL. */
void dh_hello_th(dh_conn *c, const char *run, int rank, const Attnstat__Thresholds *th,
                 int64_t *run_id);
void dh_hello(dh_conn *c, const char *run, int rank, int64_t *run_id);
/* dh_hello_th, and the HelloReply's features must list `feature` (the daemon takes it). */
void dh_hello_lists(dh_conn *c, const char *run, int rank, const Attnstat__Thresholds *th,
                    const char *feature, int64_t *run_id);
/* RegisterBuffer of a shared-memory segment (nothing awaited). */
void dh_register(dh_conn *c, uint32_t id, const char *shm, uint64_t size);
/* Subscribe (nothing awaited). */
void dh_subscribe(dh_conn *c, int alerts, int results);
/* Status, sent (the reply is the caller's to read). */
void dh_send_status(dh_conn *c);
/* Status sent and its StatusReply returned (free it). */
Attnstat__Envelope *dh_status(dh_conn *c);

/* ---- shared memory and tensors -------------------------------------------------------------- */

typedef struct {
    char name[64];
    void *ptr;
    size_t size;
} dh_shm;

void dh_shm_create(dh_shm *s, const char *tag, size_t size);
void dh_shm_destroy(dh_shm *s);

/* A tensor description in [B, H, N, D] layout in a buffer at an offset. */
typedef struct {
    uint32_t buffer_id;
    uint64_t offset;
    Attnstat__Dtype dtype;
    uint64_t shape[4];
    uint64_t strides[4];
} dh_tensor;

/* Contiguous [b, h, n, d] at off in buffer buf. */
void dh_tensor_contig(dh_tensor *t, uint32_t buf, uint64_t off, Attnstat__Dtype dt, uint64_t b,
                      uint64_t h, uint64_t n, uint64_t d);
uint64_t dh_tensor_elems(const dh_tensor *t);
/* The wire's TensorRef of t (pointing at t's shape and strides). */
void dh_tensor_ref(Attnstat__TensorRef *r, dh_tensor *t);
/* Fills n elements at p with scale * N(0,1) values of the dtype (F32, else BF16). */
void dh_fill(dh_rng *r, void *p, uint64_t n, Attnstat__Dtype dt, double scale);
/* The stats_problem equivalent of a q/k pair in host memory (for the reference computation). */
void dh_problem(stats_problem *p, const dh_tensor *q, const void *qbase, const dh_tensor *k,
                const void *kbase);

/* One trainer process: its connection (Hello done), a shared-memory segment registered as
 * buffer 1 holding q then k, float32 [1, heads, n, d] each with fresh N(0, 1) values, and the
 * pushes' sequence numbers so far (seq, the caller's to advance). */
typedef struct {
    dh_conn c;
    dh_shm shm;
    dh_tensor q, k;
    int64_t run_id;
    uint64_t seq;
} dh_proc;

/* Opens p on d: run and rank said in Hello, tag names the segment. */
void dh_proc_open(dh_proc *p, const dh_daemon *d, dh_rng *r, const char *run, int rank,
                  const char *tag, uint64_t heads, uint64_t n, uint64_t dim);
void dh_proc_close(dh_proc *p);

/* Sends a Push of q/k (sample_rows 0: every row; else that many, seeded by the step). */
void dh_push(dh_conn *c, uint64_t seq, int64_t step, uint32_t layer, dh_tensor *q, dh_tensor *k,
             int causal, uint32_t sample_rows, int want_results);
/* Waits for the Ack of seq (asserting the Release came first for OK acks); returns its code and
 * copies its message. */
int dh_wait_ack(dh_conn *c, uint64_t seq, char *msg, size_t msglen, int timeout_ms);

/* ---- the database ------------------------------------------------------------------------- */

sqlite3 *dh_db_open(const dh_daemon *d);   /* read-only */
/* One integer / text from a query (asserts one row). */
int64_t dh_db_int(sqlite3 *db, const char *sql);
void dh_db_text(sqlite3 *db, const char *sql, char *out, size_t n);
/* Equal within 1e-9 relative (NaN equals NaN, infinities exactly). */
int dh_close_enough(double a, double b);
/* A statistic the daemon computed (the production CPU backend, stats_cpu_fast_ws) against
 * stats_cpu() on the same data: within 1e-5 relative, 1e-5 absolute near zero (NaN equals NaN,
 * infinities exactly). tests/unit/test_stats_fast.c checks the backend itself, tighter. */
int dh_close_to_reference(double got, double ref);

#endif /* ATTNSTAT_DAEMON_HARNESS_H */
