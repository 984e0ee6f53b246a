/* Stop-string matching with hold-back. After each push the pending text holds only its longest
 * suffix that is a proper prefix of some stop string; anything before that suffix can never be
 * part of a match, so it is released. */
#include "serve/stop.h"

#include <string.h>

void nx_stop_init(nx_stop_matcher *m, char *const *stops, size_t n_stop) {
    memset(m, 0, sizeof *m);
    m->stops = stops;
    m->n_stop = n_stop;
}

void nx_stop_free(nx_stop_matcher *m) {
    if (!m) return;
    nx_strbuf_free(&m->pending);
}

/* Earliest start of any stop string in p[0..n), or n when none occurs. */
static size_t first_match(const nx_stop_matcher *m, const char *p, size_t n) {
    size_t best = n;
    for (size_t s = 0; s < m->n_stop; s++) {
        const char *hit = memmem(p, n, m->stops[s], strlen(m->stops[s]));
        if (hit && (size_t)(hit - p) < best) best = (size_t)(hit - p);
    }
    return best;
}

/* Smallest i such that p[i..n) is a proper prefix of some stop string (n when none). */
static size_t holdback_start(const nx_stop_matcher *m, const char *p, size_t n) {
    size_t longest = 0;
    for (size_t s = 0; s < m->n_stop; s++) {
        size_t l = strlen(m->stops[s]);
        if (l > longest) longest = l;
    }
    size_t i = n >= longest ? n - longest + 1 : 0;
    for (; i < n; i++) {
        size_t tail = n - i;
        for (size_t s = 0; s < m->n_stop; s++)
            if (strlen(m->stops[s]) > tail && memcmp(p + i, m->stops[s], tail) == 0) return i;
    }
    return n;
}

nx_status nx_stop_push(nx_stop_matcher *m, const char *text, size_t len, nx_strbuf *out,
                       bool *stopped) {
    if (stopped) *stopped = m->matched;
    if (m->matched || len == 0) return NX_OK;
    if (m->n_stop == 0) return nx_strbuf_append(out, text, len);
    nx_status st = nx_strbuf_append(&m->pending, text, len);
    if (st != NX_OK) return st;
    const char *p = m->pending.data;
    size_t n = m->pending.len;
    size_t hit = first_match(m, p, n);
    if (hit < n) {
        st = nx_strbuf_append(out, p, hit);
        m->matched = true;
        nx_strbuf_consume(&m->pending, n);
        if (stopped) *stopped = true;
        return st;
    }
    size_t keep = holdback_start(m, p, n);
    if (keep > 0) {
        st = nx_strbuf_append(out, p, keep);
        if (st != NX_OK) return st;
        nx_strbuf_consume(&m->pending, keep);
    }
    return NX_OK;
}

nx_status nx_stop_flush(nx_stop_matcher *m, nx_strbuf *out) {
    if (m->matched || m->pending.len == 0) return NX_OK;
    nx_status st = nx_strbuf_append(out, m->pending.data, m->pending.len);
    nx_strbuf_consume(&m->pending, m->pending.len);
    return st;
}
