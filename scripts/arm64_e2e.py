#!/usr/bin/python3
"""End-to-end checks of an AArch64 build (build-arm64/nextn) run under qemu-aarch64 with the CPU
model in $QEMU_CPU: logits parity with the PyTorch reference on random checkpoints (float and
4-bit), greedy MTP equal to greedy AR on int8 and int16 activations and an f16 KV cache, the
same logits at 1 and 3 threads, and `nextn bench` running with the kernel table the dispatcher
should pick for that CPU ($EXPECT_ISA). A subset sized for emulation (`make test-arm64`); with
ARM64_E2E_QUICK=1, the 4-bit model alone on default activations (a third CPU model's dispatch)."""
import os
import re
import shutil
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "e2e"))
from tap import PY, ROOT, Tap, run  # noqa: E402

CPU = os.environ.get("QEMU_CPU", "max")
QUICK = os.environ.get("ARM64_E2E_QUICK") == "1"
EXPECT = os.environ.get("EXPECT_ISA", "")
BIN = os.path.join(ROOT, "build-arm64", "nextn")
TOL = 2e-3  # of the logit range, as tests/e2e/parity.t

t = Tap()
tmp = tempfile.mkdtemp(prefix="nextn-arm64-")


def nx(*args, env=None):
    return run(["qemu-aarch64", "-cpu", CPU, BIN, *map(str, args)], env=env)


MODELS = [
    ("tencent-odd", ["--layout", "tencent", "--mtp", "inline", "--seed", "1"]),
    ("mlx-q4-g64", ["--layout", "mlx", "--mtp", "sidecar", "--hidden", "256", "--expert-dim", "128", "--inter", "256",
                    "--quant", "4:64", "--mtp-quant", "8:64", "--seed", "10"]),
    ("mlx-q3-g32", ["--layout", "mlx", "--mtp", "inline", "--quant", "3:32", "--seed", "6"]),
]
ids = ",".join(map(str, range(3, 20)))
for name, gen in MODELS[1:2] if QUICK else MODELS:
    d = os.path.join(tmp, name)
    run([PY, "tests/ref/make_random_ckpt.py", *gen, "--out", d])
    ref_l, ref_m = os.path.join(tmp, name + "-ref.npy"), os.path.join(tmp, name + "-refm.npy")
    run([PY, "tools/train/reference.py", "--model", d, "--tokens", ids, "--logits", ref_l, "--mtp-logits", ref_m])
    eng_l, eng_m = os.path.join(tmp, name + "-eng.npy"), os.path.join(tmp, name + "-engm.npy")
    nx("eval", "-m", d, "--tokens", ids, "--logits", eng_l, "--mtp-logits", eng_m, "--act-bits", 16)
    t.logits_close(f"{CPU}: {name} trunk logits", np.load(eng_l), np.load(ref_l), TOL)
    t.logits_close(f"{CPU}: {name} MTP logits", np.load(eng_m), np.load(ref_m), TOL)
    # the numerics contract: greedy MTP == greedy AR, at the default (int8) activations and at 16
    for extra in ([],) if QUICK else ([], ["--act-bits", 16], ["--kv-type", "f16"]):
        base = ["run", "-m", d, "--prompt-tokens", ids, "-n", 16, "--print-ids", "--ignore-eos", "--quiet", *extra]
        ar = nx(*base, "--draft", 0).stdout.split()
        for k in ("1", "3"):
            out = nx(*base, "--draft", k).stdout.split()
            t.ok(out == ar and len(ar) == 16, f"{CPU}: {name} {' '.join(map(str, extra)) or 'default'}: greedy MTP "
                 f"(draft {k}) equals greedy AR", f"mtp {out}\nar {ar}")

# thread invariance (the pool's waits and the split of rows): 1 and 3 threads, the same bits
d = os.path.join(tmp, "mlx-q4-g64")
by_t = {}
for th in (1, 3):
    lt = os.path.join(tmp, f"t{th}.npy")
    nx("eval", "-m", d, "-t", th, "--tokens", ids, "--logits", lt)
    by_t[th] = np.load(lt)
t.ok(np.array_equal(by_t[1], by_t[3]), f"{CPU}: 1 and 3 threads give the same logits bit for bit")

# every table this CPU runs gives the reference's logits (int16 activations)
ref_l = os.path.join(tmp, "mlx-q4-g64-ref.npy")
for isa in () if QUICK else ("ref", "neon", "neondot", "neoni8mm"):
    out = os.path.join(tmp, f"isa-{isa}.npy")
    r = run(["qemu-aarch64", "-cpu", CPU, BIN, "eval", "-m", d, "--tokens", ids, "--logits", out, "--act-bits", "16"],
            env=dict(os.environ, NX_ISA=isa))
    t.logits_close(f"{CPU}: mlx-q4-g64 with NX_ISA={isa}", np.load(out), np.load(ref_l), TOL)

# `nextn bench` runs unchanged and names the table the dispatcher chose
b = nx("bench", "-m", d, "--prompt-tokens", ids, "-n", 8, "--modes", "ar,2")
m = re.search(r"\| isa (\S+)", b.stdout)
t.ok(m is not None and m.group(1) == EXPECT and "mode=ar tok_s=" in b.stdout, f"{CPU}: nextn bench runs on the {EXPECT or '?'} table",
     b.stdout + b.stderr)

shutil.rmtree(tmp)
t.done()
