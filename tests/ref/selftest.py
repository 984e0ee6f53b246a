#!/usr/bin/python3
"""Self-test of the python reference helpers (run: /usr/bin/python3 tests/ref/selftest.py).

* MLX bit packing reproduces the reference vectors of docs/design.md §5.3;
* random checkpoints with the same seed give bit-identical reference outputs in the
  Tencent layout, the MLX layout (unaligned tensor data), with a Tencent-named
  model-mtp.safetensors sidecar + sharded index, and with legacy config aliases;
* MLX 8-bit quantized checkpoints stay close to the unquantized ones;
* the numpy reference and the independent PyTorch training model agree on a random
  odd-shaped checkpoint (GQA 3, top-3 of 6 experts, 2 dense layers, MTP with 12 experts).
"""
import os
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "tools", "train"))
from safetensors_io import pack_bits  # noqa: E402
from model import Reference  # noqa: E402

SPEC = {2: "e4e4e4e4 e4e4e4e4", 3: "88fac688 c688fac6 fac688fa",
        4: "76543210 fedcba98 76543210 fedcba98",
        5: "8a418820 c5a92839 ca307b9a 38bdab49 ffbbcdeb",
        6: "440c2040 a2481c61 3ce34c2c 544d2450 a6585d65 7de75c6d",
        8: "03020100 07060504 0b0a0908 0f0e0d0c 13121110 17161514 1b1a1918 1f1e1d1c"}


def gen(tmp, name, *args):
    out = os.path.join(tmp, name)
    subprocess.check_call([sys.executable, os.path.join(HERE, "make_random_ckpt.py"), "--out", out, *args],
                          stderr=subprocess.DEVNULL)
    return out


def main():
    for b, s in SPEC.items():
        got = " ".join("%08x" % w for w in pack_bits((np.arange(32) % (1 << b))[None], b)[0])
        assert got == s, (b, got, s)
    print("pack vectors ok")
    toks = [1, 5, 77, 300, 12, 418, 3, 9, 100, 250, 7, 7, 7]
    with tempfile.TemporaryDirectory() as tmp:
        base = Reference(gen(tmp, "t", "--layout", "tencent", "--seed", "3")).forward(toks)
        for name, args in (("m", ["--layout", "mlx"]),
                           ("ms", ["--layout", "mlx", "--mtp", "sidecar-tencent", "--shards", "2"]),
                           ("mss", ["--layout", "mlx", "--mtp", "sidecar"]),
                           ("tl", ["--layout", "tencent", "--legacy-config", "--shards", "3"])):
            r = Reference(gen(tmp, name, *args, "--seed", "3")).forward(toks)
            assert np.array_equal(r[0], base[0]) and np.array_equal(r[1], base[1]), name
        print("layouts identical ok; logit range %.1f..%.1f" % (base[0].min(), base[0].max()))
        q = Reference(gen(tmp, "q8", "--layout", "mlx", "--quant", "8:32", "--seed", "3")).forward(toks)
        agree = (q[0].argmax(-1) == base[0].argmax(-1)).mean()
        print("8-bit agreement of trunk argmax %.2f, max |dlogit| %.3f" % (agree, np.abs(q[0] - base[0]).max()))
        assert agree >= 0.75
        # torch training model vs numpy reference, MTP with a different expert count
        d = gen(tmp, "odd", "--layout", "tencent", "--seed", "4", "--mtp-experts", "12")
        ref = Reference(d).forward(toks)
        try:
            import json
            import torch
            import export
            from model import Cfg, HyV3
        except ImportError:
            print("torch not available: skipped torch parity")
            return
        m = HyV3(Cfg(json.load(open(os.path.join(d, "config.json")))))
        export.load_into(m, d)
        with torch.no_grad():
            lg, ml = m(torch.tensor([toks]), torch.tensor([toks[1:] + [0]]))
        e1 = np.abs(lg[0].numpy() - ref[0]).max()
        e2 = np.abs(ml[0, :-1].numpy() - ref[1]).max()
        print("torch vs numpy: trunk %.2e, mtp %.2e" % (e1, e2))
        assert e1 < 1e-3 and e2 < 1e-3
    print("selftest ok")


if __name__ == "__main__":
    main()
