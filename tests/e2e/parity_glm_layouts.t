#!/usr/bin/python3
"""glm4_moe end-to-end parity across layouts (a second suite beside parity_glm.t, built on other
seeds and shapes): the C engine against the independent reference forward (tools/ref/glm4_moe.py) on random GLM
checkpoints (tests/ref/make_random_glm.py) of deliberately odd shapes in the HF and the MLX layout:
max |dlogit| small relative to the logit range for the trunk and the teacher-forced MTP layer,
identical greedy continuations (plain and speculative), bit-identical logits for the HF and the
MLX bf16 layout of one seed, and an MLX checkpoint without its MTP layer loading headless.

The MTP rows follow vLLM: the embedding at position 0 is zeroed (reference --mtp-zero-pos0 on).

  NEXTN=build/nextn prove -v tests/e2e/parity_glm_layouts.t
"""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tap import PY, Tap, nextn, run, scratch  # noqa: E402

t = Tap()
TOL = 2e-3  # of the logit range; both sides compute in f32 from the same bf16 weights
tmp = scratch(prefix="nextn-parity-glm-")
WIDE = ["--hidden", "256", "--expert-dim", "128", "--inter", "256"]

RANDOM = [
    # GLM-4.5 rules: qk-norm, q/k/v biases, 2 dense layers, 6 heads over 2 kv heads, 16 of 32 dims rotated
    ("hf-odd", ["--layout", "hf", "--seed", "1"]),
    # GLM-4.5-Air rules, 3 of 6 expert groups, the MTP layer's own embedding and head, 3 shards
    ("hf-air-groups-ownhead", ["--layout", "hf", "--preset", "air", "--experts", "12", "--n-group", "6",
                               "--topk-group", "3", "--mtp-head", "own", "--shards", "3", "--seed", "2"]),
    # no attention bias, a quarter of the head rotated, 5 heads over 1 kv head, 2 of 4 groups, top-4
    ("hf-nobias-rot25", ["--layout", "hf", "--attn-bias", "0", "--partial-rotary", "0.25", "--heads", "5",
                         "--kv-heads", "1", "--experts", "16", "--n-group", "4", "--topk-group", "2", "--topk", "4",
                         "--seed", "3"]),
    ("mlx-sidecar", ["--layout", "mlx", "--mtp", "sidecar", "--seed", "4"]),
    ("mlx-sidecar-hf", ["--layout", "mlx", "--mtp", "sidecar-hf", "--mtp-head", "own", "--seed", "5"]),
    ("mlx-headless", ["--layout", "mlx", "--seed", "6"]),
    ("mlx-q4-g64", ["--layout", "mlx", "--mtp", "sidecar", "--quant", "4:64", *WIDE, "--seed", "7"]),
    ("mlx-q3-g32", ["--layout", "mlx", "--mtp", "sidecar", "--quant", "3:32", "--seed", "8"]),
    ("mlx-q8-g64-air", ["--layout", "mlx", "--mtp", "sidecar", "--preset", "air", "--quant", "8:64", *WIDE,
                        "--seed", "9"]),
]


def compare(name, a, b):
    return t.logits_close(name, a, b, TOL)


def check_model(name, mdir, tokens, has_mtp):
    ids = ",".join(map(str, tokens))
    ref_l, ref_m = os.path.join(tmp, name + "-ref.npy"), os.path.join(tmp, name + "-refm.npy")
    eng_l, eng_m = os.path.join(tmp, name + "-eng.npy"), os.path.join(tmp, name + "-engm.npy")
    rargs = [PY, "tools/ref/glm4_moe.py", "--model", mdir, "--tokens", ids, "--logits", ref_l]
    eargs = ["eval", "-m", mdir, "--tokens", ids, "--logits", eng_l, "--act-bits", 16]
    if has_mtp:
        rargs += ["--mtp-logits", ref_m]
        eargs += ["--mtp-logits", eng_m]
    run(rargs)
    nextn(*eargs)
    compare(f"{name} trunk logits", np.load(eng_l), np.load(ref_l))
    if has_mtp:
        compare(f"{name} MTP logits", np.load(eng_m), np.load(ref_m))
    pids = ",".join(map(str, tokens[:5]))
    n = 24
    ref = run([PY, "tools/ref/glm4_moe.py", "--model", mdir, "--tokens", pids, "--greedy", str(n)]).stdout.split()
    ar = nextn("run", "-m", mdir, "--prompt-tokens", pids, "-n", n, "--print-ids", "--ignore-eos", "--draft", 0,
               "--quiet", "--act-bits", 16).stdout.split()
    t.ok(ar == ref, f"{name}: greedy continuation equals the reference", f"engine {ar}\nreference {ref}")
    if has_mtp:
        for k in ("1", "3", "auto"):
            out = nextn("run", "-m", mdir, "--prompt-tokens", pids, "-n", n, "--print-ids", "--ignore-eos",
                        "--draft", k, "--quiet", "--act-bits", 16).stdout.split()
            t.ok(out == ar, f"{name}: greedy MTP (draft {k}) equals greedy AR", f"mtp {out}\nar {ar}")
    return np.load(eng_l)


tokens = np.random.default_rng(7).integers(0, 419, size=17).tolist()
logits = {}
for name, gen_args in RANDOM:
    d = os.path.join(tmp, name)
    run([PY, "tests/ref/make_random_glm.py", *gen_args, "--out", d])
    info = nextn("inspect", "-m", d).stdout
    headless = name == "mlx-headless"
    t.ok(("headless" in info) == headless, f"{name}: inspect reports the MTP layer", info)
    logits[name] = check_model(name, d, tokens, not headless)

# one seed, two layouts: the same weights give the same bits
d = os.path.join(tmp, "hf-seed4")
run([PY, "tests/ref/make_random_glm.py", "--layout", "hf", "--seed", "4", "--out", d])
out = os.path.join(tmp, "hf-seed4.npy")
nextn("eval", "-m", d, "--tokens", ",".join(map(str, tokens)), "--logits", out, "--act-bits", 16)
t.ok(np.array_equal(np.load(out), logits["mlx-sidecar"]), "HF and MLX bf16 layouts of one seed: identical logits")
t.done()
