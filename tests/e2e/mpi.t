#!/usr/bin/python3
"""One model across several MPI ranks (`mpirun -n R nextn ... --split pipeline|experts`,
docs/multinode.md) on localhost ranks:
  the same token ids as the single process, greedy (--draft auto) and seeded sampling (--draft 2),
  MTP on and off, with 1, 2 and 3 ranks and either split, on the default model and on random
  checkpoints of two more families (DeepSeek-V3: latent attention, expert groups; Qwen3.5: Gated
  DeltaNet layers whose recurrent states a rejected draft takes back), their heads agreeing with
  their trunks so drafts are accepted and verified; each split run reports network traffic (so it
  did run on several ranks) and its verify cycles;
  per-rank shares (`nextn shard`) of the default model and of an MLX 4-bit checkpoint with stacked
  experts and a sidecar head, for both splits on 2 and 3 ranks: each smaller than the checkpoint
  (pipeline: the layers' bytes divided; experts: the routed experts' divided), the same ids run from
  them; a share given to the wrong rank, cut for another rank count or split, run alone, or lacking
  a tensor its rank needs, refused naming the problem;
  `nextn serve --split` answering as the single-process server does, and after a rank fails
  answering 503 naming it, then exiting with a non-zero status by itself;
  a rank killed mid-run ending the job at once with an error naming it; a rank that stops answering
  ending it within --split-timeout with rank 0's error (the server answering 503); ranks that loaded
  different models refusing to start; and nonsense --split values refused.

  NEXTN=build/nextn prove -v tests/e2e/mpi.t
"""
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "server"))
from serverlib import MODEL, curl  # noqa: E402
from tap import NEXTN, PY, ROOT, Tap, scratch  # noqa: E402

t = Tap()
tmp = scratch(prefix="nextn-mpi-")
MPIRUN = ["mpirun", "--oversubscribe", "--allow-run-as-root", "--mca", "btl", "self,vader,tcp"]
PROMPT = ["-p", "The history of the city begins"]
IDS = ["--prompt-tokens", "3,1,4,1,5,9,2,6"]


def mpirun(n, args, timeout=120, env=None):
    return subprocess.run([*MPIRUN, "-n", str(n), NEXTN, *args], capture_output=True, text=True, cwd=ROOT,
                          timeout=timeout, env=env)


def single(args):
    return subprocess.run([NEXTN, *args], capture_output=True, text=True, cwd=ROOT, timeout=120)


def make(gen, name, args):
    out = os.path.join(tmp, name)
    subprocess.run([PY, gen, *args, "--out", out], check=True, capture_output=True, cwd=ROOT)
    return out


models = [
    ("hy3-tiny", MODEL, PROMPT),
    ("deepseek_v3", make("tests/ref/make_random_mla.py", "ds",
                         ["--family", "deepseek_v3", "--agree", "0.05", "--seed", "5"]), IDS),
    ("qwen3_5_moe", make("tests/ref/make_random_qwen35.py", "qw",
                         ["--family", "qwen3_5_moe", "--agree", "0.05", "--seed", "7"]), IDS),
]
modes = [
    ("greedy auto", []),
    ("no MTP", ["--no-mtp"]),
    ("seeded k=2", ["--temp", "0.9", "--seed", "3", "--draft", "2"]),
]

# ---------------------------------------------------------------- same tokens as one process
for mname, mdir, prompt in models:
    for label, extra in modes:
        common = ["run", "-m", mdir, *prompt, "-n", "40", "--ignore-eos", "--print-ids", "-t", "1", *extra]
        ref = single(common)
        ref_ids = ref.stdout.strip()
        if not t.ok(ref.returncode == 0 and len(ref_ids.split()) == 40, f"{mname} {label}: single process",
                    ref.stderr[-1500:]):
            continue
        ranks = (1, 2, 3) if mname == "hy3-tiny" else (2, 3)
        for n in ranks:
            for split in ("pipeline", "experts"):
                r = mpirun(n, [*common, "--split", split, "--stats"])
                ids = r.stdout.strip()
                net = re.search(r"network \(all ranks\): [\d.]+ MB sent in (\d+) messages", r.stderr)
                split_ran = net is not None and int(net.group(1)) > 0 if n > 1 else net is None
                t.ok(r.returncode == 0 and ids == ref_ids and split_ran,
                     f"{mname} {label}: {n} rank(s), --split {split}: the same {len(ids.split())} ids",
                     f"rc {r.returncode}\nsingle: {ref_ids}\nsplit:  {ids}\n{r.stderr[-1500:]}")
                if n == 3 and label == "seeded k=2":
                    t.ok(re.search(r"network \(rank 0\):.*verify cycle \(drafts \+ verify\) [\d.]+ KB", r.stderr),
                         f"{mname} 3 ranks --split {split}: --stats reports network per verify cycle", r.stderr[-800:])

# ---------------------------------------------------------------- per-rank shares (nextn shard)
LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")
ROUTED = re.compile(r"\.mlp\.(experts\.\d+\.|switch_mlp\.)")


def header(path):
    """A safetensors file's tensors: {name: (dtype, shape, nbytes)}."""
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        h = json.loads(f.read(n))
    h.pop("__metadata__", None)
    return {k: (v["dtype"], v["shape"], v["data_offsets"][1] - v["data_offsets"][0]) for k, v in h.items()}


def tensors(d):
    out = {}
    for f in sorted(os.listdir(d)):
        if f.endswith(".safetensors"):
            out.update(header(os.path.join(d, f)))
    return out


def drop_tensor(d, name):
    """Rewrites the share's file holding name without it (and its index entry)."""
    for f in sorted(os.listdir(d)):
        path = os.path.join(d, f)
        if not f.endswith(".safetensors") or name not in header(path):
            continue
        with open(path, "rb") as fh:
            n = int.from_bytes(fh.read(8), "little")
            h = json.loads(fh.read(n))
            data = fh.read()
        keep, blobs, off = {}, [], 0
        for k, v in sorted(((k, v) for k, v in h.items() if k not in (name, "__metadata__")),
                           key=lambda kv: kv[1]["data_offsets"][0]):
            a, b = v["data_offsets"]
            blobs.append(data[a:b])
            keep[k] = {"dtype": v["dtype"], "shape": v["shape"], "data_offsets": [off, off + b - a]}
            off += b - a
        hb = json.dumps(keep).encode()
        hb += b" " * (-len(hb) % 8)
        os.unlink(path)  # a new file, not the linked one
        with open(path, "wb") as fh:
            fh.write(len(hb).to_bytes(8, "little") + hb + b"".join(blobs))
    ip = os.path.join(d, "model.safetensors.index.json")
    index = json.load(open(ip))
    del index["weight_map"][name]
    json.dump(index, open(ip, "w"))


def shard(src, split, n, out):
    return subprocess.run([NEXTN, "shard", "-m", src, "--split", split, "--ranks", str(n), "-o", out],
                          capture_output=True, text=True, cwd=ROOT, timeout=120)


def check_sizes(mname, src, split, n, out):
    full = tensors(src)
    n_layers = json.load(open(os.path.join(src, "config.json")))["num_hidden_layers"]
    shares = [tensors(os.path.join(out, f"rank-{r}")) for r in range(n)]
    size = lambda ts, keep=lambda k: True: sum(v[2] for k, v in ts.items() if keep(k))  # noqa: E731
    t.ok(all(size(s) < size(full) for s in shares), f"{mname} {split} x{n}: each share is smaller than the checkpoint "
         f"({[round(size(s) / 1e6, 2) for s in shares]} vs {size(full) / 1e6:.2f} MB)")
    if split == "pipeline":
        trunk = lambda k: LAYER.search(k) is not None and int(LAYER.search(k).group(1)) < n_layers  # noqa: E731
        per = [size(s, trunk) for s in shares]
        biggest = max(sum(v[2] for k, v in full.items() if trunk(k) and LAYER.search(k).group(1) == str(l))
                      for l in range(n_layers))
        t.ok(sum(per) == size(full, trunk) and all(b <= size(full, trunk) / n + biggest for b in per),
             f"{mname} pipeline x{n}: each trunk layer in one share, each share within a layer of 1/{n} "
             f"of the layers' bytes ({per})")
    else:
        routed = lambda k: ROUTED.search(k) is not None  # noqa: E731
        per = [size(s, routed) for s in shares]
        same = all({k: v for k, v in s.items() if not routed(k)} == {k: v for k, v in full.items() if not routed(k)}
                   for s in shares)
        t.ok(sum(per) == size(full, routed) and max(per) < size(full, routed) and same,
             f"{mname} experts x{n}: the routed experts' bytes divided ({per}), the rest in every share")


share_models = [
    ("hy3-tiny", MODEL, PROMPT),
    ("glm4_moe mlx 4-bit", make("tests/ref/make_random_glm.py", "glm",
                                ["--layout", "mlx", "--quant", "4:32", "--mtp", "sidecar", "--agree", "0.05",
                                 "--seed", "3"]), IDS),
]
shares = {}
for mname, mdir, prompt in share_models:
    refs = {}
    for label, extra in modes:
        refs[label] = single(["run", "-m", mdir, *prompt, "-n", "24", "--ignore-eos", "--print-ids", "-t", "1",
                              *extra]).stdout.strip()
    for split in ("pipeline", "experts"):
        for n in (2, 3):
            out = os.path.join(tmp, f"shares-{len(shares)}")
            r = shard(mdir, split, n, out)
            shares[(mname, split, n)] = out
            if not t.ok(r.returncode == 0 and os.path.isdir(os.path.join(out, f"rank-{n - 1}")),
                        f"{mname}: nextn shard --split {split} --ranks {n}", r.stderr[-1000:]):
                continue
            check_sizes(mname, mdir, split, n, out)
            for label, extra in modes:
                r = mpirun(n, ["run", "-m", out, *prompt, "-n", "24", "--ignore-eos", "--print-ids", "-t", "1",
                               "--split", split, *extra])
                t.ok(r.returncode == 0 and r.stdout.strip() == refs[label] and len(refs[label].split()) == 24,
                     f"{mname} {label}: {n} ranks from their shares, --split {split}: the single process's ids",
                     f"rc {r.returncode}\nsingle: {refs[label]}\nshares: {r.stdout.strip()}\n{r.stderr[-1500:]}")


def refused(n, model, split, want, label):
    r = mpirun(n, ["run", "-m", model, *PROMPT, "-n", "4", "--split", split], timeout=60)
    t.ok(r.returncode != 0 and want in r.stderr, f"refused: {label}", r.stderr[-1500:])


sp2, sp3 = shares[("hy3-tiny", "pipeline", 2)], shares[("hy3-tiny", "pipeline", 3)]
swapped = os.path.join(tmp, "swapped")
os.mkdir(swapped)
for r in (0, 1):
    os.symlink(os.path.join(sp2, "rank-1"), os.path.join(swapped, f"rank-{r}"))
refused(2, swapped, "pipeline", "\"rank\" is 1: rank 1's share given to rank 0", "rank 1's share given to rank 0")
refused(2, sp3, "pipeline", "\"ranks\" is 3: the share was cut for 3 ranks, the job has 2",
        "a share cut for 3 ranks run on 2")
refused(2, sp2, "experts", "the share was cut for --split pipeline, the job runs --split experts",
        "a pipeline share run with --split experts")
r = single(["run", "-m", os.path.join(sp2, "rank-0"), *PROMPT, "-n", "4"])
t.ok(r.returncode != 0 and "run it with mpirun -n 2 ... --split pipeline" in r.stderr,
     "refused: a share run by one process", r.stderr[-800:])
cut = os.path.join(tmp, "cut")
shutil.copytree(sp2, cut, symlinks=True)
lo, hi = json.load(open(os.path.join(cut, "rank-1", "nextn-share.json")))["layers"]
need = sorted(k for k in tensors(os.path.join(cut, "rank-1")) if k.endswith("self_attn.q_proj.weight"))[0]
drop_tensor(os.path.join(cut, "rank-1"), need)
refused(2, cut, "pipeline", f"missing tensor {need}", f"a share without {need} (its layers {lo}-{hi - 1})")
mixed = os.path.join(tmp, "mixed")
os.mkdir(mixed)
os.symlink(os.path.join(sp2, "rank-0"), os.path.join(mixed, "rank-0"))
os.symlink(os.path.join(shares[("glm4_moe mlx 4-bit", "pipeline", 2)], "rank-1"), os.path.join(mixed, "rank-1"))
refused(2, mixed, "pipeline", "rank 1 loaded another model than rank 0", "shares cut from two checkpoints")
r = shard(MODEL, "pipeline", 2, sp2)
t.ok(r.returncode != 0 and "exists" in r.stderr, "nextn shard refuses to write over existing shares", r.stderr)

# ---------------------------------------------------------------- failures
ctx_model = os.path.join(tmp, "long")  # the default model allowing long runs (its files linked)
os.mkdir(ctx_model)
for f in os.listdir(MODEL):
    if f != "config.json":
        os.symlink(os.path.join(MODEL, f), os.path.join(ctx_model, f))
cfg = json.load(open(os.path.join(MODEL, "config.json")))
cfg["max_position_embeddings"] = 16384
json.dump(cfg, open(os.path.join(ctx_model, "config.json"), "w"))
pidfile = os.path.join(tmp, "rank1.pid")


def start_job(n, args, sig, timeout_s):
    """A long run on n ranks whose rank 1 gets signal sig once it is decoding; returns (seconds
    from the signal to the job's end, return code, stderr)."""
    if os.path.exists(pidfile):
        os.unlink(pidfile)
    wrap = f'[ "$OMPI_COMM_WORLD_RANK" = 1 ] && echo $$ > {pidfile}; exec "$@"'
    p = subprocess.Popen([*MPIRUN, "-n", str(n), "sh", "-c", wrap, "sh", NEXTN, *args], cwd=ROOT,
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 60
    while not os.path.exists(pidfile) and time.time() < deadline:
        time.sleep(0.05)
    time.sleep(1.0)  # loaded and decoding
    pid = int(open(pidfile).read())
    t0 = time.time()
    os.kill(pid, sig)
    try:
        _, err = p.communicate(timeout=timeout_s + 60)
    except subprocess.TimeoutExpired:
        p.kill()
        _, err = p.communicate()
        if sig == signal.SIGSTOP:
            os.kill(pid, signal.SIGKILL)
        return None, None, err
    return time.time() - t0, p.returncode, err


LONG = ["run", "-m", ctx_model, *PROMPT, "-n", "8000", "--ignore-eos", "--print-ids", "-t", "1", "--split"]
for split in ("pipeline", "experts"):
    dt, rc, err = start_job(3, [*LONG, split], signal.SIGKILL, 30)
    t.ok(dt is not None and dt < 30 and rc != 0 and re.search(r"rank 1\b.*(signal 9|Killed)", err, re.S),
         f"--split {split}: rank 1 killed: the job ends ({dt and round(dt, 1)} s, rc {rc}) naming the rank",
         err[-1500:])
    dt, rc, err = start_job(3, [*LONG, split, "--split-timeout", "3"], signal.SIGSTOP, 3)
    t.ok(dt is not None and dt < 20 and rc != 0 and re.search(r"rank 0: .*no answer within 3 s", err),
         f"--split {split}: rank 1 stopped: rank 0 ends the job after --split-timeout ({dt and round(dt, 1)} s)",
         err[-1500:])

# ranks that loaded different models
ds = models[1][1]
r = subprocess.run([*MPIRUN, "-n", "1", NEXTN, "run", "-m", ds, *IDS, "-n", "4", "--split", "pipeline", ":",
                    "-n", "1", NEXTN, "run", "-m", models[2][1], *IDS, "-n", "4", "--split", "pipeline"],
                   capture_output=True, text=True, cwd=ROOT, timeout=120)
t.ok(r.returncode != 0 and "rank 1 loaded another model" in r.stderr, "ranks with different models refuse to start",
     r.stderr[-1000:])
r = single(["run", *PROMPT, "-n", "4", "--split", "rows"])
t.ok(r.returncode == 2 and "--split rows: expected pipeline or experts" in r.stderr, "--split rows is refused",
     r.stderr)

# ---------------------------------------------------------------- the server
body = {"prompt": "The history of the city", "max_tokens": 24, "temperature": 0}


def serve_job(n, args):
    log = open(os.path.join(tmp, f"serve{n}.log"), "w+")
    wrap = f'[ "$OMPI_COMM_WORLD_RANK" = 1 ] && echo $$ > {pidfile}; exec "$@"'
    cmd = [NEXTN, "serve", "-m", ctx_model, "--host", "127.0.0.1", "--port", "0", "-t", "1", *args]
    p = subprocess.Popen([*MPIRUN, "-n", str(n), "sh", "-c", wrap, "sh", *cmd] if n else cmd, cwd=ROOT,
                         stdout=log, stderr=subprocess.STDOUT)
    deadline = time.time() + 120
    while time.time() < deadline:
        m = re.search(r"listening on http://[^ ]*:(\d+)/", open(log.name).read())
        if m:
            return p, f"http://127.0.0.1:{m.group(1)}", log.name
        if p.poll() is not None:
            break
        time.sleep(0.1)
    raise RuntimeError("nextn serve did not start:\n" + open(log.name).read()[-2000:])


p1, base1, _ = serve_job(0, [])
want = curl(base1 + "/v1/completions", body).json()["choices"][0]["text"]
p1.send_signal(signal.SIGTERM)
p1.wait(timeout=30)
p2, base2, log2 = serve_job(2, ["--split", "experts", "--split-timeout", "3"])
got = curl(base2 + "/v1/completions", body)
t.ok(got.status == 200 and got.json()["choices"][0]["text"] == want,
     "serve on 2 ranks (--split experts): the single-process server's completion", f"{got.status} {got.body[:500]}")
os.kill(int(open(pidfile).read()), signal.SIGSTOP)
t0 = time.time()
bad = curl(base2 + "/v1/completions", body, timeout=60)
t.ok(bad.status == 503 and "no answer within 3 s" in bad.body, "a stopped rank: the server answers 503 naming it",
     f"{bad.status} {bad.body[:500]}")
again = curl(base2 + "/v1/completions", body, timeout=60)
t.ok(again.status in (503, 0) and (again.status == 0 or "no answer within 3 s" in again.body),
     "a request after the failure: 503 naming it (or the server is gone)", f"{again.status} {again.body[:500]}")
try:
    rc = p2.wait(timeout=30)
except subprocess.TimeoutExpired:
    rc = None
    p2.kill()
    os.kill(int(open(pidfile).read()), signal.SIGKILL)
log = open(log2).read()
t.ok(rc not in (None, 0) and "answering 503 for 2 s, then exiting" in log,
     f"a stopped rank: the server stops by itself with a non-zero status ({rc}, {time.time() - t0:.1f} s)", log[-1500:])

# a rank killed while a request is in flight
p3_, base3, log3 = serve_job(2, ["--split", "pipeline", "--split-timeout", "3", "--ctx", "16384"])
long_body = {"prompt": "The history of the city", "max_tokens": 16000, "temperature": 0, "ignore_eos": True}
box = []
th = threading.Thread(target=lambda: box.append(curl(base3 + "/v1/completions", long_body, timeout=60)))
th.start()
time.sleep(0.5)
t0 = time.time()
os.kill(int(open(pidfile).read()), signal.SIGKILL)
th.join(90)
late = curl(base3 + "/v1/completions", body, timeout=60)
try:
    rc = p3_.wait(timeout=30)
except subprocess.TimeoutExpired:
    rc = None
    p3_.kill()
got = box[0] if box else None
t.ok(got is not None and (got.status == 0 or (got.status == 503 and "rank" in got.body)) and
     (late.status == 0 or (late.status == 503 and "rank" in late.body)),
     "a killed rank: the request in flight and a later one get 503 naming the rank failure or a closed connection",
     f"{got and got.status} {got and got.body[:300]} / {late.status} {late.body[:300]}")
t.ok(rc not in (None, 0), f"a killed rank: the server's job exits with a non-zero status ({rc}, "
     f"{time.time() - t0:.1f} s)", open(log3).read()[-1500:])

shutil.rmtree(tmp, ignore_errors=True)
t.done()
