#!/usr/bin/python3
"""`nextn serve` on a checkpoint changed under it. The weights are mapped from the files, so a
checkpoint must be replaced by rename: the server keeps the inode it loaded, and requests go on
with the loaded weights. A file overwritten or truncated in place (reading past a truncation
would kill the process with SIGBUS) fails each generation with a 500 naming the file and the
rule, while the process stays up and the requests that need no forward pass (health, models,
tokenize) are still served. Truncated in place while a generation reads it, the process says so
and exits with EX_TEMPFAIL (75) for a supervisor to restart, rather than dying without a word."""
import http.client
import json
import os
import shutil
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "server"))
from serverlib import MODEL, Server, curl, skip_all_unless_ready  # noqa: E402
from tap import Tap, scratch  # noqa: E402

skip_all_unless_ready()
t = Tap()

TMP = scratch(prefix="nextn-model-files-")
DIR = os.path.join(TMP, "model")
shutil.copytree(MODEL, DIR)
WEIGHTS = os.path.join(DIR, "model.safetensors")
REQ = {"prompt": "Once upon a time", "max_tokens": 8, "temperature": 0}

srv = Server("-m", DIR, "--ctx", "512")
B = srv.base
r = curl(B + "/v1/completions", body=REQ)
t.ok(r.status == 200, "a completion", r.body[:200])
text0 = r.json()["choices"][0]["text"] if r.status == 200 else None

# replaced by rename: the loaded weights stay mapped, the answer is the same
shutil.copyfile(os.path.join(MODEL, "model.safetensors"), WEIGHTS + ".new")
os.rename(WEIGHTS + ".new", WEIGHTS)
r = curl(B + "/v1/completions", body=REQ)
t.ok(r.status == 200 and r.json()["choices"][0]["text"] == text0, "after a replacement by rename: the same answer",
     r.body[:200])
srv.stop()

# truncated in place
srv = Server("-m", DIR, "--ctx", "512")
B = srv.base
os.truncate(WEIGHTS, 4096)
for path, body in (("/v1/completions", REQ),
                   ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4})):
    r = curl(B + path, body=body)
    msg = r.error().get("message", "")
    t.ok(r.status == 500 and "model.safetensors changed on disk since load" in msg and "rename" in msg,
         f"{path} after the file was truncated in place: a 500 naming the file and the rule", r.body[:400])
t.ok(srv.alive(), "the process is still up (no SIGBUS)")
t.ok(curl(B + "/health").status == 200, "GET /health still answers")
t.ok(curl(B + "/v1/models").status == 200, "GET /v1/models still answers")
r = curl(B + "/tokenize", body={"content": "hello"})
t.ok(r.status == 200, "POST /tokenize still answers", r.body[:200])
t.ok(srv.stop() == 0, "and it exits cleanly")

# truncated in place in the middle of a generation (a copy allowing long generations, so the
# generation is still running when the file shrinks)
shutil.rmtree(DIR)
shutil.copytree(MODEL, DIR)
cfg = json.load(open(os.path.join(DIR, "config.json")))
cfg["max_position_embeddings"] = 16384
json.dump(cfg, open(os.path.join(DIR, "config.json"), "w"))
srv = Server("-m", DIR, "--ctx", "16384", "--draft", "0")
conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=60)
conn.request("POST", "/v1/completions", json.dumps({"prompt": "Once upon a time", "max_tokens": 16000,
                                                    "temperature": 0, "stream": True, "ignore_eos": True}),
             {"Content-Type": "application/json"})
resp = conn.getresponse()
first = resp.readline()
os.truncate(WEIGHTS, 4096)
deadline = time.time() + 60
while srv.alive() and time.time() < deadline:
    time.sleep(0.05)
code = srv.proc.poll()
t.ok(first.startswith(b"data:") and code == 75, "truncated during a generation: the process exits with status 75",
     f"first line {first[:80]!r}, status {code}")
t.ok("truncated or rewritten in place while the weights were being read" in srv.output(),
     "and says why on stderr", srv.output()[-400:])
srv.stop()
shutil.rmtree(TMP, ignore_errors=True)
t.done()
