/* Name mapping and shape checking from a tensor store to nx_weights (docs/design.md §4, §5).
 * Every module is resolved through a short list of aliases, so one code path serves the
 * Tencent layout, MLX conversions and third-party MTP sidecars; stacked MLX experts become
 * per-expert views into the stacked data. */
#include "io/layout.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/config.h"

#define NAME_MAX_LEN 512

typedef struct loader {
    const nx_store *st;
    const nx_config *cfg;
    nx_error *err;
    /* Config quantization overrides use MLX's post-sanitize names; when the tensors carry a
     * different prefix (a Tencent-named MTP sidecar), `alias_from` is retried as `alias_to`. */
    const char *alias_from, *alias_to;
    bool saw_stacked, saw_quant; /* layout evidence */
    bool act16;                  /* quantized weights keep int16 activations (x16) */
    bool plus1;                  /* zero-centred norms stored as w: load 1 + w (load_norm) */
    char trunk[32];              /* the trunk's prefix: "model.", "model.language_model.", ... */
    nx_weights *out;             /* where loaded tensors' names are recorded */
} loader;

/* ================================================================ small helpers */

static const nx_tensor *findf(const loader *L, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static const nx_tensor *findf(const loader *L, const char *fmt, ...) {
    char name[NAME_MAX_LEN];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(name, sizeof name, fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= sizeof name) return NULL;
    return nx_store_find(L->st, name);
}

static void fmt_shape(char *buf, size_t cap, int nd, const int64_t *shape) {
    size_t o = 0;
    o += (size_t)snprintf(buf + o, cap - o, "[");
    for (int i = 0; i < nd && o < cap; i++)
        o += (size_t)snprintf(buf + o, cap - o, "%s%lld", i ? ", " : "", (long long)shape[i]);
    if (o < cap) snprintf(buf + o, cap - o, "]");
}

static nx_status fail_shape(loader *L, const nx_tensor *t, int nd, const int64_t *exp,
                            const char *note) {
    char e[128], g[128];
    fmt_shape(e, sizeof e, nd, exp);
    fmt_shape(g, sizeof g, t->n_dims, t->shape);
    return nx_fail(L->err, NX_E_FORMAT, "tensor %s (%s): expected shape %s%s, got %s", t->name,
                   nx_store_file_of(L->st, t), e, note ? note : "", g);
}

static bool shape_is(const nx_tensor *t, int nd, const int64_t *exp) {
    if (t->n_dims != nd) return false;
    for (int i = 0; i < nd; i++)
        if (t->shape[i] != exp[i]) return false;
    return true;
}

static bool is_float(nx_dtype t) {
    return t == NX_DTYPE_F32 || t == NX_DTYPE_F16 || t == NX_DTYPE_BF16;
}

static float half_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h >> 15) << 31, exp = (h >> 10) & 0x1f, man = h & 0x3ff, bits;
    if (exp == 0x1f) {
        bits = sign | 0x7f800000u | (man << 13);
    } else if (exp) {
        bits = sign | ((exp + 112) << 23) | (man << 13);
    } else if (man) { /* subnormal: normalize */
        int e = -1;
        do {
            man <<= 1;
            e++;
        } while (!(man & 0x400));
        bits = sign | ((uint32_t)(112 - e) << 23) | ((man & 0x3ff) << 13);
    } else {
        bits = sign;
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

/* Converts a stored vector to f32; src may be unaligned (MLX files are unpadded). */
static void vec_to_f32(nx_dtype dt, const uint8_t *src, float *dst, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        if (dt == NX_DTYPE_F32) {
            memcpy(&dst[i], src + 4 * i, 4);
        } else {
            uint16_t h;
            memcpy(&h, src + 2 * i, 2);
            if (dt == NX_DTYPE_BF16) {
                uint32_t b = (uint32_t)h << 16;
                memcpy(&dst[i], &b, 4);
            } else {
                dst[i] = half_to_f32(h);
            }
        }
    }
}

/* Records where data at came from (nx_weights_name_of); out of memory only loses the name. */
static void note_name(loader *L, const void *at, const nx_tensor *w, const nx_tensor *s, const nx_tensor *b) {
    nx_weights *o = L->out;
    if (!o || !at) return;
    if (o->n_names == o->cap_names) {
        const size_t cap = o->cap_names ? 2 * o->cap_names : 64;
        nx_weight_name *n = realloc(o->names, cap * sizeof *n);
        if (!n) return;
        o->names = n;
        o->cap_names = cap;
    }
    o->names[o->n_names++] = (nx_weight_name){at, w->name, s ? s->name : NULL, b ? b->name : NULL};
}

const nx_weight_name *nx_weights_name_of(const nx_weights *w, const void *at) {
    for (size_t i = 0; at && i < w->n_names; i++)
        if (w->names[i].at == at) return &w->names[i];
    return NULL;
}

/* A 1-D float tensor [n] as an owned f32 copy. A missing tensor is an error unless optional. */
static nx_status load_vec(loader *L, const char *name, int64_t n, bool optional, float **out) {
    *out = NULL;
    const nx_tensor *t = nx_store_find(L->st, name);
    if (!t) {
        if (optional) return NX_OK;
        return nx_fail(L->err, NX_E_FORMAT, "missing tensor %s", name);
    }
    if (!shape_is(t, 1, &n)) return fail_shape(L, t, 1, &n, NULL);
    if (!is_float(t->dtype))
        return nx_fail(L->err, NX_E_UNSUPPORTED, "tensor %s (%s): dtype %s (expected F32, F16 or BF16)",
                       name, nx_store_file_of(L->st, t), nx_dtype_name(t->dtype));
    float *v = malloc((size_t)(n ? n : 1) * sizeof *v);
    if (!v) return nx_fail(L->err, NX_E_NOMEM, "out of memory for tensor %s", name);
    vec_to_f32(t->dtype, t->data, v, n);
    *out = v;
    note_name(L, v, t, NULL, NULL);
    return NX_OK;
}

/* An RMSNorm weight [n]: load_vec, then 1 + w where the family's norms are zero-centred and the
 * file stores w (the forward always scales by the loaded vector). */
static nx_status load_norm(loader *L, const char *name, int64_t n, bool optional, float **out) {
    nx_status st = load_vec(L, name, n, optional, out);
    if (st == NX_OK && *out && L->plus1)
        for (int64_t i = 0; i < n; i++) (*out)[i] += 1.0f;
    return st;
}

static bool bits_ok(int64_t b) { return b == 2 || b == 3 || b == 4 || b == 5 || b == 6 || b == 8; }
static bool group_ok(int64_t g) { return g == 32 || g == 64 || g == 128; }

static const nx_quant_override *find_override(const nx_config *cfg, const char *path) {
    for (int32_t i = 0; i < cfg->n_quant_overrides; i++)
        if (strcmp(cfg->quant_overrides[i].path, path) == 0) return &cfg->quant_overrides[i];
    return NULL;
}

/* The per-path override of module `path`, trying its MLX name when the tensors use another. */
static const nx_quant_override *module_override(const loader *L, const char *path) {
    const nx_quant_override *o = find_override(L->cfg, path);
    if (o || !L->alias_from || strncmp(path, L->alias_from, strlen(L->alias_from)) != 0) return o;
    char alt[NAME_MAX_LEN];
    snprintf(alt, sizeof alt, "%s%s", L->alias_to, path + strlen(L->alias_from));
    return find_override(L->cfg, alt);
}

/* The configured bits/group for module `path`; false if the config has no quantization. */
static bool config_quant(const loader *L, const char *path, int *bits, int *group) {
    if (L->cfg->quant_bits == 0) return false;
    const nx_quant_override *o = module_override(L, path);
    *bits = o ? o->bits : L->cfg->quant_bits;
    *group = o ? o->group : L->cfg->quant_group;
    return true;
}

/* ================================================================ linear modules */

/* Resolves module `path` (no ".weight") as a linear [out, in], or with n_stack > 0 as n_stack
 * stacked matrices [n_stack, out, in] written to dst[0..n_stack). Quantized iff path.scales
 * exists; bits and group size follow from the packed and scales widths and must match the
 * config. */
static nx_status load_linear(loader *L, const char *path, int64_t n_stack, int64_t out, int64_t in,
                             nx_linear *dst) {
    const nx_tensor *w = findf(L, "%s.weight", path);
    const nx_tensor *s = findf(L, "%s.scales", path);
    int nd = n_stack ? 3 : 2, lead = n_stack ? 1 : 0;
    int64_t exp[3] = {n_stack, out, in};
    const int64_t *e = n_stack ? exp : exp + 1;
    int64_t n = n_stack ? n_stack : 1;
    if (!w) return nx_fail(L->err, NX_E_FORMAT, "missing tensor %s.weight", path);
    const char *file = nx_store_file_of(L->st, w);

    if (!s) {
        if (w->dtype == NX_DTYPE_U32)
            return nx_fail(L->err, NX_E_FORMAT, "tensor %s (%s): U32 (quantized) weight without %s.scales",
                           w->name, file, path);
        if (w->dtype == NX_DTYPE_F8_E4M3 || w->dtype == NX_DTYPE_F8_E5M2)
            return nx_fail(L->err, NX_E_UNSUPPORTED, "tensor %s (%s): %s weights are not loaded directly; convert "
                           "the checkpoint with `nextn convert` first", w->name, file, nx_dtype_name(w->dtype));
        if (!is_float(w->dtype))
            return nx_fail(L->err, NX_E_UNSUPPORTED, "tensor %s (%s): dtype %s is not supported for weights",
                           w->name, file, nx_dtype_name(w->dtype));
        if (!shape_is(w, nd, e)) return fail_shape(L, w, nd, e, NULL);
        /* A global block alone does not demand quantization (mlx-lm leaves modules without
         * to_quantized float), but an explicit per-path override does. */
        const nx_quant_override *o = module_override(L, path);
        if (o && o->bits > 0)
            return nx_fail(L->err, NX_E_FORMAT,
                           "tensor %s (%s): config quantizes %s to %d bits but %s.scales is missing",
                           w->name, file, path, o->bits, path);
        size_t rb = (size_t)in * nx_dtype_size(w->dtype);
        for (int64_t i = 0; i < n; i++) {
            dst[i] = (nx_linear){.dtype = w->dtype, .out = out, .in = in,
                                 .w = w->data + (size_t)i * (size_t)out * rb};
        }
        if (!n_stack) note_name(L, dst->w, w, NULL, NULL);
        return NX_OK;
    }

    L->saw_quant = true;
    const nx_tensor *b = findf(L, "%s.biases", path);
    if (!b)
        return nx_fail(L->err, NX_E_FORMAT, "missing tensor %s.biases (affine quantization of %s)", path,
                       path);
    if (w->dtype != NX_DTYPE_U32)
        return nx_fail(L->err, NX_E_FORMAT, "tensor %s (%s): quantized weight must be U32, got %s", w->name,
                       file, nx_dtype_name(w->dtype));
    if (!is_float(s->dtype) || s->dtype != b->dtype)
        return nx_fail(L->err, NX_E_FORMAT, "tensors %s.scales/%s.biases: dtypes %s/%s (need one float dtype)",
                       path, path, nx_dtype_name(s->dtype), nx_dtype_name(b->dtype));
    /* leading dims and rows must match; the last dim encodes bits / group size */
    if (w->n_dims != nd || w->shape[lead] != out || (n_stack && w->shape[0] != n_stack)) {
        char note[96];
        snprintf(note, sizeof note, " (quantized: last dim = %lld*bits/32)", (long long)in);
        return fail_shape(L, w, nd, e, note);
    }
    int64_t packed = w->shape[lead + 1];
    if (s->n_dims != nd || s->shape[lead] != out || (n_stack && s->shape[0] != n_stack)) {
        char note[96];
        snprintf(note, sizeof note, " (scales: last dim = %lld/group_size)", (long long)in);
        return fail_shape(L, s, nd, e, note);
    }
    if (!shape_is(b, s->n_dims, s->shape)) return fail_shape(L, b, s->n_dims, s->shape, " (= scales)");
    int64_t sc = s->shape[lead + 1];
    if (in <= 0 || packed <= 0 || (packed * 32) % in != 0 || !bits_ok(packed * 32 / in))
        return nx_fail(L->err, NX_E_FORMAT,
                       "tensor %s (%s): %lld packed words per row do not encode %lld inputs at 2-8 bits",
                       w->name, file, (long long)packed, (long long)in);
    if (sc <= 0 || in % sc != 0 || !group_ok(in / sc))
        return nx_fail(L->err, NX_E_FORMAT,
                       "tensor %s.scales (%s): %lld groups per row do not divide %lld inputs into 32/64/128",
                       path, nx_store_file_of(L->st, s), (long long)sc, (long long)in);
    int bits = (int)(packed * 32 / in), group = (int)(in / sc);
    int cb, cg;
    if (config_quant(L, path, &cb, &cg)) {
        if (cb == 0)
            return nx_fail(L->err, NX_E_FORMAT,
                           "tensor %s.scales (%s): config marks %s as not quantized", path,
                           nx_store_file_of(L->st, s), path);
        if (cb != bits || cg != group)
            return nx_fail(L->err, NX_E_FORMAT,
                           "tensor %s (%s): shapes imply %d-bit group %d but the config says %d-bit group %d",
                           w->name, file, bits, group, cb, cg);
    }
    size_t wrow = (size_t)packed * 4, srow = (size_t)sc * nx_dtype_size(s->dtype);
    for (int64_t i = 0; i < n; i++) {
        size_t r0 = (size_t)i * (size_t)out;
        dst[i] = (nx_linear){.dtype = NX_DTYPE_U32, .out = out, .in = in, .w = w->data + r0 * wrow,
                             .bits = bits, .group = group, .sdtype = s->dtype, .x16 = L->act16,
                             .scales = s->data + r0 * srow, .biases = b->data + r0 * srow};
    }
    if (!n_stack) note_name(L, dst->w, w, s, b);
    return NX_OK;
}

static nx_status load_ffn(loader *L, const char *pre, int64_t width, nx_ffn *f) {
    int64_t hidden = L->cfg->hidden_size;
    char p[NAME_MAX_LEN];
    nx_status st;
    snprintf(p, sizeof p, "%sgate_proj", pre);
    if ((st = load_linear(L, p, 0, width, hidden, &f->gate))) return st;
    snprintf(p, sizeof p, "%sup_proj", pre);
    if ((st = load_linear(L, p, 0, width, hidden, &f->up))) return st;
    snprintf(p, sizeof p, "%sdown_proj", pre);
    return load_linear(L, p, 0, hidden, width, &f->down);
}

/* ================================================================ layers */

/* transformers' fused expert tensors (Qwen3.5's trunk): mlp.experts.gate_up_proj [E, 2F, H], each
 * expert's gate rows then its up rows, and mlp.experts.down_proj [E, H, F], both float and
 * without a .weight suffix; every expert's matrices are views into them. */
static nx_status load_fused_experts(loader *L, const char *pre, nx_moe *m) {
    const int64_t E = m->n_experts, H = L->cfg->hidden_size, F = L->cfg->expert_dim;
    const nx_tensor *gu = findf(L, "%smlp.experts.gate_up_proj", pre), *dn = findf(L, "%smlp.experts.down_proj", pre);
    const int64_t egu[3] = {E, 2 * F, H}, edn[3] = {E, H, F};
    if (!dn) return nx_fail(L->err, NX_E_FORMAT, "missing tensor %smlp.experts.down_proj (with gate_up_proj)", pre);
    if (!shape_is(gu, 3, egu)) return fail_shape(L, gu, 3, egu, NULL);
    if (!shape_is(dn, 3, edn)) return fail_shape(L, dn, 3, edn, NULL);
    const nx_tensor *ts[2] = {gu, dn};
    for (int i = 0; i < 2; i++)
        if (!is_float(ts[i]->dtype))
            return nx_fail(L->err, NX_E_UNSUPPORTED, "tensor %s (%s): dtype %s (expected F32, F16 or BF16)",
                           ts[i]->name, nx_store_file_of(L->st, ts[i]), nx_dtype_name(ts[i]->dtype));
    const size_t rb = (size_t)H * nx_dtype_size(gu->dtype), db = (size_t)F * nx_dtype_size(dn->dtype);
    for (int64_t e = 0; e < E; e++) {
        const uint8_t *g = gu->data + (size_t)(e * 2 * F) * rb;
        m->experts[e].gate = (nx_linear){.dtype = gu->dtype, .out = F, .in = H, .w = g};
        m->experts[e].up = (nx_linear){.dtype = gu->dtype, .out = F, .in = H, .w = g + (size_t)F * rb};
        m->experts[e].down = (nx_linear){.dtype = dn->dtype, .out = H, .in = F, .w = dn->data + (size_t)(e * H) * db};
    }
    return NX_OK;
}

static nx_status load_experts(loader *L, const char *pre, nx_moe *m) {
    int64_t E = m->n_experts, hidden = L->cfg->hidden_size, edim = L->cfg->expert_dim;
    char p[NAME_MAX_LEN];
    nx_status st = NX_OK;
    m->experts = calloc((size_t)E, sizeof *m->experts);
    if (!m->experts) return nx_fail(L->err, NX_E_NOMEM, "out of memory for %lld experts", (long long)E);

    /* stacked [E, out, in]: mlx-lm's switch_mlp, or already-stacked experts.* */
    static const char *const stacked[] = {"mlp.switch_mlp.", "mlp.experts."};
    for (size_t k = 0; k < sizeof stacked / sizeof *stacked; k++) {
        if (!findf(L, "%s%sgate_proj.weight", pre, stacked[k])) continue;
        L->saw_stacked = true;
        nx_linear *tmp = calloc((size_t)E, sizeof *tmp);
        if (!tmp) return nx_fail(L->err, NX_E_NOMEM, "out of memory");
        static const char *const proj[] = {"gate_proj", "up_proj", "down_proj"};
        for (int j = 0; j < 3 && st == NX_OK; j++) {
            snprintf(p, sizeof p, "%s%s%s", pre, stacked[k], proj[j]);
            bool down = j == 2;
            st = load_linear(L, p, E, down ? hidden : edim, down ? edim : hidden, tmp);
            for (int64_t e = 0; st == NX_OK && e < E; e++) {
                nx_linear *d = j == 0 ? &m->experts[e].gate : j == 1 ? &m->experts[e].up : &m->experts[e].down;
                *d = tmp[e];
            }
        }
        free(tmp);
        return st;
    }
    if (findf(L, "%smlp.experts.gate_up_proj", pre)) return load_fused_experts(L, pre, m);
    /* per-expert (Tencent): mlp.experts.{e}.{gate,up,down}_proj */
    for (int64_t e = 0; e < E; e++) {
        snprintf(p, sizeof p, "%smlp.experts.%lld.", pre, (long long)e);
        if ((st = load_ffn(L, p, edim, &m->experts[e]))) return st;
    }
    return NX_OK;
}

static nx_status load_moe(loader *L, const char *pre, bool is_mtp, nx_moe *m) {
    const nx_config *cfg = L->cfg;
    int64_t hidden = cfg->hidden_size;
    char p[NAME_MAX_LEN];
    nx_status st;

    const nx_family_names *fn = &cfg->family->names;
    const nx_tensor *rw = NULL;
    const char *rname = fn->router[0];
    for (nx_keys r = fn->router; *r && !rw; r++) {
        rname = *r;
        rw = findf(L, "%s%s.weight", pre, rname);
    }
    if (!rw) return nx_fail(L->err, NX_E_FORMAT, "missing tensor %s%s.weight", pre, fn->router[0]);
    if (rw->n_dims != 2 || rw->shape[0] <= 0) {
        int64_t e[2] = {cfg->n_experts, hidden};
        return fail_shape(L, rw, 2, e, NULL);
    }
    /* The MTP layer may be pruned differently from the trunk: its router decides. */
    m->n_experts = is_mtp ? (int32_t)(rw->shape[0] > INT32_MAX ? INT32_MAX : rw->shape[0])
                          : cfg->n_experts;
    if (m->n_experts < cfg->top_k)
        return nx_fail(L->err, NX_E_FORMAT, "tensor %s (%s): %d experts, fewer than num_experts_per_tok %d",
                       rw->name, nx_store_file_of(L->st, rw), m->n_experts, cfg->top_k);
    snprintf(p, sizeof p, "%s%s", pre, rname);
    if ((st = load_linear(L, p, 0, m->n_experts, hidden, &m->router))) return st;
    m->router.x16 = true; /* expert choice is discontinuous in the logits */

    for (nx_keys b = fn->expert_bias; *b; b++) {
        snprintf(p, sizeof p, "%s%s", pre, *b);
        if (!nx_store_find(L->st, p)) continue;
        if ((st = load_vec(L, p, m->n_experts, false, &m->expert_bias))) return st;
        break;
    }
    if (m->n_experts % cfg->n_group != 0 || cfg->top_k > cfg->topk_group * (m->n_experts / cfg->n_group))
        return nx_fail(L->err, NX_E_FORMAT,
                       "tensor %s (%s): %d experts do not split into n_group %d groups of which topk_group %d "
                       "hold num_experts_per_tok %d", rw->name, nx_store_file_of(L->st, rw), m->n_experts,
                       cfg->n_group, cfg->topk_group, cfg->top_k);
    if ((st = load_experts(L, pre, m))) return st;

    m->has_shared = cfg->n_shared_experts > 0;
    if (m->has_shared) {
        int64_t width = cfg->shared_dim;
        const char *sh = fn->shared[0];
        for (nx_keys k = fn->shared; *k; k++)
            if (findf(L, "%s%sgate_proj.weight", pre, *k)) {
                sh = *k;
                break;
            }
        snprintf(p, sizeof p, "%s%s", pre, sh);
        if ((st = load_ffn(L, p, width, &m->shared))) return st;
        snprintf(p, sizeof p, "%s%s", pre, fn->shared_gate ? fn->shared_gate : "");
        if (fn->shared_gate && (st = load_linear(L, p, 0, 1, hidden, &m->shared_gate))) return st;
        m->shared_gate.x16 = true; /* a scalar gate: exact inputs, as the router */
    }
    return NX_OK;
}

/* ================================================================ latent attention */

/* n_stack stacked [n_stack, out, in] matrices at path as one view of n_stack·out rows (their
 * rows and scales are contiguous). */
static nx_status load_stacked_rows(loader *L, const char *path, int64_t n_stack, int64_t out, int64_t in,
                                   nx_linear *dst) {
    nx_linear *tmp = calloc((size_t)n_stack, sizeof *tmp);
    if (!tmp) return nx_fail(L->err, NX_E_NOMEM, "out of memory");
    nx_status st = load_linear(L, path, n_stack, out, in, tmp);
    if (st == NX_OK) {
        *dst = tmp[0];
        dst->out = n_stack * out;
    }
    free(tmp);
    return st;
}

/* wk_b from HF's kv_b_proj ([n_heads·(nope + v), kv_lora]): per head its nope key rows,
 * transposed into [kv_lora, nope] (mlx-lm's embed_q), so the query's nope part multiplies into
 * the latent space as an ordinary matmul. An exact copy for float weights (same dtype, the same
 * bits as mlx-lm's split); quantized rows are widened to f32. */
static nx_status transpose_k_half(loader *L, const nx_linear *kvb, nx_mla_layer *a) {
    const nx_config *cfg = L->cfg;
    const int64_t nh = cfg->n_heads, r = cfg->mla.kv_lora_rank, nope = cfg->mla.qk_nope;
    const int64_t stride = nope + cfg->mla.v_head_dim;
    const nx_dtype dt = kvb->dtype == NX_DTYPE_U32 ? NX_DTYPE_F32 : kvb->dtype;
    const size_t es = nx_dtype_size(dt);
    uint8_t *dst = malloc((size_t)(nh * r * nope) * es);
    float *row = malloc(sizeof(float) * (size_t)r);
    if (!dst || !row) {
        free(dst);
        free(row);
        return nx_fail(L->err, NX_E_NOMEM, "out of memory transposing kv_b_proj");
    }
    for (int64_t h = 0; h < nh; h++)
        for (int64_t i = 0; i < nope; i++) {
            const int64_t src = h * stride + i;
            for (int64_t c = 0; c < r; c++) {
                uint8_t *d = dst + (size_t)((h * r + c) * nope + i) * es;
                if (dt == NX_DTYPE_F32 && kvb->dtype == NX_DTYPE_U32) {
                    if (c == 0) nx_linear_get_row(kvb, src, row);
                    memcpy(d, &row[c], es);
                } else {
                    memcpy(d, (const uint8_t *)kvb->w + (size_t)(src * r + c) * es, es);
                }
            }
        }
    free(row);
    a->wk_b_owned = dst;
    a->wk_b = (nx_linear){.dtype = dt, .out = nh * r, .in = nope, .w = dst, .x16 = kvb->x16};
    return NX_OK;
}

/* Multi-head latent attention's weights at `pre` (HF names, or mlx-lm's split of kv_b_proj into
 * embed_q / unembed_out). */
static nx_status load_mla(loader *L, const char *pre, nx_layer *ly) {
    const nx_config *cfg = L->cfg;
    const nx_mla *m = &cfg->mla;
    const int64_t H = cfg->hidden_size, nh = cfg->n_heads, qk = m->qk_nope + m->qk_rope, r = m->kv_lora_rank;
    nx_mla_layer *a = &ly->mla;
    char p[NAME_MAX_LEN];
    nx_status st;
#define P(suffix) (snprintf(p, sizeof p, "%s%s", pre, suffix), p)
    if (m->q_lora_rank
            ? ((st = load_linear(L, P("self_attn.q_a_proj"), 0, m->q_lora_rank, H, &a->wq_a)) ||
               (st = load_vec(L, P("self_attn.q_a_layernorm.weight"), m->q_lora_rank, false, &a->q_a_norm)) ||
               (st = load_linear(L, P("self_attn.q_b_proj"), 0, nh * qk, m->q_lora_rank, &a->wq_b)))
            : (st = load_linear(L, P("self_attn.q_proj"), 0, nh * qk, H, &ly->wq)))
        return st;
    if ((st = load_linear(L, P("self_attn.kv_a_proj_with_mqa"), 0, r + m->qk_rope, H, &a->wkv_a)) ||
        (st = load_vec(L, P("self_attn.kv_a_layernorm.weight"), r, false, &a->kv_a_norm)) ||
        (st = load_linear(L, P("self_attn.o_proj"), 0, H, nh * m->v_head_dim, &ly->wo)))
        return st;
    a->wv_b_rows = nh * m->v_head_dim;
    if (findf(L, "%sself_attn.embed_q.weight", pre)) {
        a->wv_b_stride = m->v_head_dim;
        a->wv_b_off = 0;
        if ((st = load_stacked_rows(L, P("self_attn.embed_q"), nh, r, m->qk_nope, &a->wk_b))) return st;
        return load_stacked_rows(L, P("self_attn.unembed_out"), nh, m->v_head_dim, r, &a->wv_b);
    }
    a->wv_b_stride = m->qk_nope + m->v_head_dim;
    a->wv_b_off = m->qk_nope;
    if ((st = load_linear(L, P("self_attn.kv_b_proj"), 0, nh * (m->qk_nope + m->v_head_dim), r, &a->wv_b))) return st;
    return transpose_k_half(L, &a->wv_b, a);
#undef P
}

/* The GQA projections, their biases and q/k-norm at `pre`. */
static nx_status load_gqa(loader *L, const char *pre, nx_layer *ly) {
    const nx_config *cfg = L->cfg;
    int64_t hidden = cfg->hidden_size, qd = (int64_t)cfg->n_heads * cfg->head_dim,
            kvd = (int64_t)cfg->n_kv_heads * cfg->head_dim;
    char p[NAME_MAX_LEN];
    nx_status st;
#define P(suffix) (snprintf(p, sizeof p, "%s%s", pre, suffix), p)
    if ((st = load_linear(L, P("self_attn.q_proj"), 0, cfg->attn_gate ? 2 * qd : qd, hidden, &ly->wq)) ||
        (st = load_linear(L, P("self_attn.k_proj"), 0, kvd, hidden, &ly->wk)) ||
        (st = load_linear(L, P("self_attn.v_proj"), 0, kvd, hidden, &ly->wv)) ||
        (st = load_linear(L, P("self_attn.o_proj"), 0, hidden, qd, &ly->wo)))
        return st;
    if (cfg->attn_bias &&
        ((st = load_vec(L, P("self_attn.q_proj.bias"), qd, false, &ly->bq)) ||
         (st = load_vec(L, P("self_attn.k_proj.bias"), kvd, false, &ly->bk)) ||
         (st = load_vec(L, P("self_attn.v_proj.bias"), kvd, false, &ly->bv))))
        return st;
    if (cfg->qk_norm &&
        ((st = load_norm(L, P("self_attn.q_norm.weight"), cfg->head_dim, false, &ly->q_norm)) ||
         (st = load_norm(L, P("self_attn.k_norm.weight"), cfg->head_dim, false, &ly->k_norm))))
        return st;
    return NX_OK;
#undef P
}

/* The DeltaNet's convolution weights, [C, 1, K] (HF) or [C, K, 1] (mlx-lm): C x K values either
 * way, as an owned f32 copy [C][K]. */
static nx_status load_conv(loader *L, const char *name, int64_t C, int64_t K, float **out) {
    const nx_tensor *t = nx_store_find(L->st, name);
    const int64_t hf[3] = {C, 1, K}, mlx[3] = {C, K, 1};
    if (!t) return nx_fail(L->err, NX_E_FORMAT, "missing tensor %s", name);
    if (!shape_is(t, 3, hf) && !shape_is(t, 3, mlx)) return fail_shape(L, t, 3, hf, " (or [C, K, 1])");
    if (!is_float(t->dtype))
        return nx_fail(L->err, NX_E_UNSUPPORTED, "tensor %s (%s): dtype %s (expected F32, F16 or BF16)", name,
                       nx_store_file_of(L->st, t), nx_dtype_name(t->dtype));
    if (!(*out = malloc(sizeof(float) * (size_t)(C * K)))) return nx_fail(L->err, NX_E_NOMEM, "out of memory");
    vec_to_f32(t->dtype, t->data, *out, C * K);
    return NX_OK;
}

/* A Gated DeltaNet layer at `pre`: Qwen3.5's split input projections or Qwen3-Next's fused ones. */
static nx_status load_dn(loader *L, const char *pre, nx_dn_layer *d) {
    const nx_config *cfg = L->cfg;
    const nx_deltanet *g = &cfg->dn;
    const int64_t H = cfg->hidden_size, nv = g->n_v_heads, vd = nv * g->v_dim, C = nx_deltanet_channels(g);
    char p[NAME_MAX_LEN];
    nx_status st;
    float *A_log = NULL;
#define P(suffix) (snprintf(p, sizeof p, "%slinear_attn.%s", pre, suffix), p)
    if (findf(L, "%slinear_attn.in_proj_qkvz.weight", pre) || findf(L, "%slinear_attn.in_proj_qkvz.scales", pre)) {
        if ((st = load_linear(L, P("in_proj_qkvz"), 0, C + vd, H, &d->qkvz)) ||
            (st = load_linear(L, P("in_proj_ba"), 0, 2 * nv, H, &d->ba)))
            return st;
    } else if ((st = load_linear(L, P("in_proj_qkv"), 0, C, H, &d->qkv)) ||
               (st = load_linear(L, P("in_proj_z"), 0, vd, H, &d->z)) ||
               (st = load_linear(L, P("in_proj_b"), 0, nv, H, &d->b)) ||
               (st = load_linear(L, P("in_proj_a"), 0, nv, H, &d->a))) {
        return st;
    }
    if ((st = load_conv(L, P("conv1d.weight"), C, g->conv_k, &d->conv)) ||
        (st = load_vec(L, P("dt_bias"), nv, false, &d->dt_bias)) || (st = load_vec(L, P("A_log"), nv, false, &A_log)) ||
        (st = load_vec(L, P("norm.weight"), g->v_dim, false, &d->norm)) ||
        (st = load_linear(L, P("out_proj"), 0, H, vd, &d->out))) {
        free(A_log);
        return st;
    }
#undef P
    for (int64_t h = 0; h < nv; h++) A_log[h] = -expf(A_log[h]);
    d->neg_A = A_log;
    return NX_OK;
}

/* One decoder layer at name prefix `pre` (ending in '.'). is_moe < 0: decide from the tensors
 * (the MTP layer is MoE in hy_v3, but a dense head in a tiny test model is also accepted). */
static nx_status load_layer(loader *L, const char *pre, int is_moe, bool is_mtp, nx_layer *ly) {
    const nx_config *cfg = L->cfg;
    int64_t hidden = cfg->hidden_size;
    char p[NAME_MAX_LEN];
    nx_status st;
#define P(suffix) (snprintf(p, sizeof p, "%s%s", pre, suffix), p)
    if ((st = load_norm(L, P("input_layernorm.weight"), hidden, false, &ly->attn_norm)) ||
        (st = load_norm(L, P("post_attention_layernorm.weight"), hidden, false, &ly->ffn_norm)) ||
        (st = ly->linear                      ? load_dn(L, pre, &ly->dn)
              : cfg->attention == NX_ATTN_MLA ? load_mla(L, pre, ly)
                                              : load_gqa(L, pre, ly)))
        return st;
    if (is_moe < 0) {
        bool router = false;
        for (nx_keys r = cfg->family->names.router; *r && !router; r++) router = findf(L, "%s%s.weight", pre, *r);
        is_moe = router || !findf(L, "%smlp.gate_proj.weight", pre);
    }
    ly->is_moe = is_moe;
    if (is_moe) return load_moe(L, pre, is_mtp, &ly->moe);
    return load_ffn(L, P("mlp."), cfg->intermediate_size, &ly->dense);
#undef P
}

/* ================================================================ the MTP head */

typedef struct mtp_names {
    const char *head;      /* prefix of enorm/hnorm/eh_proj/final_layernorm */
    const char *blocks[3]; /* candidate prefixes of the decoder layer */
    const char *mlx_head, *mlx_block; /* canonical MLX names for config overrides */
} mtp_names;

static bool is_mtp_name(const char *name, const char *layer_pre) {
    return strncmp(name, "mtp.", 4) == 0 || strncmp(name, layer_pre, strlen(layer_pre)) == 0;
}

/* "sidecar" if the MTP lives in a model-mtp*.safetensors file or in a file holding nothing
 * but MTP tensors; "inline" if it shares a file with the trunk; "on another rank" if this rank's
 * share of the checkpoint does not hold it. */
static const char *mtp_location(const loader *L, const nx_tensor *t, const char *layer_pre) {
    if (!nx_store_holds(L->st, t)) return "on another rank"; /* a share without the head */
    const char *fn = nx_store_file_of(L->st, t);
    if (fn && strncmp(fn, "model-mtp", 9) == 0) return "sidecar";
    for (size_t i = 0; i < nx_store_count(L->st); i++) {
        const nx_tensor *o = nx_store_tensor(L->st, i);
        if (o->file == t->file && !is_mtp_name(o->name, layer_pre)) return "inline";
    }
    return "sidecar";
}

/* The head's final norm under the first of the family's names present (the first is the one
 * an error names). */
static nx_status load_mtp_norm(loader *L, const char *head, float **out) {
    nx_keys names = L->cfg->family->names.mtp_norm;
    char p[NAME_MAX_LEN];
    for (nx_keys n = names; *n; n++) {
        snprintf(p, sizeof p, "%s%s.weight", head, *n);
        if (nx_store_find(L->st, p)) return load_norm(L, p, L->cfg->hidden_size, false, out);
    }
    snprintf(p, sizeof p, "%s%s.weight", head, names[0]);
    return load_norm(L, p, L->cfg->hidden_size, false, out);
}

static nx_status load_mtp(loader *L, nx_weights *w) {
    const nx_config *cfg = L->cfg;
    const nx_family_names *fn = &cfg->family->names;
    const char *fc = fn->mtp_fc ? fn->mtp_fc : "eh_proj", *en = fn->mtp_enorm ? fn->mtp_enorm : "enorm",
               *hn = fn->mtp_hnorm ? fn->mtp_hnorm : "hnorm";
    char lp[96];
    snprintf(lp, sizeof lp, "%slayers.%d.", L->trunk, cfg->n_layers);
    const mtp_names cands[] = {
        {lp, {lp, NULL}, "mtp.", "mtp.layer."},
        {"mtp.", {"mtp.layer.", "mtp.layers.0.", "mtp."}, NULL, NULL},
        {"mtp.0.", {"mtp.0.block.", "mtp.0."}, NULL, NULL},
    };
    const mtp_names *nm = NULL;
    const nx_tensor *eh = NULL;
    for (size_t k = 0; k < sizeof cands / sizeof *cands && !eh; k++) {
        nm = &cands[k];
        eh = findf(L, "%s%s.weight", nm->head, fc);
        if (!eh) eh = findf(L, "%s%s.scales", nm->head, fc);
    }
    if (!eh) {
        /* No head: headless unless some MTP tensor exists (then the MTP is broken). Copies of
         * embed_tokens / shared_head under the MTP prefix are unused and do not count. */
        for (size_t i = 0; i < nx_store_count(L->st); i++) {
            const char *n = nx_store_tensor(L->st, i)->name;
            if (is_mtp_name(n, lp) && !strstr(n, "embed_tokens") && !strstr(n, "shared_head."))
                return nx_fail(L->err, NX_E_FORMAT,
                               "MTP tensor %s is present but %s%s.weight (or mtp.%s.weight) is "
                               "missing (or num_hidden_layers = %d undercounts the trunk)",
                               n, lp, fc, fc, cfg->n_layers);
        }
        w->has_mtp = false;
        snprintf(w->mtp_where, sizeof w->mtp_where, "none");
        return NX_OK;
    }
    const char *block = NULL;
    for (int k = 0; k < 3 && nm->blocks[k] && !block; k++)
        if (findf(L, "%sinput_layernorm.weight", nm->blocks[k])) block = nm->blocks[k];
    if (!block) return nx_fail(L->err, NX_E_FORMAT, "missing tensor %sinput_layernorm.weight", nm->blocks[0]);

    int64_t hidden = cfg->hidden_size;
    char p[NAME_MAX_LEN];
    nx_status st;
    nx_mtp_weights *m = &w->mtp;
    L->alias_from = nm->mlx_head ? nm->head : NULL;
    L->alias_to = nm->mlx_head;
    /* a sidecar head may be in the other layout than the trunk: its own norms decide (stacked
     * experts are mlx-lm's naming, which folds the +1 in) */
    const bool trunk_plus1 = L->plus1;
    if (cfg->family->hybrid.norm_plus1)
        L->plus1 = !findf(L, "%smlp.switch_mlp.gate_proj.weight", block) &&
                   !findf(L, "%smlp.experts.gate_proj.weight", block);
#define H(suffix) (snprintf(p, sizeof p, "%s%s", nm->head, suffix), p)
    char nb[64];
    if ((st = load_norm(L, (snprintf(nb, sizeof nb, "%s.weight", en), H(nb)), hidden, false, &m->enorm)) ||
        (st = load_norm(L, (snprintf(nb, sizeof nb, "%s.weight", hn), H(nb)), hidden, true, &m->hnorm)) ||
        (st = load_mtp_norm(L, nm->head, &m->final_norm)) ||
        (st = load_linear(L, H(fc), 0, hidden, 2 * hidden, &m->eh_proj)))
        return st;
    if (cfg->mtp.own_embed_head &&
        (((findf(L, "%sembed_tokens.weight", nm->head)) &&
          (st = load_linear(L, H("embed_tokens"), 0, cfg->vocab_size, hidden, &m->embed))) ||
         ((findf(L, "%sshared_head.head.weight", nm->head)) &&
          (st = load_linear(L, H("shared_head.head"), 0, cfg->vocab_size, hidden, &m->head)))))
        return st;
#undef H
    L->alias_to = nm->mlx_block;
    if ((st = load_layer(L, block, -1, true, &m->layer))) return st;
    L->alias_from = L->alias_to = NULL;
    L->plus1 = trunk_plus1;
    w->has_mtp = true;
    snprintf(w->mtp_where, sizeof w->mtp_where, "%s", mtp_location(L, eh, lp));
    return NX_OK;
}

/* ================================================================ entry points */

static void free_layer(nx_layer *ly) {
    free(ly->dn.conv);
    free(ly->dn.neg_A);
    free(ly->dn.dt_bias);
    free(ly->dn.norm);
    free(ly->mla.q_a_norm);
    free(ly->mla.kv_a_norm);
    free(ly->mla.wk_b_owned);
    free(ly->attn_norm);
    free(ly->ffn_norm);
    free(ly->q_norm);
    free(ly->k_norm);
    free(ly->bq);
    free(ly->bk);
    free(ly->bv);
    free(ly->moe.expert_bias);
    free(ly->moe.experts);
}

/* The trunk's prefix: the first of "model.", a vision-language wrapper's "model.language_model."
 * (transformers) or "language_model.model." (mlx-lm) that holds embed_tokens ("model." when none
 * does, for the error to name). */
static void find_trunk(loader *L) {
    static const char *const cands[] = {"model.", "model.language_model.", "language_model.model."};
    snprintf(L->trunk, sizeof L->trunk, "%s", cands[0]);
    for (size_t i = 0; i < sizeof cands / sizeof *cands; i++)
        if (findf(L, "%sembed_tokens.weight", cands[i])) {
            snprintf(L->trunk, sizeof L->trunk, "%s", cands[i]);
            return;
        }
}

static const char *lm_head_name(const loader *L) {
    return strcmp(L->trunk, "language_model.model.") == 0 ? "language_model.lm_head" : "lm_head";
}

/* Whether a hybrid trunk stores its zero-centred norms with the +1 folded in: mlx-lm's sanitize()
 * folds it and also turns conv1d weights [C, 1, K] into [C, K, 1], its own test for "already
 * converted" — the same test here, on the first DeltaNet layer. */
static bool trunk_norms_folded(const loader *L) {
    for (int32_t l = 0; L->cfg->linear && l < L->cfg->n_layers; l++) {
        if (!L->cfg->linear[l]) continue;
        const nx_tensor *t = findf(L, "%slayers.%d.linear_attn.conv1d.weight", L->trunk, l);
        return t && t->n_dims == 3 && t->shape[2] == 1 && t->shape[1] > 1;
    }
    return false;
}

void nx_weights_free(nx_weights *w) {
    if (!w) return;
    /* untouched entries of the calloc'd array hold NULLs */
    for (int32_t l = 0; w->layers && l < w->n_layers; l++) free_layer(&w->layers[l]);
    free(w->layers);
    free(w->final_norm);
    free(w->mtp.enorm);
    free(w->mtp.hnorm);
    free(w->mtp.final_norm);
    free_layer(&w->mtp.layer);
    free(w->names);
    memset(w, 0, sizeof *w);
}

nx_status nx_weights_load(const nx_store *st, const nx_config *cfg, bool want_mtp, bool act16, nx_weights *w,
                          nx_error *err) {
    memset(w, 0, sizeof *w);
    loader L = {.st = st, .cfg = cfg, .err = err, .act16 = act16, .out = w};
    nx_status s;
    int64_t vocab = cfg->vocab_size, hidden = cfg->hidden_size;
    if (cfg->n_layers <= 0 || hidden <= 0 || vocab <= 0)
        return nx_fail(err, NX_E_ARG, "configuration has no layers");

    find_trunk(&L);
    char name[96];
    snprintf(name, sizeof name, "%sembed_tokens", L.trunk);
    if ((s = load_linear(&L, name, 0, vocab, hidden, &w->embed))) goto fail;
    if (cfg->tie_embeddings) {
        w->lm_head = w->embed;
    } else if ((s = load_linear(&L, lm_head_name(&L), 0, vocab, hidden, &w->lm_head))) {
        goto fail;
    }
    L.plus1 = cfg->family->hybrid.norm_plus1 && !trunk_norms_folded(&L);
    snprintf(name, sizeof name, "%snorm.weight", L.trunk);
    if ((s = load_norm(&L, name, hidden, false, &w->final_norm))) goto fail;
    w->layers = calloc((size_t)cfg->n_layers, sizeof *w->layers);
    if (!w->layers) {
        s = nx_fail(err, NX_E_NOMEM, "out of memory for %d layers", cfg->n_layers);
        goto fail;
    }
    w->n_layers = cfg->n_layers;
    for (int32_t l = 0, slot = 0; l < cfg->n_layers; l++) {
        char pre[64];
        snprintf(pre, sizeof pre, "%slayers.%d.", L.trunk, l);
        w->layers[l].linear = cfg->linear && cfg->linear[l];
        w->layers[l].dn.slot = w->layers[l].linear ? slot++ : -1;
        if ((s = load_layer(&L, pre, l >= cfg->first_k_dense, false, &w->layers[l]))) goto fail;
    }
    snprintf(w->layout, sizeof w->layout, "%s", L.saw_stacked || L.saw_quant ? "mlx" : cfg->family->hf_layout);
    snprintf(w->mtp_where, sizeof w->mtp_where, "none");
    if (want_mtp && (s = load_mtp(&L, w))) goto fail;
    return NX_OK;
fail:
    nx_weights_free(w);
    return s;
}
