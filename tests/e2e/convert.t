#!/usr/bin/python3
"""End-to-end tests of `nextn convert` and `nextn graft` on random checkpoints: the converted
files load as MLX layout with a sidecar head, their logits (trunk and MTP) match the independent
reference computing on the same files, the quantizer agrees byte for byte with the generator's
transcription of MLX's, greedy MTP equals greedy AR, a stripped head grafted back is bit-exact
(bf16) or within tolerance (quantized), heads with another expert count graft, and bad inputs
fail with a message naming the problem."""
import glob
import json
import os
import shutil
import struct
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools", "train"))
from tap import PY, Tap, nextn, run, scratch  # noqa: E402
from safetensors_io import read_file  # noqa: E402

t = Tap()
TOL = 2e-3  # of the logit range
tmp = scratch(prefix="nextn-convert-")
TOKENS = [1, 5, 9, 33, 100, 7, 2, 8, 41, 3, 77, 12]
PROMPT = [3, 14, 15, 92, 65]
EVEN = ["--hidden", "256", "--expert-dim", "128", "--inter", "256"]  # every dim divisible by 64


def d(name):
    return os.path.join(tmp, name)


def gen(name, *args):
    run([PY, "tests/ref/make_random_ckpt.py", "--out", d(name), *args])
    return d(name)


def inspect(mdir):
    return json.loads(nextn("inspect", "-m", mdir, "--json").stdout)


def config(mdir):
    with open(os.path.join(mdir, "config.json")) as f:
        return json.load(f)


def tensors(mdir):
    out = {}
    for f in sorted(glob.glob(os.path.join(mdir, "model*.safetensors"))):
        out.update(read_file(f))
    return out


def close(name, a, b):
    if a.shape != b.shape:
        return t.ok(False, f"{name}: shape", f"engine {a.shape} vs reference {b.shape}")
    rng = float(b.max() - b.min())
    err = float(np.abs(a - b).max())
    return t.ok(err <= TOL * rng and rng > 1.0, f"{name}: max |dlogit| {err:.2e} vs range {rng:.2f}")


def eval_engine(mdir, tag):
    ids = ",".join(map(str, TOKENS))
    lg, mg = d(tag + "-eng.npy"), d(tag + "-engm.npy")
    # int16 activations: the reference multiplies exact float inputs (int8, the default, is
    # checked in parity.t)
    nextn("eval", "-m", mdir, "--tokens", ids, "--logits", lg, "--mtp-logits", mg, "--act-bits", 16)
    return np.load(lg), np.load(mg)


def parity(mdir, tag, greedy=True):
    """Engine vs reference on the converted files (trunk + MTP), and greedy MTP == greedy AR."""
    ids = ",".join(map(str, TOKENS))
    rl, rm = d(tag + "-ref.npy"), d(tag + "-refm.npy")
    run([PY, "tools/train/reference.py", "--model", mdir, "--tokens", ids, "--logits", rl, "--mtp-logits", rm])
    el, em = eval_engine(mdir, tag)
    close(f"{tag}: trunk logits vs reference", el, np.load(rl))
    close(f"{tag}: MTP logits vs reference", em, np.load(rm))
    if greedy:
        pids = ",".join(map(str, PROMPT))
        common = ["run", "-m", mdir, "--prompt-tokens", pids, "-n", "20", "--print-ids", "--ignore-eos", "--quiet"]
        ar = nextn(*common, "--draft", "0").stdout.split()
        for k in ("1", "3"):
            sp = nextn(*common, "--draft", k).stdout.split()
            t.ok(sp == ar and len(ar) > 0, f"{tag}: greedy MTP (draft {k}) equals greedy AR", f"mtp {sp}\nar {ar}")


def header_meta(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        return json.loads(f.read(n)).get("__metadata__", {})


def misaligned(mdir):
    """Tensors of whole 64-byte lines whose data does not start on a line of the file (and the
    files whose tensor data does not begin on one)."""
    bad = []
    for path in sorted(glob.glob(os.path.join(mdir, "*.safetensors"))):
        with open(path, "rb") as f:
            n = struct.unpack("<Q", f.read(8))[0]
            hdr = json.loads(f.read(n))
        if (8 + n) % 64:
            bad.append(f"{os.path.basename(path)}: data at {8 + n}")
        for k, v in hdr.items():
            if k == "__metadata__":
                continue
            a, b = v["data_offsets"]
            if (b - a) % 64 == 0 and (8 + n + a) % 64:
                bad.append(f"{k} at {8 + n + a}")
    return bad


# ---------------------------------------------------------------- convert: 4-bit, head 8-bit
src = gen("src", "--layout", "tencent", "--mtp", "inline", "--seed", "21", *EVEN)
r = nextn("convert", src, d("q4"), "--quiet")
t.ok("wrote" in r.stderr and "MTP head" in r.stderr, "convert prints a summary line", r.stderr)
info = inspect(d("q4"))
bad = misaligned(d("q4"))
t.ok(not bad, "q4: tensor data starts on 64-byte lines (every tensor of whole lines)", "\n".join(bad[:8]))
t.ok(info["layout"] == "mlx" and info["mtp"] == "sidecar", f"q4: layout {info['layout']}, head {info['mtp']}")
cfg = config(d("q4"))
q = cfg.get("quantization", {})
t.ok(q.get("bits") == 4 and q.get("group_size") == 64 and q.get("mode") == "affine", "q4: global block 4-bit g64")
t.ok(cfg.get("quantization_config") == q, "q4: quantization_config duplicates quantization")
t.ok(q.get("model.layers.2.mlp.router.gate") == {"group_size": 64, "bits": 8}, "q4: router gate 8-bit g64 override")
t.ok(q.get("mtp.eh_proj") is False and q.get("mtp.layer.self_attn.q_proj") == {"group_size": 64, "bits": 8},
     "q4: head 8-bit with eh_proj float by default", json.dumps({k: v for k, v in q.items() if k.startswith("mtp")}))
with open(os.path.join(d("q4"), "model.safetensors.index.json")) as f:
    wm = json.load(f)["weight_map"]
t.ok(wm.get("mtp.layer.mlp.switch_mlp.gate_proj.weight") == "model-mtp.safetensors"
     and wm.get("model.layers.2.mlp.switch_mlp.down_proj.scales") == "model.safetensors"
     and wm.get("model.layers.2.mlp.router.expert_bias") == "model.safetensors",
     "q4: index maps stacked experts, router.expert_bias and the sidecar")
t.ok(header_meta(os.path.join(d("q4"), "model.safetensors")).get("format") == "mlx", "q4: metadata format mlx")
tq = tensors(d("q4"))
t.ok(tq["mtp.eh_proj.weight"].dtype == np.float32 and "mtp.eh_proj.scales" not in tq
     and tq["model.layers.2.mlp.switch_mlp.gate_proj.weight"].shape == (6, 128, 256 * 4 // 32)
     and "model.norm.weight" in tq and "model.layers.1.input_layernorm.scales" not in tq,
     "q4: shapes of stacked quantized experts, float eh_proj and norms")
parity(d("q4"), "q4")

# the quantizer and names agree with the generator's own transcription of mlx-lm's, bit for bit
pyq = gen("pyq4", "--layout", "mlx", "--mtp", "sidecar", "--quant", "4:64", "--mtp-quant", "8:64", "--seed", "21",
          *EVEN)
tp = tensors(pyq)
names = set(tp) - {"mtp.eh_proj.weight", "mtp.eh_proj.scales", "mtp.eh_proj.biases"}
diff = [k for k in sorted(names) if k not in tq or tq[k].shape != tp[k].shape or not np.array_equal(tq[k], tp[k])]
t.ok(not diff and set(tq) - set(tp) == set(), "q4: every tensor equals the reference quantizer's",
     f"differ: {diff[:8]}\nextra: {sorted(set(tq) - set(tp))[:8]}")

# ---------------------------------------------------------------- convert: 3-bit g32 on odd shapes
src_odd = gen("src-odd", "--layout", "tencent", "--mtp", "inline", "--seed", "22")
nextn("convert", src_odd, d("q3"), "--bits", "3", "--group-size", "32", "--quiet")
info = inspect(d("q3"))
t.ok(info["layout"] == "mlx" and info["mtp"] == "sidecar" and "3bit-g32" in info["dtype"],
     f"q3: layout {info['layout']}, head {info['mtp']}, weights {info['dtype']}")
parity(d("q3"), "q3")
bad = misaligned(d("q3"))
t.ok(not bad, "q3 (odd shapes): tensors of whole lines start on 64-byte lines", "\n".join(bad[:8]))

# an MLX-quantized source: same precision copies the packed bytes; another one requantizes
nextn("convert", pyq, d("q4copy"), "--quiet", "--mtp-bits", "8")
tc = tensors(d("q4copy"))
t.ok(all(np.array_equal(tc[k], tp[k]) for k in tp) and set(tc) == set(tp),
     "MLX 4-bit source converted at 4-bit (head 8-bit) keeps every packed byte")
nextn("convert", pyq, d("q4to3"), "--bits", "3", "--group-size", "32", "--keep", "mtp.*=6:32", "--quiet")
q43 = config(d("q4to3"))["quantization"]
t.ok(q43.get("mtp.layer.mlp.switch_mlp.up_proj") == {"group_size": 32, "bits": 6} and q43["bits"] == 3,
     "--keep PATTERN=B:G sets a per-module override")
parity(d("q4to3"), "q4to3", greedy=False)

# ---------------------------------------------------------------- graft round trips
nextn("convert", src, d("bf-nohead"), "--no-mtp", "--keep", "*=bf16", "--quiet")
t.ok(inspect(d("bf-nohead"))["mtp"].startswith("none"), "convert --no-mtp writes a headless checkpoint")
t.ok(config(d("bf-nohead")).get("num_nextn_predict_layers") == 0, "headless: num_nextn_predict_layers 0")
nextn("graft", d("bf-nohead"), src, "-o", d("bf-graft"), "--keep-dtype", "--quiet")
ol, om = eval_engine(src, "orig")
gl, gm = eval_engine(d("bf-graft"), "bf-graft")
t.ok(np.array_equal(om, gm) and np.array_equal(ol, gl), "bf16 graft: MTP and trunk logits equal the original's exactly",
     f"max |d| mtp {np.abs(om - gm).max()}, trunk {np.abs(ol - gl).max()}")
t.ok(config(d("bf-graft")).get("num_nextn_predict_layers") == 1, "graft sets num_nextn_predict_layers 1")

nextn("convert", src, d("q4-nohead"), "--no-mtp", "--quiet")
nextn("graft", d("q4-nohead"), src, "-o", d("q4-graft"), "--quiet")
gq = config(d("q4-graft"))["quantization"]
t.ok(gq.get("mtp.layer.self_attn.o_proj") == {"group_size": 64, "bits": 8} and gq.get("mtp.eh_proj") is False
     and config(d("q4-graft"))["quantization_config"] == gq, "quantized graft: head overrides in config.json")
with open(os.path.join(d("q4-graft"), "model.safetensors.index.json")) as f:
    t.ok(json.load(f)["weight_map"].get("mtp.eh_proj.weight") == "model-mtp.safetensors", "graft: index lists the head")
parity(d("q4-graft"), "q4-graft")

# in place, quantized as asked; then replaced by a head with another expert count
shutil.copytree(d("q4-nohead"), d("inplace"))
nextn("graft", d("inplace"), src, "--bits", "4", "--group-size", "64", "--quiet")
info = inspect(d("inplace"))
gi = config(d("inplace"))["quantization"]
t.ok(info["mtp"] == "sidecar" and "mtp.layer.self_attn.o_proj" not in gi
     and gi.get("mtp.layer.mlp.router.gate") == {"group_size": 64, "bits": 8}, "in-place graft at 4-bit (router 8-bit)")
src_e4 = gen("src-e4", "--layout", "tencent", "--mtp", "inline", "--mtp-experts", "4", "--seed", "23", *EVEN)
nextn("graft", d("inplace"), src_e4, "--quiet")
info = inspect(d("inplace"))
t.ok(info["mtp_experts"] == 4 and info["experts"] == 6, f"graft of a 4-expert head onto a 6-expert trunk "
     f"(trunk {info['experts']}, head {info['mtp_experts']})")
t.ok(len(glob.glob(os.path.join(d("inplace"), "*.partial"))) == 0, "no temporary files left behind")
parity(d("inplace"), "graft-e4")

# a head inline in the base's trunk file is replaced (the trunk file is rewritten without it)
shutil.copytree(src, d("inline-base"))
nextn("graft", d("inline-base"), src_e4, "--keep-dtype", "--quiet")
info = inspect(d("inline-base"))
t.ok(info["mtp"] == "sidecar" and info["mtp_experts"] == 4, f"inline head replaced by a sidecar ({info['mtp']})")

# ---------------------------------------------------------------- errors
src_h = gen("src-h192", "--layout", "tencent", "--mtp", "inline", "--seed", "24", "--hidden", "192")
r = nextn("graft", d("q4-nohead"), src_h, "-o", d("bad"), check=False)
t.ok(r.returncode != 0 and "hidden_size" in r.stderr and "256" in r.stderr and "192" in r.stderr,
     "graft refuses a head of another hidden size, naming it", r.stderr)
r = nextn("graft", d("q4-nohead"), d("bf-nohead"), "-o", d("bad2"), check=False)
t.ok(r.returncode != 0 and "no MTP head" in r.stderr, "graft from a headless source fails clearly", r.stderr)
r = nextn("convert", d("does-not-exist"), d("bad3"), check=False)
t.ok(r.returncode != 0 and "does-not-exist" in r.stderr, "convert of a missing source names it", r.stderr)
r = nextn("graft", d("does-not-exist"), src, check=False)
t.ok(r.returncode != 0 and "does-not-exist" in r.stderr, "graft onto a missing base names it", r.stderr)
r = nextn("convert", src, d("q4"), check=False)
t.ok(r.returncode != 0 and "--force" in r.stderr, "convert refuses to overwrite a checkpoint without --force", r.stderr)
r = nextn("convert", src, d("bad4"), "--bits", "7", check=False)
t.ok(r.returncode == 2 and "--bits" in r.stderr, "unsupported bits are a usage error", r.stderr)
r = nextn("convert", src, d("bad5"), "--keep", "nonsense", check=False)
t.ok(r.returncode == 2 and "--keep" in r.stderr, "a malformed --keep is a usage error", r.stderr)
r = nextn("convert", src, src, "--force", check=False)
t.ok(r.returncode != 0 and "source" in r.stderr, "convert refuses DST == SRC", r.stderr)

shutil.rmtree(tmp, ignore_errors=True)
t.done()
