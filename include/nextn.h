/* nextn — a C inference engine for mixture-of-experts language models with their native
 * MTP ("NextN") head as a built-in, lossless self-speculative decoder.
 *
 * Public API. Handles are opaque; every *_new / *_load has a NULL-safe *_free. Fallible
 * functions return an nx_status and describe the failure in an optional nx_error. */
#ifndef NEXTN_H
#define NEXTN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------- status and errors */

typedef enum nx_status {
    NX_OK = 0,
    NX_E_IO,          /* a file could not be opened, mapped or read */
    NX_E_FORMAT,      /* a file's contents are malformed, truncated or inconsistent */
    NX_E_CONFIG,      /* config.json is missing a field or holds an impossible value */
    NX_E_NOMEM,       /* an allocation failed */
    NX_E_ARG,         /* a caller passed an out-of-range or inconsistent parameter */
    NX_E_UNSUPPORTED, /* valid input that this build cannot run (dtype, architecture) */
    NX_E_STATE,       /* the call is not valid in the object's current state */
    NX_E_RANK,        /* another rank of a split model failed or stopped answering */
} nx_status;

typedef struct nx_error {
    nx_status status;
    char msg[512]; /* names the file / field / tensor at fault */
} nx_error;

const char *nx_status_str(nx_status st);

/* ---------------------------------------------------------------- tokenizer */

/* A Hugging Face tokenizer.json byte-level BPE tokenizer (Hy3, Qwen3, DeepSeek-V3 style). */
typedef struct nx_tokenizer nx_tokenizer;

/* Loads `path`, a tokenizer.json file. */
nx_status nx_tokenizer_load(const char *path, nx_tokenizer **out, nx_error *err);
void nx_tokenizer_free(nx_tokenizer *tok);

/* Encodes len bytes of UTF-8 text. When parse_special is true, added/special token strings in
 * the text become their ids (as HF `encode` does); otherwise they are encoded as plain text.
 * *ids is malloc'd and owned by the caller. Invalid UTF-8 is an NX_E_ARG error. */
nx_status nx_tokenizer_encode(const nx_tokenizer *tok, const char *text, size_t len,
                              bool parse_special, int32_t **ids, size_t *n_ids, nx_error *err);

/* Decodes ids to UTF-8 (malloc'd, NUL-terminated, owned by the caller). skip_special drops
 * special tokens. Out-of-range ids are an NX_E_ARG error. */
nx_status nx_tokenizer_decode(const nx_tokenizer *tok, const int32_t *ids, size_t n_ids,
                              bool skip_special, char **text, nx_error *err);

int32_t nx_tokenizer_vocab_size(const nx_tokenizer *tok);
/* Id of a token string (added tokens included) or -1. */
int32_t nx_tokenizer_token_id(const nx_tokenizer *tok, const char *token);
/* The token's vocabulary string (byte-level form, e.g. "Ġthe"), or NULL if out of range. */
const char *nx_tokenizer_token_str(const nx_tokenizer *tok, int32_t id);
bool nx_tokenizer_is_special(const nx_tokenizer *tok, int32_t id);
/* The raw bytes one token adds to text after the first token (possibly part of a UTF-8
 * character; malloc'd, owned by the caller; empty for a token that is not text). */
nx_status nx_tokenizer_token_bytes(const nx_tokenizer *tok, int32_t id, uint8_t **bytes, size_t *len, nx_error *err);

/* Streaming detokenizer: feed ids one at a time, receive text that is always whole UTF-8
 * (bytes of an incomplete character are held back until the character completes). */
typedef struct nx_detok nx_detok;
nx_status nx_detok_new(const nx_tokenizer *tok, bool skip_special, nx_detok **out, nx_error *err);
void nx_detok_free(nx_detok *d);
/* Appends the text that became complete to *out (malloc'd, owned by the caller; may be "").
 * *out_len excludes the NUL. */
nx_status nx_detok_push(nx_detok *d, int32_t id, char **out, size_t *out_len, nx_error *err);
/* Flushes held-back bytes at the end of a stream (invalid remainders become U+FFFD). */
nx_status nx_detok_flush(nx_detok *d, char **out, size_t *out_len, nx_error *err);

/* ---------------------------------------------------------------- sampling */

/* A bias added to one token's logit (OpenAI's logit_bias). */
typedef struct nx_logit_bias {
    int32_t id;
    float bias; /* [-100, 100]: -100 all but bans the token, 100 all but forces it */
} nx_logit_bias;

/* JSON mode (OpenAI's response_format {"type": "json_object"}): each token's bytes, so that the
 * sampler can keep only the tokens that continue the output into one valid JSON object, and the
 * ids that end a generation, allowed only once the object is closed (src/constrain/json_grammar.h
 * has the exact language). */
typedef struct nx_json_vocab nx_json_vocab;
/* A JSON Schema for JSON mode (OpenAI's response_format json_schema), compiled: the subset of
 * OpenAI's structured outputs. type (one or a list) object / array / string / number / integer /
 * boolean / null; properties (generated in their listed order; optional ones may be left out),
 * required, additionalProperties false (or absent: no other keys either); items, minItems,
 * maxItems (up to 255); minLength, maxLength of strings (code points, up to 65535); minimum,
 * maximum, exclusiveMinimum, exclusiveMaximum of integers (within ±10^15); pattern of strings
 * (an ECMA-262 subset, src/constrain/pattern.h) and format (date, time, date-time, uuid, ipv4,
 * email); enum and const of strings, booleans and null; $ref to #/$defs/NAME, #/definitions/NAME or #; anyOf / oneOf
 * whose branches start with different kinds of value; allOf of one schema; description, title,
 * default, examples, $schema, $id, strict, $comment are ignored. Any other keyword
 * (patternProperties, uniqueItems, ...) is an error naming it and where it is, not silently dropped. The root
 * must be an object schema. */
typedef struct nx_json_schema nx_json_schema;
nx_status nx_json_schema_new(const char *json, size_t len, nx_json_schema **out, nx_error *err);
void nx_json_schema_free(nx_json_schema *s);
/* From a tokenizer (special tokens are never text); end_ids: the model's end-of-sequence ids. */
nx_status nx_json_vocab_new(const nx_tokenizer *tok, const int32_t *end_ids, size_t n_end, nx_json_vocab **out,
                            nx_error *err);
/* From explicit byte strings: token i is tokens[i] (lens[i] bytes), NULL for a token that is not text. */
nx_status nx_json_vocab_from_bytes(const char *const *tokens, const size_t *lens, int32_t n, const int32_t *end_ids,
                                   size_t n_end, nx_json_vocab **out, nx_error *err);
void nx_json_vocab_free(nx_json_vocab *v);

/* Tool-call arguments under tool_choice "required" or a named function (Hy3's call syntax, each
 * value matching its property's schema; src/constrain/tool_grammar.h has the exact language). */
typedef struct nx_tool_grammar nx_tool_grammar;

/* A logits processor: a constraint on the output that masks, at each row, the tokens that may
 * not come next. The sampler runs its processors as an ordered list on every distribution it
 * makes, drafts' and verification rows' alike, after the penalties and before the temperature;
 * it advances them by each token the generation keeps and rewinds them with its history, so a
 * processor's state is always that after the tokens advanced so far. For a row that follows
 * n_extra drafts, the sampler advances the list by the drafts, masks, and rewinds it: a
 * processor must return exactly to the state it had (what makes verification exact).
 * JSON mode and tool-call mode (the fields of nx_sampler_params) are processors too
 * (src/constrain/). A processor serves one sampler at a time; nx_sampler_new rewinds it to 0. */
typedef struct nx_logits_proc_ops {
    /* Sets the logits of the tokens not allowed next to -INFINITY (n_vocab of them); returns
     * false when it masks nothing at this state (a constraint not yet in force). */
    bool (*mask)(void *self, float *logits, int32_t n_vocab);
    /* One more token of output. */
    void (*advance)(void *self, int32_t id);
    /* Back to the state after the first n tokens advanced (n <= the tokens advanced). */
    void (*rewind)(void *self, size_t n);
    /* Releases self (may be NULL when the caller frees it otherwise). */
    void (*free)(void *self);
} nx_logits_proc_ops;
typedef struct nx_logits_proc {
    const nx_logits_proc_ops *ops;
    void *self;
} nx_logits_proc;

/* Sampler settings. Each feature is off at its neutral value. */
typedef struct nx_sampler_params {
    float temperature;        /* 0 = greedy (argmax, lowest id on ties); > 0 scales logits */
    int32_t top_k;            /* 0 = off */
    float top_p;              /* 1 = off; (0, 1] */
    float min_p;              /* 0 = off; [0, 1] relative to the most likely token */
    float repetition_penalty; /* 1 = off; > 0; over prompt + generated tokens (HF/vLLM rule) */
    float presence_penalty;   /* 0 = off; [-2, 2]; over generated tokens (OpenAI rule) */
    float frequency_penalty;  /* 0 = off; [-2, 2]; over generated tokens (OpenAI rule) */
    const nx_logit_bias *logit_bias; /* n_logit_bias entries added to the raw logits before
                                      * anything else; ids < vocab (an id listed twice gets both);
                                      * nx_sampler_new copies them */
    size_t n_logit_bias;
    uint64_t seed;
    /* JSON mode: non-NULL masks every token that cannot continue the generated text into one
     * JSON object (and the end ids until it is closed), before any other stage; the vocabulary
     * must outlive the sampler. With json_wait the mask starts after token json_after is
     * generated (a reasoning section's end). */
    const nx_json_vocab *json;
    const nx_json_schema *json_schema; /* with json: the object must match it (must outlive the sampler) */
    bool json_wait;
    int32_t json_after;
    /* Non-NULL: masks every token that cannot continue the output (an answer the prompt opened
     * as a tool call) into calls the grammar accepts, then the end ids; must outlive the sampler.
     * Takes the place of json. */
    const nx_tool_grammar *tools;
    /* The n_ban ids get no probability while fewer than ban_until tokens are generated (how
     * nx_generate keeps the end tokens out before min_tokens); nx_sampler_new copies them. */
    const int32_t *ban;
    size_t n_ban;
    int32_t ban_until;
    /* More processors, run in this order after JSON or tool-call mode's; the caller keeps them
     * alive while the sampler lives and frees them (nx_sampler_new copies the array). */
    const nx_logits_proc *procs;
    size_t n_procs;
} nx_sampler_params;

void nx_sampler_params_default(nx_sampler_params *p); /* greedy, everything off, seed 0 */
/* Range checks; the message names the offending parameter and its allowed range. */
nx_status nx_sampler_params_check(const nx_sampler_params *p, nx_error *err);

/* A sampler owns the token history (for penalties) and a seeded RNG. It turns logits into the
 * *processed* distribution actually sampled from — the p and q of speculative verification. */
typedef struct nx_sampler nx_sampler;

nx_status nx_sampler_new(const nx_sampler_params *p, int32_t vocab_size, nx_sampler **out,
                         nx_error *err);
void nx_sampler_free(nx_sampler *s);

/* History: the prompt (repetition penalty only) and generated tokens (all penalties). */
void nx_sampler_set_prompt(nx_sampler *s, const int32_t *ids, size_t n);
void nx_sampler_accept(nx_sampler *s, int32_t id);
size_t nx_sampler_n_generated(const nx_sampler *s);
/* Forgets generated tokens beyond the first n (rollback). */
void nx_sampler_rewind(nx_sampler *s, size_t n);

/* Writes the processed distribution (vocab_size floats summing to 1) for `logits`, as if the
 * generated history were followed by the n_extra tokens `extra` (the drafts before this row
 * of a speculative verify). Neither logits nor the history is modified. */
void nx_sampler_probs(nx_sampler *s, const float *logits, const int32_t *extra, size_t n_extra,
                      float *probs);
/* Draws a token from a distribution with the sampler's RNG. */
int32_t nx_sampler_draw(nx_sampler *s, const float *probs);
/* Draws a token from a distribution with noise the seed assigns to `index` (the output position)
 * and each token: the same (seed, index, distribution) always gives the same token, however many
 * draws came before, and two similar distributions drawn at the same index mostly give the same
 * token (an exponential race, i.e. the Gumbel-max trick). Independent of nx_sampler_draw's
 * stream. An all-zero row gives 0. */
int32_t nx_sampler_draw_at(nx_sampler *s, const float *probs, uint64_t index);
/* A uniform draw in [0, 1) from the sampler's RNG. */
double nx_sampler_uniform(nx_sampler *s);
bool nx_sampler_is_greedy(const nx_sampler *s);

/* ---------------------------------------------------------------- models */

typedef struct nx_model nx_model;

/* How the MTP head is wired (docs/design.md §3.7). NX_WIRING_DEFAULT fields take the family default. */
typedef enum nx_mtp_hidden {
    NX_MTP_HIDDEN_DEFAULT = 0,
    NX_MTP_HIDDEN_POST_NORM, /* trunk hidden after the final norm (hy_v3 default) */
    NX_MTP_HIDDEN_PRE_NORM,  /* trunk hidden before the final norm */
} nx_mtp_hidden;

typedef enum nx_mtp_concat {
    NX_MTP_CONCAT_DEFAULT = 0,
    NX_MTP_CONCAT_EMBED_FIRST,  /* [enorm(e) ; hnorm(h)] (hy_v3, DeepSeek, GLM) */
    NX_MTP_CONCAT_HIDDEN_FIRST, /* [hnorm(h) ; enorm(e)] (Motif-3) */
} nx_mtp_concat;

typedef enum nx_mtp_recycle {
    NX_MTP_RECYCLE_DEFAULT = 0,
    NX_MTP_RECYCLE_NORMED, /* chained drafts feed back the output after final_layernorm */
    NX_MTP_RECYCLE_RAW,    /* ... or the raw block output */
} nx_mtp_recycle;

typedef struct nx_mtp_wiring {
    nx_mtp_hidden hidden;
    nx_mtp_concat concat;
    nx_mtp_recycle recycle;
    int hnorm;              /* 0 default (on), 1 on, -1 off */
    int32_t sliding_window; /* 0 = full attention (default) */
    double rope_theta;      /* 0 = the trunk's theta */
} nx_mtp_wiring;

/* How contexts of a model store their KV caches. */
typedef enum nx_kv_type {
    NX_KV_F32 = 0, /* exact (default) */
    NX_KV_F16,     /* half the memory and the attention reads (keys after RoPE, values), each
                      element rounded to f16 as it is written, as llama.cpp's default cache */
} nx_kv_type;

/* Reading the resident weights into memory at load, instead of one page fault at a time while the
 * first forwards touch them: AUTO when they fit in the memory the system has available, NEVER
 * (headers only: describing a checkpoint), LOCK always and locked in memory (mlock). */
typedef enum nx_prefault { NX_PREFAULT_AUTO = 0, NX_PREFAULT_NEVER, NX_PREFAULT_LOCK } nx_prefault;

/* ---------------------------------------------------------------- several processes */

/* One model run by several processes (MPI ranks started by mpirun; docs/multinode.md). Rank 0
 * loads, tokenizes, samples and serves as a single process does; every context operation it makes
 * is sent to the other ranks, which hold their share of the model and follow (nx_model_follow).
 * The output is the same bits as one process's, whatever the split and the number of ranks. */
typedef struct nx_dist nx_dist;
typedef enum nx_split {
    NX_SPLIT_NONE = 0,
    NX_SPLIT_PIPELINE, /* contiguous layer ranges per rank, balanced by bytes; the rows' hidden
                          states go rank to rank; final norm, lm_head and MTP head on the last */
    NX_SPLIT_EXPERTS,  /* every rank runs attention and dense parts; the routed experts of every
                          MoE layer are divided among the ranks, their outputs exchanged */
} nx_split;

/* Joins the MPI job (MPI_Init when not done yet). A rank waits at most timeout_s (<= 0: 300) for
 * another; past that, or when MPI reports a failure, the run ends with an error naming the rank.
 * NX_E_UNSUPPORTED in a build without MPI. */
nx_status nx_dist_init(int *argc, char ***argv, double timeout_s, nx_dist **out, nx_error *err);
int nx_dist_rank(const nx_dist *d);
int nx_dist_size(const nx_dist *d);
/* Leaves the job (MPI_Finalize); after nx_model_free of the model loaded with it (rank 0: if the
 * model is still loaded, the other ranks are told to stop first). After a failure of the network,
 * or with abort set, the whole job is aborted instead (MPI_Abort), so no rank is left waiting. */
void nx_dist_finish(nx_dist *d, bool abort);

typedef struct nx_load_params {
    int n_threads;        /* 0 = all cores */
    nx_mtp_wiring wiring; /* zero = family defaults */
    bool no_mtp;          /* load the trunk only */
    int32_t draft_vocab;  /* > 0: the head drafts over token ids [0, draft_vocab) only (a smaller
                             lm_head read per draft; exact either way, the trunk verifies) */
    nx_kv_type kv_type;   /* element type of the KV caches of this model's contexts */
    int act_bits;         /* 8 (0 = 8) or 16: the precision the integer kernels round activations
                             to before multiplying quantized weights (int8 where the shape allows,
                             else int16; routers always int16). Either way the result of a row
                             does not depend on batching or threads. */
    void (*progress)(void *user, double fraction); /* optional loading progress */
    void *progress_user;
    /* Residency (docs/design.md, "Bigger than memory"). max_memory > 0 caps the bytes the weights
     * keep in memory: everything but the routed experts stays resident, and the routed experts
     * beyond what fits stream from disk into an expert cache of the remaining bytes (an NX_E_ARG
     * error when the resident part alone does not fit). 0: no cap, everything mapped. */
    uint64_t max_memory;
    /* Router statistics (nx_model_router_stats_save) from earlier runs, or NULL: with a cap, the
     * plan's expected hit rate and disk reads follow the measured routing (a missing file: no
     * statistics yet). */
    const char *router_stats;
    nx_prefault prefault; /* when the resident weights are read in at load (NX_PREFAULT_AUTO) */
    nx_dist *dist;        /* with split: this rank's part of a model run by several processes */
    nx_split split;
} nx_load_params;

void nx_load_params_default(nx_load_params *p);

/* Loads a checkpoint directory (config.json + *.safetensors [+ tokenizer.json]). */
nx_status nx_model_load(const char *dir, const nx_load_params *p, nx_model **out, nx_error *err);
void nx_model_free(nx_model *m);
/* The ranks other than 0 of a split model: runs the context operations rank 0 sends until it
 * frees the model (NX_OK) or a rank fails (the error). */
nx_status nx_model_follow(nx_model *m, nx_error *err);
/* Network traffic of a split model, summed over every rank so far: bytes and messages sent,
 * seconds ranks waited on the network. Rank 0; NX_OK and zeros for a single process. */
nx_status nx_model_net(nx_model *m, double *bytes, int64_t *messages, double *seconds, nx_error *err);
/* Whether the job of a model split across ranks has failed (a rank died or stopped answering):
 * from then on every forward fails at once with NX_E_RANK, so a server should stop. err gets the
 * failure's message. False for one process. Any thread may call it. */
bool nx_model_failed(const nx_model *m, nx_error *err);
/* Whether the checkpoint files the weights are mapped from are still the ones loaded (same size
 * and modification time of the loaded inode). A file overwritten or truncated in place is NX_E_IO
 * "model file X changed on disk since load; ... replace checkpoints by rename": its mapping no
 * longer holds the loaded weights, and reading past a truncation raises SIGBUS. nx_generate calls
 * it before every generation. */
nx_status nx_model_check_files(const nx_model *m, nx_error *err);

typedef struct nx_model_info {
    const char *family;       /* model_type: "hy_v3", "glm4_moe" */
    const char *family_name;  /* "Hunyuan 3", "GLM-4.5/4.6/4.7/Air" */
    const char *layout;       /* "tencent" | "mlx" */
    const char *weight_dtype; /* "bf16", "f32", "mixed", "affine-4bit", ... */
    const char *mtp;          /* "inline", "sidecar", "none (headless)", "disabled" */
    int32_t vocab_size, hidden_size, n_layers, n_heads, n_kv_heads, head_dim;
    int32_t n_experts, top_k, mtp_n_experts;
    int64_t max_positions;
    uint64_t n_params, n_params_active, n_params_mtp; /* active = per token, trunk */
    uint64_t weight_bytes;       /* mapped tensor bytes */
    uint64_t step_bytes_dense;   /* bytes every trunk step reads besides experts (attention, dense
                                    FFN, routers, lm_head) */
    uint64_t mtp_bytes_dense;    /* the same for one MTP forward (eh_proj, attention, router,
                                    the drafted part of lm_head) */
    uint64_t kv_bytes_per_token; /* trunk + MTP layers, at the model's kv_type */
    const char *kv_type;         /* "f32" | "f16" */
    int32_t bos_id, eos_id;      /* -1 if unknown */
    /* the variants the engine inferred from the family and its config */
    int32_t rotary_dim;          /* leading dims of each head RoPE rotates */
    const char *rope;            /* "neox" | "interleaved" */
    const char *rope_scaling;    /* "none" | "yarn" */
    const char *attention;       /* "gqa" | "mla" | "hybrid" (Gated DeltaNet + gated GQA layers) */
    int32_t n_linear_layers;     /* Gated DeltaNet layers (the rest are attention layers) */
    uint64_t linear_state_bytes; /* their recurrent and convolution states, per sequence (f32) */
    /* latent attention's shapes (0 for gqa; q_lora_rank 0: a plain q_proj) and what its cache
     * would take had it held full keys and values, at the same kv_type */
    int32_t q_lora_rank, kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim;
    uint64_t kv_bytes_per_token_expanded;
    bool attn_bias, qk_norm;     /* q/k/v biases; q/k RMSNorm */
    const char *router;          /* "sigmoid+bias" | "softmax" */
    int32_t n_group, topk_group; /* group-limited choice (1, 1: none) */
    bool norm_topk_prob;
    float routed_scaling;
    int32_t n_shared_experts, n_dense_layers;
    const char *mtp_concat;      /* "embed,hidden" | "hidden,embed" */
    const char *mtp_recycle;     /* hidden fed back when chaining: "post-norm" | "pre-norm" */
    bool mtp_zero_pos0;          /* embedding zeroed at position 0 */
    const char *mtp_embed, *mtp_head; /* "own" | "trunk" */
    /* the residency plan (nx_load_params.max_memory): bytes that stay resident (all weights but
     * the routed experts), the routed experts' bytes and count (trunk and MTP layers), the expert
     * cache's slots and bytes (0: nothing streams), and what a token is expected to read from
     * disk (the trunk's top-k experts of every MoE layer that miss a cache of that many slots,
     * taking routing as uniform: the hit rate is then the share of experts the cache holds) */
    uint64_t resident_bytes, routed_expert_bytes;
    int64_t n_routed_experts;
    int64_t cache_slots;
    uint64_t cache_bytes;
    double expected_hit_rate, expected_disk_bytes_per_token;
    /* the expectations above come from router statistics (nx_load_params.router_stats): each
     * layer's most often routed experts in its share of the slots, tokens taken as independent */
    bool plan_from_stats;
    bool prefaulted; /* the resident weights were read in at load */
    /* files read in a second time at load, to be cached in 2 MB pages (they were cached in 4 KB
     * ones: downloaded or copied just before, say) */
    int recached_files;
} nx_model_info;

const nx_model_info *nx_model_get_info(const nx_model *m);
/* The share of the model's resident weights this process maps with 2 MB page-table entries, now
 * (-1 where the system does not say): decoding streams every weight each token, and on 4 KB pages
 * pays a page walk per 4 KB (docs/kernels.md, "Model files and huge pages"). */
double nx_model_huge_share(const nx_model *m);

/* Writes how often each routed expert was chosen to path (JSON; docs/design.md §14): the counts
 * of nx_load_params.router_stats's file plus every forward's choices since loading, so a file
 * given to both accumulates over runs. */
nx_status nx_model_router_stats_save(const nx_model *m, const char *path, nx_error *err);
/* The tokenizer shipped with the checkpoint, or NULL when it ships none. */
const nx_tokenizer *nx_model_tokenizer(const nx_model *m);
/* The chat template from tokenizer_config.json, or NULL. */
const char *nx_model_chat_template(const nx_model *m);
/* tokenizer_config.json's bos_token and eos_token strings (the template's), and its
 * token_suffix (Hy3's output markers), each NULL when absent; they point into the model. */
void nx_model_template_strings(const nx_model *m, const char **bos, const char **eos, const char **token_suffix);
bool nx_model_is_eos(const nx_model *m, int32_t id);
/* The model's end-of-sequence ids (config.json's eos_token_id list): *ids points into the model. */
size_t nx_model_eos_ids(const nx_model *m, const int32_t **ids);
/* JSON mode's table for a model: its tokenizer's token bytes, ended by its end-of-sequence ids
 * (an error naming the problem when the model ships no tokenizer). */
nx_status nx_json_vocab_for_model(const nx_model *m, nx_json_vocab **out, nx_error *err);

/* ---------------------------------------------------------------- contexts and generation */

/* A context holds one sequence's KV caches (trunk + MTP), sized once, and the run state. */
typedef struct nx_ctx nx_ctx;

nx_status nx_ctx_new(nx_model *m, int32_t n_ctx, nx_ctx **out, nx_error *err);
void nx_ctx_free(nx_ctx *c);
int32_t nx_ctx_n_ctx(const nx_ctx *c);
/* Positions the context's caches hold (the rows nx_generate may keep). */
int32_t nx_ctx_n_past(const nx_ctx *c);
/* Rows one forward call of the context takes at most (a prompt is prefilled in such chunks). */
int32_t nx_ctx_n_batch_rows(const nx_ctx *c);
/* Bytes the context holds: its caches and its scratch (roughly: what one more context costs). */
size_t nx_ctx_bytes(const nx_ctx *c);

/* Trunk forward over n tokens at positions n_past.. (teacher forcing). The context's KV cache
 * must hold exactly n_past rows before the call. Writes logits [n, vocab] if non-NULL. */
nx_status nx_ctx_eval(nx_ctx *c, const int32_t *tokens, int32_t n, int32_t n_past, float *logits,
                      nx_error *err);
/* Teacher-forced MTP logits for the rows just evaluated: row p pairs the trunk hidden at p with
 * token p+1 (so n-1 rows for the last eval of n tokens). Writes [n-1, vocab]. */
nx_status nx_ctx_eval_mtp(nx_ctx *c, const int32_t *tokens, int32_t n, float *logits,
                          nx_error *err);
/* Copies the trunk hidden states the MTP head is fed (after or before the final norm, as the
 * model's wiring says) for cache rows [from, from + n) into out [n, hidden_size]: the inputs a
 * head is trained on (`nextn forge`). The rows must be in the trunk cache. */
nx_status nx_ctx_mtp_hidden(const nx_ctx *c, int32_t from, int32_t n, float *out, nx_error *err);
/* Drops every cached row at or after position n (rollback). A hybrid model's recurrent states go
 * back only to the rows of the last forward call (a verify pass's) and to the context's
 * checkpoints (nx_ctx_set_checkpoints); to any other row the context starts over (n_past 0). */
void nx_ctx_truncate(nx_ctx *c, int32_t n);
/* Recurrent-state checkpoints (hybrid models: Qwen3.5/3.6, Qwen3-Next; llama.cpp's
 * --ctx-checkpoints): copies of every recurrent layer's state after some row, so that a later
 * prompt sharing a prefix with the context (a chat's next turn, another question about the same
 * document) prefills from the last checkpoint at or below the shared prefix rather than from
 * the start. nx_generate makes one at the prompt's last row but one and, while prefilling, one
 * every `every` prompt rows (0: none of these); the context keeps the `max` of the highest rows
 * (0..64; 0: none at all). Each costs the model's recurrent states (nx_model_info's
 * linear_state_bytes: ~63 MiB for Qwen3.6-35B-A3B). Defaults 4 and 2048. No effect on other models. */
#define NX_CTX_CHECKPOINTS_DEFAULT 4
#define NX_CTX_CHECKPOINTS_MAX 64
#define NX_CHECKPOINT_EVERY_DEFAULT 2048
nx_status nx_ctx_set_checkpoints(nx_ctx *c, int32_t max, int32_t every, nx_error *err);
/* Forgets what --draft auto has measured on this context (step costs, acceptance per draft
 * position), which otherwise carries over from one generation to the next. */
void nx_ctx_reset_auto(nx_ctx *c);

/* ---------------------------------------------------------------- batches of contexts */

/* A batch runs the forwards of several contexts, each generating on its own thread, together
 * (docs/design.md §15): when every busy member has a forward waiting, one of the waiting threads
 * runs them all as ONE forward (each weight read once for every row; attention of each context
 * over its own caches) and each gets the bits a forward of its context alone would give it. */
typedef struct nx_batch nx_batch;

/* A batch for up to max_seqs contexts of model m, with scratch for max_rows rows per forward
 * (requests beyond them wait for the next one). */
nx_status nx_batch_new(nx_model *m, int32_t max_seqs, int32_t max_rows, nx_batch **out, nx_error *err);
/* Frees the batch (its contexts must be freed first, or be idle and never forward again). */
void nx_batch_free(nx_batch *b);
/* From now on c's forwards go through b (at most max_seqs contexts; false when full). */
bool nx_batch_add(nx_batch *b, nx_ctx *c);
/* Whether c's thread is generating: the batch waits for a forward of every busy context before
 * it runs one (a busy thread must forward or become idle soon: set it idle around a wait). */
void nx_batch_busy(nx_ctx *c, bool busy);

/* What a batch has run: forwards by the number of contexts they held (n_by_seqs[i]: i contexts,
 * i ≤ NX_BATCH_STAT_SEQS, the last counting every larger one), rows and seconds of all of them. */
#define NX_BATCH_STAT_SEQS 16
typedef struct nx_batch_stats {
    int64_t n_by_seqs[NX_BATCH_STAT_SEQS + 1];
    int64_t forwards, rows;
    double seconds;
} nx_batch_stats;
void nx_batch_get_stats(nx_batch *b, nx_batch_stats *out);

typedef enum nx_verify {
    NX_VERIFY_RESIDUAL = 0, /* Leviathan/Chen rejection sampling (default) */
    NX_VERIFY_MATCH,        /* accept iff the target's own sample equals the draft */
} nx_verify;

#define NX_DRAFT_AUTO (-1)
#define NX_MAX_DRAFT 8

typedef struct nx_gen_params {
    nx_sampler_params sampling;
    int32_t max_tokens;   /* generated tokens at most */
    int32_t draft;        /* NX_DRAFT_AUTO, 0 = plain decoding, 1..NX_MAX_DRAFT */
    nx_verify verify;
    float draft_p_min;    /* stop chaining when the draft's probability is below this */
    double synthetic_accept; /* benchmarks only: < 0 off; else accept drafts with this probability */
    bool ignore_eos;
    const int32_t *stop_ids; /* extra stop tokens */
    size_t n_stop_ids;
    int32_t min_tokens; /* end-of-sequence and stop tokens are masked before this many tokens */
    int32_t checkpoint_at; /* hybrid models: a prompt row to make a checkpoint at besides the
                            * others (nx_ctx_set_checkpoints), such as where a chat prompt's
                            * generation prompt begins, which the next turn re-renders; 0: none */
} nx_gen_params;

void nx_gen_params_default(nx_gen_params *p);

/* The parts of a trunk forward whose time and weight bytes are kept apart: attention (the
 * q/k/v/o projections and the attention over the cache), the feed-forward (router and experts,
 * or the dense FFN) and the output head (final norm and lm_head). The rest of a forward is the
 * embedding lookup, norms and residual adds. */
enum { NX_PHASE_ATTN, NX_PHASE_FFN, NX_PHASE_HEAD, NX_PHASES };

/* Speculative and cost counters (docs/design.md §7). */
typedef struct nx_gen_stats {
    int64_t n_prompt, n_generated;
    int64_t n_cached;                   /* prompt tokens whose cache rows were kept (prefix reuse) */
    int64_t n_mtp_prompt;               /* prompt rows the MTP head was fed (not already in its cache) */
    double t_prefill, t_decode;         /* seconds */
    double t_draft, t_verify, t_sample; /* seconds, split of t_decode */
    int64_t n_steps;                    /* trunk forwards during decode (AR steps + verifies) */
    int64_t n_drafts;                   /* cycles that drafted */
    int64_t n_drafted, n_accepted;
    int64_t accepted_at[NX_MAX_DRAFT];  /* accepted drafts per chain position */
    int64_t drafted_at[NX_MAX_DRAFT];
    /* cost model, measured: seconds of a trunk forward over r rows (index r, 1..NX_MAX_DRAFT+1) */
    double cost_rows[NX_MAX_DRAFT + 2];
    int64_t cost_rows_n[NX_MAX_DRAFT + 2];
    double cost_mtp_row; /* seconds of one MTP draft row */
    int64_t cost_mtp_n;
    /* MoE traffic */
    double expert_bytes_ar, expert_bytes_verify; /* sums over steps of that kind */
    int64_t n_ar_steps, n_verify_steps;
    double experts_touched_ar, experts_touched_verify; /* distinct experts per step, summed */
    double mtp_bytes;                /* weight bytes read by MTP forwards (dense + experts) */
    double topk_overlap_sum; /* shared top-k experts between consecutive rows, summed */
    int64_t topk_overlap_n;
    /* where plain one-row steps' time went, summed over them (n_ar_steps): wall seconds and
     * weight bytes per NX_PHASE_*; cost_rows[1] holds the whole forwards */
    double ar_phase_s[NX_PHASES], ar_phase_bytes[NX_PHASES];
    /* hybrid models: rejected drafts taking the recurrent states back (replaying the accepted rows
     * from the checkpoint a verify keeps): count, wall seconds, state bytes read and written */
    int64_t n_rewinds;
    double t_rewind, rewind_bytes;
    /* streamed experts (nx_load_params.max_memory): per kind of trunk step, expert lookups that
     * found the expert in the cache and that had to read it, bytes read from disk and seconds the
     * forward waited on those reads; [0] plain steps, [1] verifies */
    int64_t cache_hits[2], cache_misses[2];
    int64_t ahead_reads[2], ahead_used[2]; /* experts read ahead by pre-gating, and those used */
    double disk_bytes[2], io_wait_s[2];
    /* a split model (several ranks), seen from rank 0: bytes it sent and received, its messages,
     * and the seconds it waited on the other ranks (their compute and the network); [0] plain
     * steps, [1] verifies, [2] MTP forwards (catch-ups and drafts) */
    double net_bytes[3], net_s[3];
    int64_t net_msgs[3];
    bool stopped_by_eos;
} nx_gen_stats;

/* Called for each emitted token with its probability under the processed distribution `probs`
 * (vocab_size floats, valid during the call). Return non-zero to stop generation. A verify's
 * drafted_at[i] (and accepted_at[i] when the draft was accepted) in the `stats` given to
 * nx_generate are counted before the token judged at chain position i is emitted, so a callback
 * can tell accepted drafts from sampled tokens by them; the cycle's totals come after. */
typedef int (*nx_token_fn)(void *user, int32_t id, const float *probs);

/* Generates a continuation of prompt[0..n_prompt). The longest prefix the prompt shares with the
 * tokens already in the context's trunk cache (but not its last token, whose logits are needed)
 * is kept rather than computed again, as llama.cpp's server keeps a slot's prompt: a chat's next
 * turn, or another sample of the same prompt, prefills only what is new. The kept rows are the
 * ones a fresh prefill would compute (the numerics contract), so the output is the same bits as
 * from an empty context; nx_ctx_truncate(c, 0) beforehand forces a full prefill. The MTP head's
 * cache keeps its rows of the kept prefix (they too are what a fresh prefill computes) and is
 * fed the rest from the trunk's stored hidden states. */
nx_status nx_generate(nx_ctx *c, const int32_t *prompt, size_t n_prompt, const nx_gen_params *p,
                      nx_token_fn on_token, void *user, nx_gen_stats *stats, nx_error *err);

/* ---------------------------------------------------------------- prompt cache */

/* Copies of context prefixes kept in memory (llama.cpp server's --cache-ram): the tokens, every
 * trunk layer's key and value rows and the hidden states the MTP head is fed. A context holds
 * one sequence; requests that alternate between conversations, or a chat interrupted by a
 * one-off request, would otherwise evict each other's rows and prefill from scratch. */
typedef struct nx_prompt_cache nx_prompt_cache;

typedef struct nx_prompt_cache_stats {
    int64_t entries, bytes, budget_bytes;
    int64_t saves, restores, evictions; /* since creation */
    int64_t restored_tokens;           /* rows restored, summed */
} nx_prompt_cache_stats;

/* A cache of at most budget_bytes (0: nothing is ever kept). */
nx_status nx_prompt_cache_new(size_t budget_bytes, nx_prompt_cache **out, nx_error *err);
void nx_prompt_cache_free(nx_prompt_cache *pc);
/* Call before nx_generate(c, prompt, n_prompt, ...). If the context is about to lose cached rows
 * (its tokens are not all a prefix of the prompt) and holds at least 16, they are saved first:
 * an entry replaces the ones it extends, and the least recently used go when the budget is
 * exceeded. Then, if an entry shares a longer prefix with the prompt than the context does, its
 * rows are loaded into the context. Returns the rows nx_generate will keep (the shared prefix,
 * less the prompt's last token). Restored rows are the saved bits, so the output is the same as
 * from an empty context. Entries are used only with contexts of the model they came from. */
int32_t nx_prompt_cache_prepare(nx_prompt_cache *pc, nx_ctx *c, const int32_t *prompt, size_t n_prompt);
/* Saves the context's rows (at least 16) into the cache as nx_prompt_cache_prepare does before a
 * request replaces them: for callers about to replace them otherwise (loading a state file). */
void nx_prompt_cache_keep(nx_prompt_cache *pc, const nx_ctx *c);
/* Drops every entry (a slot's erase: the erased rows must not come back from the cache). */
void nx_prompt_cache_clear(nx_prompt_cache *pc);
void nx_prompt_cache_get_stats(const nx_prompt_cache *pc, nx_prompt_cache_stats *st);

/* ---------------------------------------------------------------- state files */

/* A context's rows written to a file and read back, across processes (llama.cpp's
 * --prompt-cache and its server's slot save/restore): the tokens, every trunk layer's key and
 * value rows and the hidden states the MTP head is fed (its own cache is rebuilt from them by
 * nx_generate), behind a header with the model's shape, a fingerprint
 * of its weights and the KV element type, and a CRC-32 of the rows. Restored rows are the saved
 * bits, so generation continues as from the context that saved them. */

/* Writes rows [0, n) of c (n < 0 or more than the context holds: all of them) to path,
 * atomically: a temporary file beside it, renamed over path once complete. *n_saved and *bytes
 * (either may be NULL) receive the rows written and the file's size. */
nx_status nx_state_save(const nx_ctx *c, const char *path, int32_t n, int32_t *n_saved, int64_t *bytes,
                        nx_error *err);
/* The size of the file nx_state_save(c, path, n, ...) would write. */
int64_t nx_state_file_bytes(const nx_ctx *c, int32_t n);
/* Loads the state file at path into c, which then holds its rows (at most the context's size:
 * the longest prefix that fits). A file that is not a state file, was saved from another model
 * or with another KV element type, is truncated or corrupt, or holds out-of-range tokens is an
 * error naming the problem (NX_E_IO, NX_E_FORMAT or NX_E_ARG), and c is left as it was.
 * *n_loaded and *bytes (either may be NULL) receive the rows loaded and the file's size. */
nx_status nx_state_load(nx_ctx *c, const char *path, int32_t *n_loaded, int64_t *bytes, nx_error *err);

/* Prints the stats block of `nextn run --stats` to f (a FILE *). */
void nx_gen_stats_print(const nx_gen_stats *s, void *file);

#ifdef __cplusplus
}
#endif
#endif
