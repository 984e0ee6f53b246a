#!/usr/bin/python3
"""The recurrent states of the Gated-DeltaNet hybrids outside one generation: on a random qwen3_5_moe
checkpoint (tests/ref/make_random_qwen35.py), `nextn run --prompt-cache` saves the prompt's rows with
the states after its last row but one and a second run of the same prompt, and of a longer one,
reuses them and prints what a fresh run prints (greedy and seeded sampling, AR and MTP); a prompt
that shares only part of the saved rows (states exist after the saved row only) starts over and
is still right; a state file whose recurrent part is cut or changed is refused by name and the run
goes on from an empty context."""
import os
import re
import shutil
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tap import PY, Tap, nextn, run, scratch  # noqa: E402

t = Tap()
tmp = scratch(prefix="nextn-state-qwen35-")
model = os.path.join(tmp, "m")
run([PY, "tests/ref/make_random_qwen35.py", "--family", "qwen3_5_moe", "--layout", "hf", "--agree", "0.05",
     "--seed", "7", "--out", model])
prompt = [5, 17, 33, 101, 7, 250, 9, 11, 13, 15, 17, 19, 21, 40, 41, 42, 43, 44]
ids = ",".join(map(str, prompt))


def gen(pids, pc=None, *extra):
    args = ["run", "-m", model, "--prompt-tokens", pids, "-n", "24", "--print-ids", "--ignore-eos", "--act-bits", 16,
            *extra]
    if pc:
        args += ["--prompt-cache", pc]
    r = nextn(*args)
    m = re.search(r"\((\d+) cached\)", r.stderr)
    return r.stdout.split(), int(m.group(1)) if m else 0, r.stderr


for label, extra in (("greedy AR", ["--draft", "0"]), ("greedy MTP k=3", ["--draft", "3"]),
                     ("sampled MTP k=2", ["--temp", "0.9", "--seed", "11", "--draft", "2"])):
    pc = os.path.join(tmp, "pc-" + label.replace(" ", "_"))
    fresh = gen(ids, None, *extra)[0]
    first = gen(ids, pc, *extra)
    again = gen(ids, pc, *extra)
    t.ok(first[0] == fresh and again[0] == fresh, f"{label}: a run from the state file prints a fresh run's tokens",
         f"fresh {fresh}\nagain {again[0]}")
    t.ok(again[1] == len(prompt) - 1, f"{label}: the second run keeps the prompt's rows but the last "
         f"({again[1]} of {len(prompt)})", again[2])
    longer = ids + ",60,61,62"
    t.ok(gen(longer, pc, "--prompt-cache-ro", *extra)[:2] == (gen(longer, None, *extra)[0], len(prompt) - 1),
         f"{label}: a longer prompt reuses the saved rows and prints a fresh run's tokens")

# a prompt sharing only part of the saved rows: the states exist after the saved row alone
pc = os.path.join(tmp, "pc-greedy_AR")
part = ",".join(map(str, prompt[:10] + [300, 301, 302]))
got, cached, err = gen(part, pc, "--prompt-cache-ro")
t.ok(got == gen(part)[0] and cached == 0, f"a prompt sharing 10 of the saved rows starts over ({cached} cached) "
     "and prints a fresh run's tokens", err)

# damaged recurrent part: the payload's last bytes are the DeltaNet states
with open(pc, "rb") as f:
    blob = bytearray(f.read())
for what, data in (("cut", blob[:-100]), ("changed", blob[:-8] + bytes(8))):
    bad = os.path.join(tmp, "bad-" + what)
    with open(bad, "wb") as f:
        f.write(data)
    r = nextn("run", "-m", model, "--prompt-tokens", ids, "-n", "4", "--print-ids", "--prompt-cache", bad,
              "--prompt-cache-ro", check=False)
    t.ok(r.returncode == 0 and re.search(r"truncated|checksum", r.stderr) and "empty context" in r.stderr,
         f"a state file with its recurrent part {what} is refused by name, the run starts empty", r.stderr)

shutil.rmtree(tmp, ignore_errors=True)
t.done()
