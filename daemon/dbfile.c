/* dbfile.c — the database file's lock, mode and check at start (see dbfile.h). Stage: start-up;
 * calls the store's checks, util and log. */
#include "dbfile.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "log.h"
#include "store_lock.h"
#include "store_read.h"
#include "util.h"

void dbfile_umask(const cfg *c)
{
    mode_t m = c->allow_group && c->allow_group[0] ? 0027 : 0077;
    mode_t old = umask(m);
    LOG_INFO("server", "umask %04o (was %04o): the database and its -wal/-shm files are mode %04o",
             (unsigned)m, (unsigned)old, (unsigned)(0666 & ~m));
}

void dbfile_why(int e, const char *path, char *buf, size_t len)
{
    if (e != ENOENT && e != EACCES && e != ENOTDIR) {
        snprintf(buf, len, "%s", strerror(e));
        return;
    }
    /* Up from path to the first directory that can be looked at: the one below it is what is
     * missing, or that directory is closed to this uid. */
    char dir[4096], below[4096];
    snprintf(dir, sizeof dir, "%s", path);
    snprintf(below, sizeof below, "%s", path);
    for (;;) {
        char *slash = strrchr(dir, '/');
        if (!slash)
            snprintf(dir, sizeof dir, ".");
        else if (slash == dir)
            dir[1] = '\0';
        else
            *slash = '\0';
        struct stat sb;
        if (stat(dir, &sb) == 0) {
            if (!S_ISDIR(sb.st_mode))
                snprintf(buf, len, "%.300s is not a directory", dir);
            else if (access(dir, W_OK | X_OK) != 0)
                snprintf(buf, len, "permission denied: uid %u may not create files in %.300s "
                         "(mode %04o, owner uid %u)", (unsigned)getuid(), dir,
                         (unsigned)(sb.st_mode & 07777), (unsigned)sb.st_uid);
            else if (e == ENOENT && strcmp(below, path) != 0)
                snprintf(buf, len, "no such directory: %.300s", below);
            else
                snprintf(buf, len, "%s", strerror(e));
            return;
        }
        if (errno == EACCES) {
            snprintf(buf, len, "permission denied: uid %u cannot look into %.300s (a directory "
                     "above it is closed to it)", (unsigned)getuid(), dir);
            return;
        }
        if (strcmp(dir, "/") == 0 || strcmp(dir, ".") == 0) {
            snprintf(buf, len, "%s", strerror(e));
            return;
        }
        snprintf(below, sizeof below, "%s", dir);
    }
}

/* The lock by path (DB.lock, flock): what older attnstatd and `attnstat delete-run` with no
 * daemon take. fd, or -1 with err set. */
static int lock_path(const char *db_path, char *err, size_t errlen)
{
    char path[4200];
    snprintf(path, sizeof path, "%s.lock", db_path);
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0666);
    if (fd < 0) {
        char why[400];
        dbfile_why(errno, path, why, sizeof why);
        return util_err(err, errlen, "cannot create the lock file %s: %s", path, why);
    }
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
        int e = errno;
        char buf[32] = "";
        ssize_t n = pread(fd, buf, sizeof buf - 1, 0);
        buf[n > 0 ? n : 0] = '\0';
        close(fd);
        long pid = strtol(buf, NULL, 10);
        if (e == EWOULDBLOCK)
            return util_err(err, errlen, "the database %s is in use by another attnstatd (pid %ld, "
                            "lock %s): stop that one, or give this one another --db", db_path,
                            pid, path);
        return util_err(err, errlen, "cannot lock %s: %s", path, strerror(e));
    }
    char pid[32];
    int n = snprintf(pid, sizeof pid, "%ld\n", (long)getpid());
    if (ftruncate(fd, 0) != 0 || pwrite(fd, pid, (size_t)n, 0) != n)
        LOG_WARN("server", "lock file %s: cannot write the pid: %s", path, strerror(errno));
    return fd;
}

int dbfile_lock(const char *db_path, dbfile_locks *out, char *err, size_t errlen)
{
    out->path_fd = out->file_fd = -1;
    out->path_fd = lock_path(db_path, err, errlen);
    if (out->path_fd < 0)
        return -1;
    long holder = 0;
    char why[600];
    int fd = store_lock_take(db_path, &holder, why, sizeof why);
    if (fd == STORE_LOCK_HELD) {
        char real[4096];
        const char *name = realpath(db_path, real) ? real : db_path;
        util_err(err, errlen, "the database %s is in use by another attnstatd (pid %ld), which "
                 "opened the same file by another path (a hard link or a symbolic link: %s is "
                 "one database, whatever names it): stop that one, or give this one another --db",
                 db_path, holder, name);
        dbfile_unlock(out);
        return -1;
    }
    if (fd == STORE_LOCK_UNSUPPORTED) {
        LOG_WARN("server", "%s: only the lock file %s.lock keeps a second attnstatd away, and "
                 "only one that names the database by this very path (no hard link or symbolic "
                 "link to it)", why, db_path);
        return 0;
    }
    if (fd < 0) {
        util_err(err, errlen, "the database %s: %s", db_path, why);
        dbfile_unlock(out);
        return -1;
    }
    out->file_fd = fd;
    return 0;
}

void dbfile_unlock(dbfile_locks *l)
{
    store_lock_release(l->file_fd); /* after store_close(): see store_lock.h */
    if (l->path_fd >= 0)
        close(l->path_fd); /* the flock goes with the last descriptor */
    l->file_fd = l->path_fd = -1;
}

int dbfile_prepare(const char *db_path, int have_gid, gid_t gid, char *err, size_t errlen)
{
    struct stat sb;
    if (stat(db_path, &sb) == 0) {
        if (sb.st_mode & 0004)
            LOG_WARN("server", "database %s is mode %04o: every user of this host can read it "
                     "(chmod o-rwx %s to keep it to the daemon%s)", db_path,
                     (unsigned)(sb.st_mode & 07777), db_path, have_gid ? " and its group" : "");
        return 0;
    }
    if (errno != ENOENT) {
        char why[400];
        dbfile_why(errno, db_path, why, sizeof why);
        return util_err(err, errlen, "database %s: %s", db_path, why);
    }
    mode_t mode = have_gid ? 0640 : 0600;
    int fd = open(db_path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, mode);
    if (fd < 0) {
        if (errno == EEXIST)
            return 0;
        char why[400];
        dbfile_why(errno, db_path, why, sizeof why);
        return util_err(err, errlen, "cannot create the database %s: %s", db_path, why);
    }
    if (have_gid && fchown(fd, (uid_t)-1, gid) != 0)
        LOG_WARN("server", "database %s: cannot give it to the allowed group (gid %u): %s; its "
                 "members cannot read the history", db_path, (unsigned)gid, strerror(errno));
    if (fchmod(fd, mode) != 0)
        LOG_WARN("server", "database %s: chmod %04o: %s", db_path, (unsigned)mode, strerror(errno));
    close(fd);
    LOG_INFO("server", "created the database %s (mode %04o)", db_path, (unsigned)mode);
    return 0;
}

int dbfile_check(store *db, const char *db_path, const char *db_check, char *err, size_t errlen)
{
    if (!db_check || strcmp(db_check, "off") == 0) {
        LOG_INFO("server", "database check at start: off (db_check)");
        return 0;
    }
    int full = strcmp(db_check, "full") == 0;
    uint64_t t0 = util_mono_ns();
    store_error se = {0, ""};
    store_status st = full ? store_integrity_check(db, &se) : store_quick_check(db, &se);
    if (st != STORE_OK)
        return util_err(err, errlen, "the database %s is damaged: %s. Stop here: move it aside "
                        "(with its -wal and -shm files) and start again for a new one, or restore "
                        "a copy; 'attnstat check-db --db %s' lists the problems, and 'sqlite3 %s "
                        ".recover' may save what is readable", db_path, se.msg, db_path, db_path);
    LOG_INFO("server", "database %s: %s ok (%.0f ms)", db_path, full ? "integrity_check" : "quick_check",
             (double)(util_mono_ns() - t0) / 1e6);
    return 0;
}
