"""Minimal TAP emitter and process helpers shared by the end-to-end test scripts."""
import atexit
import os
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NEXTN = os.environ.get("NEXTN", os.path.join(ROOT, "build", "nextn"))
if not os.path.isabs(NEXTN):
    NEXTN = os.path.join(ROOT, NEXTN)
PY = "/usr/bin/python3"


class Tap:
    def __init__(self):
        self.n = 0
        self.failed = 0

    def ok(self, cond, name, diag=None):
        self.n += 1
        if not cond:
            self.failed += 1
        print(("ok" if cond else "not ok") + f" {self.n} - {name}", flush=True)
        if diag and not cond:
            for line in str(diag).splitlines():
                print("# " + line, flush=True)
        return cond

    def note(self, msg):
        for line in str(msg).splitlines():
            print("# " + line, flush=True)

    def logits_close(self, name, a, b, tol):
        """Engine logits a against reference logits b: same shape, and the largest difference at
        most tol of the reference's range (a range over 1, so a degenerate model cannot pass)."""
        if a.shape != b.shape:
            return self.ok(False, f"{name}: shape", f"engine {a.shape} vs reference {b.shape}")
        rng = float(b.max() - b.min())
        err = float(abs(a - b).max())
        return self.ok(err <= tol * rng and rng > 1.0, f"{name}: max |dlogit| {err:.2e} vs range {rng:.2f}")

    def done(self):
        print(f"1..{self.n}", flush=True)
        sys.exit(1 if self.failed else 0)


def scratch(prefix):
    """A temporary directory removed when the script exits, whether its checks passed, failed or
    raised (a failing run must not leave its models behind in /tmp)."""
    d = tempfile.mkdtemp(prefix=prefix)
    atexit.register(shutil.rmtree, d, True)
    return d


def run(args, check=True, **kw):
    r = subprocess.run(args, capture_output=True, text=True, cwd=ROOT, **kw)
    if check and r.returncode != 0:
        raise RuntimeError(f"{' '.join(map(str, args))} failed ({r.returncode}):\n{r.stderr[-3000:]}")
    return r


def nextn(*args, check=True):
    return run([NEXTN, *map(str, args)], check=check)
