/* JSON mode and tool-call mode as logits processors: each keeps its recogniser's state after
 * the tokens advanced (a history that rewinds exactly) and masks from a cache of recent states'
 * masks. */
#include "constrain/procs.h"

#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "constrain/json_grammar.h"
#include "constrain/proc_util.h"
#include "constrain/tool_grammar.h"

/* ---------------------------------------------------------------- JSON mode */

typedef struct json_proc {
    const nx_json_vocab *v;
    const nx_json_schema *schema;
    bool wait;
    int32_t after;
    nx_state_hist hist; /* of json_pstate */
    nx_mask_cache cache;
} json_proc;

typedef struct json_pstate {
    nx_json_state js;
    bool on; /* the mask applies (with wait: once `after` was generated) */
} json_pstate;

static void json_init(const void *g, void *state) {
    const json_proc *jp = g;
    json_pstate *st = state;
    memset(st, 0, sizeof *st);
    nx_json_init_schema(&st->js, jp->schema);
    st->on = !jp->wait;
}

/* The state after one more token (a token that is not text kills it, unless it ends the
 * generation). */
static void json_step(const void *g, void *state, int32_t id) {
    const json_proc *jp = g;
    const nx_json_vocab *v = jp->v;
    json_pstate *st = state;
    if (!st->on) {
        st->on = jp->wait && id == jp->after;
        return;
    }
    if (id >= 0 && id < v->n && v->bytes[id] && v->len[id] > 0) nx_json_feed(&st->js, v->bytes[id], v->len[id]);
    else if (!(id >= 0 && id < v->n && v->end[id])) nx_json_step(&st->js, 0);
}

static void json_fill(const void *g, const void *state, int32_t vocab, uint8_t *allow) {
    nx_json_allowed(((const json_proc *)g)->v, state, vocab, allow);
}

static bool json_mask(void *self, float *logits, int32_t n_vocab) {
    json_proc *jp = self;
    const json_pstate *st = nx_hist_state(&jp->hist);
    if (!st->on) return false;
    nx_mask_apply(nx_mask_cache_get(&jp->cache, jp, &st->js, json_fill), logits, n_vocab);
    return true;
}

static void json_advance(void *self, int32_t id) { nx_hist_advance(&((json_proc *)self)->hist, id); }
static void json_rewind(void *self, size_t n) { nx_hist_rewind(&((json_proc *)self)->hist, n); }

static void json_free(void *self) {
    json_proc *jp = self;
    if (!jp) return;
    nx_hist_free(&jp->hist);
    nx_mask_cache_free(&jp->cache);
    free(jp);
}

static const nx_logits_proc_ops JSON_OPS = {json_mask, json_advance, json_rewind, json_free};

nx_status nx_json_proc_new(const nx_json_vocab *v, const nx_json_schema *schema, bool wait, int32_t after,
                           int32_t n_vocab, nx_logits_proc *out, nx_error *err) {
    json_proc *jp = calloc(1, sizeof *jp);
    if (!jp) return nx_fail(err, NX_E_NOMEM, "JSON mode: out of memory");
    jp->v = v, jp->schema = schema, jp->wait = wait, jp->after = after;
    bool ok = nx_hist_init(&jp->hist, jp, sizeof(json_pstate), json_init, json_step);
    ok = nx_mask_cache_init(&jp->cache, sizeof(nx_json_state), n_vocab) && ok;
    if (!ok) {
        json_free(jp);
        return nx_fail(err, NX_E_NOMEM, "JSON mode: out of memory for a vocabulary of %d", (int)n_vocab);
    }
    *out = (nx_logits_proc){&JSON_OPS, jp};
    return NX_OK;
}

/* ---------------------------------------------------------------- tool-call mode */

typedef struct tool_proc {
    const nx_tool_grammar *g;
    nx_state_hist hist; /* of nx_tool_state */
    nx_mask_cache cache;
} tool_proc;

static void tool_init(const void *g, void *state) {
    memset(state, 0, sizeof(nx_tool_state));
    nx_tool_init(((const tool_proc *)g)->g, state);
}

static void tool_step(const void *g, void *state, int32_t id) { nx_tool_step(((const tool_proc *)g)->g, state, id); }

static void tool_fill(const void *g, const void *state, int32_t vocab, uint8_t *allow) {
    nx_tool_allowed(((const tool_proc *)g)->g, state, vocab, allow);
}

static bool tool_mask(void *self, float *logits, int32_t n_vocab) {
    tool_proc *tp = self;
    nx_mask_apply(nx_mask_cache_get(&tp->cache, tp, nx_hist_state(&tp->hist), tool_fill), logits, n_vocab);
    return true;
}

static void tool_advance(void *self, int32_t id) { nx_hist_advance(&((tool_proc *)self)->hist, id); }
static void tool_rewind(void *self, size_t n) { nx_hist_rewind(&((tool_proc *)self)->hist, n); }

static void tool_free(void *self) {
    tool_proc *tp = self;
    if (!tp) return;
    nx_hist_free(&tp->hist);
    nx_mask_cache_free(&tp->cache);
    free(tp);
}

static const nx_logits_proc_ops TOOL_OPS = {tool_mask, tool_advance, tool_rewind, tool_free};

nx_status nx_tool_proc_new(const nx_tool_grammar *g, int32_t n_vocab, nx_logits_proc *out, nx_error *err) {
    tool_proc *tp = calloc(1, sizeof *tp);
    if (!tp) return nx_fail(err, NX_E_NOMEM, "tool-call mode: out of memory");
    tp->g = g;
    bool ok = nx_hist_init(&tp->hist, tp, sizeof(nx_tool_state), tool_init, tool_step);
    ok = nx_mask_cache_init(&tp->cache, sizeof(nx_tool_state), n_vocab) && ok;
    if (!ok) {
        tool_free(tp);
        return nx_fail(err, NX_E_NOMEM, "tool-call mode: out of memory for a vocabulary of %d", (int)n_vocab);
    }
    *out = (nx_logits_proc){&TOOL_OPS, tp};
    return NX_OK;
}

/* ---------------------------------------------------------------- from sampler parameters */

nx_status nx_constrain_procs(const nx_sampler_params *p, int32_t n_vocab, nx_logits_proc *out, size_t *n,
                             nx_error *err) {
    *n = 0;
    nx_status st = NX_OK;
    if (p->tools) st = nx_tool_proc_new(p->tools, n_vocab, out, err);
    else if (p->json) st = nx_json_proc_new(p->json, p->json_schema, p->json_wait, p->json_after, n_vocab, out, err);
    else return NX_OK;
    if (st == NX_OK) *n = 1;
    return st;
}
