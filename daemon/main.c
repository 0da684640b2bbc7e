/* main.c — attnstatd's entry point: settings from the config table (flags, --config file), then
 * the event loop (loop.h) until SIGINT/SIGTERM (SIGHUP reloads the settings). Exit status 0 after a clean shutdown, 1 when
 * start-up failed (the log says why), 2 on a bad command line or config file. The only file of the
 * daemon outside its library (attnstatd_core); calls config, log, crash and loop. */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "config.h"
#include "crash.h"
#include "log.h"
#include "loop.h"

int main(int argc, char **argv)
{
    setvbuf(stderr, NULL, _IOLBF, 0);
    cfg c;
    char err[600];
    if (cfg_init(&c, err, sizeof err) != 0) {
        fprintf(stderr, "attnstatd: %s\n", err);
        return 2;
    }
    int rc = cfg_parse_args(&c, argc, argv, err, sizeof err);
    if (rc != 0) {
        if (rc < 0)
            fprintf(stderr, "attnstatd: %s\n", err);
        cfg_free(&c);
        return rc < 0 ? 2 : 0;
    }
    log_set_level(c.log_level);
    int journal = log_detect_journal();
    if (journal)
        LOG_DEBUG("server", "stderr is journald's stream: lines carry syslog priorities");
    if (crash_install(journal) != 0)
        LOG_WARN("server", "cannot install the fatal-signal handler (%s): a crash will leave no "
                 "backtrace in the log", strerror(errno));
    cfg_log(&c);
    rc = loop_run(&c);
    cfg_free(&c);
    return rc;
}
