#!/usr/bin/python3
"""End-to-end tests of `nextn convert` and `nextn graft` on small random multi-head latent attention
checkpoints (deepseek_v3 in bf16 with q LoRA and the head's own embedding and output head,
glm4_moe_lite in f32 with a plain q_proj), written here in the Hugging Face layout: kv_b_proj of
every layer, the MTP layer's included, becomes mlx-lm's embed_q (its key half, transposed per head)
and unembed_out (its value half); a float conversion gives the source's logits bit for bit, an 8-bit
one close to them; a headless trunk plus the grafted HF head equals the converted-with-head model;
a source already in mlx-lm's split form converts too; a kv_b_proj that does not split into heads
is a named error."""
import glob
import json
import os
import shutil
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools", "train"))
from tap import Tap, nextn, scratch  # noqa: E402
from safetensors_io import dequantize, quantize, read_file, read_header, write_file  # noqa: E402

t = Tap()
TOL8 = 3e-2  # of the logit range, 8-bit weights against the float source (measured 0.8-1.8%)
tmp = scratch(prefix="nextn-convert-mla-")
TOKENS = [1, 5, 9, 33, 100, 7, 2, 8, 41, 3, 77, 12]
PROMPT = [3, 14, 15, 92, 65]

# deepseek_v3: bf16, q LoRA, qk_nope 64 (embed_q quantizes at group 64), two expert groups, the
#   head's own embed_tokens and shared_head.head
# glm4_moe_lite: f32, q_lora_rank null (plain q_proj), qk_nope 32 (embed_q stays float at group 64)
# The seeds route no token near a tie between two experts, where 8-bit weights could flip the choice.
FAMILIES = {
    "deepseek_v3": dict(arch="DeepseekV3ForCausalLM", dtype="BF16", q_lora=96, nope=64, rope=32, v=32,
                        n_group=2, topk_group=2, own_head=True, seed=31),
    "glm4_moe_lite": dict(arch="Glm4MoeLiteForCausalLM", dtype="F32", q_lora=None, nope=32, rope=16, v=48,
                          n_group=1, topk_group=1, own_head=False, seed=36),
}
H, NH, KV_LORA, VOCAB, INTER, MOE_INTER, EXPERTS, LAYERS = 128, 4, 64, 320, 192, 64, 4, 3


def d(name):
    return os.path.join(tmp, name)


def make_source(out, fam, seed, bad_kvb=False):
    """An HF-layout checkpoint: layer 0 dense, layers 1-2 MoE (sigmoid router with
    e_score_correction_bias, one shared expert), the MTP layer at model.layers.3."""
    f = FAMILIES[fam]
    rng = np.random.default_rng(seed)
    nope, rope, v, ql = f["nope"], f["rope"], f["v"], f["q_lora"]
    ts = {}

    def lin(name, o, i):
        ts[name + ".weight"] = (f["dtype"], (rng.standard_normal((o, i)) / np.sqrt(i)).astype(np.float32))

    def norm(name, n):
        ts[name + ".weight"] = (f["dtype"], (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32))

    def layer(p, moe):
        norm(p + "input_layernorm", H)
        norm(p + "post_attention_layernorm", H)
        a = p + "self_attn."
        if ql:
            lin(a + "q_a_proj", ql, H)
            norm(a + "q_a_layernorm", ql)
            lin(a + "q_b_proj", NH * (nope + rope), ql)
        else:
            lin(a + "q_proj", NH * (nope + rope), H)
        lin(a + "kv_a_proj_with_mqa", KV_LORA + rope, H)
        norm(a + "kv_a_layernorm", KV_LORA)
        lin(a + "kv_b_proj", NH * (nope + v) - (1 if bad_kvb and p == "model.layers.1." else 0), KV_LORA)
        lin(a + "o_proj", H, NH * v)
        if not moe:
            for n, o, i in (("gate_proj", INTER, H), ("up_proj", INTER, H), ("down_proj", H, INTER)):
                lin(p + "mlp." + n, o, i)
            return
        lin(p + "mlp.gate", EXPERTS, H)
        ts[p + "mlp.gate.e_score_correction_bias"] = ("F32", (0.3 * rng.random(EXPERTS)).astype(np.float32))
        for e in [f"experts.{k}." for k in range(EXPERTS)] + ["shared_experts."]:
            for n, o, i in (("gate_proj", MOE_INTER, H), ("up_proj", MOE_INTER, H), ("down_proj", H, MOE_INTER)):
                lin(p + "mlp." + e + n, o, i)

    ts["model.embed_tokens.weight"] = (f["dtype"], rng.standard_normal((VOCAB, H)).astype(np.float32))
    for L in range(LAYERS):
        layer(f"model.layers.{L}.", L > 0)
    norm("model.norm", H)
    lin("lm_head", VOCAB, H)
    ts["lm_head.weight"] = (f["dtype"], 4 * ts["lm_head.weight"][1])
    m = f"model.layers.{LAYERS}."
    layer(m, True)
    norm(m + "enorm", H)
    norm(m + "hnorm", H)
    lin(m + "eh_proj", H, 2 * H)
    norm(m + "shared_head.norm", H)
    if f["own_head"]:
        ts[m + "embed_tokens.weight"] = ts["model.embed_tokens.weight"]
        ts[m + "shared_head.head.weight"] = ts["lm_head.weight"]
    os.makedirs(out)
    write_file(os.path.join(out, "model.safetensors"), ts, metadata={"format": "pt"})
    cfg = {"architectures": [f["arch"]], "model_type": fam, "vocab_size": VOCAB, "hidden_size": H,
           "intermediate_size": INTER, "moe_intermediate_size": MOE_INTER, "num_hidden_layers": LAYERS,
           "num_nextn_predict_layers": 1, "num_attention_heads": NH, "num_key_value_heads": NH,
           "n_shared_experts": 1, "n_routed_experts": EXPERTS, "num_experts_per_tok": 2,
           "routed_scaling_factor": 1.8, "kv_lora_rank": KV_LORA, "q_lora_rank": ql, "qk_nope_head_dim": nope,
           "qk_rope_head_dim": rope, "v_head_dim": v, "n_group": f["n_group"], "topk_group": f["topk_group"],
           "first_k_dense_replace": 1, "norm_topk_prob": True, "hidden_act": "silu",
           "max_position_embeddings": 256, "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "rope_scaling": None,
           "attention_bias": False, "tie_word_embeddings": False, "rope_interleave": True,
           "bos_token_id": 0, "eos_token_id": 1}
    with open(os.path.join(out, "config.json"), "w") as fh:
        json.dump(cfg, fh)
    return out


def inspect(mdir):
    return json.loads(nextn("inspect", "-m", mdir, "--json").stdout)


def config(mdir):
    with open(os.path.join(mdir, "config.json")) as fh:
        return json.load(fh)


def tensors(mdir, raw=False):
    out = {}
    for fn in sorted(glob.glob(os.path.join(mdir, "model*.safetensors"))):
        out.update(read_file(fn, raw=raw))
    return out


def headers(mdir):
    """name -> (dtype, shape, file) over every safetensors file of mdir."""
    out = {}
    for fn in sorted(glob.glob(os.path.join(mdir, "model*.safetensors"))):
        hdr, _ = read_header(fn)
        for k, e in hdr.items():
            if k != "__metadata__":
                out[k] = (e["dtype"], tuple(e["shape"]), os.path.basename(fn))
    return out


def logits(mdir, tag):
    ids = ",".join(map(str, TOKENS))
    lg, mg = d(tag + "-l.npy"), d(tag + "-m.npy")
    # int16 activations: the float conversion is compared bit for bit with the source
    nextn("eval", "-m", mdir, "--tokens", ids, "--logits", lg, "--mtp-logits", mg, "--act-bits", 16)
    return np.load(lg), np.load(mg)


def exact(name, a, b):
    return t.ok(a.shape == b.shape and np.array_equal(a, b), name,
                f"shapes {a.shape} {b.shape}" + (f", max |d| {np.abs(a - b).max()}" if a.shape == b.shape else ""))


for fam, f in FAMILIES.items():
    nope, v, nh = f["nope"], f["v"], NH
    src = make_source(d(fam), fam, f["seed"])
    sl, sm = logits(src, fam + "-src")
    hf = tensors(src)
    mtp = f"model.layers.{LAYERS}."

    # ------------------------------------------------------------ float: the split, bit for bit
    fl = d(fam + "-float")
    nextn("convert", src, fl, "--keep", "*=float", "--quiet")
    hd = headers(fl)
    tf = tensors(fl)
    kvb = [k for k in hd if "kv_b_proj" in k]
    t.ok(not kvb and all(f"model.layers.{L}.self_attn.embed_q.weight" in hd for L in range(LAYERS + 1)),
         f"{fam} float: every layer (MTP layer too) has embed_q, no kv_b_proj", f"kv_b_proj: {kvb}")
    want = {"embed_q": (nh, KV_LORA, nope), "unembed_out": (nh, v, KV_LORA)}
    bad = [(k, hd.get(f"{p}self_attn.{k}.weight")) for p in [f"model.layers.{L}." for L in range(LAYERS + 1)]
           for k in want if hd.get(f"{p}self_attn.{k}.weight") != (f["dtype"], want[k],
                                                                    hd[f"{p}self_attn.{k}.weight"][2])]
    t.ok(not bad, f"{fam} float: embed_q {want['embed_q']} and unembed_out {want['unembed_out']} in "
         f"{f['dtype']}", str(bad[:4]))
    t.ok(hd[mtp + "self_attn.embed_q.weight"][2] == "model-mtp.safetensors"
         and hd["model.layers.1.self_attn.embed_q.weight"][2] == "model.safetensors",
         f"{fam} float: the MTP layer's split goes to the sidecar")
    split_ok = True
    for L in range(LAYERS + 1):
        p = f"model.layers.{L}.self_attn."
        blk = hf[p + "kv_b_proj.weight"].reshape(nh, nope + v, KV_LORA)
        split_ok &= np.array_equal(tf[p + "embed_q.weight"], blk[:, :nope].transpose(0, 2, 1))
        split_ok &= np.array_equal(tf[p + "unembed_out.weight"], blk[:, nope:])
    t.ok(split_ok, f"{fam} float: embed_q is each head's key rows transposed, unembed_out its value rows")
    info = inspect(fl)
    t.ok(info["layout"] == "mlx" and info["mtp"] == "sidecar" and info["attention"] == "mla",
         f"{fam} float: inspect says layout {info['layout']}, head {info['mtp']}, attention {info['attention']}")
    fl_l, fl_m = logits(fl, fam + "-float")
    exact(f"{fam} float: trunk logits equal the source's bit for bit", fl_l, sl)
    exact(f"{fam} float: MTP logits equal the source's bit for bit", fl_m, sm)

    # ------------------------------------------------------------ 8-bit
    q8 = d(fam + "-q8")
    nextn("convert", src, q8, "--bits", "8", "--quiet")
    hd = headers(q8)
    q = config(q8)["quantization"]
    eq_q = nope % 64 == 0
    p1 = "model.layers.1.self_attn."
    ok = (hd[p1 + "unembed_out.weight"][:2] == ("U32", (nh, v, KV_LORA * 8 // 32))
          and hd[p1 + "unembed_out.scales"][1] == (nh, v, KV_LORA // 64)
          and not any("kv_b_proj" in k for k in hd))
    if eq_q:
        ok &= hd[p1 + "embed_q.weight"][:2] == ("U32", (nh, KV_LORA, nope * 8 // 32))
        ok &= hd[p1 + "embed_q.scales"][1] == (nh, KV_LORA, nope // 64) and p1 + "embed_q" not in q
    else:
        ok &= hd[p1 + "embed_q.weight"][:2] == (f["dtype"], (nh, KV_LORA, nope)) and p1 + "embed_q.scales" not in hd
        ok &= q.get("model.layers.1.self_attn.embed_q") is False and q.get(mtp + "self_attn.embed_q") is False
    t.ok(ok, f"{fam} q8: unembed_out quantized [heads, v, kv_lora/4], embed_q "
         + ("quantized" if eq_q else "float (qk_nope not divisible by 64) with its false override"),
         json.dumps({k: hd[k] for k in hd if "embed_q" in k or "unembed_out" in k}))
    t.ok(hd["model.layers.1.mlp.gate.weight"][0] == f["dtype"] and q.get("model.layers.1.mlp.gate") is False
         and hd["model.layers.1.mlp.gate.e_score_correction_bias"][0] == "F32"
         and hd["model.layers.1.mlp.switch_mlp.gate_proj.weight"][:2] == ("U32", (EXPERTS, MOE_INTER, H // 4))
         and "model.layers.1.mlp.shared_experts.down_proj.scales" in hd
         and hd["model.layers.0.mlp.gate_proj.weight"][:2] == ("U32", (INTER, H // 4)),
         f"{fam} q8: router float (override false), selection bias, stacked switch_mlp, shared and dense MLPs")
    t.ok(q.get(mtp + "eh_proj") is False and hd[mtp + "self_attn.unembed_out.scales"][2] == "model-mtp.safetensors"
         and (not f["own_head"] or hd.get(mtp + "shared_head.head.weight", ("",))[0] == "U32"),
         f"{fam} q8: head in the sidecar, 8-bit with eh_proj float"
         + (" and its own embedding and output head" if f["own_head"] else ""))
    if f["dtype"] == "F32":  # f32 scales: the reference quantizer's bytes exactly
        b = tensors(q8, raw=True)
        diff = []
        for L in range(LAYERS + 1):
            n = f"model.layers.{L}.self_attn."
            ref = quantize(np.ascontiguousarray(hf[n + "kv_b_proj.weight"].reshape(nh, nope + v, KV_LORA)[:, nope:]),
                           8, 64)
            if not all(np.array_equal(x, b[n + "unembed_out." + y]) for x, y in zip(ref, ("weight", "scales", "biases"))):
                diff.append(n)
        t.ok(not diff, f"{fam} q8: unembed_out equals the reference quantizer's on kv_b_proj's value rows",
             str(diff[:4]))
    info = inspect(q8)
    t.ok(info["layout"] == "mlx" and info["mtp"] == "sidecar" and info["attention"] == "mla",
         f"{fam} q8: inspect says layout {info['layout']}, head {info['mtp']}, attention {info['attention']}")
    q8_l, q8_m = logits(q8, fam + "-q8")
    t.logits_close(f"{fam} q8: trunk logits vs the source's", q8_l, sl, TOL8)
    t.logits_close(f"{fam} q8: MTP logits vs the source's", q8_m, sm, TOL8)
    common = ["run", "-m", q8, "--prompt-tokens", ",".join(map(str, PROMPT)), "-n", "16", "--print-ids",
              "--ignore-eos", "--quiet"]
    ar = nextn(*common, "--draft", "0").stdout.split()
    sp = nextn(*common, "--draft", "2").stdout.split()
    t.ok(sp == ar and len(ar) > 0, f"{fam} q8: greedy MTP equals greedy AR", f"mtp {sp}\nar {ar}")

    # ------------------------------------------------------------ graft: headless trunk + the HF head
    nextn("convert", src, d(fam + "-q8-nohead"), "--bits", "8", "--no-mtp", "--quiet")
    t.ok(inspect(d(fam + "-q8-nohead"))["mtp"].startswith("none"), f"{fam}: convert --no-mtp writes no head")
    nextn("graft", d(fam + "-q8-nohead"), src, "-o", d(fam + "-q8-graft"), "--quiet")
    gl, gm = logits(d(fam + "-q8-graft"), fam + "-q8-graft")
    exact(f"{fam} graft: trunk logits equal the converted-with-head model's", gl, q8_l)
    exact(f"{fam} graft: MTP logits equal the converted-with-head model's", gm, q8_m)
    a, b = read_file(os.path.join(q8, "model-mtp.safetensors"), raw=True), \
        read_file(os.path.join(d(fam + "-q8-graft"), "model-mtp.safetensors"), raw=True)
    t.ok(set(a) == set(b) and all(np.array_equal(a[k], b[k]) for k in a),
         f"{fam} graft: the sidecar equals convert's tensor for tensor")
    t.ok(config(d(fam + "-q8-graft"))["quantization"] == q, f"{fam} graft: config.json's quantization block "
         "equals convert's")

    nextn("convert", src, d(fam + "-float-nohead"), "--keep", "*=float", "--no-mtp", "--quiet")
    nextn("graft", d(fam + "-float-nohead"), src, "-o", d(fam + "-float-graft"), "--keep-dtype", "--quiet")
    gl, gm = logits(d(fam + "-float-graft"), fam + "-float-graft")
    exact(f"{fam} float graft (--keep-dtype): MTP logits equal the source's bit for bit", gm, sm)
    hd = headers(d(fam + "-float-graft"))
    t.ok(hd.get(mtp + "self_attn.embed_q.weight") == (f["dtype"], (nh, KV_LORA, nope), "model-mtp.safetensors")
         and not any("kv_b_proj" in k for k in hd), f"{fam} float graft: the head's kv_b_proj split in the sidecar")

    # ------------------------------------------------------------ sources in mlx-lm's split form
    nextn("convert", fl, d(fam + "-float-q8"), "--bits", "8", "--quiet")
    a, b = tensors(q8, raw=True), tensors(d(fam + "-float-q8"), raw=True)
    t.ok(set(a) == set(b) and all(np.array_equal(a[k], b[k]) for k in a),
         f"{fam}: split float source at 8-bit equals the HF source's conversion tensor for tensor",
         f"differ: {sorted(k for k in a if k not in b or not np.array_equal(a[k], b[k]))[:6]}")
    nextn("convert", q8, d(fam + "-q8-again"), "--bits", "8", "--quiet")
    a, b = tensors(q8, raw=True), tensors(d(fam + "-q8-again"), raw=True)
    t.ok(set(a) == set(b) and all(np.array_equal(a[k], b[k]) for k in a),
         f"{fam}: split 8-bit source converted at 8-bit keeps every packed byte")
    nextn("convert", q8, d(fam + "-q8-q4"), "--bits", "4", "--group-size", "32", "--mtp-bits", "4", "--quiet")
    hd = headers(d(fam + "-q8-q4"))
    t.ok(hd[p1 + "embed_q.scales"][1] == (nh, KV_LORA, nope // 32)
         and hd[p1 + "unembed_out.weight"][:2] == ("U32", (nh, v, KV_LORA * 4 // 32))
         and hd[mtp + "self_attn.embed_q.weight"][:2] == ("U32", (nh, KV_LORA, nope * 4 // 32)),
         f"{fam}: split 8-bit source requantized at 4-bit group 32 (embed_q / unembed_out as stacked items)")
    t.ok(inspect(d(fam + "-q8-q4"))["attention"] == "mla", f"{fam}: the 4-bit requantization loads")
    if f["dtype"] == "F32":  # f32 scales: the reference quantizer's bytes exactly
        a, b = tensors(q8), tensors(d(fam + "-q8-q4"), raw=True)
        diff = []
        for L in range(LAYERS + 1):
            for k in ("embed_q", "unembed_out"):
                n = f"model.layers.{L}.self_attn.{k}."
                w = a[n + "weight"] if n + "scales" not in a else \
                    dequantize(a[n + "weight"], a[n + "scales"], a[n + "biases"], 8, 64)
                ref = quantize(w, 4, 32)
                if not all(np.array_equal(x, b[n + y]) for x, y in zip(ref, ("weight", "scales", "biases"))):
                    diff.append(n)
        t.ok(not diff, f"{fam}: the requantized embed_q / unembed_out equal the reference quantizer's "
             "(8-bit and float 3-D sources)", str(diff[:4]))

# ------------------------------------------------------------ a quantized kv_b_proj (HF names, MLX quantization)
qsrc = d("glm-qkvb")
shutil.copytree(d("glm4_moe_lite"), qsrc)
ts = read_file(os.path.join(qsrc, "model.safetensors"))
f = FAMILIES["glm4_moe_lite"]
nope, v = f["nope"], f["v"]
for L in range(LAYERS + 1):
    n = f"model.layers.{L}.self_attn.kv_b_proj."
    w, sc, bi = quantize(ts.pop(n + "weight"), 8, 64)
    ts.update({n + "weight": w, n + "scales": sc, n + "biases": bi})
write_file(os.path.join(qsrc, "model.safetensors"), ts, metadata={"format": "mlx"})
c = config(qsrc)
c["quantization"] = {"group_size": 64, "bits": 8}
with open(os.path.join(qsrc, "config.json"), "w") as fh:
    json.dump(c, fh)
nextn("convert", qsrc, d("glm-qkvb-float"), "--keep", "*=float", "--quiet")
tf = tensors(d("glm-qkvb-float"), raw=True)
ok = True
for L in range(LAYERS + 1):
    n = f"model.layers.{L}.self_attn."
    blk = dequantize(ts[n + "kv_b_proj.weight"], ts[n + "kv_b_proj.scales"], ts[n + "kv_b_proj.biases"], 8, 64)
    blk = blk.reshape(NH, nope + v, KV_LORA)
    ok &= np.array_equal(tf[n + "embed_q.weight"], blk[:, :nope].transpose(0, 2, 1))
    ok &= np.array_equal(tf[n + "unembed_out.weight"], blk[:, nope:])
t.ok(ok, "a quantized kv_b_proj splits into its dequantized key rows transposed and value rows")

# ------------------------------------------------------------ errors
bad = make_source(d("bad"), "deepseek_v3", 33, bad_kvb=True)
r = nextn("convert", bad, d("bad-out"), check=False)
t.ok(r.returncode != 0 and "model.layers.1.self_attn.kv_b_proj.weight" in r.stderr
     and "num_attention_heads" in r.stderr and not os.path.exists(os.path.join(d("bad-out"), "model.safetensors")),
     "a kv_b_proj whose rows do not split into heads is an error naming it", r.stderr)
r = nextn("graft", d("deepseek_v3-q8-nohead"), d("glm4_moe_lite"), "-o", d("bad-graft"), check=False)
t.ok(r.returncode != 0 and "cannot graft" in r.stderr, "graft refuses a head of another family", r.stderr)

shutil.rmtree(tmp, ignore_errors=True)
t.done()
