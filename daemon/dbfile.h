/* dbfile.h — the database file as the operating system sees it, before the store opens it: one
 * daemon per database (a lock), who may read it (its mode), and whether it is whole (the check at
 * start). Stage: start-up (loop.c calls it before and right after store_open); calls the store's
 * checks (store_read.h), util and log. Loop thread only.
 *
 * - The lock: DB.lock beside the database, held with flock() for the daemon's life and holding its
 *   pid. A second daemon on the same database stops with an error naming the first one's pid. The
 *   kernel drops the lock when the process dies (kill -9 too): a lock file left behind holds
 *   nothing, and the next daemon takes it.
 * - The mode: the daemon runs under umask 0077, or 0027 with --allow-group (the group may read the
 *   history with the CLI); a database it creates is 0600 (0640, owned by the allowed group), and
 *   SQLite gives its -wal and -shm files the database's mode. An existing database readable by
 *   every user is reported (not changed).
 * - The check: PRAGMA quick_check (db_check = quick, the default), integrity_check (full) or none;
 *   a damaged database is refused with the problems found and what to do. */
#ifndef ATTNSTAT_DBFILE_H
#define ATTNSTAT_DBFILE_H

#include <stddef.h>
#include <sys/types.h>

#include "config.h"

typedef struct store store;

/* Sets the daemon's umask (0077, or 0027 when allow_group is set) and logs it. */
void dbfile_umask(const cfg *c);

/* Takes the lock of the database at db_path (creating DB.lock). Returns its descriptor (keep it
 * open while the database is used), or -1 with err set: another daemon holds it (its pid named),
 * or the lock file cannot be made (permission, a missing directory: which one, said). */
int dbfile_lock(const char *db_path, char *err, size_t errlen);
/* Releases the lock (the file stays: it holds nothing once closed). */
void dbfile_unlock(int fd);

/* Before store_open: creates a missing database file with the daemon's mode (group set to
 * allow_group when given, gid >= 0), or reports an existing one that every user may read. 0, or -1
 * with err set (permission or a missing directory, told apart). */
int dbfile_prepare(const char *db_path, int have_gid, gid_t gid, char *err, size_t errlen);

/* After store_open: the check db_check names. 0, or -1 with err saying what is damaged and what
 * to do. */
int dbfile_check(store *db, const char *db_path, const char *db_check, char *err, size_t errlen);

/* "permission denied (...)" or "no such file or directory" and friends, for an errno of path:
 * names the directory that is missing or not searchable. */
void dbfile_why(int e, const char *path, char *buf, size_t len);

#endif /* ATTNSTAT_DBFILE_H */
