/* Loading a model: the tensor store (mmap'd safetensors), config.json, the layout mapping to
 * one weight table, the tokenizer and chat template, the thread pool; and the summary that
 * `nextn inspect` prints. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/error.h"
#include "base/file.h"
#include "dist/dist.h"
#include "io/config.h"
#include "io/layout.h"
#include "model/model_internal.h"
#include "model/share.h"
#include "model/split.h"
#include "model/validate.h"
#include "text/chat.h"

void nx_load_params_default(nx_load_params *p) {
    memset(p, 0, sizeof *p);
}

/* Anything at path (a FIFO or a directory there is then a named error from the loader). */
static bool file_exists(const char *path) {
    struct stat sb;
    return lstat(path, &sb) == 0;
}

/* Family defaults (docs/design.md §3.7, the family descriptor's MTP wiring) for every knob the
 * caller left at DEFAULT. The first draft step always gets the trunk's post-final-norm hidden. */
static void wiring_resolve(nx_mtp_wiring *w, const nx_config *cfg, const nx_weights *wt) {
    if (w->hidden == NX_MTP_HIDDEN_DEFAULT) w->hidden = NX_MTP_HIDDEN_POST_NORM;
    if (w->concat == NX_MTP_CONCAT_DEFAULT)
        w->concat = cfg->mtp.hidden_first ? NX_MTP_CONCAT_HIDDEN_FIRST : NX_MTP_CONCAT_EMBED_FIRST;
    if (w->recycle == NX_MTP_RECYCLE_DEFAULT)
        w->recycle = cfg->mtp.recycle_prenorm ? NX_MTP_RECYCLE_RAW : NX_MTP_RECYCLE_NORMED;
    w->hnorm = w->hnorm >= 0 && wt->has_mtp && wt->mtp.hnorm; /* resolved to 0/1 */
    if (w->sliding_window < 0) w->sliding_window = 0;
}

static uint64_t lin_params(const nx_linear *W) { return (uint64_t)(W->out * W->in); }

static uint64_t ffn_params(const nx_ffn *f) {
    return lin_params(&f->gate) + lin_params(&f->up) + lin_params(&f->down);
}

/* Parameters of one layer: all of them, and those a token touches (top-k experts). */
static void layer_params(const nx_layer *L, int32_t top_k, uint64_t *total, uint64_t *active) {
    nx_linear w[NX_ATTN_LINEARS];
    uint64_t attn = 0;
    for (int i = 0, n = nx_attn_linears(L, w); i < n; i++) attn += lin_params(&w[i]);
    *total += attn;
    *active += attn;
    if (!L->is_moe) {
        *total += ffn_params(&L->dense);
        *active += ffn_params(&L->dense);
        return;
    }
    const nx_moe *M = &L->moe;
    uint64_t router = lin_params(&M->router) + lin_params(&M->shared_gate);
    uint64_t shared = M->has_shared ? ffn_params(&M->shared) : 0;
    uint64_t one = M->n_experts > 0 ? ffn_params(&M->experts[0]) : 0;
    *total += router + shared + one * (uint64_t)M->n_experts;
    *active += router + shared + one * (uint64_t)top_k;
}

static const char *dtype_summary(const nx_store *st, char *buf, size_t n) {
    int seen[NX_DTYPE_COUNT] = {0};
    size_t cnt = nx_store_count(st);
    for (size_t i = 0; i < cnt; i++) {
        const nx_tensor *t = nx_store_tensor(st, i);
        if (t->n_dims >= 2 && (int)t->dtype < NX_DTYPE_COUNT) seen[t->dtype] = 1;
    }
    buf[0] = 0;
    for (int d = 0; d < NX_DTYPE_COUNT; d++)
        if (seen[d]) {
            size_t len = strlen(buf);
            snprintf(buf + len, n - len, "%s%s", len ? "+" : "", nx_dtype_name((nx_dtype)d));
        }
    return buf;
}

/* What the engine inferred: the family's variants as the config set them, and the MTP wiring
 * as resolved (family defaults, then the caller's overrides). */
static void fill_variants(nx_model *m) {
    const nx_config *cfg = &m->cfg;
    nx_model_info *in = &m->info;
    in->family_name = cfg->family->summary;
    in->rotary_dim = cfg->rotary_dim;
    in->rope = cfg->rope_pairs == NX_ROPE_INTERLEAVED ? "interleaved" : "neox";
    in->rope_scaling = cfg->yarn.factor > 0 ? "yarn" : "none";
    in->attention = cfg->n_linear ? "hybrid" : cfg->attention == NX_ATTN_MLA ? "mla" : "gqa";
    in->n_linear_layers = cfg->n_linear;
    in->linear_state_bytes = (uint64_t)cfg->n_linear * sizeof(float) *
                             (uint64_t)(nx_deltanet_state_floats(&cfg->dn) + nx_deltanet_conv_floats(&cfg->dn));
    in->q_lora_rank = cfg->mla.q_lora_rank;
    in->kv_lora_rank = cfg->mla.kv_lora_rank;
    in->qk_nope_head_dim = cfg->mla.qk_nope;
    in->qk_rope_head_dim = cfg->mla.qk_rope;
    in->v_head_dim = cfg->mla.v_head_dim;
    in->attn_bias = cfg->attn_bias;
    in->qk_norm = cfg->qk_norm;
    in->router = cfg->router == NX_ROUTER_SOFTMAX ? "softmax" : "sigmoid+bias";
    in->n_group = cfg->n_group;
    in->topk_group = cfg->topk_group;
    in->norm_topk_prob = cfg->route_norm;
    in->routed_scaling = cfg->router_scaling;
    in->n_shared_experts = cfg->n_shared_experts;
    in->n_dense_layers = cfg->first_k_dense;
    in->mtp_concat = m->wiring.concat == NX_MTP_CONCAT_HIDDEN_FIRST ? "hidden,embed" : "embed,hidden";
    in->mtp_recycle = m->wiring.recycle == NX_MTP_RECYCLE_RAW ? "pre-norm" : "post-norm";
    in->mtp_zero_pos0 = cfg->mtp.zero_pos0;
    in->mtp_embed = m->w.has_mtp && m->w.mtp.embed.w ? "own" : "trunk";
    in->mtp_head = m->w.has_mtp && m->w.mtp.head.w ? "own" : "trunk";
}

static void fill_info(nx_model *m) {
    const nx_config *cfg = &m->cfg;
    const nx_weights *w = &m->w;
    nx_model_info *in = &m->info;
    in->family = cfg->model_type;
    in->layout = w->layout;
    if (cfg->quant_bits > 0)
        snprintf(m->weight_dtype, sizeof m->weight_dtype, "affine-%dbit-g%d (+overrides: %d)",
                 cfg->quant_bits, cfg->quant_group, cfg->n_quant_overrides);
    else
        dtype_summary(m->store, m->weight_dtype, sizeof m->weight_dtype);
    in->weight_dtype = m->weight_dtype;
    in->mtp = m->mtp_status;
    in->vocab_size = cfg->vocab_size;
    in->hidden_size = cfg->hidden_size;
    in->n_layers = cfg->n_layers;
    in->n_heads = cfg->n_heads;
    in->n_kv_heads = cfg->n_kv_heads;
    in->head_dim = cfg->head_dim;
    in->n_experts = cfg->n_experts;
    in->top_k = cfg->top_k;
    in->mtp_n_experts = w->has_mtp && w->mtp.layer.is_moe ? w->mtp.layer.moe.n_experts : 0;
    in->max_positions = cfg->max_positions;
    uint64_t total = lin_params(&w->embed), active = 0;
    if (w->lm_head.w != w->embed.w) total += lin_params(&w->lm_head);
    active += lin_params(&w->lm_head);
    for (int32_t l = 0; l < cfg->n_layers; l++) layer_params(&w->layers[l], cfg->top_k, &total, &active);
    in->n_params = total;
    in->n_params_active = active;
    if (w->has_mtp) {
        uint64_t mt = lin_params(&w->mtp.eh_proj), ma = 0;
        layer_params(&w->mtp.layer, cfg->top_k, &mt, &ma);
        in->n_params_mtp = mt;
    }
    uint64_t bytes = 0;
    for (size_t i = 0; i < nx_store_count(m->store); i++) bytes += nx_store_tensor(m->store, i)->nbytes;
    in->weight_bytes = bytes;
    uint64_t step = nx_linear_bytes(&w->lm_head);
    for (int32_t l = 0; l < cfg->n_layers; l++) {
        const nx_layer *L = &w->layers[l];
        step += nx_attn_bytes(L);
        if (L->is_moe)
            step += nx_linear_bytes(&L->moe.router) + nx_linear_bytes(&L->moe.shared_gate);
        else
            step += nx_ffn_bytes(&L->dense);
    }
    in->step_bytes_dense = step;
    if (w->has_mtp) {
        const nx_layer *L = &w->mtp.layer;
        uint64_t mb = nx_linear_bytes(&w->mtp.eh_proj) + nx_attn_bytes(L);
        mb += L->is_moe ? nx_linear_bytes(&L->moe.router)
                        : nx_ffn_bytes(&L->dense);
        mb += (uint64_t)((double)nx_linear_bytes(&w->lm_head) * m->draft_vocab / (double)cfg->vocab_size);
        in->mtp_bytes_dense = mb;
    }
    int32_t kv_layers = cfg->n_layers - cfg->n_linear + (w->has_mtp ? 1 : 0); /* DeltaNet layers cache none */
    in->kv_bytes_per_token = (uint64_t)kv_layers * nx_kv_pos_bytes(m);
    in->kv_bytes_per_token_expanded =
        cfg->attention == NX_ATTN_MLA
            ? (uint64_t)kv_layers * (uint64_t)cfg->n_heads *
                  (uint64_t)(cfg->mla.qk_nope + cfg->mla.qk_rope + cfg->mla.v_head_dim) * nx_dtype_size(m->kv_dtype)
            : in->kv_bytes_per_token;
    in->kv_type = m->kv_dtype == NX_DTYPE_F16 ? "f16" : "f32";
    in->resident_bytes = m->plan.slots > 0 ? m->plan.resident : in->weight_bytes;
    in->routed_expert_bytes = m->plan.routed;
    in->n_routed_experts = m->plan.n_routed;
    in->cache_slots = m->plan.slots;
    in->cache_bytes = m->plan.cache_bytes;
    in->expected_hit_rate = m->plan.hit_rate;
    in->plan_from_stats = m->plan.from_stats;
    in->expected_disk_bytes_per_token = m->plan.disk_per_token;
    in->bos_id = cfg->bos_id;
    in->eos_id = cfg->n_eos > 0 ? cfg->eos_ids[0] : -1;
    fill_variants(m);
}

/* Whether every weight will be read in (nothing streams: no cap or one the weights fit under;
 * they fit in the memory available, or are to be locked), known from the headers alone. */
static bool reads_all(const nx_model *m, const nx_load_params *p) {
    const uint64_t total = nx_store_tensor_bytes(m->store);
    if (p->prefault == NX_PREFAULT_NEVER || p->dist) return false;
    if (p->max_memory > 0 && p->max_memory < total) return false;
    return p->prefault == NX_PREFAULT_LOCK || total <= nx_mem_available();
}

/* Marks every weight kept mapped (not the streamed experts') for readahead and 2 MB pages, then,
 * with read, reads them in. Every span is marked before any is read: a span marked beside one not
 * yet marked is a mapping of its own, and the 2 MB across their border, read then, would stay
 * mapped in 4 KB pages after the two merge. */
static void mark_then_read(nx_model *m, bool read) {
    for (int pass = 0; pass < (read ? 2 : 1); pass++)
        for (size_t i = 0; i < nx_store_count(m->store); i++) {
            const nx_tensor *t = nx_store_tensor(m->store, i);
            if (nx_xcache_covers(m->xc, t->data, t->nbytes)) continue; /* streams: never touched */
            if (pass == 0) nx_store_use(m->store, t->data, t->nbytes);
            else nx_store_prefault(m->store, t->data, t->nbytes);
        }
}

/* Files read in with more than a twentieth of their pages mapped 4 KB at a time (cached so by a
 * download, a copy, an eviction of part of them) are cached anew, where the system then gives
 * them 2 MB pages (nx_store_recache): decoding streams every weight each token, and on 4 KB
 * pages it pays a page walk per 4 KB (docs/kernels.md, "Model files and huge pages").
 * NX_RECACHE=0 leaves them be. Returns the files re-read. */
static int recache_small_pages(nx_model *m) {
    const char *env = getenv("NX_RECACHE");
    if (env && !strcmp(env, "0")) return 0;
    const int nf = nx_store_n_files(m->store);
    double *share = malloc(sizeof *share * (size_t)(nf + 1));
    int n = 0;
    if (share && nx_store_huge_share(m->store, share) >= 0)
        for (int i = 0; i < nf; i++) n += share[i] >= 0 && share[i] < 0.95 && nx_store_recache(m->store, i);
    free(share);
    return n;
}

/* Every weight read in at load (reads_all): every span marked first, then each file read whole
 * from its first 2 MB boundary past the header on (nx_store_read_in), then the files the page
 * cache held in 4 KB pages cached anew. */
static void read_all_in(nx_model *m) {
    mark_then_read(m, false);
    for (int i = 0; i < nx_store_n_files(m->store); i++) nx_store_read_in(m->store, i);
    m->info.recached_files = recache_small_pages(m);
}

/* The residency plan, the expert cache when experts stream, and the resident weights read in
 * (docs/design.md, "Bigger than memory"): loading itself reads only headers, and the weights
 * are prefaulted only when they fit in the memory the system has available (or on request,
 * locked), so describing a checkpoint larger than memory takes a moment, not minutes. */
static nx_status place_weights(nx_model *m, const nx_load_params *p, bool read_in, nx_error *err) {
    const uint64_t total = nx_store_tensor_bytes(m->store);
    nx_status st = nx_route_stats_init(&m->routes, &m->w, m->cfg.family->model_type, p->router_stats, err);
    if (st != NX_OK) return st;
    const nx_xcounts counts = m->routes.has_prior ? (nx_xcounts)m->routes.prior : NULL;
    if ((st = nx_xplan_make(&m->w, &m->cfg, total, p->max_memory, counts, &m->plan, err)) != NX_OK) return st;
    if (m->plan.slots > 0 && !(m->xc = nx_xcache_new(m->store, &m->w, &m->plan)))
        return nx_fail(err, NX_E_NOMEM, "out of memory for the expert cache");
    /* described, not run; or split: each rank pages in only the tensors it touches */
    if (p->prefault == NX_PREFAULT_NEVER || p->dist) return NX_OK;
    const uint64_t resident = m->plan.slots > 0 ? m->plan.resident : total;
    const bool lock = p->prefault == NX_PREFAULT_LOCK, fill = read_in || lock || resident <= nx_mem_available();
    if (!read_in) mark_then_read(m, fill);
    for (size_t i = 0; lock && i < nx_store_count(m->store); i++) {
        const nx_tensor *t = nx_store_tensor(m->store, i);
        if (nx_xcache_covers(m->xc, t->data, t->nbytes)) continue;
        if ((st = nx_store_lock(m->store, t->data, t->nbytes, err)) != NX_OK) return st;
    }
    m->info.prefaulted = fill;
    return NX_OK;
}

/* generation_config.json may list more stop ids than config.json. */
static void add_generation_eos(nx_config *cfg, const char *dir) {
    char path[4096];
    snprintf(path, sizeof path, "%s/generation_config.json", dir);
    json_t *root;
    if (nx_file_load_json(path, 0, &root, NULL) != NX_OK) return;
    json_t *e = json_object_get(root, "eos_token_id");
    size_t n = json_is_array(e) ? json_array_size(e) : (json_is_integer(e) ? 1 : 0);
    for (size_t i = 0; i < n; i++) {
        json_t *v = json_is_array(e) ? json_array_get(e, i) : e;
        if (!json_is_integer(v)) continue;
        int32_t id = (int32_t)json_integer_value(v);
        bool dup = false;
        for (int32_t j = 0; j < cfg->n_eos; j++) dup |= cfg->eos_ids[j] == id;
        if (!dup && cfg->n_eos < NX_MAX_EOS && id >= 0 && id < cfg->vocab_size) cfg->eos_ids[cfg->n_eos++] = id;
    }
    json_decref(root);
}

nx_status nx_model_load(const char *dir, const nx_load_params *p, nx_model **out, nx_error *err) {
    nx_load_params defaults;
    if (!p) {
        nx_load_params_default(&defaults);
        p = &defaults;
    }
    *out = NULL;
    if (p->kv_type != NX_KV_F32 && p->kv_type != NX_KV_F16)
        return nx_fail(err, NX_E_ARG, "kv_type %d: expected NX_KV_F32 or NX_KV_F16", (int)p->kv_type);
    if (p->act_bits != 0 && p->act_bits != 8 && p->act_bits != 16)
        return nx_fail(err, NX_E_ARG, "act_bits %d: expected 8 or 16", p->act_bits);
    if (!p->dist != (p->split == NX_SPLIT_NONE))
        return nx_fail(err, NX_E_ARG, "a split (pipeline or experts) and a dist (nx_dist_init) go together");
    if (p->dist && p->prefault == NX_PREFAULT_LOCK)
        return nx_fail(err, NX_E_ARG, "--mlock with --split: each rank reads only its share, lock it with ulimit/mlockall");
    nx_status st;
    nx_model *m = calloc(1, sizeof *m);
    if (!m) return nx_fail(err, NX_E_NOMEM, "out of memory");
    m->dist = p->dist;
    m->split = p->split;
    char path[4096], rank_dir[4096];
    /* a directory of shares: this rank's (one process: rank 0's, which says how to run it) */
    dir = nx_share_dir(dir, p->dist ? nx_dist_rank(p->dist) : 0, rank_dir, sizeof rank_dir);

    snprintf(path, sizeof path, "%s/config.json", dir);
    if ((st = nx_config_load(path, &m->cfg, err)) != NX_OK) goto fail;
    if (p->progress) p->progress(p->progress_user, 0.05);
    if ((st = nx_store_open_lazy(dir, &m->store, err)) != NX_OK) goto fail;
    if ((st = nx_share_open(m, dir, p, err)) != NX_OK) goto fail;
    /* Read in first when it is all to be read (known from the headers alone): the loader's reads
     * of small tensors (norms, biases) on the lazy mapping would cache their pages alone, and no
     * 2 MB page forms around them while they stay cached, so the experts stored near them would
     * cost a page walk every 4 KB (docs/kernels.md, "Model files and huge pages"). */
    const bool read_in = reads_all(m, p);
    if (read_in) read_all_in(m);
    if (p->progress) p->progress(p->progress_user, 0.5);
    if ((st = nx_weights_load(m->store, &m->cfg, !p->no_mtp, p->act_bits == 16, &m->w, err)) != NX_OK) goto fail;
    if ((st = nx_weights_validate(&m->w, &m->cfg, err)) != NX_OK) goto fail;
    if ((st = nx_share_check(m, dir, err)) != NX_OK) goto fail;
    if ((st = place_weights(m, p, read_in, err)) != NX_OK) goto fail;
    add_generation_eos(&m->cfg, dir);

    if (p->no_mtp)
        snprintf(m->mtp_status, sizeof m->mtp_status, "disabled");
    else if (m->w.has_mtp)
        snprintf(m->mtp_status, sizeof m->mtp_status, "%s", m->w.mtp_where);
    else if (m->cfg.n_nextn_layers > 0)
        snprintf(m->mtp_status, sizeof m->mtp_status, "none (headless: config declares %d, no weights)",
                 m->cfg.n_nextn_layers);
    else
        snprintf(m->mtp_status, sizeof m->mtp_status, "none");

    m->wiring = p->wiring;
    wiring_resolve(&m->wiring, &m->cfg, &m->w);
    m->draft_vocab = p->draft_vocab > 0 && p->draft_vocab < m->cfg.vocab_size ? p->draft_vocab : m->cfg.vocab_size;
    m->kv_dtype = p->kv_type == NX_KV_F16 ? NX_DTYPE_F16 : NX_DTYPE_F32;

    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    if (file_exists(path) && (st = nx_tokenizer_load(path, &m->tok, err)) != NX_OK) goto fail;
    if (m->tok && nx_tokenizer_vocab_size(m->tok) > m->cfg.vocab_size) { /* ids the embedding has no row for */
        st = nx_fail(err, NX_E_FORMAT, "%s: token ids up to %d, but config.json's vocab_size is %d", path,
                     nx_tokenizer_vocab_size(m->tok) - 1, m->cfg.vocab_size);
        goto fail;
    }
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    if (file_exists(path)) { /* present but malformed is an error, not "no chat template" */
        if ((st = nx_chat_template_from_config(path, &m->chat_template, &m->tmpl_bos, &m->tmpl_eos,
                                               &m->token_suffix, err)) != NX_OK)
            goto fail;
        int32_t id = m->tmpl_eos && m->tok ? nx_tokenizer_token_id(m->tok, m->tmpl_eos) : -1;
        if (id >= 0 && m->cfg.n_eos < NX_MAX_EOS && !nx_model_is_eos(m, id)) m->cfg.eos_ids[m->cfg.n_eos++] = id;
    }

    m->pool = nx_pool_new(p->n_threads);
    if (!m->pool) {
        st = nx_fail(err, NX_E_NOMEM, "cannot start the thread pool");
        goto fail;
    }
    fill_info(m);
    if (m->dist && (st = nx_split_setup(m, err)) != NX_OK) goto fail;
    if (p->progress) p->progress(p->progress_user, 1.0);
    *out = m;
    return NX_OK;
fail:
    nx_error_prefix(err, "%s", dir);
    nx_model_free(m);
    return st;
}

void nx_model_free(nx_model *m) {
    if (!m) return;
    if (m->dist) nx_split_end(m);
    free(m->layer_lo);
    nx_pool_free(m->pool);
    nx_xcache_free(m->xc);
    nx_route_stats_free(&m->routes);
    nx_tokenizer_free(m->tok);
    free(m->chat_template);
    free(m->tmpl_bos);
    free(m->tmpl_eos);
    free(m->token_suffix);
    nx_weights_free(&m->w);
    nx_store_free(m->store);
    nx_config_free(&m->cfg);
    free(m);
}

const nx_model_info *nx_model_get_info(const nx_model *m) { return &m->info; }

double nx_model_huge_share(const nx_model *m) { return nx_store_huge_share(m->store, NULL); }

nx_status nx_model_router_stats_save(const nx_model *m, const char *path, nx_error *err) {
    return nx_route_stats_save(&m->routes, m->cfg.family->model_type, path, err);
}
const nx_tokenizer *nx_model_tokenizer(const nx_model *m) { return m->tok; }
const char *nx_model_chat_template(const nx_model *m) { return m->chat_template; }

void nx_model_template_strings(const nx_model *m, const char **bos, const char **eos, const char **token_suffix) {
    if (bos) *bos = m->tmpl_bos;
    if (eos) *eos = m->tmpl_eos;
    if (token_suffix) *token_suffix = m->token_suffix;
}

size_t nx_model_eos_ids(const nx_model *m, const int32_t **ids) {
    *ids = m->cfg.eos_ids;
    return m->cfg.n_eos > 0 ? (size_t)m->cfg.n_eos : 0;
}

bool nx_model_is_eos(const nx_model *m, int32_t id) {
    for (int32_t i = 0; i < m->cfg.n_eos; i++)
        if (m->cfg.eos_ids[i] == id) return true;
    return false;
}
