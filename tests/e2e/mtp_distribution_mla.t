#!/usr/bin/python3
"""Speculative sampling is exact on the latent-attention families: on random deepseek_v3 (YaRN,
group-limited routing) and glm4_moe_lite (no q LoRA)
checkpoints whose heads mostly agree with their trunks (tests/ref/make_random_mla.py --agree),
greedy MTP equals greedy AR at k = 1..3 and auto with drafts accepted and rejected, and the joint
distribution of the next three tokens under MTP speculative sampling (residual and match rules,
fixed k and auto) equals plain autoregressive sampling's at two temperatures with top-k, top-p,
min-p and a repetition penalty active; a negative control shows the test has power
(tests/e2e/dist_run.py)."""
import os
import shutil
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from dist_run import FAMILY_CASES, greedy, sampled  # noqa: E402
from tap import PY, Tap, run, scratch  # noqa: E402

t = Tap()
tmp = scratch(prefix="nextn-dist-mla-")
MODELS = {
    "deepseek_v3": ["--family", "deepseek_v3", "--yarn", "8", "--n-group", "4", "--topk-group", "2", "--experts", "12"],
    "glm4_moe_lite": ["--family", "glm4_moe_lite", "--q-lora-rank", "0"],
}
for i, (label, args) in enumerate(MODELS.items()):
    model = os.path.join(tmp, label)
    run([PY, "tests/ref/make_random_mla.py", "--layout", "hf", *args, "--agree", "0.05", "--seed", str(3 + i),
         "--out", model])
    greedy(t, model, label)
    sampled(t, model, label, FAMILY_CASES, ("0.9", "1.4"))

shutil.rmtree(tmp, ignore_errors=True)
t.done()
