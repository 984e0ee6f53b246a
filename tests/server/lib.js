// Shared by the Node end-to-end server tests: TAP output, and starting/stopping `nextn serve`
// on an ephemeral loopback port (read from its start-up line). A server started here is killed
// when the test exits, whatever the reason.
'use strict';
const { spawn } = require('child_process');
const fs = require('fs');
const path = require('path');

const ROOT = path.resolve(__dirname, '..', '..');
let NEXTN = process.env.NEXTN || path.join(ROOT, 'build', 'nextn');
if (!path.isAbsolute(NEXTN)) NEXTN = path.join(ROOT, NEXTN);
const MODEL = process.env.NEXTN_TEST_MODEL || path.join(ROOT, 'models', 'nextn-hy3-tiny');

let n = 0, failed = 0;
function ok(cond, name, diag) {
  n++;
  if (!cond) failed++;
  console.log(`${cond ? 'ok' : 'not ok'} ${n} - ${name}`);
  if (!cond && diag !== undefined)
    for (const line of String(typeof diag === 'string' ? diag : JSON.stringify(diag)).split('\n'))
      console.log('# ' + line);
  return cond;
}
function is(got, want, name) {
  return ok(got === want, name, `got ${JSON.stringify(got)}, want ${JSON.stringify(want)}`);
}
function note(msg) { for (const line of String(msg).split('\n')) console.log('# ' + line); }
function done() {
  console.log(`1..${n}`);
  stopAll();
  process.exit(failed ? 1 : 0);
}

function skipAllUnlessReady() {
  let why = null;
  try { fs.accessSync(NEXTN, fs.constants.X_OK); } catch { why = `${NEXTN} is not built`; }
  if (!why && !fs.existsSync(path.join(MODEL, 'config.json'))) why = `no model at ${MODEL}`;
  if (why) {
    console.log(`not ok 1 - prerequisites: ${why}\n1..1`);
    process.exit(1);
  }
}

const servers = new Set();
function stopAll() { for (const s of servers) s.stop(); }
process.on('exit', stopAll);
for (const sig of ['SIGINT', 'SIGTERM', 'SIGHUP'])
  process.on(sig, () => { stopAll(); process.exit(128); });

// Starts `nextn serve` and resolves to {port, base, proc, stop(), output()}.
// A view of the default model (its files linked, not copied) whose config allows `positions`
// positions, so a generation can run for seconds on any machine: tests of queues and
// cancellation must not depend on how fast the engine is. Text past the trained length is
// nonsense, which those tests do not look at.
function longContextModel(positions = 16384) {
  const os = require('os');
  const d = fs.mkdtempSync(path.join(os.tmpdir(), 'nextn-longctx-'));
  for (const f of fs.readdirSync(MODEL)) {
    if (f !== 'config.json') fs.symlinkSync(path.join(MODEL, f), path.join(d, f));
  }
  const cfg = JSON.parse(fs.readFileSync(path.join(MODEL, 'config.json'), 'utf8'));
  cfg.max_position_embeddings = positions;
  fs.writeFileSync(path.join(d, 'config.json'), JSON.stringify(cfg));
  process.on('exit', () => fs.rmSync(d, { recursive: true, force: true }));
  return d;
}

function startServer(args = [], timeoutMs = 180000, model = MODEL) {
  return new Promise((resolve, reject) => {
    const proc = spawn(NEXTN, ['serve', '-m', model, '--host', '127.0.0.1', '--port', '0', ...args],
                       { cwd: ROOT, stdio: ['ignore', 'pipe', 'pipe'] });
    let out = '';
    const srv = {
      proc,
      output: () => out,
      stop() {
        if (proc.exitCode === null && proc.signalCode === null) proc.kill('SIGTERM');
        servers.delete(srv);
      },
    };
    servers.add(srv);
    const timer = setTimeout(() => { srv.stop(); reject(new Error('server did not start:\n' + out)); },
                             timeoutMs);
    const onData = (d) => {
      out += d.toString();
      const m = out.match(/listening on http:\/\/[^ ]*:(\d+)\//);
      if (m && !srv.port) {
        clearTimeout(timer);
        srv.port = Number(m[1]);
        srv.base = `http://127.0.0.1:${srv.port}`;
        resolve(srv);
      }
    };
    proc.stdout.on('data', onData);
    proc.stderr.on('data', onData);
    proc.on('exit', (code) => {
      servers.delete(srv);
      if (!srv.port) { clearTimeout(timer); reject(new Error(`server exited (${code}):\n${out}`)); }
    });
  });
}

// Waits until the server process has exited (after stop()).
function waitExit(srv, ms = 20000) {
  return new Promise((resolve) => {
    if (srv.proc.exitCode !== null || srv.proc.signalCode !== null) return resolve(srv.proc.exitCode);
    const t = setTimeout(() => { srv.proc.kill('SIGKILL'); }, ms);
    srv.proc.on('exit', (code) => { clearTimeout(t); resolve(code); });
  });
}

async function metric(base, name, headers = {}) {
  const text = await (await fetch(base + '/metrics', { headers })).text();
  for (const line of text.split('\n'))
    if (line.startsWith(name + ' ')) return Number(line.split(' ').pop());
  return null;
}

module.exports = { ROOT, NEXTN, MODEL, ok, is, note, done, skipAllUnlessReady, startServer, waitExit, metric,
  longContextModel };
