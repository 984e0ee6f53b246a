#!/usr/bin/python3
"""`nextn serve --slot-save-path DIR`: llama.cpp's slot actions (POST /slots/0?action=save,
restore, erase) with curl as the client. Without the option they answer 501. With it: a saved
slot's file holds the rows the context held, erase empties the context, and after a restore
(also in another server process) the same greedy request returns the same text and reuses the
restored rows (usage.prompt_tokens_details.cached_tokens; the prompt cache is off, so the rows
can only come from the restore). Missing, corrupt and truncated files, file names that would
leave DIR, other slots and unknown actions all get a 400 and the server keeps serving; an
action sent while a generation runs waits for it (the worker runs both, in turn). The servers here
have one slot (--parallel 1); tests/e2e/server_batch.t addresses the slots of a --parallel server."""
import json
import os
import shutil
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "server"))
from serverlib import MODEL, Server, curl, long_context_model, metric, skip_all_unless_ready  # noqa: E402
from tap import NEXTN, ROOT, Tap, scratch  # noqa: E402

skip_all_unless_ready()
t = Tap()



def slot(base, action, body=None, sid="0", raw=None, **kw):
    url = f"{base}/slots/{sid}" + (f"?action={action}" if action is not None else "")
    if body is None and raw is None:
        return curl(url, method="POST", **kw)
    return curl(url, body=body, raw=raw, **kw)


def expect_400(r, name, param=None, code=None):
    e = r.error()
    good = r.status == 400 and isinstance(e.get("message"), str) and e.get("type") == "invalid_request_error" \
        and (param is None or e.get("param") == param) and (code is None or e.get("code") == code)
    t.ok(good, f"{name}: 400" + (f" naming '{param}'" if param else ""), f"status {r.status}, body {r.body[:400]}")
    return e


TMP = scratch(prefix="nextn-slots-")
DIR = os.path.join(TMP, "slots")
os.mkdir(DIR)

CHAT = {"messages": [{"role": "system", "content": "You are terse."},
                     {"role": "user", "content": "Write a short story about a cat."}],
        "max_tokens": 24, "temperature": 0, "seed": 7}
OTHER = {"prompt": "def fibonacci(n):", "max_tokens": 12, "temperature": 0}


def chat(base, **kw):
    r = curl(base + "/v1/chat/completions", body=CHAT, **kw)
    if r.status != 200:
        return None, {}, r
    j = r.json()
    return j["choices"][0]["message"]["content"], j["usage"], r


def cached(u):
    return (u.get("prompt_tokens_details") or {}).get("cached_tokens")


# ---------------------------------------------------------------- off without --slot-save-path
srv = Server("--parallel", "1", "--ctx", "1024")
B = srv.base
for action in ("save", "restore", "erase"):
    r = slot(B, action, {"filename": "x.bin"} if action != "erase" else None)
    e = r.error()
    t.ok(r.status == 501 and e.get("type") == "not_supported_error" and "--slot-save-path" in e.get("message", ""),
         f"{action} without --slot-save-path: 501 naming the option", f"status {r.status}, body {r.body[:300]}")
t.ok(curl(B + "/health").status == 200, "the server still answers")

# GET /slots and GET /props (llama.cpp's shapes): the one slot, its context size, idle, and the
# settings a request without any gets (OpenAI's defaults: temperature 1, top_p 1, ...); the
# model's chat template as tokenizer_config.json has it
r = curl(B + "/slots")
try:
    sl = r.json()
    s0 = sl[0]
    ok = r.status == 200 and len(sl) == 1 and s0["id"] == 0 and s0["n_ctx"] == 1024 and s0["is_processing"] is False
    ok = ok and s0["params"]["temperature"] == 1.0 and s0["params"]["top_p"] == 1.0 and s0["params"]["top_k"] == 0
    ok = ok and s0["speculative"] is True and s0["params"]["speculative.draft"] == "auto"
except (ValueError, KeyError, IndexError, TypeError):
    ok = False
t.ok(ok, "GET /slots: one idle slot with its n_ctx and default settings", r.body[:400])
r = curl(B + "/props")
try:
    pr = r.json()
    tmpl = json.load(open(os.path.join(MODEL, "tokenizer_config.json"))).get("chat_template", "")
    ok = r.status == 200 and pr["total_slots"] == 1 and pr["default_generation_settings"]["n_ctx"] == 1024
    ok = ok and pr["chat_template"] == tmpl and len(tmpl) > 0 and pr["modalities"] == {"vision": False, "audio": False}
    ok = ok and pr["default_generation_settings"]["params"] == s0["params"]
except (ValueError, KeyError, TypeError, OSError, NameError):
    ok = False
t.ok(ok, "GET /props: total_slots, n_ctx, the chat template, the same default settings", r.body[:400])
r = curl(B + "/props", method="POST")
t.ok(r.status == 405 and "GET" in r.headers.get("allow", ""), "POST /props: 405 allowing GET", f"status {r.status}")
r = curl(B + "/slots", method="DELETE")
t.ok(r.status == 405, "DELETE /slots: 405", f"status {r.status}")
srv.stop()

srv = Server("--parallel", "1", "--ctx", "512", "--draft", "0")
r = curl(srv.base + "/slots")
try:
    s1 = r.json()[0]
    ok = s1["n_ctx"] == 512 and s1["speculative"] is False and s1["params"]["speculative.draft"] == "off"
except (ValueError, KeyError, IndexError, TypeError):
    ok = False
t.ok(ok, "GET /slots follows --ctx and --draft 0", r.body[:300])
srv.stop()

for bad, why in ((os.path.join(TMP, "missing"), "a missing directory"),
                 (os.path.join(TMP, "file"), "a file")):
    if why == "a file":
        open(bad, "w").close()
    p = subprocess.run([NEXTN, "serve", "-m", MODEL, "--port", "0", "--parallel", "1", "--slot-save-path", bad], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    t.ok(p.returncode != 0 and "--slot-save-path" in p.stderr and "listening" not in p.stderr,
         f"--slot-save-path {why}: refused at start-up", p.stderr[-400:])

# ---------------------------------------------------------------- save, erase, restore
srv = Server("--parallel", "1", "--ctx", "1024", "--cache-ram", "0", "--slot-save-path", DIR)
B = srv.base
text0, u0, r = chat(B)
t.ok(text0 is not None and u0.get("prompt_tokens", 0) > 1, "chat completion", r.body[:300])
P = u0.get("prompt_tokens", 0)
t.note(f"greedy chat: {text0!r}, {P} prompt tokens")

r = slot(B, "save", {"filename": "conv.bin"})
sv = r.json() if r.status == 200 else {}
t.ok(r.status == 200 and sv.get("id_slot") == 0 and sv.get("filename") == "conv.bin" and
     isinstance(sv.get("timings", {}).get("save_ms"), (int, float)) and sv["timings"]["save_ms"] >= 0,
     "save: 200 {id_slot, filename, n_saved, n_written, timings.save_ms}", r.body[:300])
N = sv.get("n_saved", 0)
path = os.path.join(DIR, "conv.bin")
t.ok(N >= P, "save: n_saved covers the prompt and the answer", f"n_saved {N}, prompt {P}")
size = os.path.getsize(path) if os.path.exists(path) else None
t.ok(size is not None and sv.get("n_written") == size, "save: the file exists and n_written is its size",
     f"{sv} vs {size}")
t.ok(sorted(os.listdir(DIR)) == ["conv.bin"], "save: no temporary file left behind", os.listdir(DIR))

r = slot(B, "erase")
t.ok(r.status == 200 and r.json() == {"id_slot": 0, "n_erased": N}, "erase: n_erased is the rows held", r.body)
r = slot(B, "erase")
t.ok(r.status == 200 and r.json().get("n_erased") == 0, "erase again: nothing left", r.body)
text, u, _ = chat(B)
t.ok(text == text0 and cached(u) == 0, "after erase: same text, no cached prompt tokens", u)

r = slot(B, "erase")
r = slot(B, "restore", {"filename": "conv.bin"})
rs = r.json() if r.status == 200 else {}
t.ok(r.status == 200 and rs.get("id_slot") == 0 and rs.get("filename") == "conv.bin" and
     rs.get("n_read") == sv.get("n_written") and isinstance(rs.get("timings", {}).get("restore_ms"), (int, float)),
     "restore: 200 {id_slot, filename, n_restored, n_read, timings.restore_ms}", r.body[:300])
t.ok(rs.get("n_restored") == N, "restore: n_restored equals n_saved", f"{rs.get('n_restored')} vs {N}")
text, u, _ = chat(B)
t.ok(text == text0, "after restore: the same text", f"{text!r} vs {text0!r}")
t.ok(cached(u) == P - 1, "after restore: the restored rows are reused (cached_tokens = prompt - 1)",
     f"cached {cached(u)}, prompt {P}")

# a restore over a context holding another sequence replaces it
r = curl(B + "/v1/completions", body=OTHER)
t.ok(r.status == 200, "another request replaces the context's rows", r.body[:200])
r = slot(B, "restore", {"filename": "conv.bin"})
t.ok(r.status == 200 and r.json().get("n_restored") == N, "restore over other rows", r.body[:300])
text, u, _ = chat(B)
t.ok(text == text0 and cached(u) == P - 1, "and the chat reuses the restored rows again", u)

t.ok(metric(B, 'nextn_slot_actions_total{action="save"}') == 1 and
     metric(B, 'nextn_slot_actions_total{action="restore"}') == 2 and
     metric(B, 'nextn_slot_actions_total{action="erase"}') == 3,
     "metrics count the slot actions")
t.ok(metric(B, "nextn_prompt_cache_restores_total") == 0, "the prompt cache (off) restored nothing")

# ---------------------------------------------------------------- bad files
r = slot(B, "restore", {"filename": "nothere.bin"})
e = expect_400(r, "restore of a missing file", "filename")
t.ok("nothere.bin" in e.get("message", "") and DIR not in e.get("message", ""),
     "the error names the file, not the server's directory", e.get("message"))
with open(os.path.join(DIR, "bad.bin"), "wb") as f:
    f.write(os.urandom(4096))
expect_400(slot(B, "restore", {"filename": "bad.bin"}), "restore of a file of random bytes", "filename")
blob = open(path, "rb").read()
with open(os.path.join(DIR, "short.bin"), "wb") as f:
    f.write(blob[:len(blob) // 2])
e = expect_400(slot(B, "restore", {"filename": "short.bin"}), "restore of a truncated file", "filename")
t.ok("truncated" in e.get("message", ""), "the error says truncated", e.get("message"))
flipped = bytearray(blob)
flipped[len(blob) - 100] ^= 0x40
with open(os.path.join(DIR, "flip.bin"), "wb") as f:
    f.write(flipped)
expect_400(slot(B, "restore", {"filename": "flip.bin"}), "restore of a file with a flipped bit", "filename")
os.mkdir(os.path.join(DIR, "adir"))
expect_400(slot(B, "restore", {"filename": "adir"}), "restore of a directory", "filename")
expect_400(slot(B, "save", {"filename": "adir"}), "save over a directory", "filename")
text, u, _ = chat(B)
t.ok(text == text0 and cached(u) == P - 1,
     "after the failed restores: the context is as it was and the server answers", u)

# ---------------------------------------------------------------- hostile requests
before_tmp = sorted(os.listdir(TMP))
before_dir = sorted(os.listdir(DIR))
names = ["../x", "a/b", "/etc/passwd", ".hidden", "", ".", "..", "a\\b", "x" * 256, "a\x01b", "a\x7fb",
         "a\u0085b", " lead", "trail ", "trail.", "a..b", "a:b", "a\u2215b", "a\uff0eb"]
for action in ("save", "restore"):
    for n in names:
        expect_400(slot(B, action, {"filename": n}), f"{action} filename {n[:20]!r}", "filename", "invalid_filename")
expect_400(slot(B, "save", raw='{"filename": "a\\u0000b"}'), "filename with a NUL", "filename", "invalid_filename")
expect_400(slot(B, "save", {"filename": "y" * 240}), "save filename too long for its temporary file", "filename")
t.ok(sorted(os.listdir(TMP)) == before_tmp and sorted(os.listdir(DIR)) == before_dir,
     "no file created, inside DIR or out of it", f"{os.listdir(TMP)} {os.listdir(DIR)}")
expect_400(slot(B, "save", {}), "filename missing", "filename")
expect_400(slot(B, "save", {"filename": 42}), "filename not a string", "filename")
expect_400(slot(B, "restore", {"filename": None}), "filename null", "filename")
expect_400(slot(B, "save", raw="{not json"), "body not JSON")
expect_400(slot(B, "save", raw='["conv.bin"]'), "body not an object")
expect_400(slot(B, "restore", raw=""), "restore without a body")
expect_400(slot(B, "save", {"filename": "x.bin"}, sid="1"), "/slots/1", "id_slot")
expect_400(slot(B, "erase", sid="abc"), "/slots/abc", "id_slot")
expect_400(slot(B, "erase", sid="-1"), "/slots/-1", "id_slot")
expect_400(slot(B, "erase", sid=""), "/slots/", "id_slot")
expect_400(slot(B, "erase", sid="99999999999999999999"), "/slots/99999999999999999999", "id_slot")
e = expect_400(slot(B, "zap", {"filename": "x.bin"}), "unknown action", "action")
t.ok("zap" in e.get("message", ""), "the error names the action", e.get("message"))
expect_400(slot(B, None, {"filename": "x.bin"}), "no action", "action")
r = curl(B + "/slots/0/x?action=erase", method="POST")
t.ok(r.status == 404, "/slots/0/x: 404", r.status)
r = curl(B + "/slots/0?action=save", method="GET")
t.ok(r.status == 405 and r.headers.get("allow") == "POST", "GET /slots/0: 405, Allow: POST", r.headers)
t.ok(sorted(os.listdir(DIR)) == before_dir, "still no new file")
text, u, _ = chat(B)
t.ok(text == text0 and srv.alive(), "the server serves after the hostile requests")

# ---------------------------------------------------------------- serialised with generations
# erase and restore hammering the worker while generations run: every output is the greedy one
LONG = {"prompt": "Once upon a time", "max_tokens": 600, "temperature": 0, "ignore_eos": True}
ref_text = curl(B + "/v1/completions", body=LONG).json()["choices"][0]["text"]
stop = threading.Event()
codes = []


def hammer():
    i = 0
    while not stop.is_set():
        rr = slot(B, "erase") if i % 2 else slot(B, "restore", {"filename": "conv.bin"})
        codes.append(rr.status)
        i += 1


h = threading.Thread(target=hammer)
h.start()
texts = [curl(B + "/v1/completions", body=LONG).json()["choices"][0]["text"] for _ in range(4)]
stop.set()
h.join()
t.ok(all(x == ref_text for x in texts), "generations interleaved with erase/restore keep their text",
     [x[:40] for x in texts])
t.ok(len(codes) > 0 and all(c == 200 for c in codes), f"{len(codes)} interleaved slot actions: all 200", codes[:20])
text, u, _ = chat(B)
t.ok(text == text0, "and the chat after them is unchanged", text)
rc = srv.stop()
t.ok(rc == 0, "SIGTERM: clean exit", rc)

# A save sent while a long generation runs (a long-context view of the model, so the generation
# lasts seconds on any machine) waits for it: it saves the finished sequence, every row.
srv = Server("--parallel", "1", "-m", long_context_model(), "--ctx", "2048", "--cache-ram", "0", "--slot-save-path", DIR)
B = srv.base
SLOW = {"prompt": "Once upon a time", "max_tokens": 2000, "temperature": 0, "ignore_eos": True}
out = {}
th = threading.Thread(target=lambda: out.setdefault("r", curl(B + "/v1/completions", body=SLOW)))
th.start()
deadline, running = time.time() + 60, False
while time.time() < deadline and not running and th.is_alive():
    running = curl(B + "/health").json().get("active") == 1
r = slot(B, "save", {"filename": "during.bin"})
th.join()
gen = out["r"].json() if out["r"].status == 200 else {}
rows = gen.get("usage", {}).get("prompt_tokens", 0) + gen.get("usage", {}).get("completion_tokens", 0) - 1
t.ok(running and out["r"].status == 200, "a long generation runs", out["r"].body[:200])
t.ok(r.status == 200 and r.json().get("n_saved") == rows,
     "a save sent during it waits for it and saves the finished sequence", f"{r.body[:200]}, want n_saved {rows}")
r = slot(B, "restore", {"filename": "during.bin"})
t.ok(r.status == 200 and r.json().get("n_restored") == rows, "and restores it", r.body[:200])
srv.stop()

# ---------------------------------------------------------------- another process restores
# (with the prompt cache on, as by default: it must not undo the restore)
srv = Server("--parallel", "1", "--ctx", "1024", "--slot-save-path", DIR + "/")
B = srv.base
r = slot(B, "restore", {"filename": "conv.bin"})
t.ok(r.status == 200 and r.json().get("n_restored") == N, "a new server restores the saved slot", r.body[:300])
text, u, _ = chat(B)
t.ok(text == text0 and cached(u) == P - 1, "and its chat reuses the rows: same text, cached prompt tokens", u)
t.ok(metric(B, "nextn_prompt_cache_restores_total") == 0, "the rows came from the restore, not the prompt cache")
# erase means gone: the conversation's rows, put into the prompt cache when another request
# replaced them, do not come back either
r = curl(B + "/v1/completions", body=OTHER)
t.ok(r.status == 200 and metric(B, "nextn_prompt_cache_entries") >= 1, "another request: the chat's rows go to the cache",
     r.body[:200])
t.ok(slot(B, "erase").status == 200, "erase")
t.ok(metric(B, "nextn_prompt_cache_entries") == 0, "erase empties the prompt cache too")
text, u, _ = chat(B)
t.ok(text == text0 and cached(u) == 0, "after erase the chat prefills from scratch: no cached prompt tokens", u)
# a FIFO (or any special file) named as a slot file: a 400 at once, not a worker blocked in open()
os.mkfifo(os.path.join(DIR, "pipe.bin"))
r = slot(B, "restore", {"filename": "pipe.bin"}, timeout=60)
e = expect_400(r, "restore of a FIFO", "filename")
t.ok("not a regular file" in e.get("message", ""), "and the message says why", e)
t.ok(curl(B + "/health", timeout=30).status == 200, "the server still answers")
os.unlink(os.path.join(DIR, "pipe.bin"))
srv.stop()

# ---------------------------------------------------------------- save quota
# the directory's regular files plus the new file must fit --slot-save-quota; GET /slots reports it
QDIR = os.path.join(TMP, "quota")
os.mkdir(QDIR)
with open(os.path.join(QDIR, "other"), "wb") as f:
    f.write(b"x" * (1 << 20))
srv = Server("--parallel", "1", "--ctx", "1024", "--slot-save-path", QDIR, "--slot-save-quota", "2")
B = srv.base
sl = curl(B + "/slots").json()[0]
t.ok(sl.get("save_quota") == {"used_bytes": 1 << 20, "limit_bytes": 2 << 20}, "GET /slots: save_quota used and limit",
     sl.get("save_quota"))
text, u, _ = chat(B)
r = slot(B, "save", {"filename": "a.bin"})
t.ok(r.status == 200, "a save within the quota", r.body[:200])
used = sum(os.path.getsize(os.path.join(QDIR, n)) for n in os.listdir(QDIR))
t.ok(curl(B + "/slots").json()[0]["save_quota"]["used_bytes"] == used, "used_bytes follows the directory", used)
# leave less room than one more file of that size
S = os.path.getsize(os.path.join(QDIR, "a.bin"))
with open(os.path.join(QDIR, "other"), "wb") as f:
    f.write(b"x" * ((2 << 20) - S - S // 2))
r = slot(B, "save", {"filename": "b.bin"})
e = r.error()
t.ok(r.status == 400 and e.get("code") == "slot_save_failed" and "slot save quota exceeded" in e.get("message", "")
     and "--slot-save-quota" in e.get("message", ""), "a save past the quota: a 400 naming the quota", r.body[:300])
t.ok(not os.path.exists(os.path.join(QDIR, "b.bin")) and sorted(os.listdir(QDIR)) == ["a.bin", "other"],
     "nothing written", os.listdir(QDIR))
srv.stop()
srv = Server("--parallel", "1", "--ctx", "1024", "--slot-save-path", QDIR)
q = curl(srv.base + "/slots").json()[0].get("save_quota", {})
t.ok(q.get("limit_bytes") == 4096 << 20, "the default quota: 4096 MiB", q)
srv.stop()

# ---------------------------------------------------------------- authentication
srv = Server("--parallel", "1", "--api-key", "sekrit", "--slot-save-path", DIR)
B = srv.base
r = slot(B, "erase")
t.ok(r.status == 401, "slot actions need the API key", r.status)
r = slot(B, "restore", {"filename": "conv.bin"}, headers=["Authorization: Bearer sekrit"])
t.ok(r.status == 200, "with the key: 200", r.body[:200])
srv.stop()

shutil.rmtree(TMP, ignore_errors=True)
t.done()
