#!/usr/bin/python3
"""Make a SCRIPTED copy of a bf16 hy_v3 checkpoint: greedy decoding after token --after emits
the token ids of --script in order, then --eos. For server tests that need a model to say
something exact (reasoning markers, a tool call) through the real engine.

How: every sublayer's output projection (attention o_proj, every down_proj: dense, routed,
shared; MTP layer included) is zeroed, so the residual stream that reaches the final norm is
the current token's embedding. Token k of the chain (after, script...) gets the embedding e_k
(one-hot), the final norm weight is 1, and lm_head maps e_k to token k+1 alone (a logit of
30 * sqrt(hidden), every other logit 0). The chain's tokens must be distinct (it is a bigram
machine). The MTP head is left as it is: its drafts are verified away, the output stays exact.

  make_scripted_ckpt.py --base models/nextn-hy3-tiny --after 4075 --script 4077,72,1313 --eos 4076 --out /tmp/s
"""
import argparse
import json
import os
import re
import shutil
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools", "train"))
from safetensors_io import read_file, read_header, write_file  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--base", required=True)
    ap.add_argument("--after", type=int, required=True, help="the token the script follows")
    ap.add_argument("--script", required=True, help="comma-separated token ids")
    ap.add_argument("--eos", type=int, required=True)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    chain = [a.after] + [int(x) for x in a.script.split(",") if x.strip()]
    if len(set(chain)) != len(chain) or a.eos in chain:
        sys.exit("make_scripted_ckpt: the chain's tokens must be distinct (and not the eos)")
    src = os.path.join(a.base, "model.safetensors")
    hdr, _ = read_header(src)
    t = read_file(src)
    emb, head = t["model.embed_tokens.weight"], t["lm_head.weight"]
    hidden = emb.shape[1]
    if len(chain) > hidden:
        sys.exit(f"make_scripted_ckpt: {len(chain)} chain tokens need a hidden size >= that ({hidden})")
    for name in t:
        if re.search(r"(self_attn\.o_proj|down_proj)\.weight$", name):
            t[name] = np.zeros_like(t[name])
    head[:] = 0
    for k, tok in enumerate(chain):
        emb[tok] = 0
        emb[tok, k] = 1
        head[chain[k + 1] if k + 1 < len(chain) else a.eos, k] = 30
    t["model.norm.weight"] = np.ones_like(t["model.norm.weight"])
    os.makedirs(a.out, exist_ok=True)
    write_file(os.path.join(a.out, "model.safetensors"),
               {n: (hdr[n]["dtype"], v) for n, v in t.items()}, metadata={"format": "pt"})
    for f in ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json"):
        if os.path.exists(os.path.join(a.base, f)):
            shutil.copy(os.path.join(a.base, f), os.path.join(a.out, f))
    with open(os.path.join(a.out, "config.json")) as f:
        cfg = json.load(f)
    if cfg.get("eos_token_id") != a.eos and a.eos not in (cfg.get("eos_token_id") or []):
        sys.exit(f"make_scripted_ckpt: --eos {a.eos} is not the config's eos_token_id")


if __name__ == "__main__":
    main()
