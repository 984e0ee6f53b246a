#!/usr/bin/python3
"""Generate small RANDOM multi-head latent attention checkpoints with an MTP layer, for engine tests:
GLM-4.7-Flash (--family glm4_moe_lite) or DeepSeek-V3 / V3.1 (--family deepseek_v3).

Deterministic by --seed with make_random_glm.py's scheme: every tensor comes from its own generator
seeded by (seed, canonical HF tensor name), so the same seed and shape options give bit-identical
weights in the HF and the MLX layout, with or without shards, quantization aside, or a sidecar.

Defaults (--preset odd) are deliberately odd: 5 heads, hidden 160 != heads x v_head_dim (120),
q_lora_rank 48, kv_lora_rank 64, qk_nope 32 != v_head_dim 24, qk_rope 16, 8 experts top-3 of 96 + a
shared expert, vocab 419, 4 layers of which 1 (glm4_moe_lite) or 2 (deepseek_v3) dense.  The family
sets the rest as its real config does: glm4_moe_lite rms_norm_eps 1e-5, rope_theta 1e6, scaling 1.8,
no scoring_func key; deepseek_v3 rms_norm_eps 1e-6, rope_theta 1e4, scaling 2.5.
--preset flash-bench: GLM-4.7-Flash's layer shapes (hidden 2048, 20 heads, q_lora 768, kv_lora 512,
nope 192, rope 64, v 256, 64 experts top-4 of 1536 + 1 shared, a 10240-wide dense first layer), 4
layers and a 32000 vocab, for a memory-bound benchmark (use --layout mlx --quant 4:64).
--preset flash: the whole GLM-4.7-Flash shape (47 layers, vocab 154880): ~17 GB at --quant 4:64.

e_score_correction_bias is drawn from [0, 0.3) (see make_random_glm.py): biased scores stay > 0, so
masking discarded groups to 0 (transformers, mlx-lm) or to -inf (vLLM) picks the same experts.

Layouts:
  hf   model.layers.L.self_attn.{q_a_proj, q_a_layernorm, q_b_proj | q_proj, kv_a_proj_with_mqa,
       kv_a_layernorm, kv_b_proj, o_proj}, mlp.experts.E.*, mlp.gate.weight,
       mlp.gate.e_score_correction_bias (F32), mlp.shared_experts.*, dense mlp.*; the MTP layer at
       model.layers.{N} (eh_proj, enorm, hnorm, shared_head.norm, + embed_tokens and shared_head.head
       with --mtp-head own, as DeepSeek ships them).  Header padded to 8, metadata format=pt.
  mlx  as mlx-lm writes it: experts stacked as mlp.switch_mlp.*, kv_b_proj replaced by
       self_attn.embed_q.weight [heads, kv_lora, nope] (its key half, transposed per head) and
       self_attn.unembed_out.weight [heads, v, kv_lora] (its value half), the MTP layer dropped;
       --quant BITS[:GROUP] affine-quantizes every Linear, Embedding and embed_q / unembed_out whose
       input (last) dimension divides by GROUP (mlx-lm's predicate); the router stays unquantized.
--mtp inline | sidecar | sidecar-hf | none   (default: inline for hf, none for mlx)
--q-lora-rank 0 writes q_lora_rank null and a plain q_proj.
--yarn F (> 1) writes DeepSeek's rope_scaling (type yarn, factor F, beta_fast 32, beta_slow 1, mscale,
       mscale_all_dim, original_max_position_embeddings --yarn-orig, default 64 so that the frequency
       ramp falls inside the rope dimensions used at short test positions).

Examples:
  make_random_mla.py --family deepseek_v3 --layout hf --n-group 4 --topk-group 2 --yarn 40 --out /tmp/d1
  make_random_mla.py --family glm4_moe_lite --layout mlx --mtp sidecar --quant 4:32 --out /tmp/g1q
  make_random_mla.py --family glm4_moe_lite --layout mlx --quant 4:64 --preset flash-bench --mtp sidecar --out /tmp/fb
"""
import argparse
import json
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "..", "tools", "train"))
from make_random_ckpt import Writer, parse_q  # noqa: E402  (file writer)
from make_random_glm import canonical_specs as glm_specs, mlp_specs, quant_entries, weight  # noqa: E402

PRESETS = {
    "odd": dict(vocab=419, hidden=160, layers=4, heads=5, q_lora_rank=48, kv_lora_rank=64, nope=32, rope=16,
                v_dim=24, inter=224, experts=8, topk=3, expert_dim=96, shared=1, n_group=1, topk_group=1,
                max_pos=4096),
    "flash-bench": dict(vocab=32000, hidden=2048, layers=4, heads=20, q_lora_rank=768, kv_lora_rank=512, nope=192,
                        rope=64, v_dim=256, inter=10240, experts=64, topk=4, expert_dim=1536, shared=1, n_group=1,
                        topk_group=1, first_dense=1, max_pos=202752),  # GLM-4.7-Flash's context
}
# GLM-4.7-Flash whole: 47 layers and its vocab (~17 GB at --quant 4:64), for the 24 GB-machine check
PRESETS["flash"] = dict(PRESETS["flash-bench"], vocab=154880, layers=47)
FAMILY = {
    "glm4_moe_lite": dict(first_dense=1, scaling=1.8, eps=1e-5, rope_theta=1e6, arch="Glm4MoeLiteForCausalLM"),
    "deepseek_v3": dict(first_dense=2, scaling=2.5, eps=1e-6, rope_theta=1e4, arch="DeepseekV3ForCausalLM"),
}


def layer_specs(a, p, dense):
    """(canonical name, shape, kind) of one decoder layer; experts stacked [E, out, in]."""
    H, qd = a.heads, a.nope + a.rope
    at = p + "self_attn."
    s = [(p + "input_layernorm.weight", (a.hidden,), "norm"),
         (p + "post_attention_layernorm.weight", (a.hidden,), "norm")]
    if a.q_lora_rank:
        s += [(at + "q_a_proj.weight", (a.q_lora_rank, a.hidden), "lin"),
              (at + "q_a_layernorm.weight", (a.q_lora_rank,), "norm"),
              (at + "q_b_proj.weight", (H * qd, a.q_lora_rank), "lin")]
    else:
        s += [(at + "q_proj.weight", (H * qd, a.hidden), "lin")]
    s += [(at + "kv_a_proj_with_mqa.weight", (a.kv_lora_rank + a.rope, a.hidden), "lin"),
          (at + "kv_a_layernorm.weight", (a.kv_lora_rank,), "norm"),
          (at + "kv_b_proj.weight", (H * (a.nope + a.v_dim), a.kv_lora_rank), "lin"),
          (at + "o_proj.weight", (a.hidden, H * a.v_dim), "out")]
    return s + mlp_specs(a, p, dense)


def canonical_specs(a):
    """(trunk specs, MTP specs), GLM's with the latent-attention layers."""
    return glm_specs(a, layer_specs)


def file_specs(a, specs, names):
    """(file name, shape, kind, produce) with the layout's names; produce() gives float32 values."""
    cache = {}

    def val(name, shape, kind):
        if name not in cache:
            cache.clear()                     # at most one stacked tensor alive
            cache[name] = weight(a, name, shape, kind)
        return cache[name]

    H, dn, dv, r = a.heads, a.nope, a.v_dim, a.kv_lora_rank
    out = []
    for name, shape, kind in specs:
        if names == "hf" and ".mlp.experts." in name:
            pfx, which = name.split(".mlp.experts.")
            for e in range(shape[0]):
                out.append((f"{pfx}.mlp.experts.{e}.{which}", shape[1:], kind,
                            lambda n=name, s=shape, k=kind, e=e: val(n, s, k)[e]))
        elif names == "mlx" and name.endswith("self_attn.kv_b_proj.weight"):
            pfx = name[:-len("kv_b_proj.weight")]

            def half(n=name, s=shape, k=kind, key=True):
                w = val(n, s, k).reshape(H, dn + dv, r)
                return np.ascontiguousarray(w[:, :dn, :].transpose(0, 2, 1) if key else w[:, dn:, :])
            out.append((pfx + "embed_q.weight", (H, r, dn), kind, half))
            out.append((pfx + "unembed_out.weight", (H, dv, r), kind, lambda half=half: half(key=False)))
        else:
            mname = name.replace(".mlp.experts.", ".mlp.switch_mlp.") if names == "mlx" else name
            out.append((mname, shape, kind, lambda n=name, s=shape, k=kind: val(n, s, k)))
    return out


def entries_for(specs, qcfg):
    """Writer entries (name, dtype, shape, produce): bf16, F32 for the correction bias, or MLX affine."""
    out = []
    for name, shape, kind, produce in specs:
        dt = "F32" if kind == "corr" else "BF16"
        quant = qcfg is not None and kind in ("lin", "out", "embed", "head") and shape[-1] % qcfg[1] == 0
        if not quant:
            out.append((name, dt, shape, produce))
            continue
        out += quant_entries(name, shape, produce, qcfg, {})
    return out


def config_json(a, qcfg):
    fam = FAMILY[a.family]
    cfg = {
        "architectures": [fam["arch"]],
        "model_type": a.family,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": 0,
        "eos_token_id": [2, 3],
        "pad_token_id": 0,
        "hidden_act": "silu",
        "hidden_size": a.hidden,
        "initializer_range": 0.02,
        "intermediate_size": a.inter,
        "moe_intermediate_size": a.expert_dim,
        "num_hidden_layers": a.layers,
        "num_attention_heads": a.heads,
        "num_key_value_heads": a.heads,
        "q_lora_rank": a.q_lora_rank or None,
        "kv_lora_rank": a.kv_lora_rank,
        "qk_nope_head_dim": a.nope,
        "qk_rope_head_dim": a.rope,
        "v_head_dim": a.v_dim,
        "rope_interleave": True,
        "n_routed_experts": a.experts,
        "num_experts_per_tok": a.topk,
        "n_shared_experts": a.shared,
        "first_k_dense_replace": a.first_dense,
        "moe_layer_freq": 1,
        "routed_scaling_factor": a.scaling,
        "n_group": a.n_group,
        "topk_group": a.topk_group,
        "norm_topk_prob": True,
        "topk_method": "noaux_tc",
        "num_nextn_predict_layers": 1,
        "rms_norm_eps": a.eps,
        "rope_theta": a.rope_theta,
        "max_position_embeddings": a.max_pos,
        "rope_scaling": None,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "transformers_version": "4.57.1",
        "use_cache": True,
        "vocab_size": a.vocab,
    }
    if a.family == "deepseek_v3":
        cfg["scoring_func"] = "sigmoid"       # GLM-4.7-Flash's config omits it (sigmoid implied)
        cfg["ep_size"] = 1
    else:
        cfg["partial_rotary_factor"] = 1.0
        cfg["head_dim"] = a.rope              # transformers' glm4_moe_lite maps head_dim to qk_rope_head_dim
    if a.yarn:
        cfg["rope_scaling"] = {"beta_fast": 32, "beta_slow": 1, "factor": a.yarn, "mscale": a.mscale,
                               "mscale_all_dim": a.mscale_all_dim,
                               "original_max_position_embeddings": a.yarn_orig, "type": "yarn"}
        cfg["max_position_embeddings"] = int(a.yarn * a.yarn_orig)
    if qcfg:
        q = {"group_size": qcfg[1], "bits": qcfg[0], "mode": "affine"}
        cfg["quantization"] = q
        cfg["quantization_config"] = dict(q)
    return cfg


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--family", choices=tuple(FAMILY), default="glm4_moe_lite")
    ap.add_argument("--layout", choices=("hf", "mlx"), default="hf")
    ap.add_argument("--mtp", choices=("inline", "sidecar", "sidecar-hf", "none"))
    ap.add_argument("--mtp-head", choices=("own", "trunk"), default="trunk",
                    help="own: the MTP layer carries embed_tokens + shared_head.head (as DeepSeek ships them)")
    ap.add_argument("--quant", help="BITS[:GROUP] MLX affine quantization (mlx layout), bits 2/3/4/5/6/8")
    ap.add_argument("--shards", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", required=True)
    ap.add_argument("--preset", choices=tuple(PRESETS), default="odd")
    for k in ("vocab", "hidden", "layers", "heads", "q_lora_rank", "kv_lora_rank", "nope", "rope", "v_dim", "inter",
              "experts", "topk", "expert_dim", "first_dense", "shared", "n_group", "topk_group", "max_pos"):
        ap.add_argument("--" + k.replace("_", "-"), type=int)
    ap.add_argument("--scaling", type=float, help="routed_scaling_factor")
    ap.add_argument("--rope-theta", type=float)
    ap.add_argument("--yarn", type=float, default=0.0, help="YaRN factor (0: no rope_scaling)")
    ap.add_argument("--yarn-orig", type=int, default=64, help="original_max_position_embeddings")
    ap.add_argument("--mscale", type=float, default=1.0)
    ap.add_argument("--mscale-all-dim", type=float, default=1.0)
    ap.add_argument("--agree", type=float, default=0.0,
                    help="A > 0: an MTP head that mostly agrees with its trunk (make_random_glm.py weight())")
    a = ap.parse_args()
    fam = FAMILY[a.family]
    for k, v in PRESETS[a.preset].items():
        if getattr(a, k, None) is None:
            setattr(a, k, v)
    for k in ("first_dense", "scaling", "rope_theta"):
        if getattr(a, k, None) is None:
            setattr(a, k, fam[k])
    a.eps = fam["eps"]
    if a.mtp is None:
        a.mtp = "inline" if a.layout == "hf" else "none"
    qcfg = parse_q(a.quant)
    if qcfg and a.layout != "mlx":
        ap.error("--quant needs --layout mlx")
    if qcfg and qcfg[0] not in (2, 3, 4, 5, 6, 8):
        ap.error("--quant bits must be 2, 3, 4, 5, 6 or 8")
    if a.experts % a.n_group or a.experts // a.n_group < 2 or a.topk_group > a.n_group \
            or a.topk > a.experts // a.n_group * a.topk_group:
        ap.error("inconsistent experts/n-group/topk-group/topk")
    if a.rope % 2 or a.rope <= 0 or min(a.nope, a.v_dim, a.kv_lora_rank, a.heads) <= 0 or a.q_lora_rank < 0:
        ap.error("MLA dims: rope must be positive and even, nope/v/kv-lora/heads positive, q-lora >= 0")
    if a.yarn and a.yarn <= 1:
        ap.error("--yarn FACTOR must be > 1 (0: off)")
    if a.first_dense > a.layers:
        ap.error("--first-dense exceeds --layers")
    os.makedirs(a.out, exist_ok=True)
    for f in os.listdir(a.out):
        if f.startswith("model") and (f.endswith(".safetensors") or f.endswith(".json")):
            os.remove(os.path.join(a.out, f))
    trunk, mtp = canonical_specs(a)
    align, meta = (8, {"format": "pt"}) if a.layout == "hf" else (1, {"format": "mlx"})
    main_specs = trunk + (mtp if a.mtp == "inline" else [])
    files = []     # (file name, canonical specs, names, quant)
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
    weight_map, total = {}, 0
    for fn, specs, names, q in files:
        entries = entries_for(file_specs(a, specs, names), q)
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
