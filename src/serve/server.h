/* The OpenAI-compatible HTTP server: libmicrohttpd in thread-per-connection mode in front of one
 * generation worker that owns the model's single context and serves a fair FIFO queue. Streaming
 * responses are fed token by token; a client that goes away cancels its generation. */
#ifndef NX_SERVE_SERVER_H
#define NX_SERVE_SERVER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "nextn.h"

/* One file of the chat page, served at its path without an API key (the page asks for the key
 * and sends it with its API calls). The nextn program embeds web/ as a table of these. */
typedef struct nx_web_file {
    const char *path; /* "/", "/app.js", ... */
    const char *type; /* its Content-Type */
    const char *etag; /* a quoted hash of the bytes */
    const unsigned char *data;
    size_t len;
} nx_web_file;

typedef struct nx_server_opts {
    const char *host;    /* address to bind; "127.0.0.1" by default */
    int port;            /* 0 = an ephemeral port (see nx_server_port) */
    const char *api_key; /* NULL = no authentication; else "Authorization: Bearer KEY" (an empty
                          * key is an error, not "no authentication") */
    const char *model_id; /* the name clients send as "model" */
    size_t max_body;     /* request bytes before 413 */
    double timeout;      /* seconds a request may take, queueing included; 0 = unlimited */
    int queue;           /* requests that may wait for the worker before 503 */
    int max_connections; /* open connections at once; 0 = queue + 64 (a few more are kept for
                          * GET /health alone) */
    int max_conns_per_ip; /* open connections from one address; 0 = a quarter of max_connections,
                           * < 0 = no limit */
    double header_timeout; /* seconds for a request's whole head (request line and headers) */
    double body_timeout;   /* seconds for its body, once the head is in */
    double sse_keepalive;  /* seconds of silence after which a stream gets an SSE comment; 0 = never */
    int64_t max_request_tokens; /* tokens one request may ask to generate, prompts x n x
                                 * max_tokens; 0 = 32768 or n_ctx if larger */
    size_t max_unsent;    /* streamed bytes a client may leave unread before its request is
                           * cancelled */
    double shutdown_grace; /* seconds nx_server_stop lets running requests finish */
    const char *host_allow; /* comma-separated Host names accepted besides the bound address and
                             * localhost ("*": any); checked when there is no API key */
    const char *cors;       /* comma-separated origins (scheme://host[:port], "*": any) that
                             * cross-origin requests may come from; NULL = none */
    int32_t n_ctx;       /* context (prompt + completion) tokens, per slot */
    int parallel;        /* sequence slots, each its own context, whose steps are batched together;
                          * 0 = as many as memory allows, at most 4 */
    int32_t draft;       /* default speculative draft length (NX_DRAFT_AUTO, 0..NX_MAX_DRAFT) */
    nx_verify verify;    /* default verification rule */
    bool split_reasoning; /* chat: <think>…</think> as reasoning_content (default) or left in the
                           * content */
    size_t cache_ram;     /* bytes of saved prompt prefixes (nx_prompt_cache); 0 = none */
    int32_t ctx_checkpoints;  /* hybrid models: recurrent-state checkpoints per slot, and the */
    int32_t checkpoint_every; /* prompt rows between them (nx_ctx_set_checkpoints) */
    const char *slot_save_path; /* an existing directory for POST /slots/0?action=save|restore
                                 * (nx_state_save / nx_state_load files); NULL = slot actions
                                 * answer 501 */
    uint64_t slot_save_quota;   /* bytes the directory's regular files may take after a save */
    const nx_web_file *web;     /* the chat page's files (GET /), n_web of them; NULL = none */
    size_t n_web;
} nx_server_opts;

void nx_server_opts_default(nx_server_opts *o);

typedef struct nx_server nx_server;

/* Creates the context and the worker, binds and starts listening. The model must outlive the
 * server. */
nx_status nx_server_start(nx_model *m, const nx_server_opts *o, nx_server **out, nx_error *err);
/* The port actually bound. */
int nx_server_port(const nx_server *s);
/* Stops accepting, cancels queued generations, lets the running one go on for the shutdown grace
 * period (then cancels it), ends every stream with an error event and [DONE], joins every thread
 * and frees the server. A worker still busy after the grace period (one long prompt evaluation)
 * is not waited for: the server is then left allocated, the model in use, and false returned;
 * the caller must exit without freeing the model. NULL-safe (true). */
bool nx_server_stop(nx_server *s);

#endif
