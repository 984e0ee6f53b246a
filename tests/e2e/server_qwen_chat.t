#!/usr/bin/python3
"""`nextn serve` on the Gated-DeltaNet hybrids: Qwen3.5 / 3.6 MoE (qwen3_5_moe, chat format qwen35,
Qwen3-Coder XML calls) and Qwen3-Next (qwen3_next, chat format qwen3_next, hermes JSON calls),
each format taken from the family.

Each checkpoint is a small random one (tests/ref/make_random_qwen35.py --family F --layout hf
--seed 1) with the default model's byte-level tokenizer plus Qwen's added tokens appended (the
end and turn tokens special, <think>, <tool_call> and the rest text, as Qwen's tokenizers have
them; for qwen3_5_moe also <function=, </function>, <parameter=, </parameter>, so that a
scripted call is a chain of distinct tokens), the family's end ids and its published chat
template (tests/chat/templates/qwen36.jinja, qwen3_next_thinking.jinja). Random weights say
random things, so what is checked is what the format guarantees whatever the weights: a forced
tool call is refused with a named error (Qwen's calls are text the call grammar does not cover),
a conversation carrying an assistant tool call (arguments a JSON string, decoded for the
template) and the tool's result renders in the family's form and is answered, chat answers with
MTP drafting on. A scripted copy (tests/ref/make_scripted_ckpt.py: greedy decoding after the
newline that ends the thinking prompt "<think>\\n" says "Hmm</think>Sure", then for qwen35 a call
to get_weather without parameters) checks the split: reasoning "Hmm", content "Sure" and the
call, streaming and not; without tools offered the call's text stays in the content."""
import json
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "server"))
from chatlib import first_choice, make_chat_checkpoint, streamed, tokenize, weather_tools  # noqa: E402
from chatlib import make_scripted as chatlib_scripted  # noqa: E402
from serverlib import ROOT, Server, curl, skip_all_unless_ready  # noqa: E402
from tap import Tap  # noqa: E402

skip_all_unless_ready()
t = Tap()
MAKER = os.path.join(ROOT, "tests", "ref", "make_random_qwen35.py")
if not t.ok(os.path.exists(MAKER), "tests/ref/make_random_qwen35.py makes the random Qwen checkpoints"):
    t.done()

TOOLS = weather_tools(required=())

SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
TEXT = ["<think>", "</think>", "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"]
TRIP_END = '<|im_start|>user\n<tool_response>\n{"temp": 21}\n</tool_response><|im_end|>\n<|im_start|>assistant\n<think>\n'

# Per family: its added tokens beyond the common ones, template, the scripted answer after the
# thinking prompt and the call it makes (None: none), and how the round trip's call must render.
FAMILIES = {
    "qwen3_5_moe": dict(
        extra=["<function=", "</function>", "<parameter=", "</parameter>"], template="qwen36.jinja",
        script="Hmm</think>Sure<tool_call><function=get_weather></function></tool_call>",
        call=("get_weather", "{}"),
        no_tools_content="Sure<tool_call><function=get_weather></function></tool_call>",
        trip_call="<|im_start|>assistant\n<think>\n\n</think>\n\n<tool_call>\n<function=get_weather>\n"
                  "<parameter=days>\n2\n</parameter>\n<parameter=unit>\nc\n</parameter>\n<parameter=alerts>\nfalse\n"
                  "</parameter>\n</function>\n</tool_call><|im_end|>"),
    "qwen3_next": dict(
        extra=[], template="qwen3_next_thinking.jinja",
        # a hermes call spells JSON with repeated quote tokens: the scripted chain (distinct
        # tokens) says no call
        script="Hmm</think>Sure", call=None, no_tools_content="Sure",
        trip_call='<|im_start|>assistant\n<tool_call>\n{"name": "get_weather", "arguments": {"days": 2, "unit": "c", '
                  '"alerts": false}}\n</tool_call><|im_end|>'),
}


def make_checkpoint(family, out):
    """The random checkpoint of family with Qwen's tokens, end ids and template."""
    fam = FAMILIES[family]
    make_chat_checkpoint(out, "make_random_qwen35.py", ["--family", family, "--layout", "hf", "--seed", "1"],
                         SPECIAL + TEXT + fam["extra"], fam["template"], ["<|im_end|>", "<|endoftext|>"],
                         special=SPECIAL, tc_extra={"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"})


def make_scripted(family, base, out):
    """A scripted copy: greedy decoding after the thinking prompt's last token ("\\n" after
    <think>) says the family's script, then <|im_end|>."""
    after = tokenize(base, "<think>\n")[-1]
    chatlib_scripted(base, out, after, FAMILIES[family]["script"], "<|im_end|>")


def check_random(family, d):
    """Forced calls refused, a tool round trip and MTP on the random checkpoint."""
    fam = FAMILIES[family]
    srv = Server("-m", d, "--model-id", "qwen", "--ctx", "1024")
    base = srv.base + "/v1/chat/completions"
    user = [{"role": "user", "content": "Weather in Paris?"}]
    for choice in ({"type": "function", "function": {"name": "get_weather"}}, "required"):
        r = curl(base, body={"model": "qwen", "messages": user, "tools": TOOLS, "max_tokens": 16,
                             "tool_choice": choice})
        err = (r.json() if r.status == 400 else {}).get("error") or {}
        t.ok(r.status == 400 and err.get("param") == "tool_choice" and err.get("code") == "unsupported_value" and
             "grammar" in (err.get("message") or ""),
             f"{family}: tool_choice {json.dumps(choice)}: a named 400, not an unconstrained answer", r.body[:600])

    # tools offered, the choice left to the model: answered, and whatever it says parses
    r = curl(base, body={"model": "qwen", "messages": user, "tools": TOOLS, "max_tokens": 48, "temperature": 0})
    ch = first_choice(r)
    calls = (ch.get("message") or {}).get("tool_calls") or []
    t.ok(r.status == 200 and ch.get("finish_reason") in ("stop", "length", "tool_calls") and
         all(isinstance(json.loads(c["function"]["arguments"]), dict) for c in calls),
         f"{family}: tool_choice auto: answered, any calls well-formed", r.body[:600])

    # a tool round trip renders: the assistant's call (arguments a JSON string) and the result
    trip = {"model": "qwen", "max_tokens": 8, "seed": 1, "tools": TOOLS, "messages": user + [
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
    t.ok(fam["trip_call"] in text and text.endswith(TRIP_END),
         f"{family}: tool round trip: the template wrote the call and its result in the family's form", text[-800:])
    srv.stop()

    # chat with MTP drafting on (the verify pass rolls the DeltaNet states back on rejection)
    srv = Server("-m", d, "--model-id", "qwen", "--ctx", "1024", "--draft", "2")
    r = curl(srv.base + "/v1/chat/completions",
             body={"model": "qwen", "messages": user, "max_tokens": 24, "temperature": 0})
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
    """The reasoning / content / call split of what the scripted copy says after "<think>\\n"."""
    fam = FAMILIES[family]
    srv = Server("-m", scripted, "--model-id", "qwen", "--ctx", "1024")
    base = srv.base + "/v1/chat/completions"
    user = [{"role": "user", "content": "Weather in Paris?"}]
    req = {"model": "qwen", "messages": user, "tools": TOOLS, "temperature": 0}
    r = curl(base, body=req)
    ch = first_choice(r)
    msg = ch.get("message") or {}
    calls = [(c["function"].get("name"), c["function"].get("arguments")) for c in msg.get("tool_calls") or []]
    t.ok(msg.get("reasoning_content") == "Hmm" and msg.get("content") == "Sure",
         f"{family}: scripted: reasoning opened by the prompt's <think>\\n, then content", r.body[:600])
    want_calls = [fam["call"]] if fam["call"] else []
    t.ok(calls == want_calls and ch.get("finish_reason") == ("tool_calls" if want_calls else "stop"),
         f"{family}: scripted: the tool calls", calls)
    reasoning, content, names, args, _, finish = streamed(curl(base, body={**req, "stream": True}))
    want = ("Hmm", "Sure", *(fam["call"] or ("", "")), "tool_calls" if fam["call"] else "stop")
    t.ok((reasoning, content, names, args, finish) == want,
         f"{family}: scripted, streamed: the same split", (reasoning, content, names, args, finish))
    r = curl(base, body={"model": "qwen", "messages": user, "temperature": 0})
    msg = first_choice(r).get("message") or {}
    t.ok(msg.get("reasoning_content") == "Hmm" and not msg.get("tool_calls") and
         msg.get("content") == fam["no_tools_content"],
         f"{family}: scripted, no tools offered: no calls split out, their text stays content", msg)
    srv.stop()


for family in FAMILIES:
    with tempfile.TemporaryDirectory(prefix=f"nextn-{family}-") as d:
        make_checkpoint(family, d)
        check_random(family, d)
        scripted = os.path.join(d, "scripted")
        make_scripted(family, d, scripted)
        check_scripted(family, scripted)

t.done()
