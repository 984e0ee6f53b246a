#!/usr/bin/python3
"""`nextn serve` on a GLM-4.5 (glm4_moe) checkpoint: the chat format comes from the family.

The checkpoint is a small random glm4_moe (tests/ref/make_random_glm.py) with the default model's
byte-level tokenizer plus GLM's special tokens appended (<|user|>, <|assistant|>, <think>,
<tool_call>, <arg_key>, …), GLM's end ids (<|endoftext|>, <|user|>, <|observation|>) and the
GLM-4.5 chat template (tests/chat/templates/glm45.jinja). Random weights say random things, so
what is checked is what the format guarantees whatever the weights: a named forced tool call
comes back as one well-formed call whose arguments validate against the tool's schema (typed:
an integer, an enum string, a boolean), streaming and not, the stream's deltas adding up to the
whole answer's call; "required" gives calls that all validate; a conversation carrying an assistant tool call (arguments a JSON string)
and the tool's result renders and is answered; /v1/chat/completions answers with MTP drafting on
and reports its drafts. A scripted copy (tests/ref/make_scripted_ckpt.py: greedy decoding after
<|assistant|> says "\n<think>Hmm</think>Sure<tool_call>get_weather<arg_key>days</arg_key>
<arg_value>3</arg_value></tool_call>", GLM-4.5's newline before <think> included) checks the split:
reasoning_content, content (without that newline) and the typed call, streaming and not; without
tools offered no call is split out."""
import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "server"))
from chatlib import make_chat_checkpoint, sse_events, streamed, tokenize, valid_args, weather_tools  # noqa: E402
from chatlib import make_scripted as chatlib_scripted  # noqa: E402
from serverlib import Server, curl, skip_all_unless_ready  # noqa: E402
from tap import Tap  # noqa: E402

skip_all_unless_ready()
t = Tap()

GLM_SPECIAL = ["<|endoftext|>", "[MASK]", "[gMASK]", "[sMASK]", "<sop>", "<eop>", "<|system|>", "<|user|>",
               "<|assistant|>", "<|observation|>", "<|begin_of_image|>", "<|end_of_image|>", "<think>", "</think>",
               "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<arg_key>", "</arg_key>",
               "<arg_value>", "</arg_value>"]

SCRIPT = "\n<think>Hmm</think>Sure<tool_call>get_weather<arg_key>days</arg_key><arg_value>3</arg_value></tool_call>"
TOOLS = weather_tools()


def make_checkpoint(out):
    """The random glm4_moe checkpoint with GLM's tokens, end ids and template."""
    make_chat_checkpoint(out, "make_random_glm.py", ["--layout", "hf", "--seed", "7"], GLM_SPECIAL, "glm45.jinja",
                         ["<|endoftext|>", "<|user|>", "<|observation|>"],
                         tc_extra={"eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>"},
                         cfg_ids={"pad_token_id": "<|endoftext|>"})


def make_scripted(base, out):
    """A scripted copy of the checkpoint: greedy decoding after <|assistant|> says SCRIPT, then
    <|observation|> (tests/ref/make_scripted_ckpt.py)."""
    [after] = tokenize(base, "<|assistant|>")
    chatlib_scripted(base, out, after, SCRIPT, "<|observation|>")


with tempfile.TemporaryDirectory(prefix="nextn-glm-") as d:
    make_checkpoint(d)
    scripted = os.path.join(d, "scripted")
    make_scripted(d, scripted)
    srv = Server("-m", d, "--model-id", "glm", "--ctx", "1024")
    base = srv.base + "/v1/chat/completions"
    user = [{"role": "user", "content": "Weather in Paris?"}]
    forced = {"model": "glm", "messages": user, "tools": TOOLS, "max_tokens": 120, "temperature": 0,
              "tool_choice": {"type": "function", "function": {"name": "get_weather"}}}

    # (a) a named forced call, whole
    r = curl(base, body=forced)
    body = r.json() if r.status == 200 else {}
    ch = (body.get("choices") or [{}])[0]
    msg = ch.get("message") or {}
    calls = msg.get("tool_calls") or []
    t.ok(r.status == 200 and ch.get("finish_reason") == "tool_calls" and len(calls) == 1,
         "forced call: one call, finish_reason tool_calls", r.body[:600])
    fn = calls[0].get("function", {}) if calls else {}
    t.ok(fn.get("name") == "get_weather" and calls[0].get("type") == "function" and
         str(calls[0].get("id", "")).startswith("call_"), "forced call: name, type and id", calls)
    good, why = valid_args(fn.get("arguments"))
    t.ok(good, "forced call: the arguments validate against the schema", f"{why}: {fn.get('arguments')!r}")
    t.ok(not (msg.get("content") or "").strip(), "forced call: no content beside the call", msg.get("content"))

    # (a) the same request streamed: deltas add up to the same call (greedy: the same tokens)
    r = curl(base, body={**forced, "stream": True})
    ev = sse_events(r.body) if r.status == 200 else []
    name, args, ids, finish = "", "", set(), None
    for e in ev:
        for c in e.get("choices", []):
            finish = c.get("finish_reason") or finish
            for tc in (c.get("delta") or {}).get("tool_calls") or []:
                t_fn = tc.get("function") or {}
                name += t_fn.get("name") or ""
                args += t_fn.get("arguments") or ""
                if tc.get("id"):
                    ids.add(tc["id"])
    t.ok(r.status == 200 and finish == "tool_calls" and name == "get_weather" and len(ids) == 1,
         "streamed forced call: one call named get_weather, finish_reason tool_calls", r.body[-600:])
    good, why = valid_args(args)
    t.ok(good and args == fn.get("arguments"), "streamed forced call: arguments valid and as the whole answer's",
         f"{why}: {args!r} vs {fn.get('arguments')!r}")

    # (a) "required": one call or more, each of a tool offered, with valid arguments
    r = curl(base, body={**forced, "tool_choice": "required", "max_tokens": 400})
    ch = ((r.json() if r.status == 200 else {}).get("choices") or [{}])[0]
    calls = (ch.get("message") or {}).get("tool_calls") or []
    checks = [(c.get("function", {}).get("name"), valid_args(c.get("function", {}).get("arguments"))) for c in calls]
    t.ok(r.status == 200 and ch.get("finish_reason") == "tool_calls" and calls and
         all(n == "get_weather" and v[0] for n, v in checks), "required: every call valid", r.body[:800])

    # (b) a tool round trip renders: the assistant's call (arguments a JSON string) and the result
    trip = {"model": "glm", "max_tokens": 8, "seed": 1, "tools": TOOLS, "messages": user + [
        {"role": "assistant", "content": "", "tool_calls": [{"id": "call_1", "type": "function", "function": {
            "name": "get_weather", "arguments": json.dumps({"days": 2, "unit": "c", "alerts": False})}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "{\"temp\": 21}"}]}
    r = curl(base, body=trip)
    ch = ((r.json() if r.status == 200 else {}).get("choices") or [{}])[0]
    t.ok(r.status == 200 and ch.get("finish_reason") in ("stop", "length", "tool_calls"),
         "tool round trip: rendered and answered", r.body[:600])
    r = curl(srv.base + "/tokenize", body={"messages": trip["messages"], "tools": TOOLS, "return_token_strs": True})
    strs = (r.json() if r.status == 200 else {}).get("token_strs") or []
    text = "".join(strs).replace("\u010a", "\n").replace("\u0120", " ")  # byte-level: ASCII here
    t.ok('<|assistant|>\n<think></think>\n<tool_call>get_weather\n<arg_key>days</arg_key>\n<arg_value>2</arg_value>'
         in text and text.endswith('<|observation|>\n<tool_response>\n{"temp": 21}\n</tool_response><|assistant|>'),
         "tool round trip: the template wrote the call and its result in GLM's form", r.body[-800:])
    srv.stop()

    # reasoning, content and a tool call split out of what the scripted copy says
    srv = Server("-m", scripted, "--model-id", "glm", "--ctx", "1024")
    base = srv.base + "/v1/chat/completions"
    req = {"model": "glm", "messages": user, "tools": TOOLS, "temperature": 0}
    r = curl(base, body=req)
    ch = ((r.json() if r.status == 200 else {}).get("choices") or [{}])[0]
    msg = ch.get("message") or {}
    calls = msg.get("tool_calls") or []
    t.ok(msg.get("reasoning_content") == "Hmm" and msg.get("content") == "Sure",
         "scripted: reasoning_content and content", r.body[:600])
    t.ok(ch.get("finish_reason") == "tool_calls" and len(calls) == 1 and
         calls[0].get("function", {}).get("name") == "get_weather" and
         calls[0]["function"].get("arguments") == '{"days":3}', "scripted: the tool call, typed", calls)
    r = curl(base, body={**req, "stream": True})
    reasoning, content, names, args, _, finish = streamed(r)
    t.ok((reasoning, content, names, args, finish) == ("Hmm", "Sure", "get_weather", '{"days":3}', "tool_calls"),
         "scripted, streamed: the same split", (reasoning, content, names, args, finish))
    r = curl(base, body={"model": "glm", "messages": user, "temperature": 0})
    msg = (((r.json() if r.status == 200 else {}).get("choices") or [{}])[0]).get("message") or {}
    t.ok(msg.get("reasoning_content") == "Hmm" and not msg.get("tool_calls") and
         msg.get("content") == "Sureget_weatherdays3",
         "scripted, no tools offered: no calls split out (their special tokens are not text)", msg)
    srv.stop()

    # (c) chat with MTP drafting on
    srv = Server("-m", d, "--model-id", "glm", "--ctx", "1024", "--draft", "2")
    r = curl(srv.base + "/v1/chat/completions",
             body={"model": "glm", "messages": user, "max_tokens": 24, "temperature": 0})
    body = r.json() if r.status == 200 else {}
    ch = (body.get("choices") or [{}])[0]
    t.ok(r.status == 200 and ch.get("finish_reason") in ("stop", "length") and
         isinstance((ch.get("message") or {}).get("content"), str), "MTP on: chat answers", r.body[:600])
    u = body.get("usage") or {}
    sp = u.get("speculative") or {}
    t.ok(u.get("completion_tokens", 0) > 0 and sp.get("draft") == 2 and sp.get("drafts", 0) > 0,
         "MTP on: tokens generated with drafts", u)
    srv.stop()

t.done()
