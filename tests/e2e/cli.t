#!/usr/bin/python3
"""The command line on bad input: every subcommand has --help; a missing, truncated or corrupt
checkpoint, a wrong config, an out-of-range parameter or a malformed token list gives a clear
error naming the problem and a non-zero exit, never a crash."""
import json
import os
import re
import shutil
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tap import PY, Tap, nextn, run, scratch  # noqa: E402

t = Tap()
tmp = scratch(prefix="nextn-cli-")

for cmd in ("run", "eval", "probe", "bench", "tokenize", "detokenize", "inspect", "serve", "convert", "graft",
            "shard"):
    r = nextn(cmd, "--help", check=False)
    t.ok(r.returncode == 0 and "usage" in r.stdout.lower(), f"{cmd} --help", r.stderr)

good = os.path.join(tmp, "good")
run([PY, "tests/ref/make_random_ckpt.py", "--layout", "tencent", "--mtp", "inline", "--seed", "9", "--out", good])


def expect_error(name, args, *needles):
    r = nextn(*args, check=False)
    crashed = r.returncode < 0 or r.returncode >= 128
    msg = r.stderr
    t.ok(r.returncode != 0 and not crashed and all(n in msg for n in needles),
         f"{name}: clear error ({msg.strip().splitlines()[-1] if msg.strip() else 'no message'})",
         f"exit {r.returncode}\n{msg}")


def variant(name, mutate):
    d = os.path.join(tmp, name)
    shutil.copytree(good, d)
    mutate(d)
    return d


expect_error("missing directory", ["inspect", "-m", os.path.join(tmp, "nope")], "config.json")


def truncate(d):
    p = os.path.join(d, "model.safetensors")
    with open(p, "r+b") as f:
        f.truncate(os.path.getsize(p) // 2)


expect_error("truncated safetensors", ["inspect", "-m", variant("trunc", truncate)], "model.safetensors")


def corrupt_header(d):
    p = os.path.join(d, "model.safetensors")
    with open(p, "r+b") as f:
        f.seek(8)
        f.write(b"{\"x\": [")


expect_error("corrupt header", ["inspect", "-m", variant("corrupt", corrupt_header)], "model.safetensors")


def huge_header_len(d):
    p = os.path.join(d, "model.safetensors")
    with open(p, "r+b") as f:
        f.write((1 << 62).to_bytes(8, "little"))


expect_error("header length beyond the file", ["inspect", "-m", variant("hugelen", huge_header_len)], "header")


def edit_config(key, value):
    def f(d):
        p = os.path.join(d, "config.json")
        cfg = json.load(open(p))
        if value is None:
            del cfg[key]
        else:
            cfg[key] = value
        json.dump(cfg, open(p, "w"))
    return f


# a context is committed when it is made: one that cannot be (6 TB here) is refused up front
# with its size, not found short mid-generation
expect_error("context larger than memory",
             ["run", "-m", variant("longctx", edit_config("max_position_embeddings", 2147483647)),
              "--prompt-tokens", "1,2", "-n", "2", "--ctx", "2000000000"],
             "context of 2000000000 positions needs", "MB for its KV caches")
expect_error("config: wrong type", ["inspect", "-m", variant("cfgtype", edit_config("hidden_size", "big"))], "hidden_size")
expect_error("config: missing field", ["inspect", "-m", variant("cfgmiss", edit_config("num_hidden_layers", None))],
             "num_hidden_layers")
expect_error("config: shape disagrees with tensors", ["inspect", "-m", variant("cfgshape", edit_config("hidden_size", 192))],
             "shape")
expect_error("config: unsupported family", ["inspect", "-m", variant("cfgfam", edit_config("model_type", "llama"))],
             "llama", "supported: hy_v3 (HYV3ForCausalLM), glm4_moe (Glm4MoeForCausalLM)")
expect_error("config: unsupported architecture",
             ["inspect", "-m", variant("cfgarch", edit_config("architectures", ["MixtralForCausalLM"]))],
             "MixtralForCausalLM", "supported: hy_v3 (HYV3ForCausalLM), glm4_moe (Glm4MoeForCausalLM)")

expect_error("top-p out of range", ["run", "-m", good, "--prompt-tokens", "1,2", "--top-p", "1.5"], "--top-p")
expect_error("temperature not a number", ["run", "-m", good, "--prompt-tokens", "1,2", "--temp", "hot"], "--temp")
expect_error("draft out of range", ["run", "-m", good, "--prompt-tokens", "1,2", "--draft", "99"], "--draft")
expect_error("activation precision not 8 or 16", ["run", "-m", good, "--prompt-tokens", "1,2", "--act-bits", "4"],
             "--act-bits")
expect_error("serve: activation precision not a number", ["serve", "-m", good, "--act-bits", "int8"], "--act-bits")
expect_error("KV cache type not f32 or f16", ["run", "-m", good, "--prompt-tokens", "1,2", "--kv-type", "q8_0"],
             "--kv-type q8_0")
expect_error("serve: KV cache type not f32 or f16", ["serve", "-m", good, "--kv-type", "F16"], "--kv-type F16")
expect_error("serve: negative prompt cache size", ["serve", "-m", good, "--cache-ram", "-5"], "--cache-ram -5")
expect_error("serve: prompt cache size not a number", ["serve", "-m", good, "--cache-ram", "lots"], "--cache-ram lots")
expect_error("serve: too many checkpoints", ["serve", "-m", good, "--ctx-checkpoints", "65"], "--ctx-checkpoints 65: expected 0..64")
expect_error("serve: negative checkpoint spacing", ["serve", "-m", good, "--checkpoint-every", "-1"],
             "--checkpoint-every -1")
expect_error("serve: reasoning format not split or none", ["serve", "-m", good, "--reasoning-format", "deepseek"],
             "--reasoning-format deepseek")
expect_error("malformed token list", ["run", "-m", good, "--prompt-tokens", "1,x,3"], "token")
expect_error("token id beyond the vocabulary", ["run", "-m", good, "--prompt-tokens", "1,999999"], "out of range")
expect_error("no tokenizer for text", ["run", "-m", good, "-p", "hello"], "tokenizer")
expect_error("unknown option", ["run", "-m", good, "--frobnicate"], "frobnicate")
expect_error("unknown command", ["frobnicate"], "frobnicate")

r = nextn("run", "-m", good, "--prompt-tokens", "1,2,3", "-n", "5", "--print-ids", "--ignore-eos", "--quiet")
t.ok(len(r.stdout.split()) == 5, "a good checkpoint still runs", r.stdout)

# --logit-bias: llama.cpp's TOKEN_ID+BIAS form forces a token (greedy and sampled, with drafts);
# malformed or out-of-range entries are refused by name
for extra in ([], ["--temp", "1", "--draft", "2"]):
    r = nextn("run", "-m", good, "--prompt-tokens", "1,2,3", "-n", "5", "--print-ids", "--ignore-eos", "--quiet",
              "--logit-bias", "7+100", "--logit-bias", "8-5", *extra)
    t.ok(r.stdout.split() == ["7"] * 5, f"--logit-bias 7+100 forces token 7 {extra}", r.stdout)
# --json-object: the default model's output is one JSON object (finished ones parse), with and
# without drafts; a model without a tokenizer is refused by name
DEFAULT = "models/nextn-hy3-tiny"
EOS = "<\uff5chy_eos:opensource\uff5c>"
finished = 0
for seed in range(4):
    for extra in (["--draft", "0"], ["--draft", "2"]):
        r = nextn("run", "-m", DEFAULT, "-p", "JSON:", "-n", "120", "--temp", "0.7", "--seed", str(seed), "--quiet",
                  "--json-object", *extra)
        out = r.stdout.rstrip("\n")
        ok = out.startswith("{")
        if out.endswith(EOS):
            finished += 1
            try:
                ok = ok and isinstance(json.loads(out[: -len(EOS)]), dict)
            except ValueError:
                ok = False
        t.ok(ok, f"--json-object seed {seed} {extra}: a JSON object (or its start, cut by -n)", out)
t.ok(finished >= 2, f"--json-object: {finished} of 8 runs closed their object and ended")
# --json-schema: the object matches the schema (checked here field by field), or the run names the
# unsupported keyword
SCHEMA = json.dumps({"type": "object", "properties": {"kind": {"enum": ["river", "lake"]}, "deep": {"type": "boolean"},
                                                      "n": {"type": "integer"}}, "required": ["kind", "deep"]})
for seed in range(3):
    r = nextn("run", "-m", DEFAULT, "-p", "JSON:", "-n", "400", "--temp", "0.7", "--seed", str(seed), "--quiet",
              "--json-schema", SCHEMA, "--draft", "2")
    out = r.stdout.rstrip("\n")
    try:
        v = json.loads(out[: -len(EOS)]) if out.endswith(EOS) else None
    except ValueError:
        v = None
    matches = isinstance(v, dict) and v.get("kind") in ("river", "lake") and isinstance(v.get("deep"), bool) and \
        set(v) <= {"kind", "deep", "n"} and (type(v.get("n", 0)) is int)
    t.ok(matches, f"--json-schema seed {seed}: an object matching the schema", out)
expect_error("json schema with an unsupported keyword",
             ["run", "-m", DEFAULT, "-p", "x", "--json-schema", '{"type":"object","properties":{"a":{"not":{}}}}'],
             "--json-schema: JSON schema at #/properties/a: the keyword 'not' is not supported")
expect_error("json object without a tokenizer", ["run", "-m", good, "--prompt-tokens", "1,2", "--json-object"],
             "--json-object: JSON mode needs the model's tokenizer.json")
expect_error("logit bias: no sign", ["run", "-m", good, "--prompt-tokens", "1,2", "--logit-bias", "7=1"],
             "--logit-bias 7=1", "TOKEN_ID+BIAS")
expect_error("logit bias: out of range", ["run", "-m", good, "--prompt-tokens", "1,2", "--logit-bias", "7+101"],
             "[-100, 100]")
expect_error("logit bias: token past the vocabulary",
             ["run", "-m", good, "--prompt-tokens", "1,2", "--logit-bias", "419+1"], "token id 419 is out of range")

# bench prints one line per mode and the dense-part timing, with figures that parse
r = nextn("bench", "-m", good, "-n", "6", "--modes", "ar,1", "--synthetic-accept", "0.8", check=False)
lines = r.stdout.splitlines()
fields = {}
for ln in lines:
    for kv in ln.split():
        if "=" in kv:
            k, v = kv.split("=", 1)
            fields.setdefault(k, []).append(v)
modes = [ln.split()[0] for ln in lines if ln.startswith("mode=")]
t.ok(r.returncode == 0 and modes == ["mode=ar", "mode=1"], "bench: a line per mode", r.stdout + r.stderr)
try:
    dense = {k: float(fields[k][0]) for k in ("dense_step_ms", "dense_verify2_ms", "dense_verify2/step", "dense_MB")}
    ratio = dense["dense_verify2_ms"] / dense["dense_step_ms"]  # printed to 4 decimals: allow their rounding
    tol = 1e-4 / dense["dense_step_ms"] * (1 + ratio) + 1e-3
    ok = all(v > 0 for v in dense.values()) and abs(dense["dense_verify2/step"] - ratio) < tol
    ok = ok and dense["dense_MB"] * 1e6 < sum(os.path.getsize(os.path.join(good, f)) for f in os.listdir(good))
except (KeyError, ValueError):
    dense, ok = None, False
t.ok(ok, f"bench: dense-part timing line {dense}", r.stdout)
# the plain steps' split: the parts add up to the step, and the attention's and head's read
# rates times their times give the bytes of the checkpoint's q/k/v/o projections and lm_head
def tensor_bytes(d, pattern):
    n_layers = json.load(open(os.path.join(d, "config.json")))["num_hidden_layers"]
    total = 0
    for fn in os.listdir(d):
        if not fn.endswith(".safetensors"):
            continue
        with open(os.path.join(d, fn), "rb") as f:
            hdr = json.loads(f.read(int.from_bytes(f.read(8), "little")))
        for name, v in hdr.items():
            m = re.fullmatch(pattern, name)
            if m and (not m.groups() or int(m.group(1)) < n_layers):
                total += v["data_offsets"][1] - v["data_offsets"][0]
    return total

try:
    ar = dict(kv.split("=", 1) for kv in lines[[i for i, ln in enumerate(lines) if ln.startswith("mode=ar")][0]].split())
    sp = {k: float(ar[k]) for k in ("ar_step_us", "attn_us", "ffn_us", "head_us", "rest_us", "attn_GB_s", "head_GB_s")}
    attn = tensor_bytes(good, r"model\.layers\.(\d+)\.self_attn\.[qkvo]_proj\.(?:weight|scales|biases)")
    head = tensor_bytes(good, r"lm_head\.weight")
    ok = all(sp[k] > 0 for k in ("attn_us", "ffn_us", "head_us")) and sp["rest_us"] > -0.02
    ok = ok and abs(sp["attn_us"] + sp["ffn_us"] + sp["head_us"] + sp["rest_us"] - sp["ar_step_us"]) < 0.05
    # the rates are printed to 0.01 GB/s: half of that, times the time, is their rounding (a
    # stalled step's rate can be a few hundredths)
    ok = ok and abs(sp["attn_GB_s"] * sp["attn_us"] * 1e3 - attn) <= 0.02 * attn + 0.005 * sp["attn_us"] * 1e3
    ok = ok and abs(sp["head_GB_s"] * sp["head_us"] * 1e3 - head) <= 0.04 * head + 0.005 * sp["head_us"] * 1e3
    ok = ok and float(ar["outside_us"]) > 0 and "outside_us" not in lines[1]
except (KeyError, ValueError, IndexError):
    sp, ok = None, False
t.ok(ok, f"bench: the plain step's split {sp}", r.stdout)
try:
    huge = float(fields["weights_on_2MB_pages"][0])
except (KeyError, ValueError):
    huge = None
t.ok(huge is not None and 0.0 <= huge <= 1.0, f"bench: share of the weights on 2 MB pages {huge}", r.stdout)

# --membw: a bandwidth reading before every third plain step, each paired with the second step
# after it (the first timed apart as the settling step): 9 tokens are 8 steps after the
# prefill's token, so pairs at steps 2, 5 and 8
r = nextn("bench", "-m", good, "-n", "9", "--modes", "ar", "--membw", "64", check=False)
try:
    ar = dict(kv.split("=", 1) for kv in [ln for ln in r.stdout.splitlines() if ln.startswith("mode=ar")][0].split())
    bw = {k: float(ar[k]) for k in ("membw_pairs", "membw_GB_s", "membw_lo_GB_s", "membw_hi_GB_s", "weight_frac",
                                    "weight_frac_top", "pairs_top", "tok_s", "settle_step/step")}
    ok = bw["membw_pairs"] == 3 and 0 < bw["membw_lo_GB_s"] <= bw["membw_GB_s"] <= bw["membw_hi_GB_s"]
    ok = ok and bw["weight_frac"] > 0 and bw["weight_frac_top"] > 0 and 1 <= bw["pairs_top"] <= 3
    ok = ok and bw["settle_step/step"] > 0
except (KeyError, ValueError, IndexError):
    bw, ok = None, False
t.ok(r.returncode == 0 and ok, f"bench --membw: paired readings {bw}", r.stdout + r.stderr)
expect_error("bench --membw without plain steps", ["bench", "-m", good, "-n", "4", "--modes", "1", "--membw", "64"],
             "--membw", "needs the ar mode")
expect_error("bench --membw too small", ["bench", "-m", good, "--membw", "8"], "--membw 8", "[16, 65536]")

# --draft-vocab N: the head drafts over token ids < N only. Its teacher-forced logits keep the
# full head's values below N and are -inf from N on; the trunk's are untouched; and output is
# exact: greedy, and sampled under --verify match (seeded output independent of the drafts), the
# text equals plain decoding's
ids = "1,17,42,99,7,250,3,64,12,5"
full_l, full_m = os.path.join(tmp, "dv_full.npy"), os.path.join(tmp, "dv_full.mtp.npy")
cut_l, cut_m = os.path.join(tmp, "dv_cut.npy"), os.path.join(tmp, "dv_cut.mtp.npy")
r1 = nextn("eval", "-m", good, "--tokens", ids, "--logits", full_l, "--mtp-logits", full_m, check=False)
r2 = nextn("eval", "-m", good, "--tokens", ids, "--logits", cut_l, "--mtp-logits", cut_m, "--draft-vocab", "60",
           check=False)
try:
    fm, cm = np.load(full_m), np.load(cut_m)
    ok = (r1.returncode == 0 and r2.returncode == 0 and np.array_equal(np.load(full_l), np.load(cut_l))
          and np.array_equal(fm[:, :60], cm[:, :60]) and bool(np.all(np.isneginf(cm[:, 60:]))) and fm.shape == cm.shape)
except (OSError, ValueError):
    ok = False
t.ok(ok, "--draft-vocab 60: the head's logits below 60 as the full head's, -inf from 60 on; trunk logits unchanged",
     r1.stderr + r2.stderr)
prompt = "static int compare(const void *a"
for mode in (["--temp", "0"], ["--temp", "0.8", "--seed", "3", "--verify", "match"]):
    plain = nextn("run", "-p", prompt, "-n", "40", "--draft", "0", *mode, check=False)
    cut = nextn("run", "-p", prompt, "-n", "40", "--draft", "2", "--draft-vocab", "60", *mode, check=False)
    t.ok(plain.returncode == 0 and cut.returncode == 0 and plain.stdout == cut.stdout and plain.stdout,
         f"--draft-vocab 60 {' '.join(mode)}: the text plain decoding gives", plain.stdout + "\n---\n" + cut.stdout)

# --prompt-cache: a second run of the same prompt (sampled, seeded) reuses the saved rows and
# prints the same text as the first; a longer prompt reuses them as its prefix and prints what a
# run without the cache prints; a broken cache file is reported by name and ignored.
pc = os.path.join(tmp, "prompt.state")
prompt = "static int compare(const void *a, const void *b) {"
# a fixed draft length: with --draft auto the drafts follow measured timings, and at temperature
# > 0 another draft length draws another (equally exact) sample
gen = ["run", "-p", prompt, "-n", "24", "--temp", "0.7", "--seed", "5", "--draft", "2"]
r1 = nextn(*gen, "--prompt-cache", pc, check=False)
r2 = nextn(*gen, "--prompt-cache", pc, check=False)
m1 = re.search(r"prompt cache: (\d+) rows saved", r1.stderr)
m2 = re.search(r"prefill: (\d+) tokens \((\d+) cached\)", r2.stderr)
t.ok(r1.returncode == 0 and r2.returncode == 0 and m1 and os.path.getsize(pc) > 96 and m2
     and int(m2.group(2)) == int(m2.group(1)) - 1 and r1.stdout == r2.stdout,
     "run --prompt-cache: the second run reuses the prompt's rows and prints the same text", r1.stderr + r2.stderr)
longer = ["run", "-p", prompt + " return 0;", "-n", "24", "--temp", "0.7", "--seed", "5", "--draft", "2"]
before = os.path.getmtime(pc), os.path.getsize(pc)
r3 = nextn(*longer, "--prompt-cache", pc, "--prompt-cache-ro", check=False)
r4 = nextn(*longer, check=False)
m3 = re.search(r"\((\d+) cached\)", r3.stderr)
t.ok(r3.returncode == 0 and m3 and int(m3.group(1)) == int(m1.group(1)) and r3.stdout == r4.stdout
     and (os.path.getmtime(pc), os.path.getsize(pc)) == before,
     "run --prompt-cache-ro: a longer prompt reuses the saved rows as its prefix, same text, file untouched",
     r3.stderr)
with open(pc, "r+b") as f:
    f.seek(200)
    f.write(b"\xff\xff\xff\xff")
r5 = nextn(*gen, "--prompt-cache", pc, check=False)
t.ok(r5.returncode == 0 and "checksum mismatch" in r5.stderr and pc in r5.stderr and r5.stdout == r1.stdout
     and "cached" not in r5.stderr.split("prefill:")[1].split("|")[0],
     "run --prompt-cache: a corrupt file is named, ignored, and then rewritten", r5.stderr)
r6 = nextn(*gen, "--prompt-cache", pc, check=False)
t.ok(r6.returncode == 0 and "cached)" in r6.stderr, "run --prompt-cache: the rewritten file loads", r6.stderr)
expect_error("prompt cache in a missing directory",
             ["run", "-p", prompt, "-n", "2", "--prompt-cache", os.path.join(tmp, "no", "such", "x.state")],
             "cannot create")

shutil.rmtree(tmp)
t.done()
