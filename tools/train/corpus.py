#!/usr/bin/python3
"""Build the training corpus for the tiny nextn-hy3 model from Debian packages.

The corpus mixes two kinds of text, because the MTP head behaves very differently
on them (code is far more predictable than prose):

* C source code: a subset of the Linux kernel tree shipped as a tarball by the
  Debian package ``linux-source-6.1`` (/usr/src/linux-source-6.1.tar.xz);
* English prose: the Python 3.11 documentation sources (``python3.11-doc``,
  reStructuredText prose sections only), the Debian Reference (HTML, tags
  stripped), the GNU Coding Standards / maintainer guides (plain text) and the
  classic ``fortunes`` databases.

Validation documents are held out *by file* (a stable hash of the file name),
so no validation text is ever seen in training, separately for code and prose.

Output (outside git, default ``.corpus/``):
    train_code.jsonl, val_code.jsonl, train_prose.jsonl, val_prose.jsonl
    manifest.json   - packages with versions, every file used and its split
One JSON object per line: {"src": path, "text": document}.

Usage: /usr/bin/python3 tools/train/corpus.py [--out .corpus]
"""
import argparse
import gzip
import hashlib
import html
import json
import os
import re
import subprocess
import sys
import tarfile

KERNEL_TAR = "/usr/src/linux-source-6.1.tar.xz"
# Kernel directories sampled for C code: core kernel, libraries, memory management,
# VFS core and a few drivers - ordinary, readable C with the usual kernel style.
KERNEL_DIRS = ("kernel/", "lib/", "mm/", "fs/", "include/linux/", "drivers/char/",
               "drivers/base/", "net/core/", "crypto/", "block/")
CODE_BUDGET = 9_000_000     # bytes of C source kept
PROSE_FILE_MAX = 400_000    # no single prose file may dominate
VAL_PERCENT = 4             # share of files held out for validation

PY_DOC = "/usr/share/doc/python3.11/html/_sources"
# prose-heavy parts of the Python docs (the library reference is mostly API lists)
PY_DOC_DIRS = ("tutorial", "howto", "faq", "reference", "whatsnew", "using", "extending",
               "installing", "distributing")
DEBREF = "/usr/share/doc/debian-reference-common/docs"
GNU_STD = ["/usr/share/doc/gnu-standards/standards.text.gz",
           "/usr/share/doc/gnu-standards/maintain.text.gz"]
FORTUNES = "/usr/share/games/fortunes"
FORTUNE_FILES = ("fortunes", "literature", "wisdom", "people", "science", "computers",
                 "humorists", "education", "work", "goedel", "love", "platitudes",
                 "pets", "magic", "linux", "paradoxum", "miscellaneous", "politics",
                 "zippy", "definitions", "food", "law", "medicine", "news", "songs-poems",
                 "sports", "startrek", "riddles", "kids", "men-women", "art", "debian",
                 "cookie", "linuxcookie", "perl", "translate-me", "disclaimer", "ethnic",
                 "drugs", "knghtbrd")

PACKAGES = ["linux-source-6.1", "python3.11-doc", "debian-reference-en",
            "debian-reference-common", "gnu-standards", "fortunes", "fortunes-min"]


def is_val(name):
    """Stable file-level split: the same file always lands in the same split."""
    h = int(hashlib.sha1(name.encode()).hexdigest()[:8], 16)
    return h % 100 < VAL_PERCENT


def pkg_version(p):
    try:
        return subprocess.check_output(["dpkg-query", "-W", "-f=${Version}", p],
                                       stderr=subprocess.DEVNULL).decode()
    except Exception:
        return None


def clean(text):
    text = text.replace("\r\n", "\n")
    # collapse runs of >2 blank lines; keep tabs (kernel style uses them)
    return re.sub(r"\n{4,}", "\n\n\n", text).strip("\n") + "\n"


def code_docs():
    """Yield (name, text) for kernel C files, in tar order; every directory of
    KERNEL_DIRS gets an equal share of CODE_BUDGET so no subsystem dominates."""
    share = CODE_BUDGET // len(KERNEL_DIRS)
    used = dict.fromkeys(KERNEL_DIRS, 0)
    with tarfile.open(KERNEL_TAR, "r|xz") as tf:
        for m in tf:
            if not m.isfile():
                continue
            rel = m.name.split("/", 1)[1] if "/" in m.name else m.name
            if not rel.endswith((".c", ".h")) or not rel.startswith(KERNEL_DIRS):
                continue
            if rel.startswith("fs/") and rel.count("/") > 1:  # fs/*.c only, not every filesystem
                continue
            if m.size > 120_000 or m.size < 500:
                continue
            top = next(d for d in KERNEL_DIRS if rel.startswith(d))
            if used[top] >= share:
                continue
            data = tf.extractfile(m).read().decode("utf-8", "replace")
            used[top] += len(data)
            yield rel, clean(data)


TAG_RE = re.compile(r"<[^>]+>")


def strip_html(s):
    s = re.sub(r"(?is)<(script|style|head)[^>]*>.*?</\1>", " ", s)
    s = re.sub(r"(?i)<br\s*/?>|</p>|</div>|</h\d>|</li>|</tr>|</pre>|</dt>|</dd>", "\n", s)
    s = TAG_RE.sub("", s)
    s = html.unescape(s)
    s = re.sub(r"[ \t]+\n", "\n", s)
    s = re.sub(r"\n[ \t]*\n[\s]*\n+", "\n\n", s)
    return s


def prose_docs():
    # Python documentation (reStructuredText source, which is mostly plain prose)
    for d in PY_DOC_DIRS:
        root = os.path.join(PY_DOC, d)
        for dp, dn, fn in sorted(os.walk(root)):
            dn.sort()
            for f in sorted(fn):
                if f.endswith(".rst.txt"):
                    p = os.path.join(dp, f)
                    yield p, clean(open(p, encoding="utf-8", errors="replace").read()[:PROSE_FILE_MAX])
    # Debian Reference: one HTML file per chapter
    for f in sorted(os.listdir(DEBREF)):
        if f.endswith(".en.html"):
            p = os.path.join(DEBREF, f)
            yield p, clean(strip_html(open(p, encoding="utf-8", errors="replace").read()))
    # GNU standards: split into sections so the file-level split has something to hold out
    for p in GNU_STD:
        if os.path.exists(p):
            txt = gzip.open(p, "rt", encoding="utf-8", errors="replace").read()
            parts = re.split(r"\n(?=\d+(?:\.\d+)* [A-Z][^\n]*\n[=*\-]+\n)", txt)
            for i, part in enumerate(parts):
                if len(part) > 200:
                    yield f"{p}#{i}", clean(part)
    # fortunes: each cookie is a tiny document; group 40 per document
    for f in FORTUNE_FILES:
        p = os.path.join(FORTUNES, f)
        if not os.path.exists(p):
            continue
        cookies = [c.strip("\n") for c in open(p, encoding="utf-8", errors="replace").read().split("\n%\n")]
        cookies = [c for c in cookies if c.strip()]
        for i in range(0, len(cookies), 40):
            yield f"{p}#{i // 40}", clean("\n\n".join(cookies[i:i + 40]))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=".corpus")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    manifest = {"packages": {p: pkg_version(p) for p in PACKAGES},
                "val_percent": VAL_PERCENT, "files": {"code": [], "prose": []}, "stats": {}}
    for kind, gen in (("code", code_docs), ("prose", prose_docs)):
        outs = {s: open(os.path.join(a.out, f"{s}_{kind}.jsonl"), "w", encoding="utf-8")
                for s in ("train", "val")}
        st = {"train": [0, 0], "val": [0, 0]}
        for name, text in gen():
            split = "val" if is_val(name) else "train"
            outs[split].write(json.dumps({"src": name, "text": text}, ensure_ascii=False) + "\n")
            st[split][0] += 1
            st[split][1] += len(text.encode("utf-8"))
            manifest["files"][kind].append([name, split, len(text)])
        for f in outs.values():
            f.close()
        manifest["stats"][kind] = {s: {"docs": v[0], "bytes": v[1]} for s, v in st.items()}
        print(kind, manifest["stats"][kind], file=sys.stderr)
    with open(os.path.join(a.out, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1)


if __name__ == "__main__":
    main()
