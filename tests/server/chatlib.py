"""What the per-family chat server tests share: a random checkpoint dressed with a family's chat
tokens, end ids and template; its scripted copy; the get_weather tool and its argument check; and
readers of whole and streamed chat answers.

A family's test gives its own tokens, template and script; everything else is here, so a new
family's chat test is its table and its checks."""
import json
import os
import subprocess
import sys

from serverlib import MODEL, ROOT
from tap import NEXTN


def weather_tools(required=("days", "unit", "alerts")):
    """The one tool every chat test offers (days an integer 1..14, unit an enum, alerts a bool)."""
    return [{"type": "function", "function": {
        "name": "get_weather", "description": "Weather forecast",
        "parameters": {"type": "object", "properties": {
            "days": {"type": "integer", "minimum": 1, "maximum": 14},
            "unit": {"type": "string", "enum": ["c", "f"]},
            "alerts": {"type": "boolean"}},
            "required": list(required)}}}]


def valid_args(text):
    """Whether text is get_weather's arguments as its schema says, all three given: (ok, why)."""
    try:
        a = json.loads(text)
    except (TypeError, ValueError) as e:
        return False, f"not JSON: {e}"
    if not isinstance(a, dict) or set(a) != {"days", "unit", "alerts"}:
        return False, f"keys {sorted(a) if isinstance(a, dict) else a!r}"
    if type(a["days"]) is not int or not 1 <= a["days"] <= 14:
        return False, f"days {a['days']!r}"
    if a["unit"] not in ("c", "f"):
        return False, f"unit {a['unit']!r}"
    if type(a["alerts"]) is not bool:
        return False, f"alerts {a['alerts']!r}"
    return True, ""


def make_chat_checkpoint(out, maker, maker_args, added, template, eos, bos=None, special=None, tc_extra=None,
                         cfg_ids=None):
    """Runs the random-checkpoint maker (a tests/ref script, its arguments without --vocab/--out)
    with the default model's byte-level tokenizer plus `added` tokens appended (special: the ones
    marked special, default all), the end ids `eos` (names of added tokens; one is written as an
    id, several as a list), `bos` (a name or None) and the chat template tests/chat/templates/
    `template`; tc_extra goes into tokenizer_config.json beside them, cfg_ids ({key: token name})
    into config.json as ids. Returns {token: id}."""
    special = set(added if special is None else special)
    tok = json.load(open(os.path.join(MODEL, "tokenizer.json"), encoding="utf-8"))
    n = len(tok["model"]["vocab"])
    tok["added_tokens"] = [{"id": n + i, "content": c, "single_word": False, "lstrip": False, "rstrip": False,
                            "normalized": False, "special": c in special} for i, c in enumerate(added)]
    ids = {c: n + i for i, c in enumerate(added)}
    p = subprocess.run([sys.executable, os.path.join(ROOT, "tests", "ref", maker), *maker_args,
                        "--vocab", str(n + len(added)), "--out", out], capture_output=True, text=True)
    if p.returncode != 0:
        raise RuntimeError(f"{maker} failed:\n{p.stdout}{p.stderr}")
    with open(os.path.join(out, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(tok, f, ensure_ascii=False)
    cfg_path = os.path.join(out, "config.json")
    cfg = json.load(open(cfg_path))
    text = cfg.get("text_config", cfg)  # qwen3_5_moe nests the language model's config
    text["eos_token_id"] = [ids[c] for c in eos] if len(eos) > 1 else ids[eos[0]]
    text["bos_token_id"] = ids[bos] if bos else None
    text.update({k: ids[c] for k, c in (cfg_ids or {}).items()})
    json.dump(cfg, open(cfg_path, "w"), indent=1)
    tc = {"chat_template": open(os.path.join(ROOT, "tests", "chat", "templates", template), encoding="utf-8").read(),
          "added_tokens_decoder": {str(ids[c]): {"content": c, "special": c in special} for c in added}}
    if bos:
        tc["bos_token"] = bos
    tc.update(tc_extra or {})
    json.dump(tc, open(os.path.join(out, "tokenizer_config.json"), "w", encoding="utf-8"), ensure_ascii=False)
    return ids


def tokenize(model, text):
    out = subprocess.run([NEXTN, "tokenize", "-m", model, text], capture_output=True, text=True, check=True).stdout
    return [int(x) for x in out.split()]


def make_scripted(base, out, after, script, end):
    """A scripted copy of base (tests/ref/make_scripted_ckpt.py): greedy decoding after the token
    id `after` says the text `script`, then the token `end` (its text)."""
    [eos] = tokenize(base, end)
    p = subprocess.run([sys.executable, os.path.join(ROOT, "tests", "ref", "make_scripted_ckpt.py"), "--base", base,
                        "--after", str(after), "--script", ",".join(map(str, tokenize(base, script))),
                        "--eos", str(eos), "--out", out], capture_output=True, text=True)
    if p.returncode != 0:
        raise RuntimeError(f"make_scripted_ckpt.py failed:\n{p.stdout}{p.stderr}")


def sse_events(body):
    out = []
    for line in body.splitlines():
        if line.startswith("data: ") and line[6:].strip() != "[DONE]":
            out.append(json.loads(line[6:]))
    return out


def streamed(r):
    """A stream's deltas added up: (reasoning, content, call names, call arguments, ids, finish)."""
    reasoning, content, names, args, ids, finish = "", "", "", "", set(), None
    for e in sse_events(r.body) if r.status == 200 else []:
        for c in e.get("choices", []):
            dl = c.get("delta") or {}
            finish = c.get("finish_reason") or finish
            reasoning += dl.get("reasoning_content") or ""
            content += dl.get("content") or ""
            for tc in dl.get("tool_calls") or []:
                names += (tc.get("function") or {}).get("name") or ""
                args += (tc.get("function") or {}).get("arguments") or ""
                if tc.get("id"):
                    ids.add(tc["id"])
    return reasoning, content, names, args, ids, finish


def first_choice(r):
    return ((r.json() if r.status == 200 else {}).get("choices") or [{}])[0]
