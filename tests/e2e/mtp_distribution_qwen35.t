#!/usr/bin/python3
"""Speculative sampling is exact on the Gated-DeltaNet hybrids, whose rejected drafts must take the
recurrent states back: on random qwen3_5_moe and qwen3_next checkpoints whose heads mostly agree
with their trunks (tests/ref/make_random_qwen35.py --agree), greedy MTP equals greedy AR at
k = 1..3 and auto with drafts accepted and rejected, and the joint distribution of the next three
tokens under MTP speculative sampling (residual and match rules, fixed k and auto) equals plain
autoregressive sampling's at two temperatures with top-k, top-p, min-p and a repetition penalty
active; a negative control shows the test has power (tests/e2e/dist_run.py)."""
import os
import shutil
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from dist_run import FAMILY_CASES, greedy, sampled  # noqa: E402
from tap import PY, Tap, run, scratch  # noqa: E402

t = Tap()
tmp = scratch(prefix="nextn-dist-qwen35-")
MODELS = {
    "qwen3_5_moe": ["--family", "qwen3_5_moe"],
    "qwen3_next": ["--family", "qwen3_next"],
}
for i, (label, args) in enumerate(MODELS.items()):
    model = os.path.join(tmp, label)
    run([PY, "tests/ref/make_random_qwen35.py", "--layout", "hf", *args, "--agree", "0.05", "--seed", str(5 + i),
         "--out", model])
    greedy(t, model, label)
    sampled(t, model, label, FAMILY_CASES, ("0.9", "1.4"))

shutil.rmtree(tmp, ignore_errors=True)
t.done()
