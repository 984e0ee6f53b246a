#!/usr/bin/python3
"""Independent float32 reference forward for the multi-head latent attention (MLA) families with
their MTP layer: GLM-4.7-Flash (model_type glm4_moe_lite) and DeepSeek-V3 / V3.1 (deepseek_v3).

Written from the public model definitions, not from the engine:
  transformers models/glm4_moe_lite/modeling_glm4_moe_lite.py, models/deepseek_v3/modeling_deepseek_v3.py,
  modeling_rope_utils.py (_compute_yarn_parameters);
  vLLM model_executor/models/deepseek_v2.py (MLA, deepseek_yarn), deepseek_mtp.py, glm4_moe_lite_mtp.py;
  mlx-lm models/glm4_moe_lite.py, deepseek_v3.py, mla.py, rope_utils.py (MLX names, YarnRoPE).
Router, MoE, dense layers, RMSNorm, MTP wiring and checkpoint loading are glm4_moe's
(tools/ref/glm4_moe.py, imported): the two families route exactly as GLM-4.5 does, with DeepSeek's
group limit when n_group > 1.

Attention is computed NAIVELY (non-absorbed): kv_b_proj expands the latent of every position into
full per-head keys and values, then a causal softmax per head.
* q = q_b_proj(q_a_layernorm(q_a_proj(x))) when q_lora_rank is set, else q_proj(x); per head
  [qk_nope_head_dim | qk_rope_head_dim].
* c = kv_a_proj_with_mqa(x) = [kv_lora_rank | qk_rope_head_dim]; latent = kv_a_layernorm(c[:kv_lora]);
  k_pe = c[kv_lora:], ONE rope key shared by all heads.
* kv_b_proj [n_heads * (nope + v), kv_lora]: rows h*(nope+v) .. +nope give head h's k_nope, the next
  v rows its value.  key = [k_nope | rope(k_pe)], query = [q_nope | rope(q_pe)].
* softmax scale (nope + rope)^-0.5, times mscale^2 with mscale = 0.1 * mscale_all_dim * ln(factor) + 1
  when rope_scaling is yarn with mscale_all_dim set and factor > 1 (all three sources).
* o_proj [hidden, n_heads * v].  No attention biases (attention_bias true is refused: vLLM has none).
* q_a_layernorm / kv_a_layernorm use rms_norm_eps as vLLM and mlx-lm's glm4_moe_lite do
  (transformers constructs them with its 1e-6 default, mlx-lm's deepseek_v3 with 1e-6; DeepSeek's
  own configs say rms_norm_eps 1e-6, so all agree on the real checkpoints).
* RoPE on the rope dims only, interleaved (GPT-J) pairs (2i, 2i+1), inv_freq_i = theta^(-2i/rope_dim)
  (rope_interleave, default true; mlx-lm always traditional=True, vLLM is_neox_style=False).
  rope_interleave false is refused: transformers then rotates NeoX halves, vLLM and mlx-lm do not.
* YaRN (rope_scaling type / rope_type "yarn"): factor, beta_fast 32, beta_slow 1,
  original_max_position_embeddings; correction range floor/ceil of
  rope_dim * ln(orig_max / (beta * 2 pi)) / (2 ln theta), clipped to [0, rope_dim - 1]; a linear ramp
  over the rope_dim/2 frequencies mixes extrapolation (theta^(-2i/d)) and interpolation (/ factor):
  inv_freq = inter * ramp + extra * (1 - ramp).  cos and sin are multiplied by the attention factor
  get_mscale(factor, mscale) / get_mscale(factor, mscale_all_dim), get_mscale(s, m) = 0.1 m ln s + 1
  for s > 1 else 1 (vLLM / mlx-lm defaults mscale 1, mscale_all_dim 0; transformers agrees whenever
  both are set, as DeepSeek's configs have them).
* MTP at model.layers.{N} as tools/ref/glm4_moe.py (vLLM deepseek_mtp.py / glm4_moe_lite_mtp.py):
  embedding zeroed at position 0, cat[enorm(e), hnorm(h)] -> eh_proj -> MLA + MoE layer -> pre-norm
  output -> shared_head.norm -> head; the layer's own embed_tokens / shared_head.head when present,
  else the trunk's.

Layouts: HF (sharded, per-expert, kv_b_proj) and MLX as mlx-lm writes it: switch_mlp experts, and
kv_b_proj replaced by self_attn.embed_q.weight [n_heads, kv_lora, nope] (the key half, transposed per
head) and self_attn.unembed_out.weight [n_heads, v, kv_lora] (the value half), affine 2-8-bit when
quantized; both are folded back into kv_b_proj here.  A model-mtp.safetensors sidecar may use
either naming.

  /usr/bin/python3 tools/ref/mla.py --model DIR --tokens 1,2,3 --logits L.npy --mtp-logits M.npy --greedy 8
"""
import math
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from glm4_moe import GlmConfig, GlmReference, main, rms_norm  # noqa: E402  (router, MoE, MTP, loading)


class MlaConfig(GlmConfig):
    """config.json of a glm4_moe_lite or deepseek_v3 checkpoint (keys as the HF configs spell them)."""

    MODEL_TYPES = ("glm4_moe_lite", "deepseek_v3")

    def __init__(self, d):
        super().__init__(d)
        if d.get("model_type") is None:
            raise ValueError("config.json: missing model_type (glm4_moe_lite or deepseek_v3)")
        self.model_type = d["model_type"]
        for k in ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"):
            if not isinstance(d.get(k), int) or d[k] <= 0:
                raise ValueError(f"config.json: {k} must be a positive integer, got {d.get(k)!r}")
        self.q_lora_rank = d.get("q_lora_rank") or 0          # null: a plain q_proj
        self.kv_lora_rank = d["kv_lora_rank"]
        self.qk_nope_head_dim = d["qk_nope_head_dim"]
        self.qk_rope_head_dim = d["qk_rope_head_dim"]
        self.v_head_dim = d["v_head_dim"]
        if self.qk_rope_head_dim % 2:
            raise ValueError("config.json: qk_rope_head_dim must be even")
        if not d.get("rope_interleave", True):
            raise ValueError("config.json: rope_interleave false is not supported (transformers rotates NeoX "
                             "halves there, vLLM and mlx-lm interleaved pairs)")
        if self.attention_bias:
            raise ValueError("config.json: attention_bias true is not supported for MLA")
        if d.get("moe_layer_freq", 1) != 1:
            raise ValueError(f"config.json: moe_layer_freq {d.get('moe_layer_freq')} is not 1")
        mlt = d.get("mlp_layer_types")
        if mlt is not None and list(mlt) != ["dense" if i < self.first_k_dense_replace else "sparse"
                                             for i in range(self.num_hidden_layers)]:
            raise ValueError("config.json: mlp_layer_types disagrees with first_k_dense_replace")
        kvh = d.get("num_key_value_heads", self.num_attention_heads)
        if kvh != self.num_attention_heads:
            raise ValueError(f"config.json: num_key_value_heads {kvh} != num_attention_heads (MLA)")
        if self.n_routed_experts is None:
            raise ValueError("config.json: missing n_routed_experts")

    def parse_rope(self, d):
        rp = dict(d.get("rope_parameters") or {})
        rs = dict(d.get("rope_scaling") or {})
        rs.update(rp)
        kind = rs.get("rope_type", rs.get("type", "default")) or "default"
        self.rope_theta = float(rs.get("rope_theta", d.get("rope_theta", 10000.0)))
        # transformers rotates head_dim (= qk_rope_head_dim) x partial_rotary_factor dims of the rope part
        prf = rs.get("partial_rotary_factor", d.get("partial_rotary_factor", 1.0))
        if prf != 1.0:
            raise ValueError(f"config.json: partial_rotary_factor {prf} is not 1 (MLA rotates all rope dims)")
        self.partial_rotary_factor = 1.0
        self.yarn = None
        if kind == "default":
            return
        if kind not in ("yarn", "deepseek_yarn"):
            raise ValueError(f"config.json: rope_scaling type {kind!r} is not supported (default or yarn)")
        for k in ("attention_factor", "truncate"):
            if k in rs and not (k == "truncate" and rs[k] is True):
                raise ValueError(f"config.json: rope_scaling.{k} is not supported")
        if "factor" not in rs or "original_max_position_embeddings" not in rs:
            raise ValueError("config.json: yarn rope_scaling needs factor and original_max_position_embeddings")
        self.yarn = dict(factor=float(rs["factor"]), beta_fast=float(rs.get("beta_fast") or 32),
                         beta_slow=float(rs.get("beta_slow") or 1), mscale=float(rs.get("mscale", 1) or 0),
                         mscale_all_dim=float(rs.get("mscale_all_dim", 0) or 0),
                         original_max=float(rs["original_max_position_embeddings"]))

    @property
    def softmax_scale(self):
        s = (self.qk_nope_head_dim + self.qk_rope_head_dim) ** -0.5
        if self.yarn and self.yarn["mscale_all_dim"]:
            m = get_mscale(self.yarn["factor"], self.yarn["mscale_all_dim"])
            s *= m * m
        return s


def get_mscale(scale, mscale=1.0):
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def rope_inv_freq(cfg):
    """(inv_freq [rope_dim/2] float64, attention factor) for the plain or the YaRN rope."""
    d, base = cfg.qk_rope_head_dim, cfg.rope_theta
    extra = base ** (-np.arange(0, d, 2, dtype=np.float64) / d)
    y = cfg.yarn
    if not y:
        return extra, 1.0
    f = y["factor"]

    def corr_dim(rot):
        return d * math.log(y["original_max"] / (rot * 2 * math.pi)) / (2 * math.log(base))
    low = max(math.floor(corr_dim(y["beta_fast"])), 0)
    high = min(math.ceil(corr_dim(y["beta_slow"])), d - 1)
    if low == high:
        high += 0.001
    ramp = np.clip((np.arange(d // 2, dtype=np.float64) - low) / (high - low), 0, 1)
    inv = (extra / f) * ramp + extra * (1 - ramp)
    return inv, get_mscale(f, y["mscale"]) / get_mscale(f, y["mscale_all_dim"])


def rope_interleaved(x, pos, cfg):
    """GPT-J rotation of pairs (2i, 2i+1) of x [T, ..., rope_dim] at positions pos [T]."""
    inv, af = rope_inv_freq(cfg)
    ang = pos.astype(np.float64)[:, None] * inv[None, :]
    c = (np.cos(ang) * af).astype(np.float32)
    s = (np.sin(ang) * af).astype(np.float32)
    c = c.reshape(c.shape[0], *([1] * (x.ndim - 2)), c.shape[1])
    s = s.reshape(c.shape)
    a, b = x[..., 0::2], x[..., 1::2]
    out = np.empty_like(x)
    out[..., 0::2] = a * c - b * s
    out[..., 1::2] = b * c + a * s
    return out


def fold_mlx_kv_b(w, cfg):
    """Replaces mlx-lm's self_attn.embed_q / unembed_out pairs by the kv_b_proj they were split from."""
    H, dn, dv, r = cfg.num_attention_heads, cfg.qk_nope_head_dim, cfg.v_head_dim, cfg.kv_lora_rank
    for k in [k for k in w if k.endswith("self_attn.embed_q.weight")]:
        pfx = k[:-len("embed_q.weight")]
        wk, wv = w.pop(k), w.pop(pfx + "unembed_out.weight", None)
        if wv is None:
            raise KeyError(f"checkpoint has {k} but lacks {pfx}unembed_out.weight")
        if wk.shape != (H, r, dn) or wv.shape != (H, dv, r):
            raise ValueError(f"{pfx}embed_q / unembed_out: shapes {wk.shape} / {wv.shape}, want "
                             f"{(H, r, dn)} / {(H, dv, r)} from config.json")
        if pfx + "kv_b_proj.weight" in w:
            raise ValueError(f"{pfx}: both kv_b_proj and embed_q / unembed_out")
        w[pfx + "kv_b_proj.weight"] = np.concatenate([wk.transpose(0, 2, 1), wv], 1).reshape(H * (dn + dv), r)
    stray = [k for k in w if k.endswith("self_attn.unembed_out.weight")]
    if stray:
        raise KeyError(f"checkpoint has {stray[0]} but no matching embed_q.weight")


class MlaReference(GlmReference):
    """Float32 numpy forward of a glm4_moe_lite / deepseek_v3 checkpoint: trunk and MTP layer."""

    config_cls = MlaConfig

    def __init__(self, model_dir, mtp_zero_pos0=True):
        super().__init__(model_dir, mtp_zero_pos0)
        fold_mlx_kv_b(self.w, self.cfg)

    def attention(self, pfx, x, pos):
        c = self.cfg
        T, H = x.shape[0], c.num_attention_heads
        dn, dr, dv, r = c.qk_nope_head_dim, c.qk_rope_head_dim, c.v_head_dim, c.kv_lora_rank
        a = pfx + "self_attn."
        if c.q_lora_rank:
            qa = rms_norm(self._linear(x, a + "q_a_proj"), self._get(a + "q_a_layernorm.weight"), c.rms_norm_eps)
            q = self._linear(qa, a + "q_b_proj")
        else:
            q = self._linear(x, a + "q_proj")
        q = q.reshape(T, H, dn + dr)
        ckv = self._linear(x, a + "kv_a_proj_with_mqa")
        latent = rms_norm(ckv[:, :r], self._get(a + "kv_a_layernorm.weight"), c.rms_norm_eps)
        kv = self._linear(latent, a + "kv_b_proj").reshape(T, H, dn + dv)
        k_pe = rope_interleaved(ckv[:, r:], pos, c)                       # [T, dr], one for all heads
        q_pe = rope_interleaved(q[..., dn:], pos, c)                      # [T, H, dr]
        scale = np.float32(c.softmax_scale)
        mask = np.triu(np.full((T, T), -np.inf, np.float32), 1)
        out = np.zeros((T, H, dv), np.float32)
        for h in range(H):
            qh = np.concatenate([q[:, h, :dn], q_pe[:, h]], -1)
            kh = np.concatenate([kv[:, h, :dn], k_pe], -1)
            s = (qh @ kh.T) * scale + mask
            p = np.exp(s - s.max(-1, keepdims=True))
            out[:, h] = (p / p.sum(-1, keepdims=True)) @ kv[:, h, dn:]
        return self._linear(out.reshape(T, H * dv), a + "o_proj")


if __name__ == "__main__":
    main(MlaReference, "glm4_moe_lite / deepseek_v3 (MLA) float32 reference forward")
