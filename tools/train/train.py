#!/usr/bin/python3
"""Train the tiny hy_v3 model (trunk + MTP head) on the code/prose corpus.

Fixed seed, fixed number of steps (so a retrain reproduces the run), AdamW with
linear warm-up and cosine decay, loss = CE(trunk, t_{p+1}) + lambda * CE(MTP, t_{p+2})
as in DeepSeek-V3.  MoE expert_bias is updated after every step with the
auxiliary-loss-free rule (bias += gamma * sign(mean_load - load)); it is a
buffer, never touched by the optimizer.  Train and validation losses (trunk and
MTP, code and prose separately) go to the log file; at the end the model is
exported in bf16, original Tencent layout (export.py).

Usage: train.py --corpus .corpus --tokenizer DIR --out models/nextn-hy3-tiny --steps N
"""
import argparse
import json
import math
import os
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from model import Cfg, HyV3  # noqa: E402
import export  # noqa: E402


def model_config(vocab_size, specials):
    """hy_v3 config.json (real field names of docs/design.md §2.1) at tiny size."""
    return {
        "model_type": "hy_v3",
        "architectures": ["HYV3ForCausalLM"],
        "vocab_size": vocab_size,
        "hidden_size": 256,
        "num_hidden_layers": 4,
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
        "head_dim": 32,
        "hidden_act": "silu",
        "intermediate_size": 768,
        "expert_hidden_dim": 256,
        "moe_intermediate_size": 256,
        "num_experts": 8,
        "num_experts_per_tok": 2,
        "num_shared_experts": 1,
        "first_k_dense_replace": 1,
        "moe_router_use_sigmoid": True,
        "moe_router_enable_expert_bias": True,
        "route_norm": True,
        "router_scaling_factor": 2.0,
        "rms_norm_eps": 1e-5,
        "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"},
        "max_position_embeddings": 1024,
        "qk_norm": True,
        "tie_word_embeddings": False,
        "num_nextn_predict_layers": 1,
        "enable_lm_head_fp32": True,
        "enable_moe_fp32_combine": False,
        "enable_attention_fp32_softmax": False,
        "bos_token_id": specials["bos"],
        "eos_token_id": specials["eos"],
        "pad_token_id": specials["pad"],
        "torch_dtype": "bfloat16",
        "dtype": "bfloat16",
    }


AUTOCAST = True


class Data:
    def __init__(self, corpus, split):
        self.arr = {k: np.fromfile(os.path.join(corpus, f"{split}_{k}.u16"), dtype=np.uint16)
                    for k in ("code", "prose")}

    def batch(self, rng, B, T, kind):
        a = self.arr[kind]
        starts = rng.integers(0, len(a) - T - 2, size=B)
        x = np.stack([a[s:s + T + 2] for s in starts]).astype(np.int64)
        return torch.from_numpy(x)

    def fixed(self, kind, n, T):
        """Deterministic, evenly spread validation windows."""
        a = self.arr[kind]
        starts = np.linspace(0, len(a) - T - 3, n).astype(np.int64)
        return torch.from_numpy(np.stack([a[s:s + T + 2] for s in starts]).astype(np.int64))


def losses(model, x):
    """x [B, T+2]: trunk predicts x[:,1:T+1] from x[:,:T]; MTP row p sees (h_p, x[p+1])
    and predicts x[p+2]."""
    T = x.shape[1] - 2
    # bf16 autocast: ~2.5x faster on this CPU (avx512_bf16); master weights stay fp32,
    # norms and the router are computed in fp32 inside the model, CE in fp32.
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=AUTOCAST):
        logits, mlog = model(x[:, :T], x[:, 1:T + 1])
    logits, mlog = logits.float(), mlog.float()
    V = logits.shape[-1]
    lt = F.cross_entropy(logits.reshape(-1, V), x[:, 1:T + 1].reshape(-1))
    lm = F.cross_entropy(mlog.reshape(-1, V), x[:, 2:T + 2].reshape(-1))
    return lt, lm, mlog


@torch.no_grad()
def evaluate(model, val, T, n=24, bs=8):
    model.eval()
    out = {}
    for kind in ("code", "prose"):
        xs = val.fixed(kind, n, T)
        lt = lm = acc = 0.0
        for i in range(0, n, bs):
            x = xs[i:i + bs]
            a, b, mlog = losses(model, x)
            lt += a.item() * len(x)
            lm += b.item() * len(x)
            acc += (mlog.argmax(-1) == x[:, 2:]).float().mean().item() * len(x)
        out[kind] = {"trunk": lt / n, "mtp": lm / n, "mtp_acc": acc / n}
    model.train()
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--corpus", default=".corpus")
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--ctx", type=int, default=256)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--mtp-weight", type=float, default=0.3)
    ap.add_argument("--bias-gamma", type=float, default=1e-3)
    ap.add_argument("--code-frac", type=float, default=0.5)
    ap.add_argument("--eval-every", type=int, default=200)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--log", default=None)
    ap.add_argument("--max-minutes", type=float, default=0,
                    help="time budget on a shared machine: the cosine schedule follows wall-clock time "
                         "when that is ahead of the step count, and training stops (and exports) when "
                         "the budget is used up; the log records where it stopped")
    ap.add_argument("--ckpt", default=None, help="where to save the fp32 torch state (default OUT/../.train-state.pt)")
    a = ap.parse_args()

    torch.manual_seed(a.seed)
    torch.set_num_threads(a.threads)
    rng = np.random.default_rng(a.seed)
    tk = json.load(open(os.path.join(a.tokenizer, "tokenizer.json"), encoding="utf-8"))
    sp = {t["content"]: t["id"] for t in tk["added_tokens"]}
    vocab_size = max(max(tk["model"]["vocab"].values()), max(sp.values())) + 1
    from bpe import BOS, EOS, PAD
    cfgd = model_config(vocab_size, {"bos": sp[BOS], "eos": sp[EOS], "pad": sp[PAD]})
    c = Cfg(cfgd)
    model = HyV3(c)
    nparam = sum(p.numel() for p in model.parameters())
    log = open(a.log or os.path.join(os.path.dirname(a.out.rstrip("/")) or ".", "train.log"), "a")

    def P(*s):
        msg = " ".join(str(x) for x in s)
        print(msg, flush=True)
        log.write(msg + "\n")
        log.flush()

    P(f"# start {time.strftime('%Y-%m-%d %H:%M:%S')} params {nparam} args {vars(a)}")
    train, val = Data(a.corpus, "train"), Data(a.corpus, "val")
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=a.lr, betas=(0.9, 0.95), eps=1e-8)
    moes = model.moe_modules()
    t0 = time.time()
    hist = []
    for step in range(1, a.steps + 1):
        # Cosine progress follows the step count; on a machine shared with other jobs it
        # follows wall-clock time instead when that is further along (--max-minutes), so the
        # schedule always completes within the time budget.  On an idle machine the step
        # count finishes first and the run is deterministic.
        prog = (step - a.warmup) / max(1, a.steps - a.warmup)
        if a.max_minutes and step > a.warmup:
            prog = max(prog, (time.time() - t0) / (a.max_minutes * 60))
        prog = min(prog, 1.0)
        lr = a.lr * (step / a.warmup if step <= a.warmup else 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * prog)))
        for g in opt.param_groups:
            g["lr"] = lr
        ncode = int(round(a.batch * a.code_frac))
        x = torch.cat([train.batch(rng, ncode, a.ctx, "code"),
                       train.batch(rng, a.batch - ncode, a.ctx, "prose")])
        lt, lm, _ = losses(model, x)
        loss = lt + a.mtp_weight * lm
        opt.zero_grad(set_to_none=True)
        loss.backward()
        gn = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        for m in moes:
            m.update_bias(a.bias_gamma)
        hist.append((lt.item(), lm.item()))
        if step % 20 == 0:
            el = time.time() - t0
            tl = np.mean([h[0] for h in hist[-20:]])
            ml = np.mean([h[1] for h in hist[-20:]])
            P(f"step {step} lr {lr:.2e} train_trunk {tl:.4f} train_mtp {ml:.4f} gnorm {gn:.2f} "
              f"elapsed {el:.0f}s tok/s {step * a.batch * a.ctx / el:.0f}")
        out_of_time = step > a.warmup and prog >= 1.0 and step < a.steps
        if step % a.eval_every == 0 or step == a.steps or out_of_time:
            ev = evaluate(model, val, a.ctx)
            P(f"val {step} " + " ".join(f"{k}_{m} {v:.4f}" for k, d in ev.items() for m, v in d.items()))
            bias_rng = [float(m.expert_bias.abs().max()) for m in moes]
            P(f"expert_bias_absmax {step} " + " ".join(f"{b:.3f}" for b in bias_rng))
        if out_of_time:
            P(f"# stopped early at step {step} of {a.steps}: the --max-minutes {a.max_minutes} time budget "
              f"ran out first (cosine schedule followed wall-clock time)")
            break
    P(f"# done {time.strftime('%Y-%m-%d %H:%M:%S')} train_seconds {time.time() - t0:.0f}")
    ck = a.ckpt or os.path.join(a.corpus, "train-state.pt")
    torch.save({"config": cfgd, "state": model.state_dict(), "train_seconds": time.time() - t0}, ck)
    export.export(model, cfgd, a.out, a.tokenizer)
    P(f"# exported to {a.out}")


if __name__ == "__main__":
    main()
