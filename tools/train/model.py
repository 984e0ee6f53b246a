#!/usr/bin/python3
"""hy_v3 (Tencent Hunyuan 3) model: PyTorch training model AND the independent
float32 reference forward used to check the C engine.

Two halves, deliberately sharing no forward code:

* ``HyV3`` (PyTorch): the training model.  Every hy_v3 feature at small size
  (docs/design.md §2/§3): dense first layer(s), sigmoid-routed MoE with a
  selection-only ``expert_bias`` (updated by DeepSeek-V3 auxiliary-loss-free
  balancing, not by gradients), top-k renormalisation and router scaling, one
  shared expert, GQA attention with per-head q/k RMSNorm before neox RoPE,
  fp32 RMSNorm, SwiGLU, untied lm_head, and one MTP (NextN) layer trained with
  the DeepSeek-V3 MTP loss to predict t_{p+2}.

* ``Reference`` (numpy, float32): loads ANY hy_v3 checkpoint directory - the
  original Tencent layout or the MLX-converted layout, sharded or not, with an
  optional ``model-mtp.safetensors`` sidecar, MLX affine-quantized tensors -
  and computes trunk logits, post-final-norm hiddens, teacher-forced MTP logits
  and greedy continuations.  It reads safetensors itself (safetensors_io).

The CLI lives in reference.py.
"""
import json
import math
import os
import re

import numpy as np

from safetensors_io import read_dir_tensors  # noqa: E402  (same directory)

# ----------------------------------------------------------------------------------------------
# config handling (field aliases of docs/design.md §2.1)
# ----------------------------------------------------------------------------------------------


class Cfg:
    """hy_v3 config with the aliases used by the different implementations."""

    def __init__(self, d):
        self.raw = d
        g = lambda *ks, default=None: next((d[k] for k in ks if k in d and d[k] is not None), default)
        self.vocab_size = g("vocab_size")
        self.hidden_size = g("hidden_size")
        self.num_hidden_layers = g("num_hidden_layers")
        self.num_attention_heads = g("num_attention_heads")
        self.num_key_value_heads = g("num_key_value_heads", default=self.num_attention_heads)
        self.head_dim = g("head_dim", default=self.hidden_size // self.num_attention_heads)
        self.intermediate_size = g("intermediate_size")
        self.expert_hidden_dim = g("expert_hidden_dim", "moe_intermediate_size")
        self.num_experts = g("num_experts", "num_local_experts", "n_routed_experts")
        self.num_experts_per_tok = g("num_experts_per_tok", "moe_topk")
        self.num_shared_experts = g("num_shared_experts", "n_shared_experts", default=1)
        self.first_k_dense_replace = g("first_k_dense_replace", default=1)
        self.route_norm = g("route_norm", "norm_topk_prob", default=True)
        self.router_scaling_factor = float(g("router_scaling_factor", "routed_scaling_factor", default=1.0))
        self.rms_norm_eps = float(g("rms_norm_eps", default=1e-5))
        rp = d.get("rope_parameters") or d.get("rope_scaling") or {}
        self.rope_theta = float(rp.get("rope_theta", d.get("rope_theta", 10000.0)))
        self.num_nextn_predict_layers = g("num_nextn_predict_layers", default=0)
        self.max_position_embeddings = g("max_position_embeddings", default=4096)
        self.tie_word_embeddings = bool(g("tie_word_embeddings", default=False))
        self.mlp_layer_types = d.get("mlp_layer_types")
        # MTP layer may carry its own expert count (random test checkpoints); default = trunk's
        self.mtp_num_experts = g("mtp_num_experts", default=self.num_experts)
        q = d.get("quantization") or d.get("quantization_config") or None
        self.quantization = q if isinstance(q, dict) else None

    def is_dense(self, layer):
        if self.mlp_layer_types and layer < len(self.mlp_layer_types):
            return self.mlp_layer_types[layer] == "dense"
        return layer < self.first_k_dense_replace

    @classmethod
    def load(cls, model_dir):
        with open(os.path.join(model_dir, "config.json")) as f:
            return cls(json.load(f))


# ----------------------------------------------------------------------------------------------
# numpy float32 reference forward
# ----------------------------------------------------------------------------------------------

def _rms(x, w, eps):
    x = x.astype(np.float32)
    return (x / np.sqrt((x * x).mean(-1, keepdims=True) + eps)) * w


def _silu(x):
    return x / (1.0 + np.exp(-x))


def _rope(x, pos, theta):
    """neox rotate-half RoPE over the full head_dim. x [T, H, D], pos [T]."""
    d = x.shape[-1]
    half = d // 2
    inv = theta ** (-np.arange(half, dtype=np.float64) * 2.0 / d)
    ang = (pos.astype(np.float64)[:, None] * inv[None, :])
    c = np.cos(ang).astype(np.float32)[:, None, :]
    s = np.sin(ang).astype(np.float32)[:, None, :]
    a, b = x[..., :half], x[..., half:]
    return np.concatenate([a * c - b * s, b * c + a * s], axis=-1)


def _normalize_names(t, cfg):
    """Map both layouts to one internal naming:
    layers L:  'L.<rest>' with experts stacked as 'L.mlp.experts.{gate,up,down}' [E,out,in],
               router 'L.mlp.router', bias 'L.mlp.expert_bias';  MTP: layer index 'mtp'.
    Quantized tensors are dequantized by the caller before this step."""
    N = cfg.num_hidden_layers
    out = {}
    for k, v in t.items():
        k2 = k
        m = re.match(r"^mtp\.(\d+\.)?(block\.|layer\.)?(.*)$", k)
        if m:
            k2 = "model.layers.mtp." + m.group(3)
        m = re.match(r"^model\.layers\.(\d+)\.(.*)$", k2)
        if m and int(m.group(1)) >= N:
            if int(m.group(1)) > N:
                continue  # only one MTP layer is supported
            k2 = "model.layers.mtp." + m.group(2)
        k2 = k2.replace(".mlp.router.expert_bias", ".mlp.expert_bias")
        k2 = k2.replace(".mlp.gate.e_score_correction_bias", ".mlp.expert_bias")
        k2 = k2.replace(".mlp.switch_mlp.", ".mlp.experts.")
        k2 = re.sub(r"\.mlp\.gate\.weight$", ".mlp.router.gate.weight", k2)
        k2 = k2.replace(".shared_experts.", ".shared_mlp.")
        out[k2] = v
    # stack per-expert tensors
    stacked = {}
    per = {}
    for k, v in out.items():
        m = re.match(r"^(.*\.mlp\.experts)\.(\d+)\.(gate|up|down)_proj\.weight$", k)
        if m:
            per.setdefault((m.group(1), m.group(3)), {})[int(m.group(2))] = v
        else:
            stacked[k] = v
    for (pfx, which), d in per.items():
        stacked[f"{pfx}.{which}_proj.weight"] = np.stack([d[i] for i in range(len(d))])
    return stacked


class Reference:
    """Float32 numpy forward of a hy_v3 checkpoint (trunk + MTP), independent of the trainer."""

    def __init__(self, model_dir, hidden_for_mtp="post"):
        self.cfg = cfg = Cfg.load(model_dir)
        raw = read_dir_tensors(model_dir, cfg.quantization)
        self.w = _normalize_names(raw, cfg)
        if "lm_head.weight" not in self.w or cfg.tie_word_embeddings:
            self.w["lm_head.weight"] = self.w["model.embed_tokens.weight"]
        self.has_mtp = any(k.startswith("model.layers.mtp.") for k in self.w)
        self.hidden_for_mtp = hidden_for_mtp

    # -- blocks ---------------------------------------------------------------------------------
    def _attn(self, pfx, x, pos):
        c, w = self.cfg, self.w
        T = x.shape[0]
        H, KV, D = c.num_attention_heads, c.num_key_value_heads, c.head_dim
        q = (x @ w[pfx + "self_attn.q_proj.weight"].T).reshape(T, H, D)
        k = (x @ w[pfx + "self_attn.k_proj.weight"].T).reshape(T, KV, D)
        v = (x @ w[pfx + "self_attn.v_proj.weight"].T).reshape(T, KV, D)
        if pfx + "self_attn.q_norm.weight" in w:   # qk_norm: per-head RMSNorm BEFORE RoPE
            q = _rms(q, w[pfx + "self_attn.q_norm.weight"], c.rms_norm_eps)
            k = _rms(k, w[pfx + "self_attn.k_norm.weight"], c.rms_norm_eps)
        q = _rope(q, pos, c.rope_theta)
        k = _rope(k, pos, c.rope_theta)
        g = H // KV
        out = np.zeros((T, H, D), np.float32)
        mask = np.triu(np.full((T, T), -np.inf, np.float32), 1)
        for h in range(H):
            j = h // g
            s = (q[:, h, :] @ k[:, j, :].T) * (D ** -0.5) + mask
            s = s - s.max(-1, keepdims=True)
            p = np.exp(s)
            p /= p.sum(-1, keepdims=True)
            out[:, h, :] = p @ v[:, j, :]
        return out.reshape(T, H * D) @ w[pfx + "self_attn.o_proj.weight"].T

    def _mlp(self, pfx, x):
        w = self.w
        return (_silu(x @ w[pfx + "gate_proj.weight"].T) * (x @ w[pfx + "up_proj.weight"].T)) \
            @ w[pfx + "down_proj.weight"].T

    def _moe(self, pfx, x):
        c, w = self.cfg, self.w
        logits = x.astype(np.float32) @ w[pfx + "mlp.router.gate.weight"].astype(np.float32).T
        s = 1.0 / (1.0 + np.exp(-logits))                     # sigmoid scores
        bias = w.get(pfx + "mlp.expert_bias")
        choose = s + bias if bias is not None else s          # bias only for choosing
        k = c.num_experts_per_tok
        idx = np.argsort(-choose, axis=-1, kind="stable")[:, :k]
        wt = np.take_along_axis(s, idx, -1)                   # weights from the raw scores
        if c.route_norm and k > 1:
            wt = wt / (wt.sum(-1, keepdims=True) + 1e-20)
        wt = wt * c.router_scaling_factor
        G = w[pfx + "mlp.experts.gate_proj.weight"]
        U = w[pfx + "mlp.experts.up_proj.weight"]
        Dn = w[pfx + "mlp.experts.down_proj.weight"]
        y = np.zeros_like(x)
        for t in range(x.shape[0]):
            for i in range(k):
                e = idx[t, i]
                hdn = _silu(G[e] @ x[t]) * (U[e] @ x[t])
                y[t] += wt[t, i] * (Dn[e] @ hdn)
        if pfx + "mlp.shared_mlp.gate_proj.weight" in w:
            y = y + self._mlp(pfx + "mlp.shared_mlp.", x)
        return y

    def _layer(self, pfx, x, pos, dense):
        c, w = self.cfg, self.w
        h = x + self._attn(pfx, _rms(x, w[pfx + "input_layernorm.weight"], c.rms_norm_eps), pos)
        n = _rms(h, w[pfx + "post_attention_layernorm.weight"], c.rms_norm_eps)
        return h + (self._mlp(pfx + "mlp.", n) if dense else self._moe(pfx, n))

    # -- public API -----------------------------------------------------------------------------
    def trunk(self, tokens):
        """Returns (logits [T,V], h_pre [T,H], h_post [T,H]) for token ids at positions 0..T-1."""
        c, w = self.cfg, self.w
        tokens = np.asarray(tokens, np.int64)
        pos = np.arange(len(tokens))
        x = w["model.embed_tokens.weight"][tokens].astype(np.float32)
        for L in range(c.num_hidden_layers):
            x = self._layer(f"model.layers.{L}.", x, pos, c.is_dense(L))
        h_post = _rms(x, w["model.norm.weight"], c.rms_norm_eps)
        return h_post @ w["lm_head.weight"].T, x, h_post

    def mtp(self, tokens, hidden):
        """Teacher-forced MTP rows p = 0..T-2: (hidden[p], token t_{p+1}, position p), causal
        attention over the MTP rows.  Returns (logits [T-1,V] predicting t_{p+2}, hm [T-1,H])."""
        c, w = self.cfg, self.w
        P = "model.layers.mtp."
        tokens = np.asarray(tokens, np.int64)
        e = w["model.embed_tokens.weight"][tokens[1:]].astype(np.float32)
        g = hidden[:-1]
        u = np.concatenate([_rms(e, w[P + "enorm.weight"], c.rms_norm_eps),      # embedding first
                            _rms(g, w[P + "hnorm.weight"], c.rms_norm_eps)], -1)  # hidden second
        z = u @ w[P + "eh_proj.weight"].T
        o = self._layer(P, z, np.arange(len(tokens) - 1), dense=False)
        hm = _rms(o, w[P + "final_layernorm.weight"], c.rms_norm_eps)
        return hm @ w["lm_head.weight"].T, hm

    def forward(self, tokens):
        logits, h_pre, h_post = self.trunk(tokens)
        mtp_logits = None
        if self.has_mtp and len(tokens) >= 2:
            mtp_logits, _ = self.mtp(tokens, h_post if self.hidden_for_mtp == "post" else h_pre)
        return logits, mtp_logits, h_pre, h_post

    def greedy(self, tokens, n, eos=None):
        """Greedy continuation (full recompute each step: slow, but obviously correct)."""
        toks = list(tokens)
        out = []
        for _ in range(n):
            logits, _, _ = self.trunk(toks)
            t = int(np.argmax(logits[-1]))
            out.append(t)
            toks.append(t)
            if eos is not None and t == eos:
                break
        return out


# ----------------------------------------------------------------------------------------------
# PyTorch training model
# ----------------------------------------------------------------------------------------------
try:
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
except ImportError:  # the reference forward does not need torch
    torch = None

if torch is not None:

    class RMSNorm(nn.Module):
        def __init__(self, d, eps):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(d))
            self.eps = eps

        def forward(self, x):
            xf = x.float()
            xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
            return self.weight * xf.to(x.dtype)

    def rope_cache(T, D, theta):
        inv = theta ** (-torch.arange(0, D // 2, dtype=torch.float64) * 2.0 / D)
        ang = torch.arange(T, dtype=torch.float64)[:, None] * inv[None, :]
        return torch.cos(ang).float(), torch.sin(ang).float()

    def apply_rope(x, cos, sin):
        # x [B, H, T, D]; neox rotate-half
        half = x.shape[-1] // 2
        a, b = x[..., :half], x[..., half:]
        return torch.cat([a * cos - b * sin, b * cos + a * sin], -1)

    class Attention(nn.Module):
        def __init__(self, c):
            super().__init__()
            self.H, self.KV, self.D = c.num_attention_heads, c.num_key_value_heads, c.head_dim
            hs = c.hidden_size
            self.q_proj = nn.Linear(hs, self.H * self.D, bias=False)
            self.k_proj = nn.Linear(hs, self.KV * self.D, bias=False)
            self.v_proj = nn.Linear(hs, self.KV * self.D, bias=False)
            self.o_proj = nn.Linear(self.H * self.D, hs, bias=False)
            self.q_norm = RMSNorm(self.D, c.rms_norm_eps)
            self.k_norm = RMSNorm(self.D, c.rms_norm_eps)

        def forward(self, x, cos, sin, mask):
            B, T, _ = x.shape
            q = self.q_proj(x).view(B, T, self.H, self.D)
            k = self.k_proj(x).view(B, T, self.KV, self.D)
            v = self.v_proj(x).view(B, T, self.KV, self.D)
            q = self.q_norm(q).transpose(1, 2)          # norm BEFORE rope
            k = self.k_norm(k).transpose(1, 2)
            v = v.transpose(1, 2)
            q = apply_rope(q, cos, sin)
            k = apply_rope(k, cos, sin)
            g = self.H // self.KV                       # head h uses kv head h // g
            k = k.repeat_interleave(g, dim=1)
            v = v.repeat_interleave(g, dim=1)
            s = (q @ k.transpose(-1, -2)) * (self.D ** -0.5) + mask
            o = torch.softmax(s.float(), -1).to(v.dtype) @ v
            return self.o_proj(o.transpose(1, 2).reshape(B, T, self.H * self.D))

    class MLP(nn.Module):
        def __init__(self, hs, inter):
            super().__init__()
            self.gate_proj = nn.Linear(hs, inter, bias=False)
            self.up_proj = nn.Linear(hs, inter, bias=False)
            self.down_proj = nn.Linear(inter, hs, bias=False)

        def forward(self, x):
            return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))

    class MoE(nn.Module):
        """Sigmoid router + selection-only bias (aux-loss-free balancing) + shared expert."""

        def __init__(self, c, n_experts):
            super().__init__()
            hs, ed = c.hidden_size, c.expert_hidden_dim
            self.E, self.k = n_experts, c.num_experts_per_tok
            self.route_norm, self.scale = c.route_norm, c.router_scaling_factor
            self.gate = nn.Linear(hs, n_experts, bias=False)   # exported as router.gate
            # stacked expert weights [E, out, in] (exported per expert)
            std = hs ** -0.5
            self.w_gate = nn.Parameter(torch.randn(n_experts, ed, hs) * std)
            self.w_up = nn.Parameter(torch.randn(n_experts, ed, hs) * std)
            self.w_down = nn.Parameter(torch.randn(n_experts, hs, ed) * ed ** -0.5)
            self.shared_mlp = MLP(hs, ed * c.num_shared_experts)
            self.register_buffer("expert_bias", torch.zeros(n_experts))
            self.register_buffer("load", torch.zeros(n_experts))   # tokens routed since last update

        def forward(self, x):
            shp = x.shape
            x = x.reshape(-1, shp[-1])
            with torch.autocast("cpu", enabled=False):             # router always in fp32
                s = torch.sigmoid(F.linear(x.float(), self.gate.weight.float()))
            with torch.no_grad():
                idx = torch.topk(s + self.expert_bias, self.k, dim=-1).indices
                self.load += torch.bincount(idx.flatten(), minlength=self.E).float()
            wt = s.gather(-1, idx)
            if self.route_norm and self.k > 1:
                wt = wt / (wt.sum(-1, keepdim=True) + 1e-20)
            wt = (wt * self.scale).to(x.dtype)
            y = torch.zeros_like(x)
            flat = idx.flatten()
            tok = torch.arange(x.shape[0]).repeat_interleave(self.k)
            wflat = wt.flatten()
            order = torch.argsort(flat)
            counts = torch.bincount(flat, minlength=self.E).tolist()
            start = 0
            for e, n in enumerate(counts):
                if n == 0:
                    continue
                sel = order[start:start + n]
                start += n
                ti = tok[sel]
                xe = x[ti]
                h = F.silu(xe @ self.w_gate[e].t()) * (xe @ self.w_up[e].t())
                y.index_add_(0, ti, (h @ self.w_down[e].t()) * wflat[sel, None])
            y = y + self.shared_mlp(x)
            return y.view(shp)

        @torch.no_grad()
        def update_bias(self, gamma):
            """DeepSeek-V3 aux-loss-free balancing: push under-loaded experts up."""
            if self.load.sum() > 0:
                self.expert_bias += gamma * torch.sign(self.load.mean() - self.load)
            self.load.zero_()

    class Layer(nn.Module):
        def __init__(self, c, dense, n_experts=None):
            super().__init__()
            self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
            self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
            self.self_attn = Attention(c)
            self.dense = dense
            self.mlp = MLP(c.hidden_size, c.intermediate_size) if dense else MoE(c, n_experts or c.num_experts)

        def forward(self, x, cos, sin, mask):
            h = x + self.self_attn(self.input_layernorm(x), cos, sin, mask)
            return h + self.mlp(self.post_attention_layernorm(h))

    class MTPLayer(nn.Module):
        def __init__(self, c):
            super().__init__()
            hs = c.hidden_size
            self.enorm = RMSNorm(hs, c.rms_norm_eps)
            self.hnorm = RMSNorm(hs, c.rms_norm_eps)
            self.eh_proj = nn.Linear(2 * hs, hs, bias=False)
            self.layer = Layer(c, dense=False, n_experts=c.mtp_num_experts)
            self.final_layernorm = RMSNorm(hs, c.rms_norm_eps)

        def forward(self, emb_next, h_post, cos, sin, mask):
            u = torch.cat([self.enorm(emb_next), self.hnorm(h_post)], -1)  # embedding first
            return self.final_layernorm(self.layer(self.eh_proj(u), cos, sin, mask))

    class HyV3(nn.Module):
        def __init__(self, c):
            super().__init__()
            self.c = c
            self.embed_tokens = nn.Embedding(c.vocab_size, c.hidden_size)
            self.layers = nn.ModuleList([Layer(c, c.is_dense(i)) for i in range(c.num_hidden_layers)])
            self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
            self.lm_head = nn.Linear(c.hidden_size, c.vocab_size, bias=False)
            self.mtp = MTPLayer(c) if c.num_nextn_predict_layers else None
            self.apply(self._init)
            # scale residual-branch outputs down with depth (GPT-2 style) for a stable start
            for n, p in self.named_parameters():
                if n.endswith(("o_proj.weight", "down_proj.weight", "w_down")):
                    with torch.no_grad():
                        p.mul_(1.0 / math.sqrt(2 * (c.num_hidden_layers + 1)))

        @staticmethod
        def _init(m):
            if isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, std=m.in_features ** -0.5)
            elif isinstance(m, nn.Embedding):
                nn.init.normal_(m.weight, std=1.0)

        def moe_modules(self):
            return [m for m in self.modules() if isinstance(m, MoE)]

        def forward(self, tokens, next_tokens=None):
            """tokens [B,T] -> trunk logits [B,T,V]; with next_tokens [B,T] (= t_{p+1}) also
            returns the MTP logits [B,T,V] predicting t_{p+2}."""
            B, T = tokens.shape
            cos, sin = rope_cache(T, self.c.head_dim, self.c.rope_theta)
            mask = torch.triu(torch.full((T, T), float("-inf")), 1)
            x = self.embed_tokens(tokens)
            for layer in self.layers:
                x = layer(x, cos, sin, mask)
            h_post = self.norm(x)
            logits = self.lm_head(h_post.float())
            if next_tokens is None or self.mtp is None:
                return logits, None
            hm = self.mtp(self.embed_tokens(next_tokens), h_post, cos, sin, mask)
            return logits, self.lm_head(hm.float())
