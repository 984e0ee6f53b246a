/* Non-finite weights and logits, and model files changed under the mapping (validate.h).
 *
 * The weight scan at load covers what every token goes through or what picks the experts: every
 * norm vector (trunk, MTP, q/k norms), every router (its gate weight in full, and the expert
 * bias), and the embedding and lm_head. For quantized matrices the scales and biases are scanned
 * (a packed integer weight cannot be NaN; a NaN scale makes its whole group NaN). An unquantized
 * embedding or lm_head is scanned in full up to EMBED_SCAN_BYTES, and beyond that on evenly
 * spaced rows adding up to that budget: a bad row hurts only its own token, while a wholesale
 * problem (a wrong dtype, a corrupt shard) shows on any sample. Expert and attention matrices are
 * not scanned (their bytes are the bulk of the checkpoint); a NaN there reaches the logits, which
 * are checked on every forward pass instead. */
#include "model/validate.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "base/error.h"
#include "model/model_internal.h"

#define EMBED_SCAN_BYTES ((size_t)32 << 20)

int64_t nx_first_nonfinite_f32(const float *x, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!isfinite(x[i])) return (int64_t)i;
    return -1;
}

/* Whether any of n 16-bit floats at p has an all-ones exponent (mask: F16 0x7c00, BF16 0x7f80),
 * branch-free so the loop vectorizes (unaligned data: memcpy). */
static bool any_bad16(const uint8_t *p, size_t n, uint16_t mask) {
    unsigned any = 0;
    for (size_t i = 0; i < n; i++) {
        uint16_t h;
        memcpy(&h, p + 2 * i, 2);
        any |= (h & mask) == mask;
    }
    return any != 0;
}

static bool any_bad32(const uint8_t *p, size_t n) {
    unsigned any = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, p + 4 * i, 4);
        any |= (u & 0x7f800000u) == 0x7f800000u;
    }
    return any != 0;
}

/* Index of the first NaN or infinity of n elements of a float dtype at p, or -1: blocks are
 * tested whole, and only a bad block is searched element by element. */
static int64_t first_bad(const void *p, nx_dtype dt, size_t n) {
    if (dt != NX_DTYPE_F32 && dt != NX_DTYPE_F16 && dt != NX_DTYPE_BF16) return -1;
    const size_t es = dt == NX_DTYPE_F32 ? 4 : 2, block = 4096;
    const uint16_t mask = dt == NX_DTYPE_F16 ? 0x7c00u : 0x7f80u;
    const uint8_t *b = p;
    for (size_t at = 0; at < n; at += block) {
        const size_t k = n - at < block ? n - at : block;
        const uint8_t *q = b + at * es;
        if (es == 4 ? !any_bad32(q, k) : !any_bad16(q, k, mask)) continue;
        for (size_t i = 0; i < k; i++)
            if (es == 4 ? any_bad32(q + 4 * i, 1) : any_bad16(q + 2 * i, 1, mask)) return (int64_t)(at + i);
    }
    return -1;
}

/* The checks name a tensor as the file spells it (the loader's record, nx_weights_name_of); the
 * fallback, for data loaded otherwise, is the Tencent-layout name built by the caller. */
typedef struct scan {
    const nx_weights *w;
    nx_error *err;
} scan;

static nx_status bad(const scan *sc, const char *name, int64_t i, int64_t row_len) {
    return nx_fail(sc->err, NX_E_FORMAT,
                   "tensor %s: non-finite value (NaN or infinity) at row %lld, column %lld; the checkpoint is corrupt",
                   name, (long long)(i / row_len), (long long)(i % row_len));
}

static nx_status check_vec(const scan *sc, const float *v, int64_t n, const char *name) {
    const int64_t i = v ? nx_first_nonfinite_f32(v, (size_t)n) : -1;
    if (i < 0) return NX_OK;
    const nx_weight_name *nm = nx_weights_name_of(sc->w, v);
    return bad(sc, nm ? nm->weight : name, i, n);
}

/* One weight matrix: the scales and biases of a quantized one, else its rows (all of them, or
 * evenly spaced ones within budget bytes). */
static nx_status check_linear(const scan *sc, const nx_linear *W, const char *name, size_t budget) {
    if (!W->w || W->out <= 0) return NX_OK;
    const nx_weight_name *nm = nx_weights_name_of(sc->w, W->w);
    char part[160];
    if (W->dtype == NX_DTYPE_U32) {
        const int64_t per_row = W->in / W->group, n = W->out * per_row;
        int64_t i = first_bad(W->scales, W->sdtype, (size_t)n);
        const bool in_scales = i >= 0;
        if (!in_scales) i = W->biases ? first_bad(W->biases, W->sdtype, (size_t)n) : -1;
        if (i < 0) return NX_OK;
        const char *stored = nm ? (in_scales ? nm->scales : nm->biases) : NULL;
        if (!stored) {
            snprintf(part, sizeof part, "%s (%s)", name, in_scales ? "scales" : "biases");
            stored = part;
        }
        return bad(sc, stored, i, per_row);
    }
    const size_t row = nx_linear_weight_row_bytes(W);
    const int64_t rows = row * (size_t)W->out <= budget ? W->out : (int64_t)(budget / row > 0 ? budget / row : 1);
    for (int64_t k = 0; k < rows; k++) {
        const int64_t r = rows == W->out ? k : k * (W->out - 1) / (rows > 1 ? rows - 1 : 1);
        const int64_t i = first_bad((const uint8_t *)W->w + (size_t)r * row, W->dtype, (size_t)W->in);
        if (i >= 0) return bad(sc, nm ? nm->weight : name, r * W->in + i, W->in);
    }
    return NX_OK;
}

/* One layer's norms and router; l names it in the fallback names (the MTP layer is index n_layers). */
static nx_status check_layer(const scan *sc, const nx_layer *L, int32_t l, const nx_config *cfg) {
    const int32_t H = cfg->hidden_size, head_dim = cfg->head_dim;
    char name[96];
    nx_status s;
#define VEC(v, n, fmt)                                                         \
    do {                                                                       \
        snprintf(name, sizeof name, "model.layers.%d." fmt, l);                \
        if ((s = check_vec(sc, (v), (n), name)) != NX_OK) return s;            \
    } while (0)
    VEC(L->attn_norm, H, "input_layernorm.weight");
    VEC(L->ffn_norm, H, "post_attention_layernorm.weight");
    VEC(L->q_norm, head_dim, "self_attn.q_norm.weight");
    VEC(L->k_norm, head_dim, "self_attn.k_norm.weight");
    VEC(L->mla.q_a_norm, cfg->mla.q_lora_rank, "self_attn.q_a_layernorm.weight");
    VEC(L->mla.kv_a_norm, cfg->mla.kv_lora_rank, "self_attn.kv_a_layernorm.weight");
    if (L->linear) {
        const nx_deltanet *g = &cfg->dn;
        VEC(L->dn.conv, (int64_t)nx_deltanet_channels(g) * g->conv_k, "linear_attn.conv1d.weight");
        VEC(L->dn.neg_A, g->n_v_heads, "linear_attn.A_log");
        VEC(L->dn.dt_bias, g->n_v_heads, "linear_attn.dt_bias");
        VEC(L->dn.norm, g->v_dim, "linear_attn.norm.weight");
    }
    if (!L->is_moe) return NX_OK;
    VEC(L->moe.expert_bias, L->moe.n_experts, "mlp.expert_bias");
#undef VEC
    snprintf(name, sizeof name, "model.layers.%d.mlp.router.gate.weight", l);
    return check_linear(sc, &L->moe.router, name, SIZE_MAX);
}

nx_status nx_weights_validate(const nx_weights *w, const nx_config *cfg, nx_error *err) {
    const int32_t H = cfg->hidden_size;
    const scan sc = {w, err};
    nx_status s;
    if ((s = check_linear(&sc, &w->embed, "model.embed_tokens.weight", EMBED_SCAN_BYTES)) != NX_OK) return s;
    if (w->lm_head.w != w->embed.w &&
        (s = check_linear(&sc, &w->lm_head, "lm_head.weight", EMBED_SCAN_BYTES)) != NX_OK)
        return s;
    if ((s = check_vec(&sc, w->final_norm, H, "model.norm.weight")) != NX_OK) return s;
    for (int32_t l = 0; l < w->n_layers; l++)
        if ((s = check_layer(&sc, &w->layers[l], l, cfg)) != NX_OK) return s;
    if (!w->has_mtp) return NX_OK;
    const nx_mtp_weights *m = &w->mtp;
    char name[96];
    const float *vecs[3] = {m->enorm, m->hnorm, m->final_norm};
    static const char *const names[3] = {"enorm.weight", "hnorm.weight", "final_layernorm.weight"};
    for (int i = 0; i < 3; i++) {
        snprintf(name, sizeof name, "model.layers.%d.%s", cfg->n_layers, names[i]);
        if ((s = check_vec(&sc, vecs[i], H, name)) != NX_OK) return s;
    }
    return check_layer(&sc, &m->layer, cfg->n_layers, cfg);
}

nx_status nx_logits_check(const float *logits, int32_t rows, int32_t V, int32_t n_valid, const char *what,
                          nx_error *err) {
    for (int32_t r = 0; r < rows; r++) {
        const float *row = logits + (size_t)r * (size_t)V;
        const int64_t i = nx_first_nonfinite_f32(row, (size_t)n_valid);
        if (i >= 0)
            return nx_fail(err, NX_E_STATE,
                           "%s logits: %s at token %lld of row %d (a NaN or infinity in the weights or the "
                           "activations); no token is sampled from them",
                           what, isnan(row[i]) ? "NaN" : "infinity", (long long)i, r);
    }
    return NX_OK;
}

nx_status nx_model_check_files(const nx_model *m, nx_error *err) {
    return nx_store_check(m->store, err);
}
