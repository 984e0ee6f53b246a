#!/usr/bin/python3
"""End-to-end parity of the C engine's Gated-DeltaNet hybrid MoE families, Qwen3.5 / Qwen3.6 MoE
(qwen3_5_moe) and Qwen3-Next (qwen3_next), against the independent float32 reference forward
(tools/ref/qwen35.py, the DeltaNet recurrence token by token) on random checkpoints of odd shapes
(tests/ref/make_random_qwen35.py: hidden 160, DeltaNet 2 key / 4 value heads of 24 / 32 dims,
attention 6 / 2 heads of 32 with 8 rotary dims and an output gate, 8 experts top-3 + a gated shared
expert, full attention every 2nd (qwen3_5_moe, layer_types) or 4th (qwen3_next) layer) in the HF
layout (qwen3_5_moe: VL wrapper config, model.language_model., fused gate_up_proj trunk experts;
qwen3_next: fused in_proj_qkvz / in_proj_ba; plain and sharded), the MLX layout in bf16 (folded
norms, conv1d [C, K, 1], sidecar head) and MLX affine 4/8-bit (the routers at 8:64 on a hidden of
256), and as `nextn convert` / `nextn graft` write them, for both families:
  trunk and teacher-forced MTP logits within a small share of the logit range; the same greedy
  continuation; decoding after a prefill (`nextn run`: conv window and recurrent state carried from
  token to token) picking what one prefill over the whole sequence (`nextn eval`) ranks first;
  greedy AR the same at --threads 1 and 2, and greedy MTP equal to it at draft 1, 2, 3, 4 and auto
  at both thread counts - rejected drafts must leave the recurrent state exactly as after the last
  accepted token, so this is what proves the rollback; drafts accepted on a checkpoint whose head
  agrees with its trunk; the HF and MLX layouts of one seed giving the same bits; and
  `nextn inspect --json` reporting the hybrid layout ("attention": "hybrid", "layer_types" counts,
  "linear_state_bytes", "kv_bytes_per_token" of the full-attention layers and the MTP layer, the
  softmax router, the MTP wiring).
Quantized models run at --act-bits 16 (the reference multiplies exact float inputs).

  NEXTN=build/nextn prove -v tests/e2e/parity_qwen35.t
"""
import os
import shutil
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from paritylib import Parity, ids, inspect  # noqa: E402
from tap import Tap, nextn, scratch  # noqa: E402

t = Tap()
tmp = scratch(prefix="nextn-parity-qwen35-")
FAMILIES = ("qwen3_5_moe", "qwen3_next")
WIDE = ["--hidden", "256"]          # divisible by 64: the routers are quantized at 8 bits, group 64
# greedy AR the same at 1 and 2 threads, greedy MTP equal to it at every draft and both counts
P = Parity(t, tmp, "tools/ref/qwen35.py", "tests/ref/make_random_qwen35.py", drafts=("1", "2", "3", "4", "auto"),
           threads=("1", "2"))
# odd preset: DeltaNet state = value heads x key dim x value dim + (kernel - 1) x conv channels, f32
STATE = (4 * 24 * 32 + 3 * (2 * 2 * 24 + 4 * 32)) * 4
KV = 2 * 2 * 32 * 4                # keys and values of one full-attention layer per token, f32
LINEAR = {"qwen3_5_moe": 2, "qwen3_next": 3}


def cases(fam, seed):
    """(name, generator arguments) for one family; seeds differ per family."""
    f = ["--family", fam]
    return [
        ("hf-odd", [*f, "--layout", "hf", "--seed", str(seed)]),
        ("hf-shards", [*f, "--layout", "hf", "--shards", "3", "--seed", str(seed + 1)]),
        ("mlx-odd-sidecar", [*f, "--layout", "mlx", "--mtp", "sidecar", "--seed", str(seed)]),
        ("mlx-q4-g64-wide", [*f, "--layout", "mlx", "--mtp", "sidecar", "--quant", "4:64", *WIDE,
                             "--seed", str(seed + 2)]),
        ("mlx-q4-g32-inline", [*f, "--layout", "mlx", "--mtp", "inline", "--quant", "4:32", "--seed", str(seed + 3)]),
        ("mlx-q8-g32-hfhead", [*f, "--layout", "mlx", "--mtp", "sidecar-hf", "--quant", "8:32", *WIDE,
                               "--seed", str(seed + 4)]),
    ]


rng = np.random.default_rng(38)
tokens = rng.integers(4, 419, size=19).tolist()
prompt = tokens[:6]

for fi, fam in enumerate(FAMILIES):
    results = {}
    for name, gen_args in cases(fam, 200 + 20 * fi):
        full = f"{fam}-{name}"
        results[name] = P.check_model(full, P.gen(full, gen_args), tokens, prompt)

    # the same weights in the HF layout (fused experts / projections, raw zero-centred norms, inline
    # head) and the MLX one (switch_mlp, folded norms, conv1d [C, K, 1], sidecar head) give the same bits
    a, b = results["hf-odd"], results["mlx-odd-sidecar"]
    t.ok(np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1]),
         f"{fam} hf-odd and mlx-odd-sidecar (same weights): trunk and MTP logits bit for bit")

    # what inspect reports is what the config says: the per-sequence recurrent state of the DeltaNet
    # layers, keys and values only for the full-attention layers and the MTP layer
    lin = LINEAR[fam]
    P.want_fields(f"{fam}-hf-odd", inspect(os.path.join(tmp, f"{fam}-hf-odd")), {
        "family": fam, "layout": "hf", "mtp": "inline", "attention": "hybrid",
        "layer_types": {"linear_attention": lin, "full_attention": 4 - lin}, "linear_state_bytes": lin * STATE,
        "kv_bytes_per_token": (4 - lin + 1) * KV, "rotary_dim": 8, "router": "softmax", "norm_topk_prob": True,
        "dense_layers": 0, "mtp_concat": "embed,hidden", "mtp_recycle": "post-norm", "mtp_zero_pos0": False,
        "mtp_embed": "trunk", "mtp_head": "trunk"})
    P.want_fields(f"{fam}-mlx-q4-g64-wide", inspect(os.path.join(tmp, f"{fam}-mlx-q4-g64-wide")),
                {"family": fam, "layout": "mlx", "mtp": "sidecar", "attention": "hybrid",
                 "linear_state_bytes": lin * STATE})

    # drafts accepted: a head that mostly agrees with its trunk (make_random_qwen35.py --agree; the
    # reference's teacher-forced head agrees on every row), so verify keeps drafted rows, the
    # recurrent states advance past accepted drafts and stop exactly at the last accepted one
    d = P.gen(f"{fam}-agree", ["--family", fam, "--layout", "hf", "--agree", "0.05", "--seed", str(31 + fi)])
    ar = P.greedy_ar(d, ids(prompt), 32)
    ref = P.greedy_reference(d, ids(prompt), 32)
    t.ok(ar == ref, f"{fam}-agree: greedy continuation equals the reference", f"engine {ar}\nreference {ref}")
    acc = P.greedy_mtp(f"{fam}-agree", d, ids(prompt), ar, 32)
    t.ok(acc >= 64, f"{fam}-agree: drafts accepted ({acc} over draft 1, 2, 3, 4, auto at 1 and 2 threads)")

    # nextn convert: HF bf16 -> MLX 4-bit g32 trunk + sidecar head, compared with the reference
    src = os.path.join(tmp, f"{fam}-hf-shards")
    conv = os.path.join(tmp, f"{fam}-conv-q4")
    nextn("convert", src, conv, "--bits", 4, "--group-size", 32, "--quiet")
    t.ok(os.path.exists(os.path.join(conv, "model-mtp.safetensors")),
         f"{fam} convert writes the head to model-mtp.safetensors")
    P.want_fields(f"{fam}-conv-q4", inspect(conv), {"family": fam, "attention": "hybrid", "mtp": "sidecar"})
    P.check_model(f"{fam}-convert-q4", conv, tokens, prompt)

    # nextn graft: an MLX-quantized trunk without its head (as mlx-lm writes it) + the HF head
    base = P.gen(f"{fam}-mlx-headless", ["--family", fam, "--layout", "mlx", "--mtp", "none", "--quant", "4:32",
                                       "--seed", str(200 + 20 * fi)])
    t.ok(inspect(base)["mtp"].startswith("none"), f"{fam}-mlx-headless: no MTP head")
    grafted = os.path.join(tmp, f"{fam}-grafted")
    nextn("graft", base, os.path.join(tmp, f"{fam}-hf-odd"), "-o", grafted, "--quiet")
    t.ok(inspect(grafted)["mtp"] == "sidecar", f"{fam} graft adds the HF head as a sidecar")
    P.check_model(f"{fam}-graft-q4+hf-head", grafted, tokens, prompt)

shutil.rmtree(tmp, ignore_errors=True)
t.done()
