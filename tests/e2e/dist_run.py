"""The exactness check of speculative sampling on one random checkpoint, shared by the family
tests (mtp_distribution_glm.t, _mla.t, _qwen35.t): greedy MTP equals greedy AR with drafts
accepted and rejected; then, at each temperature with top-k, top-p, min-p and a repetition
penalty active, the joint distribution of the next three tokens under every listed MTP mode
(residual and match rules, fixed k and auto) equals plain autoregressive sampling's
(chi-square homogeneity), each fixed-k run accepting some drafts and rejecting others as its own
--stats count them; a negative control (two temperatures) shows the test has power."""
import collections
import os
import re

from chisq import homogeneity_p
from tap import nextn

N = int(os.environ.get("NEXTN_DIST_SAMPLES", "2500"))
ALPHA = 1e-3
PROMPT = "5,17,33,101,7"
FILTERS = ["--top-k", "6", "--top-p", "0.95", "--min-p", "0.02", "--repeat-penalty", "1.3"]
# The modes per temperature a family after GLM's is checked in (mtp_distribution_glm.t keeps its
# longer list): both rules, fixed k and auto.
FAMILY_CASES = {
    "0.9": [("residual, k=1", ["--draft", "1", "--verify", "residual"]),
            ("residual, k=3", ["--draft", "3", "--verify", "residual"]),
            ("match, k=2", ["--draft", "2", "--verify", "match"]),
            ("residual, auto", ["--draft", "auto"])],
    "1.4": [("residual, k=2", ["--draft", "2", "--verify", "residual"]),
            ("match, k=1", ["--draft", "1", "--verify", "match"])],
}


def counts(stderr):
    """(drafted, accepted) summed over every --stats block of a run."""
    d = a = 0
    for m in re.finditer(r"drafted (\d+), accepted (\d+)", stderr):
        d, a = d + int(m.group(1)), a + int(m.group(2))
    return d, a


def draw(model, temp, extra, seed):
    r = nextn("run", "-m", model, "--prompt-tokens", PROMPT, "-n", 3, "--ignore-eos", "--n-samples", N,
              "--seed", seed, "--quiet", "--stats", "--temp", temp, *FILTERS, *extra)
    rows = [tuple(l.split()) for l in r.stdout.splitlines() if l.strip()]
    assert len(rows) == N, f"expected {N} samples, got {len(rows)}"
    return collections.Counter(rows), counts(r.stderr)


def greedy(t, model, label):
    ar = nextn("run", "-m", model, "--prompt-tokens", PROMPT, "-n", 48, "--print-ids", "--ignore-eos", "--draft", 0,
               "--quiet").stdout.split()
    for k in ("1", "2", "3", "auto"):
        r = nextn("run", "-m", model, "--prompt-tokens", PROMPT, "-n", 48, "--print-ids", "--ignore-eos", "--draft", k,
                  "--stats")
        d, a = counts(r.stderr)
        t.ok(r.stdout.split() == ar, f"{label}: greedy MTP (draft {k}) equals greedy AR", f"mtp {r.stdout}\nar {ar}")
        if k != "auto":
            t.ok(0 < a < d, f"{label}: greedy draft {k}: drafts accepted and rejected ({a} of {d})")


def sampled(t, model, label, cases, control):
    """cases: {temperature: [(name, extra options)]}; control: the two temperatures compared last."""
    ars = {}
    for ti, (temp, runs) in enumerate(cases.items()):
        ar, _ = draw(model, temp, ["--draft", "0"], 1 + ti)
        ars[temp] = ar
        t.ok(len(ar) >= 4, f"{label}: temperature {temp}: the sampled distribution is not degenerate "
             f"({len(ar)} distinct)", str(ar.most_common(5)))
        for i, (name, extra) in enumerate(runs):
            got, (d, a) = draw(model, temp, extra, 1000003 * (i + 1) + 7919 * ti)
            p, chi2, df, cells = homogeneity_p(ar, got)
            t.ok(p > ALPHA, f"{label}: temperature {temp}, {name}: same distribution as AR "
                 f"(chi2 {chi2:.1f}, df {df}, p {p:.3g})")
            # auto picks k from measured costs and may not draft at all on a busy machine
            if extra[extra.index("--draft") + 1] not in ("0", "auto"):
                t.ok(0 < a < d, f"{label}: temperature {temp}, {name}: drafts accepted and rejected ({a} of {d})")
    a, b = control
    p, chi2, df, cells = homogeneity_p(ars[a], ars[b])
    t.ok(p < ALPHA, f"{label}: negative control (temperature {b} vs {a}) is detected (chi2 {chi2:.1f}, df {df}, "
         f"p {p:.3g})")
