/* The OpenAI wire format: parsing and validating /v1/chat/completions and /v1/completions
 * request bodies, and building the JSON responses, SSE stream chunks and error objects.
 * No HTTP and no model here, so every rule can be unit-tested and fuzzed on its own. */
#ifndef NX_SERVE_OPENAI_H
#define NX_SERVE_OPENAI_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "nextn.h"

#define NX_OAI_MAX_STOP 16          /* stop strings per request */
#define NX_OAI_MAX_STOP_LEN 1024    /* bytes per stop string */
#define NX_OAI_MAX_TOP_LOGPROBS 20  /* chat top_logprobs upper bound (OpenAI's) */
#define NX_OAI_MAX_N 16             /* choices per prompt ("n") */
#define NX_OAI_MAX_PROMPTS 64       /* completions: prompts in one list */

typedef enum nx_oai_kind {
    NX_OAI_CHAT = 0,   /* /v1/chat/completions */
    NX_OAI_COMPLETION, /* /v1/completions */
} nx_oai_kind;

/* ---------------------------------------------------------------- errors */

/* An OpenAI-style error: {"error": {"message", "type", "param", "code"}} with its HTTP status. */
typedef struct nx_oai_error {
    int http_status;
    const char *type; /* static string: "invalid_request_error", "authentication_error", ... */
    char param[128];   /* offending field ("" serializes as null) */
    char code[64];    /* machine-readable code ("" serializes as null) */
    char message[512];
} nx_oai_error;

/* Fills e (if non-NULL); param and code may be NULL. */
void nx_oai_error_set(nx_oai_error *e, int http_status, const char *type, const char *param,
                      const char *code, const char *fmt, ...)
    __attribute__((format(printf, 6, 7)));
/* The error's JSON body (malloc'd, caller frees), or NULL when out of memory. */
char *nx_oai_error_json(const nx_oai_error *e);

/* ---------------------------------------------------------------- requests */

/* One completions prompt: text, or token ids when the client sent them pre-tokenized. */
typedef struct nx_oai_prompt {
    char *text; /* NUL-terminated UTF-8, NULL when ids are given */
    size_t text_len;
    int32_t *ids;
    size_t n_ids;
} nx_oai_prompt;

/* What the parser needs to know about the served model. */
typedef struct nx_oai_limits {
    const char *model_id; /* the only accepted "model" value (absent "model" is accepted too) */
    int32_t vocab_size;   /* bound for token-id prompts; 0 = unchecked */
    bool args_as_text;    /* the chat template writes tool-call arguments as text (DeepSeek-V3.1's) */
} nx_oai_limits;

typedef struct nx_oai_request {
    nx_oai_kind kind;
    char *model; /* as sent, or NULL */

    /* chat */
    json_t *messages;        /* validated array; content-part lists are flattened to strings */
    json_t *tools;           /* array or NULL */
    bool tool_required;      /* tool_choice "required" or a named function: the answer is a call */
    char *tool_name;         /* tool_choice {"type": "function", "function": {"name"}}, or NULL */
    json_t *template_kwargs; /* chat_template_kwargs object or NULL */
    bool add_generation_prompt;

    /* completions */
    nx_oai_prompt *prompts;
    size_t n_prompts;

    int32_t max_tokens; /* 0 = unset: chat runs to EOS or a full context, completions 16 */
    int32_t n;          /* choices per prompt, 1..NX_OAI_MAX_N */
    nx_sampler_params sampling; /* sampling.logit_bias points into logit_bias */
    nx_logit_bias *logit_bias;  /* logit_bias {"token id": bias}, n_logit_bias entries */
    size_t n_logit_bias;
    bool has_seed;
    char **stop; /* n_stop NUL-terminated, non-empty strings */
    size_t n_stop;
    bool stream;
    bool include_usage; /* stream_options.include_usage */
    bool logprobs;
    int32_t top_logprobs; /* alternatives per token, 0..NX_OAI_MAX_TOP_LOGPROBS */
    int32_t draft;        /* NX_DRAFT_AUTO, 0..NX_MAX_DRAFT; valid when has_draft */
    bool has_draft;
    nx_verify verify; /* valid when has_verify */
    bool has_verify;
    bool ignore_eos;
    bool echo;        /* completions: the prompt comes back before the completion */
    bool json_object; /* response_format json_object (or json_schema): the answer is one JSON object */
    nx_json_schema *json_schema; /* response_format json_schema: the object matches it (owned) */
    int32_t min_tokens;       /* vLLM's: end and stop tokens are masked before this many tokens */
    int32_t *stop_token_ids;  /* vLLM's: tokens that end the answer (not included in it) */
    size_t n_stop_token_ids;
} nx_oai_request;

#define NX_OAI_MAX_STOP_IDS 64

/* Parses and validates a request body. On success fills *out (free with nx_oai_request_free)
 * and returns NX_OK; otherwise returns NX_E_ARG with e describing the 400 response (type,
 * param and a message naming the field and its allowed range). *out is always safe to free. */
nx_status nx_oai_request_parse(nx_oai_kind kind, const char *body, size_t len,
                               const nx_oai_limits *lim, nx_oai_request *out, nx_oai_error *e);
void nx_oai_request_free(nx_oai_request *r);

/* ---------------------------------------------------------------- responses */

/* One sampled token with its log-probability and the most likely alternatives, all under the
 * processed distribution the token was drawn from. */
typedef struct nx_oai_logprob {
    bool none; /* no log-probability (an echoed prompt's first token): null */
    int32_t id;
    float logprob;
    int32_t n_top;
    int32_t top_id[NX_OAI_MAX_TOP_LOGPROBS];
    float top_logprob[NX_OAI_MAX_TOP_LOGPROBS];
} nx_oai_logprob;

/* Writes the token's bytes (at most cap) to buf and returns how many bytes the token has (may
 * exceed cap; the caller then retries with more room). Bytes may be a partial UTF-8 char. */
typedef size_t (*nx_oai_token_text_fn)(void *user, int32_t id, char *buf, size_t cap);

typedef struct nx_oai_meta {
    nx_oai_kind kind;
    const char *id; /* "chatcmpl-..." / "cmpl-..." */
    int64_t created;
    const char *model;
    bool logprobs;
    nx_oai_token_text_fn token_text;
    void *token_user;
} nx_oai_meta;

typedef struct nx_oai_choice {
    int32_t index;
    const char *text; /* UTF-8 (invalid sequences become U+FFFD in the output) */
    size_t text_len;
    size_t text_offset;        /* completions logprobs: where text starts in the whole output */
    const char *finish_reason; /* "stop", "length", "tool_calls", or NULL (null) */
    const char *reasoning;     /* chat: the reasoning_content (UTF-8), or NULL */
    size_t reasoning_len;
    const json_t *tool_calls;  /* chat: [{id, type, function: {name, arguments}}], or NULL */
    const nx_oai_logprob *lp;  /* the tokens behind text, when meta->logprobs */
    size_t n_lp;
    /* streaming: the tokens generated since the last chunk, each an accepted draft or not and
     * the drafts of the verify it came from (0: a plain step); sent as the choice's "nextn" */
    const bool *drafted;
    const int32_t *draft_k;
    size_t n_tokens;
} nx_oai_choice;

typedef struct nx_oai_usage {
    int64_t prompt_tokens, completion_tokens;
    int64_t cached_tokens;             /* prompt tokens whose cache rows were kept (prefix reuse) */
    int64_t drafts, drafted, accepted; /* this request's speculative counters */
    int32_t draft;                     /* draft setting (NX_DRAFT_AUTO, 0 = plain decoding) */
    const char *verify;                /* "residual" | "match" */
    int64_t drafted_at[NX_MAX_DRAFT], accepted_at[NX_MAX_DRAFT]; /* per chain position */
    double t_prefill, t_decode;        /* seconds, summed over the choices */
    int64_t prefilled, decoded;        /* tokens those times computed (decode: all but each first) */
} nx_oai_usage;

/* Non-streaming response body (malloc'd JSON), or NULL when out of memory. */
char *nx_oai_response_json(const nx_oai_meta *m, const nx_oai_choice *c, size_t n,
                           const nx_oai_usage *u);
/* One SSE event "data: {chunk}\n\n" (malloc'd). role_chunk makes the chat delta carry the
 * assistant role (the stream's first chunk); include_usage adds "usage": null as OpenAI does
 * on every chunk of a stream that will end with a usage chunk. */
char *nx_oai_stream_chunk(const nx_oai_meta *m, const nx_oai_choice *c, bool role_chunk,
                          bool include_usage);
/* The final usage-only event (empty choices) of a stream with include_usage. */
char *nx_oai_stream_usage(const nx_oai_meta *m, const nx_oai_usage *u);
/* An error inside a stream that has already sent its headers. */
char *nx_oai_stream_error(const nx_oai_error *e);
#define NX_OAI_STREAM_DONE "data: [DONE]\n\n"

/* GET /v1/models. */
char *nx_oai_models_json(const char *model_id, int64_t created, const char *owned_by);

/* Copies s to a malloc'd NUL-terminated string with invalid UTF-8 replaced by U+FFFD. */
char *nx_oai_utf8_sanitize(const char *s, size_t len, size_t *out_len);

#endif
