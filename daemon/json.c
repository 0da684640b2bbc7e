/* json.c — the strict JSON checker of json.h: a recursive descent over the grammar of RFC 8259,
 * bounded in depth. Stage: none (a pure leaf); calls util (errors) and proto/utf8.c. */
#include "json.h"

#include <stdint.h>
#include <stdio.h>

#include "utf8.h"
#include "util.h"

typedef struct {
    const unsigned char *s;
    size_t n, i;
    char *err;
    size_t errlen;
} json_in;

static int fail(json_in *j, const char *what)
{
    return util_err(j->err, j->errlen, "not valid JSON: %s at byte %zu", what, j->i);
}

static void skip_ws(json_in *j)
{
    while (j->i < j->n && (j->s[j->i] == ' ' || j->s[j->i] == '\t' || j->s[j->i] == '\n' ||
                           j->s[j->i] == '\r'))
        j->i++;
}

static int is_hex(unsigned char c)
{
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

static int string(json_in *j)
{
    j->i++; /* the opening quote */
    while (j->i < j->n) {
        unsigned char c = j->s[j->i];
        if (c == '"') {
            j->i++;
            return 0;
        }
        if (c < 0x20)
            return fail(j, "a control character inside a string");
        if (c == '\\') {
            if (j->i + 1 >= j->n)
                return fail(j, "an escape cut short");
            unsigned char e = j->s[j->i + 1];
            if (e == 'u') {
                if (j->i + 6 > j->n || !is_hex(j->s[j->i + 2]) || !is_hex(j->s[j->i + 3]) ||
                    !is_hex(j->s[j->i + 4]) || !is_hex(j->s[j->i + 5]))
                    return fail(j, "a \\u escape without four hex digits");
                j->i += 6;
            } else if (e == '"' || e == '\\' || e == '/' || e == 'b' || e == 'f' || e == 'n' ||
                       e == 'r' || e == 't') {
                j->i += 2;
            } else {
                return fail(j, "an unknown escape");
            }
            continue;
        }
        uint32_t cp;
        int l = utf8_next(j->s + j->i, j->n - j->i, &cp);
        if (l == 0)
            return fail(j, "bytes that are not UTF-8");
        j->i += (size_t)l;
    }
    return fail(j, "a string without its closing quote");
}

static int digits(json_in *j)
{
    size_t start = j->i;
    while (j->i < j->n && j->s[j->i] >= '0' && j->s[j->i] <= '9')
        j->i++;
    return j->i > start ? 0 : -1;
}

static int number(json_in *j)
{
    if (j->s[j->i] == '-')
        j->i++;
    if (j->i < j->n && j->s[j->i] == '0')
        j->i++;
    else if (digits(j) != 0)
        return fail(j, "a number without digits");
    if (j->i < j->n && j->s[j->i] == '.') {
        j->i++;
        if (digits(j) != 0)
            return fail(j, "a number without digits after its point");
    }
    if (j->i < j->n && (j->s[j->i] == 'e' || j->s[j->i] == 'E')) {
        j->i++;
        if (j->i < j->n && (j->s[j->i] == '+' || j->s[j->i] == '-'))
            j->i++;
        if (digits(j) != 0)
            return fail(j, "a number without digits in its exponent");
    }
    return 0;
}

static int literal(json_in *j, const char *word)
{
    for (size_t k = 0; word[k]; k++, j->i++)
        if (j->i >= j->n || j->s[j->i] != (unsigned char)word[k])
            return fail(j, "an unknown word");
    return 0;
}

static int value(json_in *j, int depth);

static int container(json_in *j, int depth, int object)
{
    if (depth >= JSON_MAX_DEPTH)
        return fail(j, "nesting deeper than 64 levels");
    j->i++; /* [ or { */
    skip_ws(j);
    char close = object ? '}' : ']';
    if (j->i < j->n && j->s[j->i] == close) {
        j->i++;
        return 0;
    }
    for (;;) {
        skip_ws(j);
        if (object) {
            if (j->i >= j->n || j->s[j->i] != '"')
                return fail(j, "an object key that is not a string");
            if (string(j) != 0)
                return -1;
            skip_ws(j);
            if (j->i >= j->n || j->s[j->i] != ':')
                return fail(j, "a missing ':' after an object key");
            j->i++;
        }
        if (value(j, depth + 1) != 0)
            return -1;
        skip_ws(j);
        if (j->i >= j->n)
            return fail(j, object ? "an object without its '}'" : "an array without its ']'");
        if (j->s[j->i] == ',') {
            j->i++;
            continue;
        }
        if (j->s[j->i] == close) {
            j->i++;
            return 0;
        }
        return fail(j, object ? "a missing ',' or '}'" : "a missing ',' or ']'");
    }
}

static int value(json_in *j, int depth)
{
    skip_ws(j);
    if (j->i >= j->n)
        return fail(j, "a missing value");
    switch (j->s[j->i]) {
    case '{': return container(j, depth, 1);
    case '[': return container(j, depth, 0);
    case '"': return string(j);
    case 't': return literal(j, "true");
    case 'f': return literal(j, "false");
    case 'n': return literal(j, "null");
    default:
        if (j->s[j->i] == '-' || (j->s[j->i] >= '0' && j->s[j->i] <= '9'))
            return number(j);
        return fail(j, "an unexpected character");
    }
}

int json_check_object(const char *s, size_t n, char *err, size_t errlen)
{
    json_in j = {(const unsigned char *)s, n, 0, err, errlen};
    skip_ws(&j);
    if (j.i >= n || s[j.i] != '{')
        return util_err(err, errlen, "not a JSON object (it must start with '{')");
    if (container(&j, 0, 1) != 0)
        return -1;
    skip_ws(&j);
    if (j.i != n)
        return fail(&j, "text after the object");
    return 0;
}
