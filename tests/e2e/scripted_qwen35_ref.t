#!/usr/bin/python3
"""tests/ref/make_scripted_ckpt.py on the Gated-DeltaNet hybrids, checked with the reference
forward (tools/ref/qwen35.py), not the engine: random qwen3_5_moe and qwen3_next checkpoints
(tests/ref/make_random_qwen35.py, HF layout bf16: one file with the head inline, as
tests/e2e/server_qwen_chat.t makes them, and two shards with an HF-named sidecar) are
scripted; after a prompt ending in --after, greedy decoding says the script then the eos; the
logits at every chain position are the scripted one (30 * sqrt(hidden), through a final norm that
multiplies by 1: w = 0 for these zero-centred norms) and exact zeros; every output projection
(DeltaNet out_proj, attention o_proj, fused and per-expert down_proj, shared expert, MTP layer) is
zero and every other tensor, the MTP head's included, is the base's bit for bit. Bad requests
fail with a named error.

  prove -v tests/e2e/scripted_qwen35_ref.t
"""
import json
import os
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tap import PY, ROOT, Tap, run  # noqa: E402

sys.path.insert(0, os.path.join(ROOT, "tools", "train"))
from safetensors_io import read_file  # noqa: E402

MAKER = "tests/ref/make_random_qwen35.py"
SCRIPTER = "tests/ref/make_scripted_ckpt.py"
REF = "tools/ref/qwen35.py"
PROMPT, AFTER, SCRIPT, EOS = [11, 12, 13, 14, 40], 5, [7, 100, 3, 418, 9], 2   # eos: the generator's
Q35 = ("model.language_model.embed_tokens.weight", "lm_head.weight", "model.language_model.norm.weight")
NEXT = ("model.embed_tokens.weight", "lm_head.weight", "model.norm.weight")
# (family, generator options, the tensors rewritten besides the output projections, the kinds of
# output projection it has: qwen3_5_moe's trunk experts fused, its MTP experts and Qwen3-Next's
# per expert)
CASES = [
    ("qwen3_5_moe", [], Q35, 4),
    ("qwen3_next", [], NEXT, 3),
    ("qwen3_5_moe", ["--shards", "2", "--mtp", "sidecar-hf"], Q35, 4),
]
OUTPUT_PROJ = ("linear_attn.out_proj.weight", "self_attn.o_proj.weight", "down_proj.weight", "mlp.experts.down_proj")


def tensors(d):
    out = {}
    for f in sorted(os.listdir(d)):
        if f.endswith(".safetensors"):
            out.update({(f, n): v for n, v in read_file(os.path.join(d, f), raw=True).items()})
    return out


def check_tensors(t, label, base, scripted, rewritten, nkinds):
    """Output projections zero, the rewritten tensors present, everything else unchanged."""
    a, b = tensors(base), tensors(scripted)
    t.ok(set(a) == set(b), f"{label}: same files and tensors", sorted(set(a) ^ set(b))[:10])
    outs = [k for k in a if k[1].endswith(OUTPUT_PROJ)]
    kinds = {s for s in OUTPUT_PROJ for k in outs if k[1].endswith(s)}
    mtp = [k for k in outs if k[1].startswith("mtp.")]
    t.ok(all(k in b and not b[k].any() for k in outs) and len(kinds) == nkinds and mtp,
         f"{label}: all {len(outs)} output projections zero ({len(mtp)} in the MTP layer)", sorted(kinds))
    seen = {k[1] for k in a}
    changed = [k for k in a if k in b and k[1] not in rewritten and k not in outs and
               not (a[k].dtype == b[k].dtype and np.array_equal(a[k], b[k]))]
    t.ok(all(n in seen for n in rewritten) and not changed,
         f"{label}: {', '.join(rewritten)} rewritten, every other tensor bit-identical", changed[:10])


def check_reference(t, label, scripted, hidden, eps):
    with tempfile.TemporaryDirectory(prefix="nextn-scripted-logits-") as d:
        lp = os.path.join(d, "l.npy")
        r = run([PY, REF, "--model", scripted, "--tokens", ",".join(map(str, PROMPT + [AFTER] + SCRIPT)),
                 "--logits", lp], check=False)
        g = run([PY, REF, "--model", scripted, "--tokens", ",".join(map(str, PROMPT + [AFTER])),
                 "--greedy", str(len(SCRIPT) + 1)], check=False)
        got = g.stdout.split()
        t.ok(g.returncode == 0 and got == [str(x) for x in SCRIPT + [EOS]],
             f"{label}: reference greedy after {AFTER} says {SCRIPT} then eos {EOS}", got or g.stderr[-2000:])
        if not t.ok(r.returncode == 0, f"{label}: reference logits", r.stderr[-2000:]):
            return
        lg = np.load(lp)[len(PROMPT):]                      # rows at after, script...
        want = np.zeros_like(lg)
        for k, nxt in enumerate(SCRIPT + [EOS]):
            want[k, nxt] = 30 / np.sqrt(1 / hidden + eps)    # the one-hot embedding through a norm of 1
        err = float(np.abs(lg - want).max())
        t.ok(err <= 1e-4 * want.max(), f"{label}: chain logits 30 * sqrt(hidden) and exact zeros (max |d| {err:.2e})")


def expect_error(t, label, args, words):
    r = run([PY, SCRIPTER, *args], check=False)
    t.ok(r.returncode != 0 and r.stderr.startswith("make_scripted_ckpt: ") and all(w in r.stderr for w in words),
         f"refused, named: {label}", r.stderr[-800:])


def main():
    t = Tap()
    with tempfile.TemporaryDirectory(prefix="nextn-scripted-qwen35-") as d:
        for i, (family, opts, rewritten, nkinds) in enumerate(CASES):
            label = f"{family} {' '.join(opts) or 'single file'}"
            base, scripted = os.path.join(d, f"b{i}"), os.path.join(d, f"s{i}")
            run([PY, MAKER, "--family", family, "--layout", "hf", "--seed", "1", *opts, "--out", base])
            r = run([PY, SCRIPTER, "--base", base, "--after", str(AFTER), "--script", ",".join(map(str, SCRIPT)),
                     "--eos", str(EOS), "--out", scripted], check=False)
            if not t.ok(r.returncode == 0, f"{label}: make_scripted_ckpt.py", r.stderr[-2000:]):
                continue
            cfg = json.load(open(os.path.join(base, "config.json")))
            text = cfg.get("text_config", cfg)
            check_tensors(t, label, base, scripted, rewritten, nkinds)
            check_reference(t, label, scripted, text["hidden_size"], text["rms_norm_eps"])

        base, out = os.path.join(d, "b0"), os.path.join(d, "bad")
        common = ["--base", base, "--out", out]
        expect_error(t, "a repeated chain token", [*common, "--after", "5", "--script", "7,5", "--eos", "2"],
                     ["distinct"])
        expect_error(t, "an eos not in text_config", [*common, "--after", "5", "--script", "7", "--eos", "3"],
                     ["--eos 3", "eos_token_id"])
        expect_error(t, "a token past the vocabulary", [*common, "--after", "5", "--script", "7,419", "--eos", "2"],
                     ["419", "embed_tokens"])
        long = ",".join(str(10 + k) for k in range(160))
        expect_error(t, "a chain longer than the hidden size", [*common, "--after", "5", "--script", long,
                                                                "--eos", "2"], ["161 chain tokens", "160"])
        quant = os.path.join(d, "q")
        run([PY, MAKER, "--family", "qwen3_next", "--layout", "mlx", "--quant", "4:32", "--seed", "1", "--out", quant])
        expect_error(t, "a quantized base", ["--base", quant, "--out", out, "--after", "5", "--script", "7",
                                             "--eos", "2"], ["quantized", "bf16"])
    t.done()


if __name__ == "__main__":
    main()
