/* The generation workers: one thread per slot (--parallel), each owning its slot's context and
 * running queued jobs in arrival order, generating each prompt's choices and feeding streams
 * chunk by chunk. With several slots the contexts share a batch (nx_batch): their forwards run
 * together, one forward per step for every running sequence. Slot actions (save, restore, erase a
 * context's rows) are jobs of their slot's worker, so they never overlap its generations.
 * Connection threads queue, cancel and wait on jobs through the functions here. */
#include "serve/worker.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>

#include "base/clock.h"
#include "base/error.h"
#include "model/step.h"
#include "serve/stop.h"

/* ================================================================ jobs */

uint64_t nx_server_random(nx_server *s) {
    /* splitmix64 under qmu: ids and default seeds, nothing cryptographic */
    pthread_mutex_lock(&s->qmu);
    uint64_t z = (s->rng += 0x9E3779B97F4A7C15ull);
    pthread_mutex_unlock(&s->qmu);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

void nx_job_unref(job *j) {
    if (!j) return;
    pthread_mutex_lock(&j->mu);
    int left = --j->refs;
    pthread_mutex_unlock(&j->mu);
    if (left > 0) return;
    for (size_t i = 0; i < j->n_prompts; i++) {
        free(j->ids[i]);
        if (j->out) {
            nx_strbuf_free(&j->out[i].text);
            nx_strbuf_free(&j->out[i].reasoning);
            nx_strbuf_free(&j->out[i].tools);
            json_decref(j->out[i].tool_calls);
            free(j->out[i].lp);
        }
    }
    free(j->ids);
    free(j->n_ids);
    free(j->out);
    free(j->echo_lp);
    free(j->forced);
    nx_tool_grammar_free(j->tool_grammar);
    free(j->slot_path);
    nx_strbuf_free(&j->sse);
    nx_oai_request_free(&j->req);
    pthread_mutex_destroy(&j->mu);
    pthread_cond_destroy(&j->cv);
    free(j);
}

/* Appends a streaming event (takes ownership of ev) and wakes the reader. */
static void job_push_event(job *j, char *ev) {
    if (!ev) return;
    pthread_mutex_lock(&j->mu);
    nx_strbuf_puts(&j->sse, ev);
    pthread_cond_broadcast(&j->cv);
    pthread_mutex_unlock(&j->mu);
    free(ev);
}

static void job_set_done(job *j) {
    pthread_mutex_lock(&j->mu);
    j->state = JOB_DONE;
    pthread_cond_broadcast(&j->cv);
    pthread_mutex_unlock(&j->mu);
}

static void timeout_error(const nx_server *s, nx_oai_error *e) {
    nx_oai_error_set(e, 504, "timeout_error", NULL, "timeout",
                     "The request did not finish within the server's timeout of %g s.",
                     s->o.timeout);
}

/* Ends a job that will not (or no longer) generate: streams get the error and [DONE]. */
static void job_abort(job *j, const nx_oai_error *e) {
    pthread_mutex_lock(&j->mu);
    j->failed = true;
    j->err = *e;
    pthread_mutex_unlock(&j->mu);
    if (j->req.stream) {
        job_push_event(j, nx_oai_stream_error(e));
        job_push_event(j, strdup(NX_OAI_STREAM_DONE));
    }
    job_set_done(j);
}

/* ================================================================ token text */

/* GPT-2 byte-level alphabet: printable bytes stand for themselves, the rest map to 256+. */
void nx_server_byte_map_init(nx_server *s) {
    for (size_t i = 0; i < sizeof s->byte_of_cp / sizeof s->byte_of_cp[0]; i++) s->byte_of_cp[i] = -1;
    int extra = 0;
    for (int b = 0; b < 256; b++) {
        bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174);
        s->byte_of_cp[printable ? b : 256 + extra++] = (int16_t)b;
    }
}

static size_t copy_out(char *buf, size_t cap, const char *src, size_t n) {
    if (n <= cap) memcpy(buf, src, n);
    return n;
}

/* The raw bytes a token stands for: inverse byte-level mapping of its vocabulary string, or the
 * decoder's text for tokens outside that alphabet (added and special tokens). */
static size_t token_text(void *user, int32_t id, char *buf, size_t cap) {
    nx_server *s = user;
    const char *t = nx_tokenizer_token_str(s->tok, id);
    if (!t) return 0;
    size_t n = strlen(t), o = 0;
    char tmp[256];
    bool mapped = !nx_tokenizer_is_special(s->tok, id) && n < sizeof tmp;
    for (size_t i = 0; mapped && i < n;) {
        unsigned c = (unsigned char)t[i], cp;
        size_t len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : 4;
        if (i + len > n) break;
        cp = len == 1 ? c : len == 2 ? c & 0x1F : len == 3 ? c & 0x0F : c & 0x07;
        for (size_t k = 1; k < len; k++) cp = (cp << 6) | ((unsigned char)t[i + k] & 0x3F);
        if (cp >= sizeof s->byte_of_cp / sizeof s->byte_of_cp[0] || s->byte_of_cp[cp] < 0) {
            mapped = false;
            break;
        }
        tmp[o++] = (char)s->byte_of_cp[cp];
        i += len;
    }
    if (mapped) return copy_out(buf, cap, tmp, o);
    char *d = NULL;
    if (nx_tokenizer_decode(s->tok, &id, 1, false, &d, NULL) != NX_OK || !d) return copy_out(buf, cap, t, n);
    n = copy_out(buf, cap, d, strlen(d));
    free(d);
    return n;
}

/* ================================================================ the worker */

typedef struct gen_state {
    job *j;
    size_t index;
    choice_out *out;
    nx_detok *detok;
    nx_stop_matcher stop;
    bool stopped_by_string;
    bool first_token;
    nx_strbuf released;
    nx_chat_split split;         /* chat: where each token's text goes */
    nx_strbuf released_reasoning; /* streaming: reasoning not yet sent */
    /* streaming tool calls: each call's id (sent with its name), and the argument text sent */
    size_t n_calls;
    char call_id[NX_STREAM_CALLS][40];
    nx_strbuf call_args[NX_STREAM_CALLS];
    bool call_stuck[NX_STREAM_CALLS]; /* its arguments stopped growing by appending (not expected:
                                       * the parser only appends pairs); nothing more is sent */
    /* streaming: where each generated token came from (nx_oai_choice.drafted), for the tokens
     * not yet sent; read off the generation's counters as each token arrives */
    const nx_gen_stats *st;
    int64_t seen_drafted, seen_accepted;
    int32_t cycle_k; /* drafts of the verify whose tokens are arriving; 0 between cycles */
    bool *tok_drafted;
    int32_t *tok_k;
    size_t n_tok, cap_tok;
} gen_state;

static void meta_of(const job *j, nx_oai_meta *m) {
    memset(m, 0, sizeof *m);
    m->kind = j->req.kind;
    m->id = j->id;
    m->created = j->created;
    m->model = j->srv->model_id;
    m->logprobs = j->req.logprobs;
    m->token_text = token_text;
    m->token_user = j->srv;
}

/* Sends the released text and reasoning (and the logprobs of tokens so far), or the tool calls,
 * as one stream chunk. */
static void stream_emit(gen_state *g, const char *finish, const json_t *calls) {
    job *j = g->j;
    if (g->released.len == 0 && g->released_reasoning.len == 0 && g->out->n_lp == 0 && !finish && !calls) return;
    nx_oai_meta m;
    meta_of(j, &m);
    nx_oai_choice c = {.index = (int32_t)g->index,
                       .text = g->released.data ? g->released.data : "",
                       .text_len = g->released.len,
                       .text_offset = g->out->text_sent,
                       .finish_reason = finish,
                       .reasoning = g->released_reasoning.data,
                       .reasoning_len = g->released_reasoning.len,
                       .tool_calls = calls,
                       .lp = g->out->lp,
                       .n_lp = g->out->n_lp,
                       .drafted = g->tok_drafted,
                       .draft_k = g->tok_k,
                       .n_tokens = g->n_tok};
    job_push_event(j, nx_oai_stream_chunk(&m, &c, false, j->req.include_usage));
    g->out->text_sent += g->released.len;
    g->out->n_lp = 0;
    g->n_tok = 0;
    nx_strbuf_consume(&g->released, g->released.len);
    nx_strbuf_consume(&g->released_reasoning, g->released_reasoning.len);
}

/* A new zeroed logprob entry for the choice, or NULL when memory is short (the entry is then
 * left out). */
static nx_oai_logprob *lp_append(gen_state *g, int32_t id) {
    choice_out *o = g->out;
    if (o->n_lp == o->cap_lp) {
        size_t cap = o->cap_lp ? o->cap_lp * 2 : 16;
        nx_oai_logprob *lp = realloc(o->lp, cap * sizeof *lp);
        if (!lp) return NULL;
        o->lp = lp;
        o->cap_lp = cap;
    }
    nx_oai_logprob *e = &o->lp[o->n_lp++];
    memset(e, 0, sizeof *e);
    e->id = id;
    return e;
}

/* The k (<= 20) largest scores of x[0..V) into top[] and e->top_id (insertion into a small sorted
 * list, one pass; ties keep the lower id first; scores <= floor are skipped). Returns how many. */
static int32_t top_scores(const float *x, int32_t V, int32_t k, float floor, float *top, nx_oai_logprob *e) {
    int32_t n = 0;
    for (int32_t v = 0; v < V && k > 0; v++) {
        const float p = x[v];
        if (p <= floor || (n == k && p <= top[k - 1])) continue;
        int32_t pos = n < k ? n++ : k - 1;
        while (pos > 0 && top[pos - 1] < p) {
            top[pos] = top[pos - 1];
            e->top_id[pos] = e->top_id[pos - 1];
            pos--;
        }
        top[pos] = p;
        e->top_id[pos] = v;
    }
    return e->n_top = n;
}

/* A generated token's entry: its log-probability under the processed distribution `probs` (the
 * one it was drawn from), with the top_logprobs most likely tokens. */
static void record_logprob(gen_state *g, int32_t id, const float *probs) {
    nx_oai_logprob *e = lp_append(g, id);
    if (!e) return;
    e->logprob = probs ? logf(probs[id]) : 0.0f;
    if (!probs) return;
    float top[NX_OAI_MAX_TOP_LOGPROBS];
    const int32_t n = top_scores(probs, g->j->srv->info->vocab_size, g->j->req.top_logprobs, 0.0f, top, e);
    for (int32_t t = 0; t < n; t++) e->top_logprob[t] = logf(top[t]);
}

/* A prompt token's entry under the model's raw distribution (log-softmax of `logits`, no
 * sampling settings), with the top_logprobs most likely tokens. */
static void record_prompt_logprob(gen_state *g, int32_t id, const float *logits, int32_t V) {
    nx_oai_logprob *e = lp_append(g, id);
    if (!e) return;
    float mx = -INFINITY;
    for (int32_t v = 0; v < V; v++) mx = logits[v] > mx ? logits[v] : mx;
    double z = 0.0;
    for (int32_t v = 0; v < V; v++) z += exp((double)logits[v] - (double)mx);
    const double lse = (double)mx + log(z);
    e->logprob = (float)((double)logits[id] - lse);
    float top[NX_OAI_MAX_TOP_LOGPROBS];
    const int32_t n = top_scores(logits, V, g->j->req.top_logprobs, -INFINITY, top, e);
    for (int32_t t = 0; t < n; t++) e->top_logprob[t] = (float)((double)top[t] - lse);
}

/* Completions echo: the prompt's text before the completion's, and with logprobs each prompt
 * token's log-probability given the ones before it (the first has none), from one teacher-forced
 * pass over the prompt; the generation then keeps those rows (prefix reuse). The prompt's other
 * choices (n > 1) copy the first choice's entries. */
static nx_status echo_prompt(nx_server *s, gen_state *g, const int32_t *ids, size_t n, nx_error *err) {
    job *j = g->j;
    char *text = NULL;
    nx_status st = nx_tokenizer_decode(s->tok, ids, n, false, &text, err);
    if (st != NX_OK) return st;
    nx_strbuf_puts(j->req.stream ? &g->released : &g->out->text, text);
    free(text);
    if (!j->req.logprobs || n == 0) return NX_OK;
    const bool first = g->index % j->n_per == 0;
    if (!first && j->n_echo_lp == n) {
        for (size_t k = 0; k < n; k++) {
            nx_oai_logprob *e = lp_append(g, j->echo_lp[k].id);
            if (e) *e = j->echo_lp[k];
        }
        return NX_OK;
    }
    const size_t lp0 = g->out->n_lp;
    const int32_t V = s->info->vocab_size, chunk = 32;
    float *logits = malloc(sizeof(float) * (size_t)V * (size_t)chunk);
    if (!logits) return nx_fail(err, NX_E_NOMEM, "out of memory");
    nx_oai_logprob *e0 = lp_append(g, ids[0]);
    if (e0) e0->none = true;
    nx_ctx_truncate(j->ctx, 0);
    for (size_t done = 0; done < n && st == NX_OK; done += chunk) {
        const int32_t T = n - done < (size_t)chunk ? (int32_t)(n - done) : chunk;
        st = nx_ctx_eval(j->ctx, ids + done, T, (int32_t)done, logits, err);
        for (int32_t r = 0; st == NX_OK && r < T && done + (size_t)r + 1 < n; r++)
            record_prompt_logprob(g, ids[done + (size_t)r + 1], logits + (size_t)r * (size_t)V, V);
    }
    free(logits);
    if (st == NX_OK && first && j->n_per > 1) {
        /* kept only when every entry was recorded (an entry is left out when memory is short) */
        free(j->echo_lp);
        j->n_echo_lp = 0;
        j->echo_lp = g->out->n_lp - lp0 == n ? malloc(n * sizeof *j->echo_lp) : NULL;
        if (j->echo_lp) {
            memcpy(j->echo_lp, g->out->lp + lp0, n * sizeof *j->echo_lp);
            j->n_echo_lp = n;
        }
    }
    return st;
}

/* Streams the tool calls parsed so far as OpenAI's deltas: a call's index, id, type and name
 * once its name is complete, then its arguments as they grow. The arguments are the compact JSON
 * of the complete key/value pairs, so until the end everything but the closing brace is a prefix
 * of the final text; `final` sends the rest. */
static void stream_tool_deltas(nx_server *s, gen_state *g, const json_t *calls, bool final) {
    json_t *arr = json_array();
    size_t k;
    const json_t *c;
    json_array_foreach(calls, k, c) {
        const json_t *fn = json_object_get(c, "function");
        const char *name = json_string_value(json_object_get(fn, "name")),
                   *args = json_string_value(json_object_get(fn, "arguments"));
        if (!arr || !name || !args || k >= NX_STREAM_CALLS || k > g->n_calls) break;
        if (k == g->n_calls) {
            snprintf(g->call_id[k], sizeof g->call_id[k], "call_%016llx", (unsigned long long)nx_server_random(s));
            g->n_calls++;
            json_array_append_new(arr, json_pack("{s:I, s:s, s:s, s:{s:s, s:s}}", "index", (json_int_t)k, "id",
                                                 g->call_id[k], "type", "function", "function", "name", name,
                                                 "arguments", ""));
        }
        nx_strbuf *sent = &g->call_args[k];
        const size_t len = strlen(args), ready = final || len == 0 ? len : len - 1; /* less the '}' */
        if (g->call_stuck[k] || ready <= sent->len) continue;
        if (sent->len && memcmp(args, sent->data, sent->len) != 0) {
            g->call_stuck[k] = true;
            continue;
        }
        json_array_append_new(arr, json_pack("{s:I, s:{s:s%}}", "index", (json_int_t)k, "function", "arguments",
                                             args + sent->len, ready - sent->len));
        nx_strbuf_append(sent, args + sent->len, ready - sent->len);
    }
    if (arr && json_array_size(arr) > 0) stream_emit(g, NULL, arr);
    json_decref(arr);
}

/* While a stream is inside the tool-call section: the calls as far as they parse. */
static void stream_tool_progress(nx_server *s, gen_state *g) {
    size_t n = 0;
    char *text = nx_oai_utf8_sanitize(g->out->tools.data, g->out->tools.len, &n);
    json_t *calls = text ? s->chat.f->parse_tool_calls(text, n, &s->chat.m, g->j->req.tools) : NULL;
    if (calls) stream_tool_deltas(s, g, calls, false);
    json_decref(calls);
    free(text);
}

/* A stream whose client leaves more than max_unsent bytes unread holds the only worker and the
 * memory: it gets NX_UNSENT_WAIT seconds to catch up (the reader wakes the worker as it takes
 * events), then the request is cancelled, so one stalled reader can neither grow its buffer
 * without bound nor keep the other requests waiting. False when cancelled. */
#define NX_UNSENT_WAIT 2.0
static bool stream_caught_up(job *j) {
    const size_t bound = j->srv->o.max_unsent;
    pthread_mutex_lock(&j->mu);
    const double until = nx_now_s() + NX_UNSENT_WAIT;
    bool waited = false; /* the other slots' steps do not wait for this one meanwhile */
    while (j->sse.len > bound && atomic_load(&j->cancel) == CANCEL_NONE && nx_now_s() < until) {
        if (!waited) nx_batch_busy(j->ctx, false);
        waited = true;
        nx_job_wait_tick(j);
    }
    if (waited) nx_batch_busy(j->ctx, true);
    const bool ok = j->sse.len <= bound;
    pthread_mutex_unlock(&j->mu);
    int expected = CANCEL_NONE;
    if (!ok) atomic_compare_exchange_strong(&j->cancel, &expected, CANCEL_SLOW);
    return ok;
}

/* Where the token being emitted came from, read off the generation's counters, which nx_generate
 * updates before it emits: a verify adds its drafts to n_drafted before emitting the cycle's
 * tokens, and an accepted draft to accepted_at before emitting it. A cycle's tokens are its
 * accepted drafts, then one token of the trunk's (the correction, or the token after the last
 * draft); tokens outside cycles are plain steps (k 0). */
static void note_source(gen_state *g) {
    const nx_gen_stats *st = g->st;
    int64_t acc = 0;
    for (int i = 0; i < NX_MAX_DRAFT; i++) acc += st->accepted_at[i];
    if (st->n_drafted > g->seen_drafted) g->cycle_k = (int32_t)(st->n_drafted - g->seen_drafted);
    const bool drafted = acc > g->seen_accepted;
    const int32_t k = g->cycle_k;
    g->seen_drafted = st->n_drafted;
    g->seen_accepted = acc;
    if (!drafted) g->cycle_k = 0; /* the trunk's token ends the cycle */
    if (g->n_tok == g->cap_tok) {
        const size_t cap = g->cap_tok ? g->cap_tok * 2 : 16;
        bool *d = realloc(g->tok_drafted, cap * sizeof *d);
        if (d) g->tok_drafted = d;
        int32_t *ks = d ? realloc(g->tok_k, cap * sizeof *ks) : NULL;
        if (!ks) return; /* out of memory: the token goes without its source */
        g->tok_k = ks;
        g->cap_tok = cap;
    }
    g->tok_drafted[g->n_tok] = drafted;
    g->tok_k[g->n_tok++] = k;
}

static int on_token(void *user, int32_t id, const float *probs) {
    gen_state *g = user;
    job *j = g->j;
    nx_server *s = j->srv;
    if (g->stopped_by_string || atomic_load(&j->cancel) != CANCEL_NONE) return 1;
    if (j->deadline > 0 && nx_now_s() > j->deadline) {
        atomic_store(&j->cancel, CANCEL_TIMEOUT);
        return 1;
    }
    if (g->first_token) {
        g->first_token = false;
        if (g->index == 0) j->t_first = nx_now_s(); /* time to first token, for metrics */
    }
    if (j->req.stream) note_source(g);
    bool eos = !j->req.ignore_eos && nx_model_is_eos(s->model, id);
    if (eos) return 0; /* the engine stops after it; an end token is neither text nor logprob */
    if (j->req.logprobs) record_logprob(g, id, probs);
    const char *marker;
    const int part = nx_chat_split_token(&g->split, id, &marker);
    char *piece = NULL;
    size_t len = 0;
    bool closes = marker != NULL; /* whether the calls may have grown (below) */
    if (nx_detok_push(g->detok, id, &piece, &len, NULL) == NX_OK && piece) {
        closes = closes || memchr(piece, '>', len) != NULL;
        if (part == NX_CHAT_CONTENT) {
            bool stopped = false;
            nx_strbuf *dst = j->req.stream ? &g->released : &g->out->text;
            const size_t lead = nx_chat_split_lead(&g->split, piece, len); /* GLM's "\n" before <think> */
            nx_stop_push(&g->stop, piece + lead, len - lead, dst, &stopped);
            g->stopped_by_string = stopped;
        } else if (part == NX_CHAT_REASONING) {
            nx_strbuf_append(j->req.stream ? &g->released_reasoning : &g->out->reasoning, piece, len);
        } else if (part == NX_CHAT_TOOLS) { /* markers are special tokens: the detokenizer drops them */
            if (marker) nx_strbuf_puts(&g->out->tools, marker);
            else nx_strbuf_append(&g->out->tools, piece, len);
        }
    }
    free(piece);
    if (j->req.stream) stream_emit(g, NULL, NULL);
    /* A call's name or a key/value pair is complete only once a marker closes it (every marker
     * ends in '>'; one spelled out in plain tokens too), so the held-back text is parsed again
     * only then, not on every token of a long argument value. */
    if (j->req.stream && part == NX_CHAT_TOOLS && closes) stream_tool_progress(s, g);
    if (j->req.stream && !stream_caught_up(j)) return 1;
    return g->stopped_by_string ? 1 : 0;
}

/* The end of an output that began tool calls: parses them (with ids) into g->out->tool_calls,
 * the finish reason becoming "tool_calls" as OpenAI reports it (unless max_tokens cut the output
 * short: "length", with the calls parsed so far). Text that holds no call goes
 * back to the content (dst), markers spelled out, so nothing generated is lost. */
static void tool_calls_done(nx_server *s, gen_state *g, nx_strbuf *dst) {
    choice_out *o = g->out;
    size_t n = 0;
    char *text = nx_oai_utf8_sanitize(o->tools.data, o->tools.len, &n);
    json_t *calls = text ? s->chat.f->parse_tool_calls(text, n, &s->chat.m, g->j->req.tools) : NULL;
    if (calls && json_array_size(calls) > 0) {
        json_t *with_ids = json_array(), *c;
        size_t k;
        json_array_foreach(calls, k, c) {
            char id[40];
            if (k < g->n_calls) snprintf(id, sizeof id, "%s", g->call_id[k]); /* as streamed */
            else snprintf(id, sizeof id, "call_%016llx", (unsigned long long)nx_server_random(s));
            json_array_append_new(with_ids, json_pack("{s:s, s:O, s:O}", "id", id, "type", json_object_get(c, "type"),
                                                      "function", json_object_get(c, "function")));
        }
        json_decref(calls);
        o->tool_calls = with_ids;
        if (strcmp(o->finish, "length") != 0) o->finish = "tool_calls"; /* cut short: stays "length" */
    } else {
        json_decref(calls);
        if (!s->chat.m.tools_open_kept) nx_strbuf_puts(dst, s->chat.m.tools_open);
        nx_strbuf_append(dst, o->tools.data, o->tools.len);
    }
    free(text);
}

/* The prompt cache's counters for /metrics and /health, copied under qmu (pc_mu held: the
 * workers share the cache). */
static void publish_cache_stats(nx_server *s) {
    pthread_mutex_lock(&s->qmu);
    nx_prompt_cache_get_stats(s->pcache, &s->pc_stats);
    pthread_mutex_unlock(&s->qmu);
}

int32_t nx_job_max_tokens(const nx_server *s, const job *j, size_t i) {
    const int32_t room = s->o.n_ctx - (int32_t)j->n_ids[i];
    /* Unset max_tokens: chat runs to EOS or a full context (OpenAI's rule); legacy
     * completions default to 16 tokens as OpenAI's /v1/completions does. */
    const int32_t want = j->req.max_tokens > 0 ? j->req.max_tokens : j->req.kind == NX_OAI_COMPLETION ? 16 : room;
    return want < room ? want : room;
}

/* The last of the prompt's n ids that is not whitespace text, looking back over at most 4
 * whitespace tokens (-1: none): Qwen's templates end a thinking generation prompt in
 * "<think>\n", and that <think> opens the reasoning as a final one does. */
static int32_t prompt_last(const nx_server *s, const int32_t *ids, size_t n) {
    const nx_json_vocab *v = s->json_vocab;
    for (size_t back = 0; back < 5 && back < n; back++) {
        const int32_t id = ids[n - 1 - back];
        bool ws = v && id >= 0 && id < v->n && v->bytes[id] && v->len[id] > 0;
        for (uint32_t k = 0; ws && k < v->len[id]; k++) ws = isspace(v->bytes[id][k]) != 0;
        if (!ws) return id;
    }
    return -1;
}

/* Runs prompt `i` of job j on the worker's context. */
static nx_status run_prompt(nx_server *s, job *j, size_t i, nx_gen_stats *st, nx_error *err) {
    gen_state g;
    memset(&g, 0, sizeof g);
    memset(st, 0, sizeof *st);
    g.j = j;
    g.index = i;
    g.out = &j->out[i];
    g.first_token = true;
    g.st = st;
    nx_stop_init(&g.stop, j->req.stop, j->req.n_stop);
    nx_status rc = nx_detok_new(s->tok, true, &g.detok, err);
    if (rc != NX_OK) goto done;
    /* chat: reasoning and (when the request offers tools) tool calls are split out of the
     * content, as the family's markers delimit them; other tokenizers have no markers to split on */
    const bool chat = j->req.kind == NX_OAI_CHAT;
    const int32_t last = prompt_last(s, j->ids[i], j->n_ids[i]);
    nx_chat_split_init(&g.split, &s->chat, chat && j->req.tools, chat && s->o.split_reasoning, last);
    if (j->forced) { /* the prompt already opened the call: the answer continues it */
        g.split.part = NX_CHAT_TOOLS;
        nx_strbuf_puts(&g.out->tools, j->forced);
    }

    nx_gen_params p;
    nx_gen_params_default(&p);
    p.sampling = j->req.sampling;
    if (j->tool_grammar) {
        p.sampling.tools = j->tool_grammar;
    } else if (j->req.json_object) {
        p.sampling.json = s->json_vocab;
        p.sampling.json_schema = j->req.json_schema;
        /* a prompt that opens the reasoning: the object follows its end */
        if (last >= 0 && last == s->chat.think_open && s->chat.think_close >= 0)
            p.sampling.json_wait = true, p.sampling.json_after = s->chat.think_close;
    }
    if (!j->req.has_seed) p.sampling.seed = nx_server_random(s);
    else p.sampling.seed += i % j->n_per; /* the n choices of a seeded request differ, reproducibly */
    p.max_tokens = nx_job_max_tokens(s, j, i);
    p.draft = j->draft;
    p.verify = j->verify;
    p.ignore_eos = j->req.ignore_eos;
    p.stop_ids = j->req.stop_token_ids;
    p.n_stop_ids = j->req.n_stop_token_ids;
    p.min_tokens = j->req.min_tokens;
    p.checkpoint_at = j->checkpoint_at;
    if (i % j->n_per == 0) { /* the first choice of a prompt; the others share its rows anyway */
        pthread_mutex_lock(&s->pc_mu);
        nx_prompt_cache_prepare(s->pcache, j->ctx, j->ids[i], j->n_ids[i]);
        publish_cache_stats(s);
        pthread_mutex_unlock(&s->pc_mu);
    }
    if (j->req.echo) {
        if ((rc = echo_prompt(s, &g, j->ids[i], j->n_ids[i], err)) != NX_OK) goto done;
        if (j->req.stream) stream_emit(&g, NULL, NULL);
    }
    rc = nx_generate(j->ctx, j->ids[i], j->n_ids[i], &p, on_token, &g, st, err);
    if (rc != NX_OK || atomic_load(&j->cancel) != CANCEL_NONE) goto done;

    nx_strbuf *dst = j->req.stream ? &g.released : &g.out->text;
    if (!g.stopped_by_string) {
        char *tail = NULL;
        size_t len = 0;
        if (nx_detok_flush(g.detok, &tail, &len, NULL) == NX_OK && tail) {
            bool stopped = false;
            nx_stop_push(&g.stop, tail, len, dst, &stopped);
            g.stopped_by_string = stopped;
        }
        free(tail);
        nx_stop_flush(&g.stop, dst);
    }
    g.out->finish = (g.stopped_by_string || st->stopped_by_eos) ? "stop" : "length";
    if (g.out->tools.len > 0) tool_calls_done(s, &g, dst);
    if (j->req.stream) {
        stream_emit(&g, NULL, NULL);
        /* the calls' remaining argument text, then the finish reason alone, as OpenAI ends a stream */
        if (g.out->tool_calls) stream_tool_deltas(s, &g, g.out->tool_calls, true);
        stream_emit(&g, g.out->finish, NULL);
    }
done:
    nx_detok_free(g.detok);
    nx_stop_free(&g.stop);
    nx_strbuf_free(&g.released);
    nx_strbuf_free(&g.released_reasoning);
    for (size_t k = 0; k < g.n_calls; k++) nx_strbuf_free(&g.call_args[k]);
    free(g.tok_drafted);
    free(g.tok_k);
    return rc;
}

static void run_job(nx_server *s, job *j) {
    nx_oai_meta m;
    meta_of(j, &m);
    if (j->req.stream && j->req.kind == NX_OAI_CHAT)
        for (size_t k = 0; k < j->n_prompts; k++) { /* each choice's first chunk names the role */
            nx_oai_choice c = {.index = (int32_t)k, .text = "", .text_len = 0};
            job_push_event(j, nx_oai_stream_chunk(&m, &c, true, j->req.include_usage));
        }
    nx_oai_usage *u = &j->usage;
    u->draft = j->draft;
    u->verify = j->verify == NX_VERIFY_MATCH ? "match" : "residual";
    for (size_t i = 0; i < j->n_prompts; i++) {
        nx_gen_stats st;
        nx_error err = {0};
        nx_status rc = run_prompt(s, j, i, &st, &err);
        double ttft = j->t_first > 0 ? j->t_first - j->t_arrival : -1.0;
        nx_metrics_add_generation(&s->metrics, &st, i == 0 ? ttft : -1.0,
                                  i == 0 ? j->t_picked - j->t_arrival : 0.0);
        if (i % j->n_per == 0) { /* a prompt counts once, as OpenAI counts it */
            u->prompt_tokens += st.n_prompt;
            u->cached_tokens += st.n_cached;
        }
        u->completion_tokens += st.n_generated;
        u->drafts += st.n_drafts;
        u->drafted += st.n_drafted;
        u->accepted += st.n_accepted;
        for (int k = 0; k < NX_MAX_DRAFT; k++) {
            u->drafted_at[k] += st.drafted_at[k];
            u->accepted_at[k] += st.accepted_at[k];
        }
        /* as `nextn run` reports speeds: the first token comes with the prefill */
        u->t_prefill += st.t_prefill;
        u->prefilled += st.n_prompt - st.n_cached;
        u->t_decode += st.t_decode;
        u->decoded += st.n_generated > 1 ? st.n_generated - 1 : 0;
        int cancel = atomic_load(&j->cancel);
        if (cancel == CANCEL_TIMEOUT) {
            nx_metrics_count_cancel(&s->metrics, true);
            nx_oai_error e;
            timeout_error(s, &e);
            job_abort(j, &e);
            return;
        }
        if (cancel != CANCEL_NONE) {
            nx_metrics_count_cancel(&s->metrics, false);
            nx_oai_error e;
            if (cancel == CANCEL_SLOW)
                nx_oai_error_set(&e, 503, "server_error", NULL, "client_too_slow",
                                 "The client left more than %zu bytes of the stream unread; the request was "
                                 "cancelled.", s->o.max_unsent);
            else if (cancel == CANCEL_SHUTDOWN)
                nx_oai_error_set(&e, 503, "server_error", NULL, "shutting_down",
                                 "The server is shutting down; the request was cancelled.");
            else nx_oai_error_set(&e, 503, "server_error", NULL, "cancelled", "The request was cancelled.");
            job_abort(j, &e);
            return;
        }
        if (rc != NX_OK) {
            nx_oai_error e;
            /* a rank of a split model gone: the service is down, not the request wrong */
            nx_oai_error_set(&e, rc == NX_E_ARG ? 400 : rc == NX_E_RANK ? 503 : 500,
                             rc == NX_E_ARG ? "invalid_request_error" : "server_error", NULL, NULL,
                             "Generation failed: %s", err.msg);
            job_abort(j, &e);
            return;
        }
    }
    if (j->req.stream) {
        if (j->req.include_usage) job_push_event(j, nx_oai_stream_usage(&m, u));
        job_push_event(j, strdup(NX_OAI_STREAM_DONE));
    }
    job_set_done(j);
}

/* Rewrites each mention of path (the slot directory, a '/', then name) in the library's message
 * msg as name alone: clients name slot files, the server's directories are not theirs to see. */
static void hide_dir(char *msg, const char *path, const char *name) {
    const size_t lp = strlen(path), ln = strlen(name), cut = lp - ln;
    for (char *at = strstr(msg, path); at; at = strstr(at + ln, path)) memmove(at, at + cut, strlen(at + cut) + 1);
}

/* A slot action on the worker's context, between generations. A failed load leaves the context
 * as it was (nx_state_load checks the whole file first), so the server goes on serving. A
 * restore is not undone by the next request: nx_prompt_cache_prepare and nx_generate read what
 * the context holds, and keep the rows the request's prompt starts with. */
static void run_slot(nx_server *s, job *j) {
    const nx_slot_request *r = &j->slot;
    nx_slot_result *res = &j->slot_res;
    nx_error err = {0};
    nx_status st = NX_OK;
    struct stat sb;
    const double t0 = nx_now_s();
    switch (r->action) {
    case NX_SLOT_SAVE:
        /* a directory (or a device, a socket) of that name is the client's choice of name */
        if (lstat(j->slot_path, &sb) == 0 && !S_ISREG(sb.st_mode) && !S_ISLNK(sb.st_mode))
            st = nx_fail(&err, NX_E_ARG, "state file %s: exists and is not a regular file", j->slot_path);
        else if ((st = nx_slot_quota_check(s->slot_dir, (uint64_t)nx_state_file_bytes(j->ctx, -1),
                                           s->o.slot_save_quota, &err)) == NX_OK)
            st = nx_state_save(j->ctx, j->slot_path, -1, &res->n, &res->bytes, &err);
        break;
    case NX_SLOT_RESTORE:
        /* the rows the restore replaces go into the prompt cache, as a request's would */
        pthread_mutex_lock(&s->pc_mu);
        nx_prompt_cache_keep(s->pcache, j->ctx);
        publish_cache_stats(s);
        pthread_mutex_unlock(&s->pc_mu);
        st = nx_state_load(j->ctx, j->slot_path, &res->n, &res->bytes, &err);
        break;
    case NX_SLOT_ERASE:
        res->n = nx_ctx_n_past(j->ctx);
        nx_ctx_truncate(j->ctx, 0);
        pthread_mutex_lock(&s->pc_mu);
        nx_prompt_cache_clear(s->pcache); /* erased means gone: no entry brings the rows back */
        publish_cache_stats(s);
        pthread_mutex_unlock(&s->pc_mu);
        break;
    }
    res->ms = (nx_now_s() - t0) * 1e3;
    if (st != NX_OK) {
        nx_oai_error e;
        /* a file the client named that cannot be read is the request's fault; a save that
         * cannot be written is the server's (its directory, its disk) */
        const bool client = st == NX_E_ARG || (r->action == NX_SLOT_RESTORE && st != NX_E_NOMEM);
        hide_dir(err.msg, j->slot_path, r->filename);
        nx_oai_error_set(&e, client ? 400 : 500, client ? "invalid_request_error" : "server_error",
                         "filename", r->action == NX_SLOT_SAVE ? "slot_save_failed" : "slot_restore_failed",
                         "Cannot %s slot %d: %s", r->action == NX_SLOT_SAVE ? "save" : "restore", (int)r->id, err.msg);
        job_abort(j, &e);
        return;
    }
    nx_metrics_count_slot(&s->metrics, r->action);
    job_set_done(j);
}

/* How well slot o suits a prompt of n rows (qmu held; an idle slot's context is touched by
 * nobody): the rows of it its context holds when that is at least half of them (llama.cpp's
 * slot similarity), else 0; ties go to the slot used longest ago, so a new conversation takes a
 * free or stale slot rather than evicting the rows of one that is going on. */
static int64_t slot_score(const srv_slot *o, const int32_t *ids, int32_t n) {
    const int32_t shared = nx_ctx_shared_prefix(o->ctx, ids, n);
    const int64_t fit = 2 * (int64_t)shared >= n && shared > 0 ? shared : 0;
    return fit * ((int64_t)1 << 40) - o->last_used;
}

/* Whether another idle slot suits j's first prompt better than sl: that slot takes j instead,
 * so a chat's next turn, or a request after a restore, goes where its rows are. */
static bool better_slot(const nx_server *s, const srv_slot *sl, const job *j) {
    if (j->is_slot || s->n_slots == 1 || j->n_prompts == 0) return false;
    const int32_t n = (int32_t)j->n_ids[0] - 1; /* the rows a generation keeps */
    const int64_t mine = slot_score(sl, j->ids[0], n);
    for (int k = 0; k < s->n_slots; k++) {
        const srv_slot *o = &s->slots[k];
        if (o != sl && !o->running && slot_score(o, j->ids[0], n) > mine) return true;
    }
    return false;
}

/* The first queued job slot sl takes (qmu held), unlinked from the queue, or NULL: a slot action
 * of its own slot, or a generation no other idle slot is better placed for. */
static job *pick_job(nx_server *s, srv_slot *sl) {
    job *prev = NULL;
    for (job *j = s->head; j; prev = j, j = j->next) {
        if (j->is_slot ? j->slot.id != sl->id : better_slot(s, sl, j)) continue;
        if (prev) prev->next = j->next;
        else s->head = j->next;
        if (s->tail == j) s->tail = prev;
        s->n_queued--;
        s->n_active++;
        sl->running = j;
        sl->last_used = ++s->slot_uses;
        j->t_picked = nx_now_s();
        j->ctx = sl->ctx;
        return j;
    }
    return NULL;
}

static void run_picked(nx_server *s, srv_slot *sl, job *j, bool stopping) {
    pthread_mutex_lock(&j->mu);
    j->state = JOB_RUNNING;
    pthread_mutex_unlock(&j->mu);
    if (stopping) atomic_store(&j->cancel, CANCEL_SHUTDOWN);
    if (j->deadline > 0 && nx_now_s() > j->deadline) atomic_store(&j->cancel, CANCEL_TIMEOUT);
    int cancel = atomic_load(&j->cancel);
    if (cancel == CANCEL_NONE && j->is_slot) {
        run_slot(s, j);
    } else if (cancel == CANCEL_NONE) {
        nx_batch_busy(sl->ctx, true); /* the other slots' steps wait for this one's forwards */
        run_job(s, j);
        nx_batch_busy(sl->ctx, false);
    } else {
        nx_oai_error e;
        if (cancel == CANCEL_TIMEOUT) timeout_error(s, &e);
        else nx_oai_error_set(&e, 503, "server_error", NULL, "cancelled",
                              "The request was cancelled before it started.");
        job_abort(j, &e);
    }
}

void *nx_worker_main(void *arg) {
    srv_slot *sl = arg;
    nx_server *s = sl->srv;
    for (;;) {
        pthread_mutex_lock(&s->qmu);
        job *j;
        while (!(j = pick_job(s, sl)) && !s->stopping) pthread_cond_wait(&s->qcv, &s->qmu);
        bool stopping = s->stopping;
        if (!j) s->n_workers_done++; /* stopping with nothing of its own queued */
        pthread_cond_broadcast(&s->qcv); /* the other workers look at the queue again */
        pthread_mutex_unlock(&s->qmu);
        if (!j) break;
        run_picked(s, sl, j, stopping);
        pthread_mutex_lock(&s->qmu);
        s->n_active--;
        sl->running = NULL;
        sl->n_cached = nx_ctx_n_past(sl->ctx);
        if (!j->is_slot) {
            sl->n_jobs++;
            sl->n_tokens += j->usage.completion_tokens;
        }
        pthread_cond_broadcast(&s->qcv); /* shutdown waits for the workers to be done */
        pthread_mutex_unlock(&s->qmu);
        nx_job_unref(j);
    }
    return NULL;
}

/* Queues j unless the queue is full; the queue then holds one reference. */
bool nx_job_enqueue(nx_server *s, job *j) {
    pthread_mutex_lock(&s->qmu);
    if (s->stopping || s->n_queued >= s->o.queue) {
        pthread_mutex_unlock(&s->qmu);
        return false;
    }
    pthread_mutex_lock(&j->mu);
    j->refs++;
    pthread_mutex_unlock(&j->mu);
    j->next = NULL;
    if (s->tail) s->tail->next = j;
    else s->head = j;
    s->tail = j;
    s->n_queued++;
    pthread_cond_broadcast(&s->qcv); /* the worker, and shutdown waiting on it */
    pthread_mutex_unlock(&s->qmu);
    return true;
}

/* Cancels j. A job still waiting leaves the queue at once so its slot frees immediately; a
 * running one stops at its next token. */
void nx_job_cancel(nx_server *s, job *j, int why) {
    int expected = CANCEL_NONE;
    atomic_compare_exchange_strong(&j->cancel, &expected, why);
    bool unlinked = false;
    pthread_mutex_lock(&s->qmu);
    pthread_mutex_lock(&j->mu);
    if (j->state == JOB_QUEUED) {
        job **pp = &s->head, *prev = NULL;
        while (*pp && *pp != j) prev = *pp, pp = &(*pp)->next;
        if (*pp == j) {
            *pp = j->next;
            if (s->tail == j) s->tail = prev;
            s->n_queued--;
            unlinked = true;
        }
    }
    pthread_mutex_unlock(&j->mu);
    pthread_mutex_unlock(&s->qmu);
    if (unlinked) {
        nx_oai_error e;
        if (why == CANCEL_TIMEOUT) timeout_error(s, &e);
        else if (why == CANCEL_SHUTDOWN)
            nx_oai_error_set(&e, 503, "server_error", NULL, "shutting_down",
                             "The server is shutting down; the request was cancelled before it started.");
        else nx_oai_error_set(&e, 503, "server_error", NULL, "cancelled", "The request was cancelled.");
        if (why == CANCEL_TIMEOUT) nx_metrics_count_cancel(&s->metrics, true);
        else nx_metrics_count_cancel(&s->metrics, false);
        job_abort(j, &e);
        nx_job_unref(j); /* the queue's reference */
    }
}

/* True when the peer has closed its end (checked while a client waits for tokens). */
static bool client_gone(int fd) {
    if (fd < 0) return false;
    struct pollfd p = {.fd = fd, .events = POLLIN | POLLRDHUP};
    if (poll(&p, 1, 0) <= 0) return false;
    if (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) return true;
    if (p.revents & POLLIN) {
        char c;
        ssize_t n = recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
        return n == 0;
    }
    return false;
}

/* Waits on j->cv for up to 100 ms (j->mu held). */
void nx_job_wait_tick(job *j) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_nsec += 100 * 1000000L;
    if (ts.tv_nsec >= 1000000000L) ts.tv_sec++, ts.tv_nsec -= 1000000000L;
    pthread_cond_timedwait(&j->cv, &j->mu, &ts);
}

/* Between waits: a client hang-up or an expired deadline cancels the job. */
void nx_job_watch(nx_server *s, job *j) {
    if (atomic_load(&j->cancel) != CANCEL_NONE) return;
    if (client_gone(j->fd)) nx_job_cancel(s, j, CANCEL_CLIENT);
    else if (j->deadline > 0 && nx_now_s() > j->deadline) nx_job_cancel(s, j, CANCEL_TIMEOUT);
}


/* A new job for a request whose client is on socket fd (-1: none to watch), holding one
 * reference (the connection's); NULL when out of memory. */
job *nx_job_new(nx_server *s, int fd) {
    job *j = calloc(1, sizeof *j);
    if (!j) return NULL;
    pthread_mutex_init(&j->mu, NULL);
    pthread_cond_init(&j->cv, NULL);
    j->refs = 1;
    j->srv = s;
    j->n_per = 1;
    j->state = JOB_QUEUED;
    atomic_init(&j->cancel, CANCEL_NONE);
    j->t_arrival = nx_now_s();
    j->deadline = s->o.timeout > 0 ? j->t_arrival + s->o.timeout : 0;
    j->created = (int64_t)time(NULL);
    j->fd = fd;
    return j;
}

/* A finished non-streaming generation's response body (NULL when out of memory). */
char *nx_job_response_body(job *j) {
    nx_oai_meta m;
    meta_of(j, &m);
    nx_oai_choice *c = calloc(j->n_prompts, sizeof *c);
    if (!c) return NULL;
    for (size_t i = 0; i < j->n_prompts; i++) {
        c[i].index = (int32_t)i;
        c[i].text = j->out[i].text.data ? j->out[i].text.data : "";
        c[i].text_len = j->out[i].text.len;
        c[i].finish_reason = j->out[i].finish;
        c[i].reasoning = j->out[i].reasoning.data;
        c[i].reasoning_len = j->out[i].reasoning.len;
        c[i].tool_calls = j->out[i].tool_calls;
        c[i].lp = j->out[i].lp;
        c[i].n_lp = j->out[i].n_lp;
    }
    char *body = nx_oai_response_json(&m, c, j->n_prompts, &j->usage);
    free(c);
    return body;
}
