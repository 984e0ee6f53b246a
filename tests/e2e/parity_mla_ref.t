#!/usr/bin/python3
"""The MLA reference checks itself before the engine is compared with it: tests/ref/selftest_mla.py
(interleaved RoPE and YaRN on hand-computed numbers, refused configs, mlx-lm's kv_b_proj split,
absorbed vs naive attention, layout bit-identity and quantization error for both families, numpy vs
PyTorch written the transformers way).  No engine involved.

  prove -v tests/e2e/parity_mla_ref.t
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tap import PY, Tap, run  # noqa: E402

t = Tap()
r = run([PY, "tests/ref/selftest_mla.py"], check=False)
for line in r.stdout.splitlines():
    t.note(line)
t.ok(r.returncode == 0 and r.stdout.rstrip().endswith("selftest_mla ok"),
     "tests/ref/selftest_mla.py passes", r.stderr[-3000:])
t.done()
