#!/usr/bin/python3
"""Independent float32 reference forward for glm4_moe (GLM-4.5 / 4.6 / 4.7 / 4.5-Air) with its MTP layer.

Written from the public model definitions, not from the engine:
  transformers models/glm4_moe/modeling_glm4_moe.py (attention, partial RoPE, router, decoder layer),
  vLLM model_executor/models/glm4_moe.py + glm4_moe_mtp.py (grouped top-k, MTP wiring),
  mlx-lm models/glm4_moe.py (MLX tensor names: mlp.switch_mlp.*, MTP layer dropped by sanitize()).

The rules, each with its source:
* attention: q/k/v projections carry biases when attention_bias; with use_qk_norm a per-head RMSNorm
  (weights of head_dim) runs on q and k BEFORE RoPE; scale head_dim^-0.5; GQA head h reads kv head
  h // (heads / kv_heads) (transformers repeat_kv).
* partial RoPE: rotary_dim = int(head_dim * partial_rotary_factor) (default 0.5); only dims
  [0, rotary_dim) rotate, NeoX style: dim i pairs with i + rotary_dim/2, inv_freq_i =
  theta^(-2i/rotary_dim); dims [rotary_dim, head_dim) pass through (transformers
  apply_rotary_pos_emb, vLLM get_rope is_neox_style, mlx nn.RoPE(traditional=False)).
* router: scores = sigmoid(x @ gate^T) in float32; e_score_correction_bias is added for the CHOICE
  only; with n_group > 1 each group is scored by the sum of its two best biased scores, the best
  topk_group groups are kept and the other experts masked to -inf (vLLM grouped_topk; DeepSeek-V3);
  top-k of the biased scores; weights are the UNBIASED scores of the chosen experts, divided by their
  sum when norm_topk_prob, times routed_scaling_factor.  Shared experts (moe_intermediate_size *
  n_shared_experts wide) are added unweighted.  Layers < first_k_dense_replace use a dense SwiGLU MLP
  of intermediate_size; the MTP layer is always MoE (its index is >= first_k_dense_replace).
* RMSNorm: x * rsqrt(mean(x^2) + rms_norm_eps) * w, in float32.
* MTP (vLLM glm4_moe_mtp.py): the layer model.layers.{N} (N = num_hidden_layers):
  e = embed(t_{p+1}), zeroed where the position is 0 ("masking inputs at position 0");
  z = eh_proj(cat[enorm(e), hnorm(h_p)]) - embedding FIRST; o = decoder layer(z) (pre-norm output,
  residual + h); logits = head(shared_head.norm(o)).  embed / head: the layer's own embed_tokens and
  shared_head.head when the checkpoint has them (GLM-4.5), else the trunk's (GLM-4.6 has neither).

Teacher-forced MTP rows (as tools/train/reference.py does for hy_v3): row p = 0..T-2 uses the trunk's
post-final-norm hidden at p, token t_{p+1} and RoPE position p, with causal attention over MTP rows
0..p, and predicts t_{p+2}.

Checkpoints: HF layout (model*.safetensors, sharded with model.safetensors.index.json, per-expert
mlp.experts.E.*), MLX layout (mlp.switch_mlp.* stacked, affine 2-8-bit quantized tensors with .scales/
.biases, config "quantization" with per-module overrides), and an MTP sidecar model-mtp.safetensors in
either naming.

  /usr/bin/python3 tools/ref/glm4_moe.py --model DIR --tokens 1,2,3 --logits L.npy --mtp-logits M.npy --greedy 8
"""
import argparse
import json
import os
import re
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "train"))
from safetensors_io import read_dir_tensors  # noqa: E402  (format helper: files, bf16, MLX dequantize)


class GlmConfig:
    """config.json of a glm4_moe checkpoint, keys as the HF GLM-4.5 config spells them.  The MoE,
    router and MTP keys are shared with the MLA families (tools/ref/mla.py subclasses this)."""

    MODEL_TYPES = ("glm4_moe",)

    def __init__(self, d):
        self.raw = d
        if d.get("model_type") not in (None, *self.MODEL_TYPES):
            raise ValueError(f"config.json: model_type {d.get('model_type')!r} is not {' or '.join(self.MODEL_TYPES)}")
        need = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads")
        for k in need:
            if k not in d:
                raise ValueError(f"config.json: missing {k}")
        self.vocab_size = d["vocab_size"]
        self.hidden_size = d["hidden_size"]
        self.num_hidden_layers = d["num_hidden_layers"]
        self.num_attention_heads = d["num_attention_heads"]
        self.num_key_value_heads = d.get("num_key_value_heads", self.num_attention_heads)
        self.head_dim = d.get("head_dim") or self.hidden_size // self.num_attention_heads
        self.intermediate_size = d.get("intermediate_size")
        self.moe_intermediate_size = d.get("moe_intermediate_size")
        self.n_routed_experts = d.get("n_routed_experts")
        self.num_experts_per_tok = d.get("num_experts_per_tok", 8)
        self.n_shared_experts = d.get("n_shared_experts") or 0
        self.first_k_dense_replace = d.get("first_k_dense_replace", 1)
        self.norm_topk_prob = bool(d.get("norm_topk_prob", True))
        self.routed_scaling_factor = float(d.get("routed_scaling_factor", 1.0))
        self.n_group = d.get("n_group") or 1
        self.topk_group = d.get("topk_group") or 1
        self.rms_norm_eps = float(d.get("rms_norm_eps", 1e-5))
        self.parse_rope(d)
        self.attention_bias = bool(d.get("attention_bias", False))
        self.use_qk_norm = bool(d.get("use_qk_norm", False))
        self.num_nextn_predict_layers = d.get("num_nextn_predict_layers", 0)
        self.tie_word_embeddings = bool(d.get("tie_word_embeddings", False))
        if d.get("hidden_act", "silu") != "silu":
            raise ValueError(f"config.json: hidden_act {d.get('hidden_act')} is not silu")
        if d.get("scoring_func", "sigmoid") != "sigmoid" or d.get("topk_method", "noaux_tc") != "noaux_tc":
            raise ValueError("config.json: only sigmoid scoring with noaux_tc top-k is glm4_moe")
        q = d.get("quantization") or d.get("quantization_config")
        self.quantization = q if isinstance(q, dict) else None
        if self.n_routed_experts and self.n_routed_experts % self.n_group:
            raise ValueError("config.json: n_routed_experts not divisible by n_group")

    def parse_rope(self, d):
        rp = d.get("rope_parameters") or {}
        rs = d.get("rope_scaling")
        if rs and rs.get("rope_type", rs.get("type", "default")) != "default":
            raise ValueError(f"config.json: rope_scaling {rs} is not supported by the reference")
        if rp.get("rope_type", "default") != "default":
            raise ValueError(f"config.json: rope_parameters.rope_type {rp.get('rope_type')} not supported")
        self.rope_theta = float(rp.get("rope_theta", d.get("rope_theta", 10000.0)))
        self.partial_rotary_factor = float(rp.get("partial_rotary_factor", d.get("partial_rotary_factor", 0.5)))

    @property
    def rotary_dim(self):
        return int(self.head_dim * self.partial_rotary_factor)

    @classmethod
    def load(cls, model_dir):
        with open(os.path.join(model_dir, "config.json")) as f:
            return cls(json.load(f))


# -- numerics -------------------------------------------------------------------------------------

def rms_norm(x, w, eps):
    x = x.astype(np.float32)
    return (x / np.sqrt((x * x).mean(-1, keepdims=True) + np.float32(eps))) * w


def silu(x):
    return x / (np.float32(1.0) + np.exp(-x))


def partial_rope(x, pos, theta, rotary_dim):
    """NeoX rotate-half over the first rotary_dim dims of x [T, H, D]; the rest pass through."""
    half = rotary_dim // 2
    inv = theta ** (-np.arange(0, rotary_dim, 2, dtype=np.float64) / rotary_dim)
    ang = pos.astype(np.float64)[:, None] * inv[None, :]
    c = np.cos(ang).astype(np.float32)[:, None, :]
    s = np.sin(ang).astype(np.float32)[:, None, :]
    a, b = x[..., :half], x[..., half:rotary_dim]
    return np.concatenate([a * c - b * s, b * c + a * s, x[..., rotary_dim:]], axis=-1)


def route(logits, bias, cfg):
    """Returns (expert ids [T,k], weights [T,k]) for router logits [T,E] (float32)."""
    s = (1.0 / (1.0 + np.exp(-logits.astype(np.float64)))).astype(np.float32)
    choose = s + (bias.astype(np.float32) if bias is not None else np.float32(0))
    T, E = choose.shape
    if cfg.n_group > 1:
        g = choose.reshape(T, cfg.n_group, E // cfg.n_group)
        gscore = -np.sort(-g, axis=-1)[..., :2].sum(-1)                      # sum of the best two
        keep = np.argsort(-gscore, axis=-1, kind="stable")[:, :cfg.topk_group]
        mask = np.zeros((T, cfg.n_group), bool)
        np.put_along_axis(mask, keep, True, axis=-1)
        choose = np.where(np.repeat(mask, E // cfg.n_group, axis=-1), choose, -np.inf)
    k = cfg.num_experts_per_tok
    idx = np.argsort(-choose, axis=-1, kind="stable")[:, :k]
    wt = np.take_along_axis(s, idx, -1)
    if cfg.norm_topk_prob:
        wt = wt / (wt.sum(-1, keepdims=True) + np.float32(1e-20))
    return idx, (wt * np.float32(cfg.routed_scaling_factor)).astype(np.float32)


# -- tensor names ---------------------------------------------------------------------------------

def normalize_names(t):
    """One internal naming for both layouts: HF names with experts stacked [E, out, in] under
    'model.layers.L.mlp.experts.{gate,up,down}_proj.weight'."""
    out, per = {}, {}
    for k, v in t.items():
        k = k.replace(".mlp.switch_mlp.", ".mlp.experts.")
        m = re.match(r"^(.*\.mlp\.experts)\.(\d+)\.(gate|up|down)_proj\.weight$", k)
        if m:
            per.setdefault((m.group(1), m.group(3)), {})[int(m.group(2))] = v
        else:
            out[k] = v
    for (pfx, which), d in per.items():
        if sorted(d) != list(range(len(d))):
            raise ValueError(f"{pfx}: expert indices {sorted(d)} are not 0..{len(d) - 1}")
        out[f"{pfx}.{which}_proj.weight"] = np.stack([d[i] for i in range(len(d))])
    return out


class GlmReference:
    """Float32 numpy forward of a glm4_moe checkpoint: trunk and MTP layer.  Subclasses replace
    config_cls and attention() (tools/ref/mla.py)."""

    config_cls = GlmConfig

    def __init__(self, model_dir, mtp_zero_pos0=True):
        self.cfg = cfg = self.config_cls.load(model_dir)
        self.w = normalize_names(read_dir_tensors(model_dir, cfg.quantization))
        if "lm_head.weight" not in self.w or cfg.tie_word_embeddings:
            self.w["lm_head.weight"] = self.w["model.embed_tokens.weight"]
        self.mtp_pfx = f"model.layers.{cfg.num_hidden_layers}."
        self.has_mtp = (self.mtp_pfx + "eh_proj.weight") in self.w
        self.mtp_zero_pos0 = mtp_zero_pos0

    def _get(self, name):
        if name not in self.w:
            raise KeyError(f"checkpoint lacks tensor {name}")
        return self.w[name]

    def _linear(self, x, pfx, bias=False):
        y = x @ self._get(pfx + ".weight").T
        if bias:
            y = y + self._get(pfx + ".bias")
        return y

    def attention(self, pfx, x, pos):
        c = self.cfg
        T = x.shape[0]
        H, KV, D = c.num_attention_heads, c.num_key_value_heads, c.head_dim
        q = self._linear(x, pfx + "self_attn.q_proj", c.attention_bias).reshape(T, H, D)
        k = self._linear(x, pfx + "self_attn.k_proj", c.attention_bias).reshape(T, KV, D)
        v = self._linear(x, pfx + "self_attn.v_proj", c.attention_bias).reshape(T, KV, D)
        if c.use_qk_norm:
            q = rms_norm(q, self._get(pfx + "self_attn.q_norm.weight"), c.rms_norm_eps)
            k = rms_norm(k, self._get(pfx + "self_attn.k_norm.weight"), c.rms_norm_eps)
        q = partial_rope(q, pos, c.rope_theta, c.rotary_dim)
        k = partial_rope(k, pos, c.rope_theta, c.rotary_dim)
        grp = H // KV
        out = np.zeros((T, H, D), np.float32)
        mask = np.triu(np.full((T, T), -np.inf, np.float32), 1)
        for h in range(H):
            j = h // grp
            s = (q[:, h, :] @ k[:, j, :].T) * np.float32(D ** -0.5) + mask
            p = np.exp(s - s.max(-1, keepdims=True))
            out[:, h, :] = (p / p.sum(-1, keepdims=True)) @ v[:, j, :]
        return self._linear(out.reshape(T, H * D), pfx + "self_attn.o_proj")

    def swiglu(self, pfx, x):
        return self._linear(silu(self._linear(x, pfx + "gate_proj")) * self._linear(x, pfx + "up_proj"),
                            pfx + "down_proj")

    def moe(self, pfx, x):
        idx, wt = route(x @ self._get(pfx + "mlp.gate.weight").T, self.w.get(pfx + "mlp.gate.e_score_correction_bias"),
                        self.cfg)
        G = self._get(pfx + "mlp.experts.gate_proj.weight")
        U = self._get(pfx + "mlp.experts.up_proj.weight")
        Dn = self._get(pfx + "mlp.experts.down_proj.weight")
        y = np.zeros_like(x)
        for t in range(x.shape[0]):
            for i in range(idx.shape[1]):
                e = idx[t, i]
                y[t] += wt[t, i] * (Dn[e] @ (silu(G[e] @ x[t]) * (U[e] @ x[t])))
        if self.cfg.n_shared_experts:
            y = y + self.swiglu(pfx + "mlp.shared_experts.", x)
        return y

    def layer(self, pfx, x, pos, dense):
        c = self.cfg
        h = x + self.attention(pfx, rms_norm(x, self._get(pfx + "input_layernorm.weight"), c.rms_norm_eps), pos)
        n = rms_norm(h, self._get(pfx + "post_attention_layernorm.weight"), c.rms_norm_eps)
        return h + (self.swiglu(pfx + "mlp.", n) if dense else self.moe(pfx, n))

    def trunk(self, tokens):
        """Returns (logits [T,V], hidden before the final norm [T,H], after it [T,H])."""
        c = self.cfg
        tokens = np.asarray(tokens, np.int64)
        if tokens.size and (tokens.min() < 0 or tokens.max() >= c.vocab_size):
            raise ValueError(f"token id out of range 0..{c.vocab_size - 1}")
        pos = np.arange(len(tokens))
        x = self._get("model.embed_tokens.weight")[tokens].astype(np.float32)
        for L in range(c.num_hidden_layers):
            x = self.layer(f"model.layers.{L}.", x, pos, L < c.first_k_dense_replace)
        h_post = rms_norm(x, self._get("model.norm.weight"), c.rms_norm_eps)
        return h_post @ self._get("lm_head.weight").T, x, h_post

    def mtp(self, tokens, hidden):
        """Teacher-forced MTP rows p = 0..T-2 (see the module docstring).  Returns
        (logits [T-1,V] predicting t_{p+2}, pre-norm MTP output [T-1,H])."""
        c, P = self.cfg, self.mtp_pfx
        tokens = np.asarray(tokens, np.int64)
        emb = self.w.get(P + "embed_tokens.weight", self._get("model.embed_tokens.weight"))
        head = self.w.get(P + "shared_head.head.weight", self._get("lm_head.weight"))
        pos = np.arange(len(tokens) - 1)
        e = emb[tokens[1:]].astype(np.float32)
        if self.mtp_zero_pos0:
            e[pos == 0] = 0.0
        u = np.concatenate([rms_norm(e, self._get(P + "enorm.weight"), c.rms_norm_eps),
                            rms_norm(hidden[:-1], self._get(P + "hnorm.weight"), c.rms_norm_eps)], -1)
        o = self.layer(P, self._linear(u, P + "eh_proj"), pos, dense=False)
        return rms_norm(o, self._get(P + "shared_head.norm.weight"), c.rms_norm_eps) @ head.T, o

    def forward(self, tokens):
        logits, h_pre, h_post = self.trunk(tokens)
        mtp_logits = self.mtp(tokens, h_post)[0] if self.has_mtp and len(tokens) >= 2 else None
        return logits, mtp_logits, h_pre, h_post

    def greedy(self, tokens, n):
        """Greedy continuation by full recomputation (slow, obviously correct)."""
        toks, out = list(tokens), []
        for _ in range(n):
            t = int(np.argmax(self.trunk(toks)[0][-1]))
            out.append(t)
            toks.append(t)
        return out


def main(ref_cls=GlmReference, description="glm4_moe float32 reference forward"):
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--model", required=True)
    ap.add_argument("--tokens", required=True, help="comma-separated token ids")
    ap.add_argument("--logits", help="trunk logits [T, vocab] (.npy)")
    ap.add_argument("--mtp-logits", help="teacher-forced MTP logits [T-1, vocab] (.npy)")
    ap.add_argument("--hidden-pre", help="trunk hidden before the final norm [T, hidden]")
    ap.add_argument("--hidden-post", help="trunk hidden after the final norm [T, hidden]")
    ap.add_argument("--greedy", type=int, default=0, help="print N greedy continuation ids")
    ap.add_argument("--mtp-zero-pos0", choices=("on", "off"), default="on",
                    help="zero the MTP embedding at position 0 as vLLM does (default on)")
    a = ap.parse_args()
    ref = ref_cls(a.model, mtp_zero_pos0=a.mtp_zero_pos0 == "on")
    toks = [int(t) for t in a.tokens.replace(" ", ",").split(",") if t]
    if not toks:
        ap.error("--tokens is empty")
    if a.logits or a.mtp_logits or a.hidden_pre or a.hidden_post:
        logits, mtp_logits, h_pre, h_post = ref.forward(toks)
        if a.logits:
            np.save(a.logits, logits.astype(np.float32))
        if a.mtp_logits:
            if mtp_logits is None:
                sys.exit("checkpoint has no MTP layer (or fewer than 2 tokens)")
            np.save(a.mtp_logits, mtp_logits.astype(np.float32))
        if a.hidden_pre:
            np.save(a.hidden_pre, h_pre.astype(np.float32))
        if a.hidden_post:
            np.save(a.hidden_post, h_post.astype(np.float32))
    if a.greedy:
        print(" ".join(map(str, ref.greedy(toks, a.greedy))))


if __name__ == "__main__":
    main()
