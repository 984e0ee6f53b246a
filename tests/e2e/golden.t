#!/usr/bin/python3
"""The default model against the committed golden fixtures (tests/fixtures/, written by the
independent reference forward, tests/ref/make_golden.py): tokenization of the fixture texts,
trunk and teacher-forced MTP logits (max |Δ| small relative to the range), argmaxes, and the
greedy continuations — plain and speculative."""
import hashlib
import json
import os
import shutil
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tap import ROOT, Tap, nextn, scratch  # noqa: E402

t = Tap()
FIX = os.path.join(ROOT, "tests", "fixtures")
g = json.load(open(os.path.join(FIX, "golden.json")))
model = os.path.join(ROOT, g["model"])
sha = hashlib.sha256(open(os.path.join(model, "model.safetensors"), "rb").read()).hexdigest()
t.ok(sha == g["model_safetensors_sha256"], "fixtures were made from the committed model")
tmp = scratch(prefix="nextn-golden-")
TOL = 2e-3

for s in g["sequences"]:
    name, toks = s["name"], s["tokens"]
    text_ids = nextn("tokenize", "-m", model, s["text"]).stdout.split()
    text_ids = list(map(int, text_ids))
    bos = [g["bos_token_id"]] if toks[0] == g["bos_token_id"] and text_ids[:1] != toks[:1] else []
    # the fixtures hold the first T tokens of the text (after the BOS, if any)
    t.ok((bos + text_ids)[:len(toks)] == toks, f"{name}: tokenization of the fixture text")
    lo, mo = os.path.join(tmp, name + ".npy"), os.path.join(tmp, name + ".mtp.npy")
    nextn("eval", "-m", model, "--tokens", ",".join(map(str, toks)), "--logits", lo, "--mtp-logits", mo)
    eng = {"logits": np.load(lo), "mtp_logits": np.load(mo)}
    for key in ("logits", "mtp_logits"):
        f = s["files"][key]
        ref = np.load(os.path.join(FIX, f["file"]))
        got = eng[key] if f["rows"] == "all" else eng[key][-ref.shape[0]:]
        rng = float(ref.max() - ref.min())
        err = float(np.abs(got - ref).max())
        t.ok(err <= TOL * rng, f"{name}: {key} max |d| {err:.2e} vs range {rng:.1f}")
    t.ok(eng["logits"].argmax(1).tolist() == s["argmax"], f"{name}: trunk argmax per row")
    t.ok(eng["mtp_logits"].argmax(1).tolist() == s["mtp_argmax"], f"{name}: MTP argmax per row")
    if "greedy" in s:
        n = len(s["greedy"])
        for draft in ("0", "2"):
            out = nextn("run", "-m", model, "--prompt-tokens", ",".join(map(str, toks)), "-n", n, "--print-ids",
                        "--ignore-eos", "--draft", draft, "--quiet").stdout.split()
            t.ok(list(map(int, out)) == s["greedy"], f"{name}: greedy continuation (draft {draft})")
shutil.rmtree(tmp, ignore_errors=True)
t.done()
