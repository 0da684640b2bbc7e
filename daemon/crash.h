/* crash.h — a daemon's last words: a fatal signal (SIGSEGV, SIGFPE, SIGILL, SIGABRT) writes one
 * line naming it, where and in which thread, and a backtrace to stderr (the log, journald's stream
 * under systemd), then takes the signal's default action, so that the exit status (and a core,
 * where the limits allow one) is the one it would have been: systemd's Restart=on-failure acts on
 * it and clients reconnect on their own. Not installed under AddressSanitizer, whose reports say
 * more. Stage: server (main.c calls it once, before any thread starts); includes nothing of the
 * daemon's. */
#ifndef ATTNSTAT_CRASH_H
#define ATTNSTAT_CRASH_H

/* journal: stderr is journald's (the line then carries the critical priority). 0, or -1 with
 * errno when a handler could not be installed (the daemon runs on without it). */
int crash_install(int journal);

#endif
