#!/usr/bin/python3
"""Byte-level BPE tokenizer for the tiny nextn-hy3 model.

Trains a GPT-2/Qwen-style byte-level BPE on the corpus built by corpus.py and
writes it as a Hugging Face ``tokenizer.json`` with the same pipeline shape as
Qwen3's (NFC normalizer, Split(regex, Isolated) + ByteLevel(use_regex=false)
pre-tokenizer, BPE model with pair-list merges, ByteLevel decoder), plus a
``tokenizer_config.json`` carrying a Hy3-style chat template.

Hy3-style special tokens (``<｜hy_User:opensource｜>`` ...) sit at the top of the
id range, after the learned tokens, like the real Hy3 vocabulary (ids >= 120000).

Training is the classic algorithm made fast enough for ~16 MB of text in pure
Python: pre-tokenize with the regex, count distinct words, keep incremental pair
counts plus an inverted index pair -> words, and pick the best pair from a lazy
max-heap, so each merge only touches the words that contain it.

Usage:
  bpe.py train --corpus .corpus --vocab-size 6144 --out DIR      (writes DIR/tokenizer*.json)
  bpe.py encode-corpus --tokenizer DIR --corpus .corpus            (writes .corpus/*.u16)
  bpe.py encode --tokenizer DIR "some text"                        (prints ids)
"""
import argparse
import heapq
import json
import os
import sys
import unicodedata
from collections import Counter, defaultdict

import numpy as np
import regex

# Qwen2/Qwen3 pre-tokenizer pattern (letters, single digits, punctuation runs, newlines, spaces)
PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
           r"|\s*[\r\n]+|\s+(?!\S)|\s+")
PAT = regex.compile(PATTERN)

BOS = "<｜hy_begin_of_sentence:opensource｜>"
PAD = "<｜hy_pad:opensource｜>"
EOS = "<｜hy_eos:opensource｜>"
USER = "<｜hy_User:opensource｜>"
ASSISTANT = "<｜hy_Assistant:opensource｜>"
SPECIALS = [BOS, PAD, USER, ASSISTANT, EOS,
            "<think:opensource>", "</think:opensource>", "<｜reasoning_mode:opensource｜>",
            "<tool_calls:opensource>", "</tool_calls:opensource>",
            "<tool_call:opensource>", "</tool_call:opensource>", "<tool_sep:opensource>",
            "<arg_key:opensource>", "</arg_key:opensource>",
            "<arg_value:opensource>", "</arg_value:opensource>",
            "<tool_responses:opensource>", "</tool_responses:opensource>",
            "<tool_response:opensource>", "</tool_response:opensource>"]
N_SPECIAL_SLOTS = 24   # specials + reserved slots, the top 24 ids of the vocabulary


def bytes_to_unicode():
    """GPT-2's reversible byte -> printable unicode char map used by ByteLevel."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


B2U = bytes_to_unicode()
U2B = {v: k for k, v in B2U.items()}


def special_tokens(vocab_size):
    toks = SPECIALS + [f"<｜hy_reserved_{i}:opensource｜>" for i in range(N_SPECIAL_SLOTS - len(SPECIALS))]
    base = vocab_size - N_SPECIAL_SLOTS
    return {t: base + i for i, t in enumerate(toks)}


def pretokenize(text):
    return PAT.findall(unicodedata.normalize("NFC", text))


def iter_docs(corpus, splits=("train",), kinds=("code", "prose")):
    for s in splits:
        for k in kinds:
            with open(os.path.join(corpus, f"{s}_{k}.jsonl"), encoding="utf-8") as f:
                for line in f:
                    yield k, json.loads(line)["text"]


def train(corpus, vocab_size):
    n_merges = vocab_size - N_SPECIAL_SLOTS - 256
    counts = Counter()
    for _, text in iter_docs(corpus):
        counts.update(pretokenize(text))
    # words as lists of symbol ids (0..255 = bytes)
    words, freqs = [], []
    for w, c in counts.items():
        words.append(list(w.encode("utf-8")))
        freqs.append(c)
    print(f"{len(words)} distinct pre-tokens", file=sys.stderr)
    pair_cnt = defaultdict(int)
    where = defaultdict(set)
    for i, w in enumerate(words):
        f = freqs[i]
        for a, b in zip(w, w[1:]):
            pair_cnt[(a, b)] += f
            where[(a, b)].add(i)
    heap = [(-c, p) for p, c in pair_cnt.items()]
    heapq.heapify(heap)
    sym = [bytes([b]) for b in range(256)]   # symbol id -> bytes
    merges = []
    while len(merges) < n_merges and heap:
        negc, p = heapq.heappop(heap)
        if pair_cnt.get(p, 0) != -negc or negc == 0:
            continue  # stale heap entry
        new = len(sym)
        sym.append(sym[p[0]] + sym[p[1]])
        merges.append(p)
        touched = set()
        for i in list(where[p]):
            w, f = words[i], freqs[i]
            # remove this word's old pairs
            for q in zip(w, w[1:]):
                pair_cnt[q] -= f
                touched.add(q)
            out, j = [], 0
            while j < len(w):
                if j + 1 < len(w) and w[j] == p[0] and w[j + 1] == p[1]:
                    out.append(new)
                    j += 2
                else:
                    out.append(w[j])
                    j += 1
            words[i] = out
            for q in zip(out, out[1:]):
                pair_cnt[q] += f
                where[q].add(i)
                touched.add(q)
        del pair_cnt[p]
        where.pop(p, None)
        for q in touched:
            c = pair_cnt.get(q, 0)
            if c > 0:
                heapq.heappush(heap, (-c, q))
            elif q in pair_cnt:
                del pair_cnt[q]
        if len(merges) % 1000 == 0:
            print(f"merge {len(merges)}: {sym[new]!r} x{-negc}", file=sys.stderr)
    return sym, merges


def to_u(b):
    return "".join(B2U[x] for x in b)


def save(outdir, sym, merges, vocab_size):
    os.makedirs(outdir, exist_ok=True)
    vocab = {to_u(s): i for i, s in enumerate(sym)}
    assert len(vocab) == len(sym), "duplicate byte strings in vocab"
    specials = special_tokens(vocab_size)
    added = [{"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": True} for t, i in specials.items()]
    bl = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}
    tok = {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
        "normalizer": {"type": "NFC"},
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": PATTERN}, "behavior": "Isolated", "invert": False},
            dict(bl)]},
        "post_processor": dict(bl),
        "decoder": dict(bl),
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": "",
                  "end_of_word_suffix": "", "fuse_unk": False, "byte_fallback": False,
                  "ignore_merges": False, "vocab": vocab,
                  "merges": [[to_u(sym[a]), to_u(sym[b])] for a, b in merges]},
    }
    with open(os.path.join(outdir, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(tok, f, ensure_ascii=False, indent=1)
    cfg = {
        "add_bos_token": False, "add_eos_token": False,
        "bos_token": BOS, "eos_token": EOS, "pad_token": PAD, "unk_token": None,
        "model_max_length": 1024, "clean_up_tokenization_spaces": False,
        "tokenizer_class": "PreTrainedTokenizerFast", "token_suffix": ":opensource",
        "added_tokens_decoder": {str(i): {k: v for k, v in a.items() if k != "id"} for a, i in
                                 zip(added, specials.values())},
        "chat_template": CHAT_TEMPLATE,
    }
    with open(os.path.join(outdir, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(cfg, f, ensure_ascii=False, indent=1)


# Hy3 skeleton: bos + system [+ tools block] + (User msg Assistant msg eos)* [+ Assistant]
CHAT_TEMPLATE = (
    "{{- bos_token -}}"
    "{%- if messages and messages[0]['role'] == 'system' -%}"
    "{{- messages[0]['content'] -}}{%- set loop_messages = messages[1:] -%}"
    "{%- else -%}{%- set loop_messages = messages -%}{%- endif -%}"
    "{%- if tools -%}"
    "{{- '<tool_calls:opensource>' -}}{{- tools | tojson -}}{{- '</tool_calls:opensource>' -}}"
    "{%- endif -%}"
    "{%- for m in loop_messages -%}"
    "{%- if m['role'] == 'user' -%}{{- '<｜hy_User:opensource｜>' + m['content'] -}}"
    "{%- elif m['role'] == 'assistant' -%}{{- '<｜hy_Assistant:opensource｜>' + (m['content'] or '') -}}"
    # tool calls as the model writes them (docs/design.md §11): string arguments raw, others as JSON
    "{%- if m['tool_calls'] -%}{{- '<tool_calls:opensource>\\n' -}}"
    "{%- for tc in m['tool_calls'] -%}"
    "{%- set f = tc['function'] if tc['function'] is defined else tc -%}"
    "{{- '<tool_call:opensource>' + f['name'] + '<tool_sep:opensource>\\n' -}}"
    "{%- if f['arguments'] is mapping -%}{%- for k, v in f['arguments'].items() -%}"
    "{{- '<arg_key:opensource>' + k + '</arg_key:opensource>\\n<arg_value:opensource>' -}}"
    "{{- (v if v is string else v | tojson) + '</arg_value:opensource>\\n' -}}"
    "{%- endfor -%}{%- elif f['arguments'] -%}{{- f['arguments'] + '\\n' -}}{%- endif -%}"
    "{{- '</tool_call:opensource>\\n' -}}"
    "{%- endfor -%}{{- '</tool_calls:opensource>' -}}{%- endif -%}"
    "{{- '<｜hy_eos:opensource｜>' -}}"
    "{%- elif m['role'] == 'tool' -%}{{- '<tool_response:opensource>' + (m['content'] or '') + '</tool_response:opensource>' -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<｜hy_Assistant:opensource｜>' -}}{%- endif -%}"
)


class Tokenizer:
    """Minimal encoder/decoder for the tokenizer.json written above (rank-ordered merges)."""

    def __init__(self, path):
        if os.path.isdir(path):
            path = os.path.join(path, "tokenizer.json")
        t = json.load(open(path, encoding="utf-8"))
        self.vocab = t["model"]["vocab"]
        self.inv = {i: s for s, i in self.vocab.items()}
        self.ranks = {tuple(m if isinstance(m, list) else m.split(" ")): r
                      for r, m in enumerate(t["model"]["merges"])}
        self.special = {a["content"]: a["id"] for a in t["added_tokens"]}
        for s, i in self.special.items():
            self.inv[i] = s
        self.split_re = regex.compile("(" + "|".join(regex.escape(s) for s in self.special) + ")")
        self.cache = {}
        self.bos, self.eos, self.pad = self.special[BOS], self.special[EOS], self.special[PAD]
        self.vocab_size = max(self.inv) + 1

    def _bpe(self, word):
        r = self.cache.get(word)
        if r is not None:
            return r
        parts = [B2U[b] for b in word.encode("utf-8")]
        while len(parts) > 1:
            best, bi = None, -1
            for i in range(len(parts) - 1):
                rk = self.ranks.get((parts[i], parts[i + 1]))
                if rk is not None and (best is None or rk < best):
                    best, bi = rk, i
            if best is None:
                break
            parts[bi:bi + 2] = [parts[bi] + parts[bi + 1]]
        r = [self.vocab[p] for p in parts]
        self.cache[word] = r
        return r

    def encode(self, text, allow_special=True):
        ids = []
        chunks = self.split_re.split(text) if allow_special else [text]
        for c in chunks:
            if not c:
                continue
            if allow_special and c in self.special:
                ids.append(self.special[c])
                continue
            for w in pretokenize(c):
                ids.extend(self._bpe(w))
        return ids

    def decode(self, ids):
        out, buf = [], []
        for i in ids:
            s = self.inv[int(i)]
            if int(i) in self.special.values():
                out.append(bytes(buf).decode("utf-8", "replace"))
                buf = []
                out.append(s)
            else:
                buf.extend(U2B[ch] for ch in s)
        out.append(bytes(buf).decode("utf-8", "replace"))
        return "".join(out)


def encode_corpus(tokdir, corpus):
    """Tokenize every split into a flat uint16 stream: [bos] doc [eos] [bos] doc [eos] ..."""
    tk = Tokenizer(tokdir)
    for s in ("train", "val"):
        for k in ("code", "prose"):
            ids = []
            for _, text in iter_docs(corpus, (s,), (k,)):
                ids.append(tk.bos)
                ids.extend(tk.encode(text, allow_special=False))
                ids.append(tk.eos)
            arr = np.array(ids, dtype=np.uint16)
            arr.tofile(os.path.join(corpus, f"{s}_{k}.u16"))
            print(f"{s}_{k}: {len(arr)} tokens", file=sys.stderr)


def main():
    ap = argparse.ArgumentParser(description="byte-level BPE for nextn-hy3")
    sub = ap.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("train")
    t.add_argument("--corpus", default=".corpus")
    t.add_argument("--vocab-size", type=int, default=6144)
    t.add_argument("--out", required=True)
    e = sub.add_parser("encode-corpus")
    e.add_argument("--tokenizer", required=True)
    e.add_argument("--corpus", default=".corpus")
    x = sub.add_parser("encode")
    x.add_argument("--tokenizer", required=True)
    x.add_argument("text")
    a = ap.parse_args()
    if a.cmd == "train":
        sym, merges = train(a.corpus, a.vocab_size)
        save(a.out, sym, merges, a.vocab_size)
    elif a.cmd == "encode-corpus":
        encode_corpus(a.tokenizer, a.corpus)
    else:
        print(" ".join(map(str, Tokenizer(a.tokenizer).encode(a.text))))


if __name__ == "__main__":
    main()
