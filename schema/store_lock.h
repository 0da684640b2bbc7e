/* store_lock.h — one writer per database FILE, whatever path names it. A lock taken by path (a
 * DB.lock beside the database) lets a hard link or a symbolic link to the same file start a
 * second writer: two WALs on one database, acknowledged samples lost. This lock is held on the
 * database file itself, so every name of the file meets it.
 *
 * How: an open file description lock (fcntl F_OFD_SETLK) on the database file, at bytes far past
 * any SQLite locks (SQLite's POSIX locks sit in the page at 1 GiB, its WAL locks in the -shm file:
 * neither conflicts with these), held for as long as the descriptor is open. The kernel drops it
 * when the process dies, kill -9 included. Besides one byte that is the lock, the holder locks
 * the byte STORE_LOCK_BASE + 1 + its pid, so that the next one can name it (F_OFD_GETLK on that
 * range says where it is; an OFD lock itself carries no pid).
 *
 * Ordering with SQLite: closing any descriptor of a file drops every POSIX lock the process holds
 * on it, SQLite's included. Take the lock before the store opens the database and release it only
 * after the store is closed.
 *
 * Used by attnstatd (daemon/dbfile.c) for its life, and by what writes a database with no daemon
 * running. Includes nothing of the store. */
#ifndef ATTNSTAT_STORE_LOCK_H
#define ATTNSTAT_STORE_LOCK_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The lock's byte (the pid bytes follow it): 2^62, past any database and SQLite's lock bytes. */
#define STORE_LOCK_BASE (1ll << 62)

/* store_lock_take() could not lock because another process holds the lock. */
#define STORE_LOCK_HELD (-2)
/* store_lock_take() could not lock because the file system has no such locks (ENOLCK, EINVAL). */
#define STORE_LOCK_UNSUPPORTED (-3)

/* Takes the writer's lock of the database file at path (symbolic links followed: the file SQLite
 * opens). The file must exist. Returns the descriptor that holds it (>= 0: keep it open while the
 * database is written), or:
 *   STORE_LOCK_HELD         another process holds it; *holder its pid (0: not known);
 *   STORE_LOCK_UNSUPPORTED  the file system takes no such lock (err says so);
 *   -1                      the file cannot be opened for writing (err names the cause).
 * holder may be NULL. */
int store_lock_take(const char *path, long *holder, char *err, size_t errlen);

/* Releases the lock (closes fd; a negative fd is allowed). After store_close() only. */
void store_lock_release(int fd);

#ifdef __cplusplus
}
#endif

#endif /* ATTNSTAT_STORE_LOCK_H */
