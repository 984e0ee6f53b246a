#!/usr/bin/python3
"""Evaluate an exported tiny hy_v3 checkpoint and write its model card.

Runs the PyTorch model on exactly the exported bf16 weights (computed in fp32)
over the held-out validation splits, code and prose separately:

* trunk loss / perplexity (next token t_{p+1});
* MTP head loss / perplexity (t_{p+2}, teacher-forced: row p = trunk hidden h_p
  after the final norm + embedding of t_{p+1}, full causal context of MTP rows);
* teacher-forced greedy acceptance = share of rows whose MTP argmax equals the
  true t_{p+2} (the ceiling probe of docs/design.md §9), and, for reference, the share
  equal to the trunk's own argmax at p+1 (what greedy speculative decoding accepts);
* greedy generations from a prose and a code prompt.

Writes eval.json and README.md (model card) into the model directory.

Usage: evaluate.py --model models/nextn-hy3-tiny --corpus .corpus [--log train.log]
"""
import argparse
import json
import math
import os
import platform
import re
import subprocess
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from model import Cfg, HyV3  # noqa: E402
import export  # noqa: E402
from bpe import Tokenizer  # noqa: E402

PROMPTS = {
    "prose": "The Debian package management system",
    "code": "#include <linux/module.h>\n#include <linux/kernel.h>\n\nstatic int __init",
}


def load(model_dir):
    cfgd = json.load(open(os.path.join(model_dir, "config.json")))
    m = HyV3(Cfg(cfgd))
    export.load_into(m, model_dir)
    m.eval()
    return m, cfgd


@torch.no_grad()
def eval_split(m, arr, ctx, max_windows, bs=16):
    n = min(max_windows, (len(arr) - 2) // ctx)
    tot = {"trunk": 0.0, "mtp": 0.0, "acc_true": 0.0, "acc_trunk": 0.0, "trunk_top1": 0.0, "n": 0, "nm": 0}
    for i in range(0, n, bs):
        xs = np.stack([arr[j * ctx: j * ctx + ctx + 2] for j in range(i, min(n, i + bs))]).astype(np.int64)
        x = torch.from_numpy(xs)
        T = ctx
        logits, mlog = m(x[:, :T], x[:, 1:T + 1])
        V = logits.shape[-1]
        tgt, mtgt = x[:, 1:T + 1], x[:, 2:T + 2]
        tot["trunk"] += F.cross_entropy(logits.reshape(-1, V), tgt.reshape(-1), reduction="sum").item()
        tot["mtp"] += F.cross_entropy(mlog.reshape(-1, V), mtgt.reshape(-1), reduction="sum").item()
        ta = logits.argmax(-1)
        ma = mlog.argmax(-1)
        tot["trunk_top1"] += (ta == tgt).sum().item()
        tot["acc_true"] += (ma == mtgt).sum().item()
        # MTP row p vs the trunk's own greedy choice at row p+1 (both predict t_{p+2})
        tot["acc_trunk"] += (ma[:, :-1] == ta[:, 1:]).sum().item()
        tot["nm"] += ma[:, :-1].numel()
        tot["n"] += tgt.numel()
    n_tok = tot["n"]
    return {"windows": n, "tokens": n_tok,
            "trunk_loss": tot["trunk"] / n_tok, "trunk_ppl": math.exp(tot["trunk"] / n_tok),
            "mtp_loss": tot["mtp"] / n_tok, "mtp_ppl": math.exp(tot["mtp"] / n_tok),
            "trunk_top1": tot["trunk_top1"] / n_tok,
            "mtp_acceptance": tot["acc_true"] / n_tok,
            "mtp_agree_trunk_greedy": tot["acc_trunk"] / tot["nm"]}


@torch.no_grad()
def greedy(m, ids, n, eos):
    ids = list(ids)
    out = []
    for _ in range(n):
        logits, _ = m(torch.tensor([ids]))
        t = int(logits[0, -1].argmax())
        out.append(t)
        ids.append(t)
        if t == eos:
            break
    return out


def count_params(cfgd, sd_names_shapes):
    c = Cfg(cfgd)
    total = sum(int(np.prod(s)) for s in sd_names_shapes.values())
    N = c.num_hidden_layers
    mtp = sum(int(np.prod(s)) for k, s in sd_names_shapes.items() if k.startswith(f"model.layers.{N}."))
    one_exp = 3 * c.hidden_size * c.expert_hidden_dim
    n_moe = sum(1 for L in range(N) if not c.is_dense(L))
    inactive = n_moe * (c.num_experts - c.num_experts_per_tok) * one_exp
    trunk = total - mtp
    mtp_inactive = (c.mtp_num_experts - c.num_experts_per_tok) * one_exp
    return {"total": total, "trunk": trunk, "mtp_layer": mtp,
            "trunk_active_per_token": trunk - inactive,
            "mtp_active_per_token": mtp - mtp_inactive}


def parse_log(path):
    vals, train, meta = [], [], {}
    if not path or not os.path.exists(path):
        return vals, train, meta
    for line in open(path):
        if line.startswith("val "):
            p = line.split()
            d = {"step": int(p[1])}
            for k, v in zip(p[2::2], p[3::2]):
                d[k] = float(v)
            vals.append(d)
        elif line.startswith("step "):
            p = line.split()
            train.append({"step": int(p[1]), "lr": float(p[3]), "trunk": float(p[5]), "mtp": float(p[7]),
                          "elapsed": float(p[11][:-1]), "tok_s": float(p[13])})
        elif line.startswith("# stopped early"):
            meta["stopped_early"] = line.strip("# \n")
        elif line.startswith("# done"):
            meta["train_seconds"] = float(line.split("train_seconds")[1])
        elif line.startswith("# start"):
            m = re.search(r"params (\d+) args (\{.*\})", line)
            if m:
                meta["params"] = int(m.group(1))
                meta["args"] = eval(m.group(2), {"__builtins__": {}}, {"True": True, "False": False, "None": None})
    return vals, train, meta


def cpu_name():
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--corpus", default=".corpus")
    ap.add_argument("--ctx", type=int, default=256)
    ap.add_argument("--max-windows", type=int, default=400)
    ap.add_argument("--log", default=None)
    ap.add_argument("--gen-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--card-only", action="store_true", help="rewrite README.md from an existing eval.json")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    if a.card_only:
        res = json.load(open(os.path.join(a.model, "eval.json")))
        manifest = json.load(open(os.path.join(a.model, "corpus-manifest.json")))
        write_card(a.model, res, parse_log(a.log or os.path.join(a.model, "train.log")), manifest, Tokenizer(a.model))
        return
    t0 = time.time()
    m, cfgd = load(a.model)
    tk = Tokenizer(a.model)
    res = {"config": cfgd}
    for kind in ("code", "prose"):
        arr = np.fromfile(os.path.join(a.corpus, f"val_{kind}.u16"), dtype=np.uint16)
        res[kind] = eval_split(m, arr, a.ctx, a.max_windows)
        print(kind, res[kind], file=sys.stderr)
    res["generations"] = {}
    for kind, p in PROMPTS.items():
        ids = [cfgd["bos_token_id"]] + tk.encode(p)
        out = greedy(m, ids, a.gen_tokens, cfgd["eos_token_id"])
        res["generations"][kind] = {"prompt": p, "prompt_ids": ids, "output_ids": out, "output": tk.decode(out)}
    from safetensors_io import read_header
    hdr, _ = read_header(os.path.join(a.model, "model.safetensors"))
    res["params"] = count_params(cfgd, {k: v["shape"] for k, v in hdr.items() if k != "__metadata__"})
    res["size_bytes"] = os.path.getsize(os.path.join(a.model, "model.safetensors"))
    res["eval_seconds"] = time.time() - t0
    with open(os.path.join(a.model, "eval.json"), "w") as f:
        json.dump(res, f, indent=1, ensure_ascii=False)
    log = a.log or os.path.join(a.model, "train.log")
    manifest = json.load(open(os.path.join(a.corpus, "manifest.json")))
    with open(os.path.join(a.model, "corpus-manifest.json"), "w") as f:
        json.dump(manifest, f, indent=0)
    write_card(a.model, res, parse_log(log), manifest, tk)


def fmt_int(n):
    return f"{n / 1e6:.2f} M"


def write_card(model_dir, r, logp, manifest, tk):
    vals, train, meta = logp
    c = r["config"]
    name = os.path.basename(os.path.abspath(model_dir))
    pc = r["params"]
    args = meta.get("args", {})
    steps = args.get("steps")
    tokens_seen = steps * args.get("batch", 0) * args.get("ctx", 0) if steps else None
    ts = meta.get("train_seconds")
    code_files = [f for f in manifest["files"]["code"]]
    prose_files = manifest["files"]["prose"]

    def src_groups(files):
        g = {}
        for fname, split, n in files:
            if fname.startswith("/usr/share/doc/python3.11/"):
                key = "python3.11-doc: " + fname.split("_sources/")[1].split("/")[0] + "/"
            elif "debian-reference" in fname:
                key = "debian-reference-en (HTML, tags stripped)"
            elif "gnu-standards" in fname:
                key = "gnu-standards: " + os.path.basename(fname.split("#")[0])
            elif "fortunes" in fname:
                key = "fortunes, fortunes-min (cookie databases, 40 cookies per document)"
            else:
                parts = fname.split("/")
                key = "linux-source-6.1: " + "/".join(parts[:2 if parts[0] in ("include", "drivers", "net") else 1]) + "/"
            s = g.setdefault(key, [0, 0, 0])
            s[0] += 1
            s[1] += n
            s[2] += split == "val"
        return g

    L = []
    w = L.append
    w(f"# {name}\n")
    w("A tiny Tencent Hunyuan 3 (`hy_v3`) mixture-of-experts model with a native MTP (NextN) head, "
      "trained from scratch on a small C-code + English-prose corpus. It exists to test the nextn "
      "inference engine end to end (real tokenizer, real routing statistics, a draft head that actually "
      "agrees with the trunk) - it is not a useful language model.\n")
    w("## Architecture\n")
    w("Exactly the hy_v3 architecture (see `config.json`, original Tencent tensor layout in bf16 "
      "`model.safetensors`, MTP layer at `model.layers." + str(c["num_hidden_layers"]) + ".*`):\n")
    w("| field | value |\n|---|---|")
    for k in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
              "head_dim", "intermediate_size", "expert_hidden_dim", "num_experts", "num_experts_per_tok",
              "num_shared_experts", "first_k_dense_replace", "router_scaling_factor", "route_norm",
              "rms_norm_eps", "rope_parameters", "max_position_embeddings", "num_nextn_predict_layers",
              "tie_word_embeddings"):
        w(f"| `{k}` | `{json.dumps(c[k])}` |")
    w("")
    w("- layer 0 dense SwiGLU; layers 1.." + str(c["num_hidden_layers"] - 1) + " MoE: sigmoid router in fp32, "
      "selection-only `expert_bias` (auxiliary-loss-free balancing, bias += γ·sign(mean load − load) after "
      "every step), top-k weights renormalised and scaled by `router_scaling_factor`, plus one shared expert;")
    w("- GQA attention (ratio " + str(c["num_attention_heads"] // c["num_key_value_heads"]) + "), per-head q/k "
      "RMSNorm before neox (rotate-half) RoPE, explicit head_dim;")
    w("- MTP: `eh_proj(concat[enorm(embed(t_{p+1})), hnorm(h_p)])` with h_p the trunk hidden AFTER the final "
      "norm, a full MoE decoder layer at RoPE position p, `final_layernorm`, shared `lm_head`; trained jointly "
      f"with the DeepSeek-V3 MTP loss (weight {args.get('mtp_weight', 0.3)}) to predict t_{{p+2}}.\n")
    w("| parameters | count |\n|---|---|")
    w(f"| total (trunk + MTP) | {fmt_int(pc['total'])} |")
    w(f"| trunk | {fmt_int(pc['trunk'])} |")
    w(f"| trunk, active per token (embedding and lm_head counted in full) | {fmt_int(pc['trunk_active_per_token'])} |")
    w(f"| MTP layer (eh_proj, norms, MoE decoder layer) | {fmt_int(pc['mtp_layer'])} |")
    w(f"| MTP layer, active per token | {fmt_int(pc['mtp_active_per_token'])} |")
    w(f"\n`model.safetensors`: {r['size_bytes'] / 1e6:.1f} MB (bf16; `mlp.expert_bias` in F32).\n")
    w("## Corpus\n")
    w("Built by `tools/train/corpus.py` from Debian packages only (manifest with every file and its split: "
      "`corpus-manifest.json` next to this card). Validation documents are held out per file (stable hash, "
      f"{manifest['val_percent']}%).\n")
    w("| package | version |\n|---|---|")
    for p, v in manifest["packages"].items():
        w(f"| {p} | {v} |")
    w("")
    for kind, files in (("code", code_files), ("prose", prose_files)):
        st = manifest["stats"][kind]
        w(f"**{kind}**: train {st['train']['docs']} docs / {st['train']['bytes'] / 1e6:.2f} MB, "
          f"validation {st['val']['docs']} docs / {st['val']['bytes'] / 1e6:.2f} MB\n")
        w("| source | files | MB | of which validation |\n|---|---|---|---|")
        for k, (nf, nb, nv) in sorted(src_groups(files).items()):
            w(f"| {k} | {nf} | {nb / 1e6:.2f} | {nv} |")
        w("")
    w("## Tokenizer\n")
    w(f"Byte-level BPE trained by `tools/train/bpe.py` on the training split: {len(tk.vocab)} learned tokens "
      f"(256 bytes + {len(tk.ranks)} merges) and {len(tk.special)} special/reserved tokens at the top of the id "
      f"range (vocab_size {c['vocab_size']}). `tokenizer.json` follows Qwen3's pipeline (NFC, Split(regex, "
      "Isolated) + ByteLevel, BPE with pair-list merges, ByteLevel decoder); it is checked against the "
      "npm `@huggingface/tokenizers` implementation by `tools/train/check_tokenizer.py`. "
      "`tokenizer_config.json` carries a Hy3-style chat template "
      "(bos + system + `<｜hy_User:opensource｜>`user`<｜hy_Assistant:opensource｜>`assistant`<｜hy_eos:opensource｜>`, "
      "tools as a JSON block).\n")
    w("| token | id |\n|---|---|")
    for s, i in list(tk.special.items())[:7]:
        w(f"| `{s}` | {i} |")
    w("")
    w("## Training\n")
    nth = args.get("threads", 2)
    hw = f"{cpu_name()}, {nth} intra-op thread{'s' if nth != 1 else ''} (`torch.set_num_threads`), shared with other jobs"
    w(f"- hardware: {hw}; PyTorch {torch.__version__} (Debian python3-torch), bf16 autocast, fp32 master weights")
    if ts:
        w(f"- wall-clock training time: {ts / 60:.1f} min for {steps} steps "
          f"(batch {args.get('batch')} × context {args.get('ctx')} = {tokens_seen / 1e6:.2f} M tokens seen, "
          f"{args.get('code_frac', 0.5) * 100:.0f}% code windows)")
    # did the wall-clock budget drive the cosine schedule at some point?
    if train and args.get("steps"):
        wu, st, lr0 = args["warmup"], args["steps"], args["lr"]
        ahead = [t["step"] for t in train if t["step"] > wu and t["lr"] < 0.995 * lr0 * (
            0.1 + 0.45 * (1 + math.cos(math.pi * min(1.0, (t["step"] - wu) / max(1, st - wu)))))]
        if ahead:
            w(f"- the cosine schedule followed the {args.get('max_minutes')}-minute wall-clock budget "
              f"(which was ahead of the step count) around steps {ahead[0]}..{ahead[-1]} because the "
              "machine was busy with other jobs; a retrain on another machine reproduces the run only approximately")
    if meta.get("stopped_early"):
        w(f"- NOTE: {meta['stopped_early']} (machine shared with other jobs)")
    w(f"- AdamW (β 0.9/0.95, weight decay 0.1 on matrices), peak lr {args.get('lr')}, {args.get('warmup')} warm-up "
      f"steps, cosine to 10%; grad clip 1.0; seed {args.get('seed')}; expert-bias γ {args.get('bias_gamma')}")
    w(f"- loss = CE(trunk) + {args.get('mtp_weight')} · CE(MTP)\n")
    if vals:
        w("Validation during training (fixed windows, bf16 autocast; loss in nats, acc = MTP teacher-forced greedy acceptance):\n")
        w("| step | code trunk | code MTP | code acc | prose trunk | prose MTP | prose acc |\n|---|---|---|---|---|---|---|")
        for v in vals:
            w(f"| {v['step']} | {v.get('code_trunk', 0):.3f} | {v.get('code_mtp', 0):.3f} | {v.get('code_mtp_acc', 0):.3f} | "
              f"{v.get('prose_trunk', 0):.3f} | {v.get('prose_mtp', 0):.3f} | {v.get('prose_mtp_acc', 0):.3f} |")
        w("")
    if train:
        w(f"Training loss (mean of 20 steps): trunk {train[0]['trunk']:.3f} → {train[-1]['trunk']:.3f}, "
          f"MTP {train[0]['mtp']:.3f} → {train[-1]['mtp']:.3f}; throughput ≈ {train[-1]['tok_s']:.0f} tokens/s. "
          "Full log: `train.log`.\n")
    w("## Validation (exported bf16 weights, fp32 compute)\n")
    w("| split | tokens | trunk loss | trunk ppl | trunk top-1 | MTP loss | MTP ppl | MTP acceptance (argmax = t_{p+2}) | MTP argmax = trunk greedy at p+1 |")
    w("|---|---|---|---|---|---|---|---|---|")
    for kind in ("code", "prose"):
        e = r[kind]
        w(f"| {kind} | {e['tokens']} | {e['trunk_loss']:.3f} | {e['trunk_ppl']:.1f} | {e['trunk_top1']:.3f} | "
          f"{e['mtp_loss']:.3f} | {e['mtp_ppl']:.1f} | **{e['mtp_acceptance']:.3f}** | {e['mtp_agree_trunk_greedy']:.3f} |")
    w("\nAcceptance is the teacher-forced ceiling probe of `docs/design.md` §9 (every row sees its full context, "
      "trunk hidden after the final norm). The last column is what greedy self-speculative decoding accepts "
      "(the draft must equal the trunk's own argmax).\n")
    w("## Limitations\n")
    w("A ~10 M parameter model trained for about half an hour on a few million tokens: greedy text "
      "soon repeats itself, and the MTP head's teacher-forced acceptance "
      f"({r['code']['mtp_acceptance']:.2f} code / {r['prose']['mtp_acceptance']:.2f} prose) is far below a large "
      "model's (Hy3 reports 0.83 / 0.44). Agreement with the trunk's own greedy choice is higher "
      f"({r['code']['mtp_agree_trunk_greedy']:.2f} / {r['prose']['mtp_agree_trunk_greedy']:.2f}), which is what "
      "greedy self-speculative decoding of this model accepts. Acceptance rises with training tokens "
      "(see the table above); a longer run (`STEPS=... MAX_MINUTES=... tools/train/retrain.sh`) "
      "gives a stronger head.\n")
    w("## Sample generations (greedy, bf16 weights)\n")
    for kind, g in r["generations"].items():
        w(f"**{kind}** prompt `{json.dumps(g['prompt'])}`:\n")
        w("```\n" + g["prompt"] + g["output"] + "\n```\n")
    w("## Reproduce\n")
    w("```sh\nscripts/setup-train.sh          # Debian packages (once, as root)\n"
      "tools/train/retrain.sh          # corpus -> tokenizer -> train -> export -> evaluate (~40 min on 2 cores)\n```\n")
    w("Reference forward (numpy, float32, any hy_v3 checkpoint in Tencent or MLX layout, quantized or not):\n")
    w("```sh\n/usr/bin/python3 tools/train/reference.py --model models/" + name +
      " --tokens 1,2,3 --logits out.npy --mtp-logits mtp.npy --greedy 16\n```\n")
    w("Files: `config.json`, `generation_config.json`, `model.safetensors`, `tokenizer.json`, "
      "`tokenizer_config.json`, `train.log`, `eval.json` (all figures above).\n")
    with open(os.path.join(model_dir, "README.md"), "w") as f:
        f.write("\n".join(L))


if __name__ == "__main__":
    main()
