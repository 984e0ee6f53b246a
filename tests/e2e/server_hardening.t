#!/usr/bin/python3
"""`nextn serve` against hostile or careless clients, on loopback: slow clients that drip their
headers (a deadline for the request head, connections kept for /health, a per-address limit),
requests that ask for too much work or too deep/large JSON, ambiguous or malformed framing (raw
sockets: one well-formed error each), an empty API key, Host / Origin / content-type checks and
CORS preflights, reserved chat_template_kwargs, the key checked before 404/405, a NUL in the slot
id, a stream whose client never reads (cancelled, memory bounded), and SIGTERM with a stream in
flight (drained: an error event, [DONE] and the chunked body's end)."""
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "server"))
from serverlib import Server, curl, long_context_model, metric, skip_all_unless_ready  # noqa: E402
from tap import NEXTN, Tap, scratch  # noqa: E402

skip_all_unless_ready()
t = Tap()


def connect(port, timeout=10.0, rcvbuf=None):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if rcvbuf:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    s.settimeout(timeout)
    s.connect(("127.0.0.1", port))
    return s


def read_all(s, limit=1 << 22):
    """Bytes until the peer closes (or the socket's timeout passes)."""
    out = b""
    try:
        while len(out) < limit:
            d = s.recv(65536)
            if not d:
                break
            out += d
    except (socket.timeout, ConnectionResetError):
        pass
    return out


def parse(raw):
    """(status, headers, body) of one HTTP/1.1 response; a chunked body is decoded and must end
    with its zero-length chunk (else the body is None)."""
    head, sep, rest = raw.partition(b"\r\n\r\n")
    if not sep:
        return 0, {}, None
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ", 2)
    status = int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else 0
    hdrs = {}
    for ln in lines[1:]:
        k, _, v = ln.partition(":")
        hdrs[k.strip().lower()] = v.strip()
    if hdrs.get("transfer-encoding", "").lower() == "chunked":
        body = b""
        while True:
            size_line, sep, rest = rest.partition(b"\r\n")
            if not sep:
                return status, hdrs, None
            n = int(size_line.split(b";")[0] or b"0", 16)
            if n == 0:
                return status, hdrs, body if rest.startswith(b"\r\n") else None
            body, rest = body + rest[:n], rest[n + 2:]
    if "content-length" in hdrs:
        n = int(hdrs["content-length"])
        return status, hdrs, rest[:n] if len(rest) >= n else None
    return status, hdrs, rest


def raw_request(port, data, timeout=10.0):
    s = connect(port, timeout)
    s.sendall(data)
    out = read_all(s)
    s.close()
    return out


def well_formed_error(raw, status, code):
    st, h, body = parse(raw)
    try:
        e = json.loads(body)["error"]
    except (TypeError, ValueError, KeyError):
        e = {}
    return st == status and body is not None and e.get("code") == code, f"{raw[:600]!r}"


def post(base, path, body, **kw):
    return curl(base + path, body=body, **kw)


def error_code(r):
    return r.error().get("code")


# ---------------------------------------------------------------- access: the API key
def refused(args, env=None):
    """True when `nextn serve ARGS` exits non-zero with a message naming `what` (it must not
    start: a server still running after 20 s is stopped and counts as a failure)."""
    p = subprocess.Popen([NEXTN, "serve", "--host", "127.0.0.1", "--port", "0", *args], env=env,
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        _, err = p.communicate(timeout=20)
    except subprocess.TimeoutExpired:
        p.kill()
        _, err = p.communicate()
        return False, "it started serving"
    return p.returncode != 0, err[-300:]


good, diag = refused(["--api-key", ""])
t.ok(good and "empty" in diag, "--api-key '' is an error, not 'no key'", diag)
good, diag = refused([], env=dict(os.environ, NEXTN_API_KEY=""))
t.ok(good and "NEXTN_API_KEY" in diag, "an empty NEXTN_API_KEY is an error", diag)

slots = scratch(prefix="nextn-hardening-")
srv = Server("--slot-save-path", slots, "--max-request-tokens", 20000, "--max-unsent", "64k")
B, P = srv.base, srv.port

# ---------------------------------------------------------------- framing (raw sockets)
body = b'{"prompt": "hi"}'
for name, extra in [("two Content-Length headers", b"Content-Length: %d\r\nContent-Length: 3\r\n" % len(body)),
                    ("Content-Length with Transfer-Encoding",
                     b"Content-Length: %d\r\nTransfer-Encoding: chunked\r\n" % len(body))]:
    raw = raw_request(P, b"POST /tokenize HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n" +
                      extra + b"\r\n" + body)
    good, diag = well_formed_error(raw, 400, "ambiguous_framing")
    t.ok(good, f"{name}: a well-formed 400 ambiguous_framing", diag)


def one_reply(raw, status, code):
    """raw is exactly one well-formed HTTP/1.1 error response (one status line, the body its
    Content-Length says, nothing after it) with this status and error code, announcing a close."""
    good, diag = well_formed_error(raw, status, code)
    st, h, _ = parse(raw)
    n = int(h.get("content-length", "-1")) if h.get("content-length", "").isdigit() else -1
    head_len = raw.find(b"\r\n\r\n") + 4
    return (good and raw.count(b"HTTP/1.") == 1 and len(raw) == head_len + n and
            h.get("connection", "").lower() == "close"), diag


# Lengths libmicrohttpd's own parser refuses (signs, non-digits, blanks, empty, past 64 bits):
# the server answers them itself, once, and closes; the next connection is served.
clen_cases = [(v, 400, "ambiguous_framing") for v in
              (b"-5", b"+5", b"5x", b"5 5", b"", b"0x10", b"1e3", b"5,5")]
clen_cases += [(v, 413, "request_too_large") for v in
               (b"99999999999999999999", b"18446744073709551616", b"9999999999999999")]
for v, status, code in clen_cases:
    raw = raw_request(P, b"POST /tokenize HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                      b"Content-Length: " + v + b"\r\n\r\n" + body)
    good, diag = one_reply(raw, status, code)
    t.ok(good, f"Content-Length {v.decode()!r}: one well-formed {status} {code}", diag)
# the same after a request answered on the same connection (kept alive, then pipelined)
ok_req = (b"POST /tokenize HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
          b"Content-Length: %d\r\n\r\n" % len(body) + body)
bad_req = (b"POST /tokenize HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
           b"Content-Length: -5\r\n\r\n" + body)
s = connect(P)
s.sendall(ok_req)
first = b""
while parse(first)[2] is None and len(first) < 65536:
    d = s.recv(65536)
    if not d:
        break
    first += d
s.sendall(bad_req)
raw = read_all(s)
s.close()
good, diag = one_reply(raw, 400, "ambiguous_framing")
t.ok(parse(first)[0] == 200 and good, "kept alive: a served request, then one 400 for Content-Length -5",
     repr(first[:200]) + "\n" + diag)
raw = raw_request(P, ok_req + bad_req)
st, _, first_body = parse(raw)
rest = raw[raw.find(b"\r\n\r\n") + 4 + len(first_body or b""):]
good, diag = one_reply(rest, 400, "ambiguous_framing")
t.ok(st == 200 and good, "pipelined: 200, then one 400 for Content-Length -5", raw[:900])
# answered before the body (which is never read): the client may see its upload cut
s = connect(P)
try:
    s.sendall(b"POST /tokenize HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
              b"Content-Length: -1\r\n\r\n" + b" " * (1 << 21))
except (BrokenPipeError, ConnectionResetError):
    pass
raw = read_all(s)
s.close()
good, diag = one_reply(raw, 400, "ambiguous_framing")
t.ok(good, "Content-Length -1 before a 2 MB body: one 400, the body unread", diag)
raw = raw_request(P, b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
t.ok(parse(raw)[0] == 200 and srv.alive(), "after malformed lengths, a new connection is served", raw[:300])
raw = raw_request(P, b"POST /tokenize HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                  b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(body) + body)
t.ok(parse(raw)[0] == 200, "one Content-Length is served", raw[:300])

# ---------------------------------------------------------------- Host, Origin, content type
r = curl(B + "/v1/models", headers=["Host: rebind.example:8080"])
t.ok(r.status == 403 and error_code(r) == "host_not_allowed", "without a key, a foreign Host is refused",
     r.body[:300])
r = curl(B + "/v1/models", headers=[f"Host: localhost:{P}"])
t.ok(r.status == 200, "Host localhost is served", r.body[:300])
r = curl(B + "/v1/models", headers=["Origin: http://evil.example"])
t.ok(r.status == 403 and error_code(r) == "origin_not_allowed", "a cross-origin request is refused",
     r.body[:300])
r = curl(B + "/v1/completions", method="OPTIONS", headers=["Origin: http://evil.example",
                                                          "Access-Control-Request-Method: POST"])
t.ok(r.status == 403 and "access-control-allow-origin" not in r.headers, "a preflight from a foreign origin: 403",
     f"{r.status} {r.headers}")
for ctype in (b"Content-Type: text/plain\r\n", b"", b"Content-Type: application/json\r\nContent-Type: text/plain\r\n"):
    raw = raw_request(P, b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n" + ctype +
                      b"Content-Length: %d\r\n\r\n" % len(body) + body)
    good, diag = well_formed_error(raw, 415, "unsupported_media_type")
    t.ok(good, f"a body sent as {ctype.decode().strip() or 'no type'!r} is refused (415)", diag)

# ---------------------------------------------------------------- chat_template_kwargs, slot id
for name in ("messages", "bos_token", "add_generation_prompt", "raise_exception"):
    r = post(B, "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1,
                                         "chat_template_kwargs": {name: []}})
    t.ok(r.status == 400 and r.error().get("param") == "chat_template_kwargs" and name in r.error().get("message", ""),
         f"chat_template_kwargs may not set {name}", r.body[:300])
r = post(B, "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1,
                                     "chat_template_kwargs": {"enable_thinking": False}})
t.ok(r.status == 200, "other chat_template_kwargs pass", r.body[:300])
r = curl(B + "/slots/0%00?action=erase", method="POST")
t.ok(r.status == 400 and error_code(r) == "invalid_slot", "/slots/0%00 is not slot 0", r.body[:300])
r = curl(B + "/slots/0?action=erase", method="POST")
t.ok(r.status == 200, "/slots/0 erases", r.body[:300])

# ---------------------------------------------------------------- work and JSON size limits
junk = "[" + ",".join(["[]"] * 200000) + "]"
r = curl(B + "/v1/completions", raw='{"prompt": "hi", "max_tokens": 1, "junk": %s}' % junk)
t.ok(r.status == 400 and error_code(r) == "json_too_large", "200k empty arrays in an unknown field: 400",
     r.body[:300])
r = curl(B + "/tokenize", raw='{"prompt": "hi", "junk": %s}' % ("[" * 100 + "]" * 100))
t.ok(r.status == 400 and error_code(r) == "json_too_deep", "arrays nested 100 deep: 400", r.body[:300])
r = post(B, "/v1/completions", {"prompt": [[1, 2, 3]] * 64, "max_tokens": 1})
t.ok(r.status == 200, "64 prompts of token ids pass", r.body[:300])

# ---------------------------------------------------------------- a stream nobody reads
rss = lambda pid: int([ln for ln in open(f"/proc/{pid}/status") if ln.startswith("VmRSS")][0].split()[1]) // 1024
cancelled0 = metric(B, "nextn_cancelled_total") or 0
rss0 = rss(srv.proc.pid)
req = {"messages": [{"role": "user", "content": "Tell me everything."}], "n": 16, "max_tokens": 900,
       "ignore_eos": True, "temperature": 1.0, "logprobs": True, "top_logprobs": 20, "stream": True}
data = json.dumps(req).encode()
stalled = connect(P, timeout=5, rcvbuf=4096)
stalled.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                b"Content-Length: %d\r\n\r\n" % len(data) + data)
peak, idle = rss0, False
for _ in range(3000):  # until the request ends (cancelled, or finished: a failure); 300 s at most
    time.sleep(0.1)
    peak = max(peak, rss(srv.proc.pid))
    h = curl(B + "/health").json()
    if h["active"] == 0 and h["queued"] == 0:
        idle = True
        break
cancelled = (metric(B, "nextn_cancelled_total") or 0) - cancelled0
t.ok(idle and cancelled >= 1, "a stream whose client never reads is cancelled", f"idle {idle}, cancels {cancelled}")
t.ok(peak - rss0 < 64, f"and the server's memory stays bounded (+{peak - rss0} MB)", peak - rss0)
stalled.close()
t.ok(curl(B + "/health").status == 200, "the server serves on")
srv.stop()

# ---------------------------------------------------------------- slow clients
srv = Server("--max-connections", 8, "--max-conns-per-ip", 0, "--header-timeout", 2, "--max-request-tokens", 100)
B, P = srv.base, srv.port
stop_drip = threading.Event()


def drip(s):
    """A client sending one header line every half second, never finishing its head."""
    try:
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        k = 0
        while not stop_drip.is_set():
            s.sendall(b"X-Slow-%d: 1\r\n" % k)
            k += 1
            time.sleep(0.5)
    except OSError:
        pass


slow = [connect(P, timeout=8) for _ in range(8)]
threads = [threading.Thread(target=drip, args=(s,), daemon=True) for s in slow]
for th in threads:
    th.start()
time.sleep(0.3)
r = curl(B + "/health", timeout=5)
t.ok(r.status == 200, "8 slow clients fill --max-connections 8: /health still answers", f"{r.status} {r.body[:200]}")
closed = 0
for s in slow:  # each is cut at its head's deadline (2 s), though it keeps sending
    try:
        s.recv(4096)  # the end of the stream (or an error reply): the server ended it
        closed += 1
    except socket.timeout:
        pass
    except OSError:
        closed += 1
t.ok(closed == 8, "every dripping client is cut at the head deadline", closed)
stop_drip.set()
r = post(B, "/v1/completions", {"prompt": "Count: 1, 2,", "max_tokens": 4, "temperature": 0}, timeout=30)
t.ok(r.status == 200, "then real requests are served", r.body[:300])
r = post(B, "/v1/completions", {"prompt": "hi", "n": 2, "max_tokens": 60})
t.ok(r.status == 400 and "100" in r.error().get("message", ""), "--max-request-tokens 100: n 2 x 60 is refused",
     r.body[:300])
srv.stop()

srv = Server("--max-conns-per-ip", 2)
B, P = srv.base, srv.port
held = [connect(P) for _ in range(2)]
for s in held:  # each served once and kept alive, so the server surely counts it
    s.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    t.ok(s.recv(4096).startswith(b"HTTP/1.1 200"), "a kept-alive connection")
raw = raw_request(P, b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", timeout=5)
t.ok(parse(raw)[0] == 0, "--max-conns-per-ip 2: a third connection from the address gets nothing", raw[:200])
for s in held:
    s.close()
served = False
for _ in range(100):  # the server notices the closes when their threads next read
    time.sleep(0.1)
    served = curl(B + "/health").status == 200
    if served:
        break
t.ok(served, "and is served once the others close")
r = post(B, "/v1/completions", {"prompt": ["Count:"] * 64, "n": 16, "max_tokens": 50})
t.ok(r.status == 400 and r.error().get("param") == "max_tokens" and error_code(r) == "request_too_large"
     and "--max-request-tokens" in r.error().get("message", ""),
     "64 prompts x n 16 x 50 tokens: 400 naming the limit (the default, 32768)", r.body[:400])
srv.stop()

# ---------------------------------------------------------------- with a key: 401 first; CORS
srv = Server("--api-key", "sesame", "--cors", "http://app.example")
B = srv.base
r = curl(B + "/no/such/route")
t.ok(r.status == 401, "without the key an unknown route is 401, not 404", r.status)
r = curl(B + "/v1/models", method="DELETE")
t.ok(r.status == 401, "without the key a wrong method is 401, not 405", r.status)
r = curl(B + "/no/such/route", headers=["Authorization: Bearer sesame"])
t.ok(r.status == 404, "with it, 404", r.status)
r = curl(B + "/v1/models", headers=["Authorization: Bearer sesame", "Origin: http://app.example"])
t.ok(r.status == 200 and r.headers.get("access-control-allow-origin") == "http://app.example",
     "--cors: the allowed origin is served with CORS headers", r.headers)
r = curl(B + "/v1/chat/completions", method="OPTIONS",
         headers=["Origin: http://app.example", "Access-Control-Request-Method: POST",
                  "Access-Control-Request-Headers: authorization, content-type"])
t.ok(r.status == 204 and r.headers.get("access-control-allow-origin") == "http://app.example"
     and "POST" in r.headers.get("access-control-allow-methods", "")
     and "authorization" in r.headers.get("access-control-allow-headers", "").lower(),
     "a preflight from it is answered without the key", f"{r.status} {r.headers}")
r = curl(B + "/v1/models", headers=["Authorization: Bearer sesame", "Origin: http://other.example"])
t.ok(r.status == 403, "another origin is refused", r.status)
srv.stop()

# ---------------------------------------------------------------- SIGTERM drains streams
srv = Server("-m", long_context_model(), "--ctx", "16384", "--shutdown-grace", "1")
data = json.dumps({"prompt": "Tell me everything:", "max_tokens": 16000, "ignore_eos": True, "stream": True,
                   "temperature": 0}).encode()
s = connect(srv.port, timeout=30)
s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
          b"Content-Length: %d\r\n\r\n" % len(data) + data)
first = s.recv(4096)
time.sleep(0.5)
t0 = time.time()
srv.proc.send_signal(signal.SIGTERM)
raw = first + read_all(s)
code = srv.proc.wait(timeout=60)
st, h, body = parse(raw)
text = (body or b"").decode(errors="replace")
t.ok(st == 200 and body is not None, "SIGTERM: the stream's chunked body ends properly", raw[-300:])
t.ok('"shutting_down"' in text and text.rstrip().endswith("data: [DONE]"),
     "with an error event, then [DONE]", text[-400:])
t.ok(code == 0, f"and the server exits cleanly ({time.time() - t0:.1f} s)", code)
srv.stop()

t.done()
