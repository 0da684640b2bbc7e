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

char *utf8_escape(char *out, size_t len, const char *s)
{
    if (len == 0)
        return out;
    size_t o = 0, n = s ? strlen(s) : 0;
    const unsigned char *p = (const unsigned char *)s;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        int l = utf8_next(p + i, n - i, &cp);
        if (l > 0 && !utf8_is_control(cp)) {
            if (o + (size_t)l >= len)
                break;
            memcpy(out + o, p + i, (size_t)l);
            o += (size_t)l;
            i += (size_t)l;
            continue;
        }
        if (l == 0)
            l = 1; /* one byte that starts no character */
        for (int k = 0; k < l; k++) { /* a control character, every byte of it */
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
