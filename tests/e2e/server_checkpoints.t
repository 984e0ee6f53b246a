#!/usr/bin/python3
"""Recurrent-state checkpoints in `nextn serve` (--ctx-checkpoints, --checkpoint-every) on a
Gated-DeltaNet hybrid: a random qwen3_5_moe checkpoint (tests/ref/make_random_qwen35.py) with
Qwen's added tokens and Qwen3.6's chat template, as server_qwen_chat.t builds it.

A hybrid's recurrent state cannot be cut back to an arbitrary row, so without checkpoints a
request whose prompt shares only part of what a slot holds prefills from the start. Checked, with
the shared prefix k of the two prompts taken from the server's own /tokenize:
- a chat's next turn keeps the rows up to where the first turn's generation prompt began: Qwen's
  template renders an earlier answer without the "<think>" the generation prompt opened, so the
  two prompts part inside the generation prompt, before the checkpoint every prompt leaves at its
  last row but one; with --ctx-checkpoints 0 the turn keeps none, and both answer the same
  greedy tokens;
- a second question about the same document keeps the rows up to the last multiple of
  --checkpoint-every within k, and answers as a server that prefilled it all;
- two conversations at once on two slots (their steps batched) each keep their rows on the next
  turn and answer as one slot alone does;
- two conversations alternating on one slot come back from the prompt cache at a checkpoint.
Each kept count is usage.prompt_tokens_details.cached_tokens."""
import concurrent.futures
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "server"))
from chatlib import first_choice, make_chat_checkpoint  # noqa: E402
from serverlib import Server, curl, metric, skip_all_unless_ready  # noqa: E402
from tap import Tap, scratch  # noqa: E402

skip_all_unless_ready()
t = Tap()
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
TEXT = ["<think>", "</think>", "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>",
        "<function=", "</function>", "<parameter=", "</parameter>"]
DOC = ("The river leaves the mountains in a narrow gorge, widens across the plain, and meets the sea in a "
       "delta of seven channels. Farmers along its banks grow rice in the wet season and beans in the dry; "
       "the towns at its mouth trade salt, fish and timber brought down on rafts each spring. ") * 2
EVERY = 32

d = scratch(prefix="nextn-ckpt-")
make_chat_checkpoint(d, "make_random_qwen35.py", ["--family", "qwen3_5_moe", "--layout", "hf", "--seed", "1"],
                     SPECIAL + TEXT, "qwen36.jinja", ["<|im_end|>", "<|endoftext|>"], special=SPECIAL,
                     tc_extra={"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"})


def serve(*extra):
    return Server("-m", d, "--model-id", "qwen", "--ctx", "2048", "--parallel", "1", "--draft", "2", *extra)


def tokens(srv, **body):
    r = curl(srv.base + "/tokenize", body=body)
    return r.json()["tokens"] if r.status == 200 else []


def shared(a, b):
    k = 0
    while k < min(len(a), len(b)) and a[k] == b[k]:
        k += 1
    return k


def ask(srv, path, body):
    """(text, cached tokens, prompt tokens, drafts) of a greedy request."""
    r = curl(srv.base + path, body=dict(body, model="qwen", max_tokens=8, temperature=0))
    ch = first_choice(r)
    u = (r.json() if r.status == 200 else {}).get("usage") or {}
    text = (ch.get("message") or {}).get("reasoning_content", "") or "" if "messages" in body else ch.get("text")
    if "messages" in body:
        text = ((ch.get("message") or {}).get("reasoning_content") or "") + "|" + \
               ((ch.get("message") or {}).get("content") or "")
    return (r.status, text, (u.get("prompt_tokens_details") or {}).get("cached_tokens"), u.get("prompt_tokens"),
            (u.get("speculative") or {}).get("drafts", 0))


# ---- a chat's next turn
turn1 = [{"role": "system", "content": DOC}, {"role": "user", "content": "Where does the river meet the sea?"}]
runs = {}
for name, extra in (("checkpoints", ("--checkpoint-every", "0")), ("none", ("--ctx-checkpoints", "0"))):
    srv = serve(*extra)
    st1, a1, c1, p1, dr1 = ask(srv, "/v1/chat/completions", {"messages": turn1})
    answer = a1.split("|", 1)[1]
    turn2 = turn1 + [{"role": "assistant", "content": answer}, {"role": "user", "content": "And what do they trade?"}]
    st2, a2, c2, p2, dr2 = ask(srv, "/v1/chat/completions", {"messages": turn2})
    k = shared(tokens(srv, messages=turn1), tokens(srv, messages=turn2))
    g1 = len(tokens(srv, messages=turn1, add_generation_prompt=False))
    runs[name] = (st1, st2, c1, c2, p1, p2, k, a2, dr1 + dr2, g1)
    srv.stop()
st1, st2, c1, c2, p1, p2, k, a2, drafts, g1 = runs["checkpoints"]
t.ok(st1 == 200 and st2 == 200 and c1 == 0 and drafts > 0, "chat: both turns answered, MTP drafting",
     runs["checkpoints"])
t.ok(0 < g1 <= k < p1 - 1 and c2 == g1,
     f"chat: the next turn keeps the {g1} rows before turn 1's generation prompt (the prompts share {k} of {p1})",
     runs["checkpoints"])
t.ok(runs["none"][3] == 0 and runs["none"][7] == a2,
     "chat: with --ctx-checkpoints 0 the next turn prefills from the start, and answers the same tokens",
     (runs["none"], a2))

# ---- two conversations at once on two slots, their steps batched: each next turn keeps the rows
# before its first turn's generation prompt and answers what one slot alone answers
turn1b = [{"role": "system", "content": DOC.replace("river", "canal")},
          {"role": "user", "content": "What do the farmers grow?"}]


def two_turns(srv, conv, answer_of):
    st, a, _, _, _ = ask(srv, "/v1/chat/completions", {"messages": conv})
    nxt = conv + [{"role": "assistant", "content": a.split("|", 1)[1]}, {"role": "user", "content": "Say more."}]
    answer_of.append(nxt)
    return st, ask(srv, "/v1/chat/completions", {"messages": nxt})


alone = []
for conv in (turn1, turn1b):
    srv = serve("--checkpoint-every", "0")
    alone.append(two_turns(srv, conv, []))
    srv.stop()
srv = serve("--checkpoint-every", "0", "--parallel", "2")
with concurrent.futures.ThreadPoolExecutor(2) as ex:
    nexts = [[], []]
    both = list(ex.map(two_turns, [srv, srv], [turn1, turn1b], nexts))
gens = [len(tokens(srv, messages=conv, add_generation_prompt=False)) for conv in (turn1, turn1b)]
one, allf = (metric(srv.base, name) or 0 for name in ('nextn_batch_sequences_bucket{le="1"}',
                                                    "nextn_batch_sequences_count"))
srv.stop()
t.ok(all(b[0] == 200 and b[1][0] == 200 and b[1][2] == g for b, g in zip(both, gens)) and
     [b[1][1] for b in both] == [a[1][1] for a in alone] and allf - one > 0,
     f"--parallel 2: two conversations' next turns keep {gens} rows each and answer as one slot alone "
     f"({allf - one:.0f} of {allf:.0f} forwards held both)", (both, alone, gens))

# ---- a second question about the same document (completions: the prompts are the texts)
qa, qb = DOC + "Question: what do farmers grow?", DOC + "Question: how many channels has the delta?"
srv = serve("--checkpoint-every", str(EVERY), "--ctx-checkpoints", "16")
sa, ta, ca, pa, _ = ask(srv, "/v1/completions", {"prompt": qa})
sb, tb, cb, pb, _ = ask(srv, "/v1/completions", {"prompt": qb})
k = shared(tokens(srv, prompt=qa), tokens(srv, prompt=qb))
srv.stop()
fresh = serve("--ctx-checkpoints", "0")
sf, tf, cf, _, _ = ask(fresh, "/v1/completions", {"prompt": qb})
fresh.stop()
t.ok(sa == sb == sf == 200 and ca == 0 and k >= 2 * EVERY and cb == k // EVERY * EVERY,
     f"document: the second question keeps the rows up to the last multiple of {EVERY} within the {k} shared",
     (sa, sb, ca, cb, k, pa, pb))
t.ok(tb == tf and cf == 0, "document: the same tokens as a server that prefilled it all", (tb, tf))

# ---- two conversations alternating on one slot: the prompt cache keeps their checkpoints
srv = serve("--checkpoint-every", str(EVERY), "--ctx-checkpoints", "16")
other = "Write a haiku about salt. " * 6
ask(srv, "/v1/completions", {"prompt": qa})
so, _, co, _, _ = ask(srv, "/v1/completions", {"prompt": other})
sb2, tb2, cb2, _, _ = ask(srv, "/v1/completions", {"prompt": qb})
srv.stop()
t.ok(so == sb2 == 200 and co == 0 and cb2 == k // EVERY * EVERY and tb2 == tf,
     "prompt cache: after another prompt took the slot, the document's question comes back from a checkpoint",
     (so, co, cb2, tb2, tf))
t.done()
