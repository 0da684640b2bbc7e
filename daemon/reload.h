/* reload.h — the SIGHUP reload's reading, off the event loop. The config files are read on a
 * thread of their own (cfgfile.h: regular files only, opened without blocking, at most
 * CFGFILE_MAX bytes each); their texts come back to the loop, which parses and applies them
 * (cfg_reload). A FIFO or a file system that hangs can no longer stop the daemon: a FIFO is
 * refused with the reason, and a read that hangs holds its own thread only (a SIGHUP meanwhile is
 * refused, saying which file has been read for how long).
 * Stage: beside the loop (which starts it from its SIGHUP handler and gets the result in a
 * callback); calls cfgfile, util and log. Loop thread only, but for the reading thread, which
 * touches nothing but its own job.
 *
 * Ownership: the job (paths, texts) is shared by the thread and the loop under a mutex and freed
 * by whichever lets go of it last; at shutdown a job still reading is abandoned (the thread frees
 * it when its read returns, and wakes nothing). */
#ifndef ATTNSTAT_RELOAD_H
#define ATTNSTAT_RELOAD_H

#include <stddef.h>
#include <uv.h>

typedef struct reload reload;

/* The files were read: texts[k] the text of paths[k] (valid during the call), or err (NULL when
 * every file was read) naming the one that was not and why. */
typedef void (*reload_done_fn)(void *data, const char *const *texts, size_t n, const char *err);

/* A reader on loop (its wake-up handle does not keep the loop alive). NULL (logged) on failure. */
reload *reload_new(uv_loop_t *loop, reload_done_fn done, void *data);
/* Reads paths[0..n) on a thread; done() comes on the loop once they are read. 0, or -1 with err
 * set: a read is still under way (which file, since when), or no thread could be started. */
int reload_start(reload *r, const char *const *paths, size_t n, char *err, size_t errlen);
/* Closes the reader (NULL allowed); a read under way is abandoned. Frees r in the handle's close
 * callback. */
void reload_close(reload *r);

#endif /* ATTNSTAT_RELOAD_H */
