#!/usr/bin/python3
"""End-to-end tests of `nextn convert` and `nextn graft` on the Gated-DeltaNet hybrids, qwen3_5_moe
(Qwen3.5 / 3.6 MoE: vision-language wrapper, fused trunk experts) and qwen3_next (Qwen3-Next: fused
DeltaNet projections), on small random checkpoints of tests/ref/make_random_qwen35.py, whose MLX
layout is the one mlx-lm's sanitize() and quantize write (folded +1 norms, conv1d [C, K, 1],
switch_mlp experts, the routers at 8 bits group 64), with the head added as a sidecar:
  - convert of the HF checkpoint (sharded, with a vision tower) at 4 bits group 32, the head too,
    writes that layout tensor for tensor (names, dtypes, shapes, bytes) and its quantization block;
  - a float conversion gives the HF checkpoint's trunk and MTP logits bit for bit, and so does a
    conversion of an MLX checkpoint that copies its 8-bit trunk and keeps its HF-named head float
    (the folded trunk is not folded again, the raw head is);
  - the default conversion (head 8-bit, fc float) loads with the head in model-mtp.safetensors and
    matches the reference forward tools/ref/qwen35.py (trunk and MTP logits, greedy continuation,
    greedy MTP equal to greedy AR);
  - graft of the HF head onto the headless MLX trunk: as stored, the logits of the same model
    generated with the HF head in a sidecar, bit for bit; by default, a sidecar that matches the
    reference;
  - fused experts that do not match moe_intermediate_size are a named error.
Quantized models run at --act-bits 16 (the reference multiplies exact float inputs).

  NEXTN=build/nextn prove -v tests/e2e/convert_qwen35.t
"""
import glob
import json
import os
import shutil
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.join(HERE, "..", "..", "tools", "train")]
from tap import PY, Tap, nextn, run, scratch  # noqa: E402
from safetensors_io import read_file, write_file  # noqa: E402

t = Tap()
TOL = 2e-3  # of the logit range; both sides compute in f32 from the same weights
tmp = scratch(prefix="nextn-convert-qwen35-")
REF = "tools/ref/qwen35.py"
GEN = "tests/ref/make_random_qwen35.py"
rng = np.random.default_rng(35)
TOKENS = rng.integers(4, 419, size=15).tolist()
PROMPT = TOKENS[:5]
N = 16


def d(name):
    return os.path.join(tmp, name)


def ids(tokens):
    return ",".join(map(str, tokens))


def gen(name, *args):
    run([PY, GEN, *map(str, args), "--out", d(name)])
    return d(name)


def tensors(mdir):
    """Every tensor of a checkpoint directory, BF16 as raw uint16."""
    out = {}
    for f in sorted(glob.glob(os.path.join(mdir, "*.safetensors"))):
        out.update(read_file(f, raw=True))
    return out


def logits(mdir):
    lg, mt = d(os.path.basename(mdir) + "-l.npy"), d(os.path.basename(mdir) + "-m.npy")
    nextn("eval", "-m", mdir, "--tokens", ids(TOKENS), "--logits", lg, "--mtp-logits", mt, "--act-bits", 16)
    return np.load(lg), np.load(mt)


def same_logits(name, a, b):
    (la, ma), (lb, mb) = logits(a), logits(b)
    t.ok(np.array_equal(la, lb) and np.array_equal(ma, mb), f"{name}: trunk and MTP logits bit for bit",
         f"trunk max diff {abs(la - lb).max():.3e}, MTP {abs(ma - mb).max():.3e}")


def greedy(mdir, draft, *extra):
    r = nextn("run", "-m", mdir, "--prompt-tokens", ids(PROMPT), "-n", N, "--print-ids", "--ignore-eos", "--draft",
              draft, "--act-bits", 16, "--quiet", *extra)
    return r.stdout.split()


def check_ref(name, mdir):
    """Trunk and MTP logits against the reference; greedy continuation equal to it; greedy MTP
    (draft 2, two threads) equal to greedy AR."""
    rl, rm = d(name + "-ref.npy"), d(name + "-refm.npy")
    run([PY, REF, "--model", mdir, "--tokens", ids(TOKENS), "--logits", rl, "--mtp-logits", rm])
    el, em = logits(mdir)
    t.logits_close(f"{name} trunk logits", el, np.load(rl), TOL)
    t.logits_close(f"{name} MTP logits", em, np.load(rm), TOL)
    ref = run([PY, REF, "--model", mdir, "--tokens", ids(PROMPT), "--greedy", str(N)]).stdout.split()
    ar = greedy(mdir, 0, "--threads", 1)
    t.ok(ar == ref, f"{name}: greedy continuation equals the reference", f"engine {ar}\nreference {ref}")
    mtp = greedy(mdir, 2, "--threads", 2)
    t.ok(mtp == ar, f"{name}: greedy MTP (draft 2) equals greedy AR", f"mtp {mtp}\nar {ar}")


def inspect(mdir):
    return json.loads(nextn("inspect", "-m", mdir, "--json").stdout)


def add_vision_tower(mdir):
    """A shard with a vision tower tensor, as the released Qwen3.5 checkpoints have (indexed)."""
    write_file(os.path.join(mdir, "model-visual.safetensors"),
               {"model.visual.patch_embed.proj.weight": ("BF16", np.ones((8, 3, 2, 2, 2), np.float32))})
    ip = os.path.join(mdir, "model.safetensors.index.json")
    with open(ip) as f:
        idx = json.load(f)
    idx["weight_map"]["model.visual.patch_embed.proj.weight"] = "model-visual.safetensors"
    with open(ip, "w") as f:
        json.dump(idx, f)


def quant_dicts(mdir):
    """The per-module overrides of config.json's quantization block that quantize (not `false`)."""
    with open(os.path.join(mdir, "config.json")) as f:
        q = json.load(f)["quantization"]
    return {k: v for k, v in q.items() if v is not False}


for fi, fam in enumerate(("qwen3_5_moe", "qwen3_next")):
    seed = 60 + 10 * fi
    f = ["--family", fam]
    hf = gen(f"{fam}-hf", *f, "--layout", "hf", "--shards", 3, "--seed", seed)
    if fam == "qwen3_5_moe":
        add_vision_tower(hf)

    # the MLX layout, tensor for tensor (the head quantized like the trunk)
    mlx = gen(f"{fam}-mlx-q4", *f, "--layout", "mlx", "--mtp", "sidecar", "--quant", "4:32", "--seed", seed)
    c4 = d(f"{fam}-conv-q4-all")
    nextn("convert", hf, c4, "--bits", 4, "--group-size", 32, "--mtp-bits", 4, "--quiet")
    a, b = tensors(c4), tensors(mlx)
    differ = sorted(k for k in set(a) & set(b) if a[k].dtype != b[k].dtype or not np.array_equal(a[k], b[k]))
    t.ok(set(a) == set(b) and not differ, f"{fam} convert --mtp-bits 4: the MLX layout, tensor for tensor",
         f"only converted: {sorted(set(a) - set(b))[:8]}\nonly MLX: {sorted(set(b) - set(a))[:8]}\ndiffer: {differ[:8]}")
    t.ok(quant_dicts(c4) == quant_dicts(mlx), f"{fam} convert: the quantization block's overrides",
         json.dumps({"converted": quant_dicts(c4), "mlx": quant_dicts(mlx)}))
    with open(os.path.join(c4, "config.json")) as fh:
        cfg = json.load(fh)
    lm = cfg.get("text_config", {}) if fam == "qwen3_5_moe" else cfg
    t.ok(cfg["model_type"] == fam and lm.get("num_hidden_layers") == 4,
         f"{fam} convert: config.json keeps its form" + (" (the wrapper, text_config)" if fi == 0 else ""))

    # float: the HF checkpoint's logits, bit for bit
    cf = d(f"{fam}-conv-float")
    nextn("convert", hf, cf, "--keep", "*=float", "--quiet")
    same_logits(f"{fam} convert --keep '*=float' vs the HF source", cf, hf)

    # an MLX source: its folded 8-bit trunk copied, its HF-named head (per expert, raw norms) kept float
    src8 = gen(f"{fam}-mlx-q8-hfhead", *f, "--layout", "mlx", "--mtp", "sidecar-hf", "--quant", "8:32", "--hidden", 256,
               "--seed", seed + 1)
    c8 = d(f"{fam}-conv-q8")
    nextn("convert", src8, c8, "--bits", 8, "--group-size", 32, "--keep", "mtp.*=float", "--quiet")
    same_logits(f"{fam} convert of MLX 8:32 + HF head (trunk copied, head float) vs its source", c8, src8)

    # the default: 4-bit trunk, 8-bit head with fc float, in the sidecar
    cd = d(f"{fam}-conv-q4")
    nextn("convert", hf, cd, "--bits", 4, "--group-size", 32, "--quiet")
    info = inspect(cd)
    t.ok(os.path.exists(os.path.join(cd, "model-mtp.safetensors")) and info["family"] == fam and
         info["mtp"] == "sidecar", f"{fam} convert: the head in model-mtp.safetensors, loaded as the sidecar",
         json.dumps({k: info.get(k) for k in ("family", "layout", "mtp")}))
    check_ref(f"{fam}-conv-q4", cd)

    # graft onto a headless MLX trunk (as mlx-lm writes it)
    base = gen(f"{fam}-headless", *f, "--layout", "mlx", "--mtp", "none", "--quant", "4:32", "--seed", seed)
    side = gen(f"{fam}-sidecar-hf", *f, "--layout", "mlx", "--mtp", "sidecar-hf", "--quant", "4:32", "--seed", seed)
    gk = d(f"{fam}-graft-keep")
    nextn("graft", base, hf, "-o", gk, "--keep-dtype", "--quiet")
    same_logits(f"{fam} graft --keep-dtype vs the same model with the HF head as a sidecar", gk, side)
    gd = d(f"{fam}-graft")
    nextn("graft", base, hf, "-o", gd, "--quiet")
    t.ok(inspect(gd)["mtp"] == "sidecar", f"{fam} graft: the head loaded as the sidecar")
    check_ref(f"{fam}-graft", gd)

# fused experts that do not split into moe_intermediate_size: a named error
bad = d("qwen3_5_moe-bad")
shutil.copytree(d("qwen3_5_moe-hf"), bad)
with open(os.path.join(bad, "config.json")) as fh:
    cfg = json.load(fh)
cfg["text_config"]["moe_intermediate_size"] += 8
with open(os.path.join(bad, "config.json"), "w") as fh:
    json.dump(cfg, fh)
r = nextn("convert", bad, d("bad-out"), "--quiet", check=False)
t.ok(r.returncode == 1 and "mlp.experts.gate_up_proj" in r.stderr and "moe_intermediate_size" in r.stderr,
     "fused experts of the wrong width: a named error", r.stderr)

shutil.rmtree(tmp, ignore_errors=True)
t.done()
