/* The prompt cache: copies of a context's prefix (the tokens, every trunk layer's key and value
 * rows, the hidden states the MTP head is fed) kept in memory, so that a request which shares a
 * long prefix with an earlier sequence (not the one the context holds now) is served from it.
 * This is llama.cpp's server prompt cache (--cache-ram): requests that alternate between
 * conversations, or a chat interrupted by a one-off request (a title, a summary), otherwise
 * evict each other's rows and prefill from scratch.
 *
 * Rows are copied bit for bit, so by the numerics contract a restored prefix is what a fresh
 * prefill computes; so are the MTP head's cache rows, also kept (those of a head attending from
 * row 0), and nx_generate feeds the head the rest from the hidden states. A hybrid model's entry also holds its recurrent states after its last row and
 * its context's checkpoints (nx_ctx_set_checkpoints): it serves a prompt that extends all of its
 * rows, else the rows up to its last checkpoint within the shared prefix. Entries are evicted
 * least recently used first to keep within the budget. */
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "model/deltanet.h"
#include "model/model_internal.h"

/* Shorter prefixes are cheaper to prefill again than to keep. */
#define NX_PROMPT_CACHE_MIN_ROWS 16

typedef struct entry {
    struct entry *prev, *next; /* most recently used first */
    const nx_model *m;         /* the model whose context the rows came from */
    int32_t n;                 /* rows */
    size_t bytes;
    int32_t *tokens;  /* [n] */
    uint8_t *kv;      /* per cached layer: k rows then v rows, n · kv row bytes each */
    float *hidden;    /* [n, H] */
    float *dn;        /* the DeltaNet states after row n (nx_dn_save), NULL without such layers */
    int n_ck;         /* the context's checkpoints: rows ascending, each below n, and their states */
    int32_t *ck_rows;
    float *ck;        /* [n_ck][nx_dn_saved_floats] */
    int32_t mtp_n;    /* the MTP head's cache rows [0, mtp_n) (0: none kept) */
    uint8_t *mtp_kv;  /* its key rows then value rows, mtp_n · kv row bytes each */
} entry;

struct nx_prompt_cache {
    size_t budget, bytes;
    entry *head, *tail;
    nx_prompt_cache_stats st;
};

static size_t kv_row_bytes(const nx_model *m) { return nx_kv_pos_bytes(m); }

static size_t entry_bytes(const nx_model *m, int32_t n, int n_ck, int32_t mtp_n) {
    return sizeof(entry) + (size_t)(1 + n_ck) * (size_t)nx_dn_saved_floats(m) * sizeof(float) +
           (size_t)mtp_n * kv_row_bytes(m) +
           (size_t)n * (sizeof(int32_t) + (size_t)nx_kv_layers(m) * kv_row_bytes(m) + (size_t)m->cfg.hidden_size * sizeof(float));
}

nx_status nx_prompt_cache_new(size_t budget_bytes, nx_prompt_cache **out, nx_error *err) {
    *out = calloc(1, sizeof **out);
    if (!*out) return nx_fail(err, NX_E_NOMEM, "out of memory");
    (*out)->budget = budget_bytes;
    return NX_OK;
}

static void unlink_entry(nx_prompt_cache *pc, entry *e) {
    if (e->prev) e->prev->next = e->next;
    else pc->head = e->next;
    if (e->next) e->next->prev = e->prev;
    else pc->tail = e->prev;
    e->prev = e->next = NULL;
}

static void push_front(nx_prompt_cache *pc, entry *e) {
    e->prev = NULL;
    e->next = pc->head;
    if (pc->head) pc->head->prev = e;
    pc->head = e;
    if (!pc->tail) pc->tail = e;
}

static void drop(nx_prompt_cache *pc, entry *e) {
    unlink_entry(pc, e);
    pc->bytes -= e->bytes;
    free(e->tokens);
    free(e->kv);
    free(e->hidden);
    free(e->dn);
    free(e->ck_rows);
    free(e->ck);
    free(e->mtp_kv);
    free(e);
}

void nx_prompt_cache_free(nx_prompt_cache *pc) {
    if (!pc) return;
    while (pc->head) drop(pc, pc->head);
    free(pc);
}

void nx_prompt_cache_clear(nx_prompt_cache *pc) {
    while (pc->head) drop(pc, pc->head);
}

void nx_prompt_cache_get_stats(const nx_prompt_cache *pc, nx_prompt_cache_stats *st) {
    *st = pc->st;
    st->budget_bytes = (int64_t)pc->budget;
    st->bytes = (int64_t)pc->bytes;
    st->entries = 0;
    for (const entry *e = pc->head; e; e = e->next) st->entries++;
}

/* How many leading tokens a and b share, at most n. */
static int32_t common(const int32_t *a, const int32_t *b, int32_t n) {
    int32_t i = 0;
    while (i < n && a[i] == b[i]) i++;
    return i;
}

/* The rows of e a prompt sharing k leading tokens with it can take: k for an entry without
 * recurrent states; else all of them when k reaches its end, else its last checkpoint at or
 * below k (0: none). */
static int32_t usable_rows(const entry *e, int32_t k) {
    if (!e->dn || k >= e->n) return k < e->n ? k : e->n;
    for (int i = e->n_ck - 1; i >= 0; i--)
        if (e->ck_rows[i] <= k) return e->ck_rows[i];
    return 0;
}

/* How many of the context's checkpoints are of rows below n. */
static int ckpts_below(const nx_ctx *c, int32_t n) {
    int k = 0;
    while (c->dn && k < c->dn_n_ckpts && c->dn_ckpts[k].row < n) k++;
    return k;
}

/* The context's checkpoints copied into e (rows below e->n); false when memory is short. */
static bool copy_ckpts(entry *e, const nx_ctx *c) {
    const size_t f = (size_t)nx_dn_saved_floats(c->m);
    const int n = ckpts_below(c, e->n);
    if (n == 0) return true;
    if (!(e->ck_rows = malloc(sizeof(int32_t) * (size_t)n)) || !(e->ck = malloc(sizeof(float) * f * (size_t)n)))
        return false;
    for (int i = 0; i < n; i++) {
        e->ck_rows[i] = c->dn_ckpts[i].row;
        memcpy(e->ck + (size_t)i * f, c->dn_ckpts[i].st, sizeof(float) * f);
    }
    e->n_ck = n;
    return true;
}

/* A copy of the context's rows [0, n_past), or NULL when an entry already holds them (it is
 * made the most recently used), when they exceed the budget, or when memory is short: the
 * cache is an optimisation, never a reason to fail a request. */
static entry *snapshot(nx_prompt_cache *pc, const nx_ctx *c) {
    const nx_model *m = c->m;
    const int32_t n = c->n_past;
    const int32_t hn = nx_mtp_rows_for(c, n);
    const size_t bytes = entry_bytes(m, n, ckpts_below(c, n), hn);
    if (bytes > pc->budget) return NULL;
    for (entry *e = pc->head; e; e = e->next)
        if (e->m == m && e->n >= n && usable_rows(e, n) == n && common(e->tokens, c->tokens, n) == n) {
            unlink_entry(pc, e);
            push_front(pc, e);
            return NULL;
        }
    entry *e = calloc(1, sizeof *e);
    const size_t row = kv_row_bytes(m), H = (size_t)m->cfg.hidden_size, L = (size_t)nx_kv_layers(m);
    const size_t dnf = (size_t)nx_dn_saved_floats(m);
    if (e) e->n = n, e->mtp_n = hn;
    if (!e || !(e->tokens = malloc(sizeof(int32_t) * (size_t)n)) || !(e->kv = malloc(L * row * (size_t)n + 1)) ||
        !(e->hidden = malloc(sizeof(float) * H * (size_t)n)) || (dnf && !(e->dn = malloc(sizeof(float) * dnf))) ||
        (dnf && !copy_ckpts(e, c)) || (hn && !(e->mtp_kv = malloc(row * (size_t)hn)))) {
        if (e) {
            free(e->tokens);
            free(e->kv);
            free(e->hidden);
            free(e->dn);
            free(e->ck_rows);
            free(e->ck);
            free(e->mtp_kv);
        }
        free(e);
        return NULL;
    }
    e->m = m;
    e->bytes = entry_bytes(m, n, e->n_ck, hn);
    memcpy(e->tokens, c->tokens, sizeof(int32_t) * (size_t)n);
    for (int32_t l = 0, i = 0; l < m->cfg.n_layers; l++)
        if (c->kv[l].k) nx_kv_copy_rows(c, c->kv[l], e->kv + (size_t)i++ * row * (size_t)n, n, n, true);
    memcpy(e->hidden, c->hidden, sizeof(float) * H * (size_t)n);
    if (hn) nx_kv_copy_rows(c, c->mtp_kv, e->mtp_kv, hn, hn, true);
    if (e->dn) nx_dn_save(c, n, e->dn);
    return e;
}

/* Adds e, dropping the entries it extends (their rows are a prefix of its own) and then the
 * least recently used until the cache fits its budget. */
static void insert(nx_prompt_cache *pc, entry *e) {
    for (entry *o = pc->head, *nx; o; o = nx) {
        nx = o->next;
        if (o->m == e->m && o->n <= e->n && usable_rows(e, o->n) == o->n && common(o->tokens, e->tokens, o->n) == o->n)
            drop(pc, o); /* (a hybrid's entry serves its own length and its checkpoints' only) */
    }
    while (pc->tail && pc->bytes + e->bytes > pc->budget) {
        drop(pc, pc->tail);
        pc->st.evictions++;
    }
    push_front(pc, e);
    pc->bytes += e->bytes;
    pc->st.saves++;
}

/* Loads the first n rows of e into the context (which then holds exactly those rows; for a hybrid
 * model n is e's length or one of its checkpoints' rows, whose states come along with the
 * checkpoints below them). */
static void restore(nx_ctx *c, const entry *e, int32_t n) {
    const size_t row = kv_row_bytes(c->m), H = (size_t)c->m->cfg.hidden_size, f = (size_t)nx_dn_saved_floats(c->m);
    nx_ctx_truncate(c, 0);
    memcpy(c->tokens, e->tokens, sizeof(int32_t) * (size_t)n);
    for (int32_t l = 0, i = 0; l < c->m->cfg.n_layers; l++)
        if (c->kv[l].k) nx_kv_copy_rows(c, c->kv[l], e->kv + (size_t)i++ * row * (size_t)e->n, e->n, n, false);
    memcpy(c->hidden, e->hidden, sizeof(float) * H * (size_t)n);
    c->n_past = n;
    const int32_t hn = e->mtp_n < n - 1 ? e->mtp_n : n - 1; /* the head's rows whose next token is kept */
    if (hn > 0) {
        nx_kv_copy_rows(c, c->mtp_kv, e->mtp_kv, e->mtp_n, hn, false);
        c->mtp_past = hn;
    }
    if (!e->dn) return;
    int at = e->n_ck;
    for (int i = 0; i < e->n_ck; i++)
        if (e->ck_rows[i] == n) at = i;
    nx_dn_load(c, n == e->n ? e->dn : e->ck + (size_t)at * f, n);
    for (int i = 0; i < e->n_ck && e->ck_rows[i] < n; i++) nx_dn_ckpt_put(c, e->ck_rows[i], e->ck + (size_t)i * f);
}

void nx_prompt_cache_keep(nx_prompt_cache *pc, const nx_ctx *c) {
    if (c->m->dist) return; /* rows held by several ranks: not copied (docs/multinode.md) */
    entry *e = c->n_past >= NX_PROMPT_CACHE_MIN_ROWS ? snapshot(pc, c) : NULL;
    if (e) insert(pc, e);
}

int32_t nx_prompt_cache_prepare(nx_prompt_cache *pc, nx_ctx *c, const int32_t *prompt, size_t n_prompt) {
    /* what nx_generate keeps: the shared prefix, less the prompt's last token */
    const int32_t usable = n_prompt > 0 && n_prompt <= (size_t)c->n_ctx ? (int32_t)n_prompt - 1 : 0;
    int32_t live = common(c->tokens, prompt, c->n_past < usable ? c->n_past : usable);
    live = nx_dn_rewind_floor(c, live); /* recurrent states go back only to some rows */
    if (c->m->dist) return live; /* a split model keeps only the live prefix */
    entry *best = NULL;
    int32_t best_n = live;
    for (entry *e = pc->head; e; e = e->next) {
        if (e->m != c->m || e->n > c->n_ctx) continue;
        const int32_t k = usable_rows(e, common(e->tokens, prompt, e->n < usable ? e->n : usable));
        if (k > best_n) best = e, best_n = k;
    }
    /* the rows the context is about to lose are copied first (unless they are few), and go into
     * the cache once the best entry is loaded, so that making room for them cannot evict it */
    entry *saved = c->n_past - live > 0 && c->n_past >= NX_PROMPT_CACHE_MIN_ROWS ? snapshot(pc, c) : NULL;
    if (best) {
        restore(c, best, best_n);
        unlink_entry(pc, best);
        push_front(pc, best);
        pc->st.restores++;
        pc->st.restored_tokens += best_n;
    }
    if (saved) insert(pc, saved);
    return best_n;
}
