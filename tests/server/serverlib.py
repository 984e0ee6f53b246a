"""Starts and stops `nextn serve` for the end-to-end server tests and talks to it with curl.

The server binds an ephemeral loopback port (--port 0) and the port is read from its start-up
line, so tests never race for a port. Every server started here is stopped at exit, also when
the test dies of an exception or a signal."""
import atexit
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "e2e"))
from tap import NEXTN, ROOT  # noqa: E402

MODEL = os.environ.get("NEXTN_TEST_MODEL", os.path.join(ROOT, "models", "nextn-hy3-tiny"))
_servers = []


def long_context_model(positions=16384):
    """A view of the default model (its files linked, not copied) whose config allows `positions`
    positions, so a generation can run for seconds on any machine: tests of timeouts and queues
    must not depend on how fast the engine is. The text past the trained length is nonsense,
    which those tests do not look at."""
    d = tempfile.mkdtemp(prefix="nextn-longctx-")
    for f in os.listdir(MODEL):
        if f != "config.json":
            os.symlink(os.path.join(MODEL, f), os.path.join(d, f))
    cfg = json.load(open(os.path.join(MODEL, "config.json")))
    cfg["max_position_embeddings"] = positions
    json.dump(cfg, open(os.path.join(d, "config.json"), "w"))
    atexit.register(lambda: subprocess.run(["rm", "-rf", d]))
    return d


def skip_all_unless_ready():
    """Fails the script (never skips) when the binary or the model is not there."""
    why = None
    if not os.access(NEXTN, os.X_OK):
        why = f"{NEXTN} is not built"
    elif not os.path.exists(os.path.join(MODEL, "config.json")):
        why = f"no model at {MODEL}"
    if why:
        print(f"not ok 1 - prerequisites: {why}\n1..1", flush=True)
        sys.exit(1)


class Server:
    def __init__(self, *args, startup_timeout=180):
        self.log = tempfile.NamedTemporaryFile(prefix="nextn-serve-", suffix=".log", delete=False)
        _logs.append(self.log.name)
        cmd = [NEXTN, "serve", "-m", MODEL, "--host", "127.0.0.1", "--port", "0", *map(str, args)]
        self.proc = subprocess.Popen(cmd, cwd=ROOT, stdout=self.log, stderr=subprocess.STDOUT)
        _servers.append(self)
        deadline = time.time() + startup_timeout
        self.port = None
        while time.time() < deadline:
            text = open(self.log.name, errors="replace").read()
            m = re.search(r"listening on http://[^ ]*:(\d+)/", text)
            if m:
                self.port = int(m.group(1))
                break
            if self.proc.poll() is not None:
                raise RuntimeError(f"nextn serve exited ({self.proc.returncode}):\n{text[-2000:]}")
            time.sleep(0.05)
        if self.port is None:
            raise RuntimeError("nextn serve did not start in time")
        self.base = f"http://127.0.0.1:{self.port}"

    def alive(self):
        return self.proc.poll() is None

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self in _servers:
            _servers.remove(self)
        return self.proc.returncode

    def output(self):
        return open(self.log.name, errors="replace").read()


_logs = []


def _stop_all(*_):
    for s in list(_servers):
        s.stop()


def _remove_logs():
    _stop_all()
    for name in _logs:
        try:
            os.unlink(name)
        except FileNotFoundError:
            pass


atexit.register(_remove_logs)
for _sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
    signal.signal(_sig, lambda signum, frame: (_stop_all(), sys.exit(128 + signum)))


class Reply:
    def __init__(self, status, headers, body):
        self.status = status
        self.headers = headers
        self.body = body

    def json(self):
        return json.loads(self.body)

    def error(self):
        """The OpenAI-style error object of the body, or {} when there is none."""
        try:
            return self.json().get("error") or {}
        except ValueError:
            return {}

    def events(self):
        """The data: payloads of an SSE body, in order (the final "[DONE]" included); comment
        blocks (": keep-alive") are skipped, as SSE clients skip them."""
        out = []
        for block in self.body.split("\n\n"):
            block = block.strip("\n")
            if not block or block.startswith(":"):
                continue
            assert block.startswith("data: "), f"not an SSE data line: {block[:80]!r}"
            out.append(block[6:])
        return out


def curl(url, body=None, method=None, headers=(), raw=None, timeout=120, extra=()):
    """One request with the curl binary; returns status, headers and body."""
    cmd = ["curl", "-sS", "-N", "-D", "-", "--max-time", str(timeout)]
    if method:
        cmd += ["-X", method]
    for h in headers:
        cmd += ["-H", h]
    data = raw if raw is not None else (json.dumps(body) if body is not None else None)
    if data is not None:
        cmd += ["-H", "Content-Type: application/json", "--data-binary", "@-"]
    cmd += list(extra) + [url]
    r = subprocess.run(cmd, input=data.encode() if isinstance(data, str) else data,
                       capture_output=True, timeout=timeout + 10)
    text = r.stdout.decode("utf-8", errors="replace")
    # skip interim "HTTP/1.1 100 Continue" blocks
    while text.startswith("HTTP/1.1 100"):
        text = text.split("\r\n\r\n", 1)[1]
    head, _, body_text = text.partition("\r\n\r\n")
    lines = head.split("\r\n")
    m = re.match(r"HTTP/\S+ (\d+)", lines[0]) if lines else None
    status = int(m.group(1)) if m else 0
    hdrs = {}
    for ln in lines[1:]:
        k, _, v = ln.partition(":")
        hdrs[k.strip().lower()] = v.strip()
    return Reply(status, hdrs, body_text)


def metric(base, name, headers=()):
    """A sample's value from /metrics (name may include labels), or None."""
    text = curl(base + "/metrics", headers=headers).body
    for ln in text.splitlines():
        if ln.startswith(name + " "):
            return float(ln.split()[-1])
    return None
