/* loop.h — attnstatd's event loop: start-up, the one place where the stages are wired together,
 * signals and orderly shutdown. Stage: the loop, above every other; main.c calls it. */
#ifndef ATTNSTAT_LOOP_H
#define ATTNSTAT_LOOP_H

#include "config.h"

/* Runs the daemon with the settings c until SIGINT/SIGTERM; SIGHUP reloads c in place
 * (cfg_reload: what may change live, each change logged). Returns the process exit status: 0
 * after a clean shutdown, 1 when start-up failed or the shutdown was not clean (logged). */
int loop_run(cfg *c);

#endif /* ATTNSTAT_LOOP_H */
