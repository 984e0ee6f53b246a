/* UTF-8 validation, decoding and lossy repair for the tokenizer. The repair follows the Unicode
 * "maximal subpart" practice so that decoded text matches other implementations byte for byte. */
#include "text/unicode.h"

#include <string.h>

/* Classifies the sequence at s[0..n): returns its length when complete and well-formed, 0 when
 * ill-formed (and *bad the length of the maximal subpart to replace, >= 1), or -1 when it is a
 * valid prefix cut short by the end of the input. */
static int utf8_scan(const unsigned char *s, size_t n, uint32_t *cp, size_t *bad) {
    unsigned char b = s[0];
    if (b < 0x80) {
        *cp = b;
        return 1;
    }
    size_t need;
    unsigned char lo = 0x80, hi = 0xBF;
    uint32_t c;
    if (b >= 0xC2 && b <= 0xDF) {
        need = 1;
        c = b & 0x1F;
    } else if (b >= 0xE0 && b <= 0xEF) {
        need = 2;
        c = b & 0x0F;
        if (b == 0xE0) lo = 0xA0;       /* overlong */
        else if (b == 0xED) hi = 0x9F;  /* surrogates */
    } else if (b >= 0xF0 && b <= 0xF4) {
        need = 3;
        c = b & 0x07;
        if (b == 0xF0) lo = 0x90;       /* overlong */
        else if (b == 0xF4) hi = 0x8F;  /* > U+10FFFF */
    } else {
        *bad = 1;
        return 0;
    }
    for (size_t i = 1; i <= need; i++) {
        if (i >= n) return -1;
        unsigned char t = s[i];
        if (t < lo || t > hi) {
            *bad = i;
            return 0;
        }
        lo = 0x80, hi = 0xBF;
        c = (c << 6) | (t & 0x3F);
    }
    *cp = c;
    return (int)need + 1;
}

bool nx_utf8_valid(const char *s, size_t n, size_t *bad_off) {
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0;
    while (i < n) {
        if (u[i] < 0x80) {
            i++;
            continue;
        }
        uint32_t cp;
        size_t bad = 0;
        int k = utf8_scan(u + i, n - i, &cp, &bad);
        if (k <= 0) {
            if (bad_off) *bad_off = i;
            return false;
        }
        i += (size_t)k;
    }
    return true;
}

size_t nx_utf8_next(const char *s, size_t n, uint32_t *cp) {
    if (n == 0) return 0;
    size_t bad = 0;
    int k = utf8_scan((const unsigned char *)s, n, cp, &bad);
    return k > 0 ? (size_t)k : 0;
}

size_t nx_utf8_put(uint32_t cp, char out[4]) {
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (char)(0xC0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (char)(0xE0 | (cp >> 12));
        out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (char)(0xF0 | (cp >> 18));
    out[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    out[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

size_t nx_utf8_repair(const char *s, size_t n, bool final, char *out, size_t *out_len) {
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0, o = 0;
    while (i < n) {
        uint32_t cp;
        size_t bad = 0;
        int k = utf8_scan(u + i, n - i, &cp, &bad);
        if (k > 0) {
            memcpy(out + o, s + i, (size_t)k);
            o += (size_t)k;
            i += (size_t)k;
            continue;
        }
        if (k < 0) {
            if (!final) break; /* hold the incomplete tail */
            bad = n - i;
        }
        memcpy(out + o, "\xEF\xBF\xBD", 3);
        o += 3;
        i += bad;
    }
    *out_len = o;
    return i;
}

bool nx_unicode_is_space(uint32_t cp) {
    if (cp >= 0x09 && cp <= 0x0D) return true;
    switch (cp) {
    case 0x20: case 0x85: case 0xA0: case 0x1680: case 0x2028: case 0x2029: case 0x202F:
    case 0x205F: case 0x3000:
        return true;
    default:
        return cp >= 0x2000 && cp <= 0x200A;
    }
}
