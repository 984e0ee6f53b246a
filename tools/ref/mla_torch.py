#!/usr/bin/python3
"""A second MLA forward (glm4_moe_lite / deepseek_v3), in PyTorch, with the attention and RoPE/YaRN
written the way transformers' Glm4MoeLiteAttention / DeepseekV3Attention and
_compute_yarn_parameters compute them, to cross-check the numpy reference (tools/ref/mla.py) in
tests/ref/selftest_mla.py.

Deliberately computed the other way round wherever the sources allow it: the whole [T, H*(nope+v)]
kv_b_proj product split into keys and values with torch.split; the roped key expanded over the heads;
RoPE by de-interleaving the rope dims (even dims first, then odd) and rotating halves against
cos/sin tables of cat(freqs, freqs) multiplied by the attention factor (transformers
apply_rotary_pos_emb_interleave - the output stays de-interleaved, the same permutation on query and
key, so the scores are those of the GPT-J rotation); inverse frequencies in float32 as transformers
builds them; the attention factor by transformers' rule (mscale / mscale_all_dim ratio when both are
set, else get_mscale(factor)).  Router, MoE and MTP wiring come from tools/ref/glm4_moe_torch.py
(transformers' 0.0 group mask, per-expert dispatch).  HF layout (kv_b_proj) only.
"""
import math
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from glm4_moe_torch import TorchGlm, rms, rotate_half  # noqa: E402
from mla import MlaConfig  # noqa: E402  (config keys only)


def yarn_get_mscale(scale=1, mscale=1):
    if scale <= 1:
        return 1.0
    return 0.1 * mscale * math.log(scale) + 1.0


class TorchMla(TorchGlm):
    config_cls = MlaConfig

    def rope_tables(self, pos):
        c = self.c
        raw = dict(c.raw.get("rope_scaling") or {})
        dim, base = c.qk_rope_head_dim, c.rope_theta
        pos_freqs = base ** (torch.arange(0, dim, 2).float() / dim)
        attention_factor = 1.0
        if not c.yarn:
            inv_freq = 1.0 / pos_freqs
        else:
            factor = raw["factor"]
            mscale, mscale_all_dim = raw.get("mscale"), raw.get("mscale_all_dim")
            if mscale and mscale_all_dim:
                attention_factor = float(yarn_get_mscale(factor, mscale) / yarn_get_mscale(factor, mscale_all_dim))
            else:
                attention_factor = yarn_get_mscale(factor)
            beta_fast, beta_slow = raw.get("beta_fast") or 32, raw.get("beta_slow") or 1
            orig = raw["original_max_position_embeddings"]

            def find_correction_dim(num_rotations):
                return (dim * math.log(orig / (num_rotations * 2 * math.pi))) / (2 * math.log(base))
            low = max(math.floor(find_correction_dim(beta_fast)), 0)
            high = min(math.ceil(find_correction_dim(beta_slow)), dim - 1)
            if low == high:
                high += 0.001
            ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
            extrapolation_factor = 1 - ramp
            inv_freq = (1.0 / (factor * pos_freqs)) * (1 - extrapolation_factor) + \
                (1.0 / pos_freqs) * extrapolation_factor
        freqs = pos.float()[:, None] @ inv_freq[None, :]
        emb = torch.cat((freqs, freqs), -1)
        return emb.cos() * attention_factor, emb.sin() * attention_factor

    def scaling(self):
        c = self.c
        s = (c.qk_nope_head_dim + c.qk_rope_head_dim) ** -0.5
        raw = c.raw.get("rope_scaling")
        if raw is not None:
            mad = raw.get("mscale_all_dim", 0)
            if mad:
                m = yarn_get_mscale(raw["factor"], mad)
                s = s * m * m
        return s

    def attn(self, p, x, pos):
        c, w = self.c, self.w
        T = x.shape[0]
        H, dn, dr, dv = c.num_attention_heads, c.qk_nope_head_dim, c.qk_rope_head_dim, c.v_head_dim
        a = p + "self_attn."
        eps = c.rms_norm_eps
        if c.q_lora_rank:
            q = F.linear(rms(F.linear(x, w[a + "q_a_proj.weight"]), w[a + "q_a_layernorm.weight"], eps),
                         w[a + "q_b_proj.weight"])
        else:
            q = F.linear(x, w[a + "q_proj.weight"])
        q = q.view(T, H, dn + dr).transpose(0, 1)                            # [H, T, dn+dr]
        q_pass, q_rot = torch.split(q, [dn, dr], dim=-1)
        k_pass, k_rot = torch.split(F.linear(x, w[a + "kv_a_proj_with_mqa.weight"]), [c.kv_lora_rank, dr], dim=-1)
        k_pass = F.linear(rms(k_pass, w[a + "kv_a_layernorm.weight"], eps), w[a + "kv_b_proj.weight"])
        k_pass, v = torch.split(k_pass.view(T, H, dn + dv).transpose(0, 1), [dn, dv], dim=-1)
        k_rot = k_rot.view(1, T, dr)
        cos, sin = self.rope_tables(pos)

        def deinterleave(t):
            h, s, d = t.shape
            return t.view(h, s, d // 2, 2).transpose(3, 2).reshape(h, s, d)
        q_rot, k_rot = deinterleave(q_rot), deinterleave(k_rot)
        q_rot = q_rot * cos + rotate_half(q_rot) * sin
        k_rot = (k_rot * cos + rotate_half(k_rot) * sin).expand(H, T, dr)
        query = torch.cat((q_pass, q_rot), -1)
        key = torch.cat((k_pass, k_rot), -1)
        s = query @ key.transpose(1, 2) * self.scaling() + torch.triu(torch.full((T, T), float("-inf")), 1)
        o = torch.softmax(s, -1) @ v
        return F.linear(o.transpose(0, 1).reshape(T, H * dv), w[a + "o_proj.weight"])
