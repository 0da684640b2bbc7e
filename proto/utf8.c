/* utf8.c — the UTF-8 reader and the escaping of utf8.h. Stage: the wire (proto/), a leaf. */
#include "utf8.h"

#include <stdio.h>
#include <string.h>

int utf8_next(const unsigned char *s, size_t n, uint32_t *cp)
{
    if (n == 0)
        return 0;
    unsigned char c = s[0];
    if (c < 0x80) {
        *cp = c;
        return 1;
    }
    int len;
    uint32_t v, min;
    if ((c & 0xE0) == 0xC0) {
        len = 2, v = c & 0x1Fu, min = 0x80;
    } else if ((c & 0xF0) == 0xE0) {
        len = 3, v = c & 0x0Fu, min = 0x800;
    } else if ((c & 0xF8) == 0xF0) {
        len = 4, v = c & 0x07u, min = 0x10000;
    } else {
        return 0;
    }
    if (n < (size_t)len)
        return 0;
    for (int i = 1; i < len; i++) {
        if ((s[i] & 0xC0) != 0x80)
            return 0;
        v = (v << 6) | (s[i] & 0x3Fu);
    }
    if (v < min || v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF))
        return 0;
    *cp = v;
    return len;
}

int utf8_is_control(uint32_t cp)
{
    return cp < 0x20 || (cp >= 0x7F && cp <= 0x9F);
}

/* Cf of Unicode 15.0 (DerivedGeneralCategory.txt), with Zl (U+2028) and Zp (U+2029) joined to
 * the U+202A..U+202E run; sorted, inclusive. */
static const uint32_t utf8_format_ranges[][2] = {
    {0x00AD, 0x00AD},   {0x0600, 0x0605},   {0x061C, 0x061C},   {0x06DD, 0x06DD},
    {0x070F, 0x070F},   {0x0890, 0x0891},   {0x08E2, 0x08E2},   {0x180E, 0x180E},
    {0x200B, 0x200F},   {0x2028, 0x202E},   {0x2060, 0x2064},   {0x2066, 0x206F},
    {0xFEFF, 0xFEFF},   {0xFFF9, 0xFFFB},   {0x110BD, 0x110BD}, {0x110CD, 0x110CD},
    {0x13430, 0x1343F}, {0x1BCA0, 0x1BCA3}, {0x1D173, 0x1D17A}, {0xE0001, 0xE0001},
    {0xE0020, 0xE007F},
};

int utf8_is_format(uint32_t cp)
{
    if (cp < 0xAD)
        return 0;
    size_t lo = 0, hi = sizeof utf8_format_ranges / sizeof utf8_format_ranges[0];
    while (lo < hi) { /* the first range that ends at or after cp */
        size_t mid = (lo + hi) / 2;
        if (utf8_format_ranges[mid][1] < cp)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < sizeof utf8_format_ranges / sizeof utf8_format_ranges[0] &&
           utf8_format_ranges[lo][0] <= cp;
}

int utf8_is_hidden(uint32_t cp)
{
    return utf8_is_control(cp) || utf8_is_format(cp);
}

char *utf8_escape(char *out, size_t len, const char *s)
{
    if (len == 0)
        return out;
    size_t o = 0, n = s ? strlen(s) : 0;
    const unsigned char *p = (const unsigned char *)s;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        int l = utf8_next(p + i, n - i, &cp);
        if (l > 0 && !utf8_is_hidden(cp)) {
            if (o + (size_t)l >= len)
                break;
            memcpy(out + o, p + i, (size_t)l);
            o += (size_t)l;
            i += (size_t)l;
            continue;
        }
        if (l == 0)
            l = 1; /* one byte that starts no character */
        for (int k = 0; k < l; k++) { /* a control or format character, every byte of it */
            if (o + 4 >= len)
                goto done;
            snprintf(out + o, len - o, "\\x%02x", p[i + (size_t)k]);
            o += 4;
        }
        i += (size_t)l;
    }
done:
    out[o] = '\0';
    return out;
}
