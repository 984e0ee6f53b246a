#!/usr/bin/python3
"""Bigger than memory (docs/design.md, "Bigger than memory").

Loading reads headers only: after `nextn inspect` the weight file is still out of the page cache
(mincore on a mapping of it) and the process's peak RSS is a small part of the weights, while
`nextn run` on the same model (which fits in memory) prefaults it all: the control that shows the
check can fail.

Streaming routed experts: with --max-memory at the smallest cap the plan accepts (the resident
weights plus one layer's top-k experts: almost every lookup misses) and at a middle one, the
logits of a prompt are the same bits as unconstrained, and greedy output, plain and with MTP
drafts, is the same tokens, on random checkpoints with 4-bit MLX experts and with bf16 experts;
--stats shows the misses and the bytes read. inspect --memory prints the plan; bad sizes are
named errors."""
import ctypes
import json
import os
import re
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tap import NEXTN, PY, Tap, nextn, run, scratch  # noqa: E402

t = Tap()
tmp = scratch(prefix="nextn-stream-")

libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]


def cached_fraction(path):
    """Share of the file's pages in the page cache."""
    size = os.path.getsize(path)
    fd = os.open(path, os.O_RDONLY)
    a = libc.mmap(None, size, 1, 1, fd, 0)  # PROT_READ, MAP_SHARED
    os.close(fd)
    pg = os.sysconf("SC_PAGE_SIZE")
    vec = ctypes.create_string_buffer((size + pg - 1) // pg)
    rc = libc.mincore(a, size, vec)
    libc.munmap(a, size)
    assert rc == 0
    return sum(b & 1 for b in vec.raw) / len(vec.raw)


def drop_cache(path):
    fd = os.open(path, os.O_RDONLY)
    os.fsync(fd)  # a file just written is dirty in the cache, and dirty pages are not dropped
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    os.close(fd)


# Peak RSS of one run, measured by a small interpreter that starts it: a process forked from
# this one (numpy loaded) would count this one's pages in its peak.
PEAK = ("import os, subprocess, sys\n"
        "p = subprocess.Popen(sys.argv[1:], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)\n"
        "out = p.stdout.read()\n"
        "_, status, ru = os.wait4(p.pid, 0)\n"
        "print(os.waitstatus_to_exitcode(status), ru.ru_maxrss * 1024)\n"
        "sys.stdout.write(out.decode())\n")


def peak_rss(args):
    """(returncode, stdout, peak RSS in bytes) of one run of the engine."""
    r = run([PY, "-S", "-c", PEAK, NEXTN, *map(str, args)])
    head, _, out = r.stdout.partition("\n")
    rc, rss = map(int, head.split())
    return rc, out, rss


# ---------------------------------------------------------------- loading reads headers only

big = os.path.join(tmp, "big")
run([PY, "tests/ref/make_random_ckpt.py", "--layout", "tencent", "--mtp", "inline", "--hidden", "512",
     "--expert-dim", "512", "--experts", "16", "--seed", "3", "--out", big])
wfile = os.path.join(big, "model.safetensors")
wbytes = os.path.getsize(wfile)
drop_cache(wfile)
t.ok(cached_fraction(wfile) < 0.05, "the weight file starts out of the page cache")
rc, out, rss = peak_rss(["inspect", "-m", big])
frac = cached_fraction(wfile)
t.ok(rc == 0 and "parameters" in out, "inspect describes the model", out)
t.ok(frac < 0.25, f"inspect leaves the weights unread ({frac:.1%} of {wbytes >> 20} MB cached)")
t.ok(rss < 0.4 * wbytes, f"inspect's peak RSS {rss >> 20} MB is well under the weights' {wbytes >> 20} MB")
drop_cache(wfile)
rc, out, rss = peak_rss(["run", "-m", big, "--prompt-tokens", "3,4,5", "-n", "1", "--quiet", "--draft", "0"])
frac = cached_fraction(wfile)
t.ok(rc == 0 and frac > 0.9 and rss > 0.9 * wbytes,
     f"control: run (the model fits in memory) prefaults it: {frac:.1%} cached, peak RSS {rss >> 20} MB")
drop_cache(wfile)
rc, out, rss = peak_rss(["run", "-m", big, "--prompt-tokens", "3,4,5", "-n", "1", "--quiet", "--draft", "0",
                         "--max-memory", str(wbytes // 2)])
t.ok(rc == 0 and rss < 0.75 * wbytes,
     f"run --max-memory {wbytes // 2}: peak RSS {rss >> 20} MB of the weights' {wbytes >> 20} MB")

# ---------------------------------------------------------------- sizes and the plan

for bad in ("0", "-5", "12Q", "1.5G", "", "99999999999T"):
    r = nextn("run", "-m", big, "--prompt-tokens", "3", "-n", "1", "--max-memory", bad, check=False)
    t.ok(r.returncode == 2 and "--max-memory" in r.stderr and "size in bytes" in r.stderr,
         f"--max-memory '{bad}' is refused by name", r.stderr)
r = nextn("inspect", "-m", big, "--memory", "1M", check=False)
m = re.search(r"too small: .* take (\d+) bytes and one layer's top-(\d+) experts \(per expert size\) (\d+) more, (\d+) in all", r.stderr)
t.ok(r.returncode == 1 and m is not None, "a cap below the resident weights is a named error", r.stderr)


def plan(d, cap):
    return json.loads(nextn("inspect", "-m", d, "--json", "--memory", cap).stdout)["residency"]


def min_cap(d):
    r = nextn("inspect", "-m", d, "--memory", "1K", check=False)
    return int(re.search(r"(\d+) in all", r.stderr).group(1))


lo = min_cap(big)
p = plan(big, lo)
info = json.loads(nextn("inspect", "-m", big, "--json").stdout)
t.ok(p["resident_bytes"] + p["routed_expert_bytes"] == info["weight_bytes"] and p["cache_slots"] == info["top_k"]
     and abs(p["expected_hit_rate"] - p["cache_slots"] / p["routed_experts"]) < 1e-3
     and p["disk_bytes_per_token"] > 0, "inspect --memory: the smallest cap holds one layer's top-k experts", str(p))
txt = nextn("inspect", "-m", big, "--memory", lo).stdout
t.ok("stream" in txt and "read per token" in txt, "inspect --memory prints the plan", txt)
p = plan(big, info["weight_bytes"])
t.ok(p["cache_slots"] == 0 and p["disk_bytes_per_token"] == 0, "a cap the weights fit under streams nothing", str(p))

# ---------------------------------------------------------------- streamed = mapped, bit for bit

MODELS = [
    ("mlx-q4", ["--layout", "mlx", "--mtp", "sidecar", "--quant", "4:64", "--mtp-quant", "8:64", "--hidden", "256",
                "--expert-dim", "128", "--inter", "256", "--experts", "8", "--seed", "5"]),
    ("tencent-bf16", ["--layout", "tencent", "--mtp", "inline", "--experts", "8", "--seed", "1"]),
    ("mlx-bf16-sharded", ["--layout", "mlx", "--mtp", "sidecar", "--shards", "3", "--experts", "8", "--seed", "2"]),
]
ids = ",".join(map(str, range(3, 20)))
prompt = "3,14,15,92,65"


def greedy(d, draft, extra=()):
    return nextn("run", "-m", d, "--prompt-tokens", prompt, "-n", 24, "--print-ids", "--ignore-eos", "--draft",
                 draft, "--quiet", *extra).stdout.split()


for name, args in MODELS:
    d = os.path.join(tmp, name)
    run([PY, "tests/ref/make_random_ckpt.py", *args, "--out", d])
    ref = os.path.join(tmp, name + "-ref.npy")
    refm = os.path.join(tmp, name + "-refm.npy")
    nextn("eval", "-m", d, "--tokens", ids, "--logits", ref, "--mtp-logits", refm)
    ar = greedy(d, 0)
    total = json.loads(nextn("inspect", "-m", d, "--json").stdout)["weight_bytes"]
    lo = min_cap(d)
    for cap in (lo, (lo + total) // 2):
        cap_s = str(cap)
        out, outm = os.path.join(tmp, f"{name}-{cap}.npy"), os.path.join(tmp, f"{name}-{cap}m.npy")
        nextn("eval", "-m", d, "--tokens", ids, "--logits", out, "--mtp-logits", outm, "--max-memory", cap_s)
        t.ok(np.array_equal(np.load(out), np.load(ref)) and np.array_equal(np.load(outm), np.load(refm)),
             f"{name}, --max-memory {cap}: trunk and MTP logits of a 17-token prompt are the same bits")
        got = greedy(d, 0, ("--max-memory", cap_s))
        t.ok(got == ar, f"{name}, --max-memory {cap}: greedy AR equals unconstrained", f"{got}\n{ar}")
        for k in ("3", "auto"):
            got = greedy(d, k, ("--max-memory", cap_s))
            t.ok(got == ar, f"{name}, --max-memory {cap}: greedy MTP (draft {k}) equals unconstrained AR",
                 f"{got}\n{ar}")
    st = nextn("run", "-m", d, "--prompt-tokens", prompt, "-n", 16, "--ignore-eos", "--draft", 2, "--stats",
               "--max-memory", lo).stderr
    line = [x for x in st.splitlines() if x.startswith("streamed experts:")]
    m = re.search(r"AR hit rate ([\d.]+), ([\d.]+) MB read per step.*verify hit rate ([\d.]+), ([\d.]+) MB", line[0]) \
        if line else None
    t.ok(m is not None and float(m.group(1)) < 1 and float(m.group(2)) > 0 and float(m.group(3)) < 1
         and float(m.group(4)) > 0, f"{name}: --stats shows misses and bytes read, AR and verify", st)
    st = nextn("run", "-m", d, "--prompt-tokens", prompt, "-n", 4, "--stats").stderr
    t.ok("streamed experts" not in st, f"{name}: nothing streams without a cap", st)

# ---------------------------------------------------------------- how the slots are read

# Slots are read with O_DIRECT where the file system takes it (a descriptor reopened through
# /proc/self/fd), else, and with NX_DIRECT_IO=0, through the page cache; the bits are the same
# either way. strace shows which reads were made: direct ones on the reopened descriptor, in
# whole 4 KB blocks at block offsets.
d = os.path.join(tmp, "mlx-q4")
cap = str(min_cap(d))
wfile = os.path.join(d, "model.safetensors")
try:
    os.close(os.open(wfile, os.O_RDONLY | os.O_DIRECT))
    fs_direct = True
except OSError:
    fs_direct = False


def traced(extra_env):
    log = os.path.join(tmp, "strace.log")
    out = os.path.join(tmp, "traced.npy")
    r = run(["strace", "-f", "-qq", "-e", "trace=openat,pread64", "-o", log, NEXTN, "eval", "-m", d, "--tokens", ids,
             "--logits", out, "--max-memory", cap], env={**os.environ, **extra_env})
    text = open(log).read()
    dfds = set(re.findall(r'openat\(AT_FDCWD, "/proc/self/fd/\d+", O_RDONLY\|O_DIRECT\|O_CLOEXEC\) = (\d+)', text))
    direct = [m for m in re.finditer(r"pread64\((\d+), .*?, (\d+), (\d+)\) = (\d+)", text) if m.group(1) in dfds]
    aligned = all(int(m.group(2)) % 4096 == 0 and int(m.group(3)) % 4096 == 0 for m in direct)
    return np.array_equal(np.load(out), np.load(os.path.join(tmp, "mlx-q4-ref.npy"))), len(dfds), len(direct), aligned


same, n_open, n_direct, aligned = traced({})
t.ok(same and ((fs_direct and n_open >= 1 and n_direct > 0 and aligned) or (not fs_direct and n_direct == 0)),
     f"experts read {'directly' if fs_direct else 'through the page cache'} (the file system "
     f"{'takes' if fs_direct else 'refuses'} O_DIRECT): {n_direct} direct reads on {n_open} descriptors, whole blocks "
     f"{aligned}, logits the same bits {same}")
same, n_open, n_direct, _ = traced({"NX_DIRECT_IO": "0"})
t.ok(same and n_open == 0 and n_direct == 0,
     f"NX_DIRECT_IO=0: through the page cache ({n_direct} direct reads), logits the same bits {same}")

t.done()
