#!/usr/bin/python3
"""The live loop does not starve the head: on the default model, greedy speculative decoding
(k = 1) accepts exactly the drafts that the teacher-forced probe — the head fed every row of its
context — accepts at the same positions of the very text the loop produced. A loop that skipped
the MTP prefill, left holes after accepted drafts or trimmed committed rows would differ (and
fall below the ceiling, docs/design.md §6.1). Also reports the ceiling over all positions."""
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tap import ROOT, Tap, nextn  # noqa: E402

t = Tap()
MODEL = os.path.join(ROOT, "models", "nextn-hy3-tiny")
PROMPTS = {
    "code": "static int parse_header(const char *buf, size_t len, struct header *h)\n{\n",
    "prose": "The history of the city begins in the early years of the century, when",
}
for name, prompt in PROMPTS.items():
    ids = nextn("tokenize", "-m", MODEL, prompt).stdout.split()
    r = nextn("run", "-m", MODEL, "--prompt-tokens", ",".join(ids), "-n", 160, "--draft", 1, "--ignore-eos",
              "--print-ids", "--stats", "--quiet")
    gen = r.stdout.split()
    m = re.search(r"drafted (\d+), accepted (\d+)", r.stderr)
    drafted, accepted = int(m.group(1)), int(m.group(2))
    live = accepted / max(drafted, 1)
    p = nextn("probe", "-m", MODEL, "--tokens", ",".join(ids + gen), "--simulate-from", len(ids)).stdout
    ceiling = float(re.search(r"position 1: n=\d+ greedy vs trunk ([0-9.]+)", p).group(1))
    sim = re.search(r"drafted (\d+), accepted (\d+)", p)
    sd, sa = int(sim.group(1)), int(sim.group(2))
    t.note(f"{name}: live acceptance {live:.3f} ({accepted}/{drafted}); teacher-forced at the same positions "
           f"{sa}/{sd}; ceiling over all positions {ceiling:.3f}")
    t.ok(drafted > 20, f"{name}: the loop drafted ({drafted} drafts)")
    t.ok((drafted, accepted) == (sd, sa), f"{name}: live drafts accepted == teacher-forced ({accepted}/{drafted})",
         f"live {accepted}/{drafted} vs teacher-forced {sa}/{sd}")
t.done()
