#!/usr/bin/env node
// nextn's server against llama.cpp's (llama-server) on the same model and the same load: C
// concurrent streaming completions (C = 1 and 4, or 1, 2, 4, 8 without --quick) against
// `nextn serve --parallel P` (MTP drafts auto and off) and `llama-server -np P` (its slots batched
// as well), and against both with one slot (requests one at a time). The model is
// bench/llama_cpp.py's random DeepSeek-V3-architecture checkpoint with GLM-4.7-Flash's layer
// shapes: nextn serves its MLX 4-bit conversion, llama-server its Q4_0 GGUF (both 4.5 bits a
// weight). Prompts are token ids (the GGUF's vocabulary is byte-level filler), greedy, end of
// sequence ignored. Reports aggregate tokens/s, each stream's decode tokens/s, TTFT and the gaps
// between a stream's chunks (p50/p99).
//
//   node bench/server_llama_cpp.js --llama-cpp DIR [--work DIR] [--parallel 4] [--max-tokens 64]
//                                  [--gguf-type Q4_0] [--bits 4] [--threads 2] [--quick]
//
// Run bench/llama_cpp.py first (it writes the models into --work, default /tmp/nextn-bench-llamacpp).
'use strict';
const { spawn } = require('child_process');
const fs = require('fs');
const net = require('net');
const os = require('os');
const path = require('path');
const { sseChunks } = require('./sse');
const { startNextn, tokenizerView, pct } = require('./serve');

const args = process.argv.slice(2);
const opt = (name, def) => { const i = args.indexOf(name); return i >= 0 && i + 1 < args.length ? args[i + 1] : def; };
const LLAMA = opt('--llama-cpp', process.env.LLAMA_CPP_DIR);
const WORK = opt('--work', '/tmp/nextn-bench-llamacpp');
const P = Number(opt('--parallel', 4));
const MAX_TOKENS = Number(opt('--max-tokens', 64));
const GGUF = path.join(WORK, `model-${opt('--gguf-type', 'Q4_0')}.gguf`);
const MLX = path.join(WORK, `mlx-${opt('--bits', '4')}bit`);
const THREADS = opt('--threads', String(os.cpus().length));
const QUICK = args.includes('--quick');

// Eight prompts of 24 token ids each, the same for both servers.
const PROMPTS = [...Array(8).keys()].map((p) => [...Array(24).keys()].map((i) => 300 + ((p * 24 + i) * 7919) % 31000));

function freePort() {
  return new Promise((resolve) => {
    const s = net.createServer();
    s.listen(0, '127.0.0.1', () => { const p = s.address().port; s.close(() => resolve(p)); });
  });
}

// A server with `slots` slots: nextn on the MLX conversion (through a tokenizer view: the prompts
// are ids all the same), llama-server on the GGUF, resolved once it answers /health with 200.
let view = null; // made once for both nextn servers
async function start(engine, slots) {
  if (engine === 'nextn')
    return startNextn(['-m', view || (view = tokenizerView(MLX)), '--queue', '64', '--parallel', String(slots), '--ctx', '4096',
                       '--cache-ram', '0', '--threads', THREADS]);
  const port = await freePort();
  const proc = spawn(path.join(LLAMA, 'build', 'bin', 'llama-server'),
                     ['-m', GGUF, '--host', '127.0.0.1', '--port', String(port), '-np', String(slots),
                      '-c', String(4096 * slots), '-t', THREADS, '-tb', THREADS, '--cont-batching', '--no-warmup'],
                     { stdio: ['ignore', 'ignore', 'pipe'] });
  let err = '';
  proc.stderr.on('data', (d) => { err = (err + d).slice(-4000); });
  process.on('exit', () => proc.kill('SIGTERM'));
  const url = `http://127.0.0.1:${port}`;
  for (let i = 0; i < 600; i++) {
    if (proc.exitCode !== null) throw new Error(`llama-server exited (${proc.exitCode}):\n${err}`);
    try {
      if ((await fetch(url + '/health')).status === 200) return { proc, url };
    } catch { /* not listening yet */ }
    await new Promise((r) => setTimeout(r, 250));
  }
  throw new Error(`llama-server did not come up:\n${err}`);
}

// One streaming completion: each chunk's arrival time for each token it carries (nextn: its
// logprobs' tokens, accepted drafts arriving together; llama-server: one chunk a token), and the
// token count from the usage / timings when given.
async function stream(engine, url, prompt, maxTokens, draft) {
  const t0 = performance.now();
  const body = { prompt, max_tokens: maxTokens, temperature: 0, stream: true, ignore_eos: true };
  if (engine === 'nextn') Object.assign(body, { logprobs: 0, stream_options: { include_usage: true }, speculative: { draft } });
  const res = await fetch(url + '/v1/completions', {
    method: 'POST', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify(body),
  });
  if (res.status !== 200) throw new Error(`${engine}: HTTP ${res.status}: ${await res.text()}`);
  let n = null;
  const times = [];
  for await (const c of sseChunks(res)) {
    const now = performance.now();
    if (c.usage) n = c.usage.completion_tokens;
    if (c.timings && c.timings.predicted_n) n = c.timings.predicted_n;
    for (const ch of c.choices || []) {
      const k = engine === 'nextn' ? (ch.logprobs && ch.logprobs.tokens ? ch.logprobs.tokens.length : 0)
                                   : (ch.text ? 1 : 0);
      for (let j = 0; j < k; j++) times.push(now);
    }
  }
  if (n === null) n = times.length;
  const first = times[0], last = times[times.length - 1];
  return { times, n, ttft: first - t0, decode_tps: n > 1 && last > first ? (n - 1) / ((last - first) / 1000) : NaN };
}

async function load(engine, url, C, draft) {
  const t0 = performance.now();
  const rs = await Promise.all([...Array(C).keys()].map((i) => stream(engine, url, PROMPTS[i % 8], MAX_TOKENS, draft)));
  const wall = (performance.now() - t0) / 1000;
  const gaps = rs.flatMap((r) => r.times.slice(1).map((t, i) => t - r.times[i]));
  return {
    agg: rs.reduce((s, r) => s + r.n, 0) / wall, per: rs.reduce((s, r) => s + r.decode_tps, 0) / rs.length,
    ttft50: pct(rs.map((r) => r.ttft), 50), ttft99: pct(rs.map((r) => r.ttft), 99), gap50: pct(gaps, 50), gap99: pct(gaps, 99),
  };
}

async function main() {
  if (!LLAMA || !fs.existsSync(path.join(LLAMA, 'build', 'bin', 'llama-server')))
    throw new Error('--llama-cpp DIR (or LLAMA_CPP_DIR) must name a llama.cpp tree built with CMake (build/bin/llama-server)');
  for (const f of [GGUF, path.join(MLX, 'config.json')])
    if (!fs.existsSync(f)) throw new Error(`${f} is missing: run bench/llama_cpp.py first`);
  const f = (x, d = 1) => (Number.isFinite(x) ? x.toFixed(d) : '-');
  console.log(`server bench: nextn ${path.basename(MLX)} vs llama.cpp ${path.basename(GGUF)} (${WORK}), ` +
              `max_tokens ${MAX_TOKENS}, ${THREADS} threads, ${os.cpus().length} cores`);
  console.log('server           slots draft C  aggregate tok/s  per-stream tok/s  TTFT p50/p99 ms   inter-token p50/p99 ms');
  const R = {};
  for (const engine of ['nextn', 'llama.cpp']) {
    for (const slots of [1, P]) {
      const srv = await start(engine, slots);
      for (const draft of engine === 'nextn' ? ['auto', 0] : ['-']) {
        await Promise.all([...Array(slots).keys()].map((i) => stream(engine, srv.url, PROMPTS[i % 8], 32, draft))); // warm
        for (const C of QUICK ? [1, 4] : [1, 2, 4, 8]) {
          const r = await load(engine, srv.url, C, draft);
          R[`${engine}/${slots}/${draft}/${C}`] = r;
          console.log(`${engine.padEnd(16)} ${String(slots).padStart(5)} ${String(draft).padEnd(5)} ${C}  ${f(r.agg).padStart(15)}  ` +
                      `${f(r.per).padStart(16)}  ${(f(r.ttft50, 0) + ' / ' + f(r.ttft99, 0)).padStart(15)}   ${f(r.gap50)} / ${f(r.gap99)}`);
        }
      }
      srv.proc.kill('SIGTERM');
      await new Promise((r) => (srv.proc.exitCode !== null ? r() : srv.proc.on('exit', r)));
    }
  }
  const l4 = R[`llama.cpp/${P}/-/4`], l1 = R['llama.cpp/1/-/1'];
  for (const draft of ['auto', 0]) {
    const n4 = R[`nextn/${P}/${draft}/4`], n1 = R[`nextn/1/${draft}/1`];
    console.log(`4 concurrent, nextn draft ${draft}: aggregate ${f(n4.agg / l4.agg, 2)}x llama.cpp's, each stream ` +
                `${f(n4.per / l4.per, 2)}x; one stream ${f(n1.per / l1.per, 2)}x`);
  }
}

main().catch((e) => { console.error('server_llama_cpp:', e.message); process.exit(1); });
