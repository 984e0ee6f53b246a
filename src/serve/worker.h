/* Inside the server: the jobs that connection threads (http.c) hand to the generation worker
 * (worker.c), and the server's state both sides share. Not part of the library's interface. */
#ifndef NX_SERVE_WORKER_H
#define NX_SERVE_WORKER_H

#include <microhttpd.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "base/strbuf.h"
#include "constrain/tool_grammar.h"
#include "serve/chat_format.h"
#include "serve/metrics.h"
#include "serve/openai.h"
#include "serve/server.h"
#include "serve/slots.h"
#include "text/chat.h"

#define NX_STREAM_CALLS 32 /* tool calls streamed argument by argument; more arrive whole */

enum { JOB_QUEUED, JOB_RUNNING, JOB_DONE };
enum { CANCEL_NONE = 0, CANCEL_CLIENT, CANCEL_TIMEOUT, CANCEL_SHUTDOWN, CANCEL_SLOW };

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
    int32_t checkpoint_at; /* chat on a hybrid model: where the generation prompt begins (0: -) */
    int32_t draft;
    nx_verify verify;
    char id[48];
    int64_t created;
    int fd; /* the client's socket, polled for hang-ups while the client waits */
    double t_arrival, deadline, t_picked, t_first; /* monotonic seconds */

    nx_strbuf sse; /* streaming: events the client has not read yet */
    double sse_sent; /* streaming: when the client was last given bytes (0: not yet) */
    choice_out *out;
    nx_oai_logprob *echo_lp; /* worker only: the echoed prompt's entries, for its other choices */
    size_t n_echo_lp;
    nx_oai_usage usage;
    bool failed;
    nx_oai_error err;

    nx_ctx *ctx; /* the context of the slot running it (set when a worker picks it) */

    /* a slot action instead of a generation (req, ids and out then stay empty) */
    bool is_slot;
    nx_slot_request slot;
    char *slot_path; /* --slot-save-path/filename (save, restore) */
    nx_slot_result slot_res;
} job;

/* A sequence slot: one context and the worker thread that generates on it. */
typedef struct srv_slot {
    struct nx_server *srv;
    int id;
    nx_ctx *ctx;
    pthread_t thread;
    bool started;
    job *running;      /* its current job (under qmu), so shutdown can cancel it */
    int32_t n_cached;  /* rows its context held after its last job (under qmu) */
    int64_t n_jobs, n_tokens; /* generations and tokens it has produced (under qmu) */
    int64_t last_used;        /* s->slot_uses when it last took a job (under qmu) */
} srv_slot;

#define NX_MAX_SLOTS 64

struct nx_server {
    nx_model *model;
    const nx_model_info *info;
    const nx_tokenizer *tok;
    srv_slot *slots; /* --parallel of them */
    int n_slots;
    nx_batch *batch; /* their forwards run together (NULL with one slot) */
    pthread_mutex_t pc_mu;          /* the prompt cache, shared by the slots' workers */
    nx_prompt_cache *pcache;        /* saved prompt prefixes, used by the workers only */
    nx_json_vocab *json_vocab;      /* token bytes for response_format json_object */
    nx_prompt_cache_stats pc_stats; /* its counters as of the last request, under qmu */
    nx_server_opts o;
    char *host, *api_key, *model_id;
    char *slot_dir;      /* --slot-save-path without trailing '/', or NULL: slot actions off */
    char *bos, *eos;     /* the template's bos_token / eos_token strings */
    nx_jinja *tmpl;      /* the chat template, parsed once and rendered concurrently */
    char tmpl_error[400]; /* why there is no template, for chat requests */
    bool has_mtp;
    nx_chat_tokens chat; /* the family's reasoning and tool-call markers, as this tokenizer spells them */
    int port;
    int64_t t_created;
    double t_started;
    struct MHD_Daemon *mhd;
    nx_metrics metrics;

    pthread_mutex_t prep_mu; /* template rendering and tokenization, off the worker */
    pthread_mutex_t qmu;
    pthread_cond_t qcv;
    job *head, *tail;
    int n_queued, n_active;
    int64_t slot_uses; /* jobs the slots have taken (under qmu) */
    bool stopping;
    int n_workers, n_workers_done; /* started, and left their loop when stopping (under qmu) */

    /* connections (http.c): every open one, watched for its deadlines by the watchdog */
    pthread_mutex_t cmu;
    pthread_cond_t ccv;
    struct peer *peers;
    int n_open;      /* open connections */
    int max_conn;    /* the ordinary limit; libmicrohttpd admits a few more for GET /health */
    int n_inflight;  /* requests with a job whose response has not ended (shutdown waits) */
    pthread_t watchdog;
    bool watchdog_started, watchdog_stop;
    int64_t max_request_tokens;
    char **hosts, **origins; /* --host-allow and --cors entries (NULL-terminated), "*": any */
    uint64_t rng;

    /* byte-level BPE: code point -> byte, for the raw bytes of logprob tokens */
    int16_t byte_of_cp[324];
};

/* splitmix64 under qmu: ids and default seeds, nothing cryptographic */
uint64_t nx_server_random(nx_server *s);
/* The byte-level BPE map (byte_of_cp), for the raw bytes of logprob tokens. */
void nx_server_byte_map_init(nx_server *s);
/* A slot's worker thread (arg: its srv_slot): runs queued jobs in arrival order — a generation
 * unless another idle slot holds more of its prompt, a slot action of its own slot — until the
 * server stops. */
void *nx_worker_main(void *arg);

job *nx_job_new(nx_server *s, int fd);
/* Drops a reference; the last one frees the job. NULL-safe. */
void nx_job_unref(job *j);
/* Queues j unless the server stops or the queue is full; the queue then holds one reference. */
bool nx_job_enqueue(nx_server *s, job *j);
/* Cancels j (why: CANCEL_*): a queued job leaves the queue at once, a running one stops at its
 * next token. */
void nx_job_cancel(nx_server *s, job *j, int why);
/* Waits on j->cv for up to 100 ms (j->mu held). */
void nx_job_wait_tick(job *j);
/* Between waits: a client hang-up or an expired deadline cancels the job. */
void nx_job_watch(nx_server *s, job *j);
char *nx_job_response_body(job *j);
/* The most tokens choice i of j may generate: its max_tokens (or the default) within the room
 * its prompt leaves in the context. */
int32_t nx_job_max_tokens(const nx_server *s, const job *j, size_t i);

#endif
