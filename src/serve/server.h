/* The OpenAI-compatible HTTP server: libmicrohttpd in thread-per-connection mode in front of one
 * generation worker that owns the model's single context and serves a fair FIFO queue. Streaming
 * responses are fed token by token; a client that goes away cancels its generation. */
#ifndef NX_SERVE_SERVER_H
#define NX_SERVE_SERVER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "nextn.h"

typedef struct nx_server_opts {
    const char *host;    /* address to bind; "127.0.0.1" by default */
    int port;            /* 0 = an ephemeral port (see nx_server_port) */
    const char *api_key; /* NULL = no authentication; else "Authorization: Bearer KEY" */
    const char *model_id; /* the name clients send as "model" */
    size_t max_body;     /* request bytes before 413 */
    double timeout;      /* seconds a request may take, queueing included; 0 = unlimited */
    int queue;           /* requests that may wait for the worker before 503 */
    int max_connections; /* open connections at once; 0 = queue + 64 */
    int32_t n_ctx;       /* context (prompt + completion) tokens */
    int32_t draft;       /* default speculative draft length (NX_DRAFT_AUTO, 0..NX_MAX_DRAFT) */
    nx_verify verify;    /* default verification rule */
    bool split_reasoning; /* chat: <think>…</think> as reasoning_content (default) or left in the
                           * content */
    size_t cache_ram;     /* bytes of saved prompt prefixes (nx_prompt_cache); 0 = none */
    const char *slot_save_path; /* an existing directory for POST /slots/0?action=save|restore
                                 * (nx_state_save / nx_state_load files); NULL = slot actions
                                 * answer 501 */
    uint64_t slot_save_quota;   /* bytes the directory's regular files may take after a save */
} nx_server_opts;

void nx_server_opts_default(nx_server_opts *o);

typedef struct nx_server nx_server;

/* Creates the context and the worker, binds and starts listening. The model must outlive the
 * server. */
nx_status nx_server_start(nx_model *m, const nx_server_opts *o, nx_server **out, nx_error *err);
/* The port actually bound. */
int nx_server_port(const nx_server *s);
/* Stops accepting, cancels queued and running generations, joins every thread and frees the
 * server. NULL-safe. */
void nx_server_stop(nx_server *s);

#endif
