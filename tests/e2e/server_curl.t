#!/usr/bin/python3
"""`nextn serve` end to end with curl as the client: health, models, chat and completions
(streaming and not, the stream concatenating to the non-streaming text), stop strings across
token boundaries, logprobs, seeds, per-request speculative settings and their usage numbers,
/metrics, and the error matrix (400 malformed/wrong type/out of range/unknown model, 401 without
the key, 404, 405, 413, 503 with a full queue, 504 past --timeout)."""
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "server"))
from serverlib import Server, curl, long_context_model, metric, skip_all_unless_ready  # noqa: E402
from tap import NEXTN, Tap, nextn  # noqa: E402

skip_all_unless_ready()
t = Tap()



def expect_error(base, path, body, status, param=None, name=None, **kw):
    r = curl(base + path, body=body if not isinstance(body, str) else None,
             raw=body if isinstance(body, str) else None, **kw)
    e = r.error()
    good = r.status == status and isinstance(e.get("message"), str) and "type" in e and \
        "param" in e and "code" in e and (param is None or e.get("param") == param)
    t.ok(good, f"{name or path}: {status}" + (f" naming '{param}'" if param else ""),
         f"status {r.status}, body {r.body[:400]}")
    return r


def stream_text(r, kind):
    """Concatenated text of an SSE reply plus (finish_reason, usage, ok-shape)."""
    text, finish, usage, shape_ok = "", None, None, True
    events = r.events()
    shape_ok &= bool(events) and events[-1] == "[DONE]"
    for ev in events[:-1]:
        c = json.loads(ev)
        if "error" in c:
            return text, "error", c, False
        shape_ok &= c.get("object") == ("chat.completion.chunk" if kind == "chat" else "text_completion")
        if c.get("usage"):
            usage = c["usage"]
        for ch in c.get("choices", []):
            if kind == "chat":
                text += ch["delta"].get("content") or ""
            else:
                text += ch.get("text") or ""
            if ch.get("finish_reason"):
                finish = ch["finish_reason"]
    return text, finish, usage, shape_ok


srv = Server("--ctx", "1024")
B = srv.base

# ---------------------------------------------------------------- basics
r = curl(B + "/health")
t.ok(r.status == 200 and r.json().get("status") == "ok", "GET /health", r.body)
r = curl(B + "/v1/models")
models = r.json() if r.status == 200 else {}
t.ok(r.status == 200 and models.get("object") == "list" and len(models.get("data", [])) == 1,
     "GET /v1/models lists one model", r.body)
MODEL_ID = models["data"][0]["id"]
t.ok(models["data"][0].get("object") == "model", "model object shape")

CHAT = {"model": MODEL_ID, "messages": [{"role": "system", "content": "You are terse."},
                                        {"role": "user", "content": "Write a short story about a cat."}],
        "max_tokens": 24, "temperature": 0}
r = curl(B + "/v1/chat/completions", body=CHAT)
chat = r.json() if r.status == 200 else {}
t.ok(r.status == 200 and r.headers.get("content-type", "").startswith("application/json"),
     "chat completion: 200 JSON", r.body[:400])
ch = (chat.get("choices") or [{}])[0]
t.ok(chat.get("object") == "chat.completion" and chat.get("id", "").startswith("chatcmpl-") and
     isinstance(chat.get("created"), int) and chat.get("model") == MODEL_ID,
     "chat completion envelope", chat)
t.ok(ch.get("message", {}).get("role") == "assistant" and isinstance(ch["message"].get("content"), str)
     and ch.get("finish_reason") in ("stop", "length") and ch.get("index") == 0,
     "chat choice shape", ch)
u = chat.get("usage", {})
t.ok(u.get("prompt_tokens", 0) > 0 and 0 < u.get("completion_tokens", 0) <= 24 and
     u.get("total_tokens") == u["prompt_tokens"] + u["completion_tokens"], "chat usage tokens", u)
sp = u.get("speculative", {})
t.ok(all(k in sp for k in ("drafts", "drafted", "accepted", "acceptance_rate")) and sp.get("draft") == "auto",
     "usage carries the request's speculative numbers (MTP on by default)", sp)
CHAT_TEXT = ch.get("message", {}).get("content", "")
t.note(f"greedy chat: {CHAT_TEXT!r}")

r = curl(B + "/v1/chat/completions", body=dict(CHAT, stream=True))
text, finish, usage, shape = stream_text(r, "chat")
t.ok(r.status == 200 and r.headers.get("content-type", "").startswith("text/event-stream"),
     "streaming chat: 200 text/event-stream", r.headers)
t.ok(shape and finish == ch.get("finish_reason"), "streaming chat: chunk shapes, finish_reason, [DONE]",
     r.body[:600])
t.ok(text == CHAT_TEXT, "streaming chat concatenates to the non-streaming text",
     f"stream {text!r}\nplain {CHAT_TEXT!r}")
first = json.loads(r.events()[0])
t.ok(first["choices"][0]["delta"].get("role") == "assistant", "first chunk carries the role", first)
t.ok(usage is None and "usage" not in first, "no usage without stream_options", first)

r = curl(B + "/v1/chat/completions", body=dict(CHAT, stream=True, stream_options={"include_usage": True}))
evs = r.events()
last = json.loads(evs[-2]) if len(evs) >= 2 else {}
t.ok(last.get("choices") == [] and last.get("usage", {}).get("completion_tokens") == u.get("completion_tokens")
     and all("usage" in json.loads(e) for e in evs[:-1]),
     "include_usage: usage: null on every chunk, then a usage chunk before [DONE]", evs[-3:])

COMP = {"prompt": "The quick brown fox", "max_tokens": 20, "temperature": 0}
r = curl(B + "/v1/completions", body=COMP)
comp = r.json() if r.status == 200 else {}
cc = (comp.get("choices") or [{}])[0]
t.ok(r.status == 200 and comp.get("object") == "text_completion" and isinstance(cc.get("text"), str)
     and cc.get("finish_reason") in ("stop", "length"), "completion: shape", r.body[:400])
COMP_TEXT = cc.get("text", "")
r = curl(B + "/v1/completions", body=dict(COMP, stream=True))
text, finish, _, shape = stream_text(r, "completion")
t.ok(shape and text == COMP_TEXT and finish == cc.get("finish_reason"),
     "streaming completion equals the non-streaming one", f"{text!r} vs {COMP_TEXT!r}")

r = curl(B + "/v1/completions", body={"prompt": ["One", "Two three"], "max_tokens": 5, "temperature": 0})
choices = r.json().get("choices", []) if r.status == 200 else []
t.ok(len(choices) == 2 and [c["index"] for c in choices] == [0, 1], "completions: a list of prompts", r.body[:300])

r = curl(B + "/v1/completions", body={"prompt": "Hello", "temperature": 0})
t.ok(r.status == 200 and r.json()["usage"]["completion_tokens"] <= 16, "completions default to 16 tokens")

# ---------------------------------------------------------------- stop strings
LONG = {"prompt": "Once upon a time", "max_tokens": 40, "temperature": 0, "ignore_eos": True}
base_text = curl(B + "/v1/completions", body=LONG).json()["choices"][0]["text"]
t.note(f"greedy completion: {base_text!r}")
# a stop string that straddles token boundaries somewhere in the middle of the output
mid = len(base_text) // 3
stop = base_text[mid:mid + 5]
want = base_text[:base_text.find(stop)]
r = curl(B + "/v1/completions", body=dict(LONG, stop=[stop, "\x01never"]))
c = r.json()["choices"][0]
t.ok(c["text"] == want and c["finish_reason"] == "stop", f"stop string {stop!r} ends the text before it",
     f"got {c['text']!r}, want {want!r}")
r = curl(B + "/v1/completions", body=dict(LONG, stop=stop, stream=True))
text, finish, _, shape = stream_text(r, "completion")
t.ok(shape and text == want and finish == "stop", "streaming stop string: held back, never emitted",
     f"got {text!r}, want {want!r}")
r = curl(B + "/v1/completions", body=dict(LONG, stop=["\x01not there"], stream=True))
text, finish, _, _ = stream_text(r, "completion")
t.ok(text == base_text and finish == "length", "a stop string that never matches changes nothing",
     f"{text!r}")

# ---------------------------------------------------------------- logprobs, seeds, speculative
# A fixed draft length: with "auto" the number of drafts follows measured timings, and at
# temperature > 0 a different draft length draws a different (equally distributed) sample.
LP = dict(CHAT, temperature=0.8, seed=11, logprobs=True, top_logprobs=3, max_tokens=12,
          speculative={"draft": 2})
r = curl(B + "/v1/chat/completions", body=LP)
lpj = r.json()
content = lpj["choices"][0]["logprobs"]["content"] if r.status == 200 else []
good = len(content) > 0
joined = b""
for item in content:
    tops = item["top_logprobs"]
    good &= item["logprob"] <= 1e-6 and 1 <= len(tops) <= 3
    good &= all(tops[i]["logprob"] >= tops[i + 1]["logprob"] for i in range(len(tops) - 1))
    good &= item["logprob"] <= tops[0]["logprob"] + 1e-5
    joined += bytes(item["bytes"])
t.ok(good, "chat logprobs: sorted top_logprobs from the sampled distribution", content[:3])
t.ok(lpj["choices"][0]["finish_reason"] != "length" or
     joined.decode("utf-8", "replace") == lpj["choices"][0]["message"]["content"],
     "logprob token bytes spell the content", f"{joined!r}")
again = curl(B + "/v1/chat/completions", body=LP).json()
t.ok(again["choices"][0]["message"]["content"] == lpj["choices"][0]["message"]["content"],
     "same seed and draft length, same sampled text")
r = curl(B + "/v1/completions", body=dict(COMP, logprobs=2, max_tokens=6))
lp = r.json()["choices"][0]["logprobs"] if r.status == 200 else {}
t.ok(len(lp.get("tokens", [])) == len(lp.get("token_logprobs", [])) == len(lp.get("top_logprobs", []))
     == len(lp.get("text_offset", [])) > 0, "completions logprobs shape", lp)

r = curl(B + "/v1/completions", body=dict(LONG, speculative={"draft": 0}))
s0 = r.json()["usage"]["speculative"]
t.ok(s0["drafted"] == 0 and s0["draft"] == 0, "speculative.draft 0: plain decoding, nothing drafted", s0)
t.ok(r.json()["choices"][0]["text"] == base_text, "greedy text is the same with and without drafting")
r = curl(B + "/v1/completions", body=dict(LONG, speculative={"draft": 2, "verify": "match"}))
s2 = r.json()["usage"]["speculative"]
t.ok(s2["drafted"] > 0 and s2["verify"] == "match" and 0 <= s2["accepted"] <= s2["drafted"] and
     abs(s2["acceptance_rate"] - s2["accepted"] / s2["drafted"]) < 1e-9,
     "speculative.draft 2 drafts and reports acceptance", s2)
t.ok(r.json()["choices"][0]["text"] == base_text, "greedy text is the same with draft 2")

# ---------------------------------------------------------------- echo
# Completions echo (lm-eval's loglikelihood requests: echo + logprobs): the text is the prompt
# then the completion; each prompt token after the first has the log-softmax of the model's
# logits at the position before it, here checked against `nextn eval`'s logits (itself checked
# against the reference forward by parity.t), and the top alternatives are the largest logits
import numpy  # noqa: E402
from serverlib import MODEL  # noqa: E402


def echo_ref(prompt):
    """The prompt's ids and each position's log-softmax, from `nextn eval`."""
    pids = [int(x) for x in nextn("tokenize", "-m", MODEL, prompt).stdout.split()]
    path = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"nextn-echo-{os.getpid()}.npy")
    nextn("eval", "-m", MODEL, "--tokens", ",".join(map(str, pids)), "--logits", path)
    x = numpy.load(path).astype(numpy.float64)
    os.unlink(path)
    mx = x.max(axis=1, keepdims=True)
    return pids, x - (mx + numpy.log(numpy.exp(x - mx).sum(axis=1, keepdims=True)))


EPROMPT = "The river flows into the sea"
r = curl(B + "/v1/completions", body={"prompt": EPROMPT, "max_tokens": 4, "temperature": 0})
plain_text = r.json()["choices"][0]["text"] if r.status == 200 else None
r = curl(B + "/v1/completions", body={"prompt": EPROMPT, "max_tokens": 4, "temperature": 0, "echo": True,
                                      "logprobs": 3})
ch = r.json()["choices"][0] if r.status == 200 else {}
t.ok(ch.get("text") == EPROMPT + plain_text, "echo: the prompt, then the same completion", r.body[:300])
ids, ref = echo_ref(EPROMPT)
lp = ch.get("logprobs") or {}
tl = lp.get("token_logprobs", [])
good = len(tl) == len(ids) + 4 and tl[0] is None and lp.get("top_logprobs", [1])[0] is None and \
    all(abs(tl[p] - ref[p - 1, ids[p]]) < 1e-4 for p in range(1, len(ids)))
t.ok(good, f"echo logprobs: the {len(ids) - 1} prompt tokens match nextn eval's log-softmax", tl[:len(ids)])
tops = lp.get("top_logprobs", [])
good = all(len(tops[p]) >= 2 and
           all(abs(a - b) < 1e-4 for a, b in zip(sorted(tops[p].values(), reverse=True), sorted(ref[p - 1], reverse=True)))
           for p in range(1, len(ids)))
t.ok(good, "echo top_logprobs: the largest logits' log-probabilities", tops[:3])
t.ok(lp.get("text_offset", [None])[0] == 0 and lp["text_offset"][len(ids)] == len(EPROMPT.encode()),
     "echo text_offset: the prompt from 0, the completion after it", lp.get("text_offset"))


# n > 1 over two prompts: every choice carries its own prompt's entries (the later choices of a
# prompt reuse the first one's pass; the second prompt must not get the first prompt's)
EPROMPT2 = "Once upon a time there was"
refs = [(ids, ref), echo_ref(EPROMPT2)]
r = curl(B + "/v1/completions", body={"prompt": [EPROMPT, EPROMPT2], "max_tokens": 3, "temperature": 0.9,
                                      "seed": 5, "n": 2, "echo": True, "logprobs": 1})
chs = sorted(r.json()["choices"], key=lambda c: c["index"]) if r.status == 200 else []
good = len(chs) == 4
for c in chs:
    pids, pref = refs[c["index"] // 2]
    tl = (c.get("logprobs") or {}).get("token_logprobs", [])
    good = good and len(tl) == len(pids) + 3 and tl[0] is None and \
        all(abs(tl[p] - pref[p - 1, pids[p]]) < 1e-4 for p in range(1, len(pids)))
t.ok(good, "echo logprobs, n=2 over two prompts: each choice has its prompt's entries", r.body[:300])
s = curl(B + "/v1/completions", body={"prompt": EPROMPT2, "max_tokens": 3, "temperature": 0.9, "seed": 5, "n": 2,
                                      "echo": True, "logprobs": 1, "stream": True})
per = {}
for line in s.body.split("\n"):
    if line.startswith("data: {"):
        for c in json.loads(line[6:]).get("choices", []):
            per.setdefault(c["index"], []).extend((c.get("logprobs") or {}).get("token_logprobs", []))
pids, pref = refs[1]
good = sorted(per) == [0, 1] and all(
    len(v) == len(pids) + 3 and v[0] is None and all(abs(v[p] - pref[p - 1, pids[p]]) < 1e-4 for p in range(1, len(pids)))
    for v in per.values())
t.ok(good, "echo logprobs streamed, n=2: both choices' prompt entries", {k: v[:4] for k, v in per.items()})
s = curl(B + "/v1/completions", body={"prompt": EPROMPT, "max_tokens": 4, "temperature": 0, "echo": True,
                                      "stream": True})
text, _, _, _ = stream_text(s, "completion")
t.ok(text == EPROMPT + plain_text, "echo stream: the prompt, then the completion", text)

# ---------------------------------------------------------------- metrics
r = curl(B + "/metrics")
t.ok(r.status == 200 and r.headers.get("content-type", "").startswith("text/plain"), "GET /metrics")
m = r.body
for name in ("nextn_requests_total{route=\"/v1/chat/completions\",status=\"200\"}",
             "nextn_completion_tokens_total", "nextn_decode_tokens_per_second",
             "nextn_spec_drafts_total", "nextn_spec_drafted_tokens_total",
             "nextn_spec_accepted_tokens_total", "nextn_spec_accepted_at_total{position=\"1\"}",
             "nextn_expert_bytes_per_step{kind=\"ar\"}", "nextn_prompt_cache_entries",
             "nextn_prompt_cache_restores_total", "nextn_prompt_cache_evictions_total"):
    t.ok(any(ln.startswith(name + " ") for ln in m.splitlines()), f"metrics: {name}")
t.ok(metric(B, "nextn_spec_drafted_tokens_total") > 0, "metrics count drafted tokens")

# ---------------------------------------------------------------- error matrix
MSG = [{"role": "user", "content": "hi"}]
cases = [
    ("/v1/chat/completions", "{not json", None, "malformed JSON"),
    ("/v1/chat/completions", "[1,2]", None, "non-object body"),
    ("/v1/chat/completions", "", None, "empty body"),
    ("/v1/chat/completions", {"messages": "hi"}, "messages", "messages of the wrong type"),
    ("/v1/chat/completions", {}, "messages", "missing messages"),
    ("/v1/chat/completions", {"messages": [{"role": "user"}]}, "messages[0].content", "message without content"),
    ("/v1/chat/completions", {"messages": MSG, "temperature": "hot"}, "temperature", "temperature of the wrong type"),
    ("/v1/chat/completions", {"messages": MSG, "temperature": 7}, "temperature", "temperature out of range"),
    ("/v1/chat/completions", {"messages": MSG, "max_tokens": -1}, "max_tokens", "negative max_tokens"),
    ("/v1/chat/completions", {"messages": MSG, "top_p": 2}, "top_p", "top_p out of range"),
    ("/v1/chat/completions", {"messages": MSG, "stream": "yes"}, "stream", "stream of the wrong type"),
    ("/v1/chat/completions", {"messages": MSG, "n": 17}, "n", "n above 16"),
    ("/v1/chat/completions", {"messages": MSG, "model": "gpt-4o"}, "model", "unknown model"),
    ("/v1/chat/completions", {"messages": MSG, "stop": 3}, "stop", "stop of the wrong type"),
    ("/v1/chat/completions", {"messages": MSG, "logprobs": True, "top_logprobs": 50}, "top_logprobs",
     "top_logprobs out of range"),
    ("/v1/chat/completions", {"messages": MSG, "speculative": {"draft": 99}}, "speculative.draft",
     "draft out of range"),
    ("/v1/chat/completions", {"messages": MSG, "speculative": {"verify": "maybe"}}, "speculative.verify",
     "unknown verify rule"),
    ("/v1/completions", {"prompt": 42}, "prompt", "prompt of the wrong type"),
    ("/v1/completions", {"prompt": [10 ** 9]}, "prompt", "token id outside the vocabulary"),
    ("/v1/completions", {"prompt": "x " * 3000}, "prompt", "prompt longer than the context"),
]
for path, body, param, name in cases:
    expect_error(B, path, body, 400, param, name)
r = expect_error(B, "/v1/nothing", None, 404, name="unknown route")
r = expect_error(B, "/v1/chat/completions", None, 405, method="GET", name="GET on a POST route")
t.ok(r.headers.get("allow") == "POST", "405 names the allowed method", r.headers)
expect_error(B, "/v1/models", {"x": 1}, 405, name="POST on a GET route")
r = expect_error(B, "/tokenize", None, 405, method="GET", name="GET on /tokenize")
t.ok(r.headers.get("allow") == "POST", "/tokenize: 405 names POST", r.headers)
expect_error(B, "/detokenize", "{not json", 400, name="/detokenize: malformed JSON")
expect_error(B, "/detokenize", {"tokens": "1 2"}, 400, param="tokens", name="/detokenize: tokens not a list")
expect_error(B, "/tokenize", {}, 400, param="prompt", name="/tokenize: no text")
big = json.dumps({"prompt": "a" * (5 << 20)})
expect_error(B, "/v1/completions", big, 413, name="body over --max-body")
r = curl(B + "/v1/completions", raw=big, headers=["Transfer-Encoding: chunked"])
t.ok(r.status == 413, "chunked body over --max-body: 413", r.status)
t.ok(curl(B + "/health").status == 200 and srv.alive(), "server healthy after the error matrix")
t.ok(curl(B + "/v1/completions", body={"prompt": "ok", "max_tokens": 2}).status == 200,
     "and still generating")
rc = srv.stop()
t.ok(rc == 0, "SIGTERM: clean exit", rc)

# ---------------------------------------------------------------- authentication
srv = Server("--api-key", "sekrit")
B = srv.base
expect_error(B, "/v1/models", None, 401, name="no key")
expect_error(B, "/tokenize", {"prompt": "x"}, 401, name="no key on /tokenize")
r = expect_error(B, "/v1/chat/completions", {"messages": MSG}, 401, name="no key on chat")
t.ok(r.headers.get("www-authenticate", "").lower().startswith("bearer"), "401 asks for a bearer token")
expect_error(B, "/v1/models", None, 401, headers=["Authorization: Bearer wrong"], name="wrong key")
expect_error(B, "/v1/models", None, 401, headers=["Authorization: Bearer sekrit2"], name="key with a suffix")
t.ok(curl(B + "/v1/models", headers=["Authorization: Bearer sekrit"]).status == 200, "right key: 200")
r = curl(B + "/v1/completions", body={"prompt": "hi", "max_tokens": 2},
         headers=["Authorization: Bearer sekrit"])
t.ok(r.status == 200, "right key: generation", r.body[:200])
t.ok(curl(B + "/health").status == 200, "/health needs no key")
srv.stop()

# ---------------------------------------------------------------- full queue (503), timeout (504)
# A short timeout: the long generation below (up to a 16K context) cannot finish in it.
srv = Server("--parallel", "1", "--queue", "1", "--timeout", "0.4", "-m", long_context_model(), "--ctx", "16384")
B = srv.base
slow = {"prompt": "Long story:", "max_tokens": 100000, "temperature": 0, "ignore_eos": True}
procs = []
for i in range(4):
    cmd = ["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", "--max-time", "60",
           "-H", "Content-Type: application/json", "-d", json.dumps(slow), B + "/v1/completions"]
    procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True))
    time.sleep(0.03)  # keep arrival order: one runs, one waits, the rest find the queue full
t0 = time.time()
codes = [p.communicate(timeout=90)[0] for p in procs]
elapsed = time.time() - t0
t.note(f"statuses {codes} after {elapsed:.1f}s")
t.ok(codes[0] == "504", "a generation past --timeout gets 504", codes)
t.ok(codes.count("503") >= 1, "requests beyond --queue get 503", codes)
t.ok(elapsed < 30, "nobody hangs", elapsed)
r = curl(B + "/v1/completions", body=dict(slow, stream=True))
evs = r.events()
t.ok(len(evs) >= 2 and "error" in json.loads(evs[-2]) and evs[-1] == "[DONE]",
     "a stream past --timeout ends with an error event and [DONE]", evs[-2:] if evs else r.body[:200])
r = curl(B + "/v1/completions", body={"prompt": "hi", "max_tokens": 3})
t.ok(r.status == 200, "the server serves the next request", r.status)
t.ok(metric(B, "nextn_timeouts_total") >= 2, "metrics count timeouts")
srv.stop()

# ---------------------------------------------------------------- silent streams get SSE comments
# A stream waiting in the queue behind a long generation sends nothing for seconds: with
# --sse-keepalive 0.2 it gets ": keep-alive" comment blocks meanwhile (libmicrohttpd closes a
# connection idle for 60 s, proxies sooner), then its events as usual.
for bad in ("60", "-1", "x"):
    p = subprocess.run([NEXTN, "serve", "--sse-keepalive", bad, "--port", "0"], capture_output=True, text=True,
                       timeout=60)
    t.ok(p.returncode != 0 and "--sse-keepalive" in p.stderr, f"--sse-keepalive {bad} refused", p.stderr[-300:])
for ka in ("0.2", "0"):
    srv = Server("--parallel", "1", "--sse-keepalive", ka, "-m", long_context_model(), "--ctx", "16384")
    B = srv.base
    cmd = ["curl", "-s", "-o", "/dev/null", "--max-time", "60", "-H", "Content-Type: application/json", "-d",
           json.dumps({"prompt": "Long story:", "max_tokens": 100000, "temperature": 0, "ignore_eos": True}),
           B + "/v1/completions"]
    busy = subprocess.Popen(cmd)  # holds the one slot until it is cancelled below
    time.sleep(0.3)
    waiter = subprocess.Popen(["curl", "-sS", "-N", "--max-time", "60", "-H", "Content-Type: application/json", "-d",
                               json.dumps({"prompt": "hi", "max_tokens": 3, "stream": True}),
                               B + "/v1/completions"], stdout=subprocess.PIPE, text=True)
    time.sleep(1.5)
    busy.kill()  # the client hangs up: its generation is cancelled and the waiter runs
    body = waiter.communicate(timeout=60)[0]
    blocks = [b for b in body.split("\n\n") if b.strip()]
    pings = [b for b in blocks if b.startswith(":")]
    data = [b for b in blocks if b.startswith("data: ")]
    if ka == "0":
        t.ok(not pings and data[-1:] == ["data: [DONE]"], "--sse-keepalive 0: no comments; the stream ends", body[:300])
    else:
        first_data = next(i for i, b in enumerate(blocks) if b.startswith("data: "))
        t.ok(len(pings) >= 3 and all(b == ": keep-alive" for b in pings) and first_data >= 3,
             f"a queued stream gets keep-alive comments before its first event ({len(pings)})", body[:300])
        t.ok(len(data) + len(pings) == len(blocks) and data[-1] == "data: [DONE]" and
             all("choices" in json.loads(b[6:]) for b in data[:-1]), "then its events and [DONE]", body[-300:])
    srv.stop()
t.done()
