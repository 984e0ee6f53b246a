#!/usr/bin/python3
"""Generate small RANDOM glm4_moe (GLM-4.5 family) checkpoints with an MTP layer, for engine tests.

Deterministic by --seed: every tensor comes from its own generator seeded by (seed, canonical
tensor name), so the same seed and shape options give bit-identical weights in the HF and the MLX
layout, with or without shards or a sidecar.

Defaults are deliberately odd: 6 query heads (not a power of two) over 2 kv heads, head_dim 32 with
hidden 160 != heads*head_dim, partial RoPE over 16 of 32 dims, q/k/v biases, qk-norm, 8 experts
top-3, 2 leading dense layers, vocab 419.  --preset air switches to the GLM-4.5-Air shape rules
(no qk-norm, one dense layer, routed_scaling_factor 1.0).

e_score_correction_bias is drawn from [0, 0.3): large enough to change the top-k choice against the
raw sigmoid scores, and non-negative so that biased scores stay > 0 - then masking discarded groups
to 0 (transformers, mlx-lm) or to -inf (vLLM) picks the same experts.

Layouts:
  hf   model.layers.L.mlp.experts.E.{gate,up,down}_proj.weight, mlp.gate.weight,
       mlp.gate.e_score_correction_bias (F32), mlp.shared_experts.*, dense mlp.{gate,up,down}_proj;
       MTP at model.layers.{N}: eh_proj, enorm, hnorm, shared_head.norm (+ embed_tokens and
       shared_head.head with --mtp-head own, as GLM-4.5 ships; GLM-4.6 lacks both), and a MoE
       decoder layer.  Header padded to 8, metadata format=pt.
  mlx  as mlx-lm writes it: experts stacked as mlp.switch_mlp.{gate,up,down}_proj.weight [E,out,in],
       the MTP layer dropped from the trunk (sanitize()), unpadded header, metadata format=mlx;
       --quant BITS[:GROUP] affine-quantizes every Linear/Embedding whose input dim divides by GROUP
       (the router mlp.gate is no nn.Linear in mlx-lm and stays unquantized).
--mtp inline | sidecar | sidecar-hf | none   (default: inline for hf, none for mlx)
       sidecar: the MTP layer in model-mtp.safetensors with the layout's names (and quantization);
       sidecar-hf: the sidecar with HF names, per expert, bf16.
--shards N  split the main tensors into N files + model.safetensors.index.json (the index lists the
       main files only: a sidecar is a file dropped next to an existing checkpoint).

Examples:
  make_random_glm.py --layout hf --seed 1 --out /tmp/g1
  make_random_glm.py --layout mlx --mtp sidecar --quant 4:32 --seed 1 --out /tmp/g1q
  make_random_glm.py --layout hf --agree 0.05 --seed 3 --out /tmp/g3      (a head whose drafts are accepted)
  make_random_glm.py --layout hf --preset air --n-group 4 --topk-group 2 --experts 12 --mtp-head own --out /tmp/g2
"""
import argparse
import json
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "..", "tools", "train"))
from make_random_ckpt import Writer, parse_q, rng_for  # noqa: E402  (file writer, seeding)
from safetensors_io import f32_to_bf16, quantize  # noqa: E402

PRESETS = {
    "odd": dict(vocab=419, hidden=160, layers=4, heads=6, kv_heads=2, head_dim=32, inter=224,
                experts=8, topk=3, expert_dim=96, first_dense=2, shared=1, scaling=2.5,
                n_group=1, topk_group=1, qk_norm=1, attn_bias=1, partial_rotary=0.5),
    "air": dict(vocab=419, hidden=160, layers=3, heads=6, kv_heads=2, head_dim=32, inter=224,
                experts=8, topk=3, expert_dim=96, first_dense=1, shared=1, scaling=1.0,
                n_group=1, topk_group=1, qk_norm=0, attn_bias=1, partial_rotary=0.5),
    # GLM-4.5-Air's layer shapes (hidden 4096, 96 query / 8 kv heads of 128, 128 experts of 1408
    # top-8 + a shared expert, a 10944-wide dense first layer) cut to 3 layers and a 32000 vocab:
    # ~4 GB at 4-bit, larger than any cache, with matmul calls as long as the real model's.
    "bench": dict(vocab=32000, hidden=4096, layers=3, heads=96, kv_heads=8, head_dim=128, inter=10944,
                  experts=128, topk=8, expert_dim=1408, first_dense=1, shared=1, scaling=1.0,
                  n_group=1, topk_group=1, qk_norm=0, attn_bias=1, partial_rotary=0.5),
}


def value(seed, name, shape, kind):
    r = rng_for(seed, name)
    if kind == "norm":
        return (1.0 + 0.2 * r.standard_normal(shape, dtype=np.float32)).astype(np.float32)
    if kind == "embed":
        return r.standard_normal(shape, dtype=np.float32)
    if kind == "abias":      # attention q/k/v biases: comparable to the projections themselves
        return (0.3 * r.standard_normal(shape, dtype=np.float32)).astype(np.float32)
    if kind == "corr":       # e_score_correction_bias, see the module docstring
        return (0.3 * r.random(shape, dtype=np.float32)).astype(np.float32)
    if kind == "head":       # logits ~ N(0, 2.5^2) for a unit-RMS hidden
        return r.standard_normal(shape, dtype=np.float32) * np.float32(2.5 / np.sqrt(shape[-1]))
    if kind == "router":
        return r.standard_normal(shape, dtype=np.float32) * np.float32(2.0 / np.sqrt(shape[-1]))
    std = 1.0 / np.sqrt(shape[-1])
    if kind == "out":        # residual outputs damped so depth does not blow up
        std *= 0.7
    return r.standard_normal(shape, dtype=np.float32) * np.float32(std)


def weight(a, name, shape, kind):
    """value(), or with --agree A the head-agreeing variant: every residual output (o_proj,
    down_proj) scaled by A, so the residual stream stays near the token's embedding and the trunk
    predicts from the current token much as a bigram table would; the MTP layer's eh_proj passes
    the embedding half through (identity, plus A x random on the hidden half), enorm is 1 and
    shared_head.norm equals model.norm, so the head predicts from the embedding of t+1 what the
    trunk predicts at t+1, up to the A-sized contributions of attention, experts and hidden."""
    mtp = f"model.layers.{a.layers}."
    if a.agree and name == mtp + "enorm.weight":
        return np.ones(shape, np.float32)
    if a.agree and name == mtp + "shared_head.norm.weight":
        return value(a.seed, "model.norm.weight", shape, kind)
    w = value(a.seed, name, shape, kind)
    if a.agree and name == mtp + "eh_proj.weight":
        w *= np.float32(a.agree)
        w[:, :a.hidden] += np.eye(a.hidden, dtype=np.float32)
    elif a.agree and kind == "out":
        w *= np.float32(a.agree)
    return w


def bf16_round(w):
    """w as read from a bf16 checkpoint."""
    return (f32_to_bf16(w).astype(np.uint32) << 16).view(np.float32)


def layer_specs(a, p, dense):
    qd, kd = a.heads * a.head_dim, a.kv_heads * a.head_dim
    s = [(p + "input_layernorm.weight", (a.hidden,), "norm"),
         (p + "post_attention_layernorm.weight", (a.hidden,), "norm"),
         (p + "self_attn.q_proj.weight", (qd, a.hidden), "lin"),
         (p + "self_attn.k_proj.weight", (kd, a.hidden), "lin"),
         (p + "self_attn.v_proj.weight", (kd, a.hidden), "lin"),
         (p + "self_attn.o_proj.weight", (a.hidden, qd), "out")]
    if a.attn_bias:
        s += [(p + "self_attn.q_proj.bias", (qd,), "abias"), (p + "self_attn.k_proj.bias", (kd,), "abias"),
              (p + "self_attn.v_proj.bias", (kd,), "abias")]
    if a.qk_norm:
        s += [(p + "self_attn.q_norm.weight", (a.head_dim,), "norm"),
              (p + "self_attn.k_norm.weight", (a.head_dim,), "norm")]
    return s + mlp_specs(a, p, dense)


def mlp_specs(a, p, dense):
    """A layer's MLP: dense SwiGLU, or the router with its correction bias, stacked experts
    [E, out, in] and the shared experts (GLM and DeepSeek names)."""
    if dense:
        return [(p + "mlp.gate_proj.weight", (a.inter, a.hidden), "lin"),
                (p + "mlp.up_proj.weight", (a.inter, a.hidden), "lin"),
                (p + "mlp.down_proj.weight", (a.hidden, a.inter), "out")]
    E = a.experts
    s = [(p + "mlp.gate.weight", (E, a.hidden), "router"),
         (p + "mlp.gate.e_score_correction_bias", (E,), "corr"),
         (p + "mlp.experts.gate_proj.weight", (E, a.expert_dim, a.hidden), "lin"),   # stacked
         (p + "mlp.experts.up_proj.weight", (E, a.expert_dim, a.hidden), "lin"),
         (p + "mlp.experts.down_proj.weight", (E, a.hidden, a.expert_dim), "out")]
    if a.shared:
        sd = a.expert_dim * a.shared
        s += [(p + "mlp.shared_experts.gate_proj.weight", (sd, a.hidden), "lin"),
              (p + "mlp.shared_experts.up_proj.weight", (sd, a.hidden), "lin"),
              (p + "mlp.shared_experts.down_proj.weight", (a.hidden, sd), "out")]
    return s


def canonical_specs(a, layer_specs=layer_specs):
    """(trunk specs, MTP specs) as (HF name with stacked experts, shape, kind); layer_specs(a,
    prefix, dense) gives a decoder layer's (the MTP layer is MoE)."""
    t = [("model.embed_tokens.weight", (a.vocab, a.hidden), "embed")]
    for L in range(a.layers):
        t += layer_specs(a, f"model.layers.{L}.", L < a.first_dense)
    t += [("model.norm.weight", (a.hidden,), "norm"), ("lm_head.weight", (a.vocab, a.hidden), "head")]
    p = f"model.layers.{a.layers}."
    m = [(p + "enorm.weight", (a.hidden,), "norm"), (p + "hnorm.weight", (a.hidden,), "norm"),
         (p + "eh_proj.weight", (a.hidden, 2 * a.hidden), "lin")]
    if a.mtp_head == "own":
        m += [(p + "embed_tokens.weight", (a.vocab, a.hidden), "embed")]
    m += layer_specs(a, p, False)
    m += [(p + "shared_head.norm.weight", (a.hidden,), "norm")]
    if a.mtp_head == "own":
        m += [(p + "shared_head.head.weight", (a.vocab, a.hidden), "head")]
    return t, m


def entries_for(a, specs, names, qcfg, qover):
    """(name, dtype, shape, produce) for one file; names: 'hf' (per expert) or 'mlx' (switch_mlp)."""
    cache = {}

    def val(name, shape, kind):
        if name not in cache:
            cache.clear()                     # keep at most one stacked tensor alive
            cache[name] = weight(a, name, shape, kind)
        return cache[name]

    out = []
    for name, shape, kind in specs:
        dt = "F32" if kind == "corr" else "BF16"
        if names == "hf":
            if ".mlp.experts." in name:
                pfx, which = name.split(".mlp.experts.")
                for e in range(shape[0]):
                    out.append((f"{pfx}.mlp.experts.{e}.{which}", dt, shape[1:],
                                lambda n=name, s=shape, k=kind, e=e: val(n, s, k)[e]))
            else:
                out.append((name, dt, shape, lambda n=name, s=shape, k=kind: val(n, s, k)))
            continue
        mname = name.replace(".mlp.experts.", ".mlp.switch_mlp.")
        quant = qcfg is not None and kind in ("lin", "out", "embed", "head") and shape[-1] % qcfg[1] == 0
        if not quant:
            out.append((mname, dt, shape, lambda n=name, s=shape, k=kind: val(n, s, k)))
            continue
        out += quant_entries(mname, shape, lambda n=name, s=shape, k=kind: val(n, s, k), qcfg, cache)
    return out


def quant_entries(mname, shape, produce, qcfg, cache):
    """The packed weight, scales and biases of MLX affine quantization of produce() (stacked
    [n, out, in] quantized per matrix: the groups are independent, and a stacked tensor at full
    size would need several times its f32 size in temporaries); the result is kept in cache,
    alone, until the three entries are written."""
    bits, gs = qcfg
    mod = mname[:-len(".weight")]

    def qz():
        key = ("q", mname)
        if key not in cache:
            w = produce()
            parts = [quantize(bf16_round(x), bits, gs) for x in (w if w.ndim == 3 else [w])]
            r = tuple(np.stack([p[i] for p in parts]) if w.ndim == 3 else parts[0][i] for i in range(3))
            cache.clear()
            cache[key] = r
        return cache[key]
    sshape = tuple(shape[:-1]) + (shape[-1] // gs,)
    return [(mname, "U32", tuple(shape[:-1]) + (shape[-1] * bits // 32,), lambda: qz()[0]),
            (mod + ".scales", "BF16", sshape, lambda: qz()[1]),
            (mod + ".biases", "BF16", sshape, lambda: qz()[2])]


def config_json(a, qcfg):
    cfg = {
        "architectures": ["Glm4MoeForCausalLM"],
        "attention_bias": bool(a.attn_bias),
        "attention_dropout": 0.0,
        "pad_token_id": 0,
        "eos_token_id": [2, 3],
        "head_dim": a.head_dim,
        "hidden_act": "silu",
        "hidden_size": a.hidden,
        "partial_rotary_factor": a.partial_rotary,
        "initializer_range": 0.02,
        "intermediate_size": a.inter,
        "max_position_embeddings": 4096,
        "model_type": "glm4_moe",
        "moe_intermediate_size": a.expert_dim,
        "norm_topk_prob": True,
        "num_attention_heads": a.heads,
        "n_group": a.n_group,
        "topk_group": a.topk_group,
        "n_routed_experts": a.experts,
        "n_shared_experts": a.shared,
        "routed_scaling_factor": a.scaling,
        "num_experts_per_tok": a.topk,
        "first_k_dense_replace": a.first_dense,
        "num_hidden_layers": a.layers,
        "num_key_value_heads": a.kv_heads,
        "rms_norm_eps": 1e-05,
        "rope_scaling": None,
        "rope_theta": a.rope_theta,
        "num_nextn_predict_layers": 1,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "transformers_version": "4.54.0",
        "use_cache": True,
        "use_qk_norm": bool(a.qk_norm),
        "vocab_size": a.vocab,
    }
    if qcfg:
        q = {"group_size": qcfg[1], "bits": qcfg[0], "mode": "affine"}
        cfg["quantization"] = q
        cfg["quantization_config"] = dict(q)
    return cfg


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--layout", choices=("hf", "mlx"), default="hf")
    ap.add_argument("--mtp", choices=("inline", "sidecar", "sidecar-hf", "none"))
    ap.add_argument("--mtp-head", choices=("shared", "own"), default="shared",
                    help="own: the MTP layer carries embed_tokens + shared_head.head (GLM-4.5)")
    ap.add_argument("--quant", help="BITS[:GROUP] MLX affine quantization (mlx layout), bits 2/3/4/5/6/8")
    ap.add_argument("--shards", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", required=True)
    ap.add_argument("--preset", choices=tuple(PRESETS), default="odd")
    for k in ("vocab", "hidden", "layers", "heads", "kv_heads", "head_dim", "inter", "experts", "topk",
              "expert_dim", "first_dense", "shared", "n_group", "topk_group", "qk_norm", "attn_bias"):
        ap.add_argument("--" + k.replace("_", "-"), type=int)
    ap.add_argument("--scaling", type=float)
    ap.add_argument("--partial-rotary", type=float)
    ap.add_argument("--rope-theta", type=float, default=10000.0)
    ap.add_argument("--agree", type=float, default=0.0,
                    help="A > 0: an MTP head that mostly agrees with its trunk (see weight())")
    a = ap.parse_args()
    for k, v in PRESETS[a.preset].items():
        if getattr(a, k, None) is None:
            setattr(a, k, v)
    if a.mtp is None:
        a.mtp = "inline" if a.layout == "hf" else "none"
    qcfg = parse_q(a.quant)
    if qcfg and a.layout != "mlx":
        ap.error("--quant needs --layout mlx")
    if qcfg and qcfg[0] not in (2, 3, 4, 5, 6, 8):
        ap.error("--quant bits must be 2, 3, 4, 5, 6 or 8")
    if a.heads % a.kv_heads or a.experts % a.n_group or a.experts // a.n_group < 2 \
            or a.topk_group > a.n_group or a.topk > a.experts // a.n_group * a.topk_group:
        ap.error("inconsistent heads/kv-heads or experts/n-group/topk-group/topk")
    rd = int(a.head_dim * a.partial_rotary)
    if rd % 2 or rd <= 0:
        ap.error("head_dim * partial_rotary_factor must be a positive even number")
    os.makedirs(a.out, exist_ok=True)
    for f in os.listdir(a.out):
        if f.startswith("model") and (f.endswith(".safetensors") or f.endswith(".json")):
            os.remove(os.path.join(a.out, f))
    trunk, mtp = canonical_specs(a)
    align, meta = (8, {"format": "pt"}) if a.layout == "hf" else (1, {"format": "mlx"})
    main_specs = trunk + (mtp if a.mtp == "inline" else [])
    files = []     # (file name, specs, names, quant)
    if a.shards > 1:
        per = -(-len(main_specs) // a.shards)
        for i in range(a.shards):
            files.append((f"model-{i + 1:05d}-of-{a.shards:05d}.safetensors",
                          main_specs[i * per:(i + 1) * per], a.layout, qcfg))
    else:
        files.append(("model.safetensors", main_specs, a.layout, qcfg))
    if a.mtp == "sidecar":
        files.append(("model-mtp.safetensors", mtp, a.layout, qcfg))
    elif a.mtp == "sidecar-hf":
        files.append(("model-mtp.safetensors", mtp, "hf", None))
    weight_map, total, qover = {}, 0, {}
    for fn, specs, names, q in files:
        entries = entries_for(a, specs, names, q, qover)
        total += Writer(os.path.join(a.out, fn), entries, align, meta).write()
        if fn != "model-mtp.safetensors":
            weight_map.update({e[0]: fn for e in entries})
    if a.shards > 1:
        with open(os.path.join(a.out, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=1)
    with open(os.path.join(a.out, "config.json"), "w") as f:
        json.dump(config_json(a, qcfg), f, indent=2)
    print(f"{a.out}: {total / 1e6:.1f} MB in {len(files)} file(s)", file=sys.stderr)


if __name__ == "__main__":
    main()
