/* checkdb.c — check-db and the --db path's own problems (see checkdb.h).
 *
 * How a check that cannot run is told from damage: the read-only open refuses a database of
 * another schema version as it refuses a damaged one; when it refused, the file's own schema
 * version (store_file_schema: PRAGMA user_version, read without the store's checks) says whether
 * a newer or an older attnstat wrote it, or whether it is attnstat's at all. Only what is left
 * (SQLite cannot read it) is called damaged. The problems of a damaged database are printed one
 * per line, each escaped as every string from the database is.
 *
 * Stage: a command file of the CLI. Calls the store (open, file schema, check), out.c and
 * attnstat_version. */
#include "checkdb.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "attnstat.h"
#include "out.h"
#include "store_read.h"

/* ---- the path ------------------------------------------------------------------------------- */
static int checkdb_cmp(const void *x, const void *y)
{
    return strcmp(*(char *const *)x, *(char *const *)y);
}

/* The first 3 names (in order) of the *.db files in dir, comma-separated, into buf; how many
 * there are. */
static int checkdb_db_files(const char *dir, char *buf, size_t len)
{
    buf[0] = '\0';
    DIR *d = opendir(dir);
    if (!d)
        return 0;
    char *names[64];
    int n = 0, kept = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        size_t l = strlen(e->d_name);
        if (e->d_name[0] == '.' || l < 4 || strcmp(e->d_name + l - 3, ".db") != 0)
            continue;
        n++;
        if (kept < 64 && (names[kept] = strdup(e->d_name)) != NULL)
            kept++;
    }
    closedir(d);
    qsort(names, (size_t)kept, sizeof names[0], checkdb_cmp);
    size_t used = 0;
    for (int i = 0; i < kept; i++) {
        if (i < 3 && used < len) {
            int w = snprintf(buf + used, len - used, "%s%s", used ? ", " : "", names[i]);
            used += w > 0 ? (size_t)w : 0;
        }
        free(names[i]);
    }
    return n;
}

int checkdb_path(const cli_args *a)
{
    struct stat sb;
    if (stat(a->db, &sb) != 0) {
        if (errno == ENOENT)
            fprintf(stderr,
                    "attnstat: database %s does not exist (attnstatd creates it on start; pass "
                    "--db PATH or set ATTNSTAT_DB)\n", out_safe(a->db));
        else
            fprintf(stderr, "attnstat: cannot read database %s: %s\n", out_safe(a->db),
                    strerror(errno));
        return -1;
    }
    if (S_ISREG(sb.st_mode))
        return 0;
    if (S_ISDIR(sb.st_mode)) {
        char names[300], first[300];
        int n = checkdb_db_files(a->db, names, sizeof names);
        snprintf(first, sizeof first, "%.*s", (int)strcspn(names, ","), names);
        char holds[1200];
        if (n == 0)
            snprintf(holds, sizeof holds, "it holds no *.db file");
        else
            snprintf(holds, sizeof holds, "it holds %s%s: pass one of them (--db %s/%s)",
                     out_safe(names), n > 3 ? ", ..." : "", out_safe(a->db), out_safe(first));
        fprintf(stderr, "attnstat: --db %s is a directory, not a database: %s reads one database "
                "file, the one attnstatd's --db names (e.g. /var/lib/attnstat/attnstat.db); %s. "
                "Only job and export read every *.db of a directory.\n", out_safe(a->db),
                a->cmd ? a->cmd : "this command", holds);
        return -1;
    }
    fprintf(stderr, "attnstat: --db %s is not a regular file (a %s): pass the database file "
            "attnstatd's --db names (e.g. /var/lib/attnstat/attnstat.db)\n", out_safe(a->db),
            S_ISCHR(sb.st_mode) ? "character device" : S_ISBLK(sb.st_mode) ? "block device"
            : S_ISFIFO(sb.st_mode) ? "FIFO" : S_ISSOCK(sb.st_mode) ? "socket" : "special file");
    return -1;
}

/* ---- check-db ------------------------------------------------------------------------------- */
/* The problems of a damaged database, kept until the verdict's line is printed above them. */
typedef struct {
    char *text;           /* lines, each ending in '\n' */
    size_t len, cap;
    int oom;
} checkdb_lines;

static int checkdb_add(void *ctx, const char *line)
{
    checkdb_lines *l = ctx;
    size_t n = strlen(line);
    if (l->len + n + 2 > l->cap) {
        size_t ncap = l->cap ? l->cap * 2 : 4096;
        while (ncap < l->len + n + 2)
            ncap *= 2;
        char *p = realloc(l->text, ncap);
        if (!p) {
            l->oom = 1;
            return 1;
        }
        l->text = p;
        l->cap = ncap;
    }
    memcpy(l->text + l->len, line, n);
    l->len += n;
    l->text[l->len++] = '\n';
    l->text[l->len] = '\0';
    return 0;
}

typedef enum { V_OK, V_DAMAGED, V_NEWER, V_OLDER, V_NOT_ATTNSTAT } checkdb_verdict;

static const char *const checkdb_verdicts[] = {"ok", "damaged", "newer_schema", "older_schema",
                                               "not_attnstat"};

int checkdb_run(const cli_args *a)
{
    const char *what = a->quick ? "quick_check" : "integrity_check";
    if (checkdb_path(a) != 0)
        return CLI_EXIT_FAIL;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    store_error err = {0, ""};
    checkdb_lines lines = {0};
    uint64_t problems = 0;
    int64_t version = 0;
    const int reads = store_schema_version();
    checkdb_verdict v = V_OK;
    char why[700] = ""; /* the sentence of a verdict but ok and damaged */
    store *st = store_open_readonly(a->db, 5000, &err);
    if (st) {
        version = reads;
        if (store_check_problems(st, a->quick, checkdb_add, &lines, &problems, &err) != STORE_OK) {
            v = V_DAMAGED;
            if (problems == 0) /* it could not run: why is the one problem */
                checkdb_add(&lines, err.msg);
        }
        store_close(st);
    } else {
        store_error fe = {0, ""};
        store_status fs = store_file_schema(a->db, &version, &fe);
        if (fs == STORE_OK && version > reads) {
            v = V_NEWER;
            snprintf(why, sizeof why, "written by a newer attnstat (schema version %lld; this "
                     "attnstat, %s, reads schema version %d). That is not damage: do not move it "
                     "aside. Check it with the attnstat that wrote it (or a newer one), the "
                     "version of the attnstatd that writes it.",
                     (long long)version, attnstat_version(), reads);
        } else if (fs == STORE_OK && version > 0 && version < reads) {
            v = V_OLDER;
            snprintf(why, sizeof why, "written by an older attnstat (schema version %lld; this "
                     "attnstat, %s, reads schema version %d). Start this version's attnstatd on "
                     "it once to migrate it (its history is kept), then check it again; or check "
                     "it with the attnstat that wrote it.", (long long)version,
                     attnstat_version(), reads);
        } else if (fs == STORE_SCHEMA || (fs == STORE_OK && version == 0)) {
            v = V_NOT_ATTNSTAT;
            snprintf(why, sizeof why, "%s. check-db checks the databases attnstatd writes (the "
                     "file its --db names).", fs == STORE_SCHEMA ? fe.msg : err.msg);
        } else {
            v = V_DAMAGED; /* SQLite cannot read it */
            checkdb_add(&lines, err.msg);
        }
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double ms = (double)(t1.tv_sec - t0.tv_sec) * 1e3 + (double)(t1.tv_nsec - t0.tv_nsec) / 1e6;
    if (lines.oom)
        fprintf(stderr, "attnstat: out of memory: some problems are not listed\n");
    if (a->fmt == OUT_JSON) {
        printf("{\"db\": ");
        out_json_string(stdout, a->db);
        printf(", \"check\": \"%s\", \"ok\": %s, \"verdict\": \"%s\", \"ms\": %.1f, \"problems\": ",
               what, v == V_OK ? "true" : "false", checkdb_verdicts[v], ms);
        if (v == V_DAMAGED) {
            if (lines.len && lines.text[lines.len - 1] == '\n')
                lines.text[--lines.len] = '\0';
            out_json_string(stdout, lines.text ? lines.text : "");
        } else {
            printf("null");
        }
        printf(", \"schema_version\": ");
        if (version > 0)
            printf("%lld", (long long)version);
        else
            printf("null");
        printf(", \"reads_schema_version\": %d, \"message\": ", reads);
        if (why[0])
            out_json_string(stdout, why);
        else
            printf("null");
        printf("}\n");
    } else if (v == V_OK) {
        printf("%s: ok (%s, %.0f ms)\n", out_safe(a->db), what, ms);
    } else if (v == V_DAMAGED) {
        printf("%s: DAMAGED (%s): %llu problem%s\n", out_safe(a->db), what,
               (unsigned long long)(problems ? problems : 1), problems > 1 ? "s" : "");
        for (char *p = lines.text, *nl; p && *p; p = nl + 1) {
            nl = strchr(p, '\n');
            *nl = '\0';
            printf("  %s\n", out_safe(p));
        }
        printf("Stop attnstatd, move the database aside with its -wal and -shm files, and start "
               "it again for a new one, or restore a copy ('sqlite3 %s .recover' may save what is "
               "readable).\n", out_safe(a->db));
    } else {
        printf("%s: not checked (%s): %s\n", out_safe(a->db), what, out_safe(why));
    }
    free(lines.text);
    return v == V_OK ? CLI_EXIT_OK : CLI_EXIT_FAIL;
}
