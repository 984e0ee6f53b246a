#!/usr/bin/python3
"""One model across several MPI ranks (`mpirun -n R nextn ... --split pipeline|experts`,
docs/multinode.md) on localhost ranks:
  the same token ids as the single process, greedy (--draft auto) and seeded sampling (--draft 2),
  MTP on and off, with 1, 2 and 3 ranks and either split, on the default model and on random
  checkpoints of two more families (DeepSeek-V3: latent attention, expert groups; Qwen3.5: Gated
  DeltaNet layers whose recurrent states a rejected draft takes back), their heads agreeing with
  their trunks so drafts are accepted and verified; each split run reports network traffic (so it
  did run on several ranks) and its verify cycles;
  `nextn serve --split` answering as the single-process server does;
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
bad = curl(base2 + "/v1/completions", body, timeout=60)
t.ok(bad.status == 503 and "no answer within 3 s" in bad.body, "a stopped rank: the server answers 503 naming it",
     f"{bad.status} {bad.body[:500]}")
os.kill(int(open(pidfile).read()), signal.SIGKILL)
p2.send_signal(signal.SIGTERM)
try:
    p2.wait(timeout=30)
except subprocess.TimeoutExpired:
    p2.kill()
t.ok(p2.poll() is not None, "the job ends after the failure")

shutil.rmtree(tmp, ignore_errors=True)
t.done()
