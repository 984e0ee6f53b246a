#!/usr/bin/python3
"""Replaces the MTP layer inside a single-file checkpoint by a head the forge trainer wrote, in
place of a sidecar: how the default model (one model.safetensors, MTP layer at
model.layers.{N}.*) ships a forged head. Every other tensor keeps its bytes and its place in the
file; the head's tensors must have the names, dtypes and shapes of the ones they replace.

Usage: /usr/bin/python3 tools/forge/inline_head.py --model DIR --head WORK/head
"""
import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "train"))
from safetensors_io import read_file, read_header, write_file  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--head", required=True, help="a trainer output directory (model.safetensors of the head)")
    a = ap.parse_args()
    path = os.path.join(a.model, "model.safetensors")
    hpath = os.path.join(a.head, "model.safetensors")
    hdr, _ = read_header(path)
    meta = hdr.pop("__metadata__", None)
    hh, _ = read_header(hpath)
    hh.pop("__metadata__", None)
    for k, v in hh.items():
        if k not in hdr:
            sys.exit(f"inline_head: {hpath}: {k} is not a tensor of {path}")
        if v["dtype"] != hdr[k]["dtype"] or v["shape"] != hdr[k]["shape"]:
            sys.exit(f"inline_head: {k}: {v['dtype']} {v['shape']} in the head, {hdr[k]['dtype']} "
                     f"{hdr[k]['shape']} in the model")
    t, h = read_file(path, raw=True), read_file(hpath, raw=True)
    order = sorted(hdr, key=lambda k: hdr[k]["data_offsets"][0])
    out = {k: (hdr[k]["dtype"], h[k] if k in h else t[k]) for k in order}
    tmp = path + ".partial"
    write_file(tmp, out, metadata=meta)
    os.replace(tmp, path)
    print(f"inline_head: {len(h)} head tensors of {a.head} now in {path}")


if __name__ == "__main__":
    main()
