#!/usr/bin/python3
"""End-to-end tests of FP8 sources for `nextn convert` and `nextn graft`: a small random deepseek_v3
checkpoint written as DeepSeek ships V3 / V3.1, every linear weight but the router's F8_E4M3 with F32
block scales X.weight_scale_inv [ceil(out/rows), ceil(in/cols)] for the config's weight_block_size
[rows, cols] (here [40, 48]: partial edge blocks in both directions), the MTP layer in its own shard.
Its float conversion equals that of a bf16 copy of the dequantized weights (fp8 value x block scale,
rounded once, as mlx-lm's sanitize() does) tensor for tensor and gives its logits bit for bit; f32
likewise against an f32 copy; the E4M3 values follow the format's definition; a 4-bit conversion
loads and greedy MTP equals greedy AR; the FP8 head grafted from the shard holding it equals the
converted one; the runtime refuses FP8 weights; bad scales and E5M2 weights are named errors."""
import glob
import json
import os
import shutil
import struct
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools", "train"))
from tap import Tap, nextn, scratch  # noqa: E402
from safetensors_io import f32_to_bf16, read_file, read_header, write_file  # noqa: E402

t = Tap()
TOL8 = 3e-2  # of the logit range, 8-bit weights against the float source (as convert_mla.t)
tmp = scratch(prefix="nextn-convert-fp8-")
TOKENS = [1, 5, 9, 33, 100, 7, 2, 8, 41, 3, 77, 12]
PROMPT = [3, 14, 15, 92, 65]
H, NH, KV_LORA, VOCAB, INTER, MOE_INTER, EXPERTS, LAYERS = 128, 4, 64, 320, 192, 64, 4, 3
Q_LORA, NOPE, ROPE, V = 96, 64, 32, 32
BLOCK = (40, 48)  # weight_block_size: rows, cols
MTP = f"model.layers.{LAYERS}."
SHARDS = ("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors")


def d(name):
    return os.path.join(tmp, name)


def e4m3_table():
    """The 256 E4M3 values from the format's definition: sign, 4 exponent bits (bias 7), 3 mantissa
    bits, exponent 0 subnormal, S.1111.111 NaN, no infinities."""
    v = np.empty(256, np.float64)
    for b in range(256):
        e, m = (b >> 3) & 15, b & 7
        x = np.nan if (e == 15 and m == 7) else (m / 8) * 2.0 ** -6 if e == 0 else (1 + m / 8) * 2.0 ** (e - 7)
        v[b] = -x if b & 0x80 else x
    return v


E4M3 = e4m3_table()
_POS = E4M3[:0x7f]  # codes 0x00..0x7e: 0 .. 448, increasing


def to_e4m3(x):
    """Nearest E4M3 code of each value (saturating at +-448)."""
    a = np.minimum(np.abs(x), 448.0)
    hi = np.clip(np.searchsorted(_POS, a), 1, 0x7e)
    code = np.where(np.abs(_POS[hi] - a) < np.abs(a - _POS[hi - 1]), hi, hi - 1).astype(np.uint8)
    return np.where((x < 0) & (code != 0), code | 0x80, code).astype(np.uint8)


def fp8_quant(w, scale_override=None):
    """DeepSeek's block quantization: per [40, 48] block scale = amax / 448 (f32), codes of w / scale."""
    o, i = w.shape
    rb, cb = -(-o // BLOCK[0]), -(-i // BLOCK[1])
    s = np.empty((rb, cb), np.float32)
    for r in range(rb):
        for c in range(cb):
            blk = w[r * BLOCK[0]:(r + 1) * BLOCK[0], c * BLOCK[1]:(c + 1) * BLOCK[1]]
            s[r, c] = np.float32(max(float(np.abs(blk).max()), 1e-8) / 448.0)
    if scale_override is not None:
        s[0, :] = scale_override
    full = np.repeat(np.repeat(s, BLOCK[0], 0), BLOCK[1], 1)[:o, :i]
    return to_e4m3(w / full), s


def dequant(code, s):
    """fp8 value x its block's scale, one f32 product."""
    o, i = code.shape
    full = np.repeat(np.repeat(s, BLOCK[0], 0), BLOCK[1], 1)[:o, :i]
    return E4M3[code].astype(np.float32) * full


def retag(path, dtypes):
    """Rewrites the header of a safetensors file with the dtypes given per tensor name (U8 written
    as F8_E4M3 / F8_E5M2: same bytes)."""
    hdr, base = read_header(path)
    with open(path, "rb") as fh:
        data = fh.read()[base:]
    for k, dt in dtypes.items():
        if k in hdr:
            hdr[k]["dtype"] = dt
    hj = json.dumps(hdr, separators=(",", ":")).encode()
    hj += b" " * ((-len(hj)) % 8)
    with open(path, "wb") as fh:
        fh.write(struct.pack("<Q", len(hj)) + hj + data)


def build(seed):
    """Master weights: {name: (dtype, f32 array, fp8?)}; layer 0 dense, 1-2 MoE, MTP at layer 3."""
    rng = np.random.default_rng(seed)
    ts = {}

    def lin(name, o, i, fp8=True):
        ts[name + ".weight"] = ("BF16", (rng.standard_normal((o, i)) / np.sqrt(i)).astype(np.float32), fp8)

    def norm(name, n):
        ts[name + ".weight"] = ("BF16", (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32), False)

    def layer(p, moe):
        norm(p + "input_layernorm", H)
        norm(p + "post_attention_layernorm", H)
        a = p + "self_attn."
        lin(a + "q_a_proj", Q_LORA, H)
        norm(a + "q_a_layernorm", Q_LORA)
        lin(a + "q_b_proj", NH * (NOPE + ROPE), Q_LORA)
        lin(a + "kv_a_proj_with_mqa", KV_LORA + ROPE, H)
        norm(a + "kv_a_layernorm", KV_LORA)
        lin(a + "kv_b_proj", NH * (NOPE + V), KV_LORA)
        lin(a + "o_proj", H, NH * V)
        if not moe:
            for n, o, i in (("gate_proj", INTER, H), ("up_proj", INTER, H), ("down_proj", H, INTER)):
                lin(p + "mlp." + n, o, i)
            return
        lin(p + "mlp.gate", EXPERTS, H, fp8=False)
        ts[p + "mlp.gate.e_score_correction_bias"] = ("F32", (0.3 * rng.random(EXPERTS)).astype(np.float32), False)
        for e in [f"experts.{k}." for k in range(EXPERTS)] + ["shared_experts."]:
            for n, o, i in (("gate_proj", MOE_INTER, H), ("up_proj", MOE_INTER, H), ("down_proj", H, MOE_INTER)):
                lin(p + "mlp." + e + n, o, i)

    ts["model.embed_tokens.weight"] = ("BF16", rng.standard_normal((VOCAB, H)).astype(np.float32), False)
    for L in range(LAYERS):
        layer(f"model.layers.{L}.", L > 0)
    norm("model.norm", H)
    lin("lm_head", VOCAB, H, fp8=False)
    ts["lm_head.weight"] = ("BF16", 4 * ts["lm_head.weight"][1], False)
    layer(MTP, True)
    norm(MTP + "enorm", H)
    norm(MTP + "hnorm", H)
    lin(MTP + "eh_proj", H, 2 * H)
    norm(MTP + "shared_head.norm", H)
    ts[MTP + "embed_tokens.weight"] = ts["model.embed_tokens.weight"]
    ts[MTP + "shared_head.head.weight"] = ts["lm_head.weight"]
    return ts


CODES_AT = "model.layers.0.mlp.down_proj.weight"  # rows 0-1 hold every non-NaN code, scale 2^-12
ALL_CODES = np.array([b for b in range(256) if b not in (0x7f, 0xff)], np.uint8)


def quantize_all(master):
    """{name: (codes uint8, scales f32)} of the FP8 weights."""
    out = {}
    for k, (_, w, fp8) in master.items():
        if not fp8:
            continue
        code, s = fp8_quant(w, np.float32(2.0 ** -12) if k == CODES_AT else None)
        if k == CODES_AT:
            flat = code[:2].reshape(-1)
            flat[:len(ALL_CODES)] = ALL_CODES
            code[:2] = flat.reshape(2, -1)
        out[k] = (code, s)
    return out


def config(fp8=True):
    c = {"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "vocab_size": VOCAB,
         "hidden_size": H, "intermediate_size": INTER, "moe_intermediate_size": MOE_INTER,
         "num_hidden_layers": LAYERS, "num_nextn_predict_layers": 1, "num_attention_heads": NH,
         "num_key_value_heads": NH, "n_shared_experts": 1, "n_routed_experts": EXPERTS, "num_experts_per_tok": 2,
         "routed_scaling_factor": 1.8, "kv_lora_rank": KV_LORA, "q_lora_rank": Q_LORA, "qk_nope_head_dim": NOPE,
         "qk_rope_head_dim": ROPE, "v_head_dim": V, "n_group": 2, "topk_group": 2, "first_k_dense_replace": 1,
         "norm_topk_prob": True, "hidden_act": "silu", "max_position_embeddings": 256, "rms_norm_eps": 1e-6,
         "rope_theta": 10000.0, "rope_scaling": None, "attention_bias": False, "tie_word_embeddings": False,
         "rope_interleave": True, "bos_token_id": 0, "eos_token_id": 1}
    if fp8:
        c["quantization_config"] = {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                                    "weight_block_size": list(BLOCK)}
    return c


def write_ckpt(out, master, q, mode, cfg=None, edit=None):
    """mode "fp8": as DeepSeek ships it; "bf16"/"f32": the FP8 weights dequantized into that dtype.
    Two shards (the trunk; the MTP layer) and an index. edit(ts, tags) may alter the tensors first."""
    ts, tags = {}, {}
    for k, (dt, w, fp8) in master.items():
        if not fp8:
            ts[k] = (dt, w)
        elif mode == "fp8":
            ts[k] = ("U8", q[k][0])
            tags[k] = "F8_E4M3"
            ts[k[:-len(".weight")] + ".weight_scale_inv"] = ("F32", q[k][1])
        else:
            ts[k] = ({"bf16": "BF16", "f32": "F32"}[mode], dequant(*q[k]))
    if edit:
        edit(ts, tags)
    os.makedirs(out)
    parts = ({k: v for k, v in ts.items() if not k.startswith(MTP)}, {k: v for k, v in ts.items() if k.startswith(MTP)})
    wm = {}
    for fn, part in zip(SHARDS, parts):
        write_file(os.path.join(out, fn), part, metadata={"format": "pt"})
        retag(os.path.join(out, fn), {k: v for k, v in tags.items() if k in part})
        wm.update({k: fn for k in part})
    with open(os.path.join(out, "model.safetensors.index.json"), "w") as fh:
        json.dump({"metadata": {"total_size": 0}, "weight_map": wm}, fh)
    with open(os.path.join(out, "config.json"), "w") as fh:
        json.dump(cfg if cfg is not None else config(mode == "fp8"), fh)
    return out


def read_cfg(mdir):
    with open(os.path.join(mdir, "config.json")) as fh:
        return json.load(fh)


def tensors(mdir, raw=True):
    out = {}
    for fn in sorted(glob.glob(os.path.join(mdir, "model*.safetensors"))):
        out.update(read_file(fn, raw=raw))
    return out


def same_tensors(a, b):
    ta, tb = tensors(a), tensors(b)
    bad = sorted(k for k in ta if k not in tb or ta[k].dtype != tb[k].dtype or not np.array_equal(ta[k], tb[k]))
    return set(ta) == set(tb) and not bad, f"only in one: {sorted(set(ta) ^ set(tb))[:6]}, differ: {bad[:6]}"


def logits(mdir, tag):
    ids = ",".join(map(str, TOKENS))
    lg, mg = d(tag + "-l.npy"), d(tag + "-m.npy")
    nextn("eval", "-m", mdir, "--tokens", ids, "--logits", lg, "--mtp-logits", mg, "--act-bits", 16)
    return np.load(lg), np.load(mg)


def exact(name, a, b):
    return t.ok(a.shape == b.shape and np.array_equal(a, b), name,
                f"shapes {a.shape} {b.shape}" + (f", max |d| {np.abs(a - b).max()}" if a.shape == b.shape else ""))


def fails(name, r, *needles, out=None):
    ok = r.returncode != 0 and all(n in r.stderr for n in needles)
    if out:
        ok &= not os.path.exists(os.path.join(out, "model.safetensors")) and \
            not glob.glob(os.path.join(out, "model-0*.safetensors"))
    return t.ok(ok, name, r.stderr)


master = build(42)  # routes no token near a tie between two experts, where 8-bit weights could flip it
q = quantize_all(master)
src = write_ckpt(d("fp8"), master, q, "fp8")
rbf = write_ckpt(d("ref-bf16"), master, q, "bf16")
r32 = write_ckpt(d("ref-f32"), master, q, "f32")
hdr, _ = read_header(os.path.join(src, SHARDS[0]))
t.ok(hdr["model.layers.1.self_attn.q_b_proj.weight"]["dtype"] == "F8_E4M3"
     and hdr["model.layers.1.self_attn.q_b_proj.weight_scale_inv"]["shape"] == [10, 2]
     and hdr["model.layers.1.mlp.gate.weight"]["dtype"] == "BF16",
     "the source is DeepSeek's layout: F8_E4M3 weights, F32 weight_scale_inv [ceil(384/40), ceil(96/48)], bf16 router")

# ------------------------------------------------------------ the runtime refuses FP8 weights
r = nextn("inspect", "-m", src, check=False)
fails("loading the FP8 checkpoint is refused: quant_method fp8, run nextn convert", r, "fp8", "nextn convert")
noq = d("fp8-noquant")
shutil.copytree(src, noq)
with open(os.path.join(noq, "config.json"), "w") as fh:
    json.dump(config(False), fh)
r = nextn("eval", "-m", noq, "--tokens", "1,2", "--logits", d("noq.npy"), check=False)
fails("F8_E4M3 weights without the config block: refused naming the tensor", r, "F8_E4M3", "nextn convert",
      "model.layers.0.")

# ------------------------------------------------------------ float: bf16 as mlx-lm, f32, bit for bit
fl = d("fp8-float")
nextn("convert", src, fl, "--keep", "*=float", "--quiet")
nextn("convert", rbf, d("ref-bf16-float"), "--keep", "*=float", "--quiet")
ok, why = same_tensors(fl, d("ref-bf16-float"))
t.ok(ok, "float: the FP8 conversion equals the bf16 dequantized copy's tensor for tensor", why)
tf = tensors(fl)
t.ok(not any("scale_inv" in k for k in tf) and tf["model.layers.1.self_attn.q_b_proj.weight"].dtype == np.uint16
     and np.array_equal(tf["model.layers.1.self_attn.q_b_proj.weight"],
                        f32_to_bf16(dequant(*q["model.layers.1.self_attn.q_b_proj.weight"]))),
     "float: q_b_proj is bf16(fp8 value x block scale); no weight_scale_inv written")
c = read_cfg(fl)
fp8_keys = [k for blk in ("quantization", "quantization_config") for k in c.get(blk, {})
            if k in ("quant_method", "fmt", "weight_block_size", "activation_scheme")]
t.ok(c["quantization"]["mode"] == "affine" and not fp8_keys,
     "float: the output config's quantization block is MLX's, none of the fp8 block's fields", str(fp8_keys))
fll, flm = logits(fl, "fl")
bfl, bfm = logits(rbf, "rbf")
exact("float: trunk logits equal the bf16 copy's bit for bit", fll, bfl)
exact("float: MTP logits equal the bf16 copy's bit for bit", flm, bfm)

f32 = d("fp8-f32")
nextn("convert", src, f32, "--keep", "*=f32", "--quiet")
nextn("convert", r32, d("ref-f32-f32"), "--keep", "*=f32", "--quiet")
ok, why = same_tensors(f32, d("ref-f32-f32"))
t.ok(ok, "f32: the FP8 conversion equals the f32 dequantized copy's tensor for tensor", why)
l32, m32 = logits(f32, "f32")
rl, rm = logits(r32, "r32")
exact("f32: trunk logits equal the f32 copy's bit for bit", l32, rl)
exact("f32: MTP logits equal the f32 copy's bit for bit", m32, rm)

got = tensors(f32, raw=False)[CODES_AT][:2].reshape(-1)[:len(ALL_CODES)].astype(np.float64) * 2.0 ** 12
t.ok(np.array_equal(got, E4M3[ALL_CODES]) and np.array_equal(np.signbit(got), np.signbit(E4M3[ALL_CODES])),
     "E4M3: all 254 non-NaN codes decode to the format's values (signed zero included)")
spot = {0x00: 0.0, 0x01: 2.0 ** -9, 0x07: 7 * 2.0 ** -9, 0x08: 2.0 ** -6, 0x38: 1.0, 0x3c: 1.5, 0x77: 240.0,
        0x7e: 448.0, 0xb8: -1.0, 0xfe: -448.0}
t.ok(all(got[list(ALL_CODES).index(k)] == v for k, v in spot.items()),
     "E4M3: subnormals 2^-9..7*2^-9, min normal 2^-6, 1, 1.5, 240, max 448, negatives",
     str({hex(k): got[list(ALL_CODES).index(k)] for k in spot}))

# ------------------------------------------------------------ 4-bit and 8-bit
q4 = d("fp8-q4")
nextn("convert", src, q4, "--quiet")
info = json.loads(nextn("inspect", "-m", q4, "--json").stdout)
t.ok(info["layout"] == "mlx" and info["mtp"] == "sidecar" and info["attention"] == "mla",
     f"4-bit: inspect says layout {info['layout']}, head {info['mtp']}, attention {info['attention']}")
hd = {}
for fn in glob.glob(os.path.join(q4, "model*.safetensors")):
    hd.update({k: v for k, v in read_header(fn)[0].items() if k != "__metadata__"})
qc = read_cfg(q4)["quantization"]
t.ok(hd["model.layers.1.mlp.switch_mlp.up_proj.weight"]["dtype"] == "U32"
     and hd["model.layers.1.mlp.switch_mlp.up_proj.scales"]["dtype"] == "BF16"
     and hd["model.layers.1.self_attn.unembed_out.weight"]["shape"] == [NH, V, KV_LORA * 4 // 32]
     and hd[MTP + "eh_proj.weight"]["dtype"] == "BF16" and not any("scale_inv" in k for k in hd)
     and qc.get("bits") == 4 and "quant_method" not in qc and "weight_block_size" not in qc,
     "4-bit: stacked experts and the kv_b_proj split quantized (bf16 scales), eh_proj bf16, no FP8 leftovers",
     json.dumps(qc)[:300])
common = ["run", "-m", q4, "--prompt-tokens", ",".join(map(str, PROMPT)), "-n", "16", "--print-ids",
          "--ignore-eos", "--quiet"]
ar = nextn(*common, "--draft", "0").stdout.split()
sp = nextn(*common, "--draft", "2").stdout.split()
t.ok(sp == ar and len(ar) > 0, "4-bit: greedy MTP equals greedy AR", f"mtp {sp}\nar {ar}")
q8 = d("fp8-q8")
nextn("convert", src, q8, "--bits", "8", "--quiet")
l8, m8 = logits(q8, "q8")
t.logits_close("8-bit: trunk logits vs the f32 copy's", l8, rl, TOL8)
t.logits_close("8-bit: MTP logits vs the f32 copy's", m8, rm, TOL8)

# ------------------------------------------------------------ graft the FP8 head from the shard holding it
head = d("hf-head")
os.makedirs(head)
for fn in ("config.json", "model.safetensors.index.json", SHARDS[1]):
    shutil.copy(os.path.join(src, fn), head)
nextn("convert", src, d("q4-nohead"), "--no-mtp", "--quiet")
nextn("graft", d("q4-nohead"), head, "-o", d("q4-graft"), "--quiet")
a, b = read_file(os.path.join(q4, "model-mtp.safetensors"), raw=True), \
    read_file(os.path.join(d("q4-graft"), "model-mtp.safetensors"), raw=True)
t.ok(set(a) == set(b) and all(np.array_equal(a[k], b[k]) for k in a),
     "graft: the FP8 head from its shard onto a 4-bit headless trunk equals convert's sidecar tensor for tensor")
t.ok(read_cfg(d("q4-graft"))["quantization"] == qc, "graft: config.json's quantization block equals convert's")
gl, gm = logits(d("q4-graft"), "q4-graft")
ql, qm = logits(q4, "q4")
exact("graft: MTP logits equal the converted-with-head model's", gm, qm)
nextn("convert", rbf, d("float-nohead"), "--keep", "*=float", "--no-mtp", "--quiet")
nextn("graft", d("float-nohead"), head, "-o", d("float-graft"), "--keep-dtype", "--quiet")
exact("float graft (--keep-dtype): MTP logits equal the bf16 copy's bit for bit", logits(d("float-graft"), "fg")[1],
      bfm)
r = nextn("graft", src, head, "-o", d("bad-graft"), check=False)
fails("graft onto an FP8 base is refused", r, "FP8", "nextn convert")

# ------------------------------------------------------------ errors
def bad(tag, edit=None, cfg=None):
    out = write_ckpt(d(tag), master, q, "fp8", cfg=cfg, edit=edit)
    return nextn("convert", out, d(tag + "-out"), check=False), d(tag + "-out")


r, o = bad("no-scale", lambda ts, tags: ts.pop("model.layers.1.self_attn.o_proj.weight_scale_inv"))
fails("a missing weight_scale_inv names the weight", r, "model.layers.1.self_attn.o_proj.weight",
      "weight_scale_inv", out=o)
n = "model.layers.2.mlp.experts.1.up_proj.weight_scale_inv"
r, o = bad("short-scale", lambda ts, tags: ts.__setitem__(n, ("F32", ts[n][1][:-1])))
fails("a weight_scale_inv one block row short names it and the expected shape", r, n, "[2, 3]", out=o)
r, o = bad("bf16-scale", lambda ts, tags: ts.__setitem__(n, ("BF16", ts[n][1])))
fails("a BF16 weight_scale_inv is refused (F32 expected)", r, n, "F32", out=o)
r, o = bad("e5m2", lambda ts, tags: tags.__setitem__("model.layers.1.self_attn.q_a_proj.weight", "F8_E5M2"))
fails("an F8_E5M2 weight is a named error", r, "model.layers.1.self_attn.q_a_proj.weight", "F8_E5M2", out=o)


def nan(ts, tags):
    w = ts["model.layers.2.self_attn.kv_b_proj.weight"][1].copy()
    w[5, 7] = 0x7f
    ts["model.layers.2.self_attn.kv_b_proj.weight"] = ("U8", w)


r, o = bad("nan", nan)
fails("an E4M3 NaN code is a named error", r, "model.layers.2.self_attn.kv_b_proj.weight", "NaN", out=o)
r, o = bad("stray-scale", lambda ts, tags: ts.__setitem__("model.layers.1.mlp.gate.weight_scale_inv",
                                                          ("F32", np.ones((1, 3), np.float32))))
fails("block scales of a bf16 weight are a named error", r, "model.layers.1.mlp.gate.weight_scale_inv", "BF16", out=o)
c = config()
del c["quantization_config"]["weight_block_size"]
r, o = bad("no-block", cfg=c)
fails("an fp8 quantization_config without weight_block_size is refused", r, "weight_block_size", out=o)
r, o = bad("no-config", cfg=config(False))
fails("F8_E4M3 weights without an fp8 quantization_config are refused naming one", r,
      ".weight", "F8_E4M3", "quantization_config", out=o)

shutil.rmtree(tmp, ignore_errors=True)
t.done()
