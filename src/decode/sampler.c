/* The sampler: turns one row of logits into the *processed* distribution that tokens are drawn
 * from — the p (target) and q (draft) of speculative verification, so both must come from this
 * one function — and draws from it with a seeded xoshiro256** stream.
 *
 * Processing order (vLLM's, with llama.cpp's place for the logit bias; every stage is skipped at
 * its neutral value):
 *   0. Logit bias: each listed token's bias is added to its raw logit.
 *   1. Penalties on the biased logits. Repetition (HF/vLLM rule) over prompt + generated tokens:
 *      logit > 0 ? logit / r : logit * r. Then presence and frequency (OpenAI rule) over generated
 *      tokens only: logit -= frequency * count + presence * [count > 0]. The `extra` tokens of a
 *      call count as generated for that call only (the drafts that precede a verify row).
 *      Then the logits processors, in order, set the logits of the tokens they forbid to -inf
 *      (JSON mode's or tool-call mode's first, src/constrain/, then the caller's), each at its
 *      state after the history and the extra tokens; then the ban list (min_tokens' end tokens)
 *      while fewer than ban_until tokens are generated, unless it would leave no token a
 *      processor allows (a complete object or call then ends early).
 *   2. Temperature. 0 means greedy: a one-hot at the argmax of the penalised logits, lowest id on
 *      ties; the filters below do not apply to it.
 *   3. Top-k: the k largest penalised logits; ties at the boundary go to the lower id.
 *   4. Top-p over the renormalised top-k distribution: the smallest prefix of tokens in
 *      descending order (ties: lower id first) whose mass reaches top_p; never empty.
 *   5. Min-p: drop tokens with p < min_p * p_max (p_max is the most likely surviving token).
 *   6. Renormalise the survivors.
 * Softmax is computed in double with max subtraction (each weight within 2 ulp of libm's exp).
 * NaN logits count as -inf; if some logits are +inf the distribution is uniform over them; if
 * every logit is -inf the result is a one-hot at id 0 (the greedy argmax of an all-masked row),
 * so callers always get a valid distribution.
 *
 * Cost at vocab 120832: one copy of the row, one max scan and (unless greedy or top-k) one exp
 * per token (nx_exp_weights: 8 doubles at a time on AVX-512; 0.20 ms for a temperature-only
 * row against 0.49 ms with libm's exp). Top-k is a heap (small k) or a quickselect; top-p
 * histograms mass into logit buckets and sorts only the bucket holding the nucleus boundary;
 * nothing sorts the vocabulary.
 *
 * A sampler is not thread-safe: nx_sampler_probs borrows the count table for the extra tokens. */
#include "base/error.h"
#include "constrain/procs.h"
#include "decode/rng.h"
#include "decode/spec_rules.h"
#include "kernels/kernels.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* A token still in the running after top-k: its penalised logit x orders candidates (exactly,
 * before any rounding in exp), w = exp((x - max) / T) is its unnormalised weight. */
typedef struct sampler_cand {
    double w;
    float x;
    int32_t id;
} sampler_cand;

struct nx_sampler {
    nx_sampler_params p;
    int32_t vocab;
    nx_rng rng;
    int32_t *counts;      /* [vocab] occurrences among generated (and, during a call, extra) */
    uint8_t *in_prompt;   /* [(vocab + 7) / 8] bitmap of prompt tokens */
    int32_t *prompt_ids;  /* [vocab] the distinct prompt tokens, so penalties touch only them */
    size_t n_prompt_ids;
    int32_t *gen;         /* [cap_gen] generated tokens in order, for rewind */
    size_t n_gen, cap_gen;
    float *work;          /* [vocab] penalised logits of the current call */
    nx_logit_bias *bias;  /* the n_logit_bias entries (s->p.logit_bias points here) */
    int32_t *ban;         /* the n_ban entries (s->p.ban points here) */
    float *bias_of;       /* [vocab] each token's total bias, or NULL when there is none */
    sampler_cand *cand;   /* [vocab] candidates of the current call */
    double *dw;           /* [vocab] weights of the current call's tokens (no top-k) */
    /* the logits processors in order, each advanced by the generated history; the first
     * n_own (JSON or tool-call mode's, made from the parameters) are the sampler's to free */
    nx_logits_proc *procs;
    size_t n_procs, n_own;
};

/* ---------------------------------------------------------------- parameters */

void nx_sampler_params_default(nx_sampler_params *p) {
    if (!p) return;
    memset(p, 0, sizeof *p);
    p->temperature = 0.0f;
    p->top_k = 0;
    p->top_p = 1.0f;
    p->min_p = 0.0f;
    p->repetition_penalty = 1.0f;
    p->presence_penalty = 0.0f;
    p->frequency_penalty = 0.0f;
    p->seed = 0;
}

/* Both comparisons are false for NaN, so NaN fails every range check. */
static bool param_in(float v, float lo, float hi) {
    return v >= lo && v <= hi;
}

nx_status nx_sampler_params_check(const nx_sampler_params *p, nx_error *err) {
    if (!p) return nx_fail(err, NX_E_ARG, "sampler parameters: NULL");
    if (!param_in(p->temperature, 0.0f, 100.0f))
        return nx_fail(err, NX_E_ARG, "temperature must be in [0, 100] (0 = greedy), got %g",
                       (double)p->temperature);
    if (p->top_k < 0)
        return nx_fail(err, NX_E_ARG, "top_k must be >= 0 (0 = off), got %d", (int)p->top_k);
    if (!(p->top_p > 0.0f && p->top_p <= 1.0f))
        return nx_fail(err, NX_E_ARG, "top_p must be in (0, 1] (1 = off), got %g",
                       (double)p->top_p);
    if (!param_in(p->min_p, 0.0f, 1.0f))
        return nx_fail(err, NX_E_ARG, "min_p must be in [0, 1] (0 = off), got %g",
                       (double)p->min_p);
    if (!(p->repetition_penalty > 0.0f && p->repetition_penalty <= 10.0f))
        return nx_fail(err, NX_E_ARG, "repetition_penalty must be in (0, 10] (1 = off), got %g",
                       (double)p->repetition_penalty);
    if (!param_in(p->presence_penalty, -2.0f, 2.0f))
        return nx_fail(err, NX_E_ARG, "presence_penalty must be in [-2, 2] (0 = off), got %g",
                       (double)p->presence_penalty);
    if (!param_in(p->frequency_penalty, -2.0f, 2.0f))
        return nx_fail(err, NX_E_ARG, "frequency_penalty must be in [-2, 2] (0 = off), got %g",
                       (double)p->frequency_penalty);
    if (p->n_logit_bias > 0 && !p->logit_bias)
        return nx_fail(err, NX_E_ARG, "logit_bias: %zu entries but no array", p->n_logit_bias);
    for (size_t i = 0; i < p->n_logit_bias; i++) {
        if (p->logit_bias[i].id < 0)
            return nx_fail(err, NX_E_ARG, "logit_bias: token id %d is negative", (int)p->logit_bias[i].id);
        if (!param_in(p->logit_bias[i].bias, -100.0f, 100.0f))
            return nx_fail(err, NX_E_ARG, "logit_bias: the bias of token %d must be in [-100, 100], got %g",
                           (int)p->logit_bias[i].id, (double)p->logit_bias[i].bias);
    }
    return NX_OK;
}

/* ---------------------------------------------------------------- lifetime */

/* The list: the processors the json / tools fields make, then the caller's, all at state 0. */
static nx_status sampler_procs(nx_sampler *s, const nx_sampler_params *p, nx_error *err) {
    s->p.procs = NULL;
    if (p->n_procs > 0 && !p->procs) return nx_fail(err, NX_E_ARG, "procs: %zu entries but no array", p->n_procs);
    for (size_t i = 0; i < p->n_procs; i++)
        if (!p->procs[i].ops || !p->procs[i].ops->mask || !p->procs[i].ops->advance || !p->procs[i].ops->rewind)
            return nx_fail(err, NX_E_ARG, "procs[%zu]: mask, advance and rewind are required", i);
    if (!(s->procs = malloc((p->n_procs + 1) * sizeof *s->procs)))
        return nx_fail(err, NX_E_NOMEM, "sampler: out of memory");
    nx_status st = nx_constrain_procs(p, s->vocab, s->procs, &s->n_own, err);
    if (st != NX_OK) return st;
    if (p->n_procs) memcpy(s->procs + s->n_own, p->procs, p->n_procs * sizeof *s->procs);
    s->n_procs = s->n_own + p->n_procs;
    for (size_t i = 0; i < s->n_procs; i++) s->procs[i].ops->rewind(s->procs[i].self, 0);
    return NX_OK;
}

nx_status nx_sampler_new(const nx_sampler_params *p, int32_t vocab_size, nx_sampler **out,
                         nx_error *err) {
    nx_sampler *s = NULL;
    nx_status st;
    if (!out) return nx_fail(err, NX_E_ARG, "nx_sampler_new: NULL output pointer");
    *out = NULL;
    if ((st = nx_sampler_params_check(p, err)) != NX_OK) return st;
    if (vocab_size <= 0)
        return nx_fail(err, NX_E_ARG, "sampler: vocab_size must be > 0, got %d", (int)vocab_size);
    for (size_t i = 0; i < p->n_logit_bias; i++)
        if (p->logit_bias[i].id >= vocab_size)
            return nx_fail(err, NX_E_ARG, "logit_bias: token id %d is out of range [0, %d)", (int)p->logit_bias[i].id,
                           (int)vocab_size);
    if (p->n_ban > 0 && !p->ban) return nx_fail(err, NX_E_ARG, "ban: %zu entries but no array", p->n_ban);
    for (size_t i = 0; i < p->n_ban; i++)
        if (p->ban[i] < 0 || p->ban[i] >= vocab_size)
            return nx_fail(err, NX_E_ARG, "ban: token id %d is out of range [0, %d)", (int)p->ban[i], (int)vocab_size);
    size_t v = (size_t)vocab_size;
    if (v > SIZE_MAX / sizeof(sampler_cand))
        return nx_fail(err, NX_E_NOMEM, "sampler: vocab_size %d too large", (int)vocab_size);

    s = calloc(1, sizeof *s);
    if (!s) goto nomem;
    s->p = *p;
    s->vocab = vocab_size;
    nx_rng_seed(&s->rng, p->seed);
    s->counts = calloc(v, sizeof *s->counts);
    s->in_prompt = calloc((v + 7) / 8, 1);
    s->prompt_ids = malloc(v * sizeof *s->prompt_ids);
    s->cap_gen = 1024;
    s->gen = malloc(s->cap_gen * sizeof *s->gen);
    s->work = malloc(v * sizeof *s->work);
    s->cand = malloc(v * sizeof *s->cand);
    s->dw = malloc(v * sizeof *s->dw);
    if (!s->counts || !s->in_prompt || !s->prompt_ids || !s->gen || !s->work || !s->cand || !s->dw)
        goto nomem;
    s->p.logit_bias = NULL;
    if (p->n_logit_bias > 0) {
        s->bias = malloc(p->n_logit_bias * sizeof *s->bias);
        s->bias_of = calloc(v, sizeof *s->bias_of);
        if (!s->bias || !s->bias_of) goto nomem;
        memcpy(s->bias, p->logit_bias, p->n_logit_bias * sizeof *s->bias);
        for (size_t i = 0; i < p->n_logit_bias; i++) s->bias_of[s->bias[i].id] += s->bias[i].bias;
        s->p.logit_bias = s->bias;
    }
    s->p.ban = NULL;
    if (p->n_ban > 0) {
        if (!(s->ban = malloc(p->n_ban * sizeof *s->ban))) goto nomem;
        memcpy(s->ban, p->ban, p->n_ban * sizeof *s->ban);
        s->p.ban = s->ban;
    }
    if ((st = sampler_procs(s, p, err)) != NX_OK) {
        nx_sampler_free(s);
        return st;
    }
    *out = s;
    return NX_OK;

nomem:
    nx_sampler_free(s);
    return nx_fail(err, NX_E_NOMEM, "sampler: out of memory for vocab_size %d", (int)vocab_size);
}

void nx_sampler_free(nx_sampler *s) {
    if (!s) return;
    free(s->counts);
    free(s->in_prompt);
    free(s->prompt_ids);
    free(s->gen);
    free(s->work);
    free(s->cand);
    free(s->dw);
    free(s->bias);
    free(s->bias_of);
    free(s->ban);
    for (size_t i = 0; i < s->n_own; i++)
        if (s->procs[i].ops->free) s->procs[i].ops->free(s->procs[i].self);
    free(s->procs);
    free(s);
}

int32_t nx_sampler_vocab_size(const nx_sampler *s) {
    return s ? s->vocab : 0;
}

/* ---------------------------------------------------------------- history */

static bool sampler_valid_id(const nx_sampler *s, int32_t id) {
    return id >= 0 && id < s->vocab;
}

static bool sampler_in_prompt(const nx_sampler *s, int32_t id) {
    return (s->in_prompt[id >> 3] >> (id & 7)) & 1;
}

/* The processors after the history and then the n extra tokens: advanced by them (a verify
 * row's drafts), masked, and rewound to the history, so each mask is at the state the drafts
 * would give and the list is left as it was. Returns whether any processor masked. */
static bool procs_mask(nx_sampler *s, float *x, const int32_t *extra, size_t n_extra) {
    bool any = false;
    for (size_t i = 0; i < s->n_procs; i++) {
        const nx_logits_proc *lp = &s->procs[i];
        for (size_t j = 0; j < n_extra; j++) lp->ops->advance(lp->self, extra[j]);
        any |= lp->ops->mask(lp->self, x, s->vocab);
        if (n_extra) lp->ops->rewind(lp->self, s->n_gen);
    }
    return any;
}

/* Replaces the prompt; generated history is untouched. Out-of-range ids are ignored. */
void nx_sampler_set_prompt(nx_sampler *s, const int32_t *ids, size_t n) {
    if (!s) return;
    for (size_t i = 0; i < s->n_prompt_ids; i++) {
        int32_t id = s->prompt_ids[i];
        s->in_prompt[id >> 3] &= (uint8_t)~(1u << (id & 7));
    }
    s->n_prompt_ids = 0;
    for (size_t i = 0; ids && i < n; i++) {
        int32_t id = ids[i];
        if (!sampler_valid_id(s, id) || sampler_in_prompt(s, id)) continue;
        s->in_prompt[id >> 3] |= (uint8_t)(1u << (id & 7));
        s->prompt_ids[s->n_prompt_ids++] = id; /* distinct ids, so never more than vocab */
    }
}

/* Out-of-range ids take a place in the history (so n_generated matches the caller's count) but
 * penalise nothing. If the history cannot grow (out of memory) the token is dropped whole, which
 * keeps counts and history consistent for rewind. */
void nx_sampler_accept(nx_sampler *s, int32_t id) {
    if (!s) return;
    if (s->n_gen == s->cap_gen) {
        if (s->cap_gen > SIZE_MAX / 2 / sizeof *s->gen) return;
        size_t cap = s->cap_gen * 2;
        int32_t *g = realloc(s->gen, cap * sizeof *g);
        if (!g) return;
        s->gen = g;
        s->cap_gen = cap;
    }
    s->gen[s->n_gen++] = id;
    if (sampler_valid_id(s, id)) s->counts[id]++;
    for (size_t i = 0; i < s->n_procs; i++) s->procs[i].ops->advance(s->procs[i].self, id);
}

size_t nx_sampler_n_generated(const nx_sampler *s) {
    return s ? s->n_gen : 0;
}

void nx_sampler_rewind(nx_sampler *s, size_t n) {
    if (!s) return;
    if (s->n_gen <= n) return;
    while (s->n_gen > n) {
        int32_t id = s->gen[--s->n_gen];
        if (sampler_valid_id(s, id)) s->counts[id]--;
    }
    for (size_t i = 0; i < s->n_procs; i++) s->procs[i].ops->rewind(s->procs[i].self, n);
}

/* ---------------------------------------------------------------- penalties */

static bool sampler_has_penalties(const nx_sampler *s) {
    return s->p.repetition_penalty != 1.0f || s->p.presence_penalty != 0.0f ||
           s->p.frequency_penalty != 0.0f;
}

/* The penalised logit of one token. It is a function of the raw logit, the token's bias and its
 * history only, so writing it more than once (a token seen many times) is harmless. */
static float sampler_penalty(const nx_sampler *s, float x, int32_t id) {
    if (s->bias_of) x += s->bias_of[id];
    int32_t c = s->counts[id];
    float r = s->p.repetition_penalty;
    if (r != 1.0f && (c > 0 || sampler_in_prompt(s, id))) x = x > 0.0f ? x / r : x * r;
    x -= s->p.frequency_penalty * (float)c;
    if (c > 0) x -= s->p.presence_penalty;
    return x;
}

/* work = logits with the bias and penalties applied. Only biased tokens and tokens in the
 * history can change, so the cost is the copy plus O(biased + prompt distinct + generated +
 * extra). */
static void sampler_penalise(nx_sampler *s, const float *logits, const int32_t *extra,
                             size_t n_extra) {
    memcpy(s->work, logits, (size_t)s->vocab * sizeof *s->work);
    for (size_t i = 0; i < s->p.n_logit_bias; i++) {
        const int32_t id = s->bias[i].id;
        s->work[id] = logits[id] + s->bias_of[id];
    }
    if (!sampler_has_penalties(s)) return;
    for (size_t i = 0; i < n_extra; i++)
        if (sampler_valid_id(s, extra[i])) s->counts[extra[i]]++;

    for (size_t i = 0; i < s->n_prompt_ids; i++) {
        int32_t id = s->prompt_ids[i];
        s->work[id] = sampler_penalty(s, logits[id], id);
    }
    for (size_t i = 0; i < s->n_gen; i++) {
        int32_t id = s->gen[i];
        if (sampler_valid_id(s, id)) s->work[id] = sampler_penalty(s, logits[id], id);
    }
    for (size_t i = 0; i < n_extra; i++) {
        int32_t id = extra[i];
        if (sampler_valid_id(s, id)) s->work[id] = sampler_penalty(s, logits[id], id);
    }

    for (size_t i = 0; i < n_extra; i++)
        if (sampler_valid_id(s, extra[i])) s->counts[extra[i]]--;
}

/* ---------------------------------------------------------------- candidate ordering */

/* The one total order used by top-k and top-p: larger logit first, lower id on ties. */
static inline bool cand_before(const sampler_cand *a, const sampler_cand *b) {
    return a->x > b->x || (a->x == b->x && a->id < b->id);
}

static int cand_cmp(const void *pa, const void *pb) {
    const sampler_cand *a = pa, *b = pb;
    if (cand_before(a, b)) return -1;
    if (cand_before(b, a)) return 1;
    return 0;
}

static inline void cand_swap(sampler_cand *a, sampler_cand *b) {
    sampler_cand t = *a;
    *a = *b;
    *b = t;
}

/* Partitions c[lo..hi) (hi - lo >= 3) around a median-of-three pivot and returns the pivot's
 * final index i: c[lo..i) come before it in cand order, c(i..hi) after; *mass_before is the
 * weight of c[lo..i). The keys are distinct (ids break ties), so even a row of equal logits
 * splits evenly. */
static size_t cand_partition(sampler_cand *c, size_t lo, size_t hi, double *mass_before) {
    size_t mid = lo + (hi - lo) / 2, last = hi - 1;
    if (cand_before(&c[mid], &c[lo])) cand_swap(&c[mid], &c[lo]);
    if (cand_before(&c[last], &c[lo])) cand_swap(&c[last], &c[lo]);
    if (cand_before(&c[last], &c[mid])) cand_swap(&c[last], &c[mid]);
    cand_swap(&c[mid], &c[last]);
    const sampler_cand pivot = c[last];
    size_t i = lo;
    double mass = 0.0;
    for (size_t j = lo; j < last; j++) {
        if (cand_before(&c[j], &pivot)) {
            mass += c[j].w;
            cand_swap(&c[i++], &c[j]);
        }
    }
    cand_swap(&c[i], &c[last]);
    *mass_before = mass;
    return i;
}

/* Partition rounds allowed before falling back to a sort, keeping the worst case O(n log n). */
enum { CAND_DEPTH_BUDGET = 128, CAND_SMALL = 32, TOPK_HEAP_MAX = 1024 };

/* Rearranges c[0..n) so that c[0..k) holds the k first candidates in cand order (unordered). */
static void cand_select(sampler_cand *c, size_t n, size_t k) {
    size_t lo = 0, hi = n;
    for (int budget = CAND_DEPTH_BUDGET; hi - lo > CAND_SMALL && lo < k && k < hi; budget--) {
        if (budget == 0) break;
        double unused;
        size_t i = cand_partition(c, lo, hi, &unused);
        if (i >= k) hi = i;
        else lo = i + 1;
    }
    if (lo < k && k < hi) qsort(c + lo, hi - lo, sizeof *c, cand_cmp);
}

/* Top-k of x[0..V) by a min-heap of the k best so far (root = the worst of them). A token
 * enters only if its logit is strictly larger than the root's: on a tie the earlier, lower id
 * wins, which is the cand order. One compare per token for small k. Returns the count (< k
 * when fewer than k logits are finite). */
static size_t topk_heap(const float *x, int32_t V, size_t k, sampler_cand *h) {
    size_t n = 0;
    for (int32_t i = 0; i < V; i++) {
        if (!(x[i] > -INFINITY)) continue;
        sampler_cand e = {0.0, x[i], i};
        size_t j;
        if (n < k) { /* sift up */
            j = n++;
            while (j > 0 && cand_before(&h[(j - 1) / 2], &e)) {
                h[j] = h[(j - 1) / 2];
                j = (j - 1) / 2;
            }
            h[j] = e;
            continue;
        }
        if (!(e.x > h[0].x)) continue;
        j = 0; /* replace the root, sift down */
        for (;;) {
            size_t l = 2 * j + 1, w = j;
            const sampler_cand *wp = &e;
            if (l < n && cand_before(wp, &h[l])) w = l, wp = &h[l];
            if (l + 1 < n && cand_before(wp, &h[l + 1])) w = l + 1, wp = &h[l + 1];
            if (w == j) break;
            h[j] = h[w];
            j = w;
        }
        h[j] = e;
    }
    return n;
}

enum { NUCLEUS_BUCKETS = 512, NUCLEUS_LEVELS = 4 };

/* Bucket of logit x on [xmin, xmax] split into NUCLEUS_BUCKETS, bucket 0 holding xmax. It is
 * monotone in x (rounding is), so buckets never reorder candidates; ties share a bucket. */
static inline int nucleus_bucket(float x, double xmax, double scale) {
    double b = (xmax - (double)x) * scale;
    return b < (double)(NUCLEUS_BUCKETS - 1) ? (int)b : NUCLEUS_BUCKETS - 1;
}

/* The nucleus of c[0..n) (weights w, total z): rearranges c so that c[0..K) is the smallest
 * prefix in cand order whose mass reaches top_p, and returns K. Each level histograms the
 * remaining candidates' mass into logit buckets, keeps the buckets wholly inside the nucleus,
 * and narrows to the one bucket holding the boundary; only that last, small bucket is sorted.
 * Linear time, and the partitions are branch-free (a data-dependent branch per token would
 * mispredict half the time on a flat distribution). */
static size_t cand_nucleus(sampler_cand *c, size_t n, double z, double top_p) {
    double mass[NUCLEUS_BUCKETS];
    size_t lo = 0, hi = n;
    double acc = 0.0; /* mass of c[0..lo), all inside the nucleus; the boundary is in [lo, hi) */
    for (int level = 0; level < NUCLEUS_LEVELS && hi - lo > CAND_SMALL; level++) {
        float fmin = c[lo].x, fmaxv = c[lo].x;
        for (size_t j = lo + 1; j < hi; j++) {
            fmin = c[j].x < fmin ? c[j].x : fmin;
            fmaxv = c[j].x > fmaxv ? c[j].x : fmaxv;
        }
        if (fmin == fmaxv) break; /* all tied: only the id order is left, sort below */
        const double xmax = fmaxv, scale = NUCLEUS_BUCKETS / ((double)fmaxv - (double)fmin);
        memset(mass, 0, sizeof mass);
        for (size_t j = lo; j < hi; j++) mass[nucleus_bucket(c[j].x, xmax, scale)] += c[j].w;
        int bnd = 0;
        double cum = acc;
        while (bnd < NUCLEUS_BUCKETS - 1 && (cum + mass[bnd]) / z < top_p) cum += mass[bnd++];
        /* Buckets before bnd are in; bucket bnd holds the boundary; the rest are out. */
        size_t a = lo;
        for (size_t j = lo; j < hi; j++) {
            size_t in = nucleus_bucket(c[j].x, xmax, scale) < bnd;
            cand_swap(&c[a], &c[j]); /* harmless when out: c[a..j) are all out */
            a += in;
        }
        size_t e = a;
        for (size_t j = a; j < hi; j++) {
            size_t in = nucleus_bucket(c[j].x, xmax, scale) == bnd;
            cand_swap(&c[e], &c[j]);
            e += in;
        }
        acc = cum;
        lo = a;
        hi = e;
    }
    qsort(c + lo, hi - lo, sizeof *c, cand_cmp);
    for (size_t j = lo; j < hi; j++) {
        acc += c[j].w;
        if (acc / z >= top_p) return j + 1;
    }
    return hi; /* rounding left the mass a hair short: keep everything still in the running */
}

/* ---------------------------------------------------------------- the processed distribution */

static void probs_one_hot(const nx_sampler *s, float *probs, int32_t id) {
    memset(probs, 0, (size_t)s->vocab * sizeof *probs);
    probs[id] = 1.0f;
}

/* Top-k / top-p / min-p over s->work (max m, 1/T = inv_t), result in probs. */
static void sampler_filter(nx_sampler *s, double m, double inv_t, float *probs) {
    const int32_t V = s->vocab;
    const float *x = s->work;
    sampler_cand *c = s->cand;
    const nx_sampler_params *p = &s->p;
    size_t n = 0;

    /* the weights and the mass z of the top-k set (or of everything: top-p's reference); without
     * top-k they come straight from the logits, and candidates are made only of the tokens that
     * pass the cut below (a -inf logit weighs 0 and adds nothing to z) */
    double z = 0.0, *dw = s->dw;
    const bool topk = p->top_k > 0 && p->top_k < V;
    if (topk) {
        size_t k = (size_t)p->top_k;
        if (k <= TOPK_HEAP_MAX) {
            n = topk_heap(x, V, k, c);
        } else {
            for (int32_t i = 0; i < V; i++)
                if (x[i] > -INFINITY) c[n++] = (sampler_cand){0.0, x[i], i};
            if (n > k) {
                cand_select(c, n, k);
                n = k;
            }
        }
        for (size_t j = 0; j < n; j++) {
            c[j].w = exp(((double)c[j].x - m) * inv_t);
            z += c[j].w;
        }
    } else {
        z = nx_exp_weights(x, V, (float)m, inv_t, dw);
        for (int32_t i = 0; i < V; i++) n += x[i] > -INFINITY;
    }

    /* Tokens whose weight is below thr cannot survive top-p / min-p, so they leave the list
     * before the nucleus search. Min-p: w_max is exactly exp(0) = 1 (the argmax survives top-k
     * and top-p). Top-p: the tokens under t = (1 - top_p) z / (2 n) hold less than
     * (1 - top_p) / 2 of the mass, so those above t already reach top_p and the nucleus ends
     * among them; the factor 2 leaves room for rounding. */
    double thr = 0.0;
    if (p->min_p > 0.0f) thr = (double)p->min_p;
    if (p->top_p < 1.0f && n > 0) thr = fmax(thr, (1.0 - (double)p->top_p) * z / (2.0 * (double)n));
    size_t o = 0;
    if (topk) {
        for (size_t j = 0; j < n; j++) { /* branch-free: the outcome is a coin flip when flat */
            c[o] = c[j];
            o += c[j].w >= thr && c[j].w > 0.0;
        }
    } else {
        for (int32_t i = 0; i < V; i++)
            if (dw[i] >= thr && dw[i] > 0.0) c[o++] = (sampler_cand){dw[i], x[i], i};
    }
    n = o;

    /* If min-p's cut removed tokens the nucleus would have needed, the nucleus reaches past the
     * list's end and cand_nucleus keeps all of it, which is what top-p then min-p keep too. */
    if (p->top_p < 1.0f && n > 1) n = cand_nucleus(c, n, z, (double)p->top_p);

    if (p->min_p > 0.0f && n > 1) {
        double w_max = 0.0;
        for (size_t j = 0; j < n; j++) w_max = fmax(w_max, c[j].w);
        double cut = (double)p->min_p * w_max;
        o = 0;
        for (size_t j = 0; j < n; j++)
            if (c[j].w >= cut) c[o++] = c[j];
        n = o;
    }

    double zk = 0.0;
    for (size_t j = 0; j < n; j++) zk += c[j].w;
    memset(probs, 0, (size_t)V * sizeof *probs);
    for (size_t j = 0; j < n; j++) probs[c[j].id] = (float)(c[j].w / zk);
}

static bool is_banned(const nx_sampler *s, int32_t id) {
    for (size_t i = 0; i < s->p.n_ban; i++)
        if (s->p.ban[i] == id) return true;
    return false;
}

void nx_sampler_probs(nx_sampler *s, const float *logits, const int32_t *extra, size_t n_extra,
                      float *probs) {
    const int32_t V = s->vocab;
    if (!extra) n_extra = 0;
    sampler_penalise(s, logits, extra, n_extra);
    float *x = s->work;
    const bool masked = procs_mask(s, x, extra, n_extra);
    /* min_tokens' ban, unless it would leave nothing: where a grammar allows only the end (the
     * object or the calls are complete), the end comes early rather than text that breaks them */
    if (s->p.n_ban > 0 && s->n_gen + n_extra < (size_t)(s->p.ban_until > 0 ? s->p.ban_until : 0)) {
        bool left = !masked; /* without a processor's mask the ban always applies */
        for (int32_t i = 0; !left && i < V; i++) left = x[i] > -INFINITY && !is_banned(s, i);
        if (left)
            for (size_t i = 0; i < s->p.n_ban; i++) x[s->p.ban[i]] = -INFINITY;
    }

    /* Max scan; NaN becomes -inf so that it can never win or carry mass. */
    float m;
    const int32_t arg = (int32_t)nx_argmax_f32(x, V, &m);
    if (s->p.temperature == 0.0f || m == -INFINITY) {
        probs_one_hot(s, probs, arg);
        return;
    }
    if (m == INFINITY) { /* the +inf tokens tie for all of the mass */
        for (int32_t i = 0; i < V; i++) x[i] = x[i] == INFINITY ? 0.0f : -INFINITY;
        m = 0.0f;
    }

    const double inv_t = 1.0 / (double)s->p.temperature;
    const nx_sampler_params *p = &s->p;
    if ((p->top_k > 0 && p->top_k < V) || p->top_p < 1.0f || p->min_p > 0.0f) {
        sampler_filter(s, (double)m, inv_t, probs);
        return;
    }
    const double inv_z = 1.0 / nx_exp_weights(x, V, m, inv_t, s->dw);
    for (int32_t i = 0; i < V; i++) probs[i] = (float)(s->dw[i] * inv_z);
}

/* ---------------------------------------------------------------- drawing */

double nx_sampler_uniform(nx_sampler *s) {
    return nx_rng_uniform(&s->rng);
}

/* Inverse CDF over the positive entries, scaled by their actual total so a distribution whose
 * floats sum to 1 ± rounding is still sampled exactly in proportion. A zero-probability token is
 * never returned while any token has positive probability (the CDF only steps at positive
 * entries); an all-zero row returns 0. */
int32_t nx_sampler_draw(nx_sampler *s, const float *probs) {
    const int32_t V = s->vocab;
    double total = 0.0;
    for (int32_t i = 0; i < V; i++) total += probs[i] > 0.0f ? (double)probs[i] : 0.0;
    const double target = nx_rng_uniform(&s->rng) * total;
    if (!(total > 0.0)) return 0;
    double cum = 0.0;
    for (int32_t i = 0; i < V; i++) {
        cum += probs[i] > 0.0f ? (double)probs[i] : 0.0;
        if (cum > target) return i; /* cum only grows at positive entries, so probs[i] > 0 */
    }
    /* target rounded up to the total: the last positive entry. */
    int32_t last = V - 1;
    while (last > 0 && !(probs[last] > 0.0f)) last--;
    return last;
}

/* An exponential race (the Gumbel-max trick): token i finishes at E_i / p_i with E_i ~ Exp(1)
 * fixed by (seed, index, i), and the first to finish wins, which is token i with probability
 * p_i / Σp. Two distributions raced with the same E agree often (see nx_spec_coupled_rate). */
int32_t nx_sampler_draw_at(nx_sampler *s, const float *probs, uint64_t index) {
    const uint64_t key = nx_rng_key(s->p.seed, index);
    int32_t best = -1;
    double best_t = INFINITY;
    for (int32_t i = 0; i < s->vocab; i++) {
        if (!(probs[i] > 0.0f)) continue;
        const double u = nx_rng_open_at(key, (uint64_t)i);
        /* token i finishes at -log(u)/p, not before best_t, when u <= exp(-best_t·p); 1 - x <=
         * exp(-x) makes u below (1 - best_t·p) (less a margin far above rounding) a safe skip,
         * and leaves about best_t·Σp logs per draw instead of one per token */
        if (u < (1.0 - best_t * (double)probs[i]) * (1.0 - 0x1p-30)) continue;
        const double t = -log(u) / (double)probs[i];
        if (t < best_t) best_t = t, best = i;
    }
    return best < 0 ? 0 : best;
}

bool nx_sampler_is_greedy(const nx_sampler *s) {
    return s && s->p.temperature == 0.0f;
}
