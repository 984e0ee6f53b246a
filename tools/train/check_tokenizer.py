#!/usr/bin/python3
"""Cross-check our tokenizer.json against the npm reference implementation
(@huggingface/tokenizers, pinned in package.json): the Python encoder in bpe.py
and Tokenizers.js must produce identical ids for a set of tricky strings
(code, tabs/CRLF, contractions, digits, NFC normalisation, emoji, specials).

Usage: check_tokenizer.py DIR     (exit status 1 on any mismatch)
"""
import json
import os
import subprocess
import sys
import tempfile
import unicodedata

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bpe import Tokenizer  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TEXTS = [
    "Hello World",
    "static int foo(struct device *dev)\n{\n\treturn -EINVAL;\n}\n",
    "The quick brown fox's tail -- isn't it 1234 dogs?  \n\n  Ünïcödé café naïve 日本語 😀",
    "<｜hy_begin_of_sentence:opensource｜>sys<｜hy_User:opensource｜>hi<｜hy_Assistant:opensource｜>"
    "<think:opensource></think:opensource>ok<｜hy_eos:opensource｜>",
    "\t\tif (x == NULL)\n\t\t\tgoto out;\r\n",
    "e\u0301 \ufb01 \u2126 A\u030a",
    "   leading spaces and trailing   ",
    "I'LL we've DON'T 3.14159 0x7fffffff",
    "#include <linux/module.h>\n#define MAX(a, b) ((a) > (b) ? (a) : (b))\n",
]
JS = """
const {Tokenizer} = require(process.argv[2]);
const fs = require('fs');
const dir = process.argv[3];
const tok = new Tokenizer(JSON.parse(fs.readFileSync(dir + '/tokenizer.json', 'utf8')),
                          JSON.parse(fs.readFileSync(dir + '/tokenizer_config.json', 'utf8')));
const texts = JSON.parse(fs.readFileSync(process.argv[4], 'utf8'));
console.log(JSON.stringify(texts.map(t => [tok.encode(t, {add_special_tokens: false}).ids, tok.decode(tok.encode(t, {add_special_tokens: false}).ids)])));
"""


def main():
    d = sys.argv[1]
    tk = Tokenizer(d)
    with tempfile.TemporaryDirectory() as tmp:
        tf = os.path.join(tmp, "t.json")
        json.dump(TEXTS, open(tf, "w"))
        js = os.path.join(tmp, "c.js")
        open(js, "w").write(JS)
        out = subprocess.check_output(["node", js, os.path.join(ROOT, "node_modules/@huggingface/tokenizers"),
                                       os.path.abspath(d), tf])
    res = json.loads(out)
    bad = 0
    for t, (ids, dec) in zip(TEXTS, res):
        mine = tk.encode(t)
        ok = mine == ids and tk.decode(mine) == dec == unicodedata.normalize("NFC", t)
        bad += not ok
        print("ok  " if ok else "FAIL", len(mine), repr(t[:40]))
        if not ok:
            print("  python:", mine, repr(tk.decode(mine)))
            print("  js    :", ids, repr(dec))
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
