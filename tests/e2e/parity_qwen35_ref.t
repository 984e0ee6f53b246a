#!/usr/bin/python3
"""The Gated-DeltaNet hybrid reference checks itself before the engine is compared with it:
tests/ref/selftest_qwen35.py (the delta rule on hand numbers, the token recurrence against the
chunked algorithm, Qwen3-Next's fused projections, refused configs, layout bit-identity and
quantization error for qwen3_5_moe and qwen3_next, prefill then decode against one prefill, numpy
against PyTorch).  No engine involved.

  prove -v tests/e2e/parity_qwen35_ref.t
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tap import PY, Tap, run  # noqa: E402

t = Tap()
r = run([PY, "tests/ref/selftest_qwen35.py"], check=False)
for line in r.stdout.splitlines():
    t.note(line)
t.ok(r.returncode == 0 and r.stdout.rstrip().endswith("selftest_qwen35 ok"),
     "tests/ref/selftest_qwen35.py passes", r.stderr[-3000:])
t.done()
