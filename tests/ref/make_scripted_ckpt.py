#!/usr/bin/python3
"""Make a SCRIPTED copy of a bf16 checkpoint: greedy decoding after token --after emits the token
ids of --script in order, then --eos. For server tests that need a model to say something exact
(reasoning markers, a tool call) through the real engine. Families: hy_v3 (Tencent layout),
glm4_moe, glm4_moe_lite, deepseek_v3, qwen3_5_moe and qwen3_next, in their Hugging Face layout,
one file or shards, the MTP head inline or in a model-mtp.safetensors sidecar.

How: every sublayer's output projection (attention o_proj, the Gated DeltaNet's
linear_attn.out_proj, every down_proj: dense, routed per expert or fused [E, H, F] as
qwen3_5_moe's mlp.experts.down_proj, shared; MTP layer included) is zeroed, so the residual
stream that reaches the final norm is the current token's embedding. Token k of the chain
(after, script...) gets the embedding e_k (one-hot), the final norm multiplies by 1 (weight 1;
w = 0 for the Qwen hybrids, whose norms apply 1 + w), and lm_head maps e_k to token k+1 alone (a
logit of 30 * sqrt(hidden), every other logit 0). The chain's tokens must be distinct (it is a
bigram machine). The MTP head is left as it is: its drafts are verified away, the output stays
exact.

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

# The output projections: what a sublayer adds to the residual stream.
OUTPUT_PROJ = re.compile(r"(self_attn\.o_proj\.weight|linear_attn\.out_proj\.weight|down_proj\.weight"
                         r"|mlp\.experts\.down_proj)$")
# Per model_type: (embedding, final norm, the norm weight that multiplies by 1). lm_head.weight
# is at the top in every layout read here.
NAMES = {
    "qwen3_5_moe": ("model.language_model.embed_tokens.weight", "model.language_model.norm.weight", 0.0),
    "qwen3_next": ("model.embed_tokens.weight", "model.norm.weight", 0.0),
}
DEFAULT_NAMES = ("model.embed_tokens.weight", "model.norm.weight", 1.0)
HEAD = "lm_head.weight"
COPIED = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
          "model.safetensors.index.json")


def fail(msg):
    sys.exit(f"make_scripted_ckpt: {msg}")


def config_eos(cfg):
    """The end ids of config.json, at its top or in qwen3_5_moe's text_config."""
    ids = []
    for c in (cfg, cfg.get("text_config") or {}):
        e = c.get("eos_token_id")
        ids += e if isinstance(e, list) else [] if e is None else [e]
    return ids


def locate(base, names):
    """{file: header} of base's model*.safetensors, and the [rows, hidden] of its embedding, which
    it, lm_head and the final norm must each hold once, the head in the embedding's shape."""
    files = sorted(f for f in os.listdir(base) if f.startswith("model") and f.endswith(".safetensors"))
    if not files:
        fail(f"{base}: no model*.safetensors")
    hdrs, where = {}, {}
    for fn in files:
        hdrs[fn] = read_header(os.path.join(base, fn))[0]
        for n, info in hdrs[fn].items():
            if n == "__metadata__":
                continue
            if info["dtype"] not in ("BF16", "F16", "F32"):
                fail(f"{fn}: tensor {n} is {info['dtype']} (a quantized checkpoint; the base must be bf16)")
            where.setdefault(n, []).append(info["shape"])
    for n in (names[0], HEAD, names[1]):
        if len(where.get(n, [])) != 1:
            fail(f"{base}: {'no' if n not in where else 'more than one'} tensor {n} (Hugging Face layout)")
    emb, head = where[names[0]][0], where[HEAD][0]
    if len(emb) != 2 or head != emb:
        fail(f"{base}: {names[0]} {emb} and {HEAD} {head} must both be [vocab, hidden]")
    return hdrs, emb


def script_file(base, fn, hdr, out, chain, eos, names):
    """One safetensors file: output projections zeroed, and the embedding, lm_head and final norm
    it holds set to the chain."""
    emb_name, norm_name, one = names
    t = read_file(os.path.join(base, fn))
    for name in t:
        if OUTPUT_PROJ.search(name):
            t[name] = np.zeros_like(t[name])
    if emb_name in t:
        for k, tok in enumerate(chain):
            t[emb_name][tok] = 0
            t[emb_name][tok, k] = 1
    if HEAD in t:
        head = t[HEAD]
        head[:] = 0
        for k in range(len(chain)):
            head[chain[k + 1] if k + 1 < len(chain) else eos, k] = 30
    if norm_name in t:
        t[norm_name] = np.full_like(t[norm_name], one)
    write_file(os.path.join(out, fn), {n: (hdr[n]["dtype"], v) for n, v in t.items()},
               metadata=hdr.get("__metadata__") or {"format": "pt"})


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
        fail("the chain's tokens must be distinct (and not the eos)")
    if min(chain + [a.eos]) < 0:
        fail("token ids must be >= 0")
    with open(os.path.join(a.base, "config.json")) as f:
        cfg = json.load(f)
    if a.eos not in config_eos(cfg):
        fail(f"--eos {a.eos} is not the config's eos_token_id")
    if cfg.get("quantization") or cfg.get("quantization_config"):
        fail(f"{a.base}: a quantized checkpoint (config.json quantization); the base must be bf16")
    names = NAMES.get(cfg.get("model_type"), DEFAULT_NAMES)
    hdrs, (vocab, hidden) = locate(a.base, names)
    if len(chain) > hidden:
        fail(f"{len(chain)} chain tokens need a hidden size >= that ({hidden})")
    if max(chain + [a.eos]) >= vocab:
        fail(f"token id {max(chain + [a.eos])} is outside {names[0]}'s {vocab} rows")
    os.makedirs(a.out, exist_ok=True)
    for fn, hdr in hdrs.items():
        script_file(a.base, fn, hdr, a.out, chain, a.eos, names)
    for f in COPIED:
        if os.path.exists(os.path.join(a.base, f)):
            shutil.copy(os.path.join(a.base, f), os.path.join(a.out, f))


if __name__ == "__main__":
    main()
