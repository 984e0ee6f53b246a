#!/usr/bin/python3
"""Speculative sampling is exact: the joint distribution of the next three tokens drawn with MTP
speculative decoding (residual and match rules, k = 1..3 and auto; match draws every token by an
exponential race keyed to its position, plain decoding included) equals the one drawn by plain
autoregressive sampling, with temperature, top-k, top-p, min-p and a repetition penalty active.
Two-sample chi-square homogeneity tests on thousands of independent continuations of a
concentrated code prompt; a negative control (a different temperature) shows the test has power."""
import collections
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from chisq import homogeneity_p  # noqa: E402
from tap import Tap, nextn  # noqa: E402

t = Tap()
N = int(os.environ.get("NEXTN_DIST_SAMPLES", "2500"))
ALPHA = 1e-3
PROMPT = "#include <stdio.h>\n\nint main(int argc, char **argv)\n{\n"
BASE = ["--temp", "0.9", "--top-k", "6", "--top-p", "0.95", "--min-p", "0.02", "--repeat-penalty", "1.3"]


def draw(extra, seed, base=BASE):
    out = nextn("run", "-p", PROMPT, "-n", 3, "--ignore-eos", "--n-samples", N, "--seed", seed, "--quiet",
                *base, *extra).stdout
    rows = [tuple(l.split()) for l in out.splitlines() if l.strip()]
    assert len(rows) == N, f"expected {N} samples, got {len(rows)}"
    return collections.Counter(rows)


ar = draw(["--draft", "0"], 1)
t.note(f"{len(ar)} distinct 3-token continuations; top: {ar.most_common(3)}")
t.ok(len(ar) >= 4, "the sampled distribution is not degenerate")

cases = [
    ("residual, k=1", ["--draft", "1", "--verify", "residual"]),
    ("residual, k=2", ["--draft", "2", "--verify", "residual"]),
    ("residual, k=3", ["--draft", "3", "--verify", "residual"]),
    ("match, k=2", ["--draft", "2", "--verify", "match"]),
    ("match, plain decoding (each token drawn by its position's race)", ["--draft", "0", "--verify", "match"]),
    ("match, auto", ["--draft", "auto", "--verify", "match"]),
    ("residual, auto", ["--draft", "auto"]),
]
for i, (name, extra) in enumerate(cases):
    got = draw(extra, 1000003 * (i + 1))
    p, chi2, df, cells = homogeneity_p(ar, got)
    t.ok(p > ALPHA, f"{name}: same distribution as AR (chi2 {chi2:.1f}, df {df}, p {p:.3g})")

# negative control: the test must notice a slightly different sampler
other = draw(["--draft", "0"], 77, base=["--temp", "1.2"] + BASE[2:])
p, chi2, df, cells = homogeneity_p(ar, other)
t.ok(p < ALPHA, f"negative control (temperature 1.2 vs 0.9) is detected (chi2 {chi2:.1f}, df {df}, p {p:.3g})")

# the speculative runs really speculated
st = nextn("run", "-p", PROMPT, "-n", 48, "--ignore-eos", "--seed", 5, "--stats", "--draft", "2", *BASE).stderr
acc = [l for l in st.splitlines() if l.startswith("drafts")]
t.ok(acc and " accepted 0," not in acc[0], "drafts are accepted at temperature > 0", st)
t.done()
