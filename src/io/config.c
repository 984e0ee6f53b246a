/* config.json parsing and validation (docs/design.md §2.1, §5.4, §12). model_type picks the
 * family descriptor (family/family.h), whose key lists and defaults the family-specific fields
 * are read with. Exporters disagree on field names (expert_hidden_dim vs moe_intermediate_size,
 * rope_parameters vs rope_theta, ...), so each field is looked up under all its known aliases;
 * the first present one wins and two present aliases must agree. */
#include "io/config.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/file.h"
#include "kernels/kernels.h"

typedef struct parser {
    json_t *root;
    const char *name; /* file name for messages */
    nx_error *err;
    json_t *merged;   /* a wrapper's text_config with the wrapper's keys, owned (root then) */
} parser;

/* The first alias present and not null, or NULL; *which gets its name. */
static json_t *find_alias(json_t *obj, const char *const *names, const char **which) {
    for (; *names; names++) {
        json_t *v = json_object_get(obj, *names);
        if (v && !json_is_null(v)) {
            *which = *names;
            return v;
        }
    }
    *which = NULL;
    return NULL;
}

/* Integer field under any alias. Absent: *out = def, or an error if required. All present
 * aliases must hold the same value (a config with two different expert widths is corrupt). */
static nx_status get_int(parser *p, const char *const *names, bool required, int64_t def,
                         int64_t lo, int64_t hi, int64_t *out) {
    const char *which = NULL;
    bool found = false;
    for (const char *const *n = names; *n; n++) {
        json_t *v = json_object_get(p->root, *n);
        if (!v || json_is_null(v)) continue;
        if (!json_is_integer(v))
            return nx_fail(p->err, NX_E_CONFIG, "%s: field \"%s\" must be an integer", p->name, *n);
        int64_t x = json_integer_value(v);
        if (x < lo || x > hi)
            return nx_fail(p->err, NX_E_CONFIG, "%s: field \"%s\" = %lld is out of range [%lld, %lld]",
                           p->name, *n, (long long)x, (long long)lo, (long long)hi);
        if (found && x != *out)
            return nx_fail(p->err, NX_E_CONFIG, "%s: fields \"%s\" and \"%s\" disagree (%lld vs %lld)",
                           p->name, which, *n, (long long)*out, (long long)x);
        *out = x;
        which = *n;
        found = true;
    }
    if (found) return NX_OK;
    if (required) return nx_fail(p->err, NX_E_CONFIG, "%s: missing field \"%s\"", p->name, names[0]);
    *out = def;
    return NX_OK;
}

static nx_status check_real(parser *p, const char *field, json_t *v, double *out) {
    if (!json_is_number(v))
        return nx_fail(p->err, NX_E_CONFIG, "%s: field \"%s\" must be a number", p->name, field);
    *out = json_number_value(v);
    if (!isfinite(*out))
        return nx_fail(p->err, NX_E_CONFIG, "%s: field \"%s\" is not finite", p->name, field);
    return NX_OK;
}

static nx_status get_real(parser *p, const char *const *names, double def, double *out) {
    const char *which;
    json_t *v = find_alias(p->root, names, &which);
    if (!v) {
        *out = def;
        return NX_OK;
    }
    return check_real(p, which, v, out);
}

static nx_status get_bool(parser *p, const char *const *names, bool def, bool *out) {
    const char *which;
    json_t *v = find_alias(p->root, names, &which);
    if (!v) {
        *out = def;
        return NX_OK;
    }
    if (!json_is_boolean(v))
        return nx_fail(p->err, NX_E_CONFIG, "%s: field \"%s\" must be true or false", p->name, which);
    *out = json_is_true(v);
    return NX_OK;
}

/* Token ids: an integer, null/absent (-1), or for eos a list. */
static nx_status get_token_ids(parser *p, const char *field, int32_t *ids, int32_t max,
                               int32_t *n) {
    json_t *v = json_object_get(p->root, field);
    *n = 0;
    if (!v || json_is_null(v)) return NX_OK;
    if (json_is_integer(v)) {
        json_int_t x = json_integer_value(v);
        if (x > INT32_MAX)
            return nx_fail(p->err, NX_E_CONFIG, "%s: field \"%s\" is out of range", p->name, field);
        if (x >= 0) ids[(*n)++] = (int32_t)x;
        return NX_OK;
    }
    if (!json_is_array(v) || max <= 1)
        return nx_fail(p->err, NX_E_CONFIG, "%s: field \"%s\" must be an integer%s", p->name, field,
                       max > 1 ? " or a list of integers" : "");
    if (json_array_size(v) > (size_t)max)
        return nx_fail(p->err, NX_E_CONFIG, "%s: field \"%s\" lists %zu ids (at most %d supported)",
                       p->name, field, json_array_size(v), (int)max);
    size_t i;
    json_t *e;
    json_array_foreach(v, i, e) {
        if (!json_is_integer(e) || json_integer_value(e) < 0 || json_integer_value(e) > INT32_MAX)
            return nx_fail(p->err, NX_E_CONFIG, "%s: field \"%s\"[%zu] must be a non-negative integer",
                           p->name, field, i);
        ids[(*n)++] = (int32_t)json_integer_value(e);
    }
    return NX_OK;
}

static bool bits_ok(int64_t b) { return b == 2 || b == 3 || b == 4 || b == 5 || b == 6 || b == 8; }
static bool group_ok(int64_t g) { return g == 32 || g == 64 || g == 128; }

/* Reads bits/group_size/mode of a quantization dict (the global block or one override);
 * absent values keep *bits / *group as given. */
static nx_status read_quant_params(parser *p, const char *where, json_t *obj, int *bits, int *group) {
    json_t *m = json_object_get(obj, "mode");
    if (m && !json_is_null(m)) {
        if (!json_is_string(m))
            return nx_fail(p->err, NX_E_CONFIG, "%s: field \"%s.mode\" must be a string", p->name, where);
        if (strcmp(json_string_value(m), "affine") != 0)
            return nx_fail(p->err, NX_E_UNSUPPORTED,
                           "%s: quantization mode \"%.32s\" (%s) is not supported (only \"affine\")",
                           p->name, json_string_value(m), where);
    }
    json_t *b = json_object_get(obj, "bits");
    if (b && !json_is_null(b)) {
        if (!json_is_integer(b))
            return nx_fail(p->err, NX_E_CONFIG, "%s: field \"%s.bits\" must be an integer", p->name, where);
        if (!bits_ok(json_integer_value(b)))
            return nx_fail(p->err, NX_E_CONFIG, "%s: field \"%s.bits\" = %lld (supported: 2,3,4,5,6,8)",
                           p->name, where, (long long)json_integer_value(b));
        *bits = (int)json_integer_value(b);
    }
    json_t *g = json_object_get(obj, "group_size");
    if (g && !json_is_null(g)) {
        if (!json_is_integer(g))
            return nx_fail(p->err, NX_E_CONFIG, "%s: field \"%s.group_size\" must be an integer", p->name,
                           where);
        if (!group_ok(json_integer_value(g)))
            return nx_fail(p->err, NX_E_CONFIG, "%s: field \"%s.group_size\" = %lld (supported: 32,64,128)",
                           p->name, where, (long long)json_integer_value(g));
        *group = (int)json_integer_value(g);
    }
    return NX_OK;
}

static bool is_global_quant_key(const char *k) {
    return strcmp(k, "bits") == 0 || strcmp(k, "group_size") == 0 || strcmp(k, "mode") == 0 ||
           strcmp(k, "quant_method") == 0;
}

static nx_status parse_quant(parser *p, nx_config *cfg) {
    const char *where = "quantization";
    json_t *q = json_object_get(p->root, where);
    if (!q || json_is_null(q)) {
        where = "quantization_config";
        q = json_object_get(p->root, where);
    }
    if (!q || json_is_null(q)) return NX_OK;
    if (!json_is_object(q))
        return nx_fail(p->err, NX_E_CONFIG, "%s: field \"%s\" must be an object", p->name, where);
    json_t *qm = json_object_get(q, "quant_method");
    if (qm && !json_is_null(qm)) {
        if (!json_is_string(qm))
            return nx_fail(p->err, NX_E_CONFIG, "%s: field \"%s.quant_method\" must be a string", p->name,
                           where);
        const char *m = json_string_value(qm);
        if (strcmp(m, "fp8") == 0)
            return nx_fail(p->err, NX_E_UNSUPPORTED,
                           "%s: %s.quant_method \"fp8\": FP8 weights are not loaded directly; convert the "
                           "checkpoint with `nextn convert` first", p->name, where);
        if (strcmp(m, "mlx") != 0 && strcmp(m, "affine") != 0)
            return nx_fail(p->err, NX_E_UNSUPPORTED,
                           "%s: %s.quant_method \"%.32s\" is not supported (only MLX affine)", p->name,
                           where, m);
    }
    int bits = 0, group = 0;
    nx_status st = read_quant_params(p, where, q, &bits, &group);
    if (st != NX_OK) return st;
    if (!bits || !group)
        return nx_fail(p->err, NX_E_CONFIG, "%s: field \"%s.%s\" is missing", p->name, where,
                       bits ? "group_size" : "bits");
    cfg->quant_bits = bits;
    cfg->quant_group = group;

    size_t n = 0, cap = json_object_size(q);
    if (cap == 0) return NX_OK;
    cfg->quant_overrides = calloc(cap, sizeof *cfg->quant_overrides);
    if (!cfg->quant_overrides) return nx_fail(p->err, NX_E_NOMEM, "out of memory");
    const char *k;
    json_t *v;
    json_object_foreach(q, k, v) {
        if (is_global_quant_key(k)) continue;
        /* Per-module overrides are dicts or `false`; mlx-lm's class_predicate also treats
         * `true` as "the global parameters". Other scalars are foreign keys we ignore. */
        if (!json_is_object(v) && !json_is_boolean(v)) continue;
        nx_quant_override *o = &cfg->quant_overrides[n];
        if (!(o->path = strdup(k))) return nx_fail(p->err, NX_E_NOMEM, "out of memory");
        cfg->n_quant_overrides = (int32_t)++n;
        o->bits = json_is_false(v) ? 0 : bits;
        o->group = json_is_false(v) ? 0 : group;
        if (json_is_object(v)) {
            char w[300];
            snprintf(w, sizeof w, "%s.%.200s", where, k);
            if ((st = read_quant_params(p, w, v, &o->bits, &o->group)) != NX_OK) return st;
        }
    }
    return NX_OK;
}

/* HF's optional mlp_layer_types: ["dense", ..., "sparse", ...]; dense layers must come first. */
static nx_status parse_layer_types(parser *p, int64_t n_layers, int64_t *n_dense, bool *present) {
    json_t *v = json_object_get(p->root, "mlp_layer_types");
    *present = false;
    if (!v || json_is_null(v)) return NX_OK;
    if (!json_is_array(v))
        return nx_fail(p->err, NX_E_CONFIG, "%s: field \"mlp_layer_types\" must be a list", p->name);
    if ((int64_t)json_array_size(v) != n_layers)
        return nx_fail(p->err, NX_E_CONFIG, "%s: field \"mlp_layer_types\" has %zu entries, expected %lld",
                       p->name, json_array_size(v), (long long)n_layers);
    int64_t nd = 0;
    bool seen_sparse = false;
    size_t i;
    json_t *e;
    json_array_foreach(v, i, e) {
        const char *s = json_string_value(e);
        bool dense = s && strcmp(s, "dense") == 0, sparse = s && strcmp(s, "sparse") == 0;
        if (!dense && !sparse)
            return nx_fail(p->err, NX_E_CONFIG, "%s: field \"mlp_layer_types\"[%zu] must be \"dense\" or \"sparse\"",
                           p->name, i);
        if (dense && seen_sparse)
            return nx_fail(p->err, NX_E_UNSUPPORTED,
                           "%s: mlp_layer_types: dense layer %zu after a sparse one is not supported",
                           p->name, i);
        seen_sparse |= sparse;
        nd += dense;
    }
    *n_dense = nd;
    *present = true;
    return NX_OK;
}

/* yarn_get_mscale of transformers and vLLM: 0.1·m·ln(factor) + 1 above a factor of 1. */
static double yarn_mscale(double factor, double m) {
    return factor <= 1.0 ? 1.0 : 0.1 * m * log(factor) + 1.0;
}

/* A real of a RoPE scaling object: absent or null → def; present → finite and within [lo, hi]. */
static nx_status yarn_real(parser *p, json_t *obj, const char *where, const char *key, double def, double lo, double hi,
                           double *out) {
    json_t *v = json_object_get(obj, key);
    char f[96];
    snprintf(f, sizeof f, "%s.%s", where, key);
    if (!v || json_is_null(v)) {
        *out = def;
        return NX_OK;
    }
    nx_status st = check_real(p, f, v, out);
    if (st == NX_OK && !(*out >= lo && *out <= hi))
        return nx_fail(p->err, NX_E_CONFIG, "%s: field \"%s\" = %g is out of range [%g, %g]", p->name, f, *out, lo, hi);
    return st;
}

/* YaRN's parameters from a rope_scaling / rope_parameters object (transformers'
 * _compute_yarn_parameters: attention_factor, else the ratio of the mscale and mscale_all_dim
 * magnitudes when both are set, else the magnitude of factor alone). */
static nx_status parse_yarn(parser *p, json_t *obj, const char *where, int64_t maxpos, nx_yarn *y) {
    double ms, msa, af;
    json_t *tr = json_object_get(obj, "truncate");
    nx_status st;
    if ((st = yarn_real(p, obj, where, "factor", 0, 1.0, 1e6, &y->factor)) ||
        (st = yarn_real(p, obj, where, "original_max_position_embeddings", (double)maxpos, 1, 1e12, &y->orig_max_pos)) ||
        (st = yarn_real(p, obj, where, "beta_fast", 32, 1e-6, 1e6, &y->beta_fast)) ||
        (st = yarn_real(p, obj, where, "beta_slow", 1, 1e-6, 1e6, &y->beta_slow)) ||
        (st = yarn_real(p, obj, where, "mscale", 0, 0, 1e6, &ms)) ||
        (st = yarn_real(p, obj, where, "mscale_all_dim", 0, 0, 1e6, &msa)) ||
        (st = yarn_real(p, obj, where, "attention_factor", -1, 0, 1e6, &af)))
        return st;
    if (y->factor == 0)
        return nx_fail(p->err, NX_E_CONFIG, "%s: field \"%s.factor\" is missing (YaRN)", p->name, where);
    if (tr && !json_is_null(tr) && !json_is_boolean(tr))
        return nx_fail(p->err, NX_E_CONFIG, "%s: field \"%s.truncate\" must be true or false", p->name, where);
    y->truncate = !tr || json_is_null(tr) || json_is_true(tr);
    y->attn_factor = af >= 0 ? af : ms > 0 && msa > 0 ? yarn_mscale(y->factor, ms) / yarn_mscale(y->factor, msa)
                                                      : yarn_mscale(y->factor, 1.0);
    y->mscale_all_dim = msa;
    return NX_OK;
}

/* The RoPE scaling of obj (rope_scaling, or rope_parameters when it names a rope_type): none
 * ("default"), YaRN, or an error naming the unsupported type. */
static nx_status parse_scaling(parser *p, json_t *obj, const char *where, int64_t maxpos, nx_yarn *y) {
    json_t *t = json_object_get(obj, "rope_type");
    if (!t || json_is_null(t)) t = json_object_get(obj, "type");
    if (!t || json_is_null(t)) return NX_OK;
    if (!json_is_string(t))
        return nx_fail(p->err, NX_E_CONFIG, "%s: field \"%s.rope_type\" must be a string", p->name, where);
    if (strcmp(json_string_value(t), "default") == 0) return NX_OK;
    if (strcmp(json_string_value(t), "yarn") == 0) return parse_yarn(p, obj, where, maxpos, y);
    return nx_fail(p->err, NX_E_UNSUPPORTED, "%s: rope_type \"%.32s\" (%s) is not supported (default, yarn)",
                   p->name, json_string_value(t), where);
}

static nx_status parse_rope(parser *p, double def_theta, int64_t maxpos, double *theta, nx_yarn *yarn) {
    json_t *rp = json_object_get(p->root, "rope_parameters");
    json_t *src = NULL;
    const char *field = NULL;
    nx_status st;
    memset(yarn, 0, sizeof *yarn);
    if (rp && !json_is_null(rp)) {
        if (!json_is_object(rp))
            return nx_fail(p->err, NX_E_CONFIG, "%s: field \"rope_parameters\" must be an object", p->name);
        if ((st = parse_scaling(p, rp, "rope_parameters", maxpos, yarn))) return st;
        src = json_object_get(rp, "rope_theta");
        field = "rope_parameters.rope_theta";
    }
    if (!src || json_is_null(src)) {
        src = json_object_get(p->root, "rope_theta");
        field = "rope_theta";
    }
    json_t *rs = json_object_get(p->root, "rope_scaling");
    if (rs && !json_is_null(rs)) {
        if (!json_is_object(rs))
            return nx_fail(p->err, NX_E_CONFIG, "%s: field \"rope_scaling\" must be an object", p->name);
        if ((st = parse_scaling(p, rs, "rope_scaling", maxpos, yarn))) return st;
    }
    if (!src || json_is_null(src)) {
        *theta = def_theta;
        return NX_OK;
    }
    st = check_real(p, field, src, theta);
    if (st == NX_OK && !(*theta > 0))
        return nx_fail(p->err, NX_E_CONFIG, "%s: field \"%s\" must be positive", p->name, field);
    return st;
}

/* The family config.json names by model_type (required); its architectures entries, when
 * present, must be known and of the same family. An unknown name is an error listing the
 * supported ones. */
static nx_status resolve_family(parser *p, const nx_family **out) {
    char list[512];
    *out = NULL;
    json_t *mt = json_object_get(p->root, "model_type");
    if (!mt) return nx_fail(p->err, NX_E_CONFIG, "%s: missing field \"model_type\"", p->name);
    if (!json_is_string(mt))
        return nx_fail(p->err, NX_E_CONFIG, "%s: field \"model_type\" must be a string", p->name);
    if (!(*out = nx_family_by_type(json_string_value(mt))))
        return nx_fail(p->err, NX_E_UNSUPPORTED, "%s: model_type \"%.64s\" is not supported (supported: %s)",
                       p->name, json_string_value(mt), nx_family_list(list, sizeof list));
    json_t *ar = json_object_get(p->root, "architectures");
    if (ar && !json_is_null(ar)) {
        if (!json_is_array(ar))
            return nx_fail(p->err, NX_E_CONFIG, "%s: field \"architectures\" must be a list of strings", p->name);
        size_t i;
        json_t *e;
        json_array_foreach(ar, i, e) {
            if (!json_is_string(e))
                return nx_fail(p->err, NX_E_CONFIG, "%s: field \"architectures\"[%zu] must be a string", p->name, i);
            const nx_family *f = nx_family_by_arch(json_string_value(e));
            if (!f)
                return nx_fail(p->err, NX_E_UNSUPPORTED,
                               "%s: architectures entry \"%.64s\" is not supported (supported: %s)", p->name,
                               json_string_value(e), nx_family_list(list, sizeof list));
            if (f != *out)
                return nx_fail(p->err, NX_E_CONFIG, "%s: architectures entry \"%.64s\" is not of model_type \"%s\"",
                               p->name, json_string_value(e), (*out)->model_type);
        }
    }
    return NX_OK;
}

/* The group limit of the DeepSeek router: n_group groups of equal size, topk_group kept, and
 * enough experts in them for top_k. */
static nx_status parse_groups(parser *p, const nx_family_keys *K, int64_t nexp, int64_t topk, nx_config *cfg) {
    int64_t ng, tg;
    nx_status st;
    if ((st = get_int(p, K->n_group, false, 1, 1, 64, &ng)) || (st = get_int(p, K->topk_group, false, ng, 1, 64, &tg)))
        return st;
    if (tg > ng)
        return nx_fail(p->err, NX_E_CONFIG, "%s: topk_group %lld exceeds n_group %lld", p->name, (long long)tg,
                       (long long)ng);
    if (nexp > 0 && (nexp % ng != 0 || topk > tg * (nexp / ng)))
        return nx_fail(p->err, NX_E_CONFIG,
                       "%s: %lld experts do not split into n_group %lld groups of which topk_group %lld hold "
                       "num_experts_per_tok %lld", p->name, (long long)nexp, (long long)ng, (long long)tg,
                       (long long)topk);
    cfg->n_group = (int32_t)ng;
    cfg->topk_group = (int32_t)tg;
    return NX_OK;
}

/* partial_rotary_factor → the rotated dims: head_dim * factor, even, at least 2. */
static nx_status parse_rotary(parser *p, const nx_family *fam, int64_t head_dim, nx_config *cfg) {
    double f;
    nx_status st = get_real(p, fam->keys.rotary_factor, fam->def.rotary_factor, &f);
    if (st) return st;
    const char *which;
    json_t *rp = json_object_get(p->root, "rope_parameters");
    if (json_is_object(rp) && !find_alias(p->root, fam->keys.rotary_factor, &which)) {
        json_t *v = json_object_get(rp, "partial_rotary_factor"); /* transformers 5 keeps it here */
        if (v && !json_is_null(v) && (st = check_real(p, "rope_parameters.partial_rotary_factor", v, &f))) return st;
    }
    if (!(f > 0 && f <= 1))
        return nx_fail(p->err, NX_E_CONFIG, "%s: field \"partial_rotary_factor\" = %g must be in (0, 1]", p->name, f);
    int64_t rot = (int64_t)((double)head_dim * f); /* int(): what transformers and mlx-lm take */
    if (rot < 2 || rot % 2 != 0)
        return nx_fail(p->err, NX_E_CONFIG,
                       "%s: head_dim %lld x partial_rotary_factor %g = %lld rotated dims (must be even, >= 2)",
                       p->name, (long long)head_dim, f, (long long)rot);
    cfg->rotary_dim = (int32_t)rot;
    return NX_OK;
}

#define NAMES(...) ((const char *const[]){__VA_ARGS__, NULL})

/* A string field that, when present, must be one of the values the engine implements. */
static nx_status want_string(parser *p, const char *field, const char *want) {
    json_t *v = json_object_get(p->root, field);
    if (!v || json_is_null(v)) return NX_OK;
    if (!json_is_string(v)) return nx_fail(p->err, NX_E_CONFIG, "%s: field \"%s\" must be a string", p->name, field);
    if (strcmp(json_string_value(v), want) != 0)
        return nx_fail(p->err, NX_E_UNSUPPORTED, "%s: %s \"%.32s\" is not supported (only \"%s\")", p->name, field,
                       json_string_value(v), want);
    return NX_OK;
}

/* Multi-head latent attention's shapes: q_lora_rank (null: a plain q_proj; absent: the
 * family's default, as transformers' config classes have it), the latent and head widths; the
 * query head is qk_nope + qk_rope wide and RoPE turns its qk_rope dims; the cache holds one
 * latent + roped key row per position. */
static nx_status parse_mla(parser *p, const nx_family *fam, int64_t heads, nx_config *cfg) {
    nx_mla *a = &cfg->mla;
    const int64_t W = NX_ATTN_MAX_HD;
    int64_t qr, kvr, nope, rope, vd;
    nx_status st;
    json_t *q = json_object_get(p->root, "q_lora_rank");
    if ((st = get_int(p, NAMES("q_lora_rank"), false, fam->def.q_lora_rank, 1, INT32_MAX, &qr)) ||
        (st = get_int(p, NAMES("kv_lora_rank"), true, 0, 1, W, &kvr)) ||
        (st = get_int(p, NAMES("qk_nope_head_dim"), true, 0, 1, W, &nope)) ||
        (st = get_int(p, NAMES("qk_rope_head_dim"), true, 0, 2, W, &rope)) ||
        (st = get_int(p, NAMES("v_head_dim"), true, 0, 1, W, &vd)) ||
        (st = want_string(p, "scoring_func", "sigmoid")) || (st = want_string(p, "topk_method", "noaux_tc")))
        return st;
    if (q && json_is_null(q)) qr = 0;
    if (rope % 2 != 0 || kvr + rope > W)
        return nx_fail(p->err, NX_E_CONFIG,
                       "%s: qk_rope_head_dim %lld must be even and kv_lora_rank + qk_rope_head_dim (%lld) at most %lld",
                       p->name, (long long)rope, (long long)(kvr + rope), (long long)W);
    if (heads * (nope + rope) > INT32_MAX || heads * kvr > INT32_MAX || heads * vd > INT32_MAX)
        return nx_fail(p->err, NX_E_CONFIG, "%s: MLA widths overflow (heads x head dims)", p->name);
    double f;
    if ((st = get_real(p, fam->keys.rotary_factor, 1.0, &f))) return st;
    if (f != 1.0)
        return nx_fail(p->err, NX_E_UNSUPPORTED, "%s: partial_rotary_factor %g with latent attention (only 1)",
                       p->name, f);
    int64_t freq = 1;
    if ((st = get_int(p, NAMES("moe_layer_freq"), false, 1, 1, INT32_MAX, &freq))) return st;
    if (freq != 1) return nx_fail(p->err, NX_E_UNSUPPORTED, "%s: moe_layer_freq %lld (only 1)", p->name, (long long)freq);
    *a = (nx_mla){(int32_t)qr, (int32_t)kvr, (int32_t)nope, (int32_t)rope, (int32_t)vd, 0};
    const double m = cfg->yarn.factor > 0 && cfg->yarn.mscale_all_dim > 0
                         ? yarn_mscale(cfg->yarn.factor, cfg->yarn.mscale_all_dim) : 1.0;
    a->scale = (float)(m * m / sqrt((double)(nope + rope)));
    cfg->head_dim = (int32_t)(nope + rope);
    cfg->rotary_dim = (int32_t)rope;
    cfg->cache_heads = 1;
    cfg->cache_k = (int32_t)(kvr + rope);
    cfg->cache_v = 0;
    return NX_OK;
}

/* A hybrid stack's layer kinds: layer_types ("linear_attention" / "full_attention"), else a
 * full-attention layer every full_attention_interval (the family's default) from the first. */
static nx_status parse_layer_kinds(parser *p, const nx_family *fam, int64_t layers, nx_config *cfg) {
    int64_t every;
    nx_status st = get_int(p, NAMES("full_attention_interval"), false, fam->hybrid.full_interval, 1, INT32_MAX, &every);
    if (st) return st;
    if (!(cfg->linear = calloc((size_t)layers, sizeof *cfg->linear))) return nx_fail(p->err, NX_E_NOMEM, "out of memory");
    json_t *lt = json_object_get(p->root, "layer_types");
    if (lt && !json_is_null(lt)) {
        if (!json_is_array(lt) || (int64_t)json_array_size(lt) != layers)
            return nx_fail(p->err, NX_E_CONFIG, "%s: field \"layer_types\" must list num_hidden_layers (%lld) entries",
                           p->name, (long long)layers);
        size_t i;
        json_t *e;
        json_array_foreach(lt, i, e) {
            const char *k = json_string_value(e);
            const bool lin = k && strcmp(k, "linear_attention") == 0, full = k && strcmp(k, "full_attention") == 0;
            if (!lin && !full)
                return nx_fail(p->err, NX_E_CONFIG,
                               "%s: field \"layer_types\"[%zu] must be \"linear_attention\" or \"full_attention\"",
                               p->name, i);
            cfg->linear[i] = lin;
        }
    } else {
        for (int64_t l = 0; l < layers; l++) cfg->linear[l] = (l + 1) % every != 0;
    }
    for (int64_t l = 0; l < layers; l++) cfg->n_linear += cfg->linear[l];
    return NX_OK;
}

/* Gated DeltaNet's shapes and the hybrid family's fixed choices (Qwen3-Next's dense-layer knobs
 * must keep every layer sparse). */
static nx_status parse_hybrid(parser *p, const nx_family *fam, int64_t layers, nx_config *cfg) {
    int64_t nk, nv, dk, dv, ck, step = 1;
    nx_status st;
    if ((st = parse_layer_kinds(p, fam, layers, cfg)) ||
        (st = get_int(p, NAMES("linear_num_key_heads"), true, 0, 1, 1024, &nk)) ||
        (st = get_int(p, NAMES("linear_num_value_heads"), true, 0, 1, 1024, &nv)) ||
        (st = get_int(p, NAMES("linear_key_head_dim"), true, 0, 1, NX_ATTN_MAX_HD, &dk)) ||
        (st = get_int(p, NAMES("linear_value_head_dim"), true, 0, 1, NX_ATTN_MAX_HD, &dv)) ||
        (st = get_int(p, NAMES("linear_conv_kernel_dim"), false, 4, 2, 16, &ck)) ||
        (st = get_int(p, NAMES("decoder_sparse_step"), false, 1, 1, INT32_MAX, &step)))
        return st;
    if (nv % nk != 0)
        return nx_fail(p->err, NX_E_CONFIG, "%s: linear_num_value_heads %lld is not a multiple of linear_num_key_heads %lld",
                       p->name, (long long)nv, (long long)nk);
    bool own_embed;
    if ((st = get_bool(p, NAMES("mtp_use_dedicated_embeddings"), false, &own_embed))) return st;
    if (own_embed)
        return nx_fail(p->err, NX_E_UNSUPPORTED, "%s: mtp_use_dedicated_embeddings true (an MTP head with its own "
                       "embedding) is not supported", p->name);
    json_t *mo = json_object_get(p->root, "mlp_only_layers");
    if (step != 1 || (json_is_array(mo) && json_array_size(mo) > 0))
        return nx_fail(p->err, NX_E_UNSUPPORTED, "%s: dense layers (decoder_sparse_step %lld, mlp_only_layers) are not "
                       "supported in a hybrid stack", p->name, (long long)step);
    cfg->dn = (nx_deltanet){(int32_t)nk, (int32_t)nv, (int32_t)dk, (int32_t)dv, (int32_t)ck};
    return NX_OK;
}

/* A wrapper config (Qwen3.5's vision-language one) → its text_config with the wrapper's own keys
 * (model_type, architectures, quantization, tie_word_embeddings, ...) added over it. */
static nx_status unwrap_text_config(parser *p, const nx_family *fam) {
    json_t *tc = fam->text_config ? json_object_get(p->root, fam->text_config) : NULL;
    if (!tc || json_is_null(tc)) return NX_OK;
    if (!json_is_object(tc))
        return nx_fail(p->err, NX_E_CONFIG, "%s: field \"%s\" must be an object", p->name, fam->text_config);
    if (!(p->merged = json_deep_copy(tc))) return nx_fail(p->err, NX_E_NOMEM, "out of memory");
    const char *k;
    json_t *v;
    json_object_foreach(p->root, k, v) {
        if (strcmp(k, fam->text_config) == 0 || strcmp(k, "vision_config") == 0) continue;
        if (json_object_set(p->merged, k, v) != 0) return nx_fail(p->err, NX_E_NOMEM, "out of memory");
    }
    p->root = p->merged;
    return NX_OK;
}

/* The rope pairs: the family's, or the config's rope_interleave where the family reads one. */
static nx_status parse_rope_pairs(parser *p, const nx_family *fam, nx_config *cfg) {
    bool il = fam->rope_pairs == NX_ROPE_INTERLEAVED;
    nx_status st = fam->keys.rope_interleave ? get_bool(p, fam->keys.rope_interleave, il, &il) : NX_OK;
    cfg->rope_pairs = il ? NX_ROPE_INTERLEAVED : NX_ROPE_NEOX;
    return st;
}

static nx_status parse_root(parser *p, nx_config *cfg) {
    nx_status st;
    json_t *root = p->root;
    if (!json_is_object(root))
        return nx_fail(p->err, NX_E_CONFIG, "%s: not a JSON object", p->name);

    const nx_family *fam;
    if ((st = resolve_family(p, &fam))) return st;
    cfg->family = fam;
    snprintf(cfg->model_type, sizeof cfg->model_type, "%s", fam->model_type);
    const nx_family_keys *K = &fam->keys;
    if ((st = unwrap_text_config(p, fam))) return st;
    root = p->root;

    json_t *act = json_object_get(root, "hidden_act");
    if (act && !json_is_null(act)) {
        if (!json_is_string(act))
            return nx_fail(p->err, NX_E_CONFIG, "%s: field \"hidden_act\" must be a string", p->name);
        if (strcmp(json_string_value(act), "silu") != 0)
            return nx_fail(p->err, NX_E_UNSUPPORTED, "%s: hidden_act \"%.32s\" is not supported (only silu)",
                           p->name, json_string_value(act));
    }

    const int64_t I32 = INT32_MAX;
    int64_t vocab, hidden, layers, heads, kv, head_dim, inter = 0, edim = 0, nexp = 0, topk = 0;
    int64_t nshared, kdense, nextn, maxpos;
    if ((st = get_int(p, NAMES("vocab_size"), true, 0, 1, I32, &vocab)) ||
        (st = get_int(p, NAMES("hidden_size"), true, 0, 1, I32, &hidden)) ||
        (st = get_int(p, NAMES("num_hidden_layers"), true, 0, 1, I32, &layers)) ||
        (st = get_int(p, NAMES("num_attention_heads"), true, 0, 1, I32, &heads)) ||
        (st = get_int(p, NAMES("num_key_value_heads"), false, heads, 1, I32, &kv)) ||
        (st = get_int(p, NAMES("head_dim"), false, 0, 1, I32, &head_dim)) ||
        (st = get_int(p, K->first_k_dense, false, -1, 0, I32, &kdense)) ||
        (st = get_int(p, K->n_shared, false, fam->def.n_shared, 0, 64, &nshared)) ||
        (st = get_int(p, K->n_nextn ? K->n_nextn : NAMES("num_nextn_predict_layers"), false, 0, 0, 64, &nextn)) ||
        (st = get_int(p, NAMES("max_position_embeddings"), false, 131072, 1, INT64_MAX, &maxpos)))
        return st;
    const bool mla = fam->attention == NX_ATTN_MLA; /* head_dim: parse_mla's, whatever the config says */
    if (mla) head_dim = 1;
    if (head_dim == 0) {
        if (hidden % heads != 0)
            return nx_fail(p->err, NX_E_CONFIG,
                           "%s: field \"head_dim\" is absent and hidden_size %lld is not a multiple of "
                           "num_attention_heads %lld", p->name, (long long)hidden, (long long)heads);
        head_dim = hidden / heads;
    }
    if (head_dim > NX_ATTN_MAX_HD)
        return nx_fail(p->err, NX_E_CONFIG, "%s: head_dim %lld is larger than the %d the attention kernels take",
                       p->name, (long long)head_dim, NX_ATTN_MAX_HD);
    int64_t lt_dense;
    bool lt_present;
    if ((st = parse_layer_types(p, layers, &lt_dense, &lt_present))) return st;
    if (lt_present && kdense >= 0 && kdense != lt_dense)
        return nx_fail(p->err, NX_E_CONFIG,
                       "%s: first_k_dense_replace = %lld but mlp_layer_types has %lld dense layers",
                       p->name, (long long)kdense, (long long)lt_dense);
    if (kdense < 0) kdense = lt_present ? lt_dense : fam->def.first_k_dense;
    if (kdense > layers)
        return nx_fail(p->err, NX_E_CONFIG, "%s: first_k_dense_replace = %lld exceeds num_hidden_layers = %lld",
                       p->name, (long long)kdense, (long long)layers);
    bool any_dense = kdense > 0;
    bool any_moe = kdense < layers || nextn > 0;
    if ((st = get_int(p, NAMES("intermediate_size"), any_dense, 0, 1, I32, &inter)) ||
        (st = get_int(p, K->expert_dim, any_moe, 0, 1, I32, &edim)) ||
        (st = get_int(p, K->n_experts, any_moe, 0, 1, I32, &nexp)) ||
        (st = get_int(p, NAMES("num_experts_per_tok"), any_moe, 0, 1, I32, &topk)))
        return st;
    if (heads % kv != 0)
        return nx_fail(p->err, NX_E_CONFIG,
                       "%s: num_attention_heads %lld is not a multiple of num_key_value_heads %lld",
                       p->name, (long long)heads, (long long)kv);
    if (topk > nexp)
        return nx_fail(p->err, NX_E_CONFIG, "%s: num_experts_per_tok %lld exceeds num_experts %lld",
                       p->name, (long long)topk, (long long)nexp);
    /* widths the forward pass multiplies out must stay in int32 */
    if (heads * head_dim > I32 || edim * nshared > I32 || 2 * hidden > I32)
        return nx_fail(p->err, NX_E_CONFIG, "%s: layer widths overflow (heads x head_dim or experts)",
                       p->name);

    double eps, scaling, theta;
    bool route_norm, qk_norm, tie, attn_bias;
    if ((st = get_real(p, NAMES("rms_norm_eps"), 1e-5, &eps)) ||
        (st = get_real(p, K->scaling, 1.0, &scaling)) ||
        (st = get_bool(p, K->route_norm, true, &route_norm)) ||
        (st = get_bool(p, K->qk_norm, fam->def.qk_norm, &qk_norm)) ||
        (st = get_bool(p, K->attn_bias, fam->def.attn_bias, &attn_bias)) ||
        (st = get_bool(p, NAMES("tie_word_embeddings"), false, &tie)) ||
        (st = parse_rope(p, fam->def.rope_theta, maxpos, &theta, &cfg->yarn)) ||
        (st = parse_rope_pairs(p, fam, cfg)) || (st = parse_groups(p, K, nexp, topk, cfg)))
        return st;
    cfg->attention = fam->attention;
    cfg->head_dim = (int32_t)head_dim;
    cfg->cache_heads = (int32_t)kv;
    cfg->cache_k = cfg->cache_v = (int32_t)head_dim;
    if ((st = mla ? parse_mla(p, fam, heads, cfg) : parse_rotary(p, fam, head_dim, cfg))) return st;
    if (fam->hybrid.on && (st = parse_hybrid(p, fam, layers, cfg))) return st;
    int64_t sdim = edim * nshared;
    cfg->attn_gate = fam->def.attn_gate;
    if ((K->shared_dim && (st = get_int(p, K->shared_dim, false, sdim, 0, I32, &sdim))) ||
        (K->attn_gate && (st = get_bool(p, K->attn_gate, fam->def.attn_gate, &cfg->attn_gate))))
        return st;
    if (nshared > 0 && any_moe && sdim == 0)
        return nx_fail(p->err, NX_E_CONFIG, "%s: field \"shared_expert_intermediate_size\" must be positive", p->name);
    cfg->shared_dim = (int32_t)sdim;
    if (cfg->attn_gate && heads * head_dim * 2 > I32)
        return nx_fail(p->err, NX_E_CONFIG, "%s: layer widths overflow (gated heads)", p->name);
    if (mla && (attn_bias || qk_norm))
        return nx_fail(p->err, NX_E_UNSUPPORTED, "%s: %s with latent attention is not supported", p->name,
                       attn_bias ? "attention_bias" : "use_qk_norm");
    /* checked after narrowing: the config stores floats, and 1e-85 would become 0 */
    if (!((float)eps > 0 && eps < 1))
        return nx_fail(p->err, NX_E_CONFIG, "%s: field \"rms_norm_eps\" = %g is out of range (0, 1)", p->name,
                       eps);
    if (!((float)scaling > 0) || scaling > 1e6)
        return nx_fail(p->err, NX_E_CONFIG, "%s: field \"router_scaling_factor\" = %g must be positive",
                       p->name, scaling);

    cfg->vocab_size = (int32_t)vocab;
    cfg->hidden_size = (int32_t)hidden;
    cfg->n_layers = (int32_t)layers;
    cfg->n_heads = (int32_t)heads;
    cfg->n_kv_heads = (int32_t)kv;
    cfg->intermediate_size = (int32_t)inter;
    cfg->expert_dim = (int32_t)edim;
    cfg->n_experts = (int32_t)nexp;
    cfg->top_k = (int32_t)topk;
    cfg->n_shared_experts = (int32_t)nshared;
    cfg->first_k_dense = (int32_t)kdense;
    cfg->route_norm = route_norm;
    cfg->router_scaling = (float)scaling;
    cfg->rms_eps = (float)eps;
    cfg->rope_theta = theta;
    cfg->max_positions = maxpos;
    cfg->qk_norm = qk_norm;
    cfg->attn_bias = attn_bias;
    cfg->router = fam->router;
    cfg->mtp = fam->mtp;
    cfg->tie_embeddings = tie;
    cfg->n_nextn_layers = (int32_t)nextn;

    int32_t one[1], n1;
    cfg->bos_id = cfg->pad_id = -1;
    if ((st = get_token_ids(p, "bos_token_id", one, 1, &n1))) return st;
    if (n1) cfg->bos_id = one[0];
    if ((st = get_token_ids(p, "pad_token_id", one, 1, &n1))) return st;
    if (n1) cfg->pad_id = one[0];
    if ((st = get_token_ids(p, "eos_token_id", cfg->eos_ids, NX_MAX_EOS, &cfg->n_eos))) return st;

    return parse_quant(p, cfg);
}

void nx_config_free(nx_config *cfg) {
    if (!cfg) return;
    for (int32_t i = 0; i < cfg->n_quant_overrides; i++) free(cfg->quant_overrides[i].path);
    free(cfg->quant_overrides);
    free(cfg->linear);
    memset(cfg, 0, sizeof *cfg);
}

static nx_status parse_json(json_t *root, const char *name, nx_config *cfg, nx_error *err) {
    parser p = {root, name, err, NULL};
    nx_status st = parse_root(&p, cfg);
    json_decref(p.merged);
    if (st != NX_OK) nx_config_free(cfg);
    return st;
}

nx_status nx_config_parse(const char *json, size_t len, const char *name, nx_config *cfg,
                          nx_error *err) {
    memset(cfg, 0, sizeof *cfg);
    if (!name) name = "config.json";
    json_error_t je;
    json_t *root = json_loadb(json, len, JSON_REJECT_DUPLICATES, &je);
    if (!root)
        return nx_fail(err, NX_E_CONFIG, "%s: not valid JSON (%s, line %d)", name, je.text, je.line);
    nx_status st = parse_json(root, name, cfg, err);
    json_decref(root);
    return st;
}

nx_status nx_config_load(const char *path, nx_config *cfg, nx_error *err) {
    memset(cfg, 0, sizeof *cfg);
    json_t *root;
    const nx_status ls = nx_file_load_json(path, JSON_REJECT_DUPLICATES, &root, err);
    if (ls != NX_OK) return ls == NX_E_FORMAT ? NX_E_CONFIG : ls;
    nx_status st = parse_json(root, path, cfg, err);
    json_decref(root);
    return st;
}

bool nx_config_quant_for(const nx_config *cfg, const char *path, int *bits, int *group) {
    if (!cfg || cfg->quant_bits == 0) {
        *bits = *group = 0;
        return false;
    }
    for (int32_t i = 0; i < cfg->n_quant_overrides; i++) {
        if (strcmp(cfg->quant_overrides[i].path, path) == 0) {
            *bits = cfg->quant_overrides[i].bits;
            *group = cfg->quant_overrides[i].group;
            return true;
        }
    }
    *bits = cfg->quant_bits;
    *group = cfg->quant_group;
    return true;
}
