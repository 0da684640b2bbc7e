/* dbfile.h — the database file as the operating system sees it, before the store opens it: one
 * daemon per database (a lock), who may read it (its mode), and whether it is whole (the check at
 * start). Stage: start-up (loop.c calls it before and right after store_open); calls the store's
 * checks (store_read.h), util and log. Loop thread only.
 *
 * - The locks, held for the daemon's life: the database file itself (store_lock.h: an open file
 *   description lock, so that a hard link or a symbolic link to the same file meets it too), and
 *   DB.lock beside the path it was given (flock, holding its pid: what `attnstat delete-run` with
 *   no daemon takes). A second daemon on the same database stops with an error naming the first
 *   one's pid. The kernel drops both when the process dies (kill -9 too): a lock file left behind
 *   holds nothing, and the next daemon takes it.
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

/* The descriptors that hold the locks (-1: none). */
typedef struct {
    int path_fd;             /* DB.lock */
    int file_fd;             /* the database file's own lock */
} dbfile_locks;
#define DBFILE_LOCKS_NONE {-1, -1}

/* Takes the locks of the database at db_path, which exists (dbfile_prepare() first): DB.lock
 * (created), then the file's own. 0 (keep them while the database is used), or -1 with err set:
 * another daemon holds one (its pid named; by another path, said), or the lock file cannot be made
 * or the database opened (permission, a missing directory: which one, said). A file system that
 * takes no file lock is logged, and DB.lock alone then holds. */
int dbfile_lock(const char *db_path, dbfile_locks *out, char *err, size_t errlen);
/* Releases both, after store_close() (the lock files stay: they hold nothing once closed). */
void dbfile_unlock(dbfile_locks *l);

/* Before dbfile_lock and store_open: creates a missing database file with the daemon's mode
 * (group set to allow_group when given, gid >= 0), or reports an existing one that every user may
 * read. 0, or -1 with err set (permission or a missing directory, told apart). */
int dbfile_prepare(const char *db_path, int have_gid, gid_t gid, char *err, size_t errlen);

/* After store_open: the check db_check names. 0, or -1 with err saying what is damaged and what
 * to do. */
int dbfile_check(store *db, const char *db_path, const char *db_check, char *err, size_t errlen);

/* "permission denied (...)" or "no such file or directory" and friends, for an errno of path:
 * names the directory that is missing or not searchable. */
void dbfile_why(int e, const char *path, char *buf, size_t len);

#endif /* ATTNSTAT_DBFILE_H */
