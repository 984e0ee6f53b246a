#!/usr/bin/python3
"""Trains the MTP head of a checkpoint on its own trunk (self-distillation): the trainer half of
`nextn forge` (docs/forge.md).

Input: a checkpoint directory (--model) and a training shard written by `nextn forge` (--shard):
tokens.npy [N, T] int32, hidden.npy [N, T, H] float16 (the trunk hidden states the head is fed),
topk_ids.npy / topk_logp.npy [N, T, K] (the trunk's K most likely next tokens and their
log-probabilities), check_hidden.npy / check_mtp_logits.npy (window 0 as the engine computes
it: exact hidden, and the head's logits) and meta.json.

Head row p of a window pairs hidden[p] with token t[p+1] at position p and is trained towards
the trunk's distribution at p+1 (KL over the top-K tokens plus the remaining mass as one bucket)
plus `--ce-weight` times the cross-entropy of the text token t[p+2]. Only the MTP layer trains
(eh_proj / fc, its norms, its decoder layer); the embedding, lm_head and the selection-only
router bias stay frozen.

Before training, the trainer's forward of the head on window 0 must reproduce the engine's
logits (`nextn eval --mtp-logits` on the same weights): otherwise it refuses, naming the max
error, since a head trained through a different forward would not draft for the engine.

Output (--out): config.json and model.safetensors holding only the head, in the family's HF
naming (Qwen: mlx-lm's stacked naming) and the trunk's float dtype, for `nextn graft`; and
train.json (steps, tokens, losses, agreement, wall time).

--random-head DIR --model M writes a randomly initialised head for M (its shapes taken from the
family's config and a trunk layer) for `--init random`.

Families: hy_v3 (tools/train/model.py's MTPLayer), glm4_moe, glm4_moe_lite / deepseek_v3 and
qwen3_5_moe / qwen3_next (the PyTorch references in tools/ref/).
"""
import argparse
import json
import math
import os
import re
import signal
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "train"))
sys.path.insert(0, os.path.join(HERE, "..", "ref"))
from safetensors_io import read_header, write_file, f32_to_bf16  # noqa: E402


def model_files(model_dir):
    return sorted(os.path.join(model_dir, f) for f in os.listdir(model_dir)
                  if f.startswith("model") and f.endswith(".safetensors"))


def float_dtype(model_dir):
    """The trunk's float dtype (BF16, F16 or F32): the embedding's, or BF16 when it is quantized."""
    for f in model_files(model_dir):
        h, _ = read_header(f)
        for k, v in h.items():
            if k.endswith("embed_tokens.weight") and isinstance(v, dict):
                return v["dtype"] if v["dtype"] in ("BF16", "F16", "F32") else "BF16"
    return "BF16"


def load_config(model_dir):
    with open(os.path.join(model_dir, "config.json")) as f:
        return json.load(f)


def store(a, dtype):
    a = np.ascontiguousarray(a, dtype=np.float32)
    if dtype == "BF16":
        return ("BF16", f32_to_bf16(a))
    if dtype == "F16":
        return ("F16", a.astype(np.float16))
    return ("F32", a)


def write_head(out, model_dir, tensors, dtype, extra_cfg=None):
    """out/model.safetensors (the head only) and out/config.json (the model's, unquantized)."""
    os.makedirs(out, exist_ok=True)
    t = {k: (("F32", np.ascontiguousarray(v, np.float32)) if k.endswith(("expert_bias", "e_score_correction_bias"))
             else store(v, dtype)) for k, v in tensors.items()}
    write_file(os.path.join(out, "model.safetensors"), t, metadata={"format": "pt"})
    cfg = load_config(model_dir)
    for k in ("quantization", "quantization_config"):
        cfg.pop(k, None)
    cfg.update(extra_cfg or {})
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)


def rms(x, w, eps):
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def randn(shape, std, gen):
    return (torch.randn(*shape, generator=gen) * std).numpy()


# ----------------------------------------------------------------------------------------------
# hy_v3: the training model's MTPLayer (tools/train/model.py)
# ----------------------------------------------------------------------------------------------

class HyHead:
    def __init__(self, model_dir, meta, random_init=False):
        import model as hy
        from export import _layer_items
        from safetensors_io import read_dir_tensors
        self.hy, self.layer_items = hy, _layer_items
        self.model_dir = model_dir
        self.c = c = hy.Cfg.load(model_dir)
        w = hy._normalize_names(read_dir_tensors(model_dir, c.quantization), c)
        self.embed = torch.from_numpy(w["model.embed_tokens.weight"])
        lm = w.get("lm_head.weight") if not c.tie_word_embeddings else None
        self.lm_head = torch.from_numpy(lm if lm is not None else w["model.embed_tokens.weight"])
        P = "model.layers.mtp."
        if not random_init:
            experts = w[P + "mlp.experts.gate_proj.weight"].shape[0]
            c.mtp_num_experts = experts
        torch.manual_seed(1234)
        self.mtp = hy.MTPLayer(c)
        if not random_init:
            self._load(w, P)
        self.meta = meta

    def _load(self, w, P):
        m, L = self.mtp, self.mtp.layer
        pairs = [(m.enorm.weight, "enorm.weight"), (m.hnorm.weight, "hnorm.weight"), (m.eh_proj.weight, "eh_proj.weight"),
                 (m.final_layernorm.weight, "final_layernorm.weight"),
                 (L.input_layernorm.weight, "input_layernorm.weight"),
                 (L.post_attention_layernorm.weight, "post_attention_layernorm.weight"),
                 (L.self_attn.q_norm.weight, "self_attn.q_norm.weight"),
                 (L.self_attn.k_norm.weight, "self_attn.k_norm.weight"),
                 (L.mlp.gate.weight, "mlp.router.gate.weight"), (L.mlp.w_gate, "mlp.experts.gate_proj.weight"),
                 (L.mlp.w_up, "mlp.experts.up_proj.weight"), (L.mlp.w_down, "mlp.experts.down_proj.weight")]
        pairs += [(getattr(L.self_attn, n).weight, f"self_attn.{n}.weight") for n in ("q_proj", "k_proj", "v_proj", "o_proj")]
        pairs += [(getattr(L.mlp.shared_mlp, n).weight, f"mlp.shared_mlp.{n}.weight")
                  for n in ("gate_proj", "up_proj", "down_proj")]
        with torch.no_grad():
            for dst, name in pairs:
                src = torch.from_numpy(np.ascontiguousarray(w[P + name]))
                if dst.shape != src.shape:
                    raise ValueError(f"{P}{name}: shape {tuple(src.shape)}, the head needs {tuple(dst.shape)}")
                dst.copy_(src)
            if P + "mlp.expert_bias" in w:
                L.mlp.expert_bias.copy_(torch.from_numpy(w[P + "mlp.expert_bias"]))

    def params(self):
        return [p for p in self.mtp.parameters()]

    def forward(self, tok_next, hidden):
        B, T = tok_next.shape
        c = self.c
        cos, sin = self.hy.rope_cache(T, c.head_dim, c.rope_theta)
        mask = torch.triu(torch.full((T, T), float("-inf")), 1)
        e = self.embed[tok_next]
        if self.meta.get("mtp_zero_pos0"):
            e = e.clone()
            e[:, 0] = 0
        m = self.mtp
        a, b = m.enorm(e), m.hnorm(hidden)
        u = torch.cat([b, a] if self.meta.get("mtp_concat") == "hidden,embed" else [a, b], -1)
        return m.final_layernorm(m.layer(m.eh_proj(u), cos, sin, mask))

    def head_weight(self):
        return self.lm_head

    def export(self, out, dtype):
        N = self.c.num_hidden_layers
        p = f"model.layers.{N}."
        m = self.mtp
        items = [(p + "enorm.weight", m.enorm.weight), (p + "hnorm.weight", m.hnorm.weight),
                 (p + "eh_proj.weight", m.eh_proj.weight)]
        items += self.layer_items(p, m.layer)
        items.append((p + "final_layernorm.weight", m.final_layernorm.weight))
        t = {}
        for name, v in items:
            t[name] = (v[0].detach()[v[1]] if isinstance(v, tuple) else v.detach()).float().numpy()
        extra = {"num_nextn_predict_layers": 1}
        if m.layer.mlp.E != self.c.num_experts:
            extra["mtp_num_experts"] = m.layer.mlp.E
        write_head(out, self.model_dir, t, dtype, extra)


# ----------------------------------------------------------------------------------------------
# glm4_moe, glm4_moe_lite / deepseek_v3 (tools/ref/glm4_moe_torch.py, mla_torch.py)
# ----------------------------------------------------------------------------------------------

EXPERTS = re.compile(r"^(.*\.mlp\.experts)\.(gate|up|down)_proj\.weight$")


class GlmHead:
    FROZEN = ("embed_tokens.weight", "shared_head.head.weight", "e_score_correction_bias")

    def __init__(self, model_dir, meta, random_init=False):
        family = load_config(model_dir).get("model_type")
        if family == "glm4_moe":
            from glm4_moe_torch import TorchGlm as cls
        else:
            from mla_torch import TorchMla as cls
            import mla
            self.fold = mla.fold_mlx_kv_b
        self.model_dir, self.meta = model_dir, meta
        self.t = t = cls.__new__(cls)
        self._init_torch(t, cls, model_dir, family)
        c = t.c
        self.P = P = f"model.layers.{c.num_hidden_layers}."
        if random_init:
            self._random(P)
        self.trainable = {}
        for k in list(t.w):
            if k.startswith(P) and not k.endswith(self.FROZEN):
                t.w[k] = torch.nn.Parameter(t.w[k].clone().float())
                self.trainable[k] = t.w[k]

    def _init_torch(self, t, cls, model_dir, family):
        from glm4_moe import normalize_names
        from safetensors_io import read_dir_tensors
        t.c = c = cls.config_cls.load(model_dir)
        w = normalize_names(read_dir_tensors(model_dir, c.quantization))
        if family != "glm4_moe":
            self.fold(w, c)
        t.w = {k: torch.from_numpy(np.ascontiguousarray(v, np.float32)) for k, v in w.items()}
        t.lm_head = t.w.get("lm_head.weight", t.w["model.embed_tokens.weight"])
        t.mtp_zero_pos0 = True

    def _random(self, P):
        """A head shaped like the last trunk layer (an MoE layer), random matrices, unit norms."""
        t, c = self.t, self.t.c
        src = f"model.layers.{c.num_hidden_layers - 1}."
        gen = torch.Generator().manual_seed(1234)
        H = c.hidden_size
        for k in [k for k in t.w if k.startswith(src)]:
            v = t.w[k]
            name = P + k[len(src):]
            if k.endswith("norm.weight"):
                t.w[name] = torch.ones_like(v)
            elif k.endswith("bias"):
                t.w[name] = torch.zeros_like(v)
            else:
                t.w[name] = torch.from_numpy(randn(v.shape, v.shape[-1] ** -0.5, gen))
        t.w[P + "enorm.weight"] = torch.ones(H)
        t.w[P + "hnorm.weight"] = torch.ones(H)
        t.w[P + "shared_head.norm.weight"] = torch.ones(H)
        t.w[P + "eh_proj.weight"] = torch.from_numpy(randn((H, 2 * H), (2 * H) ** -0.5, gen))

    def params(self):
        return list(self.trainable.values())

    def forward(self, tok_next, hidden):
        t, c, P = self.t, self.t.c, self.P
        w = t.w
        E = w[P + "mlp.experts.gate_proj.weight"].shape[0]
        trunk_E, c.n_routed_experts = c.n_routed_experts, E
        out = []
        try:
            for b in range(tok_next.shape[0]):
                T = tok_next.shape[1]
                pos = torch.arange(T)
                e = w.get(P + "embed_tokens.weight", w["model.embed_tokens.weight"])[tok_next[b]]
                if self.meta.get("mtp_zero_pos0"):
                    e = e.clone()
                    e[0] = 0
                a, h = rms(e, w[P + "enorm.weight"], c.rms_norm_eps), rms(hidden[b], w[P + "hnorm.weight"], c.rms_norm_eps)
                u = torch.cat([h, a] if self.meta.get("mtp_concat") == "hidden,embed" else [a, h], -1)
                o = t.layer(P, F.linear(u, w[P + "eh_proj.weight"]), pos, False)
                out.append(rms(o, w[P + "shared_head.norm.weight"], c.rms_norm_eps))
        finally:
            c.n_routed_experts = trunk_E
        return torch.stack(out)

    def head_weight(self):
        return self.t.w.get(self.P + "shared_head.head.weight", self.t.lm_head)

    def export(self, out, dtype):
        t = {}
        for k, v in self.t.w.items():
            if not k.startswith(self.P):
                continue
            a = v.detach().float().numpy()
            m = EXPERTS.match(k)
            if m and a.ndim == 3:
                for e in range(a.shape[0]):
                    t[f"{m.group(1)}.{e}.{m.group(2)}_proj.weight"] = a[e]
            else:
                t[k] = a
        E = self.t.w[self.P + "mlp.experts.gate_proj.weight"].shape[0]
        extra = {"num_nextn_predict_layers": 1}
        if E != self.t.c.n_routed_experts:
            extra["mtp_num_experts"] = E
        write_head(out, self.model_dir, t, dtype, extra)


# ----------------------------------------------------------------------------------------------
# qwen3_5_moe / qwen3_next (tools/ref/qwen35_torch.py)
# ----------------------------------------------------------------------------------------------

class QwenHead:
    P = "mtp."

    def __init__(self, model_dir, meta, random_init=False):
        from qwen35_torch import TorchQwen35
        self.model_dir, self.meta = model_dir, meta
        self.t = t = TorchQwen35(model_dir)
        if random_init:
            self._random()
        self.trainable = {}
        for k in list(t.w):
            if k.startswith(self.P):
                t.w[k] = torch.nn.Parameter(t.w[k].clone().float())
                self.trainable[k] = t.w[k]

    def _random(self):
        """A head shaped like the last full-attention trunk layer, random matrices, unit norms."""
        t, c = self.t, self.t.c
        last = max(i for i, lt in enumerate(c.layer_types) if lt == "full_attention")
        src = f"model.layers.{last}."
        gen = torch.Generator().manual_seed(1234)
        H = c.hidden_size
        for k in [k for k in t.w if k.startswith(src)]:
            v = t.w[k]
            name = "mtp.layers.0." + k[len(src):]
            if k.endswith("norm.weight"):
                t.w[name] = torch.ones_like(v)
            else:
                t.w[name] = torch.from_numpy(randn(v.shape, v.shape[-1] ** -0.5, gen))
        for n in ("pre_fc_norm_embedding", "pre_fc_norm_hidden", "norm"):
            t.w[f"mtp.{n}.weight"] = torch.ones(H)
        t.w["mtp.fc.weight"] = torch.from_numpy(randn((H, 2 * H), (2 * H) ** -0.5, gen))

    def params(self):
        return list(self.trainable.values())

    def forward(self, tok_next, hidden):
        t, c, w = self.t, self.t.c, self.t.w
        out = []
        for b in range(tok_next.shape[0]):
            T = tok_next.shape[1]
            pos = torch.arange(T)
            e = w["model.embed_tokens.weight"][tok_next[b]]
            if self.meta.get("mtp_zero_pos0"):
                e = e.clone()
                e[0] = 0
            a = rms(e, w["mtp.pre_fc_norm_embedding.weight"], c.rms_norm_eps)
            h = rms(hidden[b], w["mtp.pre_fc_norm_hidden.weight"], c.rms_norm_eps)
            u = torch.cat([h, a] if self.meta.get("mtp_concat") == "hidden,embed" else [a, h], -1)
            o = t.layer("mtp.layers.0.", t.lin(u, "mtp.fc"), pos, True)
            out.append(rms(o, w["mtp.norm.weight"], c.rms_norm_eps))
        return torch.stack(out)

    def head_weight(self):
        return self.t.lm_head

    def export(self, out, dtype):
        """mlx-lm's naming: stacked switch_mlp experts, norms stored as the multiplier they apply."""
        t = {}
        for k, v in self.t.w.items():
            if not k.startswith(self.P):
                continue
            a = v.detach().float().numpy()
            m = EXPERTS.match(k)
            t[f"{m.group(1)[:-len('experts')]}switch_mlp.{m.group(2)}_proj.weight" if m else k] = a
        E = self.t.w["mtp.layers.0.mlp.experts.gate_proj.weight"].shape[0]
        extra = {}
        cfgd = load_config(self.model_dir)
        tc = cfgd.get("text_config", cfgd)
        if tc.get("mtp_num_hidden_layers", 0) < 1:
            extra["mtp_num_hidden_layers"] = 1
        if E != tc.get("num_experts"):
            extra["mtp_num_experts"] = E
        write_head(out, self.model_dir, t, dtype, extra)


FAMILIES = {"hy_v3": HyHead, "glm4_moe": GlmHead, "glm4_moe_lite": GlmHead, "deepseek_v3": GlmHead,
            "qwen3_5_moe": QwenHead, "qwen3_next": QwenHead}


def make_head(model_dir, meta, random_init=False):
    family = load_config(model_dir).get("model_type")
    if family not in FAMILIES:
        sys.exit(f"train_head: {model_dir}: model_type {family!r} is not one of {', '.join(FAMILIES)}")
    return FAMILIES[family](model_dir, meta, random_init)


# ----------------------------------------------------------------------------------------------
# the shard, the check, the loss
# ----------------------------------------------------------------------------------------------

class Shard:
    def __init__(self, d):
        with open(os.path.join(d, "meta.json")) as f:
            self.meta = json.load(f)
        ld = lambda n: np.load(os.path.join(d, n + ".npy"), mmap_mode="r")  # noqa: E731
        self.tokens, self.hidden = ld("tokens"), ld("hidden")
        self.ids, self.logp = ld("topk_ids"), ld("topk_logp")
        self.dir = d
        N = self.tokens.shape[0]
        n_val = max(1, N // 50) if N >= 4 else 0
        self.train = np.arange(N - n_val)
        self.val = np.arange(N - n_val, N) if n_val else self.train[:1]

    def batch(self, idx):
        """Rows p = 0..T-2 of windows idx: next tokens, hidden, targets at p+1, text token p+2."""
        idx = np.sort(idx)
        tok = torch.from_numpy(np.asarray(self.tokens[idx], np.int64))
        hid = torch.from_numpy(np.asarray(self.hidden[idx], np.float32))
        return (tok[:, 1:], hid[:, :-1], torch.from_numpy(np.asarray(self.ids[idx, 1:], np.int64)),
                torch.from_numpy(np.asarray(self.logp[idx, 1:], np.float32)), tok[:, 2:])


def losses(logits, ids, logp, text):
    """Summed over rows: KL(trunk's top-K + the rest as one bucket || head), the text
    cross-entropy (rows with text < 0 have none) and the agreement of the argmaxes. logits
    [n, V], ids / logp [n, K], text [n]. One gather keeps the backward to one pass over V."""
    logits = logits.float()
    lse = torch.logsumexp(logits, -1)
    K = ids.shape[-1]
    keep = text >= 0
    sel = logits.gather(-1, torch.cat([ids, text.clamp_min(0)[:, None]], -1)) - lse[:, None]
    lq_top, lq_text = sel[:, :K], sel[:, K]
    p_top = logp.exp()
    rest_p = (1 - p_top.sum(-1)).clamp_min(1e-8)
    rest_q = (1 - lq_top.exp().sum(-1)).clamp(1e-8, 1.0)
    kl = (p_top * (logp - lq_top)).sum(-1) + rest_p * (rest_p.log() - rest_q.log())
    with torch.no_grad():
        agree = (logits.argmax(-1) == ids[:, 0]).float().sum()
    return kl.sum(), -lq_text[keep].sum(), agree


def head_losses(head, tok, hid, ids, logp, text, ce_weight=0.0, backward=False, chunk=1024):
    """Mean KL, CE and agreement of the head on a batch, the full-vocabulary part (lm_head,
    log-softmax) in chunks of rows so no [rows, vocab] tensor of the whole batch is ever held;
    with backward, the gradients of KL + ce_weight * CE."""
    hm = head.forward(tok, hid)
    B, R, H = hm.shape
    W = head.head_weight()
    hd = hm.detach().reshape(B * R, H).requires_grad_(backward)
    flat = lambda x: x.reshape(B * R, *x.shape[2:])  # noqa: E731
    ids_f, logp_f = flat(ids), flat(logp)
    tt = torch.cat([text, torch.full((B, 1), -1, dtype=text.dtype)], 1).reshape(B * R)
    n_rows, n_text = B * R, B * (R - 1)
    tot = [0.0, 0.0, 0.0]
    for i in range(0, B * R, chunk):
        sl = slice(i, min(i + chunk, B * R))
        kl, ce, ag = losses(hd[sl] @ W.t(), ids_f[sl], logp_f[sl], tt[sl])
        if backward:
            ((kl / n_rows) + ce_weight * (ce / n_text)).backward()
        tot[0] += float(kl)
        tot[1] += float(ce)
        tot[2] += float(ag)
    if backward:
        hm.backward(hd.grad.reshape(B, R, H))
    return tot[0] / n_rows, tot[1] / n_text, tot[2] / n_rows


def check_forward(head, shard, tol):
    """The trainer's head logits on window 0 against the engine's; refuses on mismatch."""
    ref = np.load(os.path.join(shard.dir, "check_mtp_logits.npy"))
    hid = torch.from_numpy(np.load(os.path.join(shard.dir, "check_hidden.npy")))
    tok = torch.from_numpy(np.asarray(shard.tokens[0], np.int64))
    with torch.no_grad():
        got = (head.forward(tok[None, 1:], hid[None, :-1])[0] @ head.head_weight().t()).float().numpy()
    if got.shape != ref.shape:
        sys.exit(f"train_head: refusing: head logits {got.shape}, the engine's {ref.shape}")
    d = np.abs(got - ref)
    r, v = np.unravel_index(int(np.argmax(d)), d.shape)
    scale = max(1.0, float(np.abs(ref).max()))
    agree = float((got.argmax(-1) == ref.argmax(-1)).mean())
    msg = (f"max |logit difference| {d.max():.4g} at row {r} token {v} (logit scale {scale:.3g}, "
           f"relative {d.max() / scale:.3g}, tolerance {tol:g}); argmax agreement {agree:.4f}")
    if not np.isfinite(d.max()) or d.max() / scale > tol:
        sys.exit("train_head: refusing to train: the trainer's forward of the MTP head does not match the "
                 f"engine's (nextn eval --mtp-logits) on the same weights: {msg}")
    print(f"train_head: forward check against the engine: {msg}", flush=True)
    return float(d.max())


def evaluate(head, shard, n=16):
    idx = shard.val[:n]
    kl = ce = ag = 0.0
    with torch.no_grad():
        for i in range(0, len(idx), 4):
            a, b, c = head_losses(head, *shard.batch(idx[i:i + 4]))
            m = len(idx[i:i + 4])
            kl, ce, ag = kl + a * m, ce + b * m, ag + c * m
    return kl / len(idx), ce / len(idx), ag / len(idx)


def fmt_time(s):
    s = int(max(0, s))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


STOP = []


def on_interrupt(sig, frame):
    """Ctrl-C (SIGINT) ends training after the current step; the head trained so far is written."""
    if STOP:
        raise KeyboardInterrupt
    STOP.append(sig)
    print("train_head: interrupted: stopping after this step and writing the head (again to abort)", flush=True)


def train(head, shard, a):
    params = head.params()
    opt = torch.optim.AdamW(params, lr=a.lr, betas=(0.9, 0.95), weight_decay=0.0)
    rng = np.random.default_rng(a.seed)
    warm = max(1, min(50, a.steps // 10))
    t0 = time.time()
    kl0, ce0, ag0 = evaluate(head, shard)
    print(f"train_head: before: val KL {kl0:.4f} CE {ce0:.4f} agreement with trunk {ag0:.4f}", flush=True)
    hist, step, T = [], 0, shard.tokens.shape[1]
    budget = a.minutes * 60 if a.minutes > 0 else None
    while step < a.steps:
        el = time.time() - t0
        frac = max(step / a.steps, el / budget if budget else 0.0)
        if frac >= 1.0 or STOP:
            break
        lr = a.lr * (step + 1) / warm if step < warm else a.lr * (0.1 + 0.45 * (1 + math.cos(math.pi * frac)))
        for g in opt.param_groups:
            g["lr"] = lr
        tok, hid, ids, logp, text = shard.batch(rng.choice(shard.train, size=min(a.batch, len(shard.train)),
                                                           replace=len(shard.train) < a.batch))
        opt.zero_grad()
        kl, ce, ag = head_losses(head, tok, hid, ids, logp, text, a.ce_weight, backward=True)
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        step += 1
        hist.append((kl + a.ce_weight * ce, kl, ce, ag))
        if step % a.log_every == 0 or step == a.steps or step == 1:
            m = np.mean(hist[-a.log_every:], 0)
            el = time.time() - t0
            frac = max(step / a.steps, el / budget if budget else 0.0)
            eta = el / frac - el if frac > 0 else 0
            tps = step * tok.numel() / max(el, 1e-9)
            print(f"step {step}/{a.steps} loss {m[0]:.4f} kl {m[1]:.4f} ce {m[2]:.4f} agree {m[3]:.4f} "
                  f"lr {lr:.2e} {tps:.0f} tok/s elapsed {fmt_time(el)} ETA {fmt_time(eta)}", flush=True)
        if a.eval_every and step % a.eval_every == 0:
            v = evaluate(head, shard)
            print(f"val {step} kl {v[0]:.4f} ce {v[1]:.4f} agree {v[2]:.4f}", flush=True)
    secs = time.time() - t0
    kl1, ce1, ag1 = evaluate(head, shard)
    print(f"train_head: after {step} steps ({secs / 60:.1f} min): val KL {kl1:.4f} CE {ce1:.4f} agreement "
          f"{ag1:.4f}", flush=True)
    n = max(1, min(20, len(hist) // 4))
    first = np.mean(hist[:n], 0).tolist() if hist else None
    last = np.mean(hist[-n:], 0).tolist() if hist else None
    return {"steps": step, "seconds": secs, "tokens": step * a.batch * (T - 1), "batch": a.batch, "lr": a.lr,
            "ce_weight": a.ce_weight, "train_loss_first": first[0] if first else None,
            "train_loss_last": last[0] if last else None, "val_before": {"kl": kl0, "ce": ce0, "agree": ag0},
            "val_after": {"kl": kl1, "ce": ce1, "agree": ag1}}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--shard")
    ap.add_argument("--out")
    ap.add_argument("--random-head", help="write a random head for --model to this directory and exit")
    ap.add_argument("--check-only", action="store_true", help="run the forward check against the engine and exit")
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--minutes", type=float, default=0.0)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--ce-weight", type=float, default=0.1)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--log-every", type=int, default=10)
    ap.add_argument("--eval-every", type=int, default=200)
    ap.add_argument("--tolerance", type=float, default=None,
                    help="max |logit difference| / max(1, max |logit|) of the forward check "
                         "(default 2e-3 for float weights, 5e-2 for quantized)")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    dtype = float_dtype(a.model)
    if a.random_head:
        make_head(a.model, {}, random_init=True).export(a.random_head, dtype)
        print(f"train_head: wrote a random head to {a.random_head}", flush=True)
        return
    if not a.shard or not (a.out or a.check_only):
        sys.exit("train_head: needs --shard and --out (or --random-head)")
    shard = Shard(a.shard)
    head = make_head(a.model, shard.meta)
    quantized = bool(load_config(a.model).get("quantization") or load_config(a.model).get("quantization_config"))
    tol = a.tolerance if a.tolerance is not None else (5e-2 if quantized else 2e-3)
    err = check_forward(head, shard, tol)
    if a.check_only:
        return
    signal.signal(signal.SIGINT, on_interrupt)
    info = train(head, shard, a)
    info.update({"check_max_abs_error": err, "shard_windows": int(shard.tokens.shape[0]),
                 "ctx": int(shard.tokens.shape[1]), "top_k": int(shard.ids.shape[2]),
                 "shard_tokens": int(shard.tokens.size)})
    head.export(a.out, dtype)
    with open(os.path.join(a.out, "train.json"), "w") as f:
        json.dump(info, f, indent=1)
    print(f"train_head: wrote the head to {a.out}", flush=True)


if __name__ == "__main__":
    main()
