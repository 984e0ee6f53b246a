/* `nextn convert` / `nextn graft`, linked into the nextn command only. A source checkpoint becomes a plan: one
 * item per output tensor or linear module, named as the family's mlx-lm sanitize leaves them
 * (stacked switch_mlp experts, the family's renames, mtp.* head), each with its source parts
 * and an output precision. The writer then streams every file: header first, then each
 * item's data converted a chunk of rows at a time, so memory stays bounded on a 295B model. */
#include "converter.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <fnmatch.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define NAME_CAP 512
#define PATH_CAP 4096
#define CHUNK_BYTES ((size_t)64 << 20) /* output bytes converted per pool job */
#define DEFAULT_SHARD ((uint64_t)5000000000ull)
#define SIDECAR "model-mtp.safetensors"
#define INDEX "model.safetensors.index.json"

static void note(const nx_convert_hooks *h, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void note(const nx_convert_hooks *h, const char *fmt, ...) {
    if (!h || !h->note) return;
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    h->note(h->user, buf);
}

static bool starts(const char *s, const char *p) { return strncmp(s, p, strlen(p)) == 0; }
static bool ends(const char *s, const char *p) {
    size_t n = strlen(s), m = strlen(p);
    return n >= m && strcmp(s + n - m, p) == 0;
}
static bool is_float(nx_dtype t) { return t == NX_DTYPE_F32 || t == NX_DTYPE_F16 || t == NX_DTYPE_BF16; }

/* ================================================================ names (docs/design.md §4) */

enum { MAP_KEEP, MAP_DROP_SHARED, MAP_DROP_EXTRA, MAP_DROP_VISION, MAP_TOO_LONG };

/* Renames inside one decoder layer (relative name) to the family's MLX form (its mlx-lm
 * file's post-sanitize names); a per-expert tensor becomes its stacked switch_mlp name with
 * *expert set. */
static void rename_in_layer(const nx_family *fam, const char *rest, char *out, size_t cap, int64_t *expert) {
    *expert = -1;
    for (nx_keys r = fam->names.mlx_renames; r[0] && r[1]; r += 2)
        if (starts(rest, r[0])) {
            snprintf(out, cap, "%s%s", r[1], rest + strlen(r[0]));
            return;
        }
    if (starts(rest, "mlp.experts.")) {
        const char *p = rest + 12;
        char *end;
        long long e = strtoll(p, &end, 10);
        if (end != p && *end == '.' && e >= 0 && e < INT32_MAX) {
            *expert = e;
            snprintf(out, cap, "mlp.switch_mlp.%s", end + 1);
        } else {
            snprintf(out, cap, "mlp.switch_mlp.%s", p);
        }
    } else {
        snprintf(out, cap, "%s", rest);
    }
}

/* Whether r (relative to the head prefix) starts with module name m ("m." follows). */
static bool has_module(const char *r, const char *m) { return m && starts(r, m) && r[strlen(m)] == '.'; }

/* Whether head-relative name r is a part of the head proper (not of its decoder layer): the
 * input norms and projection, the family's final norm, and its own embedding and output head
 * where the family uses them. */
static bool is_head_part(const nx_family *fam, const char *r) {
    const nx_family_names *fn = &fam->names;
    static const char *const head[] = {"enorm", "hnorm", "eh_proj"};
    for (size_t i = 0; i < sizeof head / sizeof *head; i++)
        if (has_module(r, head[i])) return true;
    if (has_module(r, fn->mtp_fc) || has_module(r, fn->mtp_enorm) || has_module(r, fn->mtp_hnorm)) return true;
    for (nx_keys n = fn->mtp_norm; *n; n++)
        if (has_module(r, *n)) return true;
    return fam->mtp.own_embed_head && (starts(r, "embed_tokens.") || starts(r, "shared_head.head."));
}

/* Whether module path is the head's input projection (eh_proj, or the family's name for it). */
static bool is_mtp_fc(const nx_family *fam, const char *path) {
    const char *fc = fam->names.mtp_fc ? fam->names.mtp_fc : "eh_proj";
    size_t pl = strlen(path), fl = strlen(fc);
    return pl > fl && path[pl - fl - 1] == '.' && ends(path, fc);
}

/* A family's output prefix for the MTP head: the literal, or model.layers.N. when NULL. */
static void mtp_prefix(const char *lit, int32_t n_layers, char *out, size_t cap) {
    if (lit)
        snprintf(out, cap, "%s", lit);
    else
        snprintf(out, cap, "model.layers.%d.", (int)n_layers);
}

/* map_name on the flat names (model.*, lm_head.*, mtp.*). */
static int map_flat(const nx_family *fam, const char *name, int32_t n_layers, char *out, size_t cap, int64_t *expert,
                    bool *mtp) {
    char lay[NAME_CAP];
    const char *rest = NULL;  /* head-relative name */
    const char *block = NULL; /* decoder-layer-relative name inside the head */
    *mtp = false;
    *expert = -1;
    if (starts(name, "model.layers.")) {
        char *end;
        long long L = strtoll(name + 13, &end, 10);
        if (end != name + 13 && *end == '.') {
            if (L > n_layers) return MAP_DROP_EXTRA;
            if (L < n_layers) {
                rename_in_layer(fam, end + 1, lay, sizeof lay, expert);
                int n = snprintf(out, cap, "%.*s%s", (int)(end + 1 - name), name, lay);
                return n < 0 || (size_t)n >= cap ? MAP_TOO_LONG : MAP_KEEP;
            }
            *mtp = true;
            rest = end + 1;
        }
    } else if (starts(name, "mtp.")) {
        *mtp = true;
        rest = name + 4;
        if (starts(rest, "0.")) rest += 2;
        if (starts(rest, "block.")) block = rest + 6;
        else if (starts(rest, "layer.")) block = rest + 6;
        else if (starts(rest, "layers.")) { /* transformers' mtp.layers.K. (Qwen3.5, Qwen3-Next) */
            char *end;
            long long K = strtoll(rest + 7, &end, 10);
            if (end != rest + 7 && *end == '.') {
                if (K > 0) return MAP_DROP_EXTRA;
                block = end + 1;
            }
        }
    }
    if (!*mtp) {
        int n = snprintf(out, cap, "%s", name);
        return n < 0 || (size_t)n >= cap ? MAP_TOO_LONG : MAP_KEEP;
    }
    if (!block) {
        if (is_head_part(fam, rest)) {
            char hp[64];
            mtp_prefix(fam->names.mtp_out_head, n_layers, hp, sizeof hp);
            int n = snprintf(out, cap, "%s%s", hp, rest);
            return n < 0 || (size_t)n >= cap ? MAP_TOO_LONG : MAP_KEEP;
        }
        if (starts(rest, "embed_tokens.") || starts(rest, "shared_head.")) return MAP_DROP_SHARED;
        block = rest;
    }
    rename_in_layer(fam, block, lay, sizeof lay, expert);
    char bp[64];
    mtp_prefix(fam->names.mtp_out_block, n_layers, bp, sizeof bp);
    int n = snprintf(out, cap, "%s%s", bp, lay);
    return n < 0 || (size_t)n >= cap ? MAP_TOO_LONG : MAP_KEEP;
}

/* A vision-language wrapper (a family with text_config: Qwen3.5's) keeps its language model under
 * model.language_model. (transformers) or language_model.model. (mlx-lm), lm_head at the top or
 * under language_model., and a vision tower the engine does not run. Names are mapped in the
 * flat form and the trunk's are wrapped again as mlx-lm's sanitize() writes them
 * (language_model.model.*, language_model.lm_head); the head keeps mtp.*, where the loader and
 * the reference look for a sidecar. */
static const char *const WRAPPED[][2] = {{"model.language_model.", "model."},
                                         {"language_model.model.", "model."},
                                         {"language_model.mtp.", "mtp."},
                                         {"language_model.", ""}};

/* The output name of source tensor `name` (any known layout) for a model of n_layers trunk
 * layers; *mtp tells whether it belongs to the head. */
static int map_name(const nx_family *fam, const char *name, int32_t n_layers, char *out, size_t cap, int64_t *expert,
                    bool *mtp) {
    if (!fam->text_config) return map_flat(fam, name, n_layers, out, cap, expert, mtp);
    *mtp = false;
    *expert = -1;
    if (starts(name, "model.visual.") || starts(name, "vision_tower.")) return MAP_DROP_VISION;
    char flat[NAME_CAP], o[NAME_CAP];
    const char *f = name;
    for (size_t i = 0; i < sizeof WRAPPED / sizeof *WRAPPED && f == name; i++)
        if (starts(name, WRAPPED[i][0])) {
            int n = snprintf(flat, sizeof flat, "%s%s", WRAPPED[i][1], name + strlen(WRAPPED[i][0]));
            if (n < 0 || (size_t)n >= sizeof flat) return MAP_TOO_LONG;
            f = flat;
        }
    int r = map_flat(fam, f, n_layers, o, sizeof o, expert, mtp);
    if (r != MAP_KEEP) return r;
    int n = *mtp                   ? snprintf(out, cap, "%s", o)
            : starts(o, "model.") ? snprintf(out, cap, "language_model.model.%s", o + 6)
                                   : snprintf(out, cap, "language_model.%s", o);
    return n < 0 || (size_t)n >= cap ? MAP_TOO_LONG : MAP_KEEP;
}

/* ================================================================ the plan */

typedef struct part {
    const nx_tensor *w, *s, *b;
    const nx_tensor *si; /* an FP8 weight's block scales (X.weight_scale_inv) */
} part;

typedef struct item {
    char *path;        /* module path (linear) or tensor name stem */
    bool suffix;       /* the tensor is path + ".weight" */
    bool mtp;
    bool experts;      /* parts are per-expert tensors to stack */
    bool linear;
    part *parts;
    int64_t n_parts;
    const char *src_name; /* a source tensor name, for messages */
    int derive;        /* DERIVE_*: a matrix made of rows of the source's head or expert blocks */
    bool conv;         /* a DeltaNet conv1d weight: [C, 1, K] is written as [C, K, 1] */
    bool plus1;        /* a zero-centred norm stored as w, written as 1 + w */
    /* geometry */
    int64_t per_part, mats, out, in;
    /* matrix m of a part reads the source rows m·blk_stride + blk_off onwards: `out` of them
     * (DERIVE_KT: `in` of them, transposed) of src_in columns each */
    int64_t blk_stride, blk_off, src_in;
    bool stacked;      /* output is [mats, out, in] */
    nx_dtype wdtype;   /* source weight dtype */
    int sbits, sgroup; /* source quantization (0: float) */
    nx_dtype sdtype;   /* source float dtype (the weight's, or the scales'; bf16 for FP8) */
    int fbr, fbc;      /* FP8 source: rows and columns of one scale block */
    /* decision */
    int bits, group;
    nx_dtype odtype;   /* float dtype of the output weight, or of its scales/biases */
    bool copy;
    uint64_t bytes;
    int file;
    uint64_t off[3];
} item;

typedef struct plan {
    item *it;
    size_t n, cap;
    int64_t *slot; /* open addressing: index into it, -1 empty */
    size_t n_slot;
} plan;

static uint64_t hash_str(const char *s) {
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++) h = (h ^ (uint8_t)*s) * 1099511628211ull;
    return h;
}

static void plan_free(plan *p) {
    for (size_t i = 0; i < p->n; i++) {
        free(p->it[i].path);
        free(p->it[i].parts);
    }
    free(p->it);
    free(p->slot);
    memset(p, 0, sizeof *p);
}

static nx_status plan_grow_slots(plan *p, nx_error *err) {
    size_t n = p->n_slot ? p->n_slot * 2 : 1024;
    int64_t *s = malloc(n * sizeof *s);
    if (!s) return nx_fail(err, NX_E_NOMEM, "out of memory");
    for (size_t i = 0; i < n; i++) s[i] = -1;
    for (size_t i = 0; i < p->n; i++) {
        size_t h = (size_t)hash_str(p->it[i].path) & (n - 1);
        while (s[h] >= 0) h = (h + 1) & (n - 1);
        s[h] = (int64_t)i;
    }
    free(p->slot);
    p->slot = s;
    p->n_slot = n;
    return NX_OK;
}

/* The item for `path`, created if new. */
static nx_status plan_get(plan *p, const char *path, item **out, nx_error *err) {
    if (p->n_slot == 0 || p->n * 2 >= p->n_slot) {
        nx_status st = plan_grow_slots(p, err);
        if (st) return st;
    }
    size_t h = (size_t)hash_str(path) & (p->n_slot - 1);
    while (p->slot[h] >= 0) {
        if (!strcmp(p->it[p->slot[h]].path, path)) {
            *out = &p->it[p->slot[h]];
            return NX_OK;
        }
        h = (h + 1) & (p->n_slot - 1);
    }
    if (p->n == p->cap) {
        size_t cap = p->cap ? p->cap * 2 : 256;
        item *n = realloc(p->it, cap * sizeof *n);
        if (!n) return nx_fail(err, NX_E_NOMEM, "out of memory");
        p->it = n;
        p->cap = cap;
    }
    item *it = &p->it[p->n];
    memset(it, 0, sizeof *it);
    if (!(it->path = strdup(path))) return nx_fail(err, NX_E_NOMEM, "out of memory");
    p->slot[h] = (int64_t)p->n++;
    *out = it;
    return NX_OK;
}

enum { WANT_ALL, WANT_TRUNK, WANT_MTP };

/* Source tensors written as mlx-lm's sanitize() splits them, as two items reading the one tensor:
 * - multi-head latent attention's kv_b_proj ([n_heads·(qk_nope + v_head_dim), kv_lora_rank]): per
 *   head the key rows transposed (embed_q, [n_heads, kv_lora_rank, qk_nope]) and the value rows
 *   (unembed_out, [n_heads, v_head_dim, kv_lora_rank]);
 * - transformers' fused experts (Qwen3.5's trunk), mlp.experts.gate_up_proj [E, 2F, H] with each
 *   expert's gate rows before its up rows: switch_mlp's gate_proj and up_proj [E, F, H]. */
enum { DERIVE_NONE, DERIVE_ROWS, DERIVE_KT, DERIVE_GATE, DERIVE_UP };
/* transformers' fused expert tensors (Qwen3_5MoeExperts' parameters, no ".weight" suffix) after
 * rename_in_layer */
#define FUSED_GATE_UP ".mlp.switch_mlp.gate_up_proj"
#define FUSED_DOWN ".mlp.switch_mlp.down_proj"
static const struct {
    const char *src;
    bool mla; /* only in a latent-attention family */
    const char *out[2];
    int derive[2];
} SPLITS[] = {
    {".self_attn.kv_b_proj", true, {".self_attn.embed_q", ".self_attn.unembed_out"}, {DERIVE_KT, DERIVE_ROWS}},
    {FUSED_GATE_UP, false, {".mlp.switch_mlp.gate_proj", ".mlp.switch_mlp.up_proj"}, {DERIVE_GATE, DERIVE_UP}},
};
#define N_SPLITS (sizeof SPLITS / sizeof *SPLITS)

/* Whether an item reads a source tensor another item of its split has counted already. */
static bool derive_rereads(int d) { return d == DERIVE_KT || d == DERIVE_UP; }

/* Adds source tensor t as role (0 weight, 1 scales, 2 biases, 3 FP8 block scales) of expert e
 * (-1: none) of the item at `name`. */
static nx_status plan_add(plan *p, const char *name, const nx_tensor *t, int role, int64_t e, bool suffix, bool mtp,
                          int derive, nx_error *err) {
    item *it;
    nx_status s = plan_get(p, name, &it, err);
    if (s) return s;
    if (it->n_parts == 0) {
        it->suffix = suffix;
        it->mtp = mtp;
        it->experts = e >= 0;
        it->src_name = t->name;
        it->derive = derive;
    } else if (it->experts != (e >= 0) || it->derive != derive || (role == 0 && it->suffix != suffix)) {
        return nx_fail(err, NX_E_FORMAT, "tensors %s and %s both map to %s", it->src_name, t->name, name);
    }
    int64_t idx = e >= 0 ? e : 0;
    if (idx >= it->n_parts) {
        part *np = realloc(it->parts, (size_t)(idx + 1) * sizeof *np);
        if (!np) return nx_fail(err, NX_E_NOMEM, "out of memory");
        memset(np + it->n_parts, 0, (size_t)(idx + 1 - it->n_parts) * sizeof *np);
        it->parts = np;
        it->n_parts = idx + 1;
    }
    part *pt = &it->parts[idx];
    const nx_tensor **slot = role == 0 ? &pt->w : role == 1 ? &pt->s : role == 2 ? &pt->b : &pt->si;
    if (*slot) return nx_fail(err, NX_E_FORMAT, "tensors %s and %s both map to %s", (*slot)->name, t->name, name);
    *slot = t;
    return NX_OK;
}

/* Adds every tensor of `st` (selected by `want`) to the plan under its output name. */
static nx_status plan_collect(plan *p, const nx_family *fam, const nx_store *st, int32_t n_layers, int want, const nx_convert_hooks *h,
                              nx_error *err) {
    char name[NAME_CAP];
    int dropped_shared = 0, dropped_vision = 0;
    for (size_t i = 0; i < nx_store_count(st); i++) {
        const nx_tensor *t = nx_store_tensor(st, i);
        int64_t e;
        bool mtp;
        int r = map_name(fam, t->name, n_layers, name, sizeof name, &e, &mtp);
        if (r == MAP_TOO_LONG) return nx_fail(err, NX_E_FORMAT, "tensor %.200s...: name too long", t->name);
        if (r == MAP_DROP_EXTRA) {
            note(h, "skipping %s: only the first MTP layer is kept", t->name);
            continue;
        }
        if ((want == WANT_TRUNK && mtp) || (want == WANT_MTP && !mtp)) continue;
        if (r == MAP_DROP_VISION) {
            if (!dropped_vision++)
                note(h, "skipping %s (and the rest of the vision tower): the language model is converted, as "
                        "mlx-lm does", t->name);
            continue;
        }
        if (r == MAP_DROP_SHARED) {
            if (!dropped_shared++)
                note(h, "skipping %s (and any other copy of embed_tokens/shared_head in the head): the head uses "
                        "the trunk's embedding and lm_head", t->name);
            continue;
        }
        int role = 0;
        bool suffix = true;
        size_t len = strlen(name);
        if (ends(name, ".weight_scale_inv")) name[len - 17] = 0, role = 3;
        else if (ends(name, ".weight")) name[len - 7] = 0;
        else if (ends(name, ".scales")) name[len - 7] = 0, role = 1;
        else if (ends(name, ".biases")) name[len - 7] = 0, role = 2;
        else suffix = false;
        if (!suffix && (ends(name, FUSED_GATE_UP) || ends(name, FUSED_DOWN))) suffix = true;
        nx_status s;
        size_t nl = strlen(name), k = 0;
        while (k < N_SPLITS && !(ends(name, SPLITS[k].src) && (!SPLITS[k].mla || fam->attention == NX_ATTN_MLA))) k++;
        if (k < N_SPLITS) {
            const size_t sl = strlen(SPLITS[k].src);
            for (int j = 0; j < 2; j++) {
                char dn[NAME_CAP];
                int n = snprintf(dn, sizeof dn, "%.*s%s", (int)(nl - sl), name, SPLITS[k].out[j]);
                if (n < 0 || (size_t)n >= sizeof dn)
                    return nx_fail(err, NX_E_FORMAT, "tensor %.200s...: name too long", t->name);
                if ((s = plan_add(p, dn, t, role, e, suffix, mtp, SPLITS[k].derive[j], err))) return s;
            }
            continue;
        }
        if ((s = plan_add(p, name, t, role, e, suffix, mtp, DERIVE_NONE, err))) return s;
    }
    return NX_OK;
}

/* Source bits/group of a quantized module: the config's value when it fits the shapes,
 * else the only (bits, group) the packed and scales widths allow. */
static nx_status source_quant(const item *it, const nx_config *cfg, int64_t packed, int64_t ngroups, int *bits,
                              int *group, nx_error *err) {
    int cb = 0, cg = 0;
    char src[NAME_CAP]; /* a derived item's source module */
    const char *wn = it->parts[0].w->name;
    if (it->derive) snprintf(src, sizeof src, "%.*s", (int)(strlen(wn) - strlen(".weight")), wn);
    if (nx_config_quant_for(cfg, it->derive ? src : it->path, &cb, &cg) && cb > 0 &&
        packed * 32 == (int64_t)cb * cg * ngroups) {
        *bits = cb;
        *group = cg;
        return NX_OK;
    }
    static const int B[] = {2, 3, 4, 5, 6, 8}, G[] = {32, 64, 128};
    int n = 0;
    for (int i = 0; i < 6; i++)
        for (int j = 0; j < 3; j++)
            if (packed * 32 == (int64_t)B[i] * G[j] * ngroups) {
                *bits = B[i];
                *group = G[j];
                n++;
            }
    if (n == 1) return NX_OK;
    return nx_fail(err, NX_E_FORMAT,
                   "tensor %s: cannot tell its bits/group size (%lld packed words, %lld groups per row%s)",
                   it->src_name, (long long)packed, (long long)ngroups,
                   n ? "; several widths fit and config.json does not say" : "; no supported width fits");
}

/* The geometry of gate_proj or up_proj from fused gate_up_proj experts (see SPLITS). */
static nx_status fused_derive(item *it, const nx_config *cfg, nx_error *err) {
    const int64_t F = cfg->expert_dim;
    if (!it->stacked || it->experts || it->out != 2 * F || it->in != cfg->hidden_size)
        return nx_fail(err, NX_E_FORMAT, "tensor %s: expected [experts, 2 x moe_intermediate_size %lld, hidden_size "
                                         "%lld] (each expert's gate rows, then its up rows)", it->parts[0].w->name,
                       (long long)(2 * F), (long long)cfg->hidden_size);
    it->blk_stride = 2 * F;
    it->blk_off = it->derive == DERIVE_UP ? F : 0;
    it->out = F;
    return NX_OK;
}

/* The geometry of one half of an MLA kv_b_proj or of fused experts (see SPLITS) from the source's. */
static nx_status item_derive(item *it, const nx_config *cfg, nx_error *err) {
    if (it->derive == DERIVE_GATE || it->derive == DERIVE_UP) return fused_derive(it, cfg, err);
    const int64_t nh = cfg->n_heads, nope = cfg->mla.qk_nope, v = cfg->mla.v_head_dim, r = cfg->mla.kv_lora_rank;
    const char *w = it->parts[0].w->name;
    if (it->stacked)
        return nx_fail(err, NX_E_FORMAT, "tensor %s: expected one [n_heads*(qk_nope_head_dim + v_head_dim), "
                                         "kv_lora_rank] matrix, got a stacked one", w);
    if (nh <= 0 || nope <= 0 || v <= 0 || it->out != nh * (nope + v))
        return nx_fail(err, NX_E_FORMAT,
                       "tensor %s: %lld rows do not split into num_attention_heads %lld heads of qk_nope_head_dim "
                       "%lld + v_head_dim %lld rows", w, (long long)it->out, (long long)nh, (long long)nope,
                       (long long)v);
    if (it->in != r)
        return nx_fail(err, NX_E_FORMAT, "tensor %s: input dim %lld is not kv_lora_rank %lld", w, (long long)it->in,
                       (long long)r);
    it->blk_stride = nope + v;
    it->per_part = it->mats = nh;
    it->stacked = true;
    if (it->derive == DERIVE_KT) {
        it->blk_off = 0;
        it->out = r;
        it->in = nope;
    } else {
        it->blk_off = nope;
        it->out = v;
    }
    return NX_OK;
}

/* FP8 sources (DeepSeek-V3's): every part's weight is an F8_E4M3 [out, in] matrix with F32
 * block scales X.weight_scale_inv [ceil(out/rows), ceil(in/cols)] for the config's
 * weight_block_size [rows, cols]; the last block of a row or column may be partial. */
static nx_status fp8_check(item *it, const int fp8_block[2], nx_error *err) {
    for (int64_t i = 0; i < it->n_parts; i++) {
        const nx_tensor *w = it->parts[i].w, *si = it->parts[i].si;
        if (w->dtype != NX_DTYPE_F8_E4M3) continue; /* the experts' dtype check names it */
        if (!fp8_block[0])
            return nx_fail(err, NX_E_FORMAT,
                           "tensor %s: F8_E4M3 weight, but config.json has no quantization_config "
                           "{\"quant_method\": \"fp8\", \"weight_block_size\": [rows, cols]}", w->name);
        if (w->n_dims != 2)
            return nx_fail(err, NX_E_FORMAT, "tensor %s: F8_E4M3 weight of %d dimensions (expected [out, in])",
                           w->name, w->n_dims);
        if (!si)
            return nx_fail(err, NX_E_FORMAT, "tensor %s: F8_E4M3 weight without its block scales %s_scale_inv", w->name,
                           w->name);
        const int64_t rb = (w->shape[0] + fp8_block[0] - 1) / fp8_block[0];
        const int64_t cb = (w->shape[1] + fp8_block[1] - 1) / fp8_block[1];
        if (si->dtype != NX_DTYPE_F32 || si->n_dims != 2 || si->shape[0] != rb || si->shape[1] != cb)
            return nx_fail(err, NX_E_FORMAT,
                           "tensor %s: %s [%lld, %lld%s], expected F32 [%lld, %lld] (the blocks of weight_block_size "
                           "[%d, %d] over %s [%lld, %lld])", si->name, nx_dtype_name(si->dtype),
                           (long long)si->shape[0], (long long)(si->n_dims > 1 ? si->shape[1] : 0),
                           si->n_dims == 2 ? "" : ", ...", (long long)rb, (long long)cb, fp8_block[0], fp8_block[1],
                           w->name, (long long)w->shape[0], (long long)w->shape[1]);
    }
    it->fbr = fp8_block[0];
    it->fbc = fp8_block[1];
    return NX_OK;
}

/* Checks the parts of one item and derives its geometry and source format. */
static nx_status item_resolve(item *it, const nx_config *cfg, const int fp8_block[2], nx_error *err) {
    for (int64_t i = 0; i < it->n_parts; i++) {
        const part *pt = &it->parts[i];
        if (!pt->w) {
            if (it->experts)
                return nx_fail(err, NX_E_FORMAT, "%s: expert %lld is missing (experts must be numbered 0..%lld)",
                               it->src_name, (long long)i, (long long)it->n_parts - 1);
            return nx_fail(err, NX_E_FORMAT, "tensor %s has no %s.weight",
                           pt->s ? pt->s->name : pt->b ? pt->b->name : pt->si->name, it->path);
        }
        if (pt->w->dtype == NX_DTYPE_F8_E5M2)
            return nx_fail(err, NX_E_UNSUPPORTED, "tensor %s: F8_E5M2 weights are not supported (FP8 sources must be "
                                                  "F8_E4M3 with block scales)", pt->w->name);
        if (pt->si && pt->w->dtype != NX_DTYPE_F8_E4M3)
            return nx_fail(err, NX_E_FORMAT, "tensor %s: block scales of weight %s, which is %s (only F8_E4M3 weights "
                                             "have them)", pt->si->name, pt->w->name, nx_dtype_name(pt->w->dtype));
        if (!pt->s != !pt->b)
            return nx_fail(err, NX_E_FORMAT, "tensor %s: %s.scales and %s.biases must come together", pt->w->name,
                           it->path, it->path);
    }
    const part *p0 = &it->parts[0];
    const nx_tensor *w = p0->w;
    bool quant = p0->s != NULL, fp8 = w->dtype == NX_DTYPE_F8_E4M3;
    /* a DeltaNet's depthwise conv1d is no Linear: mlx-lm leaves it float */
    it->conv = !quant && it->suffix && ends(it->path, ".linear_attn.conv1d");
    if (it->conv && (w->n_dims != 3 || (w->shape[1] != 1 && w->shape[2] != 1) || !is_float(w->dtype)))
        return nx_fail(err, NX_E_FORMAT, "tensor %s: expected a float [channels, 1, kernel] or [channels, kernel, 1] "
                                         "convolution weight", w->name);
    it->linear = quant || ((is_float(w->dtype) || fp8) && w->n_dims >= 2 && it->suffix && !it->conv);
    if (fp8 && (!it->linear || quant))
        return nx_fail(err, NX_E_FORMAT, "tensor %s: F8_E4M3 tensor that is not a linear weight", w->name);
    if (!it->linear) {
        if (it->experts || it->derive)
            return nx_fail(err, NX_E_FORMAT, "tensor %s: %s is not a matrix", w->name,
                           it->experts ? "per-expert tensor" : it->derive >= DERIVE_GATE ? "gate_up_proj" : "kv_b_proj");
        if (w->dtype == NX_DTYPE_U32 && w->n_dims >= 2)
            return nx_fail(err, NX_E_FORMAT, "tensor %s: U32 (quantized) weight without %s.scales", w->name, it->path);
        it->bytes = w->nbytes;
        it->copy = true;
        return NX_OK;
    }
    int nd = w->n_dims;
    if (nd != 2 && !(nd == 3 && !it->experts))
        return nx_fail(err, NX_E_FORMAT, "tensor %s: %d dimensions (expected [out, in]%s)", w->name, nd,
                       it->experts ? "" : " or stacked [experts, out, in]");
    it->per_part = nd == 3 ? w->shape[0] : 1;
    it->out = w->shape[nd - 2];
    it->wdtype = w->dtype;
    if (quant) {
        const nx_tensor *s = p0->s, *b = p0->b;
        if (w->dtype != NX_DTYPE_U32)
            return nx_fail(err, NX_E_FORMAT, "tensor %s: quantized weight must be U32, got %s", w->name,
                           nx_dtype_name(w->dtype));
        if (!is_float(s->dtype) || s->dtype != b->dtype)
            return nx_fail(err, NX_E_FORMAT, "tensors %s/%s: dtypes %s/%s (need one float dtype)", s->name, b->name,
                           nx_dtype_name(s->dtype), nx_dtype_name(b->dtype));
        if (s->n_dims != nd || b->n_dims != nd || memcmp(s->shape, b->shape, sizeof s->shape) != 0 ||
            memcmp(s->shape, w->shape, (size_t)(nd - 1) * sizeof *s->shape) != 0 || s->shape[nd - 1] <= 0)
            return nx_fail(err, NX_E_FORMAT, "tensors %s/%s: shapes do not match the packed weight %s", s->name,
                           b->name, w->name);
        nx_status st = source_quant(it, cfg, w->shape[nd - 1], s->shape[nd - 1], &it->sbits, &it->sgroup, err);
        if (st) return st;
        it->in = s->shape[nd - 1] * it->sgroup;
        it->sdtype = s->dtype;
    } else {
        it->in = w->shape[nd - 1];
        /* FP8 dequantizes to bf16 as mlx-lm's sanitize() does */
        it->sdtype = fp8 ? NX_DTYPE_BF16 : w->dtype;
        nx_status st = fp8 ? fp8_check(it, fp8_block, err) : NX_OK;
        if (st) return st;
    }
    if (it->out <= 0 || it->in <= 0 || it->per_part <= 0)
        return nx_fail(err, NX_E_FORMAT, "tensor %s: empty matrix", w->name);
    for (int64_t i = 1; i < it->n_parts; i++) {
        const part *pt = &it->parts[i];
        bool same = pt->w->dtype == w->dtype && pt->w->n_dims == nd &&
                    memcmp(pt->w->shape, w->shape, (size_t)nd * sizeof *w->shape) == 0 && !pt->s == !quant &&
                    (!quant || (pt->s->dtype == p0->s->dtype && pt->s->n_dims == nd &&
                                memcmp(pt->s->shape, p0->s->shape, (size_t)nd * sizeof *w->shape) == 0 &&
                                pt->b->dtype == p0->b->dtype &&
                                memcmp(pt->b->shape, p0->b->shape, (size_t)nd * sizeof *w->shape) == 0));
        if (!same)
            return nx_fail(err, NX_E_FORMAT, "tensor %s: dtype/shape differs from %s (experts must match to stack)",
                           pt->w->name, w->name);
    }
    it->mats = it->per_part * it->n_parts;
    it->stacked = nd == 3 || it->experts;
    it->blk_stride = it->out;
    it->blk_off = 0;
    it->src_in = it->in;
    return it->derive ? item_derive(it, cfg, err) : NX_OK;
}

/* Whether an item is a zero-centred RMSNorm weight of a hybrid family: every norm (input_layernorm,
 * post_attention_layernorm, q_norm, k_norm, the final norm, the head's) but the DeltaNet's own
 * gated norm, which scales by a plain w. */
static bool is_zc_norm(const item *it) {
    const nx_tensor *w = it->parts[0].w;
    if (it->linear || !it->suffix || w->n_dims != 1 || !is_float(w->dtype)) return false;
    const char *last = strrchr(it->path, '.');
    return strstr(last ? last + 1 : it->path, "norm") && !ends(it->path, ".linear_attn.norm");
}

/* A hybrid family's zero-centred norms are stored as w in the HF layout and as 1 + w in mlx-lm's,
 * which the loader and the reference tell apart by the trunk's conv1d shape ([C, K, 1]: folded,
 * mlx-lm's own test) and by a head's expert naming (stacked: folded). What is written has both
 * marks of mlx-lm's form (conv1d [C, K, 1], switch_mlp experts), so the norms of a part whose
 * source stores w get the +1. */
static void mark_plus1(plan *p, const nx_family *fam) {
    if (!fam->hybrid.norm_plus1) return;
    bool conv_out = false, conv_folded = false, head_out = false, head_folded = false;
    for (size_t i = 0; i < p->n; i++) {
        const item *it = &p->it[i];
        if (it->conv && !it->mtp) {
            const nx_tensor *w = it->parts[0].w;
            conv_out = true;
            conv_folded |= w->shape[2] == 1 && w->shape[1] > 1;
        }
        if (it->mtp && ends(it->path, ".mlp.switch_mlp.gate_proj")) {
            head_out = true;
            head_folded |= !it->experts && !it->derive;
        }
    }
    for (size_t i = 0; i < p->n; i++) {
        item *it = &p->it[i];
        if (is_zc_norm(it)) it->plus1 = it->mtp ? head_out && !head_folded : conv_out && !conv_folded;
    }
}

/* Output precision of a linear item: bits == 0 keeps it float in fd (NX_DTYPE_COUNT: the
 * source's float dtype). Sets copy when the stored bytes can be reused unchanged. */
static void item_decide(item *it, int bits, int group, nx_dtype fd) {
    if (!it->linear) return;
    it->bits = bits;
    it->group = bits ? group : 0;
    if (bits) {
        it->odtype = it->sdtype;
        it->copy = !it->derive && it->sbits == bits && it->sgroup == group;
        uint64_t row = (uint64_t)it->in * (uint64_t)bits / 8 + 2 * (uint64_t)(it->in / group) * nx_dtype_size(it->odtype);
        it->bytes = (uint64_t)it->mats * (uint64_t)it->out * row;
    } else {
        it->odtype = fd != NX_DTYPE_COUNT ? fd : it->sdtype;
        it->copy = !it->derive && it->sbits == 0 && it->wdtype == it->odtype;
        it->bytes = (uint64_t)it->mats * (uint64_t)it->out * (uint64_t)it->in * nx_dtype_size(it->odtype);
    }
}

/* Whether module path is module m of a layer (".m" ends it). */
static bool is_layer_module(const char *path, const char *m) {
    size_t pl = strlen(path), ml = m ? strlen(m) : 0;
    return m && pl > ml && path[pl - ml - 1] == '.' && ends(path, m);
}

/* Whether module path is a router gate (as the family's MLX layout names it). */
static bool is_router(const nx_family *fam, const char *path) { return is_layer_module(path, fam->names.mlx_router); }

/* Whether the family's mlx-lm recipe gives module path the router's precision: the router, and
 * the shared expert's scalar gate where there is one (Qwen's quant_predicate: both at 8 bits). */
static bool router_recipe(const nx_family *fam, const char *path) {
    return is_router(fam, path) || is_layer_module(path, fam->names.shared_gate);
}

/* Applies the defaults (given), the router recipe and the user's rules, then the group check. */
static void item_choose(item *it, int bits, int group, const nx_family *recipe, const nx_quant_rule *rules, size_t n_rules,
                        const nx_convert_hooks *h) {
    nx_dtype fd = NX_DTYPE_COUNT;
    /* the family's mlx-lm recipe for the router: small, and it decides which experts run */
    if (recipe && bits && router_recipe(recipe, it->path)) {
        bits = recipe->names.router_bits;
        group = 64;
    }
    for (size_t r = 0; r < n_rules; r++) {
        if (fnmatch(rules[r].pattern, it->path, 0) != 0) continue;
        if (rules[r].bits) {
            group = rules[r].group ? rules[r].group : group ? group : 64;
        }
        bits = rules[r].bits;
        fd = rules[r].dtype;
    }
    /* mlx-lm skips modules whose input dim the group does not divide */
    if (bits && (it->derive || bits != it->sbits || group != it->sgroup) && it->in % group != 0) {
        note(h, "%s stays float: its input dim %lld is not divisible by the group size %d", it->path,
             (long long)it->in, group);
        bits = 0;
    }
    item_decide(it, bits, group, fd);
}

/* ================================================================ writing */

typedef struct progress {
    const nx_convert_hooks *h;
    uint64_t done, total;
    nx_pool *pool;
} progress;

static void progress_add(progress *p, uint64_t n) {
    p->done += n;
    if (p->h && p->h->progress) p->h->progress(p->h->user, p->done, p->total);
}

static nx_status pwrite_all(int fd, const void *buf, size_t n, uint64_t off, const char *path, nx_error *err) {
    const uint8_t *b = buf;
    while (n) {
        size_t k = n > ((size_t)1 << 30) ? (size_t)1 << 30 : n;
        ssize_t w = pwrite(fd, b, k, (off_t)off);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return nx_fail(err, NX_E_IO, "%s: write failed: %s", path, strerror(errno ? errno : EIO));
        b += w;
        n -= (size_t)w;
        off += (uint64_t)w;
    }
    return NX_OK;
}

/* The view of the source rows of matrix k of an item as an nx_linear over its source tensors
 * (DERIVE_KT: the `in` rows it transposes). */
static nx_linear item_view(const item *it, int64_t k) {
    const part *pt = &it->parts[k / it->per_part];
    const size_t row0 = (size_t)((k % it->per_part) * it->blk_stride + it->blk_off);
    nx_linear L = {.dtype = it->wdtype, .out = it->derive == DERIVE_KT ? it->in : it->out, .in = it->src_in};
    if (it->sbits) {
        size_t wrow = (size_t)it->src_in * (size_t)it->sbits / 8;
        size_t srow = (size_t)(it->src_in / it->sgroup) * nx_dtype_size(it->sdtype);
        L.w = pt->w->data + row0 * wrow;
        L.bits = it->sbits;
        L.group = it->sgroup;
        L.sdtype = it->sdtype;
        L.scales = pt->s->data + row0 * srow;
        L.biases = pt->b->data + row0 * srow;
    } else {
        L.w = pt->w->data + row0 * (size_t)it->src_in * nx_dtype_size(it->wdtype);
    }
    return L;
}

typedef struct conv_job {
    const item *it;
    nx_linear L;
    const part *pt;       /* FP8: the source part and the row of the view's row 0 in it */
    int64_t row0;
    int64_t r0, r1;       /* rows of this chunk */
    uint8_t *w, *s, *b;   /* chunk outputs */
    size_t wrow, srow;    /* output bytes per row */
    bool oom, nonfinite;
} conv_job;

/* The 256 values of FP8 E4M3 (OCP "e4m3fn"): 1 sign, 4 exponent bits with bias 7, 3 mantissa
 * bits; exponent 0 is subnormal (m/8 · 2^-6); S.1111.111 is NaN, there are no infinities (the
 * largest value is 448). */
static void fp8_e4m3_table(float t[256]) {
    for (int b = 0; b < 256; b++) {
        const int e = (b >> 3) & 15, m = b & 7;
        const float v = e == 15 && m == 7 ? NAN
                        : e               ? ldexpf(1.0f + (float)m / 8.0f, e - 7)
                                          : ldexpf((float)m / 8.0f, -6);
        t[b] = b & 0x80 ? -v : v;
    }
}

/* Row r of job j's view as floats. An FP8 row is each code's value times the scale of its
 * block (one f32 product, exact before any rounding to the output dtype); false if a value is
 * not finite (a NaN code or a bad scale). */
static bool src_row(const conv_job *j, const float *f8, int64_t r, float *out) {
    const item *it = j->it;
    if (it->wdtype != NX_DTYPE_F8_E4M3) {
        nx_linear_get_row(&j->L, r, out);
        return true;
    }
    const int64_t sr = j->row0 + r, n = it->src_in, nb = (n + it->fbc - 1) / it->fbc;
    const uint8_t *q = j->pt->w->data + (size_t)sr * (size_t)n;
    const uint8_t *sc = j->pt->si->data + (size_t)(sr / it->fbr) * (size_t)nb * sizeof(float);
    bool ok = true;
    for (int64_t b = 0; b < nb; b++) {
        float s;
        memcpy(&s, sc + (size_t)b * sizeof s, sizeof s); /* the mapping may be unaligned */
        const int64_t c1 = (b + 1) * it->fbc < n ? (b + 1) * it->fbc : n;
        for (int64_t c = b * it->fbc; c < c1; c++) {
            out[c] = f8[q[c]] * s;
            ok &= isfinite(out[c]) != 0;
        }
    }
    return ok;
}

static void conv_worker(void *arg, int ith, int nth) {
    conv_job *j = arg;
    const item *it = j->it;
    long long a, e;
    nx_pool_split(j->r1 - j->r0, ith, nth, &a, &e);
    if (a >= e) return;
    /* DERIVE_KT: output row c is column c of the view's rows, decoded once per job and worker */
    const bool kt = it->derive == DERIVE_KT;
    float f8[256];
    if (it->wdtype == NX_DTYPE_F8_E4M3) fp8_e4m3_table(f8);
    bool ok = true;
    float *row = malloc((size_t)it->in * sizeof *row);
    float *blk = kt ? malloc((size_t)(it->in * it->src_in) * sizeof *blk) : NULL;
    if (!row || (kt && !blk)) {
        free(row);
        free(blk);
        j->oom = true;
        return;
    }
    for (int64_t k = 0; kt && k < it->in; k++) ok &= src_row(j, f8, k, blk + k * it->src_in);
    for (long long i = a; i < e; i++) {
        if (kt)
            for (int64_t k = 0; k < it->in; k++) row[k] = blk[k * it->src_in + j->r0 + i];
        else
            ok &= src_row(j, f8, j->r0 + i, row);
        if (it->bits)
            nx_quantize_row(row, it->in, it->bits, it->group, it->odtype, (uint32_t *)(void *)(j->w + (size_t)i * j->wrow),
                            j->s + (size_t)i * j->srow, j->b + (size_t)i * j->srow);
        else
            nx_store_floats(it->odtype, row, j->w + (size_t)i * j->wrow, it->in);
    }
    if (!ok) j->nonfinite = true;
    free(row);
    free(blk);
}

/* Writes 1 + w for a norm weight w (a float vector) in its dtype, as mlx-lm's sanitize() folds it. */
static nx_status write_plus1(const nx_tensor *w, int fd, uint64_t off, const char *path, nx_error *err) {
    const int64_t n = w->shape[0];
    float *f = malloc((size_t)n * sizeof *f);
    uint8_t *b = malloc(w->nbytes);
    nx_status st = NX_OK;
    if (!f || !b) {
        st = nx_fail(err, NX_E_NOMEM, "out of memory converting %s", w->name);
    } else {
        nx_to_f32(w->dtype, w->data, f, n);
        for (int64_t i = 0; i < n; i++) f[i] += 1.0f;
        nx_store_floats(w->dtype, f, b, n);
        st = pwrite_all(fd, b, w->nbytes, off, path, err);
    }
    free(f);
    free(b);
    return st;
}

/* Writes the data of one item at data offset `base` of the open file. */
static nx_status item_write(const item *it, int fd, uint64_t base, const char *path, progress *pg, nx_error *err) {
    nx_status st = NX_OK;
    if (!it->linear) {
        const nx_tensor *w = it->parts[0].w;
        st = it->plus1 ? write_plus1(w, fd, base + it->off[0], path, err)
                       : pwrite_all(fd, w->data, w->nbytes, base + it->off[0], path, err);
        if (!st) progress_add(pg, it->bytes);
        return st;
    }
    if (it->copy) { /* stacking per-expert tensors is a byte concatenation */
        uint64_t pos[3] = {0, 0, 0};
        for (int64_t i = 0; i < it->n_parts && !st; i++) {
            const nx_tensor *t[3] = {it->parts[i].w, it->parts[i].s, it->parts[i].b};
            for (int k = 0; k < (it->bits ? 3 : 1) && !st; k++) {
                st = pwrite_all(fd, t[k]->data, t[k]->nbytes, base + it->off[k] + pos[k], path, err);
                pos[k] += t[k]->nbytes;
                if (!st) progress_add(pg, t[k]->nbytes);
            }
        }
        return st;
    }
    size_t es = nx_dtype_size(it->odtype);
    size_t wrow = it->bits ? (size_t)it->in * (size_t)it->bits / 8 : (size_t)it->in * es;
    size_t srow = it->bits ? (size_t)(it->in / it->group) * es : 0;
    int64_t rows = (int64_t)(CHUNK_BYTES / (wrow + 2 * srow));
    if (rows < 1) rows = 1;
    if (rows > it->out) rows = it->out;
    uint8_t *wb = malloc((size_t)rows * wrow), *sb = srow ? malloc((size_t)rows * srow) : NULL,
            *bb = srow ? malloc((size_t)rows * srow) : NULL;
    if (!wb || (srow && (!sb || !bb))) {
        st = nx_fail(err, NX_E_NOMEM, "out of memory converting %s", it->path);
        goto done;
    }
    for (int64_t k = 0; k < it->mats && !st; k++) {
        conv_job j = {.it = it, .L = item_view(it, k), .pt = &it->parts[k / it->per_part],
                      .row0 = (k % it->per_part) * it->blk_stride + it->blk_off, .w = wb, .s = sb, .b = bb,
                      .wrow = wrow, .srow = srow};
        for (int64_t r0 = 0; r0 < it->out && !st; r0 += rows) {
            j.r0 = r0;
            j.r1 = r0 + rows < it->out ? r0 + rows : it->out;
            nx_pool_run(pg->pool, conv_worker, &j);
            if (j.oom) {
                st = nx_fail(err, NX_E_NOMEM, "out of memory converting %s", it->path);
                break;
            }
            if (j.nonfinite) {
                st = nx_fail(err, NX_E_FORMAT, "tensor %s: a value that is not finite after dequantization (an E4M3 "
                                               "NaN code 0x7f/0xff or a non-finite block scale in %s_scale_inv)",
                             j.pt->w->name, j.pt->w->name);
                break;
            }
            size_t n = (size_t)(j.r1 - r0);
            uint64_t row0 = (uint64_t)k * (uint64_t)it->out + (uint64_t)r0;
            st = pwrite_all(fd, wb, n * wrow, base + it->off[0] + row0 * wrow, path, err);
            if (!st && srow) st = pwrite_all(fd, sb, n * srow, base + it->off[1] + row0 * srow, path, err);
            if (!st && srow) st = pwrite_all(fd, bb, n * srow, base + it->off[2] + row0 * srow, path, err);
            if (!st) progress_add(pg, n * (wrow + 2 * srow));
        }
    }
done:
    free(wb);
    free(sb);
    free(bb);
    return st;
}

static json_t *shape_json(const item *it, int64_t last) {
    json_t *a = json_array();
    if (it->stacked) json_array_append_new(a, json_integer(it->mats));
    json_array_append_new(a, json_integer(it->out));
    json_array_append_new(a, json_integer(last));
    return a;
}

static void add_entry(json_t *root, const char *name, nx_dtype dt, json_t *shape, uint64_t off, uint64_t n) {
    json_t *e = json_object();
    json_object_set_new(e, "dtype", json_string(nx_dtype_name(dt)));
    json_object_set_new(e, "shape", shape);
    json_object_set_new(e, "data_offsets", json_pack("[II]", (json_int_t)off, (json_int_t)(off + n)));
    json_object_set_new(root, name, e);
}

/* Bytes and dtype of part k of an item's output (0: the weight; 1, 2: its scales, biases). */
static uint64_t part_bytes(const item *it, int k, nx_dtype *dt) {
    const uint64_t rows = (uint64_t)it->mats * (uint64_t)it->out;
    *dt = it->odtype;
    if (!it->linear) {
        *dt = it->parts[0].w->dtype;
        return it->parts[0].w->nbytes;
    }
    if (!it->bits) return rows * (uint64_t)it->in * nx_dtype_size(it->odtype);
    if (k > 0) return rows * (uint64_t)(it->in / it->group) * nx_dtype_size(it->odtype);
    *dt = NX_DTYPE_U32;
    return rows * (uint64_t)it->in * (uint64_t)it->bits / 8;
}

/* The shape of part k of an item's output, as part_bytes counts it. */
static json_t *part_shape(const item *it, int k) {
    if (!it->linear) {
        const nx_tensor *t = it->parts[0].w;
        json_t *sh = json_array();
        for (int d = 0; d < t->n_dims; d++) json_array_append_new(sh, json_integer(t->shape[d]));
        /* conv1d [C, 1, K] → [C, K, 1] (mlx-lm's moveaxis): the same bytes, one axis is 1 */
        if (it->conv && t->shape[1] == 1) {
            json_array_set_new(sh, 1, json_integer(t->shape[2]));
            json_array_set_new(sh, 2, json_integer(1));
        }
        return sh;
    }
    if (!it->bits) return shape_json(it, it->in);
    return shape_json(it, k > 0 ? it->in / it->group : it->in * it->bits / 32);
}

/* Output tensor names of an item (1 or 3): the weight, then its scales and biases. */
static int item_names(const item *it, char names[3][NAME_CAP]) {
    if (!it->linear) {
        snprintf(names[0], NAME_CAP, "%s%s", it->path, it->suffix ? ".weight" : "");
        return 1;
    }
    snprintf(names[0], NAME_CAP, "%s.weight", it->path);
    if (!it->bits) return 1;
    snprintf(names[1], NAME_CAP, "%s.scales", it->path);
    snprintf(names[2], NAME_CAP, "%s.biases", it->path);
    return 3;
}

/* Writes the safetensors file dir/fname + ".partial" from the items assigned to `file`;
 * adds each tensor to weight_map (if non-NULL). */
static nx_status file_write(const char *dir, const char *fname, plan *p, int file, json_t *weight_map, progress *pg,
                            nx_error *err) {
    char path[PATH_CAP];
    snprintf(path, sizeof path, "%s/%s.partial", dir, fname);
    nx_status st = NX_OK;
    int fd = -1;
    char *hdr = NULL;
    json_t *root = json_object();
    json_object_set_new(root, "__metadata__", json_pack("{ss}", "format", "mlx"));
    uint64_t off = 0;
    /* Tensor data begins on a 64-byte boundary (the header is padded to it) and the tensors whose
     * sizes are whole cache lines come first, so every quantized weight, scale and bias tensor of
     * such a size starts on a cache line: the kernels' 64-byte loads of its rows never straddle
     * two lines. The format allows no gaps between tensors, so the order does the aligning. */
    for (int pass = 0; pass < 2; pass++)
        for (size_t i = 0; i < p->n; i++) {
            item *it = &p->it[i];
            if (it->file != file) continue;
            char names[3][NAME_CAP];
            const int n = item_names(it, names);
            for (int k = 0; k < n; k++) {
                nx_dtype dt;
                const uint64_t nb = part_bytes(it, k, &dt);
                if ((nb % 64 == 0) != (pass == 0)) continue;
                it->off[k] = off;
                add_entry(root, names[k], dt, part_shape(it, k), off, nb);
                off += nb;
                if (weight_map) json_object_set_new(weight_map, names[k], json_string(fname));
            }
        }
    hdr = json_dumps(root, JSON_COMPACT | JSON_PRESERVE_ORDER);
    if (!hdr) {
        st = nx_fail(err, NX_E_NOMEM, "%s: cannot build the header", path);
        goto fail;
    }
    size_t hlen = strlen(hdr), pad = (64 - (8 + hlen) % 64) % 64; /* tensor data 64-aligned */
    uint8_t head[8];
    for (int i = 0; i < 8; i++) head[i] = (uint8_t)((uint64_t)(hlen + pad) >> (8 * i));
    fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        st = nx_fail(err, NX_E_IO, "%s: cannot create: %s", path, strerror(errno));
        goto fail;
    }
    char spaces[64];
    memset(spaces, ' ', sizeof spaces);
    if ((st = pwrite_all(fd, head, 8, 0, path, err)) || (st = pwrite_all(fd, hdr, hlen, 8, path, err)) ||
        (st = pwrite_all(fd, spaces, pad, 8 + hlen, path, err)))
        goto fail;
    uint64_t base = 8 + hlen + pad;
    for (size_t i = 0; i < p->n && !st; i++)
        if (p->it[i].file == file) st = item_write(&p->it[i], fd, base, path, pg, err);
    if (!st && ftruncate(fd, (off_t)(base + off)) != 0)
        st = nx_fail(err, NX_E_IO, "%s: %s", path, strerror(errno));
    /* On disk before it is renamed into place (a crash cannot leave a complete-looking but
     * empty file), then out of the page cache: the first load reads it back fresh, which lets a
     * file system that caches in large folios map the weights with 2 MB pages (pages cached
     * by the writes stay 4 KB ones). */
#if defined(__APPLE__) /* no fdatasync or posix_fadvise there */
    if (!st && fsync(fd) != 0) st = nx_fail(err, NX_E_IO, "%s: cannot flush: %s", path, strerror(errno));
#else
    if (!st && fdatasync(fd) != 0) st = nx_fail(err, NX_E_IO, "%s: cannot flush: %s", path, strerror(errno));
    if (!st) (void)posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
#endif
fail:
    if (fd >= 0 && close(fd) != 0 && !st) st = nx_fail(err, NX_E_IO, "%s: close failed: %s", path, strerror(errno));
    free(hdr);
    json_decref(root);
    return st;
}

/* ================================================================ files around the tensors */

static nx_status copy_file(const char *from, const char *to, nx_error *err) {
    nx_status st = NX_OK;
    int in = open(from, O_RDONLY | O_CLOEXEC), out = -1;
    char *buf = NULL;
    if (in < 0) return nx_fail(err, NX_E_IO, "%s: cannot open: %s", from, strerror(errno));
    out = open(to, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (out < 0) {
        st = nx_fail(err, NX_E_IO, "%s: cannot create: %s", to, strerror(errno));
        goto done;
    }
    size_t cap = (size_t)1 << 20;
    if (!(buf = malloc(cap))) {
        st = nx_fail(err, NX_E_NOMEM, "out of memory");
        goto done;
    }
    uint64_t off = 0;
    for (;;) {
        ssize_t n = read(in, buf, cap);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) {
            st = nx_fail(err, NX_E_IO, "%s: read failed: %s", from, strerror(errno));
            break;
        }
        if (n == 0) break;
        if ((st = pwrite_all(out, buf, (size_t)n, off, to, err))) break;
        off += (uint64_t)n;
    }
done:
    free(buf);
    if (out >= 0 && close(out) != 0 && !st) st = nx_fail(err, NX_E_IO, "%s: close failed", to);
    close(in);
    return st;
}

static bool file_exists(const char *dir, const char *name) {
    char p[PATH_CAP];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    struct stat sb;
    return stat(p, &sb) == 0 && S_ISREG(sb.st_mode);
}

static bool is_model_file(const char *n) {
    return (starts(n, "model") && (ends(n, ".safetensors") || ends(n, ".safetensors.partial"))) || !strcmp(n, INDEX);
}

/* Prepares an output directory: created if missing; one that already holds model files is
 * refused unless `force`, in which case those files (only) are removed. */
static nx_status prepare_dir(const char *dst, bool force, nx_error *err) {
    struct stat sb;
    if (stat(dst, &sb) != 0) {
        if (mkdir(dst, 0755) != 0) return nx_fail(err, NX_E_IO, "%s: cannot create directory: %s", dst, strerror(errno));
        return NX_OK;
    }
    if (!S_ISDIR(sb.st_mode)) return nx_fail(err, NX_E_ARG, "%s exists and is not a directory", dst);
    DIR *d = opendir(dst);
    if (!d) return nx_fail(err, NX_E_IO, "%s: %s", dst, strerror(errno));
    struct dirent *de;
    nx_status st = NX_OK;
    while ((de = readdir(d)) && !st) {
        if (!is_model_file(de->d_name)) continue;
        if (!force) {
            st = nx_fail(err, NX_E_ARG, "%s already holds a checkpoint (%s); use --force to replace it", dst, de->d_name);
            break;
        }
        char p[PATH_CAP];
        snprintf(p, sizeof p, "%s/%s", dst, de->d_name);
        if (unlink(p) != 0) st = nx_fail(err, NX_E_IO, "%s: cannot remove: %s", p, strerror(errno));
    }
    closedir(d);
    return st;
}

static bool same_dir(const char *a, const char *b) {
    struct stat sa, sb;
    return stat(a, &sa) == 0 && stat(b, &sb) == 0 && sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

static nx_status rename_partial(const char *dir, const char *name, nx_error *err) {
    char a[PATH_CAP], b[PATH_CAP];
    snprintf(a, sizeof a, "%s/%s.partial", dir, name);
    snprintf(b, sizeof b, "%s/%s", dir, name);
    if (rename(a, b) != 0) return nx_fail(err, NX_E_IO, "%s: cannot rename to %s: %s", a, b, strerror(errno));
    return NX_OK;
}

static nx_status json_write(json_t *j, const char *dir, const char *name, nx_error *err) {
    char p[PATH_CAP];
    snprintf(p, sizeof p, "%s/%s.partial", dir, name);
    if (json_dump_file(j, p, JSON_INDENT(4) | JSON_SORT_KEYS) != 0)
        return nx_fail(err, NX_E_IO, "%s: cannot write", p);
    return NX_OK;
}

/* The quantization block for the linear items of `p` (those passing `sel`) merged into q:
 * overrides for modules whose precision differs from the global one, `false` for float. */
static void quant_overrides(json_t *q, const plan *p, int gbits, int ggroup, bool only_mtp) {
    for (size_t i = 0; i < p->n; i++) {
        const item *it = &p->it[i];
        if (!it->linear || (only_mtp && !it->mtp) || it->file < 0) continue;
        if (!it->bits)
            json_object_set_new(q, it->path, json_false());
        else if (it->bits != gbits || it->group != ggroup)
            json_object_set_new(q, it->path, json_pack("{sisi}", "group_size", it->group, "bits", it->bits));
    }
}

static void quant_set(json_t *cfg, json_t *q) {
    json_object_set(cfg, "quantization", q);
    json_object_set_new(cfg, "quantization_config", json_deep_copy(q));
}

/* The object of config.json holding the language model's keys: a wrapper's text_config, else the root. */
static json_t *lm_config(json_t *root, const nx_family *fam) {
    json_t *tc = fam->text_config ? json_object_get(root, fam->text_config) : NULL;
    return json_is_object(tc) ? tc : root;
}

/* The config key declaring the MTP layers (num_nextn_predict_layers, Qwen3.5's mtp_num_hidden_layers). */
static const char *nextn_key(const nx_family *fam) {
    return fam->keys.n_nextn && fam->keys.n_nextn[0] ? fam->keys.n_nextn[0] : "num_nextn_predict_layers";
}

static void set_nextn(json_t *root, const nx_family *fam, int n) {
    json_object_set_new(lm_config(root, fam), nextn_key(fam), json_integer(n));
}

static void stats_fill(nx_convert_stats *s, const plan *p, const nx_family *fam) {
    for (size_t i = 0; i < p->n; i++) {
        const item *it = &p->it[i];
        if (it->file < 0) continue;
        s->dst_bytes += it->bytes;
        s->n_tensors += it->linear && it->bits ? 3 : 1;
        if (it->linear) {
            if (it->bits) s->n_quantized++;
            else s->n_float++;
        }
        /* the two halves of a split read one source tensor: counted once */
        for (int64_t k = 0; k < it->n_parts && !derive_rereads(it->derive); k++) {
            const part *pt = &it->parts[k];
            s->src_bytes += pt->w->nbytes + (pt->s ? pt->s->nbytes + pt->b->nbytes : 0);
            s->src_bytes += pt->si ? pt->si->nbytes : 0;
        }
        if (it->mtp) {
            s->has_mtp = true;
            if (is_router(fam, it->path)) s->mtp_experts = (int32_t)it->out;
        }
    }
}

/* ================================================================ convert */

void nx_convert_opts_default(nx_convert_opts *o) {
    memset(o, 0, sizeof *o);
    o->bits = 4;
    o->group = 64;
}

/* An FP8 source's quantization_config (DeepSeek's: {"quant_method": "fp8", "fmt": "e4m3",
 * "weight_block_size": [rows, cols], ...}): its block size into fp8_block (else {0, 0}), and the
 * block removed from root, as the runtime refuses it and nothing of it is written. */
static nx_status fp8_config(json_t *root, const char *path, int fp8_block[2], nx_error *err) {
    static const char *const keys[] = {"quantization_config", "quantization"};
    fp8_block[0] = fp8_block[1] = 0;
    for (size_t k = 0; k < 2; k++) {
        json_t *q = json_object_get(root, keys[k]);
        json_t *m = json_object_get(q, "quant_method");
        if (!json_is_string(m) || strcmp(json_string_value(m), "fp8") != 0) continue;
        json_t *fmt = json_object_get(q, "fmt"), *bs = json_object_get(q, "weight_block_size");
        if (fmt && (!json_is_string(fmt) || strcmp(json_string_value(fmt), "e4m3") != 0))
            return nx_fail(err, NX_E_UNSUPPORTED, "%s: %s.fmt is not \"e4m3\" (the only FP8 format supported)", path,
                           keys[k]);
        json_t *r = json_array_get(bs, 0), *c = json_array_get(bs, 1);
        if (json_array_size(bs) != 2 || !json_is_integer(r) || !json_is_integer(c) || json_integer_value(r) < 1 ||
            json_integer_value(c) < 1 || json_integer_value(r) > 65536 || json_integer_value(c) > 65536)
            return nx_fail(err, NX_E_CONFIG, "%s: %s.weight_block_size must be [rows, cols] (1..65536; per-tensor FP8 "
                                             "scales are not supported)", path, keys[k]);
        fp8_block[0] = (int)json_integer_value(r);
        fp8_block[1] = (int)json_integer_value(c);
        json_object_del(root, keys[k]);
    }
    return NX_OK;
}

/* partial: shards the index names may be missing (nx_store_open_partial). fp8_block: the FP8
 * source's block size ({0, 0}: none). */
static nx_status open_checkpoint(const char *dir, bool partial, nx_config *cfg, nx_store **st, json_t **cfg_json,
                                 int fp8_block[2], nx_error *err) {
    char p[PATH_CAP];
    struct stat sb;
    if (stat(dir, &sb) != 0) return nx_fail(err, NX_E_IO, "%s: %s", dir, strerror(errno));
    if (!S_ISDIR(sb.st_mode)) return nx_fail(err, NX_E_ARG, "%s is not a checkpoint directory", dir);
    snprintf(p, sizeof p, "%s/config.json", dir);
    if (stat(p, &sb) != 0) return nx_fail(err, NX_E_IO, "%s: %s", p, strerror(errno));
    json_error_t je;
    json_t *root = json_load_file(p, JSON_REJECT_DUPLICATES, &je);
    if (!root) return nx_fail(err, NX_E_CONFIG, "%s: not valid JSON (%s, line %d)", p, je.text, je.line);
    char *text = NULL;
    nx_status s = fp8_config(root, p, fp8_block, err);
    if (!s && !(text = json_dumps(root, JSON_COMPACT))) s = nx_fail(err, NX_E_NOMEM, "out of memory");
    if (!s) s = nx_config_parse(text, strlen(text), p, cfg, err);
    free(text);
    if (!s && (s = (partial ? nx_store_open_partial : nx_store_open)(dir, st, err))) nx_config_free(cfg);
    if (!s && cfg_json) *cfg_json = root;
    else json_decref(root);
    return s;
}

static const char *const AUX_FILES[] = {"tokenizer.json", "tokenizer_config.json", "generation_config.json",
                                        "special_tokens_map.json", "chat_template.jinja", "chat_template.json"};

nx_status nx_convert(const char *src, const char *dst, const nx_convert_opts *o, nx_convert_stats *stats,
                     nx_error *err) {
    nx_convert_opts def;
    if (!o) {
        nx_convert_opts_default(&def);
        o = &def;
    }
    if (stats) memset(stats, 0, sizeof *stats);
    if (o->bits && !nx_quant_supported(o->bits, o->group))
        return nx_fail(err, NX_E_ARG, "unsupported quantization %d-bit group %d (bits: 2,3,4,5,6,8; group: 32,64,128)",
                       o->bits, o->group);
    int mgroup = o->mtp_group ? o->mtp_group : o->group ? o->group : 64;
    if (!nx_quant_supported(o->mtp_bits ? o->mtp_bits : 8, mgroup))
        return nx_fail(err, NX_E_ARG, "unsupported head quantization %d-bit group %d", o->mtp_bits, mgroup);
    for (size_t r = 0; r < o->n_rules; r++)
        if (o->rules[r].bits && !nx_quant_supported(o->rules[r].bits, o->rules[r].group ? o->rules[r].group : 64))
            return nx_fail(err, NX_E_ARG, "rule %s: unsupported %d-bit group %d", o->rules[r].pattern,
                           o->rules[r].bits, o->rules[r].group);
    if (same_dir(src, dst)) return nx_fail(err, NX_E_ARG, "%s: the destination is the source directory", dst);

    nx_config cfg = {0};
    nx_store *st = NULL;
    json_t *cj = NULL, *wm = NULL, *idx = NULL, *q = NULL;
    plan p = {0};
    nx_pool *pool = NULL;
    int fp8_block[2];
    nx_status s = open_checkpoint(src, false, &cfg, &st, &cj, fp8_block, err);
    if (s) return s;
    if ((s = plan_collect(&p, cfg.family, st, cfg.n_layers, o->no_mtp ? WANT_TRUNK : WANT_ALL, &o->hooks, err))) goto fail;
    if (p.n == 0) {
        s = nx_fail(err, NX_E_FORMAT, "%s: no tensors", src);
        goto fail;
    }

    /* precisions and files: the trunk in shards of at most shard_bytes, the head in the sidecar */
    uint64_t shard = o->shard_bytes ? o->shard_bytes : DEFAULT_SHARD, cur = 0, total = 0;
    int n_trunk = 0;
    bool any_mtp = false;
    for (size_t i = 0; i < p.n; i++) {
        item *it = &p.it[i];
        if ((s = item_resolve(it, &cfg, fp8_block, err))) goto fail;
        if (it->mtp) {
            int b = o->mtp_bits ? o->mtp_bits : is_mtp_fc(cfg.family, it->path) ? 0 : 8;
            item_choose(it, b, mgroup, cfg.family, o->rules, o->n_rules, &o->hooks);
            it->file = 1 << 30;
            any_mtp = true;
        } else {
            item_choose(it, o->bits, o->group, cfg.family, o->rules, o->n_rules, &o->hooks);
            if (n_trunk == 0 || (cur > 0 && cur + it->bytes > shard)) {
                n_trunk++;
                cur = 0;
            }
            cur += it->bytes;
            it->file = n_trunk - 1;
        }
        total += it->bytes;
    }
    mark_plus1(&p, cfg.family);
    if ((s = prepare_dir(dst, o->force, err))) goto fail;
    pool = nx_pool_new(0);
    progress pg = {.h = &o->hooks, .total = total, .pool = pool};
    wm = json_object();
    char fname[64];
    for (int f = 0; f < n_trunk; f++) {
        if (n_trunk == 1) snprintf(fname, sizeof fname, "model.safetensors");
        else snprintf(fname, sizeof fname, "model-%05d-of-%05d.safetensors", f + 1, n_trunk);
        if ((s = file_write(dst, fname, &p, f, wm, &pg, err))) goto fail;
    }
    if (any_mtp && (s = file_write(dst, SIDECAR, &p, 1 << 30, wm, &pg, err))) goto fail;

    /* config.json: the quantization block follows what was written */
    int gbits = o->bits, ggroup = o->group;
    for (size_t i = 0; i < p.n && !gbits; i++)
        if (p.it[i].linear && p.it[i].bits) gbits = p.it[i].bits, ggroup = p.it[i].group;
    json_object_del(cj, "quantization");
    json_object_del(cj, "quantization_config");
    if (gbits) {
        q = json_pack("{sisiss}", "group_size", ggroup, "bits", gbits, "mode", "affine");
        quant_overrides(q, &p, gbits, ggroup, false);
        quant_set(cj, q);
    }
    if (!any_mtp) set_nextn(cj, cfg.family, 0);
    idx = json_pack("{s{sIss}sO}", "metadata", "total_size", (json_int_t)total, "format", "mlx", "weight_map", wm);
    if ((s = json_write(idx, dst, INDEX, err)) || (s = json_write(cj, dst, "config.json", err))) goto fail;
    for (int f = 0; f < n_trunk; f++) {
        if (n_trunk == 1) snprintf(fname, sizeof fname, "model.safetensors");
        else snprintf(fname, sizeof fname, "model-%05d-of-%05d.safetensors", f + 1, n_trunk);
        if ((s = rename_partial(dst, fname, err))) goto fail;
    }
    if ((any_mtp && (s = rename_partial(dst, SIDECAR, err))) || (s = rename_partial(dst, INDEX, err)) ||
        (s = rename_partial(dst, "config.json", err)))
        goto fail;
    for (size_t i = 0; i < sizeof AUX_FILES / sizeof *AUX_FILES; i++) {
        if (!file_exists(src, AUX_FILES[i])) continue;
        char a[PATH_CAP], b[PATH_CAP];
        snprintf(a, sizeof a, "%s/%s", src, AUX_FILES[i]);
        snprintf(b, sizeof b, "%s/%s", dst, AUX_FILES[i]);
        if ((s = copy_file(a, b, err))) goto fail;
    }
    if (stats) {
        stats_fill(stats, &p, cfg.family);
        stats->n_files = n_trunk + (any_mtp ? 1 : 0);
    }
fail:
    json_decref(q);
    json_decref(idx);
    json_decref(wm);
    json_decref(cj);
    nx_pool_free(pool);
    plan_free(&p);
    nx_store_free(st);
    nx_config_free(&cfg);
    return s;
}

/* ================================================================ graft */

/* The fields the head shares with the trunk it is grafted onto (the loader reads the head's
 * shapes from the base's config; only the expert count comes from the head's own tensors). */
static nx_status graft_compatible(const nx_config *b, const nx_config *h, const char *base, const char *head,
                                  nx_error *err) {
    if (strcmp(b->model_type, h->model_type) != 0)
        return nx_fail(err, NX_E_ARG, "cannot graft: model families differ (base %s: %s, head source %s: %s)", base,
                       b->model_type, head, h->model_type);
    static const struct {
        const char *name;
        size_t off;
    } f[] = {
        {"hidden_size", offsetof(nx_config, hidden_size)},
        {"vocab_size", offsetof(nx_config, vocab_size)},
        {"num_attention_heads", offsetof(nx_config, n_heads)},
        {"num_key_value_heads", offsetof(nx_config, n_kv_heads)},
        {"head_dim", offsetof(nx_config, head_dim)},
        {"expert_hidden_dim", offsetof(nx_config, expert_dim)},
        {"num_shared_experts", offsetof(nx_config, n_shared_experts)},
        {"shared_expert_intermediate_size", offsetof(nx_config, shared_dim)},
        {"rotary dims (partial_rotary_factor)", offsetof(nx_config, rotary_dim)},
        {"n_group", offsetof(nx_config, n_group)},
        {"topk_group", offsetof(nx_config, topk_group)},
        {"q_lora_rank", offsetof(nx_config, mla.q_lora_rank)},
        {"kv_lora_rank", offsetof(nx_config, mla.kv_lora_rank)},
        {"qk_nope_head_dim", offsetof(nx_config, mla.qk_nope)},
        {"qk_rope_head_dim", offsetof(nx_config, mla.qk_rope)},
        {"v_head_dim", offsetof(nx_config, mla.v_head_dim)},
    };
    for (size_t i = 0; i < sizeof f / sizeof *f; i++) {
        int32_t vb, vh;
        memcpy(&vb, (const char *)b + f[i].off, sizeof vb);
        memcpy(&vh, (const char *)h + f[i].off, sizeof vh);
        if (vb != vh)
            return nx_fail(err, NX_E_ARG, "cannot graft: %s differs (base %s: %d, head source %s: %d)", f[i].name, base,
                           vb, head, vh);
    }
    if (b->qk_norm != h->qk_norm)
        return nx_fail(err, NX_E_ARG, "cannot graft: qk_norm differs (base %s: %s, head source %s: %s)", base,
                       b->qk_norm ? "true" : "false", head, h->qk_norm ? "true" : "false");
    if (b->attn_gate != h->attn_gate)
        return nx_fail(err, NX_E_ARG, "cannot graft: attn_output_gate differs (base %s: %s, head source %s: %s)", base,
                       b->attn_gate ? "true" : "false", head, h->attn_gate ? "true" : "false");
    if (b->attn_bias != h->attn_bias)
        return nx_fail(err, NX_E_ARG, "cannot graft: attention_bias differs (base %s: %s, head source %s: %s)", base,
                       b->attn_bias ? "true" : "false", head, h->attn_bias ? "true" : "false");
    return NX_OK;
}

/* Whether tensor `name` of a checkpoint with n_layers trunk layers belongs to an MTP head. */
static bool is_head_tensor(const nx_family *fam, const char *name, int32_t n_layers) {
    char out[NAME_CAP];
    int64_t e;
    bool mtp;
    int r = map_name(fam, name, n_layers, out, sizeof out, &e, &mtp);
    return mtp || r == MAP_DROP_EXTRA;
}

nx_status nx_graft(const char *base, const char *head_src, const nx_graft_opts *o, nx_convert_stats *stats,
                   nx_error *err) {
    nx_graft_opts def = {0};
    if (!o) o = &def;
    if (stats) memset(stats, 0, sizeof *stats);
    if (o->mode == NX_GRAFT_QUANT && !nx_quant_supported(o->bits, o->group))
        return nx_fail(err, NX_E_ARG, "unsupported quantization %d-bit group %d (bits: 2,3,4,5,6,8; group: 32,64,128)",
                       o->bits, o->group);
    for (size_t r = 0; r < o->n_rules; r++)
        if (o->rules[r].bits && !nx_quant_supported(o->rules[r].bits, o->rules[r].group ? o->rules[r].group : 64))
            return nx_fail(err, NX_E_ARG, "rule %s: unsupported %d-bit group %d", o->rules[r].pattern,
                           o->rules[r].bits, o->rules[r].group);
    const char *dst = o->dst ? o->dst : base;
    bool inplace = same_dir(base, dst);

    nx_config bc = {0}, hc = {0};
    nx_store *bs = NULL, *hs = NULL;
    json_t *bj = NULL, *idx = NULL, *q = NULL;
    plan hp = {0}, rp = {0};
    nx_pool *pool = NULL;
    bool *has_head = NULL, *all_head = NULL;
    int fp8_base[2], fp8_block[2];
    nx_status s = open_checkpoint(base, false, &bc, &bs, &bj, fp8_base, err);
    if (s) return s;
    if (fp8_base[0]) {
        s = nx_fail(err, NX_E_ARG, "cannot graft onto %s: its weights are FP8; convert it with `nextn convert` first",
                    base);
        goto fail;
    }
    if ((s = open_checkpoint(head_src, true, &hc, &hs, NULL, fp8_block, err))) goto fail;
    if ((s = graft_compatible(&bc, &hc, base, head_src, err))) goto fail;

    /* the head, from the source's own naming */
    if ((s = plan_collect(&hp, hc.family, hs, hc.n_layers, WANT_MTP, &o->hooks, err))) goto fail;
    bool have_eh = false;
    uint64_t head_bytes = 0;
    int32_t head_experts = 0;
    for (size_t i = 0; i < hp.n; i++) {
        item *it = &hp.it[i];
        if ((s = item_resolve(it, &hc, fp8_block, err))) goto fail;
        have_eh |= is_mtp_fc(hc.family, it->path);
        if (is_router(bc.family, it->path)) head_experts = (int32_t)it->out;
        nx_graft_mode mode = o->mode;
        if (mode == NX_GRAFT_AUTO) mode = bc.quant_bits ? NX_GRAFT_QUANT : NX_GRAFT_KEEP_DTYPE;
        if (mode == NX_GRAFT_KEEP_DTYPE) {
            item_choose(it, it->sbits, it->sgroup, NULL, o->rules, o->n_rules, &o->hooks);
        } else if (o->mode == NX_GRAFT_QUANT) {
            item_choose(it, o->bits, o->group, bc.family, o->rules, o->n_rules, &o->hooks);
        } else { /* automatic on a quantized base: the convert default for heads */
            int g = nx_quant_supported(8, bc.quant_group) ? bc.quant_group : 64;
            item_choose(it, is_mtp_fc(bc.family, it->path) ? 0 : 8, g, bc.family, o->rules, o->n_rules, &o->hooks);
        }
        it->file = 0;
        head_bytes += it->bytes;
    }
    mark_plus1(&hp, hc.family);
    if (!have_eh) {
        const char *fc = hc.family->names.mtp_fc ? hc.family->names.mtp_fc : "eh_proj";
        s = nx_fail(err, NX_E_FORMAT, "%s has no MTP head (no model.layers.%d.%s.weight or mtp.%s.weight)", head_src,
                    hc.n_layers, fc, fc);
        goto fail;
    }
    if (head_experts && head_experts < bc.top_k) {
        s = nx_fail(err, NX_E_ARG, "cannot graft: the head has %d experts, fewer than the base's num_experts_per_tok %d",
                    head_experts, bc.top_k);
        goto fail;
    }

    /* the base's files: which hold an old head (rewritten without it, or dropped if all head) */
    int nf = nx_store_n_files(bs);
    has_head = calloc((size_t)nf + 1, sizeof *has_head);
    all_head = calloc((size_t)nf + 1, sizeof *all_head);
    if (!has_head || !all_head) {
        s = nx_fail(err, NX_E_NOMEM, "out of memory");
        goto fail;
    }
    for (int f = 0; f < nf; f++) all_head[f] = true;
    int n_old = 0;
    for (size_t i = 0; i < nx_store_count(bs); i++) {
        const nx_tensor *t = nx_store_tensor(bs, i);
        if (is_head_tensor(bc.family, t->name, bc.n_layers)) {
            has_head[t->file] = true;
            n_old++;
        } else {
            all_head[t->file] = false;
        }
    }
    if (n_old) note(&o->hooks, "replacing the MTP head of %s (%d tensors)", base, n_old);
    uint64_t total = head_bytes;
    for (size_t i = 0; i < nx_store_count(bs); i++) {
        const nx_tensor *t = nx_store_tensor(bs, i);
        if ((!inplace || has_head[t->file]) && !is_head_tensor(bc.family, t->name, bc.n_layers)) total += t->nbytes;
    }
    if (!inplace && (s = prepare_dir(dst, o->force, err))) goto fail;
    pool = nx_pool_new(0);
    progress pg = {.h = &o->hooks, .total = total, .pool = pool};

    if ((s = file_write(dst, SIDECAR, &hp, 0, NULL, &pg, err))) goto fail;
    for (int f = 0; f < nf; f++) {
        const char *fn = nx_store_file_name(bs, f);
        if (all_head[f] || !strcmp(fn, SIDECAR)) {
            if (!all_head[f]) {
                s = nx_fail(err, NX_E_FORMAT, "%s/%s holds trunk tensors; cannot replace it with the head", base, fn);
                goto fail;
            }
            continue;
        }
        if (has_head[f]) { /* rewrite without the old head */
            plan_free(&rp);
            for (size_t i = 0; i < nx_store_count(bs); i++) {
                const nx_tensor *t = nx_store_tensor(bs, i);
                if (t->file != f || is_head_tensor(bc.family, t->name, bc.n_layers)) continue;
                item *it;
                if ((s = plan_get(&rp, t->name, &it, err))) goto fail;
                if (!(it->parts = calloc(1, sizeof *it->parts))) {
                    s = nx_fail(err, NX_E_NOMEM, "out of memory");
                    goto fail;
                }
                it->parts[0].w = t;
                it->n_parts = 1;
                it->copy = true;
                it->bytes = t->nbytes;
            }
            if ((s = file_write(dst, fn, &rp, 0, NULL, &pg, err))) goto fail;
        } else if (!inplace) {
            char a[PATH_CAP], b[PATH_CAP];
            snprintf(a, sizeof a, "%s/%s", base, fn);
            snprintf(b, sizeof b, "%s/%s.partial", dst, fn);
            if ((s = copy_file(a, b, err))) goto fail;
            for (size_t i = 0; i < nx_store_count(bs); i++)
                if (nx_store_tensor(bs, i)->file == f) progress_add(&pg, nx_store_tensor(bs, i)->nbytes);
        }
    }

    /* the index, if the base has one: old head entries out, the sidecar's in */
    bool have_index = file_exists(base, INDEX);
    if (have_index) {
        char ip[PATH_CAP];
        snprintf(ip, sizeof ip, "%s/%s", base, INDEX);
        json_error_t je;
        idx = json_load_file(ip, 0, &je);
        json_t *wm = idx ? json_object_get(idx, "weight_map") : NULL;
        if (!json_is_object(wm)) {
            s = nx_fail(err, NX_E_FORMAT, "%s: %s", ip, idx ? "no weight_map object" : je.text);
            goto fail;
        }
        json_t *nwm = json_object();
        const char *k;
        json_t *v;
        uint64_t size = head_bytes;
        json_object_foreach(wm, k, v) {
            if (is_head_tensor(bc.family, k, bc.n_layers) || (json_is_string(v) && !strcmp(json_string_value(v), SIDECAR)))
                continue;
            json_object_set(nwm, k, v);
            const nx_tensor *t = nx_store_find(bs, k);
            if (t) size += t->nbytes;
        }
        for (size_t i = 0; i < hp.n; i++) {
            char names[3][NAME_CAP];
            int n = item_names(&hp.it[i], names);
            for (int j = 0; j < n; j++) json_object_set_new(nwm, names[j], json_string(SIDECAR));
        }
        json_object_set_new(idx, "weight_map", nwm);
        json_t *md = json_object_get(idx, "metadata");
        if (!json_is_object(md)) {
            md = json_object();
            json_object_set_new(idx, "metadata", md);
        }
        json_object_set_new(md, "total_size", json_integer((json_int_t)size));
        if ((s = json_write(idx, dst, INDEX, err))) goto fail;
    }

    /* config.json: a head, and the precision of its modules */
    json_t *nn = json_object_get(lm_config(bj, bc.family), nextn_key(bc.family));
    if (!json_is_integer(nn) || json_integer_value(nn) < 1) set_nextn(bj, bc.family, 1);
    json_t *oq = json_object_get(bj, "quantization");
    if (!json_is_object(oq)) oq = json_object_get(bj, "quantization_config");
    int gbits = 0, ggroup = 0;
    if (json_is_object(oq)) {
        q = json_deep_copy(oq);
        char lp[64];
        snprintf(lp, sizeof lp, "model.layers.%d.", bc.n_layers);
        const char *k;
        json_t *v;
        void *tmp;
        json_object_foreach_safe(q, tmp, k, v) {
            if (starts(k, "mtp.") || starts(k, lp)) json_object_del(q, k);
        }
        gbits = bc.quant_bits;
        ggroup = bc.quant_group;
    } else {
        for (size_t i = 0; i < hp.n && !gbits; i++)
            if (hp.it[i].linear && hp.it[i].bits) gbits = hp.it[i].bits, ggroup = hp.it[i].group;
        if (gbits) q = json_pack("{sisiss}", "group_size", ggroup, "bits", gbits, "mode", "affine");
    }
    if (q) {
        quant_overrides(q, &hp, gbits, ggroup, true);
        quant_set(bj, q);
    }
    if (head_experts && head_experts != bc.n_experts)
        json_object_set_new(bj, "mtp_num_experts", json_integer(head_experts));
    else
        json_object_del(bj, "mtp_num_experts");
    if ((s = json_write(bj, dst, "config.json", err))) goto fail;

    /* everything else of the base travels along to a new destination */
    if (!inplace) {
        DIR *d = opendir(base);
        struct dirent *de;
        while (d && (de = readdir(d)) && !s) {
            if (is_model_file(de->d_name) || !strcmp(de->d_name, "config.json") || !file_exists(base, de->d_name))
                continue;
            char a[PATH_CAP], b[PATH_CAP];
            snprintf(a, sizeof a, "%s/%s", base, de->d_name);
            snprintf(b, sizeof b, "%s/%s", dst, de->d_name);
            s = copy_file(a, b, err);
        }
        if (d) closedir(d);
        if (s) goto fail;
    }

    /* commit: renames, then the files that held nothing but the old head */
    if ((s = rename_partial(dst, SIDECAR, err))) goto fail;
    for (int f = 0; f < nf; f++) {
        const char *fn = nx_store_file_name(bs, f);
        if (all_head[f] || !strcmp(fn, SIDECAR)) continue;
        if ((has_head[f] || !inplace) && (s = rename_partial(dst, fn, err))) goto fail;
    }
    if ((have_index && (s = rename_partial(dst, INDEX, err))) || (s = rename_partial(dst, "config.json", err)))
        goto fail;
    for (int f = 0; f < nf && inplace; f++) {
        const char *fn = nx_store_file_name(bs, f);
        if (!all_head[f] || !strcmp(fn, SIDECAR)) continue;
        char p[PATH_CAP];
        snprintf(p, sizeof p, "%s/%s", dst, fn);
        if (unlink(p) != 0) {
            s = nx_fail(err, NX_E_IO, "%s: cannot remove the old head: %s", p, strerror(errno));
            goto fail;
        }
    }
    if (stats) {
        stats_fill(stats, &hp, bc.family);
        stats->n_files = 1;
    }
fail:
    json_decref(q);
    json_decref(idx);
    json_decref(bj);
    free(has_head);
    free(all_head);
    nx_pool_free(pool);
    plan_free(&hp);
    plan_free(&rp);
    nx_store_free(bs);
    nx_store_free(hs);
    nx_config_free(&bc);
    nx_config_free(&hc);
    return s;
}
