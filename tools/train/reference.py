#!/usr/bin/python3
"""Independent float32 reference forward for hy_v3 checkpoints (CLI).

Loads any checkpoint directory (config.json + model*.safetensors, Tencent or
MLX layout, optional model-mtp.safetensors sidecar, sharded, MLX affine
quantized) with the numpy implementation in model.py and writes float32 .npy:

  --logits OUT.npy       trunk logits [T, vocab]
  --mtp-logits OUT.npy   teacher-forced MTP logits [T-1, vocab]; row p uses the trunk
                         post-final-norm hidden at p, token t_{p+1}, RoPE position p,
                         causal attention over MTP rows 0..p; predicts t_{p+2}
  --hidden-pre OUT.npy   trunk hidden before the final norm [T, hidden]
  --hidden-post OUT.npy  trunk hidden after the final norm [T, hidden]
  --greedy N             print the greedy continuation ids (one line, space separated)

Example:
  /usr/bin/python3 tools/train/reference.py --model models/nextn-hy3-tiny \\
      --tokens 4072,310,2049 --logits /tmp/l.npy --mtp-logits /tmp/m.npy --greedy 8
"""
import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from model import Reference  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description="hy_v3 float32 reference forward")
    ap.add_argument("--model", required=True)
    ap.add_argument("--tokens", help="comma-separated token ids")
    ap.add_argument("--text", help="text to encode with the model's tokenizer.json (instead of --tokens)")
    ap.add_argument("--bos", action="store_true", help="prepend bos_token_id to --text")
    ap.add_argument("--logits")
    ap.add_argument("--mtp-logits")
    ap.add_argument("--hidden-pre")
    ap.add_argument("--hidden-post")
    ap.add_argument("--greedy", type=int, default=0)
    ap.add_argument("--mtp-hidden", choices=("post", "pre"), default="post",
                    help="trunk hidden fed to the MTP hnorm (docs/design.md §3.3; default post-final-norm)")
    a = ap.parse_args()
    ref = Reference(a.model, hidden_for_mtp=a.mtp_hidden)
    if a.tokens:
        toks = [int(t) for t in a.tokens.replace(" ", ",").split(",") if t]
    elif a.text is not None:
        from bpe import Tokenizer
        toks = Tokenizer(a.model).encode(a.text)
        if a.bos:
            toks = [ref.cfg.raw["bos_token_id"]] + toks
        print("tokens:", " ".join(map(str, toks)), file=sys.stderr)
    else:
        ap.error("--tokens or --text required")
    if a.logits or a.mtp_logits or a.hidden_pre or a.hidden_post:
        logits, mtp_logits, h_pre, h_post = ref.forward(toks)
        if a.logits:
            np.save(a.logits, logits.astype(np.float32))
        if a.mtp_logits:
            if mtp_logits is None:
                sys.exit("checkpoint has no MTP layer (or fewer than 2 tokens)")
            np.save(a.mtp_logits, mtp_logits.astype(np.float32))
        if a.hidden_pre:
            np.save(a.hidden_pre, h_pre.astype(np.float32))
        if a.hidden_post:
            np.save(a.hidden_post, h_post.astype(np.float32))
    if a.greedy:
        print(" ".join(map(str, ref.greedy(toks, a.greedy))))


if __name__ == "__main__":
    main()
