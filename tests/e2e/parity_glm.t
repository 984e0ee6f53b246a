#!/usr/bin/python3
"""End-to-end parity of the C engine's glm4_moe (GLM-4.5/4.6/4.7/Air) against the independent
float32 reference forward (tools/ref/glm4_moe.py), on random checkpoints of odd shapes
(tests/ref/make_random_glm.py: 6 query heads over 2 kv heads, hidden != heads x head_dim, partial
RoPE, several dense layers, groups > 1, with and without q/k/v biases and qk-norm, the MTP head's
own embedding and output head or the trunk's) in the HF layout, the MLX layout in bf16 and MLX
affine 2-8 bit, and as `nextn convert` / `nextn graft` write them: trunk and teacher-forced MTP
logits within a small share of the logit range, the same greedy continuation, decoding after a
prefill (`nextn run`) picking what one prefill over the whole sequence (`nextn eval`) ranks first,
greedy MTP equal to greedy AR with drafts accepted (tests/e2e/paritylib.py's checks), the HF and MLX layouts of the same weights giving the same bits,
and `nextn inspect` naming what it inferred. Quantized models run at --act-bits 16 (the reference
multiplies exact float inputs)."""
import json
import os
import shutil
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from paritylib import Parity, inspect  # noqa: E402
from tap import PY, Tap, nextn, run, scratch  # noqa: E402

t = Tap()
tmp = scratch(prefix="nextn-parity-glm-")
GEN = "tests/ref/make_random_glm.py"
P = Parity(t, tmp, "tools/ref/glm4_moe.py", GEN, drafts=("1", "2", "3", "auto"))

RANDOM = [
    # name, generator arguments
    ("hf-odd", ["--layout", "hf", "--seed", "11"]),
    ("hf-air-groups-own", ["--layout", "hf", "--preset", "air", "--n-group", "4", "--topk-group", "2",
                           "--experts", "12", "--mtp-head", "own", "--seed", "12"]),
    ("hf-plain-groups-shards", ["--layout", "hf", "--attn-bias", "0", "--qk-norm", "0", "--n-group", "2",
                                "--topk-group", "1", "--experts", "8", "--topk", "2", "--shards", "2", "--seed", "13"]),
    ("mlx-odd-sidecar", ["--layout", "mlx", "--mtp", "sidecar", "--seed", "11"]),
    ("mlx-q4-g32-own", ["--layout", "mlx", "--mtp", "sidecar", "--mtp-head", "own", "--quant", "4:32",
                        "--seed", "14"]),
    ("mlx-q2-g32", ["--layout", "mlx", "--mtp", "inline", "--quant", "2:32", "--seed", "15"]),
    ("mlx-q3-g32-groups", ["--layout", "mlx", "--mtp", "sidecar", "--quant", "3:32", "--n-group", "4",
                           "--topk-group", "2", "--experts", "12", "--seed", "16"]),
    ("mlx-q8-g32", ["--layout", "mlx", "--mtp", "sidecar", "--quant", "8:32", "--seed", "17"]),
]


rng = np.random.default_rng(5)
tokens = rng.integers(4, 419, size=19).tolist()
results = {}
for name, gen_args in RANDOM:
    d = os.path.join(tmp, name)
    run([PY, GEN, *gen_args, "--out", d])
    results[name] = P.check_model(name, d, tokens, tokens[:6])

# what inspect reports is what the configs say
info = inspect(os.path.join(tmp, "hf-odd"))
want = {"family": "glm4_moe", "layout": "hf", "mtp": "inline", "rotary_dim": 16, "head_dim": 32, "heads": 6,
        "kv_heads": 2, "attn_bias": True, "qk_norm": True, "router": "sigmoid+bias", "n_group": 1, "topk_group": 1,
        "norm_topk_prob": True, "routed_scaling": 2.5, "shared_experts": 1, "dense_layers": 2,
        "mtp_concat": "embed,hidden", "mtp_recycle": "pre-norm", "mtp_zero_pos0": True, "mtp_embed": "trunk",
        "mtp_head": "trunk"}
t.ok(all(info.get(k) == v for k, v in want.items()), "inspect hf-odd: family, rotary dims, biases, qk-norm, router, "
     "groups, scaling, dense layers, MTP wiring", json.dumps({k: info.get(k) for k in want}))
info = inspect(os.path.join(tmp, "hf-air-groups-own"))
want = {"attn_bias": True, "qk_norm": False, "n_group": 4, "topk_group": 2, "routed_scaling": 1.0, "dense_layers": 1,
        "mtp_embed": "own", "mtp_head": "own"}
t.ok(all(info.get(k) == v for k, v in want.items()), "inspect hf-air-groups-own: no qk-norm, 4 groups keep 2, "
     "the head's own embedding and output head", json.dumps({k: info.get(k) for k in want}))
info = inspect(os.path.join(tmp, "mlx-q4-g32-own"))
t.ok(info["layout"] == "mlx" and info["mtp"] == "sidecar" and info["mtp_head"] == "own",
     "inspect mlx-q4-g32-own: MLX layout, sidecar head with its own output head", json.dumps(info))

# the same weights in the HF layout (per-expert, inline head) and the MLX one (stacked experts,
# sidecar head) give the same bits
a, b = results["hf-odd"], results["mlx-odd-sidecar"]
t.ok(np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1]),
     "hf-odd and mlx-odd-sidecar (same weights): trunk and MTP logits bit for bit")

# --mtp-recycle overrides the family's pre-norm feedback: still exact (the trunk verifies), and
# the drafts differ in general (not asserted: a random head may propose the same tokens)
d = os.path.join(tmp, "hf-odd")
pids = ",".join(map(str, tokens[:6]))
ar = nextn("run", "-m", d, "--prompt-tokens", pids, "-n", 24, "--print-ids", "--ignore-eos", "--draft", 0, "--quiet",
           "--act-bits", 16).stdout.split()
out = nextn("run", "-m", d, "--prompt-tokens", pids, "-n", 24, "--print-ids", "--ignore-eos", "--draft", 3, "--quiet",
            "--act-bits", 16, "--mtp-recycle", "normed").stdout.split()
t.ok(out == ar, "hf-odd --mtp-recycle normed: greedy MTP equals greedy AR", f"mtp {out}\nar {ar}")

# nextn convert: HF bf16 → MLX 4-bit g32 trunk + 8-bit sidecar head (written from HF layer N),
# compared with the reference on the converted files
src = os.path.join(tmp, "hf-air-groups-own")
conv = os.path.join(tmp, "conv-q4")
nextn("convert", src, conv, "--bits", 4, "--group-size", 32, "--quiet")
t.ok(os.path.exists(os.path.join(conv, "model-mtp.safetensors")), "convert writes the head to model-mtp.safetensors")
info = inspect(conv)
t.ok(info["mtp"] == "sidecar" and info["mtp_embed"] == "own" and info["mtp_head"] == "own" and info["n_group"] == 4,
     "inspect converted: sidecar head with its own embedding and output head, groups kept", json.dumps(info))
P.check_model("convert-q4", conv, tokens, tokens[:6])

# nextn graft: an MLX-quantized trunk without its head (as mlx-lm writes it) + the HF head
base = os.path.join(tmp, "mlx-headless")
run([PY, GEN, "--layout", "mlx", "--mtp", "none", "--quant", "4:32", "--seed", "11", "--out", base])
t.ok(inspect(base)["mtp"].startswith("none"), "mlx-headless: no MTP head")
grafted = os.path.join(tmp, "grafted")
nextn("graft", base, os.path.join(tmp, "hf-odd"), "-o", grafted, "--quiet")
t.ok(inspect(grafted)["mtp"] == "sidecar", "graft adds the HF head as a sidecar")
P.check_model("graft-q4+hf-head", grafted, tokens, tokens[:6])

# the head from a partial download: the same HF weights in 3 shards, of which only config.json,
# the index and the shards holding the MTP layer are present, graft the same head bytes
full = os.path.join(tmp, "hf-odd-shards")
run([PY, GEN, "--layout", "hf", "--seed", "11", "--shards", "3", "--out", full])
part = os.path.join(tmp, "hf-odd-head-only")
os.makedirs(part)
with open(os.path.join(full, "model.safetensors.index.json")) as f:
    wmap = json.load(f)["weight_map"]
n_layers = json.load(open(os.path.join(full, "config.json")))["num_hidden_layers"]
need = {fn for k, fn in wmap.items() if k.startswith(f"model.layers.{n_layers}.")}
for fn in ["config.json", "model.safetensors.index.json", *need]:
    shutil.copy(os.path.join(full, fn), part)
t.ok(len(need) < len(set(wmap.values())), "the partial copy leaves shards out", f"{sorted(need)}")
grafted_part = os.path.join(tmp, "grafted-partial")
nextn("graft", base, part, "-o", grafted_part, "--quiet")
same = open(os.path.join(grafted, "model-mtp.safetensors"), "rb").read() == \
    open(os.path.join(grafted_part, "model-mtp.safetensors"), "rb").read()
t.ok(same, "graft from the MTP shards alone writes the same head as from the whole checkpoint")

# Random heads almost never agree with their random trunks (0 of ~1000 drafts above), so the
# accepted-draft path (verify rows kept, caches advanced past accepted drafts, the head caught
# up) runs on a copy whose final norms (model.norm, shared_head.norm) are zero: every logit of
# both heads is 0, both pick token 0, and every draft is accepted.
def zero_tensors(mdir, names):
    import struct
    for fn in os.listdir(mdir):
        if not fn.endswith(".safetensors"):
            continue
        p = os.path.join(mdir, fn)
        with open(p, "r+b") as f:
            n = struct.unpack("<Q", f.read(8))[0]
            hdr = json.loads(f.read(n))
            for k in names:
                if k in hdr:
                    a, b = hdr[k]["data_offsets"]
                    f.seek(8 + n + a)
                    f.write(bytes(b - a))


d = os.path.join(tmp, "hf-zero-norms")
shutil.copytree(os.path.join(tmp, "hf-odd"), d)
zero_tensors(d, ["model.norm.weight", "model.layers.4.shared_head.norm.weight"])
pids = ",".join(map(str, tokens[:6]))
ar = nextn("run", "-m", d, "--prompt-tokens", pids, "-n", 24, "--print-ids", "--ignore-eos", "--draft", 0, "--quiet",
           "--act-bits", 16).stdout.split()
acc = P.greedy_mtp("hf-zero-norms", d, pids, ar, 24)
t.ok(acc >= 24, f"hf-zero-norms: drafts accepted ({acc} over draft 1, 2, 3, auto)")
t.note(f"drafts accepted on the random checkpoints: {P.accepted}")

shutil.rmtree(tmp, ignore_errors=True)
t.done()
