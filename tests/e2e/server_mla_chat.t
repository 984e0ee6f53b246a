#!/usr/bin/python3
"""`nextn serve` on the MLA families: GLM-4.7-Flash (glm4_moe_lite, chat format glm47) and
DeepSeek-V3.1 (deepseek_v3, chat format deepseek_v31), each format taken from the family.

Each checkpoint is a small random one (tests/ref/make_random_mla.py --family F --layout hf
--seed 1) with the default model's byte-level tokenizer plus the family's special tokens
appended, the family's end ids and its published chat template (tests/chat/templates/
glm47_flash.jinja, deepseek_v31.jinja). Random weights say random things, so what is checked is
what the format guarantees whatever the weights: a named forced tool call comes back as one
well-formed call whose arguments validate against the tool's schema (typed: an integer, an enum
string, a boolean), streaming and not, the stream's deltas adding up to the whole answer's call;
"required" gives calls that all validate; a conversation carrying an assistant tool call
(arguments a JSON string) and the tool's result renders in the family's form and is answered;
chat answers with MTP drafting on. A scripted copy (tests/ref/make_scripted_ckpt.py: greedy
decoding after <think> says "Hmm</think>Sure" then a call to get_weather) checks the split:
with thinking on (the template's default for GLM-4.7, chat_template_kwargs thinking for
DeepSeek-V3.1) the prompt ends in <think> and the answer is reasoning "Hmm", content "Sure" and
the call; with thinking off the prompt ends in </think>, so the same chain gives content "Sure"
and the call without reasoning; streaming and not; without tools offered no call is split out."""
import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "server"))
from chatlib import first_choice, make_chat_checkpoint, streamed, tokenize, valid_args, weather_tools  # noqa: E402
from chatlib import make_scripted as chatlib_scripted  # noqa: E402
from serverlib import ROOT, Server, curl, skip_all_unless_ready  # noqa: E402
from tap import Tap  # noqa: E402

skip_all_unless_ready()
t = Tap()
MAKER = os.path.join(ROOT, "tests", "ref", "make_random_mla.py")
if not t.ok(os.path.exists(MAKER), "tests/ref/make_random_mla.py makes the random MLA checkpoints"):
    t.done()

TOOLS = weather_tools()

# Per family: its special tokens (in the order appended to the vocabulary), end ids, template,
# the scripted answer after <think>, the call it makes (arguments as parsed), how thinking is
# turned on and off, and how the round trip's call and result must render.
FAMILIES = {
    "glm4_moe_lite": dict(
        special=["<|endoftext|>", "[MASK]", "[gMASK]", "[sMASK]", "<sop>", "<eop>", "<|system|>", "<|user|>",
                 "<|assistant|>", "<|observation|>", "<think>", "</think>", "<tool_call>", "</tool_call>",
                 "<tool_response>", "</tool_response>", "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>"],
        eos=["<|endoftext|>", "<|user|>", "<|observation|>"], bos=None, eos_token="<|endoftext|>",
        template="glm47_flash.jinja",
        script="Hmm</think>Sure<tool_call>get_weather<arg_key>days</arg_key><arg_value>3</arg_value></tool_call>",
        script_end="<|observation|>", script_args='{"days":3}',
        think_on={}, think_off={"enable_thinking": False},
        trip_call='<|assistant|></think><tool_call>get_weather<arg_key>days</arg_key><arg_value>2</arg_value>'
                  '<arg_key>unit</arg_key><arg_value>c</arg_value><arg_key>alerts</arg_key><arg_value>false'
                  '</arg_value></tool_call>',
        trip_end='<|observation|><tool_response>{"temp": 21}</tool_response><|assistant|><think>',
        no_tools_content="Sureget_weatherdays3"),
    "deepseek_v3": dict(
        special=["<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>", "<think>",
                 "</think>", "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>", "<｜tool▁call▁begin｜>",
                 "<｜tool▁call▁end｜>", "<｜tool▁sep｜>", "<｜tool▁output▁begin｜>", "<｜tool▁output▁end｜>"],
        eos=["<｜end▁of▁sentence｜>"], bos="<｜begin▁of▁sentence｜>", eos_token="<｜end▁of▁sentence｜>",
        template="deepseek_v31.jinja",
        # the tiny byte-level vocabulary spells a JSON key with two '"' tokens, and a scripted
        # chain's tokens must be distinct: the scripted call has no arguments
        script="Hmm</think>Sure<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{}"
               "<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
        script_end="<｜end▁of▁sentence｜>", script_args="{}",
        think_on={"thinking": True}, think_off={},
        trip_call='<｜Assistant｜></think><｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>'
                  '{"days": 2, "unit": "c", "alerts": false}<｜tool▁call▁end｜><｜tool▁calls▁end｜>'
                  '<｜end▁of▁sentence｜>',
        trip_end='<｜tool▁output▁begin｜>{"temp": 21}<｜tool▁output▁end｜>',
        no_tools_content="Sureget_weather{}"),
}


def make_checkpoint(family, out):
    """The random checkpoint of family with its tokens, end ids and template."""
    fam = FAMILIES[family]
    make_chat_checkpoint(out, "make_random_mla.py", ["--family", family, "--layout", "hf", "--seed", "1"],
                         fam["special"], fam["template"], fam["eos"], bos=fam["bos"],
                         tc_extra={"eos_token": fam["eos_token"]})


def make_scripted(family, base, out):
    """A scripted copy: greedy decoding after <think> says the family's script, then its end."""
    fam = FAMILIES[family]
    [after] = tokenize(base, "<think>")
    chatlib_scripted(base, out, after, fam["script"], fam["script_end"])


def check_random(family, d):
    """Forced calls, a tool round trip and MTP on the random checkpoint."""
    fam = FAMILIES[family]
    srv = Server("-m", d, "--model-id", "mla", "--ctx", "1024")
    base = srv.base + "/v1/chat/completions"
    user = [{"role": "user", "content": "Weather in Paris?"}]
    forced = {"model": "mla", "messages": user, "tools": TOOLS, "max_tokens": 120, "temperature": 0,
              "tool_choice": {"type": "function", "function": {"name": "get_weather"}}}

    # a named forced call, whole
    r = curl(base, body=forced)
    ch = first_choice(r)
    msg = ch.get("message") or {}
    calls = msg.get("tool_calls") or []
    t.ok(r.status == 200 and ch.get("finish_reason") == "tool_calls" and len(calls) == 1,
         f"{family}: forced call: one call, finish_reason tool_calls", r.body[:600])
    fn = calls[0].get("function", {}) if calls else {}
    t.ok(fn.get("name") == "get_weather" and calls[0].get("type") == "function" and
         str(calls[0].get("id", "")).startswith("call_"), f"{family}: forced call: name, type and id", calls)
    good, why = valid_args(fn.get("arguments"))
    t.ok(good, f"{family}: forced call: the arguments validate against the schema", f"{why}: {fn.get('arguments')!r}")
    t.ok(not (msg.get("content") or "").strip(), f"{family}: forced call: no content beside the call",
         msg.get("content"))

    # the same request streamed: deltas add up to the same call (greedy: the same tokens)
    r = curl(base, body={**forced, "stream": True})
    _, _, name, args, ids, finish = streamed(r)
    t.ok(r.status == 200 and finish == "tool_calls" and name == "get_weather" and len(ids) == 1,
         f"{family}: streamed forced call: one call named get_weather, finish_reason tool_calls", r.body[-600:])
    good, why = valid_args(args)
    t.ok(good and args == fn.get("arguments"), f"{family}: streamed forced call: arguments valid and as the whole answer's",
         f"{why}: {args!r} vs {fn.get('arguments')!r}")

    # the named call with thinking the other way round: the prompt's reasoning is closed first
    other = fam["think_off"] or fam["think_on"]  # the family's non-default
    r = curl(base, body={**forced, "chat_template_kwargs": other})
    ch = first_choice(r)
    calls = (ch.get("message") or {}).get("tool_calls") or []
    good, why = valid_args(calls[0].get("function", {}).get("arguments") if calls else None)
    t.ok(r.status == 200 and ch.get("finish_reason") == "tool_calls" and len(calls) == 1 and good,
         f"{family}: forced call with chat_template_kwargs {other}: one valid call", f"{why}: {r.body[:600]}")

    # "required": one call or more, each of a tool offered, with valid arguments (a random model
    # may chain calls up to max_tokens: the complete ones must validate)
    r = curl(base, body={**forced, "tool_choice": "required", "max_tokens": 400})
    ch = first_choice(r)
    calls = (ch.get("message") or {}).get("tool_calls") or []
    checks = [(c.get("function", {}).get("name"), valid_args(c.get("function", {}).get("arguments"))) for c in calls]
    t.ok(r.status == 200 and ch.get("finish_reason") in ("tool_calls", "length") and calls and
         all(n == "get_weather" and v[0] for n, v in checks), f"{family}: required: every call valid", r.body[:800])

    # a tool round trip renders: the assistant's call (arguments a JSON string) and the result
    trip = {"model": "mla", "max_tokens": 8, "seed": 1, "tools": TOOLS, "messages": user + [
        {"role": "assistant", "content": "", "tool_calls": [{"id": "call_1", "type": "function", "function": {
            "name": "get_weather", "arguments": json.dumps({"days": 2, "unit": "c", "alerts": False})}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "{\"temp\": 21}"}]}
    r = curl(base, body=trip)
    ch = first_choice(r)
    t.ok(r.status == 200 and ch.get("finish_reason") in ("stop", "length", "tool_calls"),
         f"{family}: tool round trip: rendered and answered", r.body[:600])
    r = curl(srv.base + "/tokenize", body={"messages": trip["messages"], "tools": TOOLS, "return_token_strs": True})
    strs = (r.json() if r.status == 200 else {}).get("token_strs") or []
    text = "".join(strs).replace("\u010a", "\n").replace("\u0120", " ")  # byte-level: ASCII here
    t.ok(fam["trip_call"] in text and text.endswith(fam["trip_end"]),
         f"{family}: tool round trip: the template wrote the call and its result in the family's form", text[-800:])
    srv.stop()

    # chat with MTP drafting on
    srv = Server("-m", d, "--model-id", "mla", "--ctx", "1024", "--draft", "2")
    r = curl(srv.base + "/v1/chat/completions",
             body={"model": "mla", "messages": user, "max_tokens": 24, "temperature": 0})
    body = r.json() if r.status == 200 else {}
    ch = (body.get("choices") or [{}])[0]
    t.ok(r.status == 200 and ch.get("finish_reason") in ("stop", "length") and
         isinstance((ch.get("message") or {}).get("content"), str), f"{family}: MTP on: chat answers", r.body[:600])
    u = body.get("usage") or {}
    sp = u.get("speculative") or {}
    t.ok(u.get("completion_tokens", 0) > 0 and sp.get("draft") == 2 and sp.get("drafts", 0) > 0,
         f"{family}: MTP on: tokens generated with drafts", u)
    srv.stop()


def check_scripted(family, scripted):
    """The reasoning / content / call split of what the scripted copy says."""
    fam = FAMILIES[family]
    srv = Server("-m", scripted, "--model-id", "mla", "--ctx", "1024")
    base = srv.base + "/v1/chat/completions"
    user = [{"role": "user", "content": "Weather in Paris?"}]
    want_call = ("get_weather", fam["script_args"])
    for think, kwargs, want_reasoning in (("on", fam["think_on"], "Hmm"), ("off", fam["think_off"], "")):
        req = {"model": "mla", "messages": user, "tools": TOOLS, "temperature": 0}
        if kwargs:
            req["chat_template_kwargs"] = kwargs
        r = curl(base, body=req)
        ch = first_choice(r)
        msg = ch.get("message") or {}
        calls = msg.get("tool_calls") or []
        t.ok((msg.get("reasoning_content") or "") == want_reasoning and msg.get("content") == "Sure",
             f"{family}: scripted, thinking {think}: reasoning_content and content", r.body[:600])
        t.ok(ch.get("finish_reason") == "tool_calls" and len(calls) == 1 and
             (calls[0]["function"].get("name"), calls[0]["function"].get("arguments")) == want_call,
             f"{family}: scripted, thinking {think}: the tool call", calls)
        reasoning, content, names, args, _, finish = streamed(curl(base, body={**req, "stream": True}))
        t.ok((reasoning, content, names, args, finish) == (want_reasoning, "Sure", *want_call, "tool_calls"),
             f"{family}: scripted, thinking {think}, streamed: the same split", (reasoning, content, names, args, finish))
    req = {"model": "mla", "messages": user, "temperature": 0}
    if fam["think_on"]:
        req["chat_template_kwargs"] = fam["think_on"]
    r = curl(base, body=req)
    msg = first_choice(r).get("message") or {}
    t.ok(msg.get("reasoning_content") == "Hmm" and not msg.get("tool_calls") and
         msg.get("content") == fam["no_tools_content"],
         f"{family}: scripted, no tools offered: no calls split out (their special tokens are not text)", msg)
    srv.stop()


for family in FAMILIES:
    with tempfile.TemporaryDirectory(prefix=f"nextn-{family}-") as d:
        make_checkpoint(family, d)
        check_random(family, d)
        scripted = os.path.join(d, "scripted")
        make_scripted(family, d, scripted)
        check_scripted(family, scripted)

t.done()
