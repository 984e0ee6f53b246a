#!/usr/bin/python3
"""Export the PyTorch HyV3 model to a checkpoint directory in the ORIGINAL TENCENT
layout (docs/design.md §4.1): bf16 ``model.safetensors`` with per-expert tensors
``model.layers.L.mlp.experts.E.{gate,up,down}_proj.weight``, router at
``mlp.router.gate.weight``, fp32 ``mlp.expert_bias``, shared expert at
``mlp.shared_mlp.*`` and the MTP layer at ``model.layers.{num_hidden_layers}.*``;
plus config.json, generation_config.json and the tokenizer files.

``tencent_state`` / ``load_into`` are inverse mappings, so evaluation can run the
torch model on exactly the bf16 weights that were exported.
"""
import json
import os
import shutil
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from safetensors_io import write_file, read_file, bf16_to_f32, f32_to_bf16  # noqa: E402


def _layer_items(prefix, layer):
    """(tencent name, tensor) for one torch Layer."""
    out = []
    for n in ("q_proj", "k_proj", "v_proj", "o_proj"):
        out.append((f"{prefix}self_attn.{n}.weight", getattr(layer.self_attn, n).weight))
    out.append((f"{prefix}self_attn.q_norm.weight", layer.self_attn.q_norm.weight))
    out.append((f"{prefix}self_attn.k_norm.weight", layer.self_attn.k_norm.weight))
    out.append((f"{prefix}input_layernorm.weight", layer.input_layernorm.weight))
    out.append((f"{prefix}post_attention_layernorm.weight", layer.post_attention_layernorm.weight))
    m = layer.mlp
    if layer.dense:
        for n in ("gate_proj", "up_proj", "down_proj"):
            out.append((f"{prefix}mlp.{n}.weight", getattr(m, n).weight))
    else:
        out.append((f"{prefix}mlp.router.gate.weight", m.gate.weight))
        out.append((f"{prefix}mlp.expert_bias", m.expert_bias))
        for e in range(m.E):
            out.append((f"{prefix}mlp.experts.{e}.gate_proj.weight", (m.w_gate, e)))
            out.append((f"{prefix}mlp.experts.{e}.up_proj.weight", (m.w_up, e)))
            out.append((f"{prefix}mlp.experts.{e}.down_proj.weight", (m.w_down, e)))
        for n in ("gate_proj", "up_proj", "down_proj"):
            out.append((f"{prefix}mlp.shared_mlp.{n}.weight", getattr(m.shared_mlp, n).weight))
    return out


def tencent_items(model):
    c = model.c
    items = [("model.embed_tokens.weight", model.embed_tokens.weight)]
    for i, layer in enumerate(model.layers):
        items += _layer_items(f"model.layers.{i}.", layer)
    items.append(("model.norm.weight", model.norm.weight))
    items.append(("lm_head.weight", model.lm_head.weight))
    if model.mtp is not None:
        N = c.num_hidden_layers
        p = f"model.layers.{N}."
        items += [(p + "enorm.weight", model.mtp.enorm.weight), (p + "hnorm.weight", model.mtp.hnorm.weight),
                  (p + "eh_proj.weight", model.mtp.eh_proj.weight)]
        items += _layer_items(p, model.mtp.layer)
        items.append((p + "final_layernorm.weight", model.mtp.final_layernorm.weight))
    return items


def _get(t):
    if isinstance(t, tuple):
        return t[0].detach()[t[1]].float().numpy()
    return t.detach().float().numpy()


def export(model, cfgd, outdir, tokenizer_dir):
    os.makedirs(outdir, exist_ok=True)
    tensors = {}
    for name, t in tencent_items(model):
        a = _get(t)
        tensors[name] = ("F32", a.astype(np.float32)) if name.endswith("expert_bias") else ("BF16", a)
    write_file(os.path.join(outdir, "model.safetensors"), tensors, metadata={"format": "pt"})
    with open(os.path.join(outdir, "config.json"), "w") as f:
        json.dump(cfgd, f, indent=2)
    gen = {"bos_token_id": cfgd["bos_token_id"], "eos_token_id": cfgd["eos_token_id"],
           "pad_token_id": cfgd["pad_token_id"], "do_sample": False, "temperature": 1.0,
           "max_new_tokens": 256}
    with open(os.path.join(outdir, "generation_config.json"), "w") as f:
        json.dump(gen, f, indent=2)
    for fn in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(tokenizer_dir, fn), os.path.join(outdir, fn))


def load_into(model, ckpt_dir):
    """Load an exported (bf16) Tencent-layout checkpoint back into a torch HyV3."""
    import torch
    t = read_file(os.path.join(ckpt_dir, "model.safetensors"))
    with torch.no_grad():
        for name, dst in tencent_items(model):
            src = torch.from_numpy(np.ascontiguousarray(t[name]).astype(np.float32))
            if isinstance(dst, tuple):
                dst[0][dst[1]].copy_(src)
            else:
                dst.copy_(src)
