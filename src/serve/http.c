/* nextn serve's HTTP side: libmicrohttpd (one thread per connection) in front of the worker.
 * Routes, authentication, body limits and responses; connection threads parse and tokenize
 * requests, then hand a job to the worker (worker.c) and stream or wait for its output. */
#include "serve/worker.h"

#include <ctype.h>
#include <errno.h>
#include <netdb.h>
#include <poll.h>
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

#ifndef MSG_NOSIGNAL /* macOS: nextn serve ignores SIGPIPE instead */
#define MSG_NOSIGNAL 0
#endif

/* ================================================================ HTTP */

typedef struct conn {
    nx_strbuf body;
    bool too_large;
    bool responded;
    bool counted; /* already in the request metrics */
    const char *route;
    const char *allow; /* the route's method, for a 405's Allow header */
    const char *origin; /* an allowed Origin the request came from, echoed in CORS headers */
    bool close;         /* answer with "Connection: close" (framing the server does not trust) */
    bool inflight;      /* counted in n_inflight until the request ends */
} conn;

/* ---------------------------------------------------------------- connections */

/* Every open connection is watched for deadlines libmicrohttpd does not have: its idle timeout
 * restarts with each byte, so a client sending a header line every few seconds held its
 * connection for ever, and enough of them locked everyone out. A request's head must arrive
 * within header_timeout, its body within body_timeout after the head; a connection past its
 * deadline is shut down (its thread then sees the end and closes it). Connections admitted past
 * max_connections (NX_RESERVE of them) serve GET /health alone and get NX_RESERVE_HEAD seconds
 * for their head, so a full server still answers its health check. */
#define NX_RESERVE 4
#define NX_RESERVE_HEAD 2.0
#define NX_KEEPALIVE 60.0 /* an idle kept-alive connection's wait for its next request */

enum { PEER_HEAD, PEER_BODY, PEER_BUSY };
typedef struct peer {
    struct peer *prev, *next;
    int fd;
    double deadline; /* monotonic seconds; 0 = none (a request being answered) */
    bool reserve;
    bool cut;
} peer;

/* The client's socket, watched for hang-ups while it waits (-1 when unknown). */
static int conn_fd(struct MHD_Connection *c) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    return ci ? ci->connect_fd : -1;
}

static peer *peer_of(struct MHD_Connection *c) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    return ci ? ci->socket_context : NULL;
}

static void on_connection(void *cls, struct MHD_Connection *c, void **socket_context,
                          enum MHD_ConnectionNotificationCode code) {
    nx_server *s = cls;
    if (code == MHD_CONNECTION_NOTIFY_STARTED) {
        peer *p = calloc(1, sizeof *p);
        if (!p) return; /* unwatched: MHD's idle timeout still applies */
        p->fd = conn_fd(c);
        pthread_mutex_lock(&s->cmu);
        p->reserve = s->n_open >= s->max_conn;
        const double head = p->reserve && s->o.header_timeout > NX_RESERVE_HEAD ? NX_RESERVE_HEAD : s->o.header_timeout;
        p->deadline = nx_now_s() + head;
        s->n_open++;
        p->next = s->peers;
        if (s->peers) s->peers->prev = p;
        s->peers = p;
        pthread_mutex_unlock(&s->cmu);
        *socket_context = p;
    } else if (code == MHD_CONNECTION_NOTIFY_CLOSED && *socket_context) {
        peer *p = *socket_context;
        pthread_mutex_lock(&s->cmu);
        if (p->prev) p->prev->next = p->next;
        else s->peers = p->next;
        if (p->next) p->next->prev = p->prev;
        s->n_open--;
        pthread_mutex_unlock(&s->cmu);
        free(p);
        *socket_context = NULL;
    }
}

/* The connection's next stage: its body is due (PEER_BODY), it is being answered (PEER_BUSY), or
 * it waits for its next request (PEER_HEAD). */
static void peer_stage(nx_server *s, struct MHD_Connection *c, int stage) {
    peer *p = peer_of(c);
    if (!p) return;
    const double now = nx_now_s();
    pthread_mutex_lock(&s->cmu);
    p->deadline = stage == PEER_BODY   ? now + s->o.body_timeout
                : stage == PEER_HEAD ? now + NX_KEEPALIVE + s->o.header_timeout
                                     : 0;
    pthread_mutex_unlock(&s->cmu);
}

static bool peer_reserve(struct MHD_Connection *c) {
    const peer *p = peer_of(c);
    return p && p->reserve;
}

static void *watchdog_main(void *arg) {
    nx_server *s = arg;
    pthread_mutex_lock(&s->cmu);
    while (!s->watchdog_stop) {
        const double now = nx_now_s();
        for (peer *p = s->peers; p; p = p->next)
            if (!p->cut && p->deadline > 0 && now > p->deadline && p->fd >= 0) {
                p->cut = true;
                shutdown(p->fd, SHUT_RDWR);
            }
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 200 * 1000000L;
        if (ts.tv_nsec >= 1000000000L) ts.tv_sec++, ts.tv_nsec -= 1000000000L;
        pthread_cond_timedwait(&s->ccv, &s->cmu, &ts);
    }
    pthread_mutex_unlock(&s->cmu);
    return NULL;
}

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
    if (ctype) MHD_add_response_header(r, "Content-Type", ctype);
    if (cs->origin) {
        MHD_add_response_header(r, "Access-Control-Allow-Origin", cs->origin);
        MHD_add_response_header(r, "Vary", "Origin");
    }
    if (cs->close) MHD_add_response_header(r, "Connection", "close");
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

/* A hybrid model's chat prompt (ids, n): the row where its generation prompt begins, where the
 * next turn, which renders this turn's answer in its own form, parts from it — a checkpoint
 * there lets that turn keep the conversation's rows (nx_gen_params.checkpoint_at). 0 when the
 * model has no recurrent states or the rendering without the generation prompt is not a prefix. */
static int32_t chat_checkpoint_at(nx_server *s, const nx_oai_request *r, const int32_t *ids, size_t n) {
    if (!s->info->linear_state_bytes || !r->add_generation_prompt) return 0;
    char *text = NULL;
    int32_t *bare = NULL;
    size_t nb = 0, k = 0;
    nx_error err = {0};
    if (nx_chat_render_parsed(s->tmpl, r->messages, r->tools, false, r->template_kwargs, s->bos, s->eos, &text,
                              &err) == NX_OK &&
        nx_tokenizer_encode(s->tok, text, strlen(text), true, &bare, &nb, &err) == NX_OK)
        while (k < nb && k < n && bare[k] == ids[k]) k++;
    free(text);
    free(bare);
    return k == nb && k + 1 < n ? (int32_t)k : 0;
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

#define NX_REQUEST_TOKENS 32768 /* the default --max-request-tokens (or the context, if larger) */

/* One request may not ask for more generated tokens than --max-request-tokens, counted over
 * its prompts and choices: the one worker runs it whole while every other request waits. */
static nx_status check_work(nx_server *s, job *j, nx_oai_error *e) {
    int64_t total = 0;
    for (size_t i = 0; i < j->n_prompts; i++) total += nx_job_max_tokens(s, j, i);
    if (total <= s->max_request_tokens) return NX_OK;
    nx_oai_error_set(e, 400, "invalid_request_error", "max_tokens", "request_too_large",
                     "This request may generate up to %lld tokens (%zu prompt%s x n %zu, each up to max_tokens "
                     "or the context's room); the server's limit is %lld per request (--max-request-tokens). "
                     "Send fewer prompts, a smaller n or a smaller max_tokens.",
                     (long long)total, j->n_prompts / j->n_per, j->n_prompts / j->n_per == 1 ? "" : "s", j->n_per,
                     (long long)s->max_request_tokens);
    return NX_E_ARG;
}

/* A forced answer's preamble after the rendered prompt text: whole, or only its trailing
 * whitespace when the prompt already ends with the rest (GLM's template renders "<think></think>"
 * itself when thinking is off). */
static void put_preamble(nx_strbuf *full, const char *text, const char *preamble) {
    size_t core = strlen(preamble);
    while (core > 0 && (preamble[core - 1] == '\n' || preamble[core - 1] == ' ')) core--;
    const size_t n = strlen(text);
    size_t lead = 0; /* the core without its leading whitespace, as a prompt may end */
    while (lead < core && (preamble[lead] == '\n' || preamble[lead] == ' ')) lead++;
    const bool has = core > lead && n >= core - lead && memcmp(text + n - (core - lead), preamble + lead, core - lead) == 0;
    nx_strbuf_puts(full, has ? preamble + core : preamble);
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
            if (!nx_chat_tokens_forced(&s->chat)) {
                free(text);
                nx_oai_error_set(e, 400, "invalid_request_error", "tool_choice", "unsupported_value", "%s",
                                 nx_chat_tokens_tools(&s->chat)
                                     ? "This model's tool calls are text the call grammar does not cover, so a tool call "
                                       "cannot be required; use tool_choice \"auto\"."
                                     : "This model's tokenizer has no tool-call markers, so a tool call cannot be required.");
                st = NX_E_ARG;
                goto done;
            }
            const nx_chat_markers *cm = &s->chat.m;
            nx_strbuf_puts(&forced, cm->tool[NX_TM_CALL_OPEN]);
            if (r->tool_name) {
                nx_strbuf_puts(&forced, r->tool_name);
                nx_strbuf_puts(&forced, cm->name_end);
            }
            nx_strbuf_puts(&full, text);
            const size_t tl = strlen(text), ol = strlen(cm->think_open);
            if (!cm->preamble_after_open || (ol && tl >= ol && strcmp(text + tl - ol, cm->think_open) == 0))
                put_preamble(&full, text, cm->preamble);
            if (!cm->tools_open_kept) nx_strbuf_puts(&full, cm->tools_open);
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
            nx_tool_markers mk;
            nx_chat_tokens_grammar(&s->chat, &mk);
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
        if (!r->tool_required) j->checkpoint_at = chat_checkpoint_at(s, r, j->ids[0], j->n_ids[0]);
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
    if (st == NX_OK) st = check_work(s, j, e);
done:
    pthread_mutex_unlock(&s->prep_mu);
    return st;
}

/* ---------------------------------------------------------------- streaming */

/* A stream silent for sse_keepalive seconds (a long prompt's prefill, a queue) gets an SSE
 * comment, which clients ignore: libmicrohttpd closes a connection idle for its timeout
 * (NX_KEEPALIVE) even while the server itself is the slow side, and proxies cut silent streams
 * (nginx after 60 s by default). */
#define NX_SSE_PING ": keep-alive\n\n"

static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max) {
    (void)pos;
    job *j = cls;
    nx_server *s = j->srv;
    pthread_mutex_lock(&j->mu);
    if (j->sse_sent == 0) j->sse_sent = nx_now_s();
    for (;;) {
        if (j->sse.len > 0) {
            size_t n = j->sse.len < max ? j->sse.len : max;
            memcpy(buf, j->sse.data, n);
            nx_strbuf_consume(&j->sse, n);
            j->sse_sent = nx_now_s();
            pthread_cond_broadcast(&j->cv); /* a worker waiting for the client to catch up */
            pthread_mutex_unlock(&j->mu);
            return (ssize_t)n;
        }
        if (j->state == JOB_DONE) {
            pthread_mutex_unlock(&j->mu);
            return MHD_CONTENT_READER_END_OF_STREAM;
        }
        if (s->o.sse_keepalive > 0 && nx_now_s() - j->sse_sent >= s->o.sse_keepalive &&
            max >= sizeof NX_SSE_PING - 1) {
            memcpy(buf, NX_SSE_PING, sizeof NX_SSE_PING - 1);
            j->sse_sent = nx_now_s();
            pthread_mutex_unlock(&j->mu);
            return (ssize_t)(sizeof NX_SSE_PING - 1);
        }
        nx_job_wait_tick(j);
        if (j->sse.len == 0 && j->state != JOB_DONE) {
            pthread_mutex_unlock(&j->mu);
            nx_job_watch(s, j);
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
    if (!done) nx_job_cancel(j->srv, j, CANCEL_CLIENT);
    nx_job_unref(j);
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
        const nx_oai_limits lim = {.args_as_text = s->chat.m.json_args}; /* rendered as chat renders it */
        if (nx_oai_request_parse(NX_OAI_CHAT, cs->body.data, cs->body.len, &lim, &r, e) != NX_OK) return NULL;
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

/* The connection's thread waits for a queued job to finish, watching the client. True when the
 * caller is to answer; false when the client has gone (counted as 499, nobody to answer). */
static bool wait_job(nx_server *s, conn *cs, job *j) {
    pthread_mutex_lock(&j->mu);
    while (j->state != JOB_DONE) {
        nx_job_wait_tick(j);
        if (j->state != JOB_DONE) {
            pthread_mutex_unlock(&j->mu);
            nx_job_watch(s, j);
            pthread_mutex_lock(&j->mu);
        }
    }
    pthread_mutex_unlock(&j->mu);
    if (atomic_load(&j->cancel) != CANCEL_CLIENT) return true;
    nx_metrics_count_request(&s->metrics, cs->route, 499); /* nginx's "client closed" */
    cs->responded = true;
    return false;
}

/* The request's job is queued: shutdown waits (a bounded time) for its response to end. */
static void mark_inflight(nx_server *s, conn *cs) {
    pthread_mutex_lock(&s->cmu);
    s->n_inflight++;
    pthread_mutex_unlock(&s->cmu);
    cs->inflight = true;
}

static enum MHD_Result handle_generate(nx_server *s, struct MHD_Connection *c, conn *cs,
                                       nx_oai_kind kind) {
    nx_oai_error e;
    nx_oai_limits lim = {.model_id = s->model_id, .vocab_size = s->info->vocab_size, .args_as_text = s->chat.m.json_args};
    job *j = nx_job_new(s, conn_fd(c));
    if (!j) return respond_errorf(s, c, cs, 500, "server_error", NULL, "out of memory");
    snprintf(j->id, sizeof j->id, "%s-%016llx", kind == NX_OAI_CHAT ? "chatcmpl" : "cmpl",
             (unsigned long long)nx_server_random(s));

    if (nx_oai_request_parse(kind, cs->body.data, cs->body.len, &lim, &j->req, &e) != NX_OK ||
        prepare(s, j, &e) != NX_OK) {
        nx_job_unref(j);
        return respond_error(s, c, cs, &e);
    }
    j->draft = s->has_mtp ? (j->req.has_draft ? j->req.draft : s->o.draft) : 0;
    j->verify = j->req.has_verify ? j->req.verify : s->o.verify;

    if (!nx_job_enqueue(s, j)) {
        nx_job_unref(j);
        return respond_errorf(s, c, cs, 503, "server_error", "queue_full",
                              "The server is busy: the request queue is full. Retry shortly.");
    }
    mark_inflight(s, cs);

    if (j->req.stream) {
        struct MHD_Response *r =
            MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16 * 1024, stream_read, j, stream_free);
        if (!r) {
            nx_job_cancel(s, j, CANCEL_CLIENT);
            nx_job_unref(j);
            return MHD_NO;
        }
        MHD_add_response_header(r, "Content-Type", "text/event-stream");
        MHD_add_response_header(r, "Cache-Control", "no-cache");
        MHD_add_response_header(r, "X-Accel-Buffering", "no");
        if (cs->origin) {
            MHD_add_response_header(r, "Access-Control-Allow-Origin", cs->origin);
            MHD_add_response_header(r, "Vary", "Origin");
        }
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
    else ret = respond(s, c, cs, 200, "application/json", nx_job_response_body(j));
    nx_job_unref(j);
    return ret;
}

/* POST /slots/ID?action=save|restore|erase (llama.cpp's server): the action runs on the worker
 * as a job, in turn with the generations, and this thread waits for it. */
/* Slot k as llama.cpp's GET /slots and /props describe it: its id, context size, whether it is
 * generating, the rows its context holds (n_past), and the settings a request gets when it sets
 * none (a request body of nothing but a prompt, parsed as any other, so they cannot drift from
 * what requests get). */
static json_t *slot_json(nx_server *s, int k) {
    nx_oai_request r;
    nx_oai_error e;
    nx_oai_limits lim = {.model_id = s->model_id, .vocab_size = s->info->vocab_size};
    static const char probe[] = "{\"prompt\":\"\"}";
    if (nx_oai_request_parse(NX_OAI_COMPLETION, probe, sizeof probe - 1, &lim, &r, &e) != NX_OK) return NULL;
    const nx_sampler_params *sp = &r.sampling;
    pthread_mutex_lock(&s->qmu);
    const srv_slot *sl = &s->slots[k];
    const bool busy = sl->running != NULL;
    const int id_task = sl->running ? (int)(sl->running->t_picked * 1000.0) & 0x7fffffff : -1;
    const int n_past = sl->n_cached;
    const json_int_t n_jobs = (json_int_t)sl->n_jobs, n_tok = (json_int_t)sl->n_tokens;
    pthread_mutex_unlock(&s->qmu);
    const int32_t draft = s->has_mtp ? s->o.draft : 0;
    json_t *slot = json_pack(
        "{s:i, s:i, s:i, s:b, s:b, s:i, s:I, s:I, s:{s:f, s:i, s:f, s:f, s:f, s:f, s:f, s:i, s:s, s:s, s:i}}", "id", k,
        "id_task", id_task, "n_ctx", (int)nx_ctx_n_ctx(sl->ctx), "speculative", draft != 0, "is_processing", busy,
        "n_past", n_past, "n_generations", n_jobs, "n_decoded_total", n_tok, "params", "temperature",
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

/* GET /slots: every slot. GET /props: the server's settings (llama.cpp's shape). */
static enum MHD_Result handle_slot_info(nx_server *s, struct MHD_Connection *c, conn *cs, bool props) {
    json_t *out = NULL;
    if (!props) {
        out = json_array();
        for (int k = 0; out && k < s->n_slots; k++) {
            json_t *slot = slot_json(s, k);
            if (!slot || json_array_append_new(out, slot) != 0) {
                json_decref(out);
                out = NULL;
            }
        }
    } else {
        json_t *slot = slot_json(s, 0);
        const char *tmpl = nx_model_chat_template(s->model);
        if (slot)
            out = json_pack("{s:o, s:i, s:s, s:s, s:{s:b, s:b}, s:s}", "default_generation_settings", slot,
                            "total_slots", s->n_slots, "model_path", s->model_id, "chat_template", tmpl ? tmpl : "",
                            "modalities", "vision", 0, "audio", 0, "build_info", "nextn");
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
    if (nx_slot_request_parse(id, action, cs->body.data, cs->body.len, s->n_slots, &r, &e) != NX_OK)
        return respond_error(s, c, cs, &e);
    job *j = nx_job_new(s, conn_fd(c));
    if (!j) return respond_errorf(s, c, cs, 500, "server_error", NULL, "out of memory");
    j->is_slot = true;
    j->slot = r;
    if (r.action != NX_SLOT_ERASE) {
        const size_t n = strlen(s->slot_dir) + 1 + strlen(r.filename) + 1;
        if (!(j->slot_path = malloc(n))) {
            nx_job_unref(j);
            return respond_errorf(s, c, cs, 500, "server_error", NULL, "out of memory");
        }
        snprintf(j->slot_path, n, "%s/%s", s->slot_dir, r.filename);
    }
    if (!nx_job_enqueue(s, j)) {
        nx_job_unref(j);
        return respond_errorf(s, c, cs, 503, "server_error", "queue_full",
                              "The server is busy: the request queue is full. Retry shortly.");
    }
    mark_inflight(s, cs);
    enum MHD_Result ret;
    if (!wait_job(s, cs, j)) ret = MHD_NO;
    else if (j->failed) ret = respond_error(s, c, cs, &j->err);
    else ret = respond(s, c, cs, 200, "application/json", nx_slot_response_json(&j->slot, &j->slot_res));
    nx_job_unref(j);
    return ret;
}

/* ---------------------------------------------------------------- request checks */

/* How the body is framed. libmicrohttpd takes the first of several Content-Length headers and
 * lets one stand beside Transfer-Encoding; a proxy in front may read the other, so such a
 * request is refused before its body is read: more than one Content-Length, Content-Length with
 * Transfer-Encoding, or a length that is not plain digits (a length too large for the body
 * limit is a 413, later). NULL when the framing is sound. */
typedef struct framing {
    int n_len, n_te, n_type;
    bool bad_len;
} framing;

static enum MHD_Result count_framing(void *cls, enum MHD_ValueKind kind, const char *key, const char *value) {
    (void)kind;
    framing *f = cls;
    if (strcasecmp(key, MHD_HTTP_HEADER_CONTENT_LENGTH) == 0) {
        f->n_len++;
        const size_t n = value ? strlen(value) : 0;
        if (n == 0 || strspn(value, "0123456789") != n) f->bad_len = true;
    } else if (strcasecmp(key, MHD_HTTP_HEADER_TRANSFER_ENCODING) == 0) {
        f->n_te++;
    } else if (strcasecmp(key, MHD_HTTP_HEADER_CONTENT_TYPE) == 0) {
        f->n_type++;
    }
    return MHD_YES;
}

static const char *framing_problem(struct MHD_Connection *c) {
    framing f = {0};
    MHD_get_connection_values(c, MHD_HEADER_KIND, count_framing, &f);
    if (f.n_len > 1) return "The request has more than one Content-Length header.";
    if (f.n_len && f.n_te) return "The request has both Content-Length and Transfer-Encoding.";
    if (f.bad_len) return "The request's Content-Length is not a number of bytes (digits only).";
    return NULL;
}

/* The name part of a Host header or an allow-list entry: "[v6]" or a name, without ":port". */
static size_t host_name_len(const char *h) {
    if (h[0] == '[') {
        const char *end = strchr(h, ']');
        return end ? (size_t)(end - h) + 1 : strlen(h);
    }
    const char *colon = strchr(h, ':');
    return colon && !strchr(colon + 1, ':') ? (size_t)(colon - h) : strlen(h);
}

static bool host_is(const char *h, size_t n, const char *name) {
    if (!name) return false;
    const size_t m = host_name_len(name);
    if (name[0] != '[' && strchr(name, ':')) { /* a bare IPv6 address (--host ::1) */
        return n == strlen(name) + 2 && h[0] == '[' && strncasecmp(h + 1, name, n - 2) == 0;
    }
    return m == n && strncasecmp(h, name, n) == 0;
}

/* Without an API key any web page the user opens could drive the server, through a DNS name of
 * its own that resolves to this address (DNS rebinding): the Host header must then name the bound
 * address, localhost, or an entry of --host-allow. A request without Host (HTTP/1.0; no browser
 * sends one) passes. */
static bool host_ok(const nx_server *s, struct MHD_Connection *c) {
    if (s->api_key) return true;
    const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_HOST);
    if (!h) return true;
    const size_t n = host_name_len(h);
    if (host_is(h, n, "localhost") || host_is(h, n, "127.0.0.1") || host_is(h, n, "[::1]") || host_is(h, n, s->host))
        return true;
    for (char **a = s->hosts; a && *a; a++)
        if (strcmp(*a, "*") == 0 || host_is(h, n, *a)) return true;
    return false;
}

/* The server's own page calling its API: browsers send Origin on a same-origin POST, and that
 * origin is the server's, http:// and the Host the request was sent to (which host_ok checks). */
static bool same_origin(struct MHD_Connection *c, const char *o) {
    const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_HOST);
    return h && *h && strncasecmp(o, "http://", 7) == 0 && strcasecmp(o + 7, h) == 0;
}

/* A browser names the page a request comes from in Origin. Requests without one (curl, SDKs)
 * pass; one with an Origin passes only when --cors lists it (or "*"), and then gets CORS
 * headers. Returns false for an origin not allowed; *origin is the allowed one or NULL. */
static bool origin_ok(const nx_server *s, struct MHD_Connection *c, const char **origin) {
    *origin = NULL;
    const char *o = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Origin");
    if (!o) return true;
    if (same_origin(c, o)) return true;
    for (char **a = s->origins; a && *a; a++)
        if (strcmp(*a, "*") == 0 || strcasecmp(*a, o) == 0) {
            *origin = o;
            return true;
        }
    return false;
}

/* A body on a JSON route must say it is JSON, once. text/plain, form encodings and no type at
 * all are what a web page can send cross-origin without a preflight, so they are refused. */
static bool json_type_ok(struct MHD_Connection *c) {
    framing f = {0};
    MHD_get_connection_values(c, MHD_HEADER_KIND, count_framing, &f);
    const char *t = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_TYPE);
    if (!t || f.n_type != 1) return false;
    while (*t == ' ' || *t == '\t') t++;
    const size_t n = strlen("application/json");
    if (strncasecmp(t, "application/json", n) != 0) return false;
    t += n;
    while (*t == ' ' || *t == '\t') t++;
    return *t == '\0' || *t == ';';
}

static bool has_body(struct MHD_Connection *c) {
    const char *len = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
    if (len) return strspn(len, "0") != strlen(len);
    return MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_TRANSFER_ENCODING) != NULL;
}

/* Parsing costs memory per value, far more than the bytes: 4 MB of nested empty arrays took
 * ~180 MB in jansson. Bodies are scanned first (outside strings) and refused past a depth, a
 * number of arrays and objects, and a number of members (commas bound them). */
#define NX_BODY_MAX_DEPTH 64
#define NX_BODY_MAX_CONTAINERS 16384
#define NX_BODY_MAX_VALUES 300000
static bool json_bounded(const char *p, size_t n, nx_oai_error *e) {
    size_t depth = 0, containers = 0, values = 1;
    bool in_str = false, esc = false;
    for (size_t i = 0; i < n; i++) {
        const char ch = p[i];
        if (in_str) {
            if (esc) esc = false;
            else if (ch == '\\') esc = true;
            else if (ch == '"') in_str = false;
            continue;
        }
        if (ch == '"') in_str = true;
        else if (ch == ',') values++;
        else if (ch == '[' || ch == '{') {
            containers++;
            values++;
            if (++depth > NX_BODY_MAX_DEPTH) {
                nx_oai_error_set(e, 400, "invalid_request_error", NULL, "json_too_deep",
                                 "The JSON body nests arrays and objects deeper than %d levels.", NX_BODY_MAX_DEPTH);
                return false;
            }
        } else if ((ch == ']' || ch == '}') && depth > 0) depth--;
    }
    if (containers > NX_BODY_MAX_CONTAINERS || values > NX_BODY_MAX_VALUES) {
        nx_oai_error_set(e, 400, "invalid_request_error", NULL, "json_too_large",
                         "The JSON body has %zu arrays and objects and about %zu values; the server takes at most "
                         "%d and %d.",
                         containers, values, NX_BODY_MAX_CONTAINERS, NX_BODY_MAX_VALUES);
        return false;
    }
    return true;
}

/* libmicrohttpd's unescaping of the path and query, except that "%00" stays as it is: a NUL
 * would end the string early, and "/slots/0%00" would read as "/slots/0". */
static size_t unescape(void *cls, struct MHD_Connection *c, char *str) {
    (void)cls;
    (void)c;
    char *w = str;
    for (const char *r = str; *r;) {
        if (r[0] == '%' && isxdigit((unsigned char)r[1]) && isxdigit((unsigned char)r[2]) && !(r[1] == '0' && r[2] == '0')) {
            const char hex[3] = {r[1], r[2], 0};
            *w++ = (char)strtol(hex, NULL, 16);
            r += 3;
        } else {
            *w++ = *r++;
        }
    }
    *w = '\0';
    return (size_t)(w - str);
}

static size_t content_length(struct MHD_Connection *c) {
    const char *v = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
    if (!v) return 0;
    char *end;
    errno = 0;
    unsigned long long n = strtoull(v, &end, 10);
    if (errno || end == v) return SIZE_MAX;
    return n > SIZE_MAX ? SIZE_MAX : (size_t)n;
}

/* ---------------------------------------------------------------- the chat page */

static const nx_web_file *web_file(const nx_server *s, const char *url) {
    for (size_t i = 0; i < s->o.n_web; i++)
        if (strcmp(s->o.web[i].path, url) == 0) return &s->o.web[i];
    return NULL;
}

/* One of the page's files. Served without a key (the page asks for it), revalidated on each load
 * (no-cache with an ETag: an upgraded server's page is never stale), and confined: its scripts
 * and styles come from this server alone, and no other site may frame it. */
static enum MHD_Result respond_web(nx_server *s, struct MHD_Connection *c, conn *cs, const nx_web_file *f) {
    const char *inm = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_IF_NONE_MATCH);
    const bool fresh = inm && strcmp(inm, f->etag) == 0;
    struct MHD_Response *r = fresh ? MHD_create_response_from_buffer(0, (void *)"", MHD_RESPMEM_PERSISTENT)
                                   : MHD_create_response_from_buffer(f->len, (void *)f->data, MHD_RESPMEM_PERSISTENT);
    if (!r) return MHD_NO;
    MHD_add_response_header(r, "Content-Type", f->type);
    MHD_add_response_header(r, "Cache-Control", "no-cache");
    MHD_add_response_header(r, "ETag", f->etag);
    MHD_add_response_header(r, "X-Content-Type-Options", "nosniff");
    MHD_add_response_header(r, "Referrer-Policy", "no-referrer");
    MHD_add_response_header(r, "Content-Security-Policy",
                            "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
                            "img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'");
    const int status = fresh ? 304 : 200;
    enum MHD_Result ret = MHD_queue_response(c, (unsigned)status, r);
    MHD_destroy_response(r);
    cs->responded = true;
    nx_metrics_count_request(&s->metrics, cs->route, status);
    return ret;
}

/* An answer to a CORS preflight (OPTIONS) for a known route: which method and headers a page of
 * an allowed origin may send. Preflights carry no credentials, so no key is asked for. */
static enum MHD_Result respond_preflight(nx_server *s, struct MHD_Connection *c, conn *cs) {
    char methods[32];
    snprintf(methods, sizeof methods, "%s, OPTIONS", cs->allow);
    struct MHD_Response *r = MHD_create_response_from_buffer(0, (void *)"", MHD_RESPMEM_PERSISTENT);
    if (!r) return MHD_NO;
    MHD_add_response_header(r, "Allow", methods);
    if (cs->origin) {
        MHD_add_response_header(r, "Access-Control-Allow-Origin", cs->origin);
        MHD_add_response_header(r, "Access-Control-Allow-Methods", methods);
        MHD_add_response_header(r, "Access-Control-Allow-Headers", "Authorization, Content-Type");
        MHD_add_response_header(r, "Access-Control-Max-Age", "600");
        MHD_add_response_header(r, "Vary", "Origin");
    }
    enum MHD_Result ret = MHD_queue_response(c, 204, r);
    MHD_destroy_response(r);
    cs->responded = true;
    nx_metrics_count_request(&s->metrics, cs->route, 204);
    return ret;
}

/* First call of a request: headers only. Everything that can be refused before a body is read
 * is refused here, in this order: framing, Host, Origin (then preflights), the API key (so
 * without it nothing about the routes is told), the route and method, the reserve connections'
 * one route, the content type and the declared length. */
static enum MHD_Result on_head(nx_server *s, struct MHD_Connection *c, conn *cs, const char *url, const char *method) {
    nx_oai_error e;
    const char *bad = framing_problem(c);
    if (bad) {
        cs->close = true;
        return respond_errorf(s, c, cs, 400, "invalid_request_error", "ambiguous_framing", bad);
    }
    peer_stage(s, c, PEER_BODY);
    if (!host_ok(s, c)) {
        cs->close = true;
        return respond_errorf(s, c, cs, 403, "invalid_request_error", "host_not_allowed",
                              "The Host header names neither this server's address nor localhost; allow other "
                              "names with --host-allow.");
    }
    if (!origin_ok(s, c, &cs->origin))
        return respond_errorf(s, c, cs, 403, "invalid_request_error", "origin_not_allowed",
                              "Cross-origin requests are refused; allow an origin with --cors ORIGIN.");
    const nx_web_file *wf = web_file(s, url);
    if (wf) { /* before the key: the page loads, then asks for it */
        cs->route = "/"; /* the page's files count as one route in the metrics */
        cs->allow = "GET, HEAD";
        if (strcmp(method, "GET") != 0 && strcmp(method, "HEAD") != 0) {
            if (!auth_ok(s, c)) /* as on every route: without the key, nothing about methods */
                return respond_errorf(s, c, cs, 401, "invalid_request_error", "invalid_api_key",
                                      "Incorrect or missing API key. Send it as 'Authorization: Bearer KEY'.");
            nx_oai_error_set(&e, 405, "invalid_request_error", NULL, "method_not_allowed",
                             "%s is not allowed on %.200s; use GET.", method, url);
            return respond_error(s, c, cs, &e);
        }
        if (peer_reserve(c)) {
            cs->close = true;
            return respond_errorf(s, c, cs, 503, "server_error", "too_many_connections",
                                  "The server has no free connection; retry shortly.");
        }
        return respond_web(s, c, cs, wf);
    }
    int route = -1;
    for (size_t i = 0; i < sizeof routes / sizeof routes[0] && route < 0; i++)
        if (route_match(routes[i][0], url, NULL)) route = (int)i;
    if (route >= 0) {
        cs->route = routes[route][0];
        cs->allow = routes[route][1];
        if (strcmp(method, "OPTIONS") == 0) return respond_preflight(s, c, cs);
    }
    if ((route < 0 || strcmp(cs->route, "/health") != 0) && !auth_ok(s, c))
        return respond_errorf(s, c, cs, 401, "invalid_request_error", "invalid_api_key",
                              "Incorrect or missing API key. Send it as 'Authorization: Bearer KEY'.");
    if (route < 0) {
        nx_oai_error_set(&e, 404, "invalid_request_error", NULL, "unknown_url",
                         "Unknown request URL: %s %.200s. Please check the URL for typos.", method, url);
        return respond_error(s, c, cs, &e);
    }
    if (strcmp(method, routes[route][1]) != 0) {
        nx_oai_error_set(&e, 405, "invalid_request_error", NULL, "method_not_allowed",
                         "%s is not allowed on %s; use %s.", method, cs->route, routes[route][1]);
        return respond_error(s, c, cs, &e);
    }
    if (peer_reserve(c) && strcmp(cs->route, "/health") != 0) {
        cs->close = true;
        return respond_errorf(s, c, cs, 503, "server_error", "too_many_connections",
                              "The server has no free connection; retry shortly.");
    }
    if (strcmp(method, "POST") == 0 && has_body(c) && !json_type_ok(c))
        return respond_errorf(s, c, cs, 415, "invalid_request_error", "unsupported_media_type",
                              "The body must be sent as 'Content-Type: application/json'.");
    if (content_length(c) > s->o.max_body) {
        nx_oai_error_set(&e, 413, "invalid_request_error", NULL, "request_too_large",
                         "The request body exceeds the server's limit of %zu bytes.", s->o.max_body);
        return respond_error(s, c, cs, &e);
    }
    return MHD_YES;
}

/* ---------------------------------------------------------------- lengths libmicrohttpd refuses */

/* libmicrohttpd 0.9.75 refuses a Content-Length that is not plain digits or passes 64 bits while
 * it reads the head, before on_request sees the request, and its reply is malformed: it builds
 * the reply's head, then goes on as if the request were sound and builds the head again (two
 * status lines before one body; fixed in libmicrohttpd 1.0). The one callback on that path is its
 * error log, called before the reply is built, on the connection's own thread (one thread per
 * connection). So each thread remembers the connection whose head is being read, from its request
 * line to on_request; when the log speaks while that head has such a length, the server answers
 * the request itself and shuts the socket's sending side: libmicrohttpd's reply then fails to
 * send, and it closes the connection. */
static _Thread_local struct MHD_Connection *head_conn;

static void *on_uri(void *cls, const char *uri, struct MHD_Connection *c) {
    (void)cls;
    (void)uri;
    head_conn = c;
    return NULL; /* the request's con_cls, which on_request allocates */
}

/* True when libmicrohttpd refuses the head's Content-Length: it reads the first one, none beside
 * Transfer-Encoding, and refuses anything but digits and values past 64 bits. */
static bool length_refused_by_mhd(struct MHD_Connection *c) {
    const char *v = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
    if (!v || MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_TRANSFER_ENCODING)) return false;
    const size_t n = strlen(v);
    if (n == 0 || strspn(v, "0123456789") != n) return true;
    uint64_t x = 0;
    for (const char *p = v; *p; p++) {
        const uint64_t d = (uint64_t)(*p - '0');
        if (x > (UINT64_MAX - d) / 10) return true;
        x = x * 10 + d;
    }
    return false;
}

/* Writes all of buf to the (non-blocking) socket within NX_RAW_SEND seconds; false if it cannot. */
#define NX_RAW_SEND 2.0
static bool send_all(int fd, const char *buf, size_t n) {
    const double until = nx_now_s() + NX_RAW_SEND;
    while (n > 0) {
        const ssize_t k = send(fd, buf, n, MSG_NOSIGNAL);
        if (k > 0) {
            buf += k;
            n -= (size_t)k;
            continue;
        }
        if (k < 0 && errno == EINTR) continue;
        const double left = until - nx_now_s();
        if (k == 0 || (errno != EAGAIN && errno != EWOULDBLOCK) || left <= 0) return false;
        struct pollfd p = {.fd = fd, .events = POLLOUT};
        poll(&p, 1, (int)(left * 1000) + 1);
    }
    return true;
}

/* The error response to the request on c, written to its socket by the server itself, after
 * which the socket sends nothing more. */
static void answer_and_shut(nx_server *s, struct MHD_Connection *c, const nx_oai_error *e) {
    static const char days[7][4] = {"Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat"};
    static const char months[12][4] = {"Jan", "Feb", "Mar", "Apr", "May", "Jun",
                                       "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"};
    const int fd = conn_fd(c);
    if (fd < 0) return;
    char *body = nx_oai_error_json(e);
    const time_t now = time(NULL);
    struct tm tm = {0};
    gmtime_r(&now, &tm);
    const char *reason = MHD_get_reason_phrase_for((unsigned)e->http_status);
    const size_t len = body ? strlen(body) : 0;
    char head[256];
    const int n = snprintf(head, sizeof head,
                           "HTTP/1.1 %d %s\r\nDate: %s, %02d %s %04d %02d:%02d:%02d GMT\r\nConnection: close\r\n"
                           "Content-Type: application/json\r\nContent-Length: %zu\r\n\r\n",
                           e->http_status, reason, days[tm.tm_wday % 7], tm.tm_mday, months[tm.tm_mon % 12],
                           tm.tm_year + 1900, tm.tm_hour, tm.tm_min, tm.tm_sec, len);
    if (body && n > 0 && (size_t)n < sizeof head && send_all(fd, head, (size_t)n)) send_all(fd, body, len);
    free(body);
    shutdown(fd, SHUT_WR);
    nx_metrics_count_request(&s->metrics, "other", e->http_status);
}

/* libmicrohttpd's error log: nothing is printed; it is the moment to answer a head whose length
 * libmicrohttpd refuses (above). */
static void on_mhd_log(void *cls, const char *fmt, va_list ap) {
    (void)fmt;
    (void)ap;
    nx_server *s = cls;
    struct MHD_Connection *c = head_conn;
    if (!c || !length_refused_by_mhd(c)) return;
    head_conn = NULL;
    nx_oai_error e;
    const char *bad = framing_problem(c);
    if (bad) {
        nx_oai_error_set(&e, 400, "invalid_request_error", NULL, "ambiguous_framing", "%s", bad);
    } else {
        nx_oai_error_set(&e, 413, "invalid_request_error", NULL, "request_too_large",
                         "The request's Content-Length passes 64 bits; the server's limit is %zu bytes.",
                         s->o.max_body);
    }
    answer_and_shut(s, c, &e);
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url,
                                  const char *method, const char *version, const char *upload_data,
                                  size_t *upload_data_size, void **con_cls) {
    (void)version;
    nx_server *s = cls;
    conn *cs = *con_cls;
    if (!cs) {
        head_conn = NULL; /* libmicrohttpd took the head */
        cs = calloc(1, sizeof *cs);
        if (!cs) return MHD_NO;
        *con_cls = cs;
        cs->route = "other";
        return on_head(s, c, cs, url, method);
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
    peer_stage(s, c, PEER_BUSY);
    nx_oai_error e;
    if (cs->too_large) {
        nx_oai_error_set(&e, 413, "invalid_request_error", NULL, "request_too_large",
                         "The request body exceeds the server's limit of %zu bytes.", s->o.max_body);
        return respond_error(s, c, cs, &e);
    }
    if (cs->body.len > 0 && !json_bounded(cs->body.data, cs->body.len, &e)) return respond_error(s, c, cs, &e);

    if (strcmp(cs->route, "/health") == 0) {
        pthread_mutex_lock(&s->qmu);
        int q = s->n_queued, a = s->n_active;
        pthread_mutex_unlock(&s->qmu);
        return respond_json(s, c, cs,
                            json_pack("{s:s, s:s, s:s, s:i, s:i, s:b}", "status", "ok", "model", s->model_id, "mtp",
                                      s->info->mtp ? s->info->mtp : "none", "queued", q, "active", a,
                                      "api_key_required", s->api_key != NULL));
    }
    if (strcmp(cs->route, "/v1/models") == 0)
        return respond(s, c, cs, 200, "application/json",
                       nx_oai_models_json(s->model_id, s->t_created, "nextn"));
    if (strcmp(cs->route, "/metrics") == 0) {
        bool busy[NX_MAX_SLOTS];
        int64_t jobs[NX_MAX_SLOTS], toks[NX_MAX_SLOTS];
        nx_batch_stats bs;
        if (s->batch) nx_batch_get_stats(s->batch, &bs);
        pthread_mutex_lock(&s->qmu);
        for (int k = 0; k < s->n_slots; k++) {
            busy[k] = s->slots[k].running != NULL;
            jobs[k] = s->slots[k].n_jobs;
            toks[k] = s->slots[k].n_tokens;
        }
        nx_metrics_gauges g = {.model_id = s->model_id, .mtp = s->info->mtp, .draft = s->o.draft,
                               .queue_depth = s->n_queued, .queue_capacity = s->o.queue,
                               .active = s->n_active, .uptime = nx_now_s() - s->t_started,
                               .pcache = s->pc_stats, .n_slots = s->n_slots, .slot_busy = busy,
                               .slot_jobs = jobs, .slot_tokens = toks, .batch = s->batch ? &bs : NULL};
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
    (void)toe;
    conn *cs = *con_cls;
    nx_server *s = cls;
    peer_stage(s, c, PEER_HEAD); /* kept alive: the next request's head is due */
    if (!cs) return;
    if (cs->inflight) {
        pthread_mutex_lock(&s->cmu);
        s->n_inflight--;
        pthread_cond_broadcast(&s->ccv);
        pthread_mutex_unlock(&s->cmu);
    }
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
    o->ctx_checkpoints = NX_CTX_CHECKPOINTS_DEFAULT;
    o->checkpoint_every = NX_CHECKPOINT_EVERY_DEFAULT;
    o->slot_save_quota = NX_SLOT_SAVE_QUOTA_DEFAULT;
    o->header_timeout = 10;
    o->body_timeout = 60;
    o->sse_keepalive = 15;
    o->max_unsent = (size_t)1 << 20;
    o->shutdown_grace = 10;
}

static char *dup_or_null(const char *s) { return s ? strdup(s) : NULL; }

/* "a, b,c" as a NULL-terminated list of "a", "b", "c" (empty entries dropped); an empty list
 * for NULL. False when out of memory. */
static bool split_list(const char *text, char ***out) {
    size_t n = 0;
    for (const char *p = text; p && *p; p++) n += *p == ',';
    char **v = calloc(n + 2, sizeof *v);
    if (!v) return false;
    *out = v;
    size_t k = 0;
    for (const char *p = text; p && *p;) {
        p += strspn(p, " \t,");
        size_t len = strcspn(p, ",");
        while (len > 0 && (p[len - 1] == ' ' || p[len - 1] == '\t')) len--;
        if (len > 0 && !(v[k++] = strndup(p, len))) return false;
        p += strcspn(p, ",");
    }
    return true;
}

static void free_list(char **v) {
    for (char **p = v; p && *p; p++) free(*p);
    free(v);
}

/* Slots --parallel 0 gets: as many contexts as half the memory available now holds, at most
 * NX_DEFAULT_SLOTS (each is its context's KV caches and scratch). */
#define NX_DEFAULT_SLOTS 4
static int default_slots(size_t ctx_bytes) {
    const long pages = sysconf(_SC_AVPHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    if (pages <= 0 || page <= 0 || ctx_bytes == 0) return 1;
    const double fit = (double)pages * (double)page / 2.0 / (double)ctx_bytes;
    return fit >= NX_DEFAULT_SLOTS ? NX_DEFAULT_SLOTS : fit >= 1.0 ? (int)fit : 1;
}

/* Rows one batched forward holds: a prompt's prefill chunk and a verify of every slot. */
static int32_t batch_rows(const nx_ctx *c, int n_slots) { return nx_ctx_n_batch_rows(c) + n_slots * (NX_MAX_DRAFT + 1); }

/* The slots' contexts (--parallel, 0: default_slots), sharing one batch when there are several. */
static nx_status slots_new(nx_server *s, nx_model *m, const nx_server_opts *o, nx_error *err) {
    if (o->parallel < 0 || o->parallel > NX_MAX_SLOTS)
        return nx_fail(err, NX_E_ARG, "--parallel %d: must be 1..%d (0: sized from memory)", o->parallel,
                       NX_MAX_SLOTS);
    nx_ctx *first;
    nx_status st = nx_ctx_new(m, o->n_ctx, &first, err);
    if (st == NX_OK && (st = nx_ctx_set_checkpoints(first, o->ctx_checkpoints, o->checkpoint_every, err)) != NX_OK)
        nx_ctx_free(first);
    if (st != NX_OK) return st;
    const int n = o->parallel > 0 ? o->parallel : default_slots(nx_ctx_bytes(first));
    if (!(s->slots = calloc((size_t)n, sizeof *s->slots))) {
        nx_ctx_free(first);
        return nx_fail(err, NX_E_NOMEM, "out of memory");
    }
    s->n_slots = n;
    for (int k = 0; k < n; k++) {
        s->slots[k].srv = s;
        s->slots[k].id = k;
        if (k == 0) s->slots[k].ctx = first;
        else if ((st = nx_ctx_new(m, o->n_ctx, &s->slots[k].ctx, err)) != NX_OK ||
                 (st = nx_ctx_set_checkpoints(s->slots[k].ctx, o->ctx_checkpoints, o->checkpoint_every, err)) != NX_OK)
            return st;
    }
    if (n == 1) return NX_OK;
    if ((st = nx_batch_new(m, n, batch_rows(first, n), &s->batch, err)) != NX_OK) return st;
    for (int k = 0; k < n; k++) nx_batch_add(s->batch, s->slots[k].ctx);
    return NX_OK;
}

nx_status nx_server_start(nx_model *m, const nx_server_opts *o, nx_server **out, nx_error *err) {
    *out = NULL;
    if (o->queue < 1) return nx_fail(err, NX_E_ARG, "--queue %d: must be at least 1", o->queue);
    if (o->n_ctx < 2) return nx_fail(err, NX_E_ARG, "--ctx %d: must be at least 2", o->n_ctx);
    if (o->port < 0 || o->port > 65535) return nx_fail(err, NX_E_ARG, "--port %d: out of range", o->port);
    if (o->api_key && !*o->api_key)
        return nx_fail(err, NX_E_ARG, "--api-key: empty key (leave the option out to run without one)");
    if (!(o->header_timeout > 0) || !(o->body_timeout > 0))
        return nx_fail(err, NX_E_ARG, "--header-timeout / --body-timeout: must be more than 0 seconds");
    if (!(o->sse_keepalive >= 0 && o->sse_keepalive < NX_KEEPALIVE))
        return nx_fail(err, NX_E_ARG, "--sse-keepalive %g: must be 0 (off) or less than %g seconds", o->sse_keepalive,
                       NX_KEEPALIVE);
    if (o->max_request_tokens < 0)
        return nx_fail(err, NX_E_ARG, "--max-request-tokens %lld: must be at least 1", (long long)o->max_request_tokens);
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
    s->api_key = dup_or_null(o->api_key);
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
    nx_server_byte_map_init(s);
    /* The chat format is the family's (Hy3's for a family without one of its own). From
     * tokenizer_config.json (read by the model): the template's special-token strings (else the
     * config's ids, below), and the token_suffix the format's markers are spelled with (Hy3:
     * ":opensource" in the final release; else bare, as in Hy3-preview) */
    const nx_chat_format *cf = nx_chat_format_for_family(s->info->family);
    if (!cf) cf = nx_chat_format_by_name("hy3");
    nx_chat_tokens_init(&s->chat, cf, NULL, s->tok);
    const char *cfg_bos, *cfg_eos, *suffix;
    nx_model_template_strings(m, &cfg_bos, &cfg_eos, &suffix);
    s->bos = dup_or_null(cfg_bos);
    s->eos = dup_or_null(cfg_eos);
    if (suffix) {
        nx_chat_tokens sm;
        nx_chat_tokens_init(&sm, cf, suffix, s->tok);
        if (nx_chat_tokens_tools(&sm) || nx_chat_tokens_reasoning(&sm)) s->chat = sm;
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
    pthread_mutex_init(&s->cmu, NULL);
    pthread_cond_init(&s->ccv, NULL);
    pthread_mutex_init(&s->prep_mu, NULL);
    pthread_mutex_init(&s->pc_mu, NULL);
    pthread_mutex_init(&s->qmu, NULL);
    pthread_cond_init(&s->qcv, NULL);
    nx_status st;
    /* by default a chat without max_tokens (up to the whole context) always fits */
    s->max_request_tokens = o->max_request_tokens > 0 ? o->max_request_tokens
                          : o->n_ctx > NX_REQUEST_TOKENS ? o->n_ctx : NX_REQUEST_TOKENS;
    const bool lists = split_list(o->host_allow, &s->hosts) && split_list(o->cors, &s->origins);
    if (!lists || !s->host || !s->model_id || (o->slot_save_path && !s->slot_dir) || (o->api_key && !s->api_key)) {
        st = nx_fail(err, NX_E_NOMEM, "out of memory");
        goto fail;
    }
    if ((st = slots_new(s, m, o, err)) != NX_OK) goto fail;
    if ((st = nx_prompt_cache_new(o->cache_ram, &s->pcache, err)) != NX_OK) goto fail;
    if ((st = nx_json_vocab_for_model(m, &s->json_vocab, err)) != NX_OK) goto fail;
    nx_prompt_cache_get_stats(s->pcache, &s->pc_stats);
    for (int k = 0; k < s->n_slots; k++) {
        if (pthread_create(&s->slots[k].thread, NULL, nx_worker_main, &s->slots[k]) != 0) {
            st = nx_fail(err, NX_E_NOMEM, "cannot start the generation worker of slot %d", k);
            goto fail;
        }
        s->slots[k].started = true;
        s->n_workers++;
    }
    if (pthread_create(&s->watchdog, NULL, watchdog_main, s) != 0) {
        st = nx_fail(err, NX_E_NOMEM, "cannot start the connection watchdog");
        goto fail;
    }
    s->watchdog_started = true;

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
    s->max_conn = o->max_connections > 0 ? o->max_connections : o->queue + 64;
    const int per_ip = o->max_conns_per_ip > 0 ? o->max_conns_per_ip
                     : o->max_conns_per_ip == 0 ? (s->max_conn + 3) / 4 : 0; /* 0: MHD's "no limit" */
    s->mhd = MHD_start_daemon(flags | MHD_USE_ERROR_LOG, (uint16_t)o->port, NULL, NULL, on_request, s,
                              MHD_OPTION_EXTERNAL_LOGGER, on_mhd_log, s,
                              MHD_OPTION_URI_LOG_CALLBACK, on_uri, s,
                              MHD_OPTION_SOCK_ADDR, ai->ai_addr,
                              MHD_OPTION_CONNECTION_LIMIT, (unsigned)(s->max_conn + NX_RESERVE),
                              MHD_OPTION_PER_IP_CONNECTION_LIMIT, (unsigned)per_ip,
                              /* silent connections are closed; dripping ones by the watchdog */
                              MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)NX_KEEPALIVE,
                              MHD_OPTION_NOTIFY_COMPLETED, on_completed, s,
                              MHD_OPTION_NOTIFY_CONNECTION, on_connection, s,
                              MHD_OPTION_UNESCAPE_CALLBACK, unescape, s,
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
    s->o.shutdown_grace = 0;
    nx_server_stop(s);
    return st;
}

int nx_server_port(const nx_server *s) { return s ? s->port : 0; }

/* Waits on cv (mu held) until done(s) or the monotonic time `until`; true when done. */
static bool wait_until(pthread_cond_t *cv, pthread_mutex_t *mu, bool (*done)(const nx_server *), const nx_server *s,
                       double until) {
    while (!done(s)) {
        const double left = until - nx_now_s();
        if (left <= 0) return false;
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        const double step = left < 0.1 ? left : 0.1;
        ts.tv_nsec += (long)(step * 1e9);
        if (ts.tv_nsec >= 1000000000L) ts.tv_sec++, ts.tv_nsec -= 1000000000L;
        pthread_cond_timedwait(cv, mu, &ts);
    }
    return true;
}

static bool worker_done(const nx_server *s) { return s->n_workers_done == s->n_workers; }
static bool responses_done(const nx_server *s) { return s->n_inflight == 0; }

/* After the running request is cancelled: time for it to notice (its next token). */
#define NX_STOP_CANCEL 1.0
/* Then time for the responses to reach their clients (error events, [DONE], the chunked end). */
#define NX_STOP_FLUSH 2.0

bool nx_server_stop(nx_server *s) {
    if (!s) return true;
    /* No new connections; the listening socket is ours to close once quiesced. */
    MHD_socket lsock = s->mhd ? MHD_quiesce_daemon(s->mhd) : MHD_INVALID_SOCKET;
    /* Queued requests end now (their clients get an error); the running one may finish within
     * the grace period, then is cancelled at its next token. */
    pthread_mutex_lock(&s->qmu);
    s->stopping = true;
    pthread_cond_broadcast(&s->qcv);
    pthread_mutex_unlock(&s->qmu);
    for (;;) {
        pthread_mutex_lock(&s->qmu);
        job *j = s->head;
        if (j) {
            pthread_mutex_lock(&j->mu);
            j->refs++;
            pthread_mutex_unlock(&j->mu);
        }
        pthread_mutex_unlock(&s->qmu);
        if (!j) break;
        nx_job_cancel(s, j, CANCEL_SHUTDOWN);
        nx_job_unref(j);
    }
    pthread_mutex_lock(&s->qmu);
    bool idle = wait_until(&s->qcv, &s->qmu, worker_done, s, nx_now_s() + s->o.shutdown_grace);
    if (!idle) {
        for (int k = 0; k < s->n_slots; k++)
            if (s->slots[k].running) atomic_store(&s->slots[k].running->cancel, CANCEL_SHUTDOWN);
        idle = wait_until(&s->qcv, &s->qmu, worker_done, s, nx_now_s() + NX_STOP_CANCEL);
    }
    pthread_mutex_unlock(&s->qmu);
    if (!idle) return false; /* the worker is inside one long step: the caller exits */
    for (int k = 0; k < s->n_slots; k++)
        if (s->slots[k].started) pthread_join(s->slots[k].thread, NULL);
    pthread_mutex_lock(&s->cmu);
    wait_until(&s->ccv, &s->cmu, responses_done, s, nx_now_s() + NX_STOP_FLUSH);
    s->watchdog_stop = true;
    pthread_cond_broadcast(&s->ccv);
    pthread_mutex_unlock(&s->cmu);
    if (s->watchdog_started) pthread_join(s->watchdog, NULL);
    if (s->mhd) MHD_stop_daemon(s->mhd);
    if (lsock != MHD_INVALID_SOCKET) close(lsock);
    for (int k = 0; s->slots && k < s->n_slots; k++) nx_ctx_free(s->slots[k].ctx);
    free(s->slots);
    nx_batch_free(s->batch);
    pthread_mutex_destroy(&s->pc_mu);
    nx_prompt_cache_free(s->pcache);
    nx_json_vocab_free(s->json_vocab);
    nx_metrics_destroy(&s->metrics);
    pthread_mutex_destroy(&s->prep_mu);
    pthread_mutex_destroy(&s->cmu);
    pthread_cond_destroy(&s->ccv);
    pthread_mutex_destroy(&s->qmu);
    pthread_cond_destroy(&s->qcv);
    free(s->host);
    free(s->api_key);
    free(s->model_id);
    free(s->slot_dir);
    nx_jinja_free(s->tmpl);
    free(s->bos);
    free(s->eos);
    free_list(s->hosts);
    free_list(s->origins);
    free(s);
    return true;
}

