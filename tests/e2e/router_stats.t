#!/usr/bin/python3
"""Router statistics (--router-stats FILE): run and probe count every routed expert choice into
FILE and add to what it holds; inspect --memory N plans with them, read only; bad files are refused
naming the file and the field; the counts never change the output.

Checked against something independent: the counts of a plain run are exactly rows x top-k per MoE
layer (rows = prompt + generated - 1 with --draft 0), and inspect's expected hit rate is recomputed
here from the file and the cache's slot count (each layer's most often routed experts in its share
of the slots, tokens independent).

  NEXTN=build/nextn prove -v tests/e2e/router_stats.t
"""
import json
import os
import shutil
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "server"))
from serverlib import Server, curl  # noqa: E402
from tap import Tap, nextn, scratch  # noqa: E402

t = Tap()
tmp = scratch(prefix="nextn-router-stats-")
F = os.path.join(tmp, "stats.json")
PROMPT = "1,2,3,4,5,6,7"
N = 12

info = json.loads(nextn("inspect", "--json").stdout)
LAYERS, K, DENSE = info["layers"], info["top_k"], info["dense_layers"]


def run(*extra, check=True):
    return nextn("run", "--prompt-tokens", PROMPT, "-n", N, "--ignore-eos", "--print-ids", *extra, check=check)


# ---- a plain run counts exactly its rows
plain = run("--draft", "0").stdout
r = run("--draft", "0", "--router-stats", F)
t.ok(r.stdout == plain, "the output with --router-stats is the output without")
st = json.load(open(F))
t.ok(st.get("format") == "nextn router statistics" and st.get("model_type") == info["family"],
     "the file names its format and the model's family", st)
t.ok(len(st["layers"]) == LAYERS and all(st["layers"][i] is None for i in range(DENSE)),
     f"one entry per layer, null for the {DENSE} dense ones", st["layers"])
rows = len(PROMPT.split(",")) + N - 1
sums = [sum(c) for c in st["layers"][DENSE:]]
t.ok(all(s == rows * K for s in sums), f"each MoE layer counted {rows} rows x top-{K} = {rows * K} choices", sums)
t.ok(all(len(c) == info["experts"] for c in st["layers"][DENSE:]), "one count per routed expert")
t.ok(sum(st["mtp"]) == 0, "no MTP forward without drafts", st["mtp"])

# ---- a second run adds to the file; drafting counts the head's choices too
first = st
run("--draft", "0", "--router-stats", F)
st = json.load(open(F))
t.ok(all(a == 2 * b for x, y in zip(st["layers"][DENSE:], first["layers"][DENSE:]) for a, b in zip(x, y)),
     "the same run again doubles every count")
run("--draft", "2", "--router-stats", F)
st2 = json.load(open(F))
t.ok(sum(st2["mtp"]) > 0 and sum(st2["mtp"]) % K == 0, "drafting counts the MTP layer's choices", st2["mtp"])
t.ok(all(sum(b) > sum(a) for a, b in zip(st["layers"][DENSE:], st2["layers"][DENSE:])), "and the trunk's")

# ---- probe gathers over files
P = os.path.join(tmp, "probe.json")
code = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench", "texts", "code.c")
r = nextn("probe", "--router-stats", P, code)
sp = json.load(open(P))
t.ok(sum(sum(c) for c in sp["layers"][DENSE:]) > 1000 * K, "probe counts its teacher-forced rows")


# ---- inspect plans with them, read only
def expected_hit(stats, slots, n_routed):
    hits = []
    for c in stats["layers"][DENSE:]:
        f = sorted((x / sum(c) for x in c), reverse=True)
        n = slots / n_routed * len(c)  # one pool: every expert has the same size here
        m, i = 0.0, 0
        while n > 0 and i < len(f):
            m += f[i] * min(n, 1.0)
            n -= 1.0
            i += 1
        hits.append(min(m, 1.0))
    return sum(hits) / len(hits)


before = open(P).read()
cap = "12M"
uni = json.loads(nextn("inspect", "--json", "--memory", cap).stdout)["residency"]
rs = json.loads(nextn("inspect", "--json", "--memory", cap, "--router-stats", P).stdout)["residency"]
t.ok(uni["from_router_stats"] is False and rs["from_router_stats"] is True, "inspect says which expectation it gives")
want = expected_hit(sp, rs["cache_slots"], rs["routed_experts"])
t.ok(abs(rs["expected_hit_rate"] - want) < 1e-3,
     f"expected hit rate {rs['expected_hit_rate']:.4f} = {want:.4f} recomputed from the file")
t.ok(rs["expected_hit_rate"] >= uni["expected_hit_rate"] - 1e-9,
     "the most often routed experts hold at least the uniform share")
t.ok(rs["disk_bytes_per_token"] <= uni["disk_bytes_per_token"] + 1, "so a token reads no more from disk")
t.ok(open(P).read() == before, "inspect never writes the file")
text = nextn("inspect", "--memory", cap, "--router-stats", P).stdout
t.ok("(router statistics)" in text, "the text plan says it used the statistics", text)

# ---- a streamed run with statistics gives the same tokens
r = run("--draft", "0", "--max-memory", cap, "--router-stats", P)
t.ok(r.stdout == plain, "streamed experts with statistics: the same tokens")


# ---- serve adds every request's choices at shutdown
S = os.path.join(tmp, "serve.json")
srv = Server("--router-stats", S, "--parallel", "2", "--draft", "0")
replies = [curl(srv.base + "/v1/completions", {"prompt": p, "max_tokens": N, "temperature": 0, "ignore_eos": True})
           for p in ([1, 2, 3, 4, 5, 6, 7], [70, 60, 50, 40, 30, 20, 10])]
t.ok(all(r.status == 200 for r in replies), "two completions served", [r.body[:200] for r in replies])
t.ok(not os.path.exists(S), "nothing written before shutdown")
t.ok(srv.stop() == 0, "the server stops cleanly")
ss = json.load(open(S))
sums = [sum(c) for c in ss["layers"][DENSE:]]
t.ok(all(x == 2 * rows * K for x in sums), f"serve counted both requests' rows (2 x {rows} x {K})", sums)

# ---- bad files are refused by name
def bad(content, field, what):
    B = os.path.join(tmp, "bad.json")
    with open(B, "w") as fh:
        fh.write(content if isinstance(content, str) else json.dumps(content))
    r = run("--draft", "0", "--router-stats", B, check=False)
    t.ok(r.returncode != 0 and B in r.stderr and field in r.stderr, f"refused: {what}", r.stderr[-600:])
    r = nextn("inspect", "--memory", cap, "--router-stats", B, check=False)
    t.ok(r.returncode != 0 and field in r.stderr, f"inspect refuses it too: {what}", r.stderr[-600:])


good = json.load(open(P))
bad("{not json", "not valid JSON", "not JSON")
bad(dict(good, format="something else"), '"format"', "another format")
bad(dict(good, model_type="glm4_moe"), '"model_type"', "another model's")
bad(dict(good, layers=good["layers"][:-1]), '"layers"', "a layer missing")
short = [c[:-1] if c else c for c in good["layers"]]
bad(dict(good, layers=short), f"layers[{DENSE}]", "an expert missing")
neg = [list(c) if c else c for c in good["layers"]]
neg[DENSE + 1][2] = -4
bad(dict(good, layers=neg), f"layers[{DENSE + 1}][2]", "a negative count")
dense_counts = [list(c) if c else c for c in good["layers"]]
dense_counts[0] = [1] * info["experts"]
bad(dict(good, layers=dense_counts), "layers[0]", "counts for a dense layer")

r = run("--draft", "0", "--router-stats", os.path.join(tmp, "no-such-dir", "s.json"), check=False)
t.ok(r.returncode != 0 and "router statistics" in r.stderr, "an unwritable file is an error at the end",
     r.stderr[-400:])

shutil.rmtree(tmp, ignore_errors=True)
t.done()
