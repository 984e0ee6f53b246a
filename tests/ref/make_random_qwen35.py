#!/usr/bin/python3
"""Generate small RANDOM Gated-DeltaNet hybrid MoE checkpoints with their MTP head, for engine tests:
Qwen3.5 / Qwen3.6 MoE (--family qwen3_5_moe) or Qwen3-Next (--family qwen3_next).

Deterministic by --seed with make_random_glm.py's scheme: every tensor comes from its own generator
seeded by (seed, canonical tensor name), so one seed and shape gives the same weights in the HF and
the MLX layout, sharded or not, with the head inline or in a sidecar (quantization aside).

Canonical names are Qwen3-Next's flat HF names with Qwen3.5's split DeltaNet projections
(in_proj_qkv, in_proj_z, in_proj_b, in_proj_a) and experts stacked [E, out, in]; each layout
writes them the way its real checkpoints do:
  qwen3_5_moe hf   config.json is the VL wrapper (text_config holds the LM keys); tensors under
                   model.language_model. (lm_head.weight at the top); trunk experts fused as
                   mlp.experts.gate_up_proj [E, 2F, H] (gate rows first) + mlp.experts.down_proj
                   [E, H, F] (no .weight suffix, transformers' Qwen3_5MoeExperts); the MTP head at
                   mtp.* with per-expert mtp.layers.0.mlp.experts.E.*.
  qwen3_next  hf   flat config.json, model.layers.L., per-expert experts, fused
                   linear_attn.in_proj_qkvz (per key head: q | k | v of its value heads | z) and
                   in_proj_ba (per key head: b | a), as transformers' fix_query_key_value_ordering
                   reads them; MTP at mtp.*, per expert.
  mlx              as mlx-lm's sanitize() leaves them: language_model.model.* / language_model.lm_head
                   (qwen3_5_moe) or model.* (qwen3_next), experts stacked as mlp.switch_mlp.*,
                   conv1d.weight [C, K, 1] instead of [C, 1, K], the zero-centred RMSNorms stored with
                   their +1 folded in (every *norm.weight except linear_attn.norm), the MTP head
                   dropped; --quant BITS[:GROUP] affine-quantizes every Linear / Embedding whose input
                   dimension divides by GROUP, the routers (mlp.gate, mlp.shared_expert_gate) at 8 bits
                   group 64 as mlx-lm's quant_predicate does (left bf16 when the input does not divide
                   by 64), with per-module overrides in config.json "quantization".
--mtp inline | sidecar | sidecar-hf | none   (default: inline for hf, none for mlx)
       sidecar: model-mtp.safetensors with mtp.* names in the layout's form (MLX: switch_mlp,
       folded norms, quantized like the trunk); sidecar-hf: HF names, per expert, bf16, raw norms.

Zero-centred norm weights w are drawn on a 1/128 grid in [-0.5, 0.5], so w and 1 + w are both exact
in bf16 and the folded MLX norm is bit for bit the HF one.  A_log is stored in float32
(mamba_ssm_dtype), exp(A_log) in [0.02, 1): decays exp(g) spread over (0, 1), not all ~0.

Defaults (--preset odd): hidden 160, 4 layers (qwen3_5_moe: full attention every 2nd layer via
layer_types; qwen3_next: every 4th via full_attention_interval), DeltaNet 2 key / 4 value heads of
24 / 32 dims, conv kernel 4, attention 6 / 2 heads of 32 with partial rotary 0.25 (8 dims), 8
experts top-3 of 96 + a 128-wide shared expert, vocab 419.
--preset bench: Qwen3.6-35B-A3B's layer shapes (hidden 2048, 256 experts top-8 of 512 + shared 512,
DeltaNet 16 / 32 heads of 128, attention 16 / 2 heads of 256), 4 layers (3 DeltaNet + 1 full),
vocab cut to 32000, max_position_embeddings 262144; use --layout mlx --quant 4:64.
--preset qwen36: the whole Qwen3.6-35B-A3B shape (40 layers, vocab 248320): ~20 GB at --quant 4:64.

Examples:
  make_random_qwen35.py --family qwen3_5_moe --layout hf --seed 1 --out /tmp/q1
  make_random_qwen35.py --family qwen3_next --layout mlx --mtp sidecar --quant 4:32 --seed 1 --out /tmp/n1q
  make_random_qwen35.py --family qwen3_5_moe --layout hf --agree 0.05 --seed 3 --out /tmp/q3   (accepted drafts)
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
from make_random_glm import quant_entries, value  # noqa: E402  (MLX affine entries, value kinds)

PRESETS = {
    "odd": dict(vocab=419, hidden=160, layers=4, heads=6, kv_heads=2, head_dim=32, partial_rotary=0.25,
                lin_k_heads=2, lin_v_heads=4, lin_k_dim=24, lin_v_dim=32, conv=4, experts=8, topk=3,
                expert_dim=96, shared_dim=128, max_pos=4096),
    "bench": dict(vocab=32000, hidden=2048, layers=4, heads=16, kv_heads=2, head_dim=256, partial_rotary=0.25,
                  lin_k_heads=16, lin_v_heads=32, lin_k_dim=128, lin_v_dim=128, conv=4, experts=256, topk=8,
                  expert_dim=512, shared_dim=512, max_pos=262144, interval=4),
}
# Qwen3.6-35B-A3B whole: 40 layers (30 DeltaNet + 10 full) and its vocab (~20 GB at --quant 4:64)
PRESETS["qwen36"] = dict(PRESETS["bench"], vocab=248320, layers=40)
FAMILY = {
    "qwen3_5_moe": dict(interval=2, arch="Qwen3_5MoeForConditionalGeneration"),
    "qwen3_next": dict(interval=4, arch="Qwen3NextForCausalLM"),
}
QUANT_KINDS = ("lin", "out", "embed", "head")
ROUTER_Q = (8, 64)          # mlx-lm quant_predicate for mlp.gate / shared_expert_gate


def is_full(a, L):
    return (L + 1) % a.interval == 0


def qvalue(a, name, shape, kind):
    """value() of make_random_glm.py plus the kinds of this family."""
    r = rng_for(a.seed, name)
    if kind == "znorm":      # zero-centred RMSNorm weight (applied as 1 + w), exact in bf16 with or without +1
        return np.clip(np.round(0.2 * r.standard_normal(shape) * 128) / 128, -0.5, 0.5).astype(np.float32)
    if kind == "alog":
        return np.log(r.uniform(0.02, 1.0, shape)).astype(np.float32)
    if kind == "dt":
        return (0.5 * r.standard_normal(shape)).astype(np.float32)
    if kind == "conv":
        return (0.5 * r.standard_normal(shape)).astype(np.float32)
    if kind == "sgate":
        return r.standard_normal(shape, dtype=np.float32) * np.float32(1.0 / np.sqrt(shape[-1]))
    return value(a.seed, name, shape, kind)


def weight(a, name, shape, kind):
    """qvalue(), or with --agree A the head-agreeing variant (make_random_glm.py weight()'s idea):
    every residual output (o_proj, out_proj, down_proj) scaled by A so the residual stream stays near
    the token's embedding; mtp.fc passes the normed embedding through (identity on its first half,
    plus A x random), pre_fc_norm_embedding is 1 (w = 0) and mtp.norm equals model.norm, so the head
    predicts from t+1's embedding what the trunk predicts at t+1."""
    if a.agree and name == "mtp.pre_fc_norm_embedding.weight":
        return np.zeros(shape, np.float32)
    if a.agree and name == "mtp.norm.weight":
        return qvalue(a, "model.norm.weight", shape, kind)
    w = qvalue(a, name, shape, kind)
    if a.agree and name == "mtp.fc.weight":
        w *= np.float32(a.agree)
        w[:, :a.hidden] += np.eye(a.hidden, dtype=np.float32)
    elif a.agree and kind == "out":
        w *= np.float32(a.agree)
    return w


def moe_specs(a, p):
    E, F, S = a.experts, a.expert_dim, a.shared_dim
    return [(p + "mlp.gate.weight", (E, a.hidden), "router"),
            (p + "mlp.experts.gate_proj.weight", (E, F, a.hidden), "lin"),     # stacked
            (p + "mlp.experts.up_proj.weight", (E, F, a.hidden), "lin"),
            (p + "mlp.experts.down_proj.weight", (E, a.hidden, F), "out"),
            (p + "mlp.shared_expert.gate_proj.weight", (S, a.hidden), "lin"),
            (p + "mlp.shared_expert.up_proj.weight", (S, a.hidden), "lin"),
            (p + "mlp.shared_expert.down_proj.weight", (a.hidden, S), "out"),
            (p + "mlp.shared_expert_gate.weight", (1, a.hidden), "sgate")]


def attn_specs(a, p):
    H, KV, D = a.heads, a.kv_heads, a.head_dim
    at = p + "self_attn."
    return [(at + "q_proj.weight", (2 * H * D, a.hidden), "lin"),     # per head: query | gate
            (at + "k_proj.weight", (KV * D, a.hidden), "lin"),
            (at + "v_proj.weight", (KV * D, a.hidden), "lin"),
            (at + "o_proj.weight", (a.hidden, H * D), "out"),
            (at + "q_norm.weight", (D,), "znorm"),
            (at + "k_norm.weight", (D,), "znorm")]


def linear_specs(a, p):
    kd, vd, Hv = a.lin_k_heads * a.lin_k_dim, a.lin_v_heads * a.lin_v_dim, a.lin_v_heads
    la = p + "linear_attn."
    return [(la + "in_proj_qkv.weight", (2 * kd + vd, a.hidden), "lin"),
            (la + "in_proj_z.weight", (vd, a.hidden), "lin"),
            (la + "in_proj_b.weight", (Hv, a.hidden), "lin"),
            (la + "in_proj_a.weight", (Hv, a.hidden), "lin"),
            (la + "conv1d.weight", (2 * kd + vd, a.conv), "conv"),            # canonical [C, K]
            (la + "dt_bias", (Hv,), "dt"),
            (la + "A_log", (Hv,), "alog"),
            (la + "norm.weight", (a.lin_v_dim,), "norm"),                   # plain w, not 1 + w
            (la + "out_proj.weight", (a.hidden, vd), "out")]


def layer_specs(a, p, full):
    return ([(p + "input_layernorm.weight", (a.hidden,), "znorm"),
             (p + "post_attention_layernorm.weight", (a.hidden,), "znorm")]
            + (attn_specs(a, p) if full else linear_specs(a, p)) + moe_specs(a, p))


def canonical_specs(a):
    t = [("model.embed_tokens.weight", (a.vocab, a.hidden), "embed")]
    for L in range(a.layers):
        t += layer_specs(a, f"model.layers.{L}.", is_full(a, L))
    t += [("model.norm.weight", (a.hidden,), "znorm"), ("lm_head.weight", (a.vocab, a.hidden), "head")]
    m = [("mtp.fc.weight", (a.hidden, 2 * a.hidden), "lin"),
         ("mtp.pre_fc_norm_embedding.weight", (a.hidden,), "znorm"),
         ("mtp.pre_fc_norm_hidden.weight", (a.hidden,), "znorm")]
    m += layer_specs(a, "mtp.layers.0.", True)
    m += [("mtp.norm.weight", (a.hidden,), "znorm")]
    return t, m


def fuse_qkvz(a, qkv, z):
    """Qwen3-Next's in_proj_qkvz rows: per key head, its q, k, the v rows of its value heads, their z."""
    nk, dk, dv, r = a.lin_k_heads, a.lin_k_dim, a.lin_v_dim, a.lin_v_heads // a.lin_k_heads
    kd = nk * dk
    q, k, v = qkv[:kd], qkv[kd:2 * kd], qkv[2 * kd:]
    parts = []
    for h in range(nk):
        parts += [q[h * dk:(h + 1) * dk], k[h * dk:(h + 1) * dk], v[h * r * dv:(h + 1) * r * dv],
                  z[h * r * dv:(h + 1) * r * dv]]
    return np.concatenate(parts)


def fuse_ba(a, b, av):
    nk, r = a.lin_k_heads, a.lin_v_heads // a.lin_k_heads
    return np.concatenate([x for h in range(nk) for x in (b[h * r:(h + 1) * r], av[h * r:(h + 1) * r])])


def rename(a, name, names):
    """The file name of canonical name in layout names ('hf' or 'mlx')."""
    if names == "mlx":
        name = name.replace(".mlp.experts.", ".mlp.switch_mlp.")
    if a.family == "qwen3_5_moe" and not name.startswith("mtp."):
        if names == "hf":
            name = name.replace("model.", "model.language_model.", 1) if name.startswith("model.") else name
        else:
            name = "language_model." + name
    return name


def file_specs(a, specs, names):
    """(file name, shape, kind, produce) in the layout's form; produce() gives float32 values."""
    cache = {}

    def val(name, shape, kind):
        if name not in cache:
            cache.clear()                     # at most one stacked tensor alive
            cache[name] = weight(a, name, shape, kind)
        return cache[name]

    out, fold = [], names == "mlx"
    byname = {n: (s, k) for n, s, k in specs}
    for name, shape, kind in specs:
        fn = rename(a, name, names)
        prod = (lambda n=name, s=shape, k=kind: val(n, s, k))
        if kind == "znorm" and fold:
            out.append((fn, shape, "norm", lambda p=prod: p() + np.float32(1.0)))
        elif name.endswith("conv1d.weight"):
            shp = (shape[0], 1, shape[1]) if names == "hf" else (shape[0], shape[1], 1)
            out.append((fn, shp, kind, lambda p=prod, shp=shp: p().reshape(shp)))
        elif a.family == "qwen3_next" and ".linear_attn.in_proj_" in name:
            pfx = name[:name.index("in_proj_")]
            if name.endswith("in_proj_qkv.weight"):
                zs, zk = byname[pfx + "in_proj_z.weight"]
                out.append((rename(a, pfx + "in_proj_qkvz.weight", names), (shape[0] + zs[0], shape[1]), kind,
                            lambda p=prod, n=pfx + "in_proj_z.weight", zs=zs, zk=zk:
                            fuse_qkvz(a, p().copy(), weight(a, n, zs, zk))))
            elif name.endswith("in_proj_b.weight"):
                out.append((rename(a, pfx + "in_proj_ba.weight", names), (2 * shape[0], shape[1]), kind,
                            lambda p=prod, n=pfx + "in_proj_a.weight", s=shape, k=kind:
                            fuse_ba(a, p().copy(), weight(a, n, s, k))))
        elif names == "hf" and ".mlp.experts." in name:
            pfx, which = name.split(".mlp.experts.")
            if a.family == "qwen3_5_moe" and not name.startswith("mtp."):
                pfx = rename(a, pfx, "hf")
                if which == "gate_proj.weight":
                    E, F, H = shape
                    un = name.replace("gate_proj", "up_proj")
                    out.append((pfx + ".mlp.experts.gate_up_proj", (E, 2 * F, H), kind,
                                lambda p=prod, un=un, s=shape, k=kind:
                                np.concatenate([p(), weight(a, un, s, k)], axis=1)))
                elif which == "down_proj.weight":
                    out.append((pfx + ".mlp.experts.down_proj", shape, kind, prod))
                continue
            for e in range(shape[0]):
                out.append((f"{pfx}.mlp.experts.{e}.{which}", shape[1:], kind, lambda p=prod, e=e: p()[e]))
        else:
            out.append((fn, shape, kind, prod))
    return out


def entries_for(specs, qcfg, qover):
    """Writer entries (name, dtype, shape, produce): bf16, F32 for A_log, or MLX affine; qover
    collects the per-module quantization overrides of the routers."""
    out = []
    for name, shape, kind, produce in specs:
        dt = "F32" if kind == "alog" else "BF16"
        q = None
        if qcfg and kind in QUANT_KINDS and shape[-1] % qcfg[1] == 0:
            q = qcfg
        elif qcfg and kind in ("router", "sgate") and shape[-1] % ROUTER_Q[1] == 0:
            q = ROUTER_Q
            qover[name[:-len(".weight")]] = {"group_size": ROUTER_Q[1], "bits": ROUTER_Q[0]}
        if q is None:
            out.append((name, dt, shape, produce))
        else:
            out += quant_entries(name, shape, produce, q, {})
    return out


def text_config(a):
    layer_types = ["full_attention" if is_full(a, L) else "linear_attention" for L in range(a.layers)]
    c = {
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": None,
        "eos_token_id": 2,
        "pad_token_id": None,
        "full_attention_interval": a.interval,
        "head_dim": a.head_dim,
        "hidden_act": "silu",
        "hidden_size": a.hidden,
        "initializer_range": 0.02,
        "linear_conv_kernel_dim": a.conv,
        "linear_key_head_dim": a.lin_k_dim,
        "linear_num_key_heads": a.lin_k_heads,
        "linear_num_value_heads": a.lin_v_heads,
        "linear_value_head_dim": a.lin_v_dim,
        "max_position_embeddings": a.max_pos,
        "moe_intermediate_size": a.expert_dim,
        "num_attention_heads": a.heads,
        "num_experts": a.experts,
        "num_experts_per_tok": a.topk,
        "num_hidden_layers": a.layers,
        "num_key_value_heads": a.kv_heads,
        "rms_norm_eps": 1e-06,
        "shared_expert_intermediate_size": a.shared_dim,
        "vocab_size": a.vocab,
    }
    if a.family == "qwen3_5_moe":
        c.update({"model_type": "qwen3_5_moe_text", "attn_output_gate": True, "layer_types": layer_types,
                  "mamba_ssm_dtype": "float32", "mtp_num_hidden_layers": 1, "mtp_use_dedicated_embeddings": False,
                  "output_router_logits": False, "router_aux_loss_coef": 0.001, "dtype": "bfloat16",
                  "rope_parameters": {"mrope_interleaved": True, "mrope_section": [11, 11, 10],
                                      "rope_type": "default", "rope_theta": 10000000,
                                      "partial_rotary_factor": a.partial_rotary}})
    else:
        c.update({"model_type": "qwen3_next", "architectures": ["Qwen3NextForCausalLM"],
                  "decoder_sparse_step": 1, "mlp_only_layers": [], "norm_topk_prob": True,
                  "intermediate_size": 4 * a.expert_dim, "num_nextn_predict_layers": 1,
                  "partial_rotary_factor": a.partial_rotary, "rope_scaling": None, "rope_theta": 10000000,
                  "tie_word_embeddings": False, "torch_dtype": "bfloat16", "transformers_version": "4.57.0",
                  "use_cache": True, "use_sliding_window": False, "sliding_window": None})
    return c


def config_json(a, qcfg, qover):
    if a.family == "qwen3_5_moe":
        cfg = {"architectures": ["Qwen3_5MoeForConditionalGeneration"], "model_type": "qwen3_5_moe",
               "image_token_id": 248056, "video_token_id": 248057, "vision_start_token_id": 248053,
               "vision_end_token_id": 248054, "tie_word_embeddings": False, "transformers_version": "4.57.0",
               "text_config": text_config(a),
               "vision_config": {"model_type": "qwen3_5_moe", "depth": 27, "hidden_size": 1152,
                                 "out_hidden_size": a.hidden, "num_heads": 16, "patch_size": 16,
                                 "spatial_merge_size": 2, "temporal_patch_size": 2, "in_channels": 3,
                                 "intermediate_size": 4304, "hidden_act": "gelu_pytorch_tanh",
                                 "num_position_embeddings": 2304, "deepstack_visual_indexes": []}}
    else:
        cfg = text_config(a)
    if qcfg:
        q = {"group_size": qcfg[1], "bits": qcfg[0], "mode": "affine", **qover}
        cfg["quantization"] = q
        cfg["quantization_config"] = dict(q)
    return cfg


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--family", choices=tuple(FAMILY), default="qwen3_5_moe")
    ap.add_argument("--layout", choices=("hf", "mlx"), default="hf")
    ap.add_argument("--mtp", choices=("inline", "sidecar", "sidecar-hf", "none"))
    ap.add_argument("--quant", help="BITS[:GROUP] MLX affine quantization (mlx layout), bits 2/3/4/5/6/8")
    ap.add_argument("--shards", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", required=True)
    ap.add_argument("--preset", choices=tuple(PRESETS), default="odd")
    for k in ("vocab", "hidden", "layers", "heads", "kv_heads", "head_dim", "lin_k_heads", "lin_v_heads",
              "lin_k_dim", "lin_v_dim", "conv", "experts", "topk", "expert_dim", "shared_dim", "max_pos",
              "interval"):
        ap.add_argument("--" + k.replace("_", "-"), type=int)
    ap.add_argument("--partial-rotary", type=float)
    ap.add_argument("--agree", type=float, default=0.0,
                    help="A > 0: an MTP head that mostly agrees with its trunk (see weight())")
    a = ap.parse_args()
    for k, v in PRESETS[a.preset].items():
        if getattr(a, k, None) is None:
            setattr(a, k, v)
    if a.interval is None:
        a.interval = FAMILY[a.family]["interval"]
    if a.mtp is None:
        a.mtp = "inline" if a.layout == "hf" else "none"
    qcfg = parse_q(a.quant)
    if qcfg and a.layout != "mlx":
        ap.error("--quant needs --layout mlx")
    if qcfg and qcfg[0] not in (2, 3, 4, 5, 6, 8):
        ap.error("--quant bits must be 2, 3, 4, 5, 6 or 8")
    if a.heads % a.kv_heads or a.lin_v_heads % a.lin_k_heads or a.topk > a.experts:
        ap.error("inconsistent heads/kv-heads, linear value/key heads or topk/experts")
    if a.conv < 2 or a.interval < 1 or a.interval > a.layers:
        ap.error("--conv must be >= 2 and --interval within 1..layers (a full-attention layer)")
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
    files = []
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
        entries = entries_for(file_specs(a, specs, names), q, qover)
        total += Writer(os.path.join(a.out, fn), entries, align if names == a.layout else 8,
                        meta if names == a.layout else {"format": "pt"}).write()
        if fn != "model-mtp.safetensors":
            weight_map.update({e[0]: fn for e in entries})
    if a.shards > 1:
        with open(os.path.join(a.out, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=1)
    with open(os.path.join(a.out, "config.json"), "w") as f:
        json.dump(config_json(a, qcfg, qover), f, indent=2)
    print(f"{a.out}: {total / 1e6:.1f} MB in {len(files)} file(s)", file=sys.stderr)


if __name__ == "__main__":
    main()
