/* owners.h — who owns each run name: the uid whose Hello first created it. Another uid's Hello
 * with that name is refused (the session says whose it is), so two users admitted by
 * --allow-group never write into, or raise alerts in, each other's run.
 * Stage: beside the session (it asks and records at each Hello); loaded at start-up from the
 * store's runs; calls the store's read half and log. Loop thread only.
 *
 * Where ownership is kept: the run's record carries it in its thresholds text, as
 * "owner_uid":UID after the thresholds (owners_tag() writes it, owners_load() reads it back), so
 * it survives restarts with no change to the tables. A run recorded before owners existed has
 * none: the first uid to say Hello with its name takes it. */
#ifndef ATTNSTAT_OWNERS_H
#define ATTNSTAT_OWNERS_H

#include <stddef.h>
#include <sys/types.h>

typedef struct owners owners;
typedef struct store store;

owners *owners_new(void);
void owners_free(owners *o);

/* Every run of db with an owner recorded. 0, or -1 with err set (then nothing is known: the first
 * uid to say Hello with a name takes it). */
int owners_load(owners *o, store *db, char *err, size_t errlen);

/* 1 with *uid the owner of run name, 0 when it has none. */
int owners_get(const owners *o, const char *name, uid_t *uid);
/* name is uid's from now on. 0, or -1 on no memory. */
int owners_set(owners *o, const char *name, uid_t uid);

/* Appends ,"owner_uid":UID inside the closing brace of the thresholds JSON json[len]. 0, or -1
 * when it does not fit. */
int owners_tag(char *json, size_t len, uid_t uid);

#endif /* ATTNSTAT_OWNERS_H */
