/* nextn serve: routes, authentication, body limits and the generation queue. Connection threads
 * (libmicrohttpd, one per connection) parse and tokenize requests, then hand a job to the single
 * worker thread, which owns the model context and runs jobs in arrival order. Slot actions
 * (save, restore, erase the context's rows) are jobs too, so they never overlap a generation. */
#include "serve/server.h"

#include <errno.h>
#include <math.h>
#include <microhttpd.h>
#include <netdb.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "base/clock.h"
#include "base/error.h"
#include "base/strbuf.h"
#include "decode/tool_grammar.h"
#include "serve/hy_output.h"
#include "serve/metrics.h"
#include "serve/openai.h"
#include "serve/slots.h"
#include "serve/stop.h"
#include "text/chat.h"

/* ================================================================ jobs */

#define NX_STREAM_CALLS 32 /* tool calls streamed argument by argument; more arrive whole */

enum { JOB_QUEUED, JOB_RUNNING, JOB_DONE };
enum { CANCEL_NONE = 0, CANCEL_CLIENT, CANCEL_TIMEOUT, CANCEL_SHUTDOWN };

/* What one prompt of a job has produced so far. */
typedef struct choice_out {
    nx_strbuf text;    /* non-streaming: the whole completion (chat: its content) */
    nx_strbuf reasoning; /* chat, non-streaming: the reasoning_content */
    nx_strbuf tools;   /* chat: the tool-call section, held back until the end */
    json_t *tool_calls; /* chat: the parsed calls (with ids), or NULL */
    nx_oai_logprob *lp; /* non-streaming: every token; streaming: tokens not yet sent */
    size_t n_lp, cap_lp;
    size_t text_sent;  /* streaming: bytes sent (completions logprobs text_offset) */
    const char *finish;
} choice_out;

typedef struct job {
    struct nx_server *srv;
    pthread_mutex_t mu; /* guards state, sse, refs and the results below */
    pthread_cond_t cv;
    int refs; /* the connection and the queue/worker */
    int state;
    atomic_int cancel;
    struct job *next;

    nx_oai_request req;
    int32_t **ids; /* per prompt */
    size_t *n_ids;
    size_t n_prompts;   /* choices: each prompt's "n" copies in turn (ids, n_ids, out per choice) */
    size_t n_per;       /* choices per prompt ("n") */
    char *forced;       /* tool_choice required / named: the tool-call text the prompt ends with
                         * (after <tool_calls>), where each answer's tool section starts */
    nx_tool_grammar *tool_grammar; /* and what the answer may say from there */
    int32_t draft;
    nx_verify verify;
    char id[48];
    int64_t created;
    int fd; /* the client's socket, polled for hang-ups while the client waits */
    double t_arrival, deadline, t_picked, t_first; /* monotonic seconds */

    nx_strbuf sse; /* streaming: events the client has not read yet */
    choice_out *out;
    nx_oai_logprob *echo_lp; /* worker only: the echoed prompt's entries, for its other choices */
    size_t n_echo_lp;
    nx_oai_usage usage;
    bool failed;
    nx_oai_error err;

    /* a slot action instead of a generation (req, ids and out then stay empty) */
    bool is_slot;
    nx_slot_request slot;
    char *slot_path; /* --slot-save-path/filename (save, restore) */
    nx_slot_result slot_res;
} job;

struct nx_server {
    nx_model *model;
    const nx_model_info *info;
    const nx_tokenizer *tok;
    nx_ctx *ctx;
    nx_prompt_cache *pcache;        /* saved prompt prefixes, used by the worker only */
    nx_json_vocab *json_vocab;      /* token bytes for response_format json_object */
    nx_prompt_cache_stats pc_stats; /* its counters as of the last request, under qmu */
    nx_server_opts o;
    char *host, *api_key, *model_id;
    char *slot_dir;      /* --slot-save-path without trailing '/', or NULL: slot actions off */
    char *bos, *eos;     /* the template's bos_token / eos_token strings */
    nx_jinja *tmpl;      /* the chat template, parsed once and rendered concurrently */
    char tmpl_error[400]; /* why there is no template, for chat requests */
    bool has_mtp;
    nx_hy_markers hy; /* Hy3's reasoning and tool-call markers, as this tokenizer spells them */
    int port;
    int64_t t_created;
    double t_started;
    struct MHD_Daemon *mhd;
    nx_metrics metrics;

    pthread_mutex_t prep_mu; /* template rendering and tokenization, off the worker */
    pthread_mutex_t qmu;
    pthread_cond_t qcv;
    job *head, *tail;
    job *running; /* the worker's current job, so shutdown can cancel it */
    int n_queued, n_active;
    bool stopping;
    pthread_t worker;
    bool worker_started;
    uint64_t rng;

    /* byte-level BPE: code point -> byte, for the raw bytes of logprob tokens */
    int16_t byte_of_cp[324];
};

static uint64_t next_random(nx_server *s) {
    /* splitmix64 under qmu: ids and default seeds, nothing cryptographic */
    pthread_mutex_lock(&s->qmu);
    uint64_t z = (s->rng += 0x9E3779B97F4A7C15ull);
    pthread_mutex_unlock(&s->qmu);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static void job_unref(job *j) {
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
static void byte_map_init(nx_server *s) {
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
    nx_hy_split split;           /* chat: where each token's text goes */
    nx_strbuf released_reasoning; /* streaming: reasoning not yet sent */
    /* streaming tool calls: each call's id (sent with its name), and the argument text sent */
    size_t n_calls;
    char call_id[NX_STREAM_CALLS][40];
    nx_strbuf call_args[NX_STREAM_CALLS];
    bool call_stuck[NX_STREAM_CALLS]; /* its arguments stopped growing by appending (not expected:
                                       * the parser only appends pairs); nothing more is sent */
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
                       .n_lp = g->out->n_lp};
    job_push_event(j, nx_oai_stream_chunk(&m, &c, false, j->req.include_usage));
    g->out->text_sent += g->released.len;
    g->out->n_lp = 0;
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
    nx_ctx_truncate(s->ctx, 0);
    for (size_t done = 0; done < n && st == NX_OK; done += chunk) {
        const int32_t T = n - done < (size_t)chunk ? (int32_t)(n - done) : chunk;
        st = nx_ctx_eval(s->ctx, ids + done, T, (int32_t)done, logits, err);
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
            snprintf(g->call_id[k], sizeof g->call_id[k], "call_%016llx", (unsigned long long)next_random(s));
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
    json_t *calls = text ? nx_hy_parse_tool_calls(text, n, &s->hy, g->j->req.tools) : NULL;
    if (calls) stream_tool_deltas(s, g, calls, false);
    json_decref(calls);
    free(text);
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
    bool eos = !j->req.ignore_eos && nx_model_is_eos(s->model, id);
    if (eos) return 0; /* the engine stops after it; an end token is neither text nor logprob */
    if (j->req.logprobs) record_logprob(g, id, probs);
    const char *marker;
    const int part = nx_hy_split_token(&g->split, id, &marker);
    char *piece = NULL;
    size_t len = 0;
    bool closes = marker != NULL; /* whether the calls may have grown (below) */
    if (nx_detok_push(g->detok, id, &piece, &len, NULL) == NX_OK && piece) {
        closes = closes || memchr(piece, '>', len) != NULL;
        if (part == NX_HY_CONTENT) {
            bool stopped = false;
            nx_strbuf *dst = j->req.stream ? &g->released : &g->out->text;
            nx_stop_push(&g->stop, piece, len, dst, &stopped);
            g->stopped_by_string = stopped;
        } else if (part == NX_HY_REASONING) {
            nx_strbuf_append(j->req.stream ? &g->released_reasoning : &g->out->reasoning, piece, len);
        } else if (part == NX_HY_TOOLS) { /* markers are special tokens: the detokenizer drops them */
            if (marker) nx_strbuf_puts(&g->out->tools, marker);
            else nx_strbuf_append(&g->out->tools, piece, len);
        }
    }
    free(piece);
    if (j->req.stream) stream_emit(g, NULL, NULL);
    /* A call's name or a key/value pair is complete only once a marker closes it (every marker
     * ends in '>'; one spelled out in plain tokens too), so the held-back text is parsed again
     * only then, not on every token of a long argument value. */
    if (j->req.stream && part == NX_HY_TOOLS && closes) stream_tool_progress(s, g);
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
    json_t *calls = text ? nx_hy_parse_tool_calls(text, n, &s->hy, g->j->req.tools) : NULL;
    if (calls && json_array_size(calls) > 0) {
        json_t *with_ids = json_array(), *c;
        size_t k;
        json_array_foreach(calls, k, c) {
            char id[40];
            if (k < g->n_calls) snprintf(id, sizeof id, "%s", g->call_id[k]); /* as streamed */
            else snprintf(id, sizeof id, "call_%016llx", (unsigned long long)next_random(s));
            json_array_append_new(with_ids, json_pack("{s:s, s:O, s:O}", "id", id, "type", json_object_get(c, "type"),
                                                      "function", json_object_get(c, "function")));
        }
        json_decref(calls);
        o->tool_calls = with_ids;
        if (strcmp(o->finish, "length") != 0) o->finish = "tool_calls"; /* cut short: stays "length" */
    } else {
        json_decref(calls);
        nx_strbuf_puts(dst, s->hy.text[NX_HY_CALLS_OPEN]);
        nx_strbuf_append(dst, o->tools.data, o->tools.len);
    }
    free(text);
}

/* Runs prompt `i` of job j on the worker's context. */
/* The prompt cache's counters for /metrics and /health, copied under qmu (the worker owns the cache). */
static void publish_cache_stats(nx_server *s) {
    pthread_mutex_lock(&s->qmu);
    nx_prompt_cache_get_stats(s->pcache, &s->pc_stats);
    pthread_mutex_unlock(&s->qmu);
}

static nx_status run_prompt(nx_server *s, job *j, size_t i, nx_gen_stats *st, nx_error *err) {
    gen_state g;
    memset(&g, 0, sizeof g);
    memset(st, 0, sizeof *st);
    g.j = j;
    g.index = i;
    g.out = &j->out[i];
    g.first_token = true;
    nx_stop_init(&g.stop, j->req.stop, j->req.n_stop);
    nx_status rc = nx_detok_new(s->tok, true, &g.detok, err);
    if (rc != NX_OK) goto done;
    /* chat: reasoning and (when the request offers tools) tool calls are split out of the
     * content, as Hy3's markers delimit them; other tokenizers have no markers to split on */
    const bool chat = j->req.kind == NX_OAI_CHAT;
    nx_hy_split_init(&g.split, &s->hy, chat && j->req.tools, chat && s->o.split_reasoning,
                     j->n_ids[i] ? j->ids[i][j->n_ids[i] - 1] : -1);
    if (j->forced) { /* the prompt already opened the call: the answer continues it */
        g.split.part = NX_HY_TOOLS;
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
        const int32_t last = j->n_ids[i] ? j->ids[i][j->n_ids[i] - 1] : -1;
        if (last >= 0 && last == s->hy.id[NX_HY_THINK_OPEN] && s->hy.id[NX_HY_THINK_CLOSE] >= 0)
            p.sampling.json_wait = true, p.sampling.json_after = s->hy.id[NX_HY_THINK_CLOSE];
    }
    if (!j->req.has_seed) p.sampling.seed = next_random(s);
    else p.sampling.seed += i % j->n_per; /* the n choices of a seeded request differ, reproducibly */
    int32_t room = s->o.n_ctx - (int32_t)j->n_ids[i];
    /* Unset max_tokens: chat runs to EOS or a full context (OpenAI's rule); legacy
     * completions default to 16 tokens as OpenAI's /v1/completions does. */
    int32_t want = j->req.max_tokens > 0 ? j->req.max_tokens
                 : j->req.kind == NX_OAI_COMPLETION ? 16 : room;
    p.max_tokens = want < room ? want : room;
    p.draft = j->draft;
    p.verify = j->verify;
    p.ignore_eos = j->req.ignore_eos;
    p.stop_ids = j->req.stop_token_ids;
    p.n_stop_ids = j->req.n_stop_token_ids;
    p.min_tokens = j->req.min_tokens;
    if (i % j->n_per == 0) { /* the first choice of a prompt; the others share its rows anyway */
        nx_prompt_cache_prepare(s->pcache, s->ctx, j->ids[i], j->n_ids[i]);
        publish_cache_stats(s);
    }
    if (j->req.echo) {
        if ((rc = echo_prompt(s, &g, j->ids[i], j->n_ids[i], err)) != NX_OK) goto done;
        if (j->req.stream) stream_emit(&g, NULL, NULL);
    }
    rc = nx_generate(s->ctx, j->ids[i], j->n_ids[i], &p, on_token, &g, st, err);
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
            nx_oai_error_set(&e, 503, "server_error", NULL, "cancelled", "The request was cancelled.");
            job_abort(j, &e);
            return;
        }
        if (rc != NX_OK) {
            nx_oai_error e;
            nx_oai_error_set(&e, rc == NX_E_ARG ? 400 : 500,
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
        else if ((st = nx_slot_quota_check(s->slot_dir, (uint64_t)nx_state_file_bytes(s->ctx, -1),
                                           s->o.slot_save_quota, &err)) == NX_OK)
            st = nx_state_save(s->ctx, j->slot_path, -1, &res->n, &res->bytes, &err);
        break;
    case NX_SLOT_RESTORE:
        /* the rows the restore replaces go into the prompt cache, as a request's would */
        nx_prompt_cache_keep(s->pcache, s->ctx);
        publish_cache_stats(s);
        st = nx_state_load(s->ctx, j->slot_path, &res->n, &res->bytes, &err);
        break;
    case NX_SLOT_ERASE:
        res->n = nx_ctx_n_past(s->ctx);
        nx_ctx_truncate(s->ctx, 0);
        nx_prompt_cache_clear(s->pcache); /* erased means gone: no entry brings the rows back */
        publish_cache_stats(s);
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
                         "Cannot %s slot 0: %s", r->action == NX_SLOT_SAVE ? "save" : "restore", err.msg);
        job_abort(j, &e);
        return;
    }
    nx_metrics_count_slot(&s->metrics, r->action);
    job_set_done(j);
}

static void *worker_main(void *arg) {
    nx_server *s = arg;
    for (;;) {
        pthread_mutex_lock(&s->qmu);
        while (!s->head && !s->stopping) pthread_cond_wait(&s->qcv, &s->qmu);
        job *j = s->head;
        if (j) {
            s->head = j->next;
            if (!s->head) s->tail = NULL;
            s->n_queued--;
            s->n_active++;
            s->running = j;
            j->t_picked = nx_now_s();
        }
        bool stopping = s->stopping;
        pthread_mutex_unlock(&s->qmu);
        if (!j) break; /* stopping with an empty queue */

        pthread_mutex_lock(&j->mu);
        j->state = JOB_RUNNING;
        pthread_mutex_unlock(&j->mu);
        if (stopping) atomic_store(&j->cancel, CANCEL_SHUTDOWN);
        if (j->deadline > 0 && nx_now_s() > j->deadline) atomic_store(&j->cancel, CANCEL_TIMEOUT);
        int cancel = atomic_load(&j->cancel);
        if (cancel == CANCEL_NONE) {
            if (j->is_slot) run_slot(s, j);
            else run_job(s, j);
        } else {
            nx_oai_error e;
            if (cancel == CANCEL_TIMEOUT) timeout_error(s, &e);
            else nx_oai_error_set(&e, 503, "server_error", NULL, "cancelled",
                                  "The request was cancelled before it started.");
            job_abort(j, &e);
        }
        pthread_mutex_lock(&s->qmu);
        s->n_active--;
        s->running = NULL;
        pthread_mutex_unlock(&s->qmu);
        job_unref(j);
    }
    return NULL;
}

/* Queues j unless the queue is full; the queue then holds one reference. */
static bool enqueue(nx_server *s, job *j) {
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
    pthread_cond_signal(&s->qcv);
    pthread_mutex_unlock(&s->qmu);
    return true;
}

/* Cancels j. A job still waiting leaves the queue at once so its slot frees immediately; a
 * running one stops at its next token. */
static void cancel_job(nx_server *s, job *j, int why) {
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
        else nx_oai_error_set(&e, 503, "server_error", NULL, "cancelled", "The request was cancelled.");
        if (why == CANCEL_TIMEOUT) nx_metrics_count_cancel(&s->metrics, true);
        else nx_metrics_count_cancel(&s->metrics, false);
        job_abort(j, &e);
        job_unref(j); /* the queue's reference */
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
static void wait_tick(job *j) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_nsec += 100 * 1000000L;
    if (ts.tv_nsec >= 1000000000L) ts.tv_sec++, ts.tv_nsec -= 1000000000L;
    pthread_cond_timedwait(&j->cv, &j->mu, &ts);
}

/* Between waits: a client hang-up or an expired deadline cancels the job. */
static void watch_job(nx_server *s, job *j) {
    if (atomic_load(&j->cancel) != CANCEL_NONE) return;
    if (client_gone(j->fd)) cancel_job(s, j, CANCEL_CLIENT);
    else if (j->deadline > 0 && nx_now_s() > j->deadline) cancel_job(s, j, CANCEL_TIMEOUT);
}

/* ================================================================ HTTP */

typedef struct conn {
    nx_strbuf body;
    bool too_large;
    bool responded;
    bool counted; /* already in the request metrics */
    const char *route;
    const char *allow; /* the route's method, for a 405's Allow header */
    job *j; /* non-streaming job waited on in the handler */
} conn;

static enum MHD_Result respond(nx_server *s, struct MHD_Connection *c, conn *cs, int status,
                               const char *ctype, char *body) {
    if (!body) {
        status = 500;
        ctype = "application/json";
        body = strdup("{\"error\":{\"message\":\"out of memory\",\"type\":\"server_error\","
                      "\"param\":null,\"code\":null}}");
        if (!body) return MHD_NO;
    }
    struct MHD_Response *r =
        MHD_create_response_from_buffer(strlen(body), body, MHD_RESPMEM_MUST_FREE);
    if (!r) {
        free(body);
        return MHD_NO;
    }
    MHD_add_response_header(r, "Content-Type", ctype);
    if (status == 401) MHD_add_response_header(r, "WWW-Authenticate", "Bearer");
    if (status == 405) MHD_add_response_header(r, "Allow", cs->allow ? cs->allow : "GET");
    if (status == 503) MHD_add_response_header(r, "Retry-After", "1");
    enum MHD_Result ret = MHD_queue_response(c, (unsigned)status, r);
    MHD_destroy_response(r);
    cs->responded = true;
    if (!cs->counted) nx_metrics_count_request(&s->metrics, cs->route, status);
    return ret;
}

/* 200 with out as compact JSON (taken: freed here); a NULL out or a failed dump is a 500 out of
 * memory, as respond makes of a NULL body. */
static enum MHD_Result respond_json(nx_server *s, struct MHD_Connection *c, conn *cs, json_t *out) {
    char *text = out ? json_dumps(out, JSON_COMPACT) : NULL;
    json_decref(out);
    return respond(s, c, cs, 200, "application/json", text);
}

static enum MHD_Result respond_error(nx_server *s, struct MHD_Connection *c, conn *cs,
                                     const nx_oai_error *e) {
    return respond(s, c, cs, e->http_status, "application/json", nx_oai_error_json(e));
}

static enum MHD_Result respond_errorf(nx_server *s, struct MHD_Connection *c, conn *cs, int status,
                                      const char *type, const char *code, const char *msg) {
    nx_oai_error e;
    nx_oai_error_set(&e, status, type, NULL, code, "%s", msg);
    return respond_error(s, c, cs, &e);
}

static bool auth_ok(const nx_server *s, struct MHD_Connection *c) {
    if (!s->api_key) return true;
    const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
    if (!h || strncasecmp(h, "Bearer ", 7) != 0) return false;
    h += 7;
    while (*h == ' ') h++;
    size_t a = strlen(h), b = strlen(s->api_key);
    /* compare in time independent of where the strings differ */
    unsigned char diff = (unsigned char)(a != b);
    for (size_t i = 0; i < b; i++) diff |= (unsigned char)(s->api_key[i] ^ (i < a ? h[i] : 0));
    return diff == 0;
}

/* Each route's path (also its label in the request metrics) and method. A path ending in "{id}"
 * matches any last segment, which its handler checks. */
static const char *const routes[][2] = {
    {"/v1/chat/completions", "POST"}, {"/v1/completions", "POST"}, {"/v1/models", "GET"},
    {"/health", "GET"},               {"/metrics", "GET"},
    {"/tokenize", "POST"},            {"/detokenize", "POST"},
    {"/slots/{id}", "POST"},          {"/slots", "GET"},
    {"/props", "GET"},
};

/* True when url is the route's path; for a "{id}" path, when url has its prefix and one more
 * segment (possibly empty), which *id (if id is non-NULL) then points to. */
static bool route_match(const char *path, const char *url, const char **id) {
    const char *brace = strchr(path, '{');
    if (!brace) return strcmp(url, path) == 0;
    const size_t n = (size_t)(brace - path);
    if (strncmp(url, path, n) != 0 || strchr(url + n, '/')) return false;
    if (id) *id = url + n;
    return true;
}

/* ---------------------------------------------------------------- request preparation */

static nx_status encode(nx_server *s, const char *text, size_t len, int32_t **ids, size_t *n,
                        nx_oai_error *e) {
    nx_error err = {0};
    if (nx_tokenizer_encode(s->tok, text, len, true, ids, n, &err) != NX_OK) {
        nx_oai_error_set(e, 400, "invalid_request_error", NULL, "invalid_prompt",
                         "The prompt cannot be tokenized: %s", err.msg);
        return NX_E_ARG;
    }
    return NX_OK;
}

/* With "n" > 1: the prompts' ids repeated so that choice c = p·n + k runs prompt p (OpenAI's
 * order of completions choices), each choice with its own ids and output. */
static nx_status expand_choices(job *j, nx_oai_error *e) {
    const size_t n = j->req.n > 1 ? (size_t)j->req.n : 1, P = j->n_prompts, C = P * n;
    j->n_per = n;
    if (n == 1) return NX_OK;
    int32_t **ids = calloc(C, sizeof *ids);
    size_t *n_ids = calloc(C, sizeof *n_ids);
    choice_out *out = calloc(C, sizeof *out);
    bool ok = ids && n_ids && out;
    for (size_t c = 0; ok && c < C; c++) {
        n_ids[c] = j->n_ids[c / n];
        ids[c] = malloc((n_ids[c] ? n_ids[c] : 1) * sizeof(int32_t));
        if (ids[c]) memcpy(ids[c], j->ids[c / n], n_ids[c] * sizeof(int32_t));
        else ok = false;
    }
    if (!ok) {
        for (size_t c = 0; ids && c < C; c++) free(ids[c]);
        free(ids);
        free(n_ids);
        free(out);
        nx_oai_error_set(e, 500, "server_error", NULL, NULL, "out of memory");
        return NX_E_NOMEM;
    }
    for (size_t p = 0; p < P; p++) free(j->ids[p]);
    free(j->ids);
    free(j->n_ids);
    free(j->out);
    j->ids = ids;
    j->n_ids = n_ids;
    j->out = out;
    j->n_prompts = C;
    return NX_OK;
}

/* Renders (chat) or takes (completions) each prompt and tokenizes it, checking it fits. */
static nx_status prepare(nx_server *s, job *j, nx_oai_error *e) {
    nx_oai_request *r = &j->req;
    j->n_prompts = r->kind == NX_OAI_CHAT ? 1 : r->n_prompts;
    j->ids = calloc(j->n_prompts, sizeof *j->ids);
    j->n_ids = calloc(j->n_prompts, sizeof *j->n_ids);
    j->out = calloc(j->n_prompts, sizeof *j->out);
    if (!j->ids || !j->n_ids || !j->out) {
        nx_oai_error_set(e, 500, "server_error", NULL, NULL, "out of memory");
        return NX_E_NOMEM;
    }
    nx_status st = NX_OK;
    pthread_mutex_lock(&s->prep_mu);
    if (r->kind == NX_OAI_CHAT) {
        if (!s->tmpl) {
            nx_oai_error_set(e, 400, "invalid_request_error", "messages", "no_chat_template",
                             "%s; use /v1/completions.", s->tmpl_error);
            st = NX_E_ARG;
            goto done;
        }
        char *text = NULL;
        nx_error err = {0};
        if (nx_chat_render_parsed(s->tmpl, r->messages, r->tools, r->add_generation_prompt,
                                  r->template_kwargs, s->bos, s->eos, &text, &err) != NX_OK) {
            nx_oai_error_set(e, 400, "invalid_request_error", "messages", "chat_template_error",
                             "The chat template rejected the conversation: %s", err.msg);
            st = NX_E_ARG;
            goto done;
        }
        if (r->tool_required) { /* the answer must call a tool: its opening is put in its mouth */
            nx_strbuf full = {0}, forced = {0};
            if (!nx_hy_markers_tools(&s->hy)) {
                free(text);
                nx_oai_error_set(e, 400, "invalid_request_error", "tool_choice", "unsupported_value",
                                 "This model's tokenizer has no tool-call markers, so a tool call cannot be required.");
                st = NX_E_ARG;
                goto done;
            }
            nx_strbuf_puts(&forced, s->hy.text[NX_HY_CALL_OPEN]);
            if (r->tool_name) {
                nx_strbuf_puts(&forced, r->tool_name);
                nx_strbuf_puts(&forced, s->hy.text[NX_HY_SEP]);
            }
            nx_strbuf_puts(&full, text);
            nx_strbuf_puts(&full, s->hy.text[NX_HY_CALLS_OPEN]);
            nx_strbuf_puts(&full, forced.data ? forced.data : "");
            free(text);
            text = nx_strbuf_take(&full);
            j->forced = nx_strbuf_take(&forced);
            if (!text || !j->forced) {
                free(text);
                nx_oai_error_set(e, 500, "server_error", NULL, NULL, "out of memory");
                st = NX_E_NOMEM;
                goto done;
            }
            /* the arguments the answer writes follow the tools' schemas */
            const int32_t *id = s->hy.id;
            const nx_tool_markers mk = {{id[NX_HY_CALL_OPEN], id[NX_HY_CALL_CLOSE], id[NX_HY_CALLS_CLOSE],
                                        id[NX_HY_SEP],       id[NX_HY_KEY_OPEN],   id[NX_HY_KEY_CLOSE],
                                        id[NX_HY_VALUE_OPEN], id[NX_HY_VALUE_CLOSE]}};
            if ((st = nx_tool_grammar_new(r->tools, r->tool_name, &mk, s->json_vocab, &j->tool_grammar, &err)) !=
                NX_OK) {
                free(text);
                nx_oai_error_set(e, st == NX_E_NOMEM ? 500 : 400, st == NX_E_NOMEM ? "server_error" : "invalid_request_error",
                                 "tools", NULL, "The tools cannot constrain a call: %s", err.msg);
                goto done;
            }
        }
        st = encode(s, text, strlen(text), &j->ids[0], &j->n_ids[0], e);
        free(text);
        if (st != NX_OK) goto done;
    } else {
        for (size_t i = 0; i < j->n_prompts; i++) {
            nx_oai_prompt *p = &r->prompts[i];
            if (p->text) {
                st = encode(s, p->text, p->text_len, &j->ids[i], &j->n_ids[i], e);
                if (st != NX_OK) goto done;
            } else {
                j->ids[i] = malloc((p->n_ids ? p->n_ids : 1) * sizeof(int32_t));
                if (!j->ids[i]) {
                    nx_oai_error_set(e, 500, "server_error", NULL, NULL, "out of memory");
                    st = NX_E_NOMEM;
                    goto done;
                }
                if (p->n_ids) memcpy(j->ids[i], p->ids, p->n_ids * sizeof(int32_t));
                j->n_ids[i] = p->n_ids;
            }
        }
    }
    for (size_t i = 0; i < j->n_prompts; i++) {
        char param[32];
        snprintf(param, sizeof param, j->n_prompts > 1 ? "prompt[%zu]" : "prompt", i);
        const char *what = r->kind == NX_OAI_CHAT ? "messages" : param;
        if (j->n_ids[i] == 0) {
            nx_oai_error_set(e, 400, "invalid_request_error", what, "empty_prompt",
                             "The prompt is empty: it has no tokens to continue from.");
            st = NX_E_ARG;
            goto done;
        }
        if ((int64_t)j->n_ids[i] + 1 > s->o.n_ctx) {
            nx_oai_error_set(e, 400, "invalid_request_error", what, "context_length_exceeded",
                             "This model's context is %d tokens, but the prompt has %zu tokens "
                             "(room is needed for at least one generated token).",
                             s->o.n_ctx, j->n_ids[i]);
            st = NX_E_ARG;
            goto done;
        }
    }
    if (st == NX_OK) st = expand_choices(j, e);
done:
    pthread_mutex_unlock(&s->prep_mu);
    return st;
}

/* ---------------------------------------------------------------- streaming */

static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max) {
    (void)pos;
    job *j = cls;
    nx_server *s = j->srv;
    pthread_mutex_lock(&j->mu);
    for (;;) {
        if (j->sse.len > 0) {
            size_t n = j->sse.len < max ? j->sse.len : max;
            memcpy(buf, j->sse.data, n);
            nx_strbuf_consume(&j->sse, n);
            pthread_mutex_unlock(&j->mu);
            return (ssize_t)n;
        }
        if (j->state == JOB_DONE) {
            pthread_mutex_unlock(&j->mu);
            return MHD_CONTENT_READER_END_OF_STREAM;
        }
        wait_tick(j);
        if (j->sse.len == 0 && j->state != JOB_DONE) {
            pthread_mutex_unlock(&j->mu);
            watch_job(s, j);
            if (atomic_load(&j->cancel) == CANCEL_CLIENT) return MHD_CONTENT_READER_END_WITH_ERROR;
            pthread_mutex_lock(&j->mu);
        }
    }
}

/* The response is gone (finished, or the client dropped): stop generating for nobody. */
static void stream_free(void *cls) {
    job *j = cls;
    pthread_mutex_lock(&j->mu);
    bool done = j->state == JOB_DONE;
    pthread_mutex_unlock(&j->mu);
    if (!done) cancel_job(j->srv, j, CANCEL_CLIENT);
    job_unref(j);
}

/* ---------------------------------------------------------------- completions */

static char *nonstream_body(job *j) {
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

/* ---------------------------------------------------------------- tokenize / detokenize */

/* An optional boolean field; false (and *e set) when it has another type. */
static bool opt_flag(json_t *root, const char *key, bool *out, nx_oai_error *e) {
    json_t *v = json_object_get(root, key);
    if (!v || json_is_null(v)) return true;
    if (!json_is_boolean(v)) {
        nx_oai_error_set(e, 400, "invalid_request_error", key, "invalid_type", "'%s' must be a boolean.", key);
        return false;
    }
    *out = json_is_true(v);
    return true;
}

/* POST /tokenize, as vLLM's and llama.cpp's servers take it: {"prompt" (or llama.cpp's "content"):
 * text} or {"messages": [...]} (rendered with the chat template, add_generation_prompt true by
 * default); "parse_special" (default true) turns special-token strings into their ids;
 * "return_token_strs" adds the vocabulary strings. The tokenizer adds no special tokens of its
 * own, so add_special_tokens / add_special change nothing (they are checked to be booleans).
 * Answers {"tokens", "count", "max_model_len"[, "token_strs"]}. */
static json_t *tokenize_body(nx_server *s, const conn *cs, json_t *root, nx_oai_error *e) {
    char *text = NULL;
    int32_t *ids = NULL;
    size_t n = 0;
    json_t *out = NULL;
    bool parse_special = true, strs = false, add_special = true;
    if (!opt_flag(root, "parse_special", &parse_special, e) || !opt_flag(root, "return_token_strs", &strs, e) ||
        !opt_flag(root, "add_special_tokens", &add_special, e) || !opt_flag(root, "add_special", &add_special, e))
        return NULL;
    json_t *prompt = json_object_get(root, "prompt");
    if (!prompt) prompt = json_object_get(root, "content");
    if (json_object_get(root, "messages")) {
        nx_oai_request r;
        if (nx_oai_request_parse(NX_OAI_CHAT, cs->body.data, cs->body.len, NULL, &r, e) != NX_OK) return NULL;
        nx_error err = {0};
        nx_status st = NX_E_ARG;
        pthread_mutex_lock(&s->prep_mu);
        if (!s->tmpl)
            nx_oai_error_set(e, 400, "invalid_request_error", "messages", "no_chat_template", "%s.", s->tmpl_error);
        else if ((st = nx_chat_render_parsed(s->tmpl, r.messages, r.tools, r.add_generation_prompt, r.template_kwargs,
                                             s->bos, s->eos, &text, &err)) != NX_OK)
            nx_oai_error_set(e, 400, "invalid_request_error", "messages", "chat_template_error",
                             "The chat template rejected the conversation: %s", err.msg);
        pthread_mutex_unlock(&s->prep_mu);
        nx_oai_request_free(&r);
        if (st != NX_OK) return NULL;
    } else if (json_is_string(prompt)) {
        text = strndup(json_string_value(prompt), json_string_length(prompt));
    } else {
        nx_oai_error_set(e, 400, "invalid_request_error", "prompt", prompt ? "invalid_type" : "missing_required_parameter",
                         "Send the text as a string 'prompt' (or 'content'), or a 'messages' list.");
        return NULL;
    }
    nx_error err = {0};
    if (!text) {
        nx_oai_error_set(e, 500, "server_error", NULL, NULL, "out of memory");
    } else if (nx_tokenizer_encode(s->tok, text, strlen(text), parse_special, &ids, &n, &err) != NX_OK) {
        nx_oai_error_set(e, 400, "invalid_request_error", "prompt", "invalid_prompt", "The text cannot be tokenized: %s",
                         err.msg);
    } else if ((out = json_pack("{s:[], s:I, s:i}", "tokens", "count", (json_int_t)n, "max_model_len",
                                (int)s->o.n_ctx))) {
        json_t *toks = json_object_get(out, "tokens"), *ts = strs ? json_array() : NULL;
        for (size_t i = 0; i < n; i++) {
            json_array_append_new(toks, json_integer(ids[i]));
            const char *str = nx_tokenizer_token_str(s->tok, ids[i]);
            json_t *js = ts ? json_stringn(str ? str : "", str ? strlen(str) : 0) : NULL;
            if (ts) json_array_append_new(ts, js ? js : json_string(""));
        }
        if (ts) json_object_set_new(out, "token_strs", ts);
    }
    free(text);
    free(ids);
    return out;
}

/* POST /detokenize: {"tokens": [ids]} -> {"prompt": text} (vLLM), also as "content" (llama.cpp). */
static json_t *detokenize_body(nx_server *s, const conn *cs, json_t *root, nx_oai_error *e) {
    (void)cs;
    json_t *toks = json_object_get(root, "tokens"), *out = NULL;
    if (!json_is_array(toks)) {
        nx_oai_error_set(e, 400, "invalid_request_error", "tokens", toks ? "invalid_type" : "missing_required_parameter",
                         "'tokens' must be a list of token ids.");
        return NULL;
    }
    const size_t n = json_array_size(toks);
    const int32_t V = nx_tokenizer_vocab_size(s->tok);
    int32_t *ids = malloc(sizeof(int32_t) * (n ? n : 1));
    char *text = NULL;
    nx_error err = {0};
    for (size_t i = 0; ids && i < n; i++) {
        json_t *v = json_array_get(toks, i);
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= V) {
            nx_oai_error_set(e, 400, "invalid_request_error", "tokens", "invalid_value",
                             "tokens[%zu] must be a token id in [0, %d).", i, (int)V);
            free(ids);
            return NULL;
        }
        ids[i] = (int32_t)json_integer_value(v);
    }
    if (!ids) nx_oai_error_set(e, 500, "server_error", NULL, NULL, "out of memory");
    else if (nx_tokenizer_decode(s->tok, ids, n, false, &text, &err) != NX_OK)
        nx_oai_error_set(e, 500, "server_error", NULL, NULL, "%s", err.msg);
    else out = json_pack("{s:s, s:s}", "prompt", text, "content", text);
    free(ids);
    free(text);
    return out;
}

/* A JSON-in, JSON-out route: the body must be an object; `body` answers it or sets e. */
static enum MHD_Result handle_json(nx_server *s, struct MHD_Connection *c, conn *cs,
                                   json_t *(*body)(nx_server *, const conn *, json_t *, nx_oai_error *)) {
    nx_oai_error e = {0};
    json_error_t jerr;
    json_t *root = json_loadb(cs->body.data ? cs->body.data : "", cs->body.len, 0, &jerr), *out = NULL;
    if (!json_is_object(root))
        nx_oai_error_set(&e, 400, "invalid_request_error", NULL, "invalid_json", "The body must be a JSON object (%s).",
                         root ? "got another JSON value" : jerr.text);
    else if (!(out = body(s, cs, root, &e)) && e.http_status == 0)
        nx_oai_error_set(&e, 500, "server_error", NULL, NULL, "out of memory");
    json_decref(root);
    if (!out) return respond_error(s, c, cs, &e);
    return respond_json(s, c, cs, out);
}

/* A new job for the request on c (one reference: the connection's), or NULL when out of memory. */
static job *job_new(nx_server *s, struct MHD_Connection *c) {
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
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    j->fd = ci ? ci->connect_fd : -1;
    return j;
}

/* The connection's thread waits for a queued job to finish, watching the client. True when the
 * caller is to answer; false when the client has gone (counted as 499, nobody to answer). */
static bool wait_job(nx_server *s, conn *cs, job *j) {
    pthread_mutex_lock(&j->mu);
    while (j->state != JOB_DONE) {
        wait_tick(j);
        if (j->state != JOB_DONE) {
            pthread_mutex_unlock(&j->mu);
            watch_job(s, j);
            pthread_mutex_lock(&j->mu);
        }
    }
    pthread_mutex_unlock(&j->mu);
    if (atomic_load(&j->cancel) != CANCEL_CLIENT) return true;
    nx_metrics_count_request(&s->metrics, cs->route, 499); /* nginx's "client closed" */
    cs->responded = true;
    return false;
}

static enum MHD_Result handle_generate(nx_server *s, struct MHD_Connection *c, conn *cs,
                                       nx_oai_kind kind) {
    nx_oai_error e;
    nx_oai_limits lim = {.model_id = s->model_id, .vocab_size = s->info->vocab_size};
    job *j = job_new(s, c);
    if (!j) return respond_errorf(s, c, cs, 500, "server_error", NULL, "out of memory");
    snprintf(j->id, sizeof j->id, "%s-%016llx", kind == NX_OAI_CHAT ? "chatcmpl" : "cmpl",
             (unsigned long long)next_random(s));

    if (nx_oai_request_parse(kind, cs->body.data, cs->body.len, &lim, &j->req, &e) != NX_OK ||
        prepare(s, j, &e) != NX_OK) {
        job_unref(j);
        return respond_error(s, c, cs, &e);
    }
    j->draft = s->has_mtp ? (j->req.has_draft ? j->req.draft : s->o.draft) : 0;
    j->verify = j->req.has_verify ? j->req.verify : s->o.verify;

    if (!enqueue(s, j)) {
        job_unref(j);
        return respond_errorf(s, c, cs, 503, "server_error", "queue_full",
                              "The server is busy: the request queue is full. Retry shortly.");
    }

    if (j->req.stream) {
        struct MHD_Response *r =
            MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16 * 1024, stream_read, j, stream_free);
        if (!r) {
            cancel_job(s, j, CANCEL_CLIENT);
            job_unref(j);
            return MHD_NO;
        }
        MHD_add_response_header(r, "Content-Type", "text/event-stream");
        MHD_add_response_header(r, "Cache-Control", "no-cache");
        MHD_add_response_header(r, "X-Accel-Buffering", "no");
        enum MHD_Result ret = MHD_queue_response(c, 200, r);
        MHD_destroy_response(r); /* stream_free drops the connection's reference */
        cs->responded = true;
        nx_metrics_count_request(&s->metrics, cs->route, 200);
        return ret;
    }

    /* Non-streaming: this connection's thread waits for the worker, watching the client. */
    enum MHD_Result ret;
    if (!wait_job(s, cs, j)) ret = MHD_NO; /* nobody to answer */
    else if (j->failed) ret = respond_error(s, c, cs, &j->err);
    else ret = respond(s, c, cs, 200, "application/json", nonstream_body(j));
    job_unref(j);
    return ret;
}

/* POST /slots/ID?action=save|restore|erase (llama.cpp's server): the action runs on the worker
 * as a job, in turn with the generations, and this thread waits for it. */
/* The one slot as llama.cpp's GET /slots and /props describe it: its context size, whether it is
 * generating, and the settings a request gets when it sets none (a request body of nothing
 * but a prompt, parsed as any other, so they cannot drift from what requests get). */
static json_t *slot_json(nx_server *s) {
    nx_oai_request r;
    nx_oai_error e;
    nx_oai_limits lim = {.model_id = s->model_id, .vocab_size = s->info->vocab_size};
    static const char probe[] = "{\"prompt\":\"\"}";
    if (nx_oai_request_parse(NX_OAI_COMPLETION, probe, sizeof probe - 1, &lim, &r, &e) != NX_OK) return NULL;
    const nx_sampler_params *sp = &r.sampling;
    pthread_mutex_lock(&s->qmu);
    const bool busy = s->n_active > 0;
    pthread_mutex_unlock(&s->qmu);
    const int32_t draft = s->has_mtp ? s->o.draft : 0;
    json_t *slot = json_pack(
        "{s:i, s:i, s:b, s:b, s:{s:f, s:i, s:f, s:f, s:f, s:f, s:f, s:i, s:s, s:s, s:i}}", "id", 0, "n_ctx",
        (int)nx_ctx_n_ctx(s->ctx), "speculative", draft != 0, "is_processing", busy, "params", "temperature",
        (double)sp->temperature, "top_k", (int)sp->top_k, "top_p", (double)sp->top_p, "min_p", (double)sp->min_p,
        "repeat_penalty", (double)sp->repetition_penalty, "presence_penalty", (double)sp->presence_penalty,
        "frequency_penalty", (double)sp->frequency_penalty, "n_predict", -1, "speculative.draft",
        draft == NX_DRAFT_AUTO ? "auto" : draft == 0 ? "off" : "fixed", "speculative.verify",
        s->o.verify == NX_VERIFY_MATCH ? "match" : "residual", "speculative.n_max",
        draft == NX_DRAFT_AUTO ? NX_MAX_DRAFT : (int)draft);
    nx_oai_request_free(&r);
    if (slot && s->slot_dir) nx_slot_quota_json(slot, s->slot_dir, s->o.slot_save_quota);
    return slot;
}

/* GET /slots: the slots, one here. GET /props: the server's settings (llama.cpp's shape). */
static enum MHD_Result handle_slot_info(nx_server *s, struct MHD_Connection *c, conn *cs, bool props) {
    json_t *slot = slot_json(s), *out = NULL;
    if (slot && !props) out = json_pack("[o]", slot);
    else if (slot) {
        const char *tmpl = nx_model_chat_template(s->model);
        out = json_pack("{s:o, s:i, s:s, s:s, s:{s:b, s:b}, s:s}", "default_generation_settings", slot, "total_slots",
                        1, "model_path", s->model_id, "chat_template", tmpl ? tmpl : "", "modalities", "vision", 0,
                        "audio", 0, "build_info", "nextn");
    }
    return respond_json(s, c, cs, out);
}

static enum MHD_Result handle_slots(nx_server *s, struct MHD_Connection *c, conn *cs, const char *url) {
    nx_oai_error e;
    if (!s->slot_dir) {
        nx_oai_error_set(&e, 501, "not_supported_error", NULL, "slots_disabled",
                         "Slot saving is disabled on this server: start it with --slot-save-path DIR to save, "
                         "restore and erase slots.");
        return respond_error(s, c, cs, &e);
    }
    const char *id = "";
    route_match(cs->route, url, &id);
    const char *action = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "action");
    nx_slot_request r;
    if (nx_slot_request_parse(id, action, cs->body.data, cs->body.len, &r, &e) != NX_OK)
        return respond_error(s, c, cs, &e);
    job *j = job_new(s, c);
    if (!j) return respond_errorf(s, c, cs, 500, "server_error", NULL, "out of memory");
    j->is_slot = true;
    j->slot = r;
    if (r.action != NX_SLOT_ERASE) {
        const size_t n = strlen(s->slot_dir) + 1 + strlen(r.filename) + 1;
        if (!(j->slot_path = malloc(n))) {
            job_unref(j);
            return respond_errorf(s, c, cs, 500, "server_error", NULL, "out of memory");
        }
        snprintf(j->slot_path, n, "%s/%s", s->slot_dir, r.filename);
    }
    if (!enqueue(s, j)) {
        job_unref(j);
        return respond_errorf(s, c, cs, 503, "server_error", "queue_full",
                              "The server is busy: the request queue is full. Retry shortly.");
    }
    enum MHD_Result ret;
    if (!wait_job(s, cs, j)) ret = MHD_NO;
    else if (j->failed) ret = respond_error(s, c, cs, &j->err);
    else ret = respond(s, c, cs, 200, "application/json", nx_slot_response_json(&j->slot, &j->slot_res));
    job_unref(j);
    return ret;
}

static size_t content_length(struct MHD_Connection *c, bool *present) {
    const char *v = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
    *present = v != NULL;
    if (!v) return 0;
    char *end;
    errno = 0;
    unsigned long long n = strtoull(v, &end, 10);
    if (errno || end == v) return SIZE_MAX;
    return n > SIZE_MAX ? SIZE_MAX : (size_t)n;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url,
                                  const char *method, const char *version, const char *upload_data,
                                  size_t *upload_data_size, void **con_cls) {
    (void)version;
    nx_server *s = cls;
    conn *cs = *con_cls;
    if (!cs) {
        /* First call: headers only. Reject what can be rejected before reading a body. */
        cs = calloc(1, sizeof *cs);
        if (!cs) return MHD_NO;
        *con_cls = cs;
        cs->route = "other";
        int route = -1;
        for (size_t i = 0; i < sizeof routes / sizeof routes[0] && route < 0; i++)
            if (route_match(routes[i][0], url, NULL)) route = (int)i;
        if (route < 0) {
            nx_oai_error e;
            nx_oai_error_set(&e, 404, "invalid_request_error", NULL, "unknown_url",
                             "Unknown request URL: %s %.200s. Please check the URL for typos.",
                             method, url);
            return respond_error(s, c, cs, &e);
        }
        cs->route = routes[route][0];
        cs->allow = routes[route][1];
        if (strcmp(method, routes[route][1]) != 0) {
            nx_oai_error e;
            nx_oai_error_set(&e, 405, "invalid_request_error", NULL, "method_not_allowed",
                             "%s is not allowed on %s; use %s.", method, cs->route, routes[route][1]);
            return respond_error(s, c, cs, &e);
        }
        if (strcmp(cs->route, "/health") != 0 && !auth_ok(s, c))
            return respond_errorf(s, c, cs, 401, "invalid_request_error", "invalid_api_key",
                                  "Incorrect or missing API key. Send it as 'Authorization: "
                                  "Bearer KEY'.");
        bool has_len;
        if (content_length(c, &has_len) > s->o.max_body) {
            nx_oai_error e;
            nx_oai_error_set(&e, 413, "invalid_request_error", NULL, "request_too_large",
                             "The request body exceeds the server's limit of %zu bytes.",
                             s->o.max_body);
            return respond_error(s, c, cs, &e);
        }
        return MHD_YES;
    }
    if (cs->responded) {
        *upload_data_size = 0; /* discard the rest of a rejected upload */
        return MHD_YES;
    }
    if (*upload_data_size > 0) {
        if (!cs->too_large && cs->body.len + *upload_data_size > s->o.max_body) {
            cs->too_large = true;
            nx_strbuf_free(&cs->body);
        }
        if (!cs->too_large && nx_strbuf_append(&cs->body, upload_data, *upload_data_size) != NX_OK)
            return MHD_NO;
        *upload_data_size = 0;
        return MHD_YES;
    }
    if (cs->too_large) {
        nx_oai_error e;
        nx_oai_error_set(&e, 413, "invalid_request_error", NULL, "request_too_large",
                         "The request body exceeds the server's limit of %zu bytes.", s->o.max_body);
        return respond_error(s, c, cs, &e);
    }

    if (strcmp(cs->route, "/health") == 0) {
        pthread_mutex_lock(&s->qmu);
        int q = s->n_queued, a = s->n_active;
        pthread_mutex_unlock(&s->qmu);
        return respond_json(s, c, cs,
                            json_pack("{s:s, s:s, s:s, s:i, s:i}", "status", "ok", "model", s->model_id, "mtp",
                                      s->info->mtp ? s->info->mtp : "none", "queued", q, "active", a));
    }
    if (strcmp(cs->route, "/v1/models") == 0)
        return respond(s, c, cs, 200, "application/json",
                       nx_oai_models_json(s->model_id, s->t_created, "nextn"));
    if (strcmp(cs->route, "/metrics") == 0) {
        pthread_mutex_lock(&s->qmu);
        nx_metrics_gauges g = {.model_id = s->model_id, .mtp = s->info->mtp, .draft = s->o.draft,
                               .queue_depth = s->n_queued, .queue_capacity = s->o.queue,
                               .active = s->n_active, .uptime = nx_now_s() - s->t_started,
                               .pcache = s->pc_stats};
        pthread_mutex_unlock(&s->qmu);
        /* count this scrape before rendering so it sees itself */
        nx_metrics_count_request(&s->metrics, cs->route, 200);
        cs->counted = true;
        return respond(s, c, cs, 200, "text/plain; version=0.0.4",
                       nx_metrics_render(&s->metrics, &g));
    }
    if (strcmp(cs->route, "/tokenize") == 0) return handle_json(s, c, cs, tokenize_body);
    if (strcmp(cs->route, "/detokenize") == 0) return handle_json(s, c, cs, detokenize_body);
    if (strcmp(cs->route, "/slots/{id}") == 0) return handle_slots(s, c, cs, url);
    if (strcmp(cs->route, "/slots") == 0) return handle_slot_info(s, c, cs, false);
    if (strcmp(cs->route, "/props") == 0) return handle_slot_info(s, c, cs, true);
    return handle_generate(s, c, cs,
                           strcmp(cs->route, "/v1/chat/completions") == 0 ? NX_OAI_CHAT
                                                                          : NX_OAI_COMPLETION);
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls,
                         enum MHD_RequestTerminationCode toe) {
    (void)cls;
    (void)c;
    (void)toe;
    conn *cs = *con_cls;
    if (!cs) return;
    nx_strbuf_free(&cs->body);
    free(cs);
    *con_cls = NULL;
}

/* ================================================================ lifecycle */

void nx_server_opts_default(nx_server_opts *o) {
    memset(o, 0, sizeof *o);
    o->host = "127.0.0.1";
    o->port = 8080;
    o->max_body = 4u << 20;
    o->timeout = 600;
    o->queue = 64;
    o->n_ctx = 4096;
    o->draft = NX_DRAFT_AUTO;
    o->verify = NX_VERIFY_RESIDUAL;
    o->split_reasoning = true;
    o->cache_ram = (size_t)1024 << 20;
    o->slot_save_quota = NX_SLOT_SAVE_QUOTA_DEFAULT;
}

static char *dup_or_null(const char *s) { return s ? strdup(s) : NULL; }

nx_status nx_server_start(nx_model *m, const nx_server_opts *o, nx_server **out, nx_error *err) {
    *out = NULL;
    if (o->queue < 1) return nx_fail(err, NX_E_ARG, "--queue %d: must be at least 1", o->queue);
    if (o->n_ctx < 2) return nx_fail(err, NX_E_ARG, "--ctx %d: must be at least 2", o->n_ctx);
    if (o->port < 0 || o->port > 65535) return nx_fail(err, NX_E_ARG, "--port %d: out of range", o->port);
    if (!nx_model_tokenizer(m))
        return nx_fail(err, NX_E_ARG, "the model ships no tokenizer.json; the server needs one");
    if (o->slot_save_path) {
        struct stat sb;
        if (!*o->slot_save_path) return nx_fail(err, NX_E_ARG, "--slot-save-path: empty directory name");
        if (stat(o->slot_save_path, &sb) != 0)
            return nx_fail(err, NX_E_ARG, "--slot-save-path %s: %s", o->slot_save_path, strerror(errno));
        if (!S_ISDIR(sb.st_mode))
            return nx_fail(err, NX_E_ARG, "--slot-save-path %s: not a directory", o->slot_save_path);
    }
    nx_server *s = calloc(1, sizeof *s);
    if (!s) return nx_fail(err, NX_E_NOMEM, "out of memory");
    s->model = m;
    s->info = nx_model_get_info(m);
    s->tok = nx_model_tokenizer(m);
    s->o = *o;
    s->host = dup_or_null(o->host ? o->host : "127.0.0.1");
    s->api_key = o->api_key && *o->api_key ? strdup(o->api_key) : NULL;
    s->model_id = dup_or_null(o->model_id ? o->model_id : "nextn");
    if (o->slot_save_path && (s->slot_dir = strdup(o->slot_save_path))) {
        size_t n = strlen(s->slot_dir);
        while (n > 1 && s->slot_dir[n - 1] == '/') s->slot_dir[--n] = '\0'; /* "dir/" + "/" + name */
    }
    s->has_mtp = s->info->mtp && strncmp(s->info->mtp, "none", 4) != 0 &&
                 strcmp(s->info->mtp, "disabled") != 0;
    s->t_created = (int64_t)time(NULL);
    s->t_started = nx_now_s();
    s->rng = (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32) ^ (uint64_t)(uintptr_t)s;
    byte_map_init(s);
    /* From tokenizer_config.json (read by the model): the template's special-token strings
     * (else the config's ids, below), and the token_suffix Hy3's output markers are spelled with
     * (":opensource" in the final release; else bare, as in Hy3-preview) */
    nx_hy_markers_init(&s->hy, NULL, s->tok);
    const char *cfg_bos, *cfg_eos, *suffix;
    nx_model_template_strings(m, &cfg_bos, &cfg_eos, &suffix);
    s->bos = dup_or_null(cfg_bos);
    s->eos = dup_or_null(cfg_eos);
    if (suffix) {
        nx_hy_markers sm;
        nx_hy_markers_init(&sm, suffix, s->tok);
        if (nx_hy_markers_tools(&sm) || nx_hy_markers_reasoning(&sm)) s->hy = sm;
    }
    if (!s->bos && s->info->bos_id >= 0 && nx_tokenizer_token_str(s->tok, s->info->bos_id))
        s->bos = strdup(nx_tokenizer_token_str(s->tok, s->info->bos_id));
    if (!s->eos && s->info->eos_id >= 0 && nx_tokenizer_token_str(s->tok, s->info->eos_id))
        s->eos = strdup(nx_tokenizer_token_str(s->tok, s->info->eos_id));
    const char *tsrc = nx_model_chat_template(m);
    snprintf(s->tmpl_error, sizeof s->tmpl_error, "The model ships no chat template");
    if (tsrc) {
        nx_error terr = {0};
        if (nx_jinja_parse(tsrc, strlen(tsrc), &s->tmpl, &terr) != NX_OK)
            snprintf(s->tmpl_error, sizeof s->tmpl_error, "The model's chat template does not parse: %.300s",
                     terr.msg);
    }
    nx_metrics_init(&s->metrics);
    pthread_mutex_init(&s->prep_mu, NULL);
    pthread_mutex_init(&s->qmu, NULL);
    pthread_cond_init(&s->qcv, NULL);
    nx_status st;
    if (!s->host || !s->model_id || (o->slot_save_path && !s->slot_dir)) {
        st = nx_fail(err, NX_E_NOMEM, "out of memory");
        goto fail;
    }
    if ((st = nx_ctx_new(m, o->n_ctx, &s->ctx, err)) != NX_OK) goto fail;
    if ((st = nx_prompt_cache_new(o->cache_ram, &s->pcache, err)) != NX_OK) goto fail;
    if ((st = nx_json_vocab_for_model(m, &s->json_vocab, err)) != NX_OK) goto fail;
    nx_prompt_cache_get_stats(s->pcache, &s->pc_stats);
    if (pthread_create(&s->worker, NULL, worker_main, s) != 0) {
        st = nx_fail(err, NX_E_NOMEM, "cannot start the generation worker");
        goto fail;
    }
    s->worker_started = true;

    /* Resolve --host to one address; libmicrohttpd binds exactly what it is given. */
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE | AI_NUMERICSERV};
    struct addrinfo *ai = NULL;
    char port[16];
    snprintf(port, sizeof port, "%d", o->port);
    int gai = getaddrinfo(s->host, port, &hints, &ai);
    if (gai != 0 || !ai) {
        st = nx_fail(err, NX_E_ARG, "--host %s: %s", s->host, gai_strerror(gai));
        goto fail;
    }
    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_THREAD_PER_CONNECTION |
                     MHD_USE_POLL | MHD_USE_ITC;
    if (ai->ai_family == AF_INET6) flags |= MHD_USE_IPv6;
    int max_conn = o->max_connections > 0 ? o->max_connections : o->queue + 64;
    s->mhd = MHD_start_daemon(flags, (uint16_t)o->port, NULL, NULL, on_request, s,
                              MHD_OPTION_SOCK_ADDR, ai->ai_addr,
                              MHD_OPTION_CONNECTION_LIMIT, (unsigned)max_conn,
                              /* idle connections (slow or silent clients) are closed */
                              MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)60,
                              MHD_OPTION_NOTIFY_COMPLETED, on_completed, s,
                              MHD_OPTION_END);
    int bind_errno = errno;
    freeaddrinfo(ai);
    if (!s->mhd) {
        st = nx_fail(err, NX_E_IO, "cannot listen on %s:%d: %s", s->host, o->port,
                     bind_errno ? strerror(bind_errno) : "libmicrohttpd refused to start");
        goto fail;
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(s->mhd, MHD_DAEMON_INFO_BIND_PORT);
    s->port = di ? di->port : o->port;
    *out = s;
    return NX_OK;
fail:
    nx_server_stop(s);
    return st;
}

int nx_server_port(const nx_server *s) { return s ? s->port : 0; }

void nx_server_stop(nx_server *s) {
    if (!s) return;
    /* No new connections; the listening socket is ours to close once quiesced. */
    MHD_socket lsock = s->mhd ? MHD_quiesce_daemon(s->mhd) : MHD_INVALID_SOCKET;
    pthread_mutex_lock(&s->qmu);
    s->stopping = true;
    if (s->running) atomic_store(&s->running->cancel, CANCEL_SHUTDOWN);
    pthread_cond_broadcast(&s->qcv);
    pthread_mutex_unlock(&s->qmu);
    /* The worker ends every queued job (its client gets an error) and then exits; every
     * connection thread then sees its job done and finishes. */
    if (s->worker_started) pthread_join(s->worker, NULL);
    if (s->mhd) MHD_stop_daemon(s->mhd);
    if (lsock != MHD_INVALID_SOCKET) close(lsock);
    nx_ctx_free(s->ctx);
    nx_prompt_cache_free(s->pcache);
    nx_json_vocab_free(s->json_vocab);
    nx_metrics_destroy(&s->metrics);
    pthread_mutex_destroy(&s->prep_mu);
    pthread_mutex_destroy(&s->qmu);
    pthread_cond_destroy(&s->qcv);
    free(s->host);
    free(s->api_key);
    free(s->model_id);
    free(s->slot_dir);
    nx_jinja_free(s->tmpl);
    free(s->bos);
    free(s->eos);
    free(s);
}
