/* top_view.c — the state and the frame of `attnstat top` (see top_view.h).
 *
 * A frame: a line that starts with the time and names the run, its source and its step; the
 * heatmaps of the normalised entropy (low = collapsing) and of the max logit (high = logits
 * growing); the heads most at risk by each, with the change since the frame before; the latest
 * alerts. Every line but the heatmaps' is cut at the width; the heatmaps fit by showing values only
 * where they fit, else two columns a cell, else a cell for several heads (and, with a height,
 * several layers): the worst of them (the lowest entropy, the highest logit).
 *
 * Stage: below top.c; calls out.c and libc. */
#include "top_view.h"

#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "out.h"

#define TOP_MAX_GRID 4096     /* the largest grid drawn (layers, heads), as attnstat heads */
#define TOP_CEILING 100.0     /* the max logit scale's top, at least (the default ceiling) */

void top_grid_init(top_grid *g)
{
    memset(g, 0, sizeof *g);
    g->step = INT64_MIN;
}

void top_grid_free(top_grid *g)
{
    free(g->v);
    top_grid_init(g);
}

static size_t top_grid_pos(const top_grid *g, int32_t layer, int32_t head)
{
    size_t lo = 0, hi = g->n;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        const top_cell *c = &g->v[mid];
        if (c->layer < layer || (c->layer == layer && c->head < head))
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

const top_cell *top_grid_find(const top_grid *g, int32_t layer, int32_t head)
{
    size_t i = top_grid_pos(g, layer, head);
    return i < g->n && g->v[i].layer == layer && g->v[i].head == head ? &g->v[i] : NULL;
}

int top_grid_set(top_grid *g, int32_t layer, int32_t head, double en, double ml)
{
    size_t i = top_grid_pos(g, layer, head);
    if (i == g->n || g->v[i].layer != layer || g->v[i].head != head) {
        if (g->n == g->cap) {
            size_t ncap = g->cap ? g->cap * 2 : 256;
            top_cell *nv = realloc(g->v, ncap * sizeof *nv);
            if (!nv)
                return -1;
            g->v = nv;
            g->cap = ncap;
        }
        memmove(g->v + i + 1, g->v + i, (g->n - i) * sizeof *g->v);
        g->n++;
    }
    g->v[i] = (top_cell){layer, head, en, ml};
    return 0;
}

int top_grid_copy(top_grid *dst, const top_grid *src)
{
    if (dst->cap < src->n) {
        top_cell *nv = realloc(dst->v, (src->n ? src->n : 1) * sizeof *nv);
        if (!nv)
            return -1;
        dst->v = nv;
        dst->cap = src->n;
    }
    if (src->n)
        memcpy(dst->v, src->v, src->n * sizeof *src->v);
    dst->n = src->n;
    dst->step = src->step;
    return 0;
}

void top_view_init(top_view *v, const char *run)
{
    memset(v, 0, sizeof *v);
    top_grid_init(&v->now);
    top_grid_init(&v->shown);
    top_grid_init(&v->base);
    v->run = run;
}

void top_view_free(top_view *v)
{
    top_grid_free(&v->now);
    top_grid_free(&v->shown);
    top_grid_free(&v->base);
}

void top_view_alert(top_view *v, const top_alert *al)
{
    if (v->nalerts < TOP_ALERTS)
        v->nalerts++;
    memmove(&v->alerts[1], &v->alerts[0], (size_t)(v->nalerts - 1) * sizeof v->alerts[0]);
    v->alerts[0] = *al;
}

int top_view_advance(top_view *v)
{
    if (v->now.n == 0 || v->now.step == v->shown.step)
        return 0;
    if (v->shown.n && top_grid_copy(&v->base, &v->shown) != 0)
        return -1;
    return top_grid_copy(&v->shown, &v->now);
}

/* ---- drawing ----------------------------------------------------------------------------------*/

/* A line of text (top_view_draw cuts the frame's lines at its width). */
static void top_line(FILE *f, int width, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void top_line(FILE *f, int width, const char *fmt, ...)
{
    (void)width;
    va_list ap;
    va_start(ap, fmt);
    vfprintf(f, fmt, ap);
    va_end(ap);
    fputc('\n', f);
}

/* The lines of text[0 .. len) into out, each cut at width columns (0: not cut): a UTF-8 sequence
 * counts one column, an escape sequence (ESC [ ... final byte) none; a line cut after a colour
 * began gets the reset. */
static void top_cut(FILE *out, const char *text, size_t len, int width)
{
    size_t i = 0;
    while (i < len) {
        size_t start = i, end = i;
        int cols = 0, esc = 0, cut = 0;
        while (end < len && text[end] != '\n') {
            unsigned char ch = (unsigned char)text[end];
            if (ch == 0x1b && end + 1 < len && text[end + 1] == '[') {
                size_t k = end + 2;
                while (k < len && ((unsigned char)text[k] < 0x40 || (unsigned char)text[k] > 0x7e))
                    k++;
                end = k < len ? k + 1 : k;
                esc = 1;
                continue;
            }
            if ((ch & 0xC0) != 0x80) {
                if (width > 0 && cols == width) {
                    cut = 1;
                    break;
                }
                cols++;
            }
            end++;
        }
        fwrite(text + start, 1, end - start, out);
        if (cut && esc)
            fputs("\x1b[0m", out);
        fputc('\n', out);
        while (end < len && text[end] != '\n')
            end++;
        i = end + 1;
    }
}

/* The heads most at risk: indices of v->shown's cells, the lowest entropy (low) or the highest
 * logit, finite values only. */
static int top_worst(const top_grid *g, int low_en, size_t *out)
{
    int n = 0;
    for (size_t i = 0; i < g->n; i++) {
        double x = low_en ? g->v[i].en : g->v[i].ml;
        if (!isfinite(x))
            continue;
        int k = n < TOP_WORST ? n++ : TOP_WORST;
        /* insertion into out[0 .. n) by badness; k: where the newcomer starts */
        while (k > 0) {
            double y = low_en ? g->v[out[k - 1]].en : g->v[out[k - 1]].ml;
            if (low_en ? !(x < y) : !(x > y))
                break;
            if (k < TOP_WORST)
                out[k] = out[k - 1];
            k--;
        }
        if (k < TOP_WORST)
            out[k] = i;
    }
    return n;
}

/* "L3.H6   0.012  -0.004" of cell c, the change against base: about 30 columns. */
static void top_worst_cell(char *buf, size_t len, const top_cell *c, const top_grid *base,
                           int en)
{
    const top_cell *b = top_grid_find(base, c->layer, c->head);
    double x = en ? c->en : c->ml, y = b ? (en ? b->en : b->ml) : NAN;
    char head[24], change[24];
    snprintf(head, sizeof head, "L%d.H%d", c->layer, c->head);
    int prec = en ? 3 : 2;
    if (isfinite(x - y) && fabs(x - y) < 0.5 * pow(10, -prec))
        snprintf(change, sizeof change, "%.*f", prec, 0.0); /* no "-0.000" */
    else if (isfinite(x - y))
        snprintf(change, sizeof change, "%+.*f", prec, x - y);
    else
        snprintf(change, sizeof change, "-");
    snprintf(buf, len, "%-11s %9.*f %9s", head, en ? 3 : 2, x, change);
}

/* The heatmap of one metric (en: entropy_norm; else max_logit) of g, rl x rh cells of lg layers
 * and hg heads. */
static void top_map(FILE *f, const top_grid *g, int en, int64_t rl, int64_t rh, int64_t lg,
                    int64_t hg, int color, int show_values)
{
    double *vals = malloc((size_t)(rl * rh) * sizeof *vals);
    if (!vals) {
        fprintf(f, "(out of memory for a %lld x %lld heatmap)\n", (long long)rl, (long long)rh);
        return;
    }
    for (int64_t i = 0; i < rl * rh; i++)
        vals[i] = NAN;
    double vmax = -INFINITY;
    for (size_t i = 0; i < g->n; i++) {
        const top_cell *c = &g->v[i];
        double x = en ? c->en : c->ml;
        if (isnan(x))
            continue;
        double *cell = &vals[(c->layer / lg) * rh + c->head / hg];
        if (isnan(*cell) || (en ? x < *cell : x > *cell))
            *cell = x;
        if (isfinite(x) && x > vmax)
            vmax = x;
    }
    char title[200];
    size_t n = (size_t)snprintf(title, sizeof title, "%s per layer x head",
                                en ? "entropy_norm (0..1, low = collapsing)"
                                   : "max_logit (high = logits growing)");
    if ((lg > 1 || hg > 1) && n < sizeof title)
        snprintf(title + n, sizeof title - n, "\n(a cell: %lld layer%s x %lld head%s, the %s)",
                 (long long)lg, lg > 1 ? "s" : "", (long long)hg, hg > 1 ? "s" : "",
                 en ? "lowest" : "highest");
    out_heatmap hm = {.title = title, .metric = en ? "entropy_norm" : "max_logit",
                      .layers = (int)rl, .heads = (int)rh, .values = vals, .lo = 0, .hi = 1,
                      .high_is_good = en, .color = color, .show_values = show_values,
                      .layer_group = (int)lg, .head_group = (int)hg};
    if (!en)
        hm.hi = vmax > TOP_CEILING ? vmax : TOP_CEILING;
    out_heatmap_print(f, &hm);
    free(vals);
}

static int64_t top_ceil_div(int64_t a, int64_t b)
{
    return (a + b - 1) / b;
}

static void top_draw(FILE *f, const top_view *v, int width, int height, int color,
                     int64_t now_ms)
{
    char t[32];
    out_time(t, sizeof t, now_ms);
    const top_grid *g = &v->shown;
    if (g->n)
        top_line(f, width, "%s  attnstat top  run %s  step %lld  %s", t, v->run,
                 (long long)g->step, v->source);
    else
        top_line(f, width, "%s  attnstat top  run %s  %s", t, v->run, v->source);
    if (v->note[0])
        top_line(f, width, "%s", v->note);
    int lines = 1 + (v->note[0] != 0);
    if (g->n == 0) {
        top_line(f, width, "no sample of run %s yet: waiting for its next push", v->run);
        lines++;
    } else {
        int64_t layers = 0, heads = 0;
        for (size_t i = 0; i < g->n; i++) {
            layers = g->v[i].layer + (int64_t)1 > layers ? g->v[i].layer + (int64_t)1 : layers;
            heads = g->v[i].head + (int64_t)1 > heads ? g->v[i].head + (int64_t)1 : heads;
        }
        fputc('\n', f);
        if (layers > TOP_MAX_GRID || heads > TOP_MAX_GRID) {
            top_line(f, width, "layer numbers up to %lld and head numbers up to %lld: more than "
                     "the %d x %d drawn (attnstat heads --format json lists them)",
                     (long long)(layers - 1), (long long)(heads - 1), TOP_MAX_GRID, TOP_MAX_GRID);
        } else {
            char lab[32];
            int labw = snprintf(lab, sizeof lab, "layer %lld ", (long long)(layers - 1));
            labw = labw < 8 ? 8 : labw;
            int valw = color ? 7 : 8; /* out_heatmap_print's cell with a value */
            int show_values = width <= 0 || labw + heads * valw <= width;
            int64_t hg = 1, lg = 1;
            while (!show_values && hg < heads && labw + top_ceil_div(heads, hg) * 2 > width)
                hg++;
            /* the lines outside the maps' rows: a blank line, per map two title lines (one
             * says what a cell holds), its head row and legend, a blank line between them, then
             * a blank line, the lists' header and rows, a blank line, the ticker's */
            int fixed = lines + 1 + 2 * 4 + 1 + 1 + 1 + TOP_WORST + 1 + 1 + TOP_ALERTS;
            if (height > 0) {
                int64_t rows = (height - fixed) / 2;
                rows = rows < 1 ? 1 : rows;
                lg = top_ceil_div(layers, rows);
            }
            int64_t rl = top_ceil_div(layers, lg), rh = top_ceil_div(heads, hg);
            top_map(f, g, 1, rl, rh, lg, hg, color, show_values);
            fputc('\n', f);
            top_map(f, g, 0, rl, rh, lg, hg, color, show_values);
        }
        /* the heads most at risk, the two lists side by side where they fit */
        size_t lo[TOP_WORST], hi[TOP_WORST];
        int nlo = top_worst(g, 1, lo), nhi = top_worst(g, 0, hi);
        char since[64] = "";
        if (v->base.n)
            snprintf(since, sizeof since, " (change: since step %lld)", (long long)v->base.step);
        else
            snprintf(since, sizeof since, " (change: none yet)");
        int side = width <= 0 || width >= 66;
        fputc('\n', f);
        if (side)
            top_line(f, width, "%-31s    %-31s%s", "lowest entropy_norm     change",
                     "highest max_logit       change", since);
        else
            top_line(f, width, "lowest entropy_norm     change%s", since);
        for (int k = 0; k < TOP_WORST && (k < nlo || (side && k < nhi)); k++) {
            char a[96] = "", b[96] = "";
            if (k < nlo)
                top_worst_cell(a, sizeof a, &g->v[lo[k]], &v->base, 1);
            if (k < nhi)
                top_worst_cell(b, sizeof b, &g->v[hi[k]], &v->base, 0);
            if (side)
                top_line(f, width, "%-31s    %s", a, b);
            else
                top_line(f, width, "%s", a);
        }
        if (!side) {
            top_line(f, width, "highest max_logit       change");
            for (int k = 0; k < nhi; k++) {
                char b[96];
                top_worst_cell(b, sizeof b, &g->v[hi[k]], &v->base, 0);
                top_line(f, width, "%s", b);
            }
        }
    }
    fputc('\n', f);
    if (v->nalerts == 0) {
        top_line(f, width, "no alerts of run %s", v->run);
        return;
    }
    top_line(f, width, "latest alerts of run %s", v->run);
    for (int i = 0; i < v->nalerts; i++) {
        const top_alert *al = &v->alerts[i];
        char when[32], value[64] = "";
        out_time(when, sizeof when, al->time_ms);
        if (isfinite(al->value))
            snprintf(value, sizeof value, "  %.4g (threshold %.4g)", al->value, al->threshold);
        top_line(f, width, "%s  %-8s %-13s L%d.H%d  step %lld%s", when, al->state, al->rule,
                 al->layer, al->head, (long long)al->step, value);
    }
}

void top_view_draw(FILE *f, const top_view *v, int width, int height, int color, int64_t now_ms)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *m = open_memstream(&buf, &len);
    if (!m) {
        fputs("(out of memory for a frame)\n", f);
        return;
    }
    top_draw(m, v, width, height, color, now_ms);
    if (fclose(m) == 0)
        top_cut(f, buf, len, width);
    free(buf);
}
