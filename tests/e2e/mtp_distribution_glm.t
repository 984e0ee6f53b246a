#!/usr/bin/python3
"""Speculative sampling is exact on glm4_moe too: the joint distribution of the next three tokens
drawn with MTP speculative decoding (residual and match rules, k = 1..3 and auto) equals the one
drawn by plain autoregressive sampling, at three temperatures with top-k, top-p, min-p and a
repetition penalty active; a negative control shows the test has power. The checkpoint is a random
one whose head mostly agrees with its trunk (tests/ref/make_random_glm.py --agree), so the runs
tested at a fixed k accept some drafts and reject others, as counted from their own --stats; greedy
MTP equals greedy AR on it with drafts accepted."""
import collections
import os
import re
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from chisq import homogeneity_p  # noqa: E402
from tap import PY, Tap, nextn, run  # noqa: E402

t = Tap()
N = int(os.environ.get("NEXTN_DIST_SAMPLES", "2500"))
ALPHA = 1e-3
tmp = tempfile.mkdtemp(prefix="nextn-dist-glm-")
MODEL = os.path.join(tmp, "agree")
run([PY, "tests/ref/make_random_glm.py", "--layout", "hf", "--agree", "0.05", "--seed", "3", "--out", MODEL])
PROMPT = "5,17,33,101,7"
FILTERS = ["--top-k", "6", "--top-p", "0.95", "--min-p", "0.02", "--repeat-penalty", "1.3"]


def counts(stderr):
    """(drafted, accepted) summed over every --stats block of a run."""
    d = a = 0
    for m in re.finditer(r"drafted (\d+), accepted (\d+)", stderr):
        d, a = d + int(m.group(1)), a + int(m.group(2))
    return d, a


def draw(temp, extra, seed):
    r = nextn("run", "-m", MODEL, "--prompt-tokens", PROMPT, "-n", 3, "--ignore-eos", "--n-samples", N,
              "--seed", seed, "--quiet", "--stats", "--temp", temp, *FILTERS, *extra)
    rows = [tuple(l.split()) for l in r.stdout.splitlines() if l.strip()]
    assert len(rows) == N, f"expected {N} samples, got {len(rows)}"
    return collections.Counter(rows), counts(r.stderr)


# greedy: MTP equals AR, with drafts accepted and rejected
ar = nextn("run", "-m", MODEL, "--prompt-tokens", PROMPT, "-n", 48, "--print-ids", "--ignore-eos", "--draft", 0,
           "--quiet").stdout.split()
for k in ("1", "2", "3", "auto"):
    r = nextn("run", "-m", MODEL, "--prompt-tokens", PROMPT, "-n", 48, "--print-ids", "--ignore-eos", "--draft", k,
              "--stats")
    d, a = counts(r.stderr)
    t.ok(r.stdout.split() == ar, f"greedy MTP (draft {k}) equals greedy AR", f"mtp {r.stdout}\nar {ar}")
    if k != "auto":
        t.ok(0 < a < d, f"greedy draft {k}: drafts accepted and rejected ({a} of {d})")

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
ars = {}
for ti, (temp, cases) in enumerate(CASES.items()):
    ar, _ = draw(temp, ["--draft", "0"], 1 + ti)
    ars[temp] = ar
    t.ok(len(ar) >= 4, f"temperature {temp}: the sampled distribution is not degenerate ({len(ar)} distinct)",
         str(ar.most_common(5)))
    for i, (name, extra) in enumerate(cases):
        got, (d, a) = draw(temp, extra, 1000003 * (i + 1) + 7919 * ti)
        p, chi2, df, cells = homogeneity_p(ar, got)
        t.ok(p > ALPHA, f"temperature {temp}, {name}: same distribution as AR (chi2 {chi2:.1f}, df {df}, p {p:.3g})")
        # auto picks k from measured costs and may not draft at all on a busy machine
        if extra[extra.index("--draft") + 1] not in ("0", "auto"):
            t.ok(0 < a < d, f"temperature {temp}, {name}: drafts accepted and rejected ({a} of {d})")

# negative control: the test must notice a different sampler (top-k 6 and top-p keep the
# sampled set small, so temperatures need to be further apart than on the text model)
p, chi2, df, cells = homogeneity_p(ars["0.9"], ars["1.4"])
t.ok(p < ALPHA, f"negative control (temperature 1.4 vs 0.9) is detected (chi2 {chi2:.1f}, df {df}, p {p:.3g})")

shutil.rmtree(tmp, ignore_errors=True)
t.done()
