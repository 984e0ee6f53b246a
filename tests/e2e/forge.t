#!/usr/bin/python3
"""`nextn forge` end to end, a smoke forge of seconds per checkpoint: small random checkpoints of
every family nextn runs (hy_v3 bf16 and MLX 4-bit with its head in a sidecar, glm4_moe,
deepseek_v3, glm4_moe_lite, qwen3_5_moe, qwen3_next; headless ones start from a random head) and
the default model. For each: the trainer's forward check against the engine passes, the training
loss falls, the written head loads and drafts with greedy MTP output equal to plain decoding, and
the engine's reading of the written sidecar is the trainer's head (the check passes again on the
output). The check refuses a head whose weights differ from the ones the engine ran, naming the
max error; bad input is a named error."""
import json
import os
import shutil
import struct
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tap import PY, ROOT, Tap, nextn, run, scratch  # noqa: E402

t = Tap()
tmp = scratch(prefix="nextn-forge-")
TRAINER = os.path.join(ROOT, "tools", "forge", "train_head.py")
REF = os.path.join(ROOT, "tests", "ref")
PROMPT = "3,14,15,92,65,35,89"
SMALL = ["--ctx", 32, "--tokens", 1536, "--steps", 12, "--batch", 4]

CKPTS = {
    "hy_v3": ["make_random_ckpt.py"],
    "hy_v3 mlx 4-bit, head in a sidecar": ["make_random_ckpt.py", "--layout", "mlx", "--quant", "4:32", "--mtp", "sidecar"],
    "hy_v3 headless": ["make_random_ckpt.py", "--mtp", "none"],
    "glm4_moe": ["make_random_glm.py"],
    "deepseek_v3": ["make_random_mla.py", "--family", "deepseek_v3"],
    "glm4_moe_lite": ["make_random_mla.py", "--family", "glm4_moe_lite"],
    "qwen3_5_moe": ["make_random_qwen35.py", "--family", "qwen3_5_moe"],
    "qwen3_next mlx headless": ["make_random_qwen35.py", "--family", "qwen3_next", "--layout", "mlx"],
}


def d(*p):
    return os.path.join(tmp, *p)


def write_ids(path, n, vocab, seed):
    ids = np.random.default_rng(seed).integers(0, vocab, n)
    with open(path, "w") as f:
        f.write(" ".join(map(str, ids)))


def greedy(model, draft):
    r = nextn("run", "-m", model, "--prompt-tokens", PROMPT, "-n", 24, "--print-ids", "--ignore-eos", "--quiet",
              "--draft", draft, "--stats")
    drafted = [ln for ln in r.stderr.splitlines() if ln.startswith("drafts ")]
    return r.stdout.split(), int(drafted[0].split()[1].rstrip(",")) if drafted else 0


def check_written(name, out):
    """The engine's logits of the written head, with a fresh shard, against the trainer's forward
    of the same files: what was written is what the engine reads."""
    r = nextn("forge", "-m", out, "--corpus", d("corpus.ids"), "--ctx", 32, "--tokens", 64, "--dump-only",
              "--work", out + ".check", check=False)
    c = run([PY, TRAINER, "--model", out, "--shard", os.path.join(out + ".check", "shard"), "--check-only"],
            check=False) if r.returncode == 0 else r
    t.ok(c.returncode == 0 and "forward check against the engine" in c.stdout,
         f"{name}: the written head is the trained one (engine vs trainer on the output)", c.stderr[-2000:])


def forge_one(name, model, corpus, heldout, extra=()):
    out = d(name.replace(" ", "_").replace(",", "") + "-out")
    args = ["forge", "-m", model, "--corpus", corpus, "-o", out, *SMALL, *extra]
    if heldout:
        args += ["--heldout", heldout]
    r = nextn(*args, check=False)
    if not t.ok(r.returncode == 0, f"{name}: forge runs", r.stderr[-3000:] + r.stdout[-2000:]):
        return None
    t.ok("forward check against the engine" in r.stdout, f"{name}: the trainer's head forward matches the engine's")
    card = json.load(open(os.path.join(out, "forge.json")))
    tr = card["training"]
    t.ok(tr["steps"] == 12 and tr["train_loss_last"] < tr["train_loss_first"] and
         tr["val_after"]["kl"] < tr["val_before"]["kl"],
         f"{name}: the loss falls (train {tr['train_loss_first']:.3f} -> {tr['train_loss_last']:.3f}, "
         f"held-out KL {tr['val_before']['kl']:.3f} -> {tr['val_after']['kl']:.3f})")
    info = json.loads(nextn("inspect", "-m", out, "--json").stdout)
    t.ok(info["mtp"] == "sidecar" and os.path.exists(os.path.join(out, "model-mtp.safetensors")),
         f"{name}: the head is in model-mtp.safetensors", info["mtp"])
    ar, _ = greedy(out, 0)
    sp, drafted = greedy(out, 2)
    t.ok(len(ar) == 24 and ar == sp and drafted > 0, f"{name}: the forged head drafts ({drafted} drafts), greedy "
         "MTP == AR", f"AR  {ar}\nMTP {sp}")
    return out


write_ids(d("corpus.ids"), 6000, 419, 1)
write_ids(d("held.ids"), 300, 419, 2)
for name, gen in CKPTS.items():
    src = d(name.replace(" ", "_").replace(",", ""))
    run([PY, os.path.join(REF, gen[0]), *gen[1:], "--out", src])
    out = forge_one(name, src, d("corpus.ids"), d("held.ids"))
    if out and name not in ("hy_v3", "glm4_moe_lite"):  # the others write heads the same way
        check_written(name, out)
        if "headless" in name:
            card = json.load(open(os.path.join(out, "forge.json")))
            t.ok(card["init"] == "random", f"{name}: a headless checkpoint starts from a random head", card["init"])

# --init graft:DIR starts from another checkpoint's head; the model card has the held-out figures
out = forge_one("hy_v3 from a grafted head", d("hy_v3_headless"), d("corpus.ids"), d("held.ids"),
                ["--init", "graft:" + d("hy_v3")])
if out:
    card = json.load(open(os.path.join(out, "forge.json")))
    held = card["after"][d("held.ids")]
    t.ok(card["init"].startswith("graft:") and 0 <= held["greedy_vs_trunk"] <= 1 and held["rows"] > 0,
         "graft init: forge.json records the init and the held-out acceptance")

# the default model, on text through its tokenizer, from a random head (its own head is forged
# already: a dozen steps on other text need not lower its loss)
model = os.path.join(ROOT, "models", "nextn-hy3-tiny")
out = forge_one("default model", model, os.path.join(ROOT, "docs", "design.md"),
                os.path.join(ROOT, "bench", "texts", "code.c"), ["--ctx", 128, "--tokens", 4096, "--init", "random"])
if out:
    readme = open(os.path.join(out, "README.md")).read()
    t.ok("## Forged MTP head" in readme and "bench/texts/code.c" in readme,
         "default model: the model card gains the forge section with the held-out acceptance")

# the check refuses a head that is not the one the engine ran
src = d("hy_v3")
r = nextn("forge", "-m", src, "--corpus", d("corpus.ids"), "--ctx", 32, "--tokens", 64, "--dump-only",
          "--work", d("refuse.work"))
bad = d("hy_v3_corrupt")
shutil.copytree(src, bad)
f = os.path.join(bad, "model.safetensors")
with open(f, "r+b") as fh:
    n = struct.unpack("<Q", fh.read(8))[0]
    hdr = json.loads(fh.read(n))
    e = hdr["model.layers.4.eh_proj.weight"]
    a, b = e["data_offsets"]
    fh.seek(8 + n + a)
    raw = np.frombuffer(fh.read(b - a), np.uint16).copy()
    raw ^= 0x8000  # flip the sign of every eh_proj weight
    fh.seek(8 + n + a)
    fh.write(raw.tobytes())
c = run([PY, TRAINER, "--model", bad, "--shard", d("refuse.work", "shard"), "--out", d("never")], check=False)
t.ok(c.returncode != 0 and "refusing" in c.stderr and "max |logit difference|" in c.stderr and
     not os.path.exists(d("never")), "a head whose forward differs from the engine's is refused, naming the max error",
     c.stderr[-2000:])

# bad input: named errors
r = nextn("forge", "-m", src, "-o", d("x"), check=False)
t.ok(r.returncode == 2 and "--corpus" in r.stderr, "no corpus: a usage error", r.stderr)
with open(d("far.ids"), "w") as fh:
    fh.write("1 2 3 5000 4")
r = nextn("forge", "-m", src, "--corpus", d("far.ids"), "-o", d("x"), check=False)
t.ok(r.returncode == 1 and "far.ids" in r.stderr and "5000" in r.stderr, "a token past the vocabulary names the file",
     r.stderr)
r = nextn("forge", "-m", src, "--corpus", os.path.join(ROOT, "README.md"), "-o", d("x"), check=False)
t.ok(r.returncode == 1 and "tokenizer" in r.stderr, "text for a checkpoint without a tokenizer: a named error", r.stderr)
r = nextn("forge", "-m", src, "--corpus", d("corpus.ids"), "--init", "sideways", "-o", d("x"), check=False)
t.ok(r.returncode == 2 and "--init" in r.stderr, "an unknown --init: a usage error", r.stderr)

shutil.rmtree(tmp, ignore_errors=True)
t.done()
