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
import json
import os
import re
import shutil
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from tap import PY, Tap, nextn, run, scratch  # noqa: E402

t = Tap()
TOL = 2e-3  # of the logit range; both sides compute in f32 from the same bf16 weights
tmp = scratch(prefix="nextn-parity-qwen35-")
REF = "tools/ref/qwen35.py"
GEN = "tests/ref/make_random_qwen35.py"
FAMILIES = ("qwen3_5_moe", "qwen3_next")
WIDE = ["--hidden", "256"]          # divisible by 64: the routers are quantized at 8 bits, group 64
DRAFTS = ("1", "2", "3", "4", "auto")
THREADS = ("1", "2")
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


def ids(tokens):
    return ",".join(map(str, tokens))


def run_ids(mdir, pids, n, draft, *extra):
    r = nextn("run", "-m", mdir, "--prompt-tokens", pids, "-n", n, "--print-ids", "--ignore-eos", "--draft", draft,
              "--act-bits", 16, *extra)
    return r.stdout.split(), r.stderr


def greedy_mtp(name, mdir, pids, ar, n):
    """Greedy AR at --threads 2 equals --threads 1 (ar); greedy MTP equals it at every draft length and
    thread count.  Returns the drafts accepted."""
    acc = 0
    for th in THREADS:
        out = run_ids(mdir, pids, n, 0, "--quiet", "--threads", th)[0]
        t.ok(out == ar, f"{name}: greedy AR at --threads {th} equals --threads 1", f"{out}\n{ar}")
        for k in DRAFTS:
            out, err = run_ids(mdir, pids, n, k, "--stats", "--threads", th)
            t.ok(out == ar, f"{name}: greedy MTP (draft {k}, --threads {th}) equals greedy AR", f"mtp {out}\nar {ar}")
            m = re.search(r"drafted (\d+), accepted (\d+)", err)
            acc += int(m.group(2)) if m else 0
    return acc


def decode_matches_prefill(name, mdir, prompt, gen):
    """Every token decoded after the prompt's prefill is, in one prefill over prompt + continuation,
    the top logit at its position up to the parity tolerance (ties may break either way)."""
    out = os.path.join(tmp, name + "-full.npy")
    nextn("eval", "-m", mdir, "--tokens", ids(prompt + gen), "--logits", out, "--act-bits", 16)
    lg = np.load(out)
    rows = lg[len(prompt) - 1:len(prompt) - 1 + len(gen)]
    picked = rows[np.arange(len(gen)), gen]
    gap = float((rows.max(-1) - picked).max())
    rng = float(lg.max() - lg.min())
    exact = int((rows.argmax(-1) == np.array(gen)).sum())
    t.ok(gap <= TOL * rng, f"{name}: decode after prefill picks one prefill's top logit ({exact}/{len(gen)} exact, "
         f"worst gap {gap:.2e} vs range {rng:.2f})")


def check_model(name, mdir, tokens, greedy_prompt, n=24):
    ref_l, ref_m = os.path.join(tmp, name + "-ref.npy"), os.path.join(tmp, name + "-refm.npy")
    eng_l, eng_m = os.path.join(tmp, name + "-eng.npy"), os.path.join(tmp, name + "-engm.npy")
    run([PY, REF, "--model", mdir, "--tokens", ids(tokens), "--logits", ref_l, "--mtp-logits", ref_m])
    nextn("eval", "-m", mdir, "--tokens", ids(tokens), "--logits", eng_l, "--mtp-logits", eng_m, "--act-bits", 16)
    t.logits_close(f"{name} trunk logits", np.load(eng_l), np.load(ref_l), TOL)
    t.logits_close(f"{name} MTP logits", np.load(eng_m), np.load(ref_m), TOL)
    pids = ids(greedy_prompt)
    ref = run([PY, REF, "--model", mdir, "--tokens", pids, "--greedy", str(n)]).stdout.split()
    ar = run_ids(mdir, pids, n, 0, "--quiet", "--threads", "1")[0]
    t.ok(ar == ref, f"{name}: greedy continuation equals the reference", f"engine {ar}\nreference {ref}")
    decode_matches_prefill(name, mdir, list(greedy_prompt), [int(x) for x in ar])
    greedy_mtp(name, mdir, pids, ar, n)
    return np.load(eng_l), np.load(eng_m)


def inspect(mdir):
    return json.loads(nextn("inspect", "-m", mdir, "--json").stdout)


def want_fields(name, info, want):
    got = {k: info.get(k) for k in want}
    t.ok(got == want, f"inspect {name}: " + ", ".join(sorted(want)), json.dumps({"got": got, "want": want}))


def gen(name, args):
    d = os.path.join(tmp, name)
    run([PY, GEN, *args, "--out", d])
    return d


rng = np.random.default_rng(38)
tokens = rng.integers(4, 419, size=19).tolist()
prompt = tokens[:6]

for fi, fam in enumerate(FAMILIES):
    results = {}
    for name, gen_args in cases(fam, 200 + 20 * fi):
        full = f"{fam}-{name}"
        results[name] = check_model(full, gen(full, gen_args), tokens, prompt)

    # the same weights in the HF layout (fused experts / projections, raw zero-centred norms, inline
    # head) and the MLX one (switch_mlp, folded norms, conv1d [C, K, 1], sidecar head) give the same bits
    a, b = results["hf-odd"], results["mlx-odd-sidecar"]
    t.ok(np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1]),
         f"{fam} hf-odd and mlx-odd-sidecar (same weights): trunk and MTP logits bit for bit")

    # what inspect reports is what the config says: the per-sequence recurrent state of the DeltaNet
    # layers, keys and values only for the full-attention layers and the MTP layer
    lin = LINEAR[fam]
    want_fields(f"{fam}-hf-odd", inspect(os.path.join(tmp, f"{fam}-hf-odd")), {
        "family": fam, "layout": "hf", "mtp": "inline", "attention": "hybrid",
        "layer_types": {"linear_attention": lin, "full_attention": 4 - lin}, "linear_state_bytes": lin * STATE,
        "kv_bytes_per_token": (4 - lin + 1) * KV, "rotary_dim": 8, "router": "softmax", "norm_topk_prob": True,
        "dense_layers": 0, "mtp_concat": "embed,hidden", "mtp_recycle": "post-norm", "mtp_zero_pos0": False,
        "mtp_embed": "trunk", "mtp_head": "trunk"})
    want_fields(f"{fam}-mlx-q4-g64-wide", inspect(os.path.join(tmp, f"{fam}-mlx-q4-g64-wide")),
                {"family": fam, "layout": "mlx", "mtp": "sidecar", "attention": "hybrid",
                 "linear_state_bytes": lin * STATE})

    # drafts accepted: a head that mostly agrees with its trunk (make_random_qwen35.py --agree; the
    # reference's teacher-forced head agrees on every row), so verify keeps drafted rows, the
    # recurrent states advance past accepted drafts and stop exactly at the last accepted one
    d = gen(f"{fam}-agree", ["--family", fam, "--layout", "hf", "--agree", "0.05", "--seed", str(31 + fi)])
    ar = run_ids(d, ids(prompt), 32, 0, "--quiet", "--threads", "1")[0]
    ref = run([PY, REF, "--model", d, "--tokens", ids(prompt), "--greedy", "32"]).stdout.split()
    t.ok(ar == ref, f"{fam}-agree: greedy continuation equals the reference", f"engine {ar}\nreference {ref}")
    acc = greedy_mtp(f"{fam}-agree", d, ids(prompt), ar, 32)
    t.ok(acc >= 64, f"{fam}-agree: drafts accepted ({acc} over draft 1, 2, 3, 4, auto at 1 and 2 threads)")

    # nextn convert: HF bf16 -> MLX 4-bit g32 trunk + sidecar head, compared with the reference
    src = os.path.join(tmp, f"{fam}-hf-shards")
    conv = os.path.join(tmp, f"{fam}-conv-q4")
    nextn("convert", src, conv, "--bits", 4, "--group-size", 32, "--quiet")
    t.ok(os.path.exists(os.path.join(conv, "model-mtp.safetensors")),
         f"{fam} convert writes the head to model-mtp.safetensors")
    want_fields(f"{fam}-conv-q4", inspect(conv), {"family": fam, "attention": "hybrid", "mtp": "sidecar"})
    check_model(f"{fam}-convert-q4", conv, tokens, prompt)

    # nextn graft: an MLX-quantized trunk without its head (as mlx-lm writes it) + the HF head
    base = gen(f"{fam}-mlx-headless", ["--family", fam, "--layout", "mlx", "--mtp", "none", "--quant", "4:32",
                                       "--seed", str(200 + 20 * fi)])
    t.ok(inspect(base)["mtp"].startswith("none"), f"{fam}-mlx-headless: no MTP head")
    grafted = os.path.join(tmp, f"{fam}-grafted")
    nextn("graft", base, os.path.join(tmp, f"{fam}-hf-odd"), "-o", grafted, "--quiet")
    t.ok(inspect(grafted)["mtp"] == "sidecar", f"{fam} graft adds the HF head as a sidecar")
    check_model(f"{fam}-graft-q4+hf-head", grafted, tokens, prompt)

shutil.rmtree(tmp, ignore_errors=True)
t.done()
