#!/usr/bin/python3
"""A second qwen3_5_moe / qwen3_next forward, in PyTorch, shaped like transformers'
Qwen3_5MoeForCausalLM / Qwen3NextForCausalLM and vLLM's Qwen3NextMTP, to cross-check the numpy
reference (tools/ref/qwen35.py) in tests/ref/selftest_qwen35.py.

Deliberately computed the other way round wherever the sources allow it: the DeltaNet by the
CHUNKED algorithm (transformers torch_chunk_gated_delta_rule, chunk 64: per chunk a unit lower
triangular system solved for the corrected values, the state read once per chunk and decayed by the
chunk's cumulative gate) instead of the token recurrence; the causal conv1d by F.conv1d with K - 1
zeros of padding (causal_conv1d_fn); RoPE through cos/sin tables of cat(freqs, freqs) and
rotate_half; GQA through repeat_kv; the gated norm in float32 as Qwen3_5MoeRMSNormGated; experts
dispatched per expert with index_add_ (transformers' Qwen3_5MoeExperts).  Config and tensor names
come from tools/ref/qwen35.py (they are the checkpoint's facts, not its numerics).
"""
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from qwen35 import Qwen35Config, canonical_names, fix_conv_and_norms, split_fused  # noqa: E402  (names only)
from glm4_moe import normalize_names  # noqa: E402
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "train"))
from safetensors_io import read_dir_tensors  # noqa: E402


def rms(x, w, eps):
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), -1)


def l2norm(x, eps=1e-6):
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + eps)


def chunk_gated_delta_rule(q, k, v, g, beta, chunk_size=64, initial_state=None):
    """transformers' torch_chunk_gated_delta_rule on [T, H, d] inputs (q, k already L2-normalised and
    repeated to the value heads, q not yet scaled); returns (out [T, H, dv], final state [H, dk, dv])."""
    T, H, dk = k.shape
    dv = v.shape[-1]
    q, k, v = (x.transpose(0, 1).float() for x in (q, k, v))           # [H, T, d]
    beta, g = beta.transpose(0, 1).float(), g.transpose(0, 1).float()  # [H, T]
    q = q * dk ** -0.5
    pad = (chunk_size - T % chunk_size) % chunk_size
    q, k, v = (F.pad(x, (0, 0, 0, pad)) for x in (q, k, v))
    beta, g = F.pad(beta, (0, pad)), F.pad(g, (0, pad))
    n = (T + pad) // chunk_size
    v_beta, k_beta = v * beta[..., None], k * beta[..., None]
    q, k, k_beta, v_beta = (x.reshape(H, n, chunk_size, x.shape[-1]) for x in (q, k, k_beta, v_beta))
    g = g.reshape(H, n, chunk_size).cumsum(-1)
    upper = torch.ones(chunk_size, chunk_size, dtype=torch.bool).triu(1)
    decay = (g[..., :, None] - g[..., None, :]).masked_fill(upper, float("-inf")).exp()
    ut = (k_beta @ k.transpose(-1, -2)) * decay
    attn = (q @ k.transpose(-1, -2)) * decay
    # ut is (strictly lower) + the identity the solver assumes: solve (I + L) X = B
    new_v = torch.linalg.solve_triangular(ut, v_beta, upper=False, unitriangular=True)
    k_cum = torch.linalg.solve_triangular(ut, k_beta * g.exp()[..., None], upper=False, unitriangular=True)
    S = torch.zeros(H, dk, dv) if initial_state is None else initial_state.float().clone()
    out = torch.zeros_like(new_v)
    qd = q * g.exp()[..., None]
    kd = k * (g[..., -1:] - g).exp()[..., None]
    for i in range(n):
        vn = new_v[:, i] - k_cum[:, i] @ S
        out[:, i] = qd[:, i] @ S + attn[:, i] @ vn
        S = S * g[:, i, -1].exp()[:, None, None] + kd[:, i].transpose(-1, -2) @ vn
    return out.reshape(H, -1, dv)[:, :T].transpose(0, 1), S


class TorchQwen35:
    def __init__(self, model_dir, chunk_size=64):
        self.c = c = Qwen35Config.load(model_dir)
        w = canonical_names(read_dir_tensors(model_dir, c.quantization))
        mtp_mlx = any(".mlp.switch_mlp." in k for k in w if k.startswith("mtp."))
        w = normalize_names(w)
        split_fused(w, c)
        fix_conv_and_norms(w, c, mtp_mlx)
        self.w = {k: torch.from_numpy(v.copy()) for k, v in w.items()}
        self.lm_head = self.w.get("lm_head.weight", self.w["model.embed_tokens.weight"])
        self.chunk_size = chunk_size

    def lin(self, x, name):
        return F.linear(x, self.w[name + ".weight"])

    def deltanet(self, p, x):
        c = self.c
        la = p + "linear_attn."
        T = x.shape[0]
        Hk, Hv, dk, dv = (c.linear_num_key_heads, c.linear_num_value_heads, c.linear_key_head_dim,
                          c.linear_value_head_dim)
        mixed = self.lin(x, la + "in_proj_qkv").t()[None]                 # [1, C, T]
        cw = self.w[la + "conv1d.weight"]
        mixed = F.silu(F.conv1d(mixed, cw.unsqueeze(1), padding=cw.shape[-1] - 1, groups=cw.shape[0])[..., :T])
        mixed = mixed[0].t()
        q, k, v = torch.split(mixed, [c.key_dim, c.key_dim, c.value_dim], -1)
        q, k = l2norm(q.reshape(T, Hk, dk)), l2norm(k.reshape(T, Hk, dk))
        q, k = (y.repeat_interleave(Hv // Hk, dim=1) for y in (q, k))
        beta = self.lin(x, la + "in_proj_b").sigmoid()
        g = -self.w[la + "A_log"].float().exp() * F.softplus(self.lin(x, la + "in_proj_a") + self.w[la + "dt_bias"])
        o, _ = chunk_gated_delta_rule(q, k, v.reshape(T, Hv, dv), g, beta, self.chunk_size)
        z = self.lin(x, la + "in_proj_z").reshape(T, Hv, dv)
        o = self.w[la + "norm.weight"] * (o * torch.rsqrt(o.pow(2).mean(-1, keepdim=True) + c.rms_norm_eps))
        return self.lin((o * F.silu(z)).reshape(T, -1), la + "out_proj")

    def attention(self, p, x, pos):
        c = self.c
        T, H, KV, D = x.shape[0], c.num_attention_heads, c.num_key_value_heads, c.head_dim
        at = p + "self_attn."
        q, gate = torch.chunk(self.lin(x, at + "q_proj").view(T, H, 2 * D), 2, dim=-1)
        gate = gate.reshape(T, H * D)
        q = rms(q, self.w[at + "q_norm.weight"], c.rms_norm_eps).transpose(0, 1)
        k = rms(self.lin(x, at + "k_proj").view(T, KV, D), self.w[at + "k_norm.weight"], c.rms_norm_eps).transpose(0, 1)
        v = self.lin(x, at + "v_proj").view(T, KV, D).transpose(0, 1)
        rd = c.rotary_dim
        inv = 1.0 / (c.rope_theta ** (torch.arange(0, rd, 2, dtype=torch.int64).float() / rd))
        fr = pos[:, None].float() * inv[None]
        emb = torch.cat((fr, fr), -1)
        cos, sin = emb.cos()[None], emb.sin()[None]
        q = torch.cat([q[..., :rd] * cos + rotate_half(q[..., :rd]) * sin, q[..., rd:]], -1)
        k = torch.cat([k[..., :rd] * cos + rotate_half(k[..., :rd]) * sin, k[..., rd:]], -1)
        rep = H // KV
        k = k[:, None].expand(KV, rep, T, D).reshape(H, T, D)
        v = v[:, None].expand(KV, rep, T, D).reshape(H, T, D)
        s = (q @ k.transpose(1, 2)) * D ** -0.5
        s = s.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
        o = (torch.softmax(s, -1) @ v).transpose(0, 1).reshape(T, H * D)
        return self.lin(o * torch.sigmoid(gate), at + "o_proj")

    def moe(self, p, x):
        c = self.c
        probs = torch.softmax(self.lin(x, p + "mlp.gate").float(), dim=-1)
        topv, topi = torch.topk(probs, c.num_experts_per_tok, dim=-1)
        if c.norm_topk_prob:
            topv = topv / topv.sum(-1, keepdim=True)
        G, U, Dn = (self.w[p + f"mlp.experts.{n}_proj.weight"] for n in ("gate", "up", "down"))
        y = torch.zeros_like(x)
        for e in range(G.shape[0]):
            tok, slot = torch.where(topi == e)
            if tok.numel():
                h = F.linear(F.silu(F.linear(x[tok], G[e])) * F.linear(x[tok], U[e]), Dn[e])
                y.index_add_(0, tok, h * topv[tok, slot, None])
        se = p + "mlp.shared_expert."
        sh = self.lin(F.silu(self.lin(x, se + "gate_proj")) * self.lin(x, se + "up_proj"), se + "down_proj")
        return y + torch.sigmoid(self.lin(x, p + "mlp.shared_expert_gate")) * sh

    def layer(self, p, x, pos, full):
        c = self.c
        n = rms(x, self.w[p + "input_layernorm.weight"], c.rms_norm_eps)
        h = x + (self.attention(p, n, pos) if full else self.deltanet(p, n))
        return h + self.moe(p, rms(h, self.w[p + "post_attention_layernorm.weight"], c.rms_norm_eps))

    @torch.no_grad()
    def forward(self, tokens):
        c = self.c
        t = torch.tensor(tokens)
        pos = torch.arange(len(tokens))
        x = self.w["model.embed_tokens.weight"][t]
        for L in range(c.num_hidden_layers):
            x = self.layer(f"model.layers.{L}.", x, pos, c.layer_types[L] == "full_attention")
        h = rms(x, self.w["model.norm.weight"], c.rms_norm_eps)
        logits = F.linear(h, self.lm_head)
        mtp = None
        if "mtp.fc.weight" in self.w and len(tokens) >= 2:
            e = self.w["model.embed_tokens.weight"][t[1:]]
            u = torch.cat([rms(e, self.w["mtp.pre_fc_norm_embedding.weight"], c.rms_norm_eps),
                           rms(h[:-1], self.w["mtp.pre_fc_norm_hidden.weight"], c.rms_norm_eps)], -1)
            o = self.layer("mtp.layers.0.", self.lin(u, "mtp.fc"), pos[:-1], True)
            mtp = F.linear(rms(o, self.w["mtp.norm.weight"], c.rms_norm_eps), self.lm_head)
        return logits.numpy(), None if mtp is None else mtp.numpy()
