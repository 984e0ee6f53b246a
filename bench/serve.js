'use strict';
// What the server benches share: starting `nextn serve` on an ephemeral port, a view of a model
// without a tokenizer (the generated bench models) with the default model's tokenizer linked in,
// and percentiles.
const { spawn } = require('child_process');
const fs = require('fs');
const os = require('os');
const path = require('path');

const ROOT = path.resolve(__dirname, '..');
let NEXTN = process.env.NEXTN || path.join(ROOT, 'build', 'nextn');
if (!path.isAbsolute(NEXTN)) NEXTN = path.join(ROOT, NEXTN);

// `nextn serve ARGS` on 127.0.0.1 and a port of the kernel's choosing; resolves { proc, url } once
// it listens (the port read from its start-up line); stopped when this process exits.
function startNextn(args) {
  return new Promise((resolve, reject) => {
    const proc = spawn(NEXTN, ['serve', '--host', '127.0.0.1', '--port', '0', ...args],
                       { stdio: ['ignore', 'pipe', 'pipe'] });
    let out = '';
    const on = (d) => {
      out += d;
      const m = out.match(/listening on http:\/\/[^ ]*:(\d+)\//);
      if (m) resolve({ proc, url: `http://127.0.0.1:${m[1]}` });
    };
    proc.stdout.on('data', on);
    proc.stderr.on('data', on);
    proc.on('exit', (code) => reject(new Error(`server exited (${code}):\n${out}`)));
    process.on('exit', () => proc.kill('SIGTERM'));
  });
}

// dir itself when it has a tokenizer, else a directory in /tmp with dir's files and the default
// model's tokenizer files linked (removed when this process exits).
function tokenizerView(dir) {
  if (fs.existsSync(path.join(dir, 'tokenizer.json'))) return dir;
  const d = fs.mkdtempSync(path.join(os.tmpdir(), 'nextn-bench-view-'));
  for (const f of fs.readdirSync(dir)) fs.symlinkSync(path.join(dir, f), path.join(d, f));
  const tiny = path.join(ROOT, 'models', 'nextn-hy3-tiny');
  for (const f of ['tokenizer.json', 'tokenizer_config.json'])
    if (fs.existsSync(path.join(tiny, f)) && !fs.existsSync(path.join(d, f)))
      fs.symlinkSync(path.join(tiny, f), path.join(d, f));
  process.on('exit', () => fs.rmSync(d, { recursive: true, force: true }));
  return d;
}

// The p-th percentile of xs (nearest rank), NaN for none.
function pct(xs, p) {
  const s = [...xs].sort((a, b) => a - b);
  return s.length ? s[Math.min(s.length - 1, Math.max(0, Math.ceil((p / 100) * s.length) - 1))] : NaN;
}

module.exports = { ROOT, NEXTN, startNextn, tokenizerView, pct };
