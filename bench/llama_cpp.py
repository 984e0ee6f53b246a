#!/usr/bin/python3
"""nextn against llama.cpp on the same model: decode and prompt tokens/s at matched bit widths.

One random DeepSeek-V3-architecture checkpoint with GLM-4.7-Flash's layer shapes (hidden 2048, 20
heads, q_lora 768, kv_lora 512, 64 experts top-4 of 1536 + 1 shared, a dense first layer, 4 layers,
a 32000 vocabulary; tests/ref/make_random_mla.py --preset flash-bench) is written once in the HF
layout (bf16, with an MTP layer whose drafts mostly agree with the trunk: --agree). From it:
  llama.cpp: convert_hf_to_gguf.py (bf16 GGUF; the MTP layer skipped, as the converter does), then
             llama-quantize to each of --ggml-types (default Q4_0, Q4_K_M, Q2_K);
  nextn:     `nextn convert --bits B` (MLX affine, groups of 64) for each of --bits (default 4, 2).
Random weights have no tokenizer: the GGUF gets a byte-level vocabulary of the model's size (the
benchmarks feed token ids, not text). Each round runs every model once, alternating the engines, so
both see the same machine; the table gives the median over rounds of llama-bench's tg/pp tokens/s
and `nextn bench`'s tok_s/prefill_tok_s, and nextn's ratio to each GGUF type (same thread count).

  bench/llama_cpp.py --llama-cpp DIR [--work DIR] [--rounds 3] [-n 64] [--threads 2]

DIR is a llama.cpp source tree built with CMake (build/bin/llama-bench, llama-quantize); its
commit is printed with the results. Bytes per weight differ by type (Q4_0 4.5 bits, MLX 4-bit g64
4.5 bits, Q4_K_M ~4.9, Q2_K ~2.6-3.4 by tensor, MLX 2-bit g64 2.5): the table lists each file's size.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PY = "/usr/bin/python3"

# The converter's DeepSeek class with its vocabulary replaced: a byte-level GPT-2 style token list of
# the model's size (the random checkpoint has no tokenizer files; llama.cpp needs a vocabulary).
CONVERT = r'''
import sys
sys.path[:0] = [sys.argv[1], sys.argv[1] + "/gguf-py"]
sys.argv = [sys.argv[0]] + sys.argv[2:]
import types
try:
    import sentencepiece  # noqa: F401  (gguf-py imports it; these vocabularies do not use it)
except ImportError:
    sys.modules["sentencepiece"] = types.SimpleNamespace(SentencePieceProcessor=None)
import torch
for t in ("float8_e4m3fn", "float8_e5m2"):  # an older torch: the converter only names these types
    if not hasattr(torch, t):
        setattr(torch, t, torch.uint8)
try:
    import safetensors  # noqa: F401
except ImportError:  # a reader of the few calls the converter makes (with --no-lazy), on numpy
    import json, mmap, numpy as np
    class _File:
        DT = {"BF16": (np.int16, torch.bfloat16), "F16": (np.float16, None), "F32": (np.float32, None)}
        def __init__(self, path, framework="pt", device="cpu"):
            self.f = open(path, "rb")
            n = int.from_bytes(self.f.read(8), "little")
            self.head = {k: v for k, v in json.loads(self.f.read(n)).items() if k != "__metadata__"}
            self.base = 8 + n
            self.mm = mmap.mmap(self.f.fileno(), 0, access=mmap.ACCESS_READ)
        def __enter__(self):
            return self
        def __exit__(self, *exc):
            return False
        def keys(self):
            return list(self.head)
        def get_tensor(self, name):
            h = self.head[name]
            np_dt, view = self.DT[h["dtype"]]
            b, e = h["data_offsets"]
            a = np.frombuffer(self.mm, dtype=np_dt, count=(e - b) // np.dtype(np_dt).itemsize, offset=self.base + b)
            t = torch.from_numpy(a.reshape(h["shape"]).copy())
            return t.view(view) if view is not None else t
    sys.modules["safetensors"] = types.SimpleNamespace(safe_open=_File)
    sys.argv.append("--no-lazy")
try:
    import tqdm  # noqa: F401
except ImportError:  # the writer's progress bar, silent
    class _Bar:
        def __init__(self, *a, **k):
            pass
        def __enter__(self):
            return self
        def __exit__(self, *exc):
            return False
        def update(self, *a):
            pass
        def close(self):
            pass
    sys.modules["tqdm"] = types.SimpleNamespace(tqdm=_Bar)
import convert_hf_to_gguf as c
import gguf

def byte_vocab(self):
    n = self.hparams["vocab_size"]
    tokens = [bytes([b]).decode("latin-1") for b in range(256)] + [f"<t{i}>" for i in range(256, n)]
    self.gguf_writer.add_tokenizer_model("gpt2")
    self.gguf_writer.add_tokenizer_pre("default")
    self.gguf_writer.add_token_list(tokens)
    self.gguf_writer.add_token_types([gguf.TokenType.NORMAL] * n)
    self.gguf_writer.add_token_merges(["a b"])
    self.gguf_writer.add_bos_token_id(1)
    self.gguf_writer.add_eos_token_id(2)

c.DeepseekV2Model.set_vocab = byte_vocab
_params = c.DeepseekV2Model.set_gguf_parameters


def params(self):  # llama.cpp's deepseek2 loader requires the YaRN key; 0 = no scaling (the model has none)
    _params(self)
    if (self.hparams.get("rope_scaling") or {}).get("type") != "yarn":
        self.gguf_writer.add_rope_scaling_yarn_log_mul(0.0)


c.DeepseekV2Model.set_gguf_parameters = params
c.main()
'''


def sh(args, **kw):
    r = subprocess.run([str(a) for a in args], capture_output=True, text=True, **kw)
    if r.returncode != 0:
        sys.exit(f"{' '.join(map(str, args))} failed ({r.returncode}):\n{r.stderr[-3000:]}")
    return r.stdout


def size_gb(path):
    if os.path.isfile(path):
        return os.path.getsize(path) / 1e9
    return sum(os.path.getsize(os.path.join(path, f)) for f in os.listdir(path)
               if f.endswith(".safetensors") and f != "model-mtp.safetensors") / 1e9  # the trunk, as the GGUF


def prepare(a):
    hf = os.path.join(a.work, "hf")
    if not os.path.isfile(os.path.join(hf, "config.json")):
        print(f"== writing the random checkpoint (bf16, HF layout) into {hf}", flush=True)
        sh([PY, os.path.join(ROOT, "tests/ref/make_random_mla.py"), "--family", "deepseek_v3", "--preset",
            "flash-bench", "--first-dense", "1", "--layout", "hf", "--mtp", "inline", "--agree", "0.05", "--seed",
            "61", "--out", hf])
    ggufs = {}
    bf16 = os.path.join(a.work, "model-bf16.gguf")
    if not os.path.isfile(bf16):
        print("== converting to GGUF (bf16)", flush=True)
        sh([PY, "-c", CONVERT, a.llama_cpp, hf, "--outtype", "bf16", "--outfile", bf16])
    for t in a.ggml_types:
        out = os.path.join(a.work, f"model-{t}.gguf")
        if not os.path.isfile(out):
            print(f"== llama-quantize {t}", flush=True)
            sh([os.path.join(a.llama_cpp, "build/bin/llama-quantize"), bf16, out, t, str(a.threads)])
        ggufs[t] = out
    mlx = {}
    for b in a.bits:
        out = os.path.join(a.work, f"mlx-{b}bit")
        if not os.path.isfile(os.path.join(out, "config.json")):
            print(f"== nextn convert --bits {b}", flush=True)
            sh([a.nextn, "convert", hf, out, "--bits", b, "--quiet"])
        mlx[b] = out
    return ggufs, mlx


def llama_run(a, path):
    """llama-bench's tg (decode) and pp (prompt) tokens/s, one repetition each."""
    out = sh([os.path.join(a.llama_cpp, "build/bin/llama-bench"), "-m", path, "-t", a.threads, "-p",
              a.prompt, "-n", a.n, "-r", "1", "-o", "json"])
    tg = pp = None
    for rec in json.loads(out):
        if rec.get("n_gen", 0) > 0:
            tg = rec["avg_ts"]
        elif rec.get("n_prompt", 0) > 0:
            pp = rec["avg_ts"]
    return tg, pp


def nextn_run(a, path, modes):
    """nextn bench's tok_s per mode and prefill_tok_s (of the ar mode), fed --prompt-tokens."""
    ids = ",".join(str(3 + (i * 7919) % 30000) for i in range(int(a.prompt)))
    out = sh([a.nextn, "bench", "-m", path, "-t", a.threads, "--prompt-tokens", ids, "-n", a.n, "--modes",
              ",".join(modes)])
    res = {}
    for line in out.splitlines():
        if not line.startswith("mode="):
            continue
        kv = dict(f.split("=", 1) for f in line.split() if "=" in f)
        res[kv["mode"]] = float(kv["tok_s"])
        if "acceptance" in kv:
            res["acc" + kv["mode"]] = float(kv["acceptance"])
        if kv["mode"] == "ar":
            res["prefill"] = float(kv["prefill_tok_s"])
    return res


def commit_of(d):
    r = subprocess.run(["git", "-C", d, "log", "-1", "--format=%h %cs"], capture_output=True, text=True)
    if r.returncode == 0 and r.stdout.strip():
        return r.stdout.strip()
    stamp = os.path.join(d, "COMMIT")
    return open(stamp).read().strip() if os.path.isfile(stamp) else "unknown commit"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--llama-cpp", default=os.environ.get("LLAMA_CPP_DIR"), help="llama.cpp tree built with CMake")
    ap.add_argument("--work", default="/tmp/nextn-bench-llamacpp")
    ap.add_argument("--nextn", default=os.path.join(ROOT, "build/nextn"))
    ap.add_argument("--ggml-types", default="Q4_0,Q4_K_M,Q2_K")
    ap.add_argument("--bits", default="4,2")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("-n", default="64", help="tokens decoded per run")
    ap.add_argument("--prompt", default="256", help="prompt tokens of the prefill runs")
    ap.add_argument("--threads", default="2")
    a = ap.parse_args()
    if not a.llama_cpp or not os.path.isfile(os.path.join(a.llama_cpp, "build/bin/llama-bench")):
        sys.exit("bench/llama_cpp.py: --llama-cpp DIR (or LLAMA_CPP_DIR) must name a llama.cpp tree built with "
                 "CMake (build/bin/llama-bench); docs/performance.md says how")
    a.ggml_types = [t for t in a.ggml_types.split(",") if t]
    a.bits = [b for b in a.bits.split(",") if b]
    os.makedirs(a.work, exist_ok=True)
    ggufs, mlx = prepare(a)
    res = {}
    for r in range(a.rounds):
        for t, p in ggufs.items():
            res.setdefault(("llama.cpp", t), []).append(llama_run(a, p))
        for b, p in mlx.items():
            modes = ["ar", "1", "2"] if b == a.bits[0] else ["ar"]
            res.setdefault(("nextn", b), []).append(nextn_run(a, p, modes))
        print(f"   round {r + 1} of {a.rounds} done", flush=True)
    med = lambda xs: statistics.median(x for x in xs if x is not None)  # noqa: E731
    load = os.getloadavg()[0]
    print(f"\nllama.cpp {commit_of(a.llama_cpp)}; {a.threads} threads; load average {load:.1f}; decode {a.n} tokens, prompt {a.prompt}; "
          f"median of {a.rounds} alternating rounds")
    print(f"{'engine':10} {'weights':12} {'file GB':>8} {'decode tok/s':>13} {'prompt tok/s':>13}")
    rows = {}
    for t, p in ggufs.items():
        tg, pp = med(x[0] for x in res[("llama.cpp", t)]), med(x[1] for x in res[("llama.cpp", t)])
        rows[t] = tg
        print(f"{'llama.cpp':10} {t:12} {size_gb(p):8.2f} {tg:13.1f} {pp:13.1f}")
    for b, p in mlx.items():
        runs = res[("nextn", b)]
        ar, pf = med(x["ar"] for x in runs), med(x["prefill"] for x in runs)
        print(f"{'nextn':10} {'MLX ' + b + '-bit':12} {size_gb(p):8.2f} {ar:13.1f} {pf:13.1f}")
        for k in ("1", "2"):
            if k in runs[0]:
                print(f"{'nextn':10} {'  + MTP k=' + k:12} {'':8} {med(x[k] for x in runs):13.1f}   "
                      f"(acceptance {med(x['acc' + k] for x in runs):.2f})")
    for b in a.bits:
        ar = med(x["ar"] for x in res[("nextn", b)])
        for t, tg in rows.items():
            if t.upper().startswith(f"Q{b}"):
                print(f"nextn MLX {b}-bit / llama.cpp {t} decode: {ar / tg:.2f}x")
    if "1" in res[("nextn", a.bits[0])][0]:
        best = max(med(x[k] for x in res[("nextn", a.bits[0])]) for k in ("1", "2"))
        for t, tg in rows.items():
            if t.upper().startswith(f"Q{a.bits[0]}"):
                print(f"nextn MLX {a.bits[0]}-bit with its MTP head (agreeing random head) / llama.cpp {t} decode: "
                      f"{best / tg:.2f}x")


if __name__ == "__main__":
    main()
