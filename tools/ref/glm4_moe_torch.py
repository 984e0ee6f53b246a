#!/usr/bin/python3
"""A second glm4_moe forward, in PyTorch, shaped like transformers' Glm4MoeForCausalLM and vLLM's
Glm4MoeMTP, to cross-check the numpy reference (tools/ref/glm4_moe.py) in tests/ref/selftest_glm.py.

Deliberately computed the other way round wherever the sources allow it: RoPE through cos/sin tables
of cat(freqs, freqs) and rotate_half; GQA through repeat_kv; the router through torch.topk on group
scores and a 0.0 group mask (transformers; the numpy reference masks with -inf like vLLM - random
test checkpoints keep biased scores positive, where both agree); experts dispatched per expert with
index_add_ (transformers' naive MoE) instead of per token.
"""
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from glm4_moe import GlmConfig, normalize_names  # noqa: E402  (config keys and tensor names only)
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "train"))
from safetensors_io import read_dir_tensors  # noqa: E402


def rms(x, w, eps):
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), -1)


class TorchGlm:
    config_cls = GlmConfig

    def __init__(self, model_dir, mtp_zero_pos0=True):
        self.c = c = self.config_cls.load(model_dir)
        self.w = {k: torch.from_numpy(v.copy()) for k, v in
                  normalize_names(read_dir_tensors(model_dir, c.quantization)).items()}
        self.lm_head = self.w.get("lm_head.weight", self.w["model.embed_tokens.weight"])
        self.mtp_zero_pos0 = mtp_zero_pos0

    def rope_tables(self, pos):
        c = self.c
        dim = c.rotary_dim
        inv = 1.0 / (c.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.int64).double() / dim))
        freqs = pos.double()[:, None] * inv[None, :]
        emb = torch.cat((freqs, freqs), -1)
        return emb.cos().float(), emb.sin().float()

    def attn(self, p, x, pos):
        c, w = self.c, self.w
        T = x.shape[0]
        H, KV, D = c.num_attention_heads, c.num_key_value_heads, c.head_dim

        def proj(n):
            return F.linear(x, w[p + f"self_attn.{n}_proj.weight"], w.get(p + f"self_attn.{n}_proj.bias"))
        q = proj("q").view(T, H, D)
        k = proj("k").view(T, KV, D)
        v = proj("v").view(T, KV, D).transpose(0, 1)
        if c.use_qk_norm:
            q = rms(q, w[p + "self_attn.q_norm.weight"], c.rms_norm_eps)
            k = rms(k, w[p + "self_attn.k_norm.weight"], c.rms_norm_eps)
        q, k = q.transpose(0, 1), k.transpose(0, 1)              # [heads, T, D]
        cos, sin = self.rope_tables(pos)
        rd = cos.shape[-1]
        q = torch.cat([q[..., :rd] * cos + rotate_half(q[..., :rd]) * sin, q[..., rd:]], -1)
        k = torch.cat([k[..., :rd] * cos + rotate_half(k[..., :rd]) * sin, k[..., rd:]], -1)
        n_rep = H // KV
        k = k[:, None].expand(KV, n_rep, T, D).reshape(H, T, D)
        v = v[:, None].expand(KV, n_rep, T, D).reshape(H, T, D)
        s = q @ k.transpose(1, 2) * D ** -0.5 + torch.triu(torch.full((T, T), float("-inf")), 1)
        o = torch.softmax(s, -1) @ v
        return F.linear(o.transpose(0, 1).reshape(T, H * D), w[p + "self_attn.o_proj.weight"])

    def mlp(self, p, x):
        w = self.w
        return F.linear(F.silu(F.linear(x, w[p + "gate_proj.weight"])) * F.linear(x, w[p + "up_proj.weight"]),
                        w[p + "down_proj.weight"])

    def moe(self, p, x):
        c, w = self.c, self.w
        E, G = c.n_routed_experts, c.n_group
        scores = F.linear(x, w[p + "mlp.gate.weight"]).sigmoid()
        choice = scores + w[p + "mlp.gate.e_score_correction_bias"]
        gsc = choice.view(-1, G, E // G).topk(2, dim=-1)[0].sum(-1)
        gidx = torch.topk(gsc, k=c.topk_group, dim=-1)[1]
        gmask = torch.zeros_like(gsc).scatter_(1, gidx, 1)
        smask = gmask.unsqueeze(-1).expand(-1, G, E // G).reshape(-1, E)
        idx = torch.topk(choice.masked_fill(~smask.bool(), 0.0), k=c.num_experts_per_tok, dim=-1)[1]
        wt = scores.gather(1, idx)
        if c.norm_topk_prob:
            wt = wt / (wt.sum(-1, keepdim=True) + 1e-20)
        wt = wt * c.routed_scaling_factor
        Wg, Wu, Wd = (w[p + f"mlp.experts.{n}_proj.weight"] for n in ("gate", "up", "down"))
        y = torch.zeros_like(x)
        onehot = F.one_hot(idx, E).permute(2, 1, 0)              # [E, k, T]
        for e in range(E):
            slot, tok = torch.where(onehot[e])
            if tok.numel() == 0:
                continue
            h = F.silu(x[tok] @ Wg[e].T) * (x[tok] @ Wu[e].T)
            y.index_add_(0, tok, (h @ Wd[e].T) * wt[tok, slot, None])
        if c.n_shared_experts:
            y = y + self.mlp(p + "mlp.shared_experts.", x)
        return y

    def layer(self, p, x, pos, dense):
        eps = self.c.rms_norm_eps
        h = x + self.attn(p, rms(x, self.w[p + "input_layernorm.weight"], eps), pos)
        n = rms(h, self.w[p + "post_attention_layernorm.weight"], eps)
        return h + (self.mlp(p + "mlp.", n) if dense else self.moe(p, n))

    @torch.no_grad()
    def forward(self, tokens):
        c, w = self.c, self.w
        t = torch.tensor(tokens)
        pos = torch.arange(len(tokens))
        x = w["model.embed_tokens.weight"][t]
        for L in range(c.num_hidden_layers):
            x = self.layer(f"model.layers.{L}.", x, pos, L < c.first_k_dense_replace)
        h = rms(x, w["model.norm.weight"], c.rms_norm_eps)
        logits = F.linear(h, self.lm_head)
        P = f"model.layers.{c.num_hidden_layers}."
        if P + "eh_proj.weight" not in w:
            return logits.numpy(), None
        # vLLM Glm4MoeMultiTokenPredictorLayer: inputs_embeds[positions == 0] = 0, embedding first
        mpos = pos[:-1]
        e = w.get(P + "embed_tokens.weight", w["model.embed_tokens.weight"])[t[1:]].clone()
        if self.mtp_zero_pos0:
            e[mpos == 0] = 0
        z = F.linear(torch.cat([rms(e, w[P + "enorm.weight"], c.rms_norm_eps),
                                rms(h[:-1], w[P + "hnorm.weight"], c.rms_norm_eps)], -1), w[P + "eh_proj.weight"])
        o = self.layer(P, z, mpos, False)
        head = w.get(P + "shared_head.head.weight", self.lm_head)
        return logits.numpy(), F.linear(rms(o, w[P + "shared_head.norm.weight"], c.rms_norm_eps), head).numpy()
