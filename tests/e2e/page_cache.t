#!/usr/bin/python3
"""A model whose files the page cache holds in 4 KB pages (written just before: a download, a copy)
is cached anew at load, so it is mapped with 2 MB pages as a model read fresh from disk is
(docs/kernels.md, "Model files and huge pages").

The default model copied (the copy's pages are the ones its writes cached) and loaded by `nextn
bench`: with NX_RECACHE=0 the share of its weights on 2 MB pages is what the writes left; by
default the loader re-reads the file when that share is low and the kernel caches a window read
again in 2 MB pages, and then the share is that of a copy dropped from the cache and read fresh,
which itself is not re-read (the loader reads a file from its first 2 MB boundary on, so a fresh
read leaves no 4 KB window for the probe to find); the next load finds it cached so and reads
nothing again. Where the kernel caches files in 4 KB pages whatever happens, the loader leaves
the file be. Greedy output is the same either way."""
import os
import shutil
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tap import NEXTN, ROOT, Tap, nextn, run, scratch  # noqa: E402

t = Tap()
tmp = scratch(prefix="nextn-pagecache-")
model = os.path.join(ROOT, "models", "nextn-hy3-tiny")


def copy(name):
    d = os.path.join(tmp, name)
    shutil.copytree(model, d)
    return d


def drop(d):
    for f in os.listdir(d):
        fd = os.open(os.path.join(d, f), os.O_RDONLY)
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)


def load(d, **env):
    """(share of the weights on 2 MB pages, files re-read at load) of one `nextn bench` load."""
    r = run([NEXTN, "bench", "-m", d, "-n", "2", "--modes", "ar"], env={**os.environ, **env})
    for ln in r.stdout.splitlines():
        if ln.startswith("weights_on_2MB_pages="):
            kv = dict(x.split("=", 1) for x in ln.split())
            return float(kv["weights_on_2MB_pages"]), int(kv["recached_files"])
    raise RuntimeError("bench printed no weights_on_2MB_pages line:\n" + r.stdout)


fresh = copy("fresh")
drop(fresh)
s_fresh, r_fresh = load(fresh)
t.ok(r_fresh == 0, f"a model read fresh from disk is not read again (share {s_fresh:.2f}, re-read {r_fresh})")

s_off, r_off = load(copy("left"), NX_RECACHE="0")
t.ok(r_off == 0, f"NX_RECACHE=0: nothing re-read (share {s_off:.2f})")

written = copy("written")
s_on, r_on = load(written)
s_again, r_again = load(written)
t.note(f"2 MB share: read fresh {s_fresh:.2f}, as written {s_off:.2f}, re-read {s_on:.2f} ({r_on} files), "
       f"next load {s_again:.2f} ({r_again} files)")
if s_fresh >= 0.5:
    # the kernel caches files read from disk in 2 MB pages: the copy's load must end as well mapped,
    # re-reading the file when its writes left it worse (here: 4 KB pages throughout)
    t.ok(s_on >= s_fresh - 0.1, f"a written copy is mapped as one read fresh is ({s_on:.2f} against {s_fresh:.2f}; "
         f"{s_off:.2f} as written)")
    t.ok(r_on == 1 or s_off >= s_fresh - 0.1, f"the copy was re-read ({r_on} files; as written: {s_off:.2f})")
else:
    # 4 KB pages whatever happens: a re-read gains nothing, and the probe declines
    t.ok(r_on == 0, f"no re-read where it gains nothing (fresh {s_fresh:.2f}, written {s_off:.2f}, re-read {r_on})")
    t.ok(abs(s_on - s_off) < 0.1, f"the copy left as it was ({s_on:.2f})")
t.ok(r_again == 0 and s_again >= s_on - 0.05, f"the next load reads nothing again ({s_again:.2f}, {r_again} files)")

want = nextn("run", "-m", model, "-p", "def fib(n):", "-n", "12", "--temp", "0").stdout
got = nextn("run", "-m", copy("run"), "-p", "def fib(n):", "-n", "12", "--temp", "0").stdout
t.ok(got == want and len(want) > 0, "greedy output of a re-read copy is the original's", got)
t.done()
