#!/usr/bin/python3
"""Prunes the routed experts a hy_v3 trunk uses least (an expert-pruned variant, as "REAP"
checkpoints are made), for the healing experiment of docs/forge.md.

Router frequency is counted over token windows (a `nextn forge` shard's tokens.npy: text the
trunk is meant for) with the training model's forward (tools/train/model.py): the experts each
token's router selects (sigmoid scores plus the selection-only bias, top-k), per MoE layer. The
`--fraction` least selected experts of every trunk MoE layer are dropped: their weights, their
router rows and bias entries; the rest are renumbered in order. The output is headless (the MTP
layer dropped, `num_nextn_predict_layers` kept, so `nextn graft` can put a head back).

Usage: /usr/bin/python3 tools/forge/prune_experts.py --model DIR --tokens SHARD/tokens.npy
           [--windows 200] [--fraction 0.25] --out DIR
"""
import argparse
import json
import os
import re
import shutil
import sys

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "train"))
import model as hy  # noqa: E402
from export import load_into  # noqa: E402
from safetensors_io import read_file, read_header, write_file  # noqa: E402

EXPERT = re.compile(r"^model\.layers\.(\d+)\.mlp\.experts\.(\d+)\.(.*)$")


def router_load(model_dir, tokens, windows):
    c = hy.Cfg.load(model_dir)
    m = hy.HyV3(c)
    load_into(m, model_dir)
    m.eval()
    for moe in m.moe_modules():
        moe.load.zero_()
    idx = np.linspace(0, tokens.shape[0] - 1, min(windows, tokens.shape[0])).astype(int)
    with torch.no_grad():
        for i in range(0, len(idx), 8):
            m(torch.from_numpy(np.asarray(tokens[idx[i:i + 8]], np.int64)))
    return {L: m.layers[L].mlp.load.numpy().copy() for L in range(c.num_hidden_layers) if not c.is_dense(L)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--tokens", required=True, help="tokens.npy [N, T] of a forge shard")
    ap.add_argument("--windows", type=int, default=200)
    ap.add_argument("--fraction", type=float, default=0.25)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    torch.set_num_threads(1)
    with open(os.path.join(a.model, "config.json")) as f:
        cfgd = json.load(f)
    N, E = cfgd["num_hidden_layers"], cfgd["num_experts"]
    drop = int(round(E * a.fraction))
    if not 0 < drop <= E - cfgd["num_experts_per_tok"]:
        sys.exit(f"prune_experts: dropping {drop} of {E} experts leaves fewer than num_experts_per_tok")
    load = router_load(a.model, np.load(a.tokens, mmap_mode="r"), a.windows)
    keep = {}
    for L, ld in load.items():
        order = np.argsort(-ld, kind="stable")
        keep[L] = sorted(order[:E - drop].tolist())
        share = ld.astype(np.float64) / max(float(ld.sum()), 1.0)
        print(f"layer {L}: router share {np.round(share, 3).tolist()}; dropping experts "
              f"{sorted(order[E - drop:].tolist())}", flush=True)
    files = [f for f in os.listdir(a.model) if f.startswith("model") and f.endswith(".safetensors")]
    if files != ["model.safetensors"]:
        sys.exit(f"prune_experts: {a.model}: expects one model.safetensors (Tencent layout), found {files}")
    src = os.path.join(a.model, "model.safetensors")
    dtypes = {k: v["dtype"] for k, v in read_header(src)[0].items() if k != "__metadata__"}
    t = read_file(src, raw=True)
    out = {}
    for k, v in t.items():
        m = re.match(r"^model\.layers\.(\d+)\.", k)
        L = int(m.group(1)) if m else -1
        if L >= N:
            continue  # the MTP layer: the output is headless
        e = EXPERT.match(k)
        if e and L in keep:
            old = int(e.group(2))
            if old in keep[L]:
                out[f"model.layers.{L}.mlp.experts.{keep[L].index(old)}.{e.group(3)}"] = (dtypes[k], v)
            continue
        if L in keep and (k.endswith("mlp.router.gate.weight") or k.endswith("mlp.expert_bias")):
            v = v[keep[L]]
        out[k] = (dtypes[k], v)
    os.makedirs(a.out, exist_ok=True)
    write_file(os.path.join(a.out, "model.safetensors"), out, metadata={"format": "pt"})
    cfgd["num_experts"] = E - drop
    with open(os.path.join(a.out, "config.json"), "w") as f:
        json.dump(cfgd, f, indent=2)
    for fn in ("generation_config.json", "tokenizer.json", "tokenizer_config.json"):
        if os.path.exists(os.path.join(a.model, fn)):
            shutil.copy(os.path.join(a.model, fn), os.path.join(a.out, fn))
    print(f"prune_experts: wrote {a.out}: {E - drop} of {E} experts per MoE layer, no MTP head", flush=True)


if __name__ == "__main__":
    main()
