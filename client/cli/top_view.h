/* top_view.h — what `attnstat top` shows and how a frame is drawn: the latest values of each
 * (layer, head) of the run, the frames' snapshots that changes are counted from, the latest
 * alerts, and the drawing of one frame at a given terminal size (top.c feeds it from attnstatd or
 * the database and decides when to draw).
 *
 * Stage: below top.c; calls out.c (heatmaps, times, escaping). */
#ifndef ATTNSTAT_CLI_TOP_VIEW_H
#define ATTNSTAT_CLI_TOP_VIEW_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#define TOP_WORST 5   /* heads listed as most at risk, per metric */
#define TOP_ALERTS 5  /* alerts in the ticker */

typedef struct {
    int32_t layer, head;
    double en, ml;            /* entropy_norm_mean, max_logit (NaN: none) */
} top_cell;

/* (layer, head) -> values, sorted by (layer, head); step: the newest step the values are of. */
typedef struct {
    top_cell *v;
    size_t n, cap;
    int64_t step;             /* INT64_MIN: none yet */
} top_grid;

typedef struct {
    int64_t time_ms, step;
    int32_t layer, head;
    char rule[24], state[16];
    double value, threshold;  /* NaN: none (a resolve) */
} top_alert;

typedef struct {
    top_grid now;             /* the latest value of each (layer, head) */
    top_grid shown, base;     /* the last frame's values and the ones before them: the change */
    top_alert alerts[TOP_ALERTS]; /* newest first */
    int nalerts;
    const char *run;          /* escaped */
    char source[4200];        /* "live from attnstatd at ..." / "from the database ..." */
    char note[600];           /* the source's trouble ("lost attnstatd ..."), or "" */
} top_view;

void top_view_init(top_view *v, const char *run);
void top_view_free(top_view *v);

void top_grid_init(top_grid *g);
void top_grid_free(top_grid *g);
/* Sets the values of (layer, head), keeping the order. -1 when out of memory. */
int top_grid_set(top_grid *g, int32_t layer, int32_t head, double en, double ml);
/* dst becomes a copy of src. -1 when out of memory (dst unchanged). */
int top_grid_copy(top_grid *dst, const top_grid *src);
/* The cell of (layer, head), or NULL. */
const top_cell *top_grid_find(const top_grid *g, int32_t layer, int32_t head);

/* An alert joins the ticker (newest first). */
void top_view_alert(top_view *v, const top_alert *al);

/* Before drawing: when `now` has a step the last frame did not show, the last frame's values
 * become the base of the changes and `now` the values shown. -1 when out of memory. */
int top_view_advance(top_view *v);

/* One frame into f: its first line starts with the time (now_ms); heatmaps fitted into width
 * columns and, when height > 0, height lines (a cell then stands for several heads or layers,
 * the worst of them); color: ANSI colours in the heatmaps. */
void top_view_draw(FILE *f, const top_view *v, int width, int height, int color, int64_t now_ms);

#endif /* ATTNSTAT_CLI_TOP_VIEW_H */
