#!/usr/bin/python3
"""The library's folders form layers, and a header or source file includes only its own folder and
the layers below it: base < kernels, family < io, text, dist < model, constrain < decode < serve. The
programs in tools/ include the public API (include/nextn.h), the tools' declared interface
(src/nextn_tools.h) and their own headers, never a module header. Fails naming file:line."""
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tap import Tap  # noqa: E402

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
RANK = {"base": 0, "kernels": 1, "family": 1, "io": 2, "text": 2, "dist": 2, "model": 3, "constrain": 3, "decode": 4,
        "serve": 5}
INC = re.compile(r'^\s*#\s*include\s+"([^"]+)"')


def includes(path):
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            m = INC.match(line)
            if m:
                yield n, m.group(1)


def library_violations(root):
    bad, folders = [], set()
    src = os.path.join(root, "src")
    for folder in sorted(os.listdir(src)):
        d = os.path.join(src, folder)
        if not os.path.isdir(d):
            continue
        folders.add(folder)
        if folder not in RANK:
            bad.append(f"src/{folder}/: a folder without a layer (add it to RANK)")
            continue
        for fn in sorted(os.listdir(d)):
            if not fn.endswith((".c", ".h")):
                continue
            for n, inc in includes(os.path.join(d, fn)):
                top = inc.split("/")[0] if "/" in inc else None
                if top in RANK and top != folder and RANK[top] >= RANK[folder]:
                    bad.append(f"src/{folder}/{fn}:{n}: includes {inc} ({top} is not below {folder})")
    return bad, folders


def tool_violations(root):
    bad = []
    d = os.path.join(root, "tools", "cli")
    for fn in sorted(os.listdir(d)):
        if fn.endswith((".c", ".h")):
            for n, inc in includes(os.path.join(d, fn)):
                if "/" in inc:
                    bad.append(f"tools/cli/{fn}:{n}: includes {inc} (use nextn.h or nextn_tools.h)")
    return bad


t = Tap()
lib, folders = library_violations(ROOT)
t.ok(set(RANK) <= folders, "every layer names a folder of src/", str(sorted(set(RANK) - folders)))
t.ok(not lib, "src/: every include stays in its folder or goes down a layer", "\n".join(lib))
tools = tool_violations(ROOT)
t.ok(not tools, "tools/cli: only the public API, the tools' interface and local headers", "\n".join(tools))
t.done()
