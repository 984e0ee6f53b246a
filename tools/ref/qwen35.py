#!/usr/bin/python3
"""Independent float32 reference forward for the Gated-DeltaNet hybrid MoE families with their MTP
head: Qwen3.5 / Qwen3.6 MoE (model_type qwen3_5_moe, e.g. Qwen3.6-35B-A3B) and Qwen3-Next
(qwen3_next).

Written from the public model definitions, not from the engine:
  transformers models/qwen3_5_moe/modeling_qwen3_5_moe.py, models/qwen3_next/modeling_qwen3_next.py
  (torch_recurrent_gated_delta_rule, Qwen3NextRMSNorm / RMSNormGated, fix_query_key_value_ordering);
  vLLM model_executor/models/qwen3_next.py, qwen3_next_mtp.py, qwen3_5_mtp.py (MTP wiring);
  mlx-lm models/qwen3_next.py, qwen3_5.py, qwen3_5_moe.py (MLX names, sanitize()).

The rules, each with its source:
* layer L is full attention when layer_types[L] says so, else when (L + 1) % full_attention_interval
  == 0 (transformers / mlx-lm); every other layer is a Gated DeltaNet; every layer has the MoE MLP.
* Gated DeltaNet (Qwen3_5MoeGatedDeltaNet; Qwen3-Next's fused projections are split first):
  qkv = in_proj_qkv(x) (channels q | k | v, key_dim, key_dim, value_dim), z = in_proj_z(x),
  b = in_proj_b(x), a = in_proj_a(x); a causal depthwise conv1d over the qkv channels (kernel K,
  out[t] = sum_j w[c, j] x[t - K + 1 + j], zeros before the first token), then SiLU; q, k
  L2-normalised over their head dim (x * rsqrt(sum x^2 + 1e-6)), q times d_k^-0.5; key head
  hv // (Hv / Hk) serves value head hv (repeat_interleave); beta = sigmoid(b),
  g = -exp(A_log) * softplus(a + dt_bias).  Per token, per value head, S [d_k, d_v] from zeros:
      S = S * exp(g);  delta = beta * (v - S^T k);  S = S + k delta^T;  o = S^T q
  (torch_recurrent_gated_delta_rule, computed here token by token); o = RMSNorm(o) * w * silu(z)
  per value head with rms_norm_eps and a PLAIN weight w (Qwen3NextRMSNormGated), then out_proj.
* full attention (Qwen3_5MoeAttention): q_proj gives per head [query (D) | gate (D)]; q_norm /
  k_norm per head; partial NeoX RoPE on the first int(D * partial_rotary_factor) dims (mrope with the
  equal t/h/w ids of text is plain RoPE), theta rope_theta; scale D^-0.5; GQA; out * sigmoid(gate)
  before o_proj.  No biases (attention_bias true is refused).
* every other RMSNorm (input_layernorm, post_attention_layernorm, q_norm, k_norm, model.norm and the
  MTP norms) is zero-centred: x * rsqrt(mean x^2 + eps) * (1 + w).  mlx-lm's sanitize() folds the +1
  in: a checkpoint whose conv1d weights are [C, K, 1] (mlx-lm's test for "already sanitized") stores
  1 + w; its MTP tensors (a sidecar) count as folded when its experts are stacked (switch_mlp, the
  MLX naming), raw when per expert (the HF naming).
* MoE: softmax over all experts (float32), top-k, renormalised (always for qwen3_5_moe, whose router
  has no switch; norm_topk_prob for qwen3_next), no bias, no scaling; SwiGLU experts; plus
  shared_expert(x) * sigmoid(shared_expert_gate(x)).  No dense layers.
* MTP (vLLM qwen3_next_mtp.py): e = embed(t_{p+1}) (the trunk's embedding; not zeroed at position 0,
  --mtp-zero-pos0 on tries it), z = fc(cat[pre_fc_norm_embedding(e), pre_fc_norm_hidden(h_p)]) -
  embedding FIRST; one full-attention MoE layer mtp.layers.0; out = mtp.norm(.), which is both what
  the trunk's lm_head reads and what a later draft step is fed (after the norm).

Teacher-forced MTP rows as the other references: row p = 0..T-2 uses the trunk's post-final-norm
hidden at p, token t_{p+1} and RoPE position p, attends causally over MTP rows 0..p, predicts t_{p+2}.

Checkpoints: HF (sharded, qwen3_5_moe's VL wrapper config with text_config and tensors under
model.language_model., trunk experts fused as mlp.experts.gate_up_proj [E, 2F, H] (gate rows first)
+ mlp.experts.down_proj [E, H, F], per-expert MTP experts; qwen3_next flat, per expert, fused
in_proj_qkvz / in_proj_ba), MLX (language_model.model.* / model.*, switch_mlp, affine 2-8-bit with
per-module overrides), and a model-mtp.safetensors sidecar in either naming.

The forward keeps per-layer state (the DeltaNet conv window and S, the attention keys and values),
so prefill then decode can be checked against one prefill (tests/ref/selftest_qwen35.py).

  /usr/bin/python3 tools/ref/qwen35.py --model DIR --tokens 1,2,3 --logits L.npy --mtp-logits M.npy --greedy 8
"""
import argparse
import json
import os
import re
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from glm4_moe import normalize_names, partial_rope, rms_norm, silu  # noqa: E402  (expert stacking, numerics)
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "train"))
from safetensors_io import read_dir_tensors  # noqa: E402

MODEL_TYPES = ("qwen3_5_moe", "qwen3_next")


class Qwen35Config:
    """config.json of a qwen3_5_moe (VL wrapper, LM keys in text_config) or qwen3_next (flat) checkpoint."""

    def __init__(self, d):
        self.raw = d
        mt = d.get("model_type")
        if mt not in MODEL_TYPES:
            raise ValueError(f"config.json: model_type {mt!r} is not {' or '.join(MODEL_TYPES)}")
        self.model_type = mt
        t = d.get("text_config") if mt == "qwen3_5_moe" else d
        if not isinstance(t, dict):
            raise ValueError("config.json: qwen3_5_moe needs text_config")
        for k in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                  "head_dim", "linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim",
                  "linear_value_head_dim", "linear_conv_kernel_dim", "num_experts", "num_experts_per_tok",
                  "moe_intermediate_size", "shared_expert_intermediate_size"):
            if not isinstance(t.get(k), int) or t[k] <= 0:
                raise ValueError(f"config.json: {k} must be a positive integer, got {t.get(k)!r}")
            setattr(self, k, t[k])
        self.rms_norm_eps = float(t.get("rms_norm_eps", 1e-6))
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError("config.json: num_attention_heads not divisible by num_key_value_heads")
        if self.linear_num_value_heads % self.linear_num_key_heads:
            raise ValueError("config.json: linear_num_value_heads not divisible by linear_num_key_heads")
        if self.linear_conv_kernel_dim < 2:
            raise ValueError("config.json: linear_conv_kernel_dim must be >= 2")
        if self.num_experts_per_tok > self.num_experts:
            raise ValueError("config.json: num_experts_per_tok exceeds num_experts")
        if t.get("hidden_act", "silu") != "silu":
            raise ValueError(f"config.json: hidden_act {t.get('hidden_act')} is not silu")
        if t.get("attention_bias", False):
            raise ValueError("config.json: attention_bias true is not supported")
        if t.get("attn_output_gate", True) is not True:
            raise ValueError("config.json: attn_output_gate false is not supported")
        if t.get("decoder_sparse_step", 1) != 1 or t.get("mlp_only_layers"):
            raise ValueError("config.json: dense layers (decoder_sparse_step != 1, mlp_only_layers) not supported")
        self.norm_topk_prob = True if mt == "qwen3_5_moe" else bool(t.get("norm_topk_prob", False))
        n = self.num_hidden_layers
        lt = t.get("layer_types")
        if lt is None:
            fai = t.get("full_attention_interval", 4)
            if not isinstance(fai, int) or fai <= 0:
                raise ValueError(f"config.json: full_attention_interval {fai!r}")
            lt = ["full_attention" if (i + 1) % fai == 0 else "linear_attention" for i in range(n)]
        if len(lt) != n or any(x not in ("full_attention", "linear_attention") for x in lt):
            raise ValueError(f"config.json: layer_types must list {n} of full_attention / linear_attention")
        self.layer_types = list(lt)
        rp = dict(t.get("rope_parameters") or {})
        rs = t.get("rope_scaling") or {}
        kind = rp.get("rope_type", rp.get("type", rs.get("rope_type", rs.get("type", "default"))))
        if kind != "default":
            raise ValueError(f"config.json: rope type {kind!r} is not supported (default only)")
        self.rope_theta = float(rp.get("rope_theta", t.get("rope_theta", 10000.0)))
        self.partial_rotary_factor = float(rp.get("partial_rotary_factor", t.get("partial_rotary_factor", 0.25)))
        rd = int(self.head_dim * self.partial_rotary_factor)
        if rd <= 0 or rd % 2:
            raise ValueError("config.json: head_dim * partial_rotary_factor must be a positive even number")
        self.rotary_dim = rd
        self.mtp_layers = t.get("mtp_num_hidden_layers", t.get("num_nextn_predict_layers", 0)) or 0
        if self.mtp_layers > 1:
            raise ValueError(f"config.json: {self.mtp_layers} MTP layers (one is supported)")
        self.tie_word_embeddings = bool(d.get("tie_word_embeddings", t.get("tie_word_embeddings", False)))
        q = d.get("quantization") or d.get("quantization_config")
        self.quantization = q if isinstance(q, dict) else None

    @property
    def key_dim(self):
        return self.linear_num_key_heads * self.linear_key_head_dim

    @property
    def value_dim(self):
        return self.linear_num_value_heads * self.linear_value_head_dim

    @classmethod
    def load(cls, model_dir):
        with open(os.path.join(model_dir, "config.json")) as f:
            return cls(json.load(f))


# -- tensor names ---------------------------------------------------------------------------------

def canonical_names(t):
    """Flat names (model.*, lm_head.weight, mtp.*) for either family and layout; fused trunk experts
    split into gate / up."""
    out = {}
    for k, v in t.items():
        for a, b in (("model.language_model.", "model."), ("language_model.model.", "model."),
                     ("language_model.lm_head.", "lm_head."), ("language_model.mtp.", "mtp.")):
            if k.startswith(a):
                k = b + k[len(a):]
                break
        if k.startswith("model.visual.") or k.startswith("vision_tower."):
            continue
        m = re.match(r"^(.*\.mlp\.experts)\.(gate_up_proj|down_proj)$", k)
        if m and m.group(2) == "gate_up_proj":
            if v.ndim != 3 or v.shape[1] % 2:
                raise ValueError(f"{k}: shape {v.shape}, want [experts, 2 x moe_intermediate_size, hidden]")
            f = v.shape[1] // 2
            out[m.group(1) + ".gate_proj.weight"] = v[:, :f]
            out[m.group(1) + ".up_proj.weight"] = v[:, f:]
            continue
        if m:
            k = k + ".weight"
        if k in out:
            raise ValueError(f"checkpoint has {k} twice (in two namings)")
        out[k] = v
    return out


def split_fused(w, cfg):
    """Qwen3-Next's in_proj_qkvz / in_proj_ba -> in_proj_qkv, in_proj_z, in_proj_b, in_proj_a
    (transformers fix_query_key_value_ordering: per key head q | k | v | z and b | a)."""
    nk, dk, dv = cfg.linear_num_key_heads, cfg.linear_key_head_dim, cfg.linear_value_head_dim
    r = cfg.linear_num_value_heads // nk
    for k in [k for k in w if k.endswith("linear_attn.in_proj_qkvz.weight")]:
        p = k[:-len("in_proj_qkvz.weight")]
        x = w.pop(k)
        per = 2 * dk + 2 * r * dv
        if x.shape[0] != nk * per:
            raise ValueError(f"{k}: {x.shape[0]} rows, want {nk * per} from config.json")
        g = x.reshape(nk, per, -1)
        q, kk = g[:, :dk], g[:, dk:2 * dk]
        v, z = g[:, 2 * dk:2 * dk + r * dv], g[:, 2 * dk + r * dv:]
        w[p + "in_proj_qkv.weight"] = np.concatenate([q.reshape(nk * dk, -1), kk.reshape(nk * dk, -1),
                                                      v.reshape(nk * r * dv, -1)])
        w[p + "in_proj_z.weight"] = z.reshape(nk * r * dv, -1)
        ba = w.pop(p + "in_proj_ba.weight", None)
        if ba is None:
            raise KeyError(f"checkpoint has {k} but lacks {p}in_proj_ba.weight")
        if ba.shape[0] != 2 * nk * r:
            raise ValueError(f"{p}in_proj_ba.weight: {ba.shape[0]} rows, want {2 * nk * r}")
        g = ba.reshape(nk, 2 * r, -1)
        w[p + "in_proj_b.weight"] = g[:, :r].reshape(nk * r, -1)
        w[p + "in_proj_a.weight"] = g[:, r:].reshape(nk * r, -1)


def zero_centred(name):
    """Every RMSNorm weight but the DeltaNet's gated norm (mtp.pre_fc_norm_embedding / _hidden included)."""
    return re.search(r"norm(_embedding|_hidden)?\.weight$", name) is not None \
        and not name.endswith("linear_attn.norm.weight")


def fix_conv_and_norms(w, cfg, mtp_mlx):
    """conv1d weights to [C, K]; zero-centred norms to their effective multiplier (1 + w unless
    folded, see the module docstring)."""
    K, convs = cfg.linear_conv_kernel_dim, [k for k in w if k.endswith("linear_attn.conv1d.weight")]
    shapes = {w[k].shape[1:] for k in convs}
    if len(shapes) > 1 or (shapes and shapes.pop() not in ((1, K), (K, 1))):
        raise ValueError(f"conv1d weights: shapes {sorted({w[k].shape for k in convs})}, want [C, 1, {K}] "
                         f"(HF) or [C, {K}, 1] (MLX)")
    trunk_folded = bool(convs) and w[convs[0]].shape[-1] == 1
    for k in convs:
        w[k] = w[k].reshape(w[k].shape[0], K)
    for k in list(w):
        if zero_centred(k):
            folded = mtp_mlx if k.startswith("mtp.") else trunk_folded
            if not folded:
                w[k] = w[k] + np.float32(1.0)


# -- numerics -------------------------------------------------------------------------------------

def l2norm(x):
    return x / np.sqrt((x * x).sum(-1, keepdims=True) + np.float32(1e-6))


def softplus(x):
    return np.where(x > 20, x, np.log1p(np.exp(np.minimum(x, 20)))).astype(np.float32)


def sigmoid(x):
    return (1.0 / (1.0 + np.exp(-x.astype(np.float64)))).astype(np.float32)


def gated_delta_rule(q, k, v, g, beta, S=None):
    """The delta rule token by token: q, k [T, H, dk] (q scaled, both per value head), v [T, H, dv],
    g, beta [T, H]; S [H, dk, dv] (zeros when None).  Returns (o [T, H, dv], the final S)."""
    T, H, dk = k.shape
    S = np.zeros((H, dk, v.shape[-1]), np.float32) if S is None else S
    o = np.zeros(v.shape, np.float32)
    for t in range(T):
        S = S * np.exp(g[t])[:, None, None]
        mem = np.einsum("hkv,hk->hv", S, k[t])                     # S^T k
        delta = (v[t] - mem) * beta[t][:, None]
        S = S + k[t][:, :, None] * delta[:, None, :]                # + k delta^T
        o[t] = np.einsum("hkv,hk->hv", S, q[t])                     # S^T q
    return o, S


class Qwen35Reference:
    """Float32 numpy forward of a qwen3_5_moe / qwen3_next checkpoint: trunk and MTP head."""

    def __init__(self, model_dir, mtp_zero_pos0=False):
        self.cfg = cfg = Qwen35Config.load(model_dir)
        w = canonical_names(read_dir_tensors(model_dir, cfg.quantization))
        mtp_mlx = any(".mlp.switch_mlp." in k for k in w if k.startswith("mtp."))
        w = normalize_names(w)
        split_fused(w, cfg)
        fix_conv_and_norms(w, cfg, mtp_mlx)
        self.w = w
        if "lm_head.weight" not in w or cfg.tie_word_embeddings:
            w["lm_head.weight"] = self._get("model.embed_tokens.weight")
        self.has_mtp = "mtp.fc.weight" in w
        self.mtp_zero_pos0 = mtp_zero_pos0

    def _get(self, name):
        if name not in self.w:
            raise KeyError(f"checkpoint lacks tensor {name}")
        return self.w[name]

    def _linear(self, x, pfx):
        return x @ self._get(pfx + ".weight").T

    # -- token mixers: st is the layer's state dict, updated in place --

    def deltanet(self, pfx, x, st):
        c = self.cfg
        la = pfx + "linear_attn."
        T = x.shape[0]
        Hk, Hv, dk, dv, K = (c.linear_num_key_heads, c.linear_num_value_heads, c.linear_key_head_dim,
                             c.linear_value_head_dim, c.linear_conv_kernel_dim)
        qkv = self._linear(x, la + "in_proj_qkv")
        z = self._linear(x, la + "in_proj_z").reshape(T, Hv, dv)
        b = self._linear(x, la + "in_proj_b")
        a = self._linear(x, la + "in_proj_a")
        cw = self._get(la + "conv1d.weight")                              # [C, K]
        win = np.concatenate([st.get("conv", np.zeros((K - 1, qkv.shape[1]), np.float32)), qkv])
        conv = np.zeros_like(qkv)
        for j in range(K):
            conv += win[j:j + T] * cw[:, j]
        st["conv"] = win[T:]
        conv = silu(conv)
        kd = c.key_dim
        q = l2norm(conv[:, :kd].reshape(T, Hk, dk)) * np.float32(dk ** -0.5)
        k = l2norm(conv[:, kd:2 * kd].reshape(T, Hk, dk))
        v = conv[:, 2 * kd:].reshape(T, Hv, dv)
        rep = Hv // Hk
        q, k = np.repeat(q, rep, axis=1), np.repeat(k, rep, axis=1)       # head hv reads key head hv // rep
        beta = sigmoid(b)
        g = -np.exp(self._get(la + "A_log")) * softplus(a + self._get(la + "dt_bias"))
        o, st["S"] = gated_delta_rule(q, k, v, g, beta, st.get("S"))
        o = rms_norm(o, self._get(la + "norm.weight"), c.rms_norm_eps) * silu(z)
        return self._linear(o.reshape(T, Hv * dv), la + "out_proj")

    def attention(self, pfx, x, pos, st):
        c = self.cfg
        T, H, KV, D = x.shape[0], c.num_attention_heads, c.num_key_value_heads, c.head_dim
        at = pfx + "self_attn."
        qg = self._linear(x, at + "q_proj").reshape(T, H, 2 * D)
        q, gate = qg[..., :D], qg[..., D:].reshape(T, H * D)
        k = self._linear(x, at + "k_proj").reshape(T, KV, D)
        v = self._linear(x, at + "v_proj").reshape(T, KV, D)
        q = partial_rope(rms_norm(q, self._get(at + "q_norm.weight"), c.rms_norm_eps), pos, c.rope_theta, c.rotary_dim)
        k = partial_rope(rms_norm(k, self._get(at + "k_norm.weight"), c.rms_norm_eps), pos, c.rope_theta, c.rotary_dim)
        if "k" in st:
            k, v = np.concatenate([st["k"], k]), np.concatenate([st["v"], v])
        st["k"], st["v"] = k, v
        S = k.shape[0]
        mask = np.triu(np.full((T, S), -np.inf, np.float32), S - T + 1)
        out = np.zeros((T, H, D), np.float32)
        grp = H // KV
        for h in range(H):
            s = (q[:, h] @ k[:, h // grp].T) * np.float32(D ** -0.5) + mask
            p = np.exp(s - s.max(-1, keepdims=True))
            out[:, h] = (p / p.sum(-1, keepdims=True)) @ v[:, h // grp]
        return self._linear(out.reshape(T, H * D) * sigmoid(gate), at + "o_proj")

    def moe(self, pfx, x):
        c = self.cfg
        lg = (x @ self._get(pfx + "mlp.gate.weight").T).astype(np.float64)
        p = np.exp(lg - lg.max(-1, keepdims=True))
        p = (p / p.sum(-1, keepdims=True)).astype(np.float32)
        idx = np.argsort(-p, axis=-1, kind="stable")[:, :c.num_experts_per_tok]
        wt = np.take_along_axis(p, idx, -1)
        if c.norm_topk_prob:
            wt = wt / wt.sum(-1, keepdims=True)
        G = self._get(pfx + "mlp.experts.gate_proj.weight")
        U = self._get(pfx + "mlp.experts.up_proj.weight")
        Dn = self._get(pfx + "mlp.experts.down_proj.weight")
        y = np.zeros_like(x)
        for t in range(x.shape[0]):
            for i in range(idx.shape[1]):
                e = idx[t, i]
                y[t] += wt[t, i] * (Dn[e] @ (silu(G[e] @ x[t]) * (U[e] @ x[t])))
        se = pfx + "mlp.shared_expert."
        sh = self._linear(silu(self._linear(x, se + "gate_proj")) * self._linear(x, se + "up_proj"), se + "down_proj")
        return y + sh * sigmoid(self._linear(x, pfx + "mlp.shared_expert_gate"))

    def layer(self, pfx, x, pos, full, st):
        c = self.cfg
        n = rms_norm(x, self._get(pfx + "input_layernorm.weight"), c.rms_norm_eps)
        h = x + (self.attention(pfx, n, pos, st) if full else self.deltanet(pfx, n, st))
        return h + self.moe(pfx, rms_norm(h, self._get(pfx + "post_attention_layernorm.weight"), c.rms_norm_eps))

    def trunk(self, tokens, state=None):
        """Returns (logits [T,V], hidden before the final norm [T,H], after it [T,H]).  state: a dict
        from new_state() continued in place (tokens then follow the ones it has seen)."""
        c = self.cfg
        tokens = np.asarray(tokens, np.int64)
        if tokens.size and (tokens.min() < 0 or tokens.max() >= c.vocab_size):
            raise ValueError(f"token id out of range 0..{c.vocab_size - 1}")
        state = self.new_state() if state is None else state
        pos = state["pos"] + np.arange(len(tokens))
        x = self._get("model.embed_tokens.weight")[tokens].astype(np.float32)
        for L in range(c.num_hidden_layers):
            x = self.layer(f"model.layers.{L}.", x, pos, c.layer_types[L] == "full_attention", state["layers"][L])
        state["pos"] += len(tokens)
        h_post = rms_norm(x, self._get("model.norm.weight"), c.rms_norm_eps)
        return h_post @ self._get("lm_head.weight").T, x, h_post

    def new_state(self):
        return {"pos": 0, "layers": [{} for _ in range(self.cfg.num_hidden_layers)], "mtp": {}}

    def mtp(self, tokens, hidden, pos0=0, st=None):
        """MTP rows for tokens t_{p+1} (tokens[1:]) and trunk hiddens h_p (hidden[:-1]), positions pos0..;
        st: the MTP layer's key/value state, continued in place.  Returns (logits [T-1,V], the
        post-norm output [T-1,H], fed back for the next draft step)."""
        c = self.cfg
        tokens = np.asarray(tokens, np.int64)
        pos = pos0 + np.arange(len(tokens) - 1)
        e = self._get("model.embed_tokens.weight")[tokens[1:]].astype(np.float32)
        if self.mtp_zero_pos0:
            e[pos == 0] = 0.0
        u = np.concatenate([rms_norm(e, self._get("mtp.pre_fc_norm_embedding.weight"), c.rms_norm_eps),
                            rms_norm(hidden[:-1], self._get("mtp.pre_fc_norm_hidden.weight"), c.rms_norm_eps)], -1)
        o = self.layer("mtp.layers.0.", self._linear(u, "mtp.fc"), pos, True, {} if st is None else st)
        out = rms_norm(o, self._get("mtp.norm.weight"), c.rms_norm_eps)
        return out @ self._get("lm_head.weight").T, out

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


def main():
    ap = argparse.ArgumentParser(description="qwen3_5_moe / qwen3_next (Gated DeltaNet hybrid) float32 reference")
    ap.add_argument("--model", required=True)
    ap.add_argument("--tokens", required=True, help="comma-separated token ids")
    ap.add_argument("--logits", help="trunk logits [T, vocab] (.npy)")
    ap.add_argument("--mtp-logits", help="teacher-forced MTP logits [T-1, vocab] (.npy)")
    ap.add_argument("--hidden-pre", help="trunk hidden before the final norm [T, hidden]")
    ap.add_argument("--hidden-post", help="trunk hidden after the final norm [T, hidden]")
    ap.add_argument("--greedy", type=int, default=0, help="print N greedy continuation ids")
    ap.add_argument("--mtp-zero-pos0", choices=("on", "off"), default="off",
                    help="zero the MTP embedding at position 0 (default off: vLLM's qwen3_next_mtp.py does not)")
    a = ap.parse_args()
    ref = Qwen35Reference(a.model, mtp_zero_pos0=a.mtp_zero_pos0 == "on")
    toks = [int(t) for t in a.tokens.replace(" ", ",").split(",") if t]
    if not toks:
        ap.error("--tokens is empty")
    if a.logits or a.mtp_logits or a.hidden_pre or a.hidden_post:
        logits, mtp_logits, h_pre, h_post = ref.forward(toks)
        if a.mtp_logits and mtp_logits is None:
            sys.exit("checkpoint has no MTP head (or fewer than 2 tokens)")
        for path, arr in ((a.logits, logits), (a.mtp_logits, mtp_logits), (a.hidden_pre, h_pre),
                          (a.hidden_post, h_post)):
            if path:
                np.save(path, arr.astype(np.float32))
    if a.greedy:
        print(" ".join(map(str, ref.greedy(toks, a.greedy))))


if __name__ == "__main__":
    main()
