#!/usr/bin/python3
"""Regenerate the golden fixtures in tests/fixtures/ for the committed default model.

For a few token sequences (prose, code, mixed chat, a short one) the float32
reference forward (tools/train/model.py, numpy, from the stored bf16 weights)
gives:
  <name>.logits.npy        trunk logits [T, vocab]           (full rows, T <= 32)
  <name>.mtp_logits.npy    teacher-forced MTP logits [T-1, vocab]; row p = (post-final-norm
                           trunk hidden h_p, token t_{p+1}, RoPE position p), predicts t_{p+2}
For the long sequence only the last 4 full rows plus the top-16 (ids, values) of every row:
  <name>.logits_last4.npy, <name>.logits_top16_ids.npy (int32), <name>.logits_top16_vals.npy
  and the same with mtp_logits.
Plus greedy continuations (32 tokens) and tokenizer cases, described in golden.json.

Usage: /usr/bin/python3 tests/ref/make_golden.py [--model models/nextn-hy3-tiny] [--out tests/fixtures]
"""
import argparse
import hashlib
import json
import os
import sys

import numpy as np

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "tools", "train"))
from model import Reference  # noqa: E402
from bpe import Tokenizer  # noqa: E402

SEQS = [
    # name, text, max tokens (prompt gets bos prepended)
    ("short", "The package manager keeps track of installed files.", 8),
    ("prose", "The Debian package management system keeps track of every file that a package installs, "
              "so that it can be removed cleanly later.", 24),
    ("code", "static int foo_probe(struct platform_device *pdev)\n{\n\tstruct device *dev = &pdev->dev;\n"
             "\tint ret;\n\n\tif (!dev->of_node)\n\t\treturn -ENODEV;\n", 32),
    ("mixed", None, 64),
]
MIXED_CHAT = [
    {"role": "system", "content": "You are a careful C programmer."},
    {"role": "user", "content": "Write a function that returns the larger of two integers."},
    {"role": "assistant", "content": "Here it is:\n\nstatic inline int max_int(int a, int b)\n{\n\treturn a > b ? a : b;\n}\n\n"
                                     "It works for negative numbers as well."},
]
TOKENIZER_CASES = [
    "Hello World",
    "\tif (x == NULL)\n\t\treturn -EINVAL;\r\n",
    "I'LL we've DON'T 3.14159 0x7fffffff",
    "café naïve e\u0301 日本語 😀",
    "<｜hy_User:opensource｜>hi<｜hy_Assistant:opensource｜><think:opensource></think:opensource>ok<｜hy_eos:opensource｜>",
]
GREEDY_N = 32
TOPK = 16


def render_chat(tok_cfg, messages):
    try:
        import jinja2
        env = jinja2.Environment()
        env.filters["tojson"] = lambda x: json.dumps(x, ensure_ascii=False)
        return env.from_string(tok_cfg["chat_template"]).render(
            messages=messages, bos_token=tok_cfg["bos_token"], add_generation_prompt=False, tools=None)
    except ImportError:   # same skeleton by hand
        s = tok_cfg["bos_token"] + messages[0]["content"]
        s += "<｜hy_User:opensource｜>" + messages[1]["content"]
        s += "<｜hy_Assistant:opensource｜>" + messages[2]["content"] + "<｜hy_eos:opensource｜>"
        return s


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=os.path.join(ROOT, "models", "nextn-hy3-tiny"))
    ap.add_argument("--out", default=os.path.join(ROOT, "tests", "fixtures"))
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    ref = Reference(a.model)
    tk = Tokenizer(a.model)
    cfg = ref.cfg.raw
    tok_cfg = json.load(open(os.path.join(a.model, "tokenizer_config.json"), encoding="utf-8"))
    sha = hashlib.sha256(open(os.path.join(a.model, "model.safetensors"), "rb").read()).hexdigest()
    desc = {
        "model": os.path.relpath(a.model, ROOT),
        "model_safetensors_sha256": sha,
        "vocab_size": cfg["vocab_size"],
        "bos_token_id": cfg["bos_token_id"], "eos_token_id": cfg["eos_token_id"],
        "generator": "tests/ref/make_golden.py (numpy float32 reference forward, tools/train/model.py)",
        "conventions": {
            "logits": "trunk logits [T, vocab] for tokens at positions 0..T-1, float32",
            "mtp_logits": "teacher-forced MTP logits [T-1, vocab]; row p = (trunk hidden after the final "
                          "norm at p, token t_{p+1}, RoPE position p), causal attention over MTP rows 0..p; "
                          "predicts t_{p+2}",
            "greedy": f"{GREEDY_N} greedy (argmax) tokens continuing the sequence, trunk only, no EOS stop",
            "precision": "weights are the stored bf16 values, all arithmetic in float32; an engine "
                         "computing in bf16/f32 should match to ~1e-2 (argmax identical except near-ties)",
        },
        "sequences": [],
        "tokenizer_cases": [{"text": t, "ids": tk.encode(t)} for t in TOKENIZER_CASES],
    }
    for name, text, maxlen in SEQS:
        if text is None:
            text = render_chat(tok_cfg, MIXED_CHAT)
            ids = tk.encode(text)           # the template already starts with bos
        else:
            ids = [cfg["bos_token_id"]] + tk.encode(text)
        ids = ids[:maxlen]
        logits, mtp_logits, h_pre, h_post = ref.forward(ids)
        ent = {"name": name, "text": text, "tokens": ids, "T": len(ids), "files": {}}
        if len(ids) <= 32:
            for k, arr in (("logits", logits), ("mtp_logits", mtp_logits)):
                fn = f"{name}.{k}.npy"
                np.save(os.path.join(a.out, fn), arr.astype(np.float32))
                ent["files"][k] = {"file": fn, "shape": list(arr.shape), "rows": "all"}
        else:
            for k, arr in (("logits", logits), ("mtp_logits", mtp_logits)):
                last = arr[-4:].astype(np.float32)
                fn = f"{name}.{k}_last4.npy"
                np.save(os.path.join(a.out, fn), last)
                top = np.argsort(-arr, axis=-1, kind="stable")[:, :TOPK].astype(np.int32)
                vals = np.take_along_axis(arr, top, -1).astype(np.float32)
                np.save(os.path.join(a.out, f"{name}.{k}_top{TOPK}_ids.npy"), top)
                np.save(os.path.join(a.out, f"{name}.{k}_top{TOPK}_vals.npy"), vals)
                ent["files"][k] = {"file": fn, "shape": list(last.shape),
                                   "rows": f"last 4 of {arr.shape[0]}",
                                   "top_ids": f"{name}.{k}_top{TOPK}_ids.npy",
                                   "top_vals": f"{name}.{k}_top{TOPK}_vals.npy",
                                   "top_shape": list(top.shape)}
        ent["argmax"] = [int(i) for i in logits.argmax(-1)]
        ent["mtp_argmax"] = [int(i) for i in mtp_logits.argmax(-1)]
        if name == "short":
            np.save(os.path.join(a.out, f"{name}.hidden_post.npy"), h_post.astype(np.float32))
            np.save(os.path.join(a.out, f"{name}.hidden_pre.npy"), h_pre.astype(np.float32))
            ent["files"]["hidden_post"] = {"file": f"{name}.hidden_post.npy", "shape": list(h_post.shape)}
            ent["files"]["hidden_pre"] = {"file": f"{name}.hidden_pre.npy", "shape": list(h_pre.shape)}
        if name in ("prose", "code", "short"):
            g = ref.greedy(ids, GREEDY_N)
            ent["greedy"] = g
            ent["greedy_text"] = tk.decode(g)
        desc["sequences"].append(ent)
        print(name, len(ids), file=sys.stderr)
    with open(os.path.join(a.out, "golden.json"), "w", encoding="utf-8") as f:
        json.dump(desc, f, indent=1, ensure_ascii=False)


if __name__ == "__main__":
    main()
