/* out.c — table / JSON / CSV records, sparklines and the heatmap of the attnstat CLI (see out.h).
 *
 * Stage: the CLI's output, called by history.c and live.c; calls proto/utf8.c and libc. */
#include "out.h"

#include "utf8.h"

#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ---- Records ---------------------------------------------------------------------------------- */
void out_begin(out_set *o, out_format fmt, FILE *f, const out_col *cols, int ncols)
{
    memset(o, 0, sizeof *o);
    o->fmt = fmt;
    o->f = f;
    o->cols = cols;
    o->ncols = ncols;
}

size_t out_rows(const out_set *o)
{
    return o->nrows;
}

void out_json_string(FILE *f, const char *s)
{
    fputc('"', f);
    const unsigned char *p = (const unsigned char *)s;
    size_t n = strlen(s);
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        int l = utf8_next(p + i, n - i, &cp);
        if (l == 0) {
            fputs("\\ufffd", f);
            i++;
            continue;
        }
        switch (cp) {
        case '"': fputs("\\\"", f); break;
        case '\\': fputs("\\\\", f); break;
        case '\n': fputs("\\n", f); break;
        case '\r': fputs("\\r", f); break;
        case '\t': fputs("\\t", f); break;
        default:
            if (utf8_is_hidden(cp) && cp > 0xFFFF) /* a tag character: a surrogate pair */
                fprintf(f, "\\u%04x\\u%04x", 0xD800u + ((cp - 0x10000u) >> 10),
                        0xDC00u + ((cp - 0x10000u) & 0x3FFu));
            else if (utf8_is_hidden(cp)) /* a control or format character (U+202E) */
                fprintf(f, "\\u%04x", (unsigned)cp);
            else
                fwrite(p + i, 1, (size_t)l, f);
        }
        i += (size_t)l;
    }
    fputc('"', f);
}

char *out_escape(char *buf, size_t len, const char *s)
{
    return utf8_escape(buf, len, s);
}

const char *out_safe(const char *s)
{
    static char slots[OUT_SAFE_SLOTS][OUT_SAFE_LEN];
    static int next;
    char *b = slots[next];
    next = (next + 1) % OUT_SAFE_SLOTS;
    return out_escape(b, OUT_SAFE_LEN, s ? s : "");
}

void out_csv_string(FILE *f, const char *s)
{
    size_t cap = strlen(s) * 4 + 1;
    char *e = malloc(cap);
    if (!e)
        return;
    out_escape(e, cap, s);
    if (!strpbrk(e, ",\"")) {
        fputs(e, f);
        free(e);
        return;
    }
    fputc('"', f);
    for (const char *q = e; *q; q++) {
        if (*q == '"')
            fputc('"', f);
        fputc(*q, f);
    }
    fputc('"', f);
    free(e);
}

/* Shortest text that reads back as the same double. */
static void out_exact(char *buf, size_t len, double d)
{
    for (int prec = 6; prec <= 17; prec++) {
        snprintf(buf, len, "%.*g", prec, d);
        if (strtod(buf, NULL) == d)
            return;
    }
}

static char *out_strdup(const char *s)
{
    size_t n = strlen(s) + 1;
    char *p = malloc(n);
    if (p)
        memcpy(p, s, n);
    return p;
}

static void out_table_cell(char *buf, size_t len, const out_col *c, const out_val *v)
{
    switch (v->kind) {
    case OUT_STR: snprintf(buf, len, "%s", v->s && *v->s ? v->s : "-"); break;
    case OUT_INT: snprintf(buf, len, "%lld", (long long)v->i); break;
    case OUT_NUM:
        if (isnan(v->d))
            snprintf(buf, len, "-");
        else if (isinf(v->d))
            snprintf(buf, len, "%sinf", v->d < 0 ? "-" : "");
        else
            snprintf(buf, len, "%.*f", c->prec, v->d);
        break;
    }
}

void out_add(out_set *o, const out_val *vals)
{
    char buf[512];
    if (o->fmt == OUT_JSON) {
        fputc('{', o->f);
        for (int i = 0; i < o->ncols; i++) {
            if (i)
                fputs(", ", o->f);
            out_json_string(o->f, o->cols[i].key);
            fputs(": ", o->f);
            const out_val *v = &vals[i];
            if (v->kind == OUT_STR) {
                if (v->s)
                    out_json_string(o->f, v->s);
                else
                    fputs("null", o->f);
            } else if (v->kind == OUT_INT) {
                fprintf(o->f, "%lld", (long long)v->i);
            } else if (!isfinite(v->d)) {
                fputs("null", o->f);
            } else {
                out_exact(buf, sizeof buf, v->d);
                fputs(buf, o->f);
            }
        }
        fputs("}\n", o->f);
        o->nrows++;
        return;
    }
    if (o->fmt == OUT_CSV) {
        if (!o->header_done) {
            for (int i = 0; i < o->ncols; i++)
                fprintf(o->f, "%s%s", i ? "," : "", o->cols[i].key);
            fputc('\n', o->f);
            o->header_done = 1;
        }
        for (int i = 0; i < o->ncols; i++) {
            if (i)
                fputc(',', o->f);
            const out_val *v = &vals[i];
            if (v->kind == OUT_STR) {
                if (v->s)
                    out_csv_string(o->f, v->s);
            } else if (v->kind == OUT_INT) {
                fprintf(o->f, "%lld", (long long)v->i);
            } else if (isnan(v->d)) {
                fputs("nan", o->f);
            } else if (isinf(v->d)) {
                fputs(v->d < 0 ? "-inf" : "inf", o->f);
            } else {
                out_exact(buf, sizeof buf, v->d);
                fputs(buf, o->f);
            }
        }
        fputc('\n', o->f);
        o->nrows++;
        return;
    }
    if (o->nrows == o->cap) {
        size_t ncap = o->cap ? o->cap * 2 : 64;
        char **nc = realloc(o->cells, ncap * (size_t)o->ncols * sizeof *nc);
        if (!nc) {
            o->failed = 1;
            return;
        }
        o->cells = nc;
        o->cap = ncap;
    }
    char **row = &o->cells[o->nrows * (size_t)o->ncols];
    for (int i = 0; i < o->ncols; i++) {
        const out_val *v = &vals[i];
        if (v->kind == OUT_STR && v->s && *v->s) { /* whole, however long, escaped */
            size_t cap = strlen(v->s) * 4 + 1;
            row[i] = malloc(cap);
            if (row[i])
                out_escape(row[i], cap, v->s);
        } else {
            out_table_cell(buf, sizeof buf, &o->cols[i], v);
            row[i] = out_strdup(buf);
        }
        if (!row[i])
            o->failed = 1;
    }
    o->nrows++;
}

/* Display width of UTF-8 text: one column per code point. */
static size_t out_width(const char *s)
{
    size_t w = 0;
    for (; *s; s++)
        w += ((unsigned char)*s & 0xC0) != 0x80;
    return w;
}

static void out_pad(FILE *f, size_t n)
{
    while (n--)
        fputc(' ', f);
}

int out_end(out_set *o)
{
    if (o->fmt == OUT_TABLE && o->nrows > 0) {
        size_t *w = calloc((size_t)o->ncols, sizeof *w);
        if (!w) {
            o->failed = 1;
        } else {
            for (int c = 0; c < o->ncols; c++) {
                if (!o->cols[c].in_table)
                    continue;
                w[c] = out_width(o->cols[c].label ? o->cols[c].label : o->cols[c].key);
                for (size_t r = 0; r < o->nrows; r++) {
                    const char *s = o->cells[r * (size_t)o->ncols + (size_t)c];
                    size_t sw = s ? out_width(s) : 0;
                    if (sw > w[c])
                        w[c] = sw;
                }
            }
            for (long r = -1; r < (long)o->nrows; r++) {
                int first = 1;
                for (int c = 0; c < o->ncols; c++) {
                    if (!o->cols[c].in_table)
                        continue;
                    const char *s = r < 0 ? (o->cols[c].label ? o->cols[c].label : o->cols[c].key)
                                          : o->cells[(size_t)r * (size_t)o->ncols + (size_t)c];
                    if (!s)
                        s = "";
                    int right = o->cols[c].kind != OUT_STR;
                    size_t sw = out_width(s);
                    if (!first)
                        fputs("  ", o->f);
                    if (right)
                        out_pad(o->f, w[c] - sw);
                    fputs(s, o->f);
                    int last = 1;
                    for (int k = c + 1; k < o->ncols; k++)
                        last &= !o->cols[k].in_table;
                    if (!right && !last)
                        out_pad(o->f, w[c] - sw);
                    first = 0;
                }
                fputc('\n', o->f);
            }
            free(w);
        }
    }
    for (size_t i = 0; i < o->nrows * (size_t)o->ncols && o->cells; i++)
        free(o->cells[i]);
    free(o->cells);
    int rc = o->failed ? -1 : 0;
    memset(o, 0, sizeof *o);
    return rc;
}

/* ---- Sparklines and times --------------------------------------------------------------------- */
static const char *const out_spark[8] = {"▁", "▂", "▃", "▄", "▅", "▆", "▇", "█"};

void out_sparkline(FILE *f, const double *v, size_t n, size_t width)
{
    if (n == 0 || width == 0)
        return;
    size_t cells = n < width ? n : width;
    double *b = malloc(cells * sizeof *b);
    if (!b)
        return;
    for (size_t i = 0; i < cells; i++) { /* bucket i covers [i*n/cells, (i+1)*n/cells) */
        size_t s = i * n / cells, e = (i + 1) * n / cells;
        double sum = 0;
        size_t cnt = 0;
        for (size_t j = s; j < e; j++)
            if (!isnan(v[j]) && !isinf(v[j])) {
                sum += v[j];
                cnt++;
            }
        b[i] = cnt ? sum / (double)cnt : NAN;
    }
    double lo = INFINITY, hi = -INFINITY;
    for (size_t i = 0; i < cells; i++)
        if (!isnan(b[i])) {
            lo = b[i] < lo ? b[i] : lo;
            hi = b[i] > hi ? b[i] : hi;
        }
    for (size_t i = 0; i < cells; i++) {
        if (isnan(b[i])) {
            fputc(' ', f);
            continue;
        }
        int k = hi > lo ? (int)((b[i] - lo) / (hi - lo) * 7.0 + 0.5) : 3;
        fputs(out_spark[k < 0 ? 0 : k > 7 ? 7 : k], f);
    }
    free(b);
}

void out_spark_line(FILE *f, const char *label, int label_width, const double *v, size_t n,
                    int prec)
{
    double first = NAN, last = NAN, lo = INFINITY, hi = -INFINITY;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(v[i]))
            continue;
        if (isnan(first))
            first = v[i];
        last = v[i];
        lo = v[i] < lo ? v[i] : lo;
        hi = v[i] > hi ? v[i] : hi;
    }
    fprintf(f, "  %-*s ", label_width, label);
    out_sparkline(f, v, n, 48);
    if (isnan(first))
        fprintf(f, "  (no values)\n");
    else
        fprintf(f, "  %.*f -> %.*f  (min %.*f, max %.*f)\n", prec, first, prec, last, prec, lo,
                prec, hi);
}

void out_time(char *buf, size_t len, int64_t ms)
{
    if (ms <= 0) {
        snprintf(buf, len, "-");
        return;
    }
    time_t t = (time_t)(ms / 1000);
    struct tm tm;
    if (!gmtime_r(&t, &tm) || strftime(buf, len, "%Y-%m-%dT%H:%M:%SZ", &tm) == 0)
        snprintf(buf, len, "%lld", (long long)ms);
}

void out_duration(char *buf, size_t len, int64_t ms)
{
    static const struct {
        char unit;
        int64_t s;
    } u[] = {{'d', 86400}, {'h', 3600}, {'m', 60}, {'s', 1}};
    int64_t t = ms > 0 ? ms / 1000 : 0;
    for (size_t i = 0; i < sizeof u / sizeof u[0]; i++) {
        if (t < u[i].s && u[i].s > 1)
            continue;
        int64_t hi = t / u[i].s, lo = i + 1 < sizeof u / sizeof u[0] ? t % u[i].s / u[i + 1].s : 0;
        if (lo)
            snprintf(buf, len, "%lld%c%lld%c", (long long)hi, u[i].unit, (long long)lo,
                     u[i + 1].unit);
        else
            snprintf(buf, len, "%lld%c", (long long)hi, u[i].unit);
        return;
    }
}

/* ---- Numbers in fixed-width cells ------------------------------------------------------------- */
void out_fit(char *buf, size_t len, double v, int width)
{
    static const char suffix[] = "kMGTPE";
    double a = fabs(v);
    if (isnan(v)) {
        snprintf(buf, len, "-");
        return;
    }
    if (isinf(v)) {
        snprintf(buf, len, "%sinf", v < 0 ? "-" : "");
        return;
    }
    /* Plain, with the decimals of three significant digits (at least the integer part). */
    if (a < 9999.5) {
        int dec = a < 9.995 ? 2 : a < 99.95 ? 1 : 0;
        for (; dec >= 0; dec--)
            if (snprintf(buf, len, "%.*f", dec, v) <= width)
                return;
    }
    /* Scaled by a power of 1000 with its suffix: 12.3k, -12k, 1.23M, 999E. */
    double s = v;
    for (int k = 0; k < 6; k++) {
        s /= 1000.0;
        double as = fabs(s);
        if (as >= 999.5)
            continue;
        int dec = as < 9.995 ? 2 : as < 99.95 ? 1 : 0;
        for (; dec >= 0; dec--)
            if (snprintf(buf, len, "%.*f%c", dec, s, suffix[k]) <= width)
                return;
        break;
    }
    /* Mantissa and exponent without '+' or leading zeros: 1.2e21, -1e300. */
    for (int dec = 2; dec >= 0; dec--) {
        char m[64];
        snprintf(m, sizeof m, "%.*e", dec, v);
        char *e = strchr(m, 'e');
        if (!e)
            break;
        int exp = atoi(e + 1);
        *e = '\0';
        if (snprintf(buf, len, "%se%d", m, exp) <= width || dec == 0)
            return; /* at dec 0: the shortest form, even if wider than asked: never cut */
    }
    snprintf(buf, len, "%.3g", v);
}

/* ---- Heatmap ---------------------------------------------------------------------------------- */
static const char *const out_shade[5] = {" ", "░", "▒", "▓", "█"};
/* 256-colour ramp from red (bad) through yellow to green (good). */
static const int out_ramp[11] = {196, 202, 208, 214, 220, 226, 190, 154, 118, 82, 46};

static double out_unit(const out_heatmap *hm, double v)
{
    double t = hm->hi > hm->lo ? (v - hm->lo) / (hm->hi - hm->lo) : 0.5;
    return t < 0 ? 0 : t > 1 ? 1 : t;
}

static int out_colour(const out_heatmap *hm, double v)
{
    double g = out_unit(hm, v);
    if (!hm->high_is_good)
        g = 1 - g;
    return out_ramp[(int)(g * 10 + 0.5)];
}

/* Shade by how alarming a value is: blank for healthy, a full block for the worst, whatever the
 * direction of the metric, so trouble is what the eye lands on. */
static int out_level(const out_heatmap *hm, double v)
{
    double b = out_unit(hm, v);
    if (hm->high_is_good)
        b = 1 - b;
    int k = (int)(b * 5);
    return k > 4 ? 4 : k;
}

static const char *out_glyph(const out_heatmap *hm, double v)
{
    return out_shade[out_level(hm, v)];
}

/* Width of a heatmap cell's value. */
#define OUT_CELL_VALUE 5

void out_heatmap_print(FILE *f, const out_heatmap *hm)
{
    /* Every line is the row label, then one cell per head as wide as its header:
     *   values, colour:     " " value " "          (the value on the cell's colour)
     *   values, no colour:  shade shade value " "
     *   no values:          two columns of colour or shade, a head label over every fourth */
    const int cellw = !hm->show_values ? 2 : hm->color ? OUT_CELL_VALUE + 2 : OUT_CELL_VALUE + 3;
    const int64_t lg = hm->layer_group > 1 ? hm->layer_group : 1;
    const int64_t hg = hm->head_group > 1 ? hm->head_group : 1;
    char lab[32];
    int labw = snprintf(lab, sizeof lab, "layer %lld ",
                        (long long)(hm->layers > 0 ? hm->layers - 1 : 0) * lg);
    if (labw < 8)
        labw = 8;
    if (hm->title)
        fprintf(f, "%s\n", hm->title);
    fprintf(f, "%-*s", labw, "");
    for (int h = 0; h < hm->heads; h++) {
        snprintf(lab, sizeof lab, "h%lld", (long long)(h * hg));
        if (hm->show_values) {
            fprintf(f, "%*s ", cellw - 1, lab);
        } else if (h % 4 == 0) {
            /* The label spans the cells up to the next label; it is left out where it does not
             * fit (never cut). */
            int span = (hm->heads - h < 4 ? hm->heads - h : 4) * cellw;
            fprintf(f, "%-*s", span, (int)strlen(lab) <= span ? lab : "");
        }
    }
    fputc('\n', f);
    for (int l = 0; l < hm->layers; l++) {
        fprintf(f, "layer %-*lld", labw - 6, (long long)(l * lg));
        for (int h = 0; h < hm->heads; h++) {
            double v = hm->values[(size_t)l * (size_t)hm->heads + (size_t)h];
            char val[32];
            out_fit(val, sizeof val, v, OUT_CELL_VALUE);
            if (isnan(v)) {
                if (hm->show_values)
                    fprintf(f, "%*s ", cellw - 1, val);
                else
                    fputs("··", f);
                continue;
            }
            if (hm->color) {
                int col = out_colour(hm, v);
                if (hm->show_values)
                    fprintf(f, "\x1b[48;5;%dm\x1b[38;5;16m %*s \x1b[0m", col, OUT_CELL_VALUE, val);
                else
                    fprintf(f, "\x1b[48;5;%dm  \x1b[0m", col);
            } else {
                const char *g = out_glyph(hm, v);
                if (hm->show_values)
                    fprintf(f, "%s%s%*s ", g, g, OUT_CELL_VALUE, val);
                else
                    fprintf(f, "%s%s", g, g);
            }
        }
        fputc('\n', f);
    }
    /* Legend */
    char lo[32], hi[32];
    snprintf(lo, sizeof lo, "%.3g", hm->lo);
    snprintf(hi, sizeof hi, "%.3g", hm->hi);
    const char *bad = hm->high_is_good ? "low" : "high";
    const char *means = hm->bad_means  ? hm->bad_means
                        : hm->high_is_good ? "collapsing"
                                           : "logits growing";
    if (hm->color) {
        fprintf(f, "legend: %s ", lo);
        for (int i = 0; i <= 10; i++) {
            double v = hm->lo + (hm->hi - hm->lo) * i / 10.0;
            fprintf(f, "\x1b[48;5;%dm \x1b[0m", out_colour(hm, v));
        }
        fprintf(f, " %s %s   (red = %s %s = %s)\n", hi, hm->metric, bad, hm->metric, means);
    } else {
        fprintf(f, "legend (%s):", hm->metric);
        double span = (hm->hi - hm->lo) / 5.0;
        for (int k = 4; k >= 0; k--) { /* most alarming first */
            if (hm->high_is_good) /* level k covers values [hi - (k+1) span, hi - k span) */
                fprintf(f, "  '%s' %s%.3g", out_shade[k], k == 4 ? "<" : ">=",
                        k == 4 ? hm->hi - 4 * span : hm->hi - (k + 1) * span);
            else
                fprintf(f, "  '%s' %s%.3g", out_shade[k], k == 0 ? "<" : ">=",
                        k == 0 ? hm->lo + span : hm->lo + k * span);
        }
        fprintf(f, "  '··' no data   (%s = %s)\n", bad, means);
    }
}
