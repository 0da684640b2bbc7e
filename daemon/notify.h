/* notify.h — telling a service manager how attnstatd stands (systemd's notification protocol, as
 * Type=notify units use it): one datagram of "KEY=value" lines sent to the Unix socket named by
 * $NOTIFY_SOCKET ("/path" or "@abstract-name"). Without $NOTIFY_SOCKET (the daemon was not started
 * by systemd with Type=notify, or by a test standing in for it) a call does nothing. No libsystemd.
 *
 * What the loop says: "READY=1" (with STATUS= and MAINPID=) once every stage serves and the socket
 * accepts connections; "STOPPING=1" when the shutdown begins; on SIGHUP, "RELOADING=1" (with
 * MONOTONIC_USEC=) when the reload starts and "READY=1" when it is done.
 *
 * Stage: none (a leaf the loop calls); includes libc only. */
#ifndef ATTNSTAT_NOTIFY_H
#define ATTNSTAT_NOTIFY_H

#include <stddef.h>

/* Sends state ("READY=1\nSTATUS=...") to $NOTIFY_SOCKET. Returns 1 when sent, 0 when there is no
 * $NOTIFY_SOCKET, -1 with err set (the socket's name and why) when it could not be sent. */
int notify_send(const char *state, char *err, size_t errlen);

#endif /* ATTNSTAT_NOTIFY_H */
