/* cli_harness.h — what the suites that drive the attnstat CLI and libattnstat against a real
 * attnstatd share (test_client_e2e.c, test_cli.c, test_client_restart.c): running the attnstat
 * binary (to its end, or in the background) and reading what it printed, waiting for a text to
 * appear, picking numbers and strings out of its JSON lines, a trainer (a connected client that
 * pushes random steps), and the runner of a suite.
 *
 * Knows nothing of how the daemon is started: it is given a scratch folder and a socket path. */
#ifndef ATTNSTAT_CLI_HARNESS_H
#define ATTNSTAT_CLI_HARNESS_H

#include <check.h>
#include <sqlite3.h>
#include <stdint.h>
#include <sys/types.h>

#include "attnstat.h"
#include "stats_testutil.h"

typedef struct {
    int status;      /* exit status, or -1 when it did not exit normally */
    char *out, *err; /* NUL-terminated, malloc'd */
} cli_result;

/* The attnstat binary under test. */
const char *cli_binary(void);

/* Runs the attnstat binary with args (NULL-terminated), stdout and stderr into files of dir, and
 * waits for it (killed after 120 s: status -1). */
cli_result cli_run_v(const char *dir, const char *const *args);
#define cli_run(dir, ...) cli_run_v((dir), (const char *const[]){__VA_ARGS__, NULL})
void cli_result_free(cli_result *r);

/* Starts the attnstat binary with args (NULL-terminated) in the background, its stdout into the
 * file out_path and its stderr into err_path (created afresh). Returns its pid. */
pid_t cli_spawn_v(const char *out_path, const char *err_path, const char *const *args);
#define cli_spawn(out, err, ...) cli_spawn_v((out), (err), (const char *const[]){__VA_ARGS__, NULL})

/* Waits until the file at path holds needle at least n times and returns how many times (a
 * condition, not a time: it fails the test, showing the file, only after timeout_ms, or when the
 * process pid (if > 0) exited first). */
int cli_wait_text(const char *path, const char *needle, int n, pid_t pid, int timeout_ms);
/* How many times needle stands in s. */
int cli_count_text(const char *s, const char *needle);

/* A whole file, NUL-terminated and malloc'd ("" when it cannot be read). */
char *cli_slurp(const char *path);

/* The number after "key": in a JSON line (NaN for null or absent). */
double cli_json_num(const char *line, const char *key);
/* 1 when the JSON line has "key": "strval". */
int cli_json_has(const char *line, const char *key, const char *strval);
int cli_count_lines(const char *s);

/* A client connected to sock that said hello for run with rank and thresholds (may be NULL);
 * ring and queue bytes 0 for the defaults. Fails the test when it cannot. */
attnstat_client *cli_trainer(const char *sock, const char *run, int32_t rank,
                             const attnstat_thresholds *th, uint64_t ring, uint64_t queue);

/* A host tensor of libattnstat describing t. */
attnstat_tensor cli_tensor(const tu_tensor *t);

/* Pushes steps [from, to) of `layers` layers of 4 heads, N=32, D=32, bf16, with Q scaled by amp
 * (large amp: max logits over any small ceiling; tiny amp: logits near 0), then flushes. */
void cli_push_steps(attnstat_client *c, tu_rng *rng, int from, int to, int layers, double amp);

/* The database at path opened for writing (with the daemon stopped), and the ids of the runs
 * called names[0..n) (each must exist) in ids. Close it with sqlite3_close. */
sqlite3 *cli_db_runs(const char *path, const char *const *names, int n, int64_t *ids);

/* Runs tests[0..n) as one suite (600 s each at most); returns the test program's exit status. */
int cli_run_tests(const char *suite, const TTest *const *tests, int n);

#endif /* ATTNSTAT_CLI_HARNESS_H */
