/* checkdb.h — the attnstat CLI's check-db command, and what every command that reads one database
 * says when --db is not a database file (missing, unreadable, a directory, a device).
 *
 * Stage: called by main.c (check-db) and history.c (every history command's --db); calls the
 * store's read half and out.c. */
#ifndef ATTNSTAT_CLI_CHECKDB_H
#define ATTNSTAT_CLI_CHECKDB_H

#include "args.h"

/* 0 when a->db names a file a database can be read from (a regular file, through links); else
 * -1 with the reason on stderr and what --db takes instead: a missing file (attnstatd creates it),
 * an unreadable one (errno's words), a directory (the *.db files it holds, and that job and export
 * are the commands that read a directory), anything else that is not a regular file. */
int checkdb_path(const cli_args *a);

/* check-db: PRAGMA integrity_check (quick_check with --quick) of the database, read-only (attnstatd
 * may be running). Exit 0 when it is whole; 1 when it is damaged (every problem on a line of its
 * own, then what to do), and when it could not be checked: a database of a newer schema (written
 * by a newer attnstat: not damaged, not to be moved aside; use that attnstat), of an older one
 * (start this attnstatd on it once to migrate it), not an attnstat database, or a --db that is not
 * a database file (checkdb_path: said on stderr only). --format json says which in "verdict": ok,
 * damaged, newer_schema, older_schema or not_attnstat. */
int checkdb_run(const cli_args *a);

#endif /* ATTNSTAT_CLI_CHECKDB_H */
