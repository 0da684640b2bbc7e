/* out.h — output of the attnstat CLI: records of typed values printed as an aligned table,
 * as JSON (one object per line) or as CSV from one column description; sparklines and the
 * terminal heatmap of the layer x head grid. Every string cell is escaped (out_escape) in tables and
 * CSV, and in JSON as JSON escapes. Writes to a FILE; keeps no global state but out_safe()'s
 * buffers.
 *
 * Stage: the bottom of the CLI; includes libc only. */
#ifndef ATTNSTAT_CLI_OUT_H
#define ATTNSTAT_CLI_OUT_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

typedef enum { OUT_TABLE, OUT_JSON, OUT_CSV } out_format;

typedef enum { OUT_STR, OUT_INT, OUT_NUM } out_kind;

typedef struct {
    const char *key;    /* JSON key and CSV header */
    const char *label;  /* table header (NULL: key) */
    out_kind kind;
    int prec;           /* digits after the point for OUT_NUM in tables */
    int in_table;       /* 0: only in JSON and CSV */
} out_col;

typedef struct {
    out_kind kind;
    const char *s;      /* OUT_STR (copied when added); NULL prints as null / empty / "-" */
    int64_t i;
    double d;           /* NaN and infinities: null in JSON, "nan"/"inf" in CSV, "-" in tables */
} out_val;

/* A set of records with the same columns. Table output is buffered (to align the columns); JSON
 * and CSV go out as each record is added. */
typedef struct {
    out_format fmt;
    FILE *f;
    const out_col *cols;
    int ncols;
    char **cells;       /* table: nrows x ncols formatted strings */
    size_t nrows, cap;
    int header_done;
    int failed;         /* an allocation failed: output is incomplete */
} out_set;

void out_begin(out_set *o, out_format fmt, FILE *f, const out_col *cols, int ncols);
void out_add(out_set *o, const out_val *vals);
/* Prints the table (when the format is a table) and frees everything. Returns 0, or -1 when an
 * allocation failed along the way. */
int out_end(out_set *o);
size_t out_rows(const out_set *o);

static inline out_val out_s(const char *s) { return (out_val){.kind = OUT_STR, .s = s}; }
static inline out_val out_i(int64_t i) { return (out_val){.kind = OUT_INT, .i = i}; }
static inline out_val out_d(double d) { return (out_val){.kind = OUT_NUM, .d = d}; }

/* JSON string escaping into f, with the quotes: control characters, DEL and C1 controls as \u00XX,
 * format characters (U+202E, U+200B, U+2028...) as \uXXXX (a surrogate pair past U+FFFF), bytes
 * that are not UTF-8 as \ufffd. */
void out_json_string(FILE *f, const char *s);

/* A CSV field into f: escaped like a table cell (no control character reaches a terminal that
 * shows the file), then quoted when it holds a comma or a quote. */
void out_csv_string(FILE *f, const char *s);

/* Text from the database or a peer (run names, hosts, messages), made safe to print on a terminal:
 * control characters (newlines, escape sequences), DEL, C1 controls, format characters (U+202E
 * right-to-left override, U+200B, U+2028: utf8_is_hidden) and bytes that are not UTF-8 become
 * \xNN, so that nothing stored can move the cursor, recolour the screen, reorder or forge a line.
 * Written into buf[len] (cut to fit), which is returned. */
char *out_escape(char *buf, size_t len, const char *s);
/* out_escape() into one of OUT_SAFE_SLOTS rotating buffers of OUT_SAFE_LEN bytes: for printf
 * arguments ("run %s", out_safe(name)); valid until OUT_SAFE_SLOTS more calls. NULL gives "". */
#define OUT_SAFE_SLOTS 8
#define OUT_SAFE_LEN 1024
const char *out_safe(const char *s);

/* Writes a sparkline of n values (NaN: a gap) scaled between their min and max, at most width
 * cells (values are averaged into buckets when there are more). */
void out_sparkline(FILE *f, const double *v, size_t n, size_t width);

/* One line: "  LABEL SPARKLINE  first -> last  (min lo, max hi)" over the finite values of v (the
 * label padded to label_width, values with prec decimals), or "(no values)". */
void out_spark_line(FILE *f, const char *label, int label_width, const double *v, size_t n,
                    int prec);

/* RFC 3339 UTC time "YYYY-MM-DDTHH:MM:SSZ" of a Unix time in milliseconds ("-" for 0). */
void out_time(char *buf, size_t len, int64_t ms);
/* A duration in its two largest units: "45s", "12m5s", "3h12m", "2d3h" (seconds dropped past
 * the hour; negative as 0s). */
void out_duration(char *buf, size_t len, int64_t ms);

/* v in at most width characters (width >= 4) without cutting it: three significant digits where
 * they fit ("0.50", "99.9", "-1234"), then a k/M/G/T/P/E suffix ("12.3k", "-12k", "1.23M"), then
 * a short exponent ("1e21"); NaN "-", infinities "inf" / "-inf". A magnitude that fits no other
 * way (past 1e99 with a sign, at width 5) gets its shortest form, wider than asked. len >= 32. */
void out_fit(char *buf, size_t len, double v, int width);

/* The heatmap of a layer x head grid. values[l * heads + h], NaN for a missing cell.
 * lo..hi is the colour scale; high_is_good picks the direction (entropy: high is healthy; max
 * logit: high is dangerous). color: 256-colour ANSI cells; otherwise shade characters. */
typedef struct {
    const char *title;
    const char *metric;
    int layers, heads;
    const double *values;
    double lo, hi;
    int high_is_good;
    const char *bad_means; /* what the bad end says in the legend (NULL: "collapsing" when high is
                            * good, else "logits growing") */
    int color;
    int show_values;    /* print the value in each cell */
    int layer_group, head_group; /* a row / column stands for this many layers / heads from its
                                  * label on (0: 1): the labels count by them */
} out_heatmap;

void out_heatmap_print(FILE *f, const out_heatmap *hm);

#endif /* ATTNSTAT_CLI_OUT_H */
