#!/usr/bin/python3
"""Generate small RANDOM hy_v3 checkpoints (no tokenizer) for engine tests.

Deterministic by --seed.  Every tensor is drawn from its own generator seeded by
(seed, canonical tensor name), so the SAME seed and shapes give bit-identical
weights in the Tencent and the MLX layout (and with or without a sidecar) - tests
can compare one layout against the other.

Shapes are deliberately odd by default: 6 experts (not a power of two), top-3,
GQA ratio 3 (6 q heads / 2 kv heads), head_dim 32 with hidden 160 != heads*head_dim,
first_k_dense_replace 2, vocab 419, MTP layer optionally with another expert count.

Weights are scaled so that logits span several units (non-degenerate argmax),
norm weights are random around 1 and expert_bias is large enough to change the
top-k choice relative to the raw sigmoid scores.

Layouts (docs/design.md §4):
  tencent: model.layers.L.mlp.experts.E.{gate,up,down}_proj.weight, mlp.expert_bias,
           mlp.router.gate.weight, MTP at model.layers.{N}.*; header padded to 8.
  mlx:     mlp.switch_mlp.{gate,up,down}_proj.weight [E,out,in], mlp.router.expert_bias,
           MTP as mtp.{enorm,hnorm,eh_proj,final_layernorm}.weight + mtp.layer.<rest>;
           unpadded header (unaligned tensor data), metadata format=mlx.
--mtp inline | sidecar | sidecar-tencent | none
           sidecar: MTP tensors in model-mtp.safetensors (layout names);
           sidecar-tencent: sidecar with Tencent names (per-expert), as third-party MLX runtimes ship.
--quant BITS[:GROUP]  MLX affine quantization (mlx layout only) of every Linear/Embedding whose
           input dim is divisible by GROUP; the router gets an 8-bit override (like mlx-lm);
           --mtp-quant BITS[:GROUP] gives the MTP layer its own per-module overrides.
--shards N  split the main tensors into N files + model.safetensors.index.json
--preset big  ~1.3 B params (>= 2 GB bf16) for memory-bandwidth benchmarks.

Examples:
  make_random_ckpt.py --layout tencent --seed 1 --out /tmp/r1
  make_random_ckpt.py --layout mlx --mtp sidecar --quant 4:32 --seed 1 --out /tmp/r1q
  make_random_ckpt.py --layout mlx --quant 3:64 --mtp-quant 8:64 --hidden 192 --expert-dim 128 --inter 256 --seed 2 --out /tmp/r2
  make_random_ckpt.py --preset big --layout tencent --seed 7 --out /tmp/big
"""
import argparse
import json
import os
import struct
import sys
import zlib

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools", "train"))
from safetensors_io import f32_to_bf16, quantize  # noqa: E402

PRESETS = {
    "odd": dict(vocab=419, hidden=160, layers=4, heads=6, kv_heads=2, head_dim=32, inter=224,
                experts=6, topk=3, expert_dim=96, first_dense=2, shared=1, scaling=2.5),
    "big": dict(vocab=32000, hidden=1024, layers=12, heads=16, kv_heads=4, head_dim=64, inter=2816,
                experts=64, topk=8, expert_dim=512, first_dense=1, shared=1, scaling=2.826),
}


def rng_for(seed, name):
    return np.random.default_rng([seed, zlib.crc32(name.encode())])


class Gen:
    """Canonical tensor list: (canonical name, shape, kind) with lazy deterministic values."""

    def __init__(self, a):
        self.a = a

    def value(self, name, shape, kind):
        r = rng_for(self.a.seed, name)
        a = self.a
        if kind == "norm":
            return (1.0 + 0.2 * r.standard_normal(shape, dtype=np.float32)).astype(np.float32)
        if kind == "embed":
            return r.standard_normal(shape, dtype=np.float32)
        if kind == "bias":       # expert_bias: comparable to sigmoid score gaps -> changes choices
            return (0.1 * r.standard_normal(shape, dtype=np.float32)).astype(np.float32)
        if kind == "head":       # logits ~ N(0, 2.5^2) for a unit-RMS hidden
            return r.standard_normal(shape, dtype=np.float32) * np.float32(2.5 / np.sqrt(shape[-1]))
        if kind == "router":
            return r.standard_normal(shape, dtype=np.float32) * np.float32(2.0 / np.sqrt(shape[-1]))
        # ordinary linear; residual outputs slightly damped so depth does not blow up
        std = 1.0 / np.sqrt(shape[-1])
        if kind == "out":
            std *= 0.7
        return r.standard_normal(shape, dtype=np.float32) * np.float32(std)


def layer_specs(a, pfx, dense, n_exp):
    s = [(pfx + "input_layernorm.weight", (a.hidden,), "norm"),
         (pfx + "post_attention_layernorm.weight", (a.hidden,), "norm"),
         (pfx + "self_attn.q_proj.weight", (a.heads * a.head_dim, a.hidden), "lin"),
         (pfx + "self_attn.k_proj.weight", (a.kv_heads * a.head_dim, a.hidden), "lin"),
         (pfx + "self_attn.v_proj.weight", (a.kv_heads * a.head_dim, a.hidden), "lin"),
         (pfx + "self_attn.o_proj.weight", (a.hidden, a.heads * a.head_dim), "out"),
         (pfx + "self_attn.q_norm.weight", (a.head_dim,), "norm"),
         (pfx + "self_attn.k_norm.weight", (a.head_dim,), "norm")]
    if dense:
        s += [(pfx + "mlp.gate_proj.weight", (a.inter, a.hidden), "lin"),
              (pfx + "mlp.up_proj.weight", (a.inter, a.hidden), "lin"),
              (pfx + "mlp.down_proj.weight", (a.hidden, a.inter), "out")]
    else:
        s += [(pfx + "mlp.router.gate.weight", (n_exp, a.hidden), "router"),
              (pfx + "mlp.expert_bias", (n_exp,), "bias"),
              # stacked experts: canonical, split per expert for the Tencent layout
              (pfx + "mlp.experts.gate_proj.weight", (n_exp, a.expert_dim, a.hidden), "lin"),
              (pfx + "mlp.experts.up_proj.weight", (n_exp, a.expert_dim, a.hidden), "lin"),
              (pfx + "mlp.experts.down_proj.weight", (n_exp, a.hidden, a.expert_dim), "out"),
              (pfx + "mlp.shared_mlp.gate_proj.weight", (a.expert_dim * a.shared, a.hidden), "lin"),
              (pfx + "mlp.shared_mlp.up_proj.weight", (a.expert_dim * a.shared, a.hidden), "lin"),
              (pfx + "mlp.shared_mlp.down_proj.weight", (a.hidden, a.expert_dim * a.shared), "out")]
    return s


def canonical_specs(a):
    """Returns (trunk specs, mtp specs); canonical names are Tencent names with stacked experts."""
    t = [("model.embed_tokens.weight", (a.vocab, a.hidden), "embed")]
    for L in range(a.layers):
        t += layer_specs(a, f"model.layers.{L}.", L < a.first_dense, a.experts)
    t += [("model.norm.weight", (a.hidden,), "norm"), ("lm_head.weight", (a.vocab, a.hidden), "head")]
    m = []
    if a.mtp != "none":
        p = f"model.layers.{a.layers}."
        m = [(p + "enorm.weight", (a.hidden,), "norm"), (p + "hnorm.weight", (a.hidden,), "norm"),
             (p + "eh_proj.weight", (a.hidden, 2 * a.hidden), "lin")]
        m += layer_specs(a, p, False, a.mtp_experts or a.experts)
        m += [(p + "final_layernorm.weight", (a.hidden,), "norm")]
    return t, m


def to_tencent(specs):
    """Expand stacked experts into per-expert tensors: yields (name, shape, kind, source, index)."""
    for name, shape, kind in specs:
        if ".mlp.experts." in name:
            pfx, which = name.split(".mlp.experts.")
            for e in range(shape[0]):
                yield (f"{pfx}.mlp.experts.{e}.{which}", shape[1:], kind, name, e)
        else:
            yield (name, shape, kind, name, None)


def mlx_name(name, n_layers):
    n = name.replace(".mlp.experts.", ".mlp.switch_mlp.").replace(".mlp.expert_bias", ".mlp.router.expert_bias")
    p = f"model.layers.{n_layers}."
    if n.startswith(p):
        rest = n[len(p):]
        n = "mtp." + rest if rest.split(".")[0] in ("enorm", "hnorm", "eh_proj", "final_layernorm") \
            else "mtp.layer." + rest
    return n


def module_of(name):
    return name[:-len(".weight")] if name.endswith(".weight") else None


class Writer:
    """Streaming safetensors writer: header from shapes first, then tensors one by one
    (the big preset never holds the whole model in memory)."""

    def __init__(self, path, entries, align, metadata):
        # entries: list of (name, dtype, shape, produce)
        self.path, self.entries = path, entries
        size = {"BF16": 2, "F32": 4, "U32": 4}
        hdr, off = {"__metadata__": metadata}, 0
        for name, dt, shape, _ in entries:
            n = int(np.prod(shape)) * size[dt]
            hdr[name] = {"dtype": dt, "shape": list(shape), "data_offsets": [off, off + n]}
            off += n
        hj = json.dumps(hdr, separators=(",", ":")).encode()
        if align > 1:
            hj += b" " * ((-len(hj)) % align)
        self.hj, self.total = hj, off

    def write(self):
        with open(self.path, "wb") as f:
            f.write(struct.pack("<Q", len(self.hj)))
            f.write(self.hj)
            for name, dt, shape, produce in self.entries:
                arr = produce()
                assert tuple(arr.shape) == tuple(shape), (name, arr.shape, shape)
                if dt == "BF16":
                    f.write(f32_to_bf16(arr).astype("<u2").tobytes())
                elif dt == "F32":
                    f.write(np.ascontiguousarray(arr, dtype="<f4").tobytes())
                else:
                    f.write(np.ascontiguousarray(arr, dtype="<u4").tobytes())
        return self.total


def parse_q(s):
    if not s:
        return None
    b, _, g = s.partition(":")
    return int(b), int(g or 64)


def build_entries(a, specs, gen, layout, qglobal, qmtp, qoverrides, force_tencent=False):
    """Returns list of (name, dtype, shape, produce) for one file."""
    cache = {}

    def value(cname, shape, kind):
        if cname not in cache:
            cache.clear()  # keep at most one stacked tensor alive
            cache[cname] = gen.value(cname, shape, kind)
        return cache[cname]

    out = []
    mtp_pfx = f"model.layers.{a.layers}."
    if layout == "tencent" or force_tencent:
        for name, shape, kind, src, idx in to_tencent(specs):
            full = next(s for s in specs if s[0] == src)
            dt = "F32" if name.endswith("expert_bias") else "BF16"
            out.append((name, dt, shape, (lambda src=src, full=full, idx=idx:
                                          value(src, full[1], full[2]) if idx is None
                                          else value(src, full[1], full[2])[idx])))
        return out
    for name, shape, kind in specs:
        mname = mlx_name(name, a.layers)
        mod = module_of(mname)
        q = qmtp if (qmtp and name.startswith(mtp_pfx)) else qglobal
        if kind == "router" and q:
            q = (8, 64 if shape[-1] % 64 == 0 else q[1])
        quant = q is not None and kind in ("lin", "out", "embed", "head", "router") and shape[-1] % q[1] == 0
        if not quant:
            dt = "F32" if kind == "bias" else "BF16"
            out.append((mname, dt, shape, lambda name=name, shape=shape, kind=kind: value(name, shape, kind)))
            continue
        bits, gs = q
        if (bits, gs) != (qglobal[0], qglobal[1]) if qglobal else True:
            qoverrides[mod] = {"group_size": gs, "bits": bits}
        qshape = tuple(shape[:-1]) + (shape[-1] * bits // 32,)
        sshape = tuple(shape[:-1]) + (shape[-1] // gs,)

        def qz(name=name, shape=shape, kind=kind, bits=bits, gs=gs):
            key = ("q", name)
            if key not in cache:
                w = value(name, shape, kind)
                # quantize the bf16-rounded weight, like converting a bf16 checkpoint
                w = (f32_to_bf16(w).astype(np.uint32) << 16).view(np.float32)
                W, s, b = quantize(w, bits, gs)
                cache.clear()
                cache[key] = (W, s, b)
            return cache[key]
        out.append((mname, "U32", qshape, lambda qz=qz: qz()[0]))
        out.append((mod + ".scales", "BF16", sshape, lambda qz=qz: qz()[1]))
        out.append((mod + ".biases", "BF16", sshape, lambda qz=qz: qz()[2]))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--layout", choices=("tencent", "mlx"), default="tencent")
    ap.add_argument("--mtp", choices=("inline", "sidecar", "sidecar-tencent", "none"), default="inline")
    ap.add_argument("--quant", help="BITS[:GROUP] MLX affine quantization (mlx layout)")
    ap.add_argument("--mtp-quant", help="BITS[:GROUP] for the MTP layer (per-module overrides)")
    ap.add_argument("--shards", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", required=True)
    ap.add_argument("--preset", choices=tuple(PRESETS), default="odd")
    for k in ("vocab", "hidden", "layers", "heads", "kv_heads", "head_dim", "inter", "experts", "topk",
              "expert_dim", "first_dense", "shared"):
        ap.add_argument("--" + k.replace("_", "-"), type=int)
    ap.add_argument("--mtp-experts", type=int, help="expert count of the MTP layer (default = trunk)")
    ap.add_argument("--scaling", type=float)
    ap.add_argument("--rope-theta", type=float, default=10000.0)
    ap.add_argument("--legacy-config", action="store_true",
                    help="write top-level rope_theta and only moe_intermediate_size (alias test)")
    a = ap.parse_args()
    for k, v in PRESETS[a.preset].items():
        if getattr(a, k, None) is None:
            setattr(a, k, v)
    if (a.quant or a.mtp_quant) and a.layout != "mlx":
        ap.error("--quant needs --layout mlx")
    assert a.heads % a.kv_heads == 0
    qglobal, qmtp = parse_q(a.quant), parse_q(a.mtp_quant)
    if qmtp and not qglobal:
        ap.error("--mtp-quant needs --quant")
    os.makedirs(a.out, exist_ok=True)
    for f in os.listdir(a.out):
        if f.startswith("model") and (f.endswith(".safetensors") or f.endswith(".json")):
            os.remove(os.path.join(a.out, f))
    gen = Gen(a)
    trunk, mtp = canonical_specs(a)
    align = 8 if a.layout == "tencent" else 1
    meta = {"format": "pt"} if a.layout == "tencent" else {"format": "mlx"}
    qover = {}
    files = []   # (filename, specs, force_tencent)
    main_specs = trunk + (mtp if a.mtp == "inline" else [])
    if a.shards > 1:
        per = -(-len(main_specs) // a.shards)
        for i in range(a.shards):
            files.append((f"model-{i + 1:05d}-of-{a.shards:05d}.safetensors", main_specs[i * per:(i + 1) * per], False))
    else:
        files.append(("model.safetensors", main_specs, False))
    if a.mtp in ("sidecar", "sidecar-tencent"):
        files.append(("model-mtp.safetensors", mtp, a.mtp == "sidecar-tencent"))
    weight_map, total = {}, 0
    for fn, specs, ft in files:
        entries = build_entries(a, specs, gen, a.layout, qglobal, qmtp, qover, force_tencent=ft)
        w = Writer(os.path.join(a.out, fn), entries, align, meta)
        total += w.write()
        for e in entries:
            weight_map[e[0]] = fn
    if a.shards > 1 or a.mtp.startswith("sidecar"):
        with open(os.path.join(a.out, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=1)
    cfg = {
        "model_type": "hy_v3", "architectures": ["HYV3ForCausalLM"],
        "vocab_size": a.vocab, "hidden_size": a.hidden, "num_hidden_layers": a.layers,
        "num_attention_heads": a.heads, "num_key_value_heads": a.kv_heads, "head_dim": a.head_dim,
        "hidden_act": "silu", "intermediate_size": a.inter,
        "expert_hidden_dim": a.expert_dim, "moe_intermediate_size": a.expert_dim,
        "num_experts": a.experts, "num_experts_per_tok": a.topk, "num_shared_experts": a.shared,
        "first_k_dense_replace": a.first_dense, "moe_router_use_sigmoid": True,
        "moe_router_enable_expert_bias": True, "route_norm": True, "router_scaling_factor": a.scaling,
        "rms_norm_eps": 1e-5, "rope_parameters": {"rope_theta": a.rope_theta, "rope_type": "default"},
        "max_position_embeddings": 4096, "qk_norm": True, "tie_word_embeddings": False,
        "num_nextn_predict_layers": 0 if a.mtp == "none" else 1, "enable_lm_head_fp32": True,
        "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0, "torch_dtype": "bfloat16",
    }
    if a.mtp_experts and a.mtp != "none":
        cfg["mtp_num_experts"] = a.mtp_experts   # informational; loaders should trust tensor shapes
    if a.legacy_config:
        del cfg["rope_parameters"], cfg["expert_hidden_dim"]
        cfg["rope_theta"] = a.rope_theta
    if qglobal:
        q = {"group_size": qglobal[1], "bits": qglobal[0], "mode": "affine"}
        q.update(qover)
        cfg["quantization"] = q
        cfg["quantization_config"] = dict(q)
    with open(os.path.join(a.out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    print(f"{a.out}: {total / 1e6:.1f} MB in {len(files)} file(s)", file=sys.stderr)


if __name__ == "__main__":
    main()
