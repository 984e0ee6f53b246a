#!/usr/bin/python3
"""A NaN in a checked weight is refused at load with the tensor named as the checkpoint spells it,
in every family and layout: random glm4_moe, glm4_moe_lite, deepseek_v3, qwen3_5_moe and qwen3_next
checkpoints (HF and MLX, float and quantized, inline and sidecar MTP heads) get one NaN written
into a norm, a router, the scales or biases of a quantized embedding or head, a selection bias or
an MTP norm; `nextn run`
must fail naming exactly that tensor, and the unpoisoned checkpoint must run.

  NEXTN=build/nextn prove -v tests/e2e/nan_names.t
"""
import json
import os
import shutil
import struct
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tap import PY, ROOT, Tap, nextn, run, scratch  # noqa: E402

t = Tap()
tmp = scratch(prefix="nextn-nan-names-")
REF = os.path.join(ROOT, "tests", "ref")


def headers(d):
    """{tensor name: (file, dtype, absolute byte offset)} over every .safetensors file in d."""
    out = {}
    for f in sorted(os.listdir(d)):
        if not f.endswith(".safetensors"):
            continue
        p = os.path.join(d, f)
        with open(p, "rb") as fh:
            n = struct.unpack("<Q", fh.read(8))[0]
            h = json.loads(fh.read(n))
        for k, v in h.items():
            if k != "__metadata__":
                out[k] = (p, v["dtype"], 8 + n + v["data_offsets"][0])
    return out


def poison(src, name, at):
    """A copy of checkpoint src with element `at` of tensor name set to NaN."""
    dst = os.path.join(tmp, "poisoned")
    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(src, dst)
    p, dt, off = headers(dst)[name]
    p = os.path.join(dst, os.path.basename(p))
    nan = {"F32": struct.pack("<I", 0x7FC00000), "F16": struct.pack("<H", 0x7E00),
           "BF16": struct.pack("<H", 0x7FC0)}[dt]
    with open(p, "r+b") as fh:
        fh.seek(off + at * len(nan))
        fh.write(nan)
    return dst


def make(script, args, tag):
    d = os.path.join(tmp, tag)
    run([PY, os.path.join(REF, script), *args, "--out", d])
    return d


def pick(names, *suffixes):
    """The first stored name ending in one of suffixes (in order of the suffixes)."""
    for s in suffixes:
        hit = sorted(n for n in names if n.endswith(s))
        if hit:
            return hit[0]
    return None


CASES = [
    ("make_random_glm.py", ["--layout", "hf", "--seed", "11"], "glm-hf",
     [".layers.1.input_layernorm.weight", ".layers.2.mlp.gate.weight", ".layers.2.mlp.gate.e_score_correction_bias",
      "enorm.weight", "hnorm.weight"]),
    ("make_random_glm.py", ["--layout", "mlx", "--mtp", "sidecar", "--quant", "4:64", "--hidden", "256",
                            "--expert-dim", "128", "--inter", "256", "--seed", "12"], "glm-mlx-q4",
     ["lm_head.scales", "embed_tokens.biases", "shared_head.norm.weight", "post_attention_layernorm.weight"]),
    ("make_random_mla.py", ["--family", "glm4_moe_lite", "--layout", "hf", "--seed", "13"], "flash-hf",
     ["self_attn.kv_a_layernorm.weight", "self_attn.q_a_layernorm.weight", "mlp.gate.weight"]),
    ("make_random_mla.py", ["--family", "deepseek_v3", "--layout", "mlx", "--mtp", "sidecar", "--seed", "14"],
     "dsv3-mlx", ["mlp.gate.e_score_correction_bias", "model.norm.weight"]),
    ("make_random_qwen35.py", ["--family", "qwen3_5_moe", "--layout", "hf", "--seed", "15"], "qwen35-hf",
     ["linear_attn.A_log", "linear_attn.dt_bias", "mtp.pre_fc_norm_embedding.weight", "mtp.norm.weight",
      "mlp.gate.weight"]),
    ("make_random_qwen35.py", ["--family", "qwen3_next", "--layout", "mlx", "--mtp", "sidecar", "--quant", "4:64",
                               "--seed", "16"], "next-mlx-q4", ["linear_attn.norm.weight", "lm_head.weight", "mlp.gate.weight"]),
]

for script, args, tag, wanted in CASES:
    d = make(script, args, tag)
    names = headers(d)
    r = nextn("run", "-m", d, "--prompt-tokens", "1,2,3", "-n", "2", "--draft", "1", check=False)
    t.ok(r.returncode == 0, f"{tag}: the clean checkpoint runs", r.stderr[-800:])
    for suffix in wanted:
        name = pick(names, suffix)
        if not t.ok(name is not None, f"{tag}: the checkpoint stores a tensor ending in {suffix}",
                    "\n".join(sorted(names))[:3000]):
            continue
        bad = poison(d, name, 1)
        r = nextn("run", "-m", bad, "--prompt-tokens", "1,2,3", "-n", "2", check=False)
        want = f"tensor {name}: non-finite value"
        t.ok(r.returncode != 0 and want in r.stderr, f"{tag}: a NaN in {name} is refused naming it",
             r.stderr[-800:])

shutil.rmtree(tmp, ignore_errors=True)
t.done()
