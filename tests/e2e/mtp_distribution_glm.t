#!/usr/bin/python3
"""Speculative sampling is exact on glm4_moe too: the joint distribution of the next three tokens
drawn with MTP speculative decoding (residual and match rules, k = 1..3 and auto) equals the one
drawn by plain autoregressive sampling, at three temperatures with top-k, top-p, min-p and a
repetition penalty active; a negative control shows the test has power. The checkpoint is a random
one whose head mostly agrees with its trunk (tests/ref/make_random_glm.py --agree), so the runs
tested at a fixed k accept some drafts and reject others, as counted from their own --stats; greedy
MTP equals greedy AR on it with drafts accepted."""
import os
import shutil
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from dist_run import greedy, sampled  # noqa: E402
from tap import PY, Tap, run, scratch  # noqa: E402

t = Tap()
tmp = scratch(prefix="nextn-dist-glm-")
MODEL = os.path.join(tmp, "agree")
run([PY, "tests/ref/make_random_glm.py", "--layout", "hf", "--agree", "0.05", "--seed", "3", "--out", MODEL])
greedy(t, MODEL, "glm4_moe")

CASES = {
    "0.9": [("residual, k=1", ["--draft", "1", "--verify", "residual"]),
            ("residual, k=2", ["--draft", "2", "--verify", "residual"]),
            ("residual, k=3", ["--draft", "3", "--verify", "residual"]),
            ("match, k=2", ["--draft", "2", "--verify", "match"]),
            ("match, plain decoding", ["--draft", "0", "--verify", "match"]),
            ("match, auto", ["--draft", "auto", "--verify", "match"]),
            ("residual, auto", ["--draft", "auto"])],
    "0.5": [("residual, k=2", ["--draft", "2", "--verify", "residual"]),
            ("match, k=3", ["--draft", "3", "--verify", "match"])],
    "1.4": [("residual, k=3", ["--draft", "3", "--verify", "residual"]),
            ("match, k=1", ["--draft", "1", "--verify", "match"])],
}
# the negative control: top-k 6 and top-p keep the sampled set small, so temperatures need to be
# further apart than on the text model
sampled(t, MODEL, "glm4_moe", CASES, ("0.9", "1.4"))

shutil.rmtree(tmp, ignore_errors=True)
t.done()
