#!/usr/bin/python3
"""Documentation references stay inside the tree: every `*.md` file name, `docs/...` path and
`§N` section reference in src/ include/ tools/ tests/ bench/ scripts/ fuzz/ models/ (model cards),
README.md and docs/ must name a file that exists, and a section that its headings number. A `§`
reference belongs to the last `.md` file named before it on its line; with none, to the file
itself inside docs/ and to docs/design.md elsewhere. In C sources only comments are read (`ms.md`
is a struct member). A tree with deliberately broken references checks the checker first.

Usage: tests/e2e/docs.t [ROOT] (default: this repository)."""
import os
import re
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tap import ROOT, Tap  # noqa: E402

SCAN = ("src", "include", "tools", "tests", "bench", "scripts", "fuzz", "docs", "README.md", "models")
# sample texts and data, not documentation
SKIP_DIRS = ("bench/texts", "tests/fixtures", "node_modules")
SKIP_EXT = (".json", ".npy", ".safetensors", ".bin")
# this checker's own fixtures are broken references on purpose
SELF = os.path.join("tests", "e2e", "docs.t")

MD_RE = re.compile(r"(?<![\w./-])((?:[\w.-]+/)*[\w-][\w.-]*\.md)(?![\w-])")
DOCS_RE = re.compile(r"(?<![\w./-])(docs/[\w./-]*[\w/])")
SECT_RE = re.compile(r"§\s*(\d+(?:\.\d+)*)")
HEAD_RE = re.compile(r"^#+\s+(\d+(?:\.\d+)*)\.?\s")


def c_comments(text):
    """(line, text) of every comment line of a C source; strings and char literals skipped."""
    out, i, n, line = [], 0, len(text), 1
    while i < n:
        ch = text[i]
        if ch == "\n":
            line += 1
            i += 1
        elif text.startswith("/*", i):
            end = text.find("*/", i + 2)
            end = n if end < 0 else end + 2
            for k, part in enumerate(text[i:end].split("\n")):
                out.append((line + k, part))
            line += text.count("\n", i, end)
            i = end
        elif text.startswith("//", i):
            end = text.find("\n", i)
            end = n if end < 0 else end
            out.append((line, text[i:end]))
            i = end
        elif ch in "\"'":
            j = i + 1
            while j < n and text[j] != ch and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            i = j + 1
        else:
            i += 1
    return out


def files(root):
    for top in SCAN:
        p = os.path.join(root, top)
        if os.path.isfile(p):
            yield top
            continue
        for d, dirs, names in os.walk(p):
            rel_d = os.path.relpath(d, root)
            dirs[:] = sorted(x for x in dirs if os.path.join(rel_d, x) not in SKIP_DIRS and x != "node_modules")
            for name in sorted(names):
                rel = os.path.join(rel_d, name)
                if not name.endswith(SKIP_EXT) and rel != SELF:
                    yield rel


def sections(root, rel, cache={}):
    key = (root, rel)
    if key not in cache:
        nums = set()
        with open(os.path.join(root, rel), encoding="utf-8") as f:
            fence = False
            for line in f:
                if line.startswith("```"):
                    fence = not fence
                m = None if fence else HEAD_RE.match(line)
                if m:
                    nums.add(m.group(1))
        cache[key] = nums
    return cache[key]


def resolve_md(root, rel_file, name):
    """The tree path of an .md reference, or None: relative to the referring file's directory,
    the root, or docs/."""
    for base in (os.path.dirname(rel_file), "", "docs"):
        cand = os.path.normpath(os.path.join(base, name))
        if not cand.startswith("..") and os.path.isfile(os.path.join(root, cand)):
            return cand
    return None


def scan(root):
    """(problems, counts) for the tree at root; problems are 'file:line: message' strings."""
    problems, counts = [], {"files": 0, "md": 0, "docs": 0, "sections": 0}
    for rel in files(root):
        try:
            text = open(os.path.join(root, rel), encoding="utf-8").read()
        except (UnicodeDecodeError, OSError):
            continue
        counts["files"] += 1
        lines = c_comments(text) if rel.endswith((".c", ".h")) else enumerate(text.split("\n"), 1)
        in_docs = rel.startswith("docs" + os.sep) and rel.endswith(".md")
        for ln, s in lines:
            where = f"{rel}:{ln}"
            mds = [(m.start(), m.group(1)) for m in MD_RE.finditer(s)]
            for _, name in mds:
                counts["md"] += 1
                if not resolve_md(root, rel, name):
                    problems.append(f"{where}: {name}: no such file in the tree")
            for m in DOCS_RE.finditer(s):
                counts["docs"] += 1
                path = m.group(1).rstrip(".")
                if not os.path.exists(os.path.join(root, path)):
                    problems.append(f"{where}: {path}: no such file in the tree")
            for m in SECT_RE.finditer(s):
                counts["sections"] += 1
                before = [name for pos, name in mds if pos < m.start()]
                if before:
                    target = resolve_md(root, rel, before[-1])
                    label = before[-1]
                else:
                    target = rel if in_docs else os.path.join("docs", "design.md")
                    label = target
                if not target or not os.path.isfile(os.path.join(root, target)):
                    problems.append(f"{where}: §{m.group(1)}: {label} is not in the tree")
                elif m.group(1) not in sections(root, target):
                    problems.append(f"{where}: §{m.group(1)}: {target} has no such section")
    return list(dict.fromkeys(problems)), counts


def write(root, rel, text):
    path = os.path.join(root, rel)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)


t = Tap()

# The checker on a tree with known good and broken references.
with tempfile.TemporaryDirectory(prefix="nextn-docs-") as tmp:
    write(tmp, "docs/design.md", "# D\n\n## 1. One\n\n### 1.2 Two\n\n```\n## 7. not a heading\n```\n")
    write(tmp, "docs/server.md", "# S\n\n## 3. Three\n\nSee §3 and docs/design.md §1.2; [d](design.md).\n")
    write(tmp, "src/a.c", '/* the spec (hy_v3.md §2) */\nint f(void) { return ms.md; }\n'
                          'const char *s = "/* docs/gone.md */";\n// docs/design.md §1, §1.3\n')
    write(tmp, "tools/x.py", "# docs/design.md §1.2 and docs/missing.md\n")
    write(tmp, "README.md", "[design](docs/design.md) §1–§7, docs/server.md §3 and bench/MEASUREMENTS.md\n")
    got, _ = scan(tmp)
    want = [
        "src/a.c:1: hy_v3.md: no such file in the tree",
        "src/a.c:1: §2: hy_v3.md is not in the tree",
        "src/a.c:4: §1.3: docs/design.md has no such section",
        "tools/x.py:1: docs/missing.md: no such file in the tree",
        "README.md:1: §7: docs/design.md has no such section",
        "README.md:1: bench/MEASUREMENTS.md: no such file in the tree",
    ]
    t.ok(sorted(got) == sorted(want), "the checker flags exactly the broken references of a test tree",
         "got:\n  " + "\n  ".join(sorted(got)) + "\nwant:\n  " + "\n  ".join(sorted(want)))

root = os.path.abspath(sys.argv[1]) if len(sys.argv) > 1 else ROOT
problems, counts = scan(root)
t.note(f"{root}: {counts['files']} files, {counts['md']} .md names, {counts['docs']} docs/ paths, "
       f"{counts['sections']} § references")
t.ok(counts["files"] > 100 and counts["docs"] > 0 and counts["sections"] > 0,
     "the tree's sources and documents were read and hold references")
t.ok(os.path.isfile(os.path.join(root, "docs", "design.md")) and len(sections(root, "docs/design.md")) > 10,
     "docs/design.md exists with numbered sections")
t.ok(not problems, "every documentation reference in the tree resolves", "\n".join(problems))
t.done()
