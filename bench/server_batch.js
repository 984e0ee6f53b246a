#!/usr/bin/env node
// Continuous batching under load: C concurrent streaming completions (C = 1, 2, 4, 8) served by
// `nextn serve --parallel P` (their steps batched) and by `--parallel 1` (one request at a time,
// the others queued), MTP drafts on (auto) and off (0). Reports aggregate tokens/s, each stream's
// decode tokens/s (after its first token), TTFT and the gaps between a stream's chunks (p50/p99);
// then the gaps of running streams while a long prompt (about 2k tokens) is prefilled beside them.
//
//   node bench/server_batch.js [-m DIR] [--parallel 8] [--max-tokens 64] [--threads N] [--quick] [--conc 1,2,4] [--drafts auto,0]
//
// --conc: the concurrent request counts to load the servers with (default 1,2,4,8; --quick 1,4;
// none: only the long prompt's figures); --drafts: the streams' draft settings (default auto,0).
//
// DIR needs a tokenizer: a model without one (the generated bench models) is served through a
// view in /tmp with the default model's tokenizer files linked beside its weights.
'use strict';
const http = require('http');
const os = require('os');
const path = require('path');
const { sseChunks } = require('./sse');
const { startNextn, tokenizerView, pct } = require('./serve');

const args = process.argv.slice(2);
const opt = (name, def) => { const i = args.indexOf(name); return i >= 0 && i + 1 < args.length ? args[i + 1] : def; };
const MODEL_DIR = opt('-m', '/tmp/nextn-bench-hy3shape-q4');
const P = Number(opt('--parallel', 8));
const MAX_TOKENS = Number(opt('--max-tokens', 64));
const THREADS = opt('--threads', null);
const QUICK = args.includes('--quick');
const DRAFTS = opt('--drafts', 'auto,0').split(',').map((d) => (d === 'auto' ? 'auto' : Number(d)));
const CONC = opt('--conc', QUICK ? '1,4' : '1,2,4,8').split(',').filter((c) => c !== 'none').map(Number);

const PROMPTS = [
  'The history of the printing press', 'def quicksort(items):', 'A recipe for bread:',
  'Once upon a time in a small village', 'The mitochondria is', '#include <stdio.h>\nint main(void) {',
  'Dear Sir or Madam,', 'In 1969, astronauts',
];



// One streaming completion: the arrival time of each generated token (every token gets a chunk
// with `logprobs`, text or not: the bench models' tokens past the borrowed tokenizer's vocabulary
// have no text; a chunk with several tokens, accepted drafts, counts its extra ones as arriving
// with it), and the usage.
async function stream(url, prompt, maxTokens, draft) {
  const t0 = performance.now();
  const res = await fetch(url + '/v1/completions', {
    method: 'POST', headers: { 'Content-Type': 'application/json' },
    body: JSON.stringify({ prompt, max_tokens: maxTokens, temperature: 0, stream: true, ignore_eos: true, logprobs: 0,
                           stream_options: { include_usage: true }, speculative: { draft } }),
  });
  if (res.status !== 200) throw new Error(`HTTP ${res.status}: ${await res.text()}`);
  let usage = null;
  const times = [];
  for await (const c of sseChunks(res)) {
    if (c.usage) usage = c.usage;
    const now = performance.now();
    for (const ch of c.choices || [])
      for (let k = 0; k < (ch.logprobs && ch.logprobs.tokens ? ch.logprobs.tokens.length : 0); k++) times.push(now);
  }
  const n = usage ? usage.completion_tokens : times.length;
  const first = times[0], last = times[times.length - 1];
  return { t0, times, n, ttft: first - t0, decode_tps: n > 1 && last > first ? (n - 1) / ((last - first) / 1000) : NaN };
}

async function load(url, C, draft) {
  const t0 = performance.now();
  const rs = await Promise.all([...Array(C).keys()].map((i) => stream(url, PROMPTS[i % PROMPTS.length], MAX_TOKENS, draft)));
  const wall = (performance.now() - t0) / 1000;
  const gaps = rs.flatMap((r) => r.times.slice(1).map((t, i) => t - r.times[i]));
  return {
    agg: rs.reduce((s, r) => s + r.n, 0) / wall,
    per: rs.reduce((s, r) => s + r.decode_tps, 0) / rs.length,
    ttft50: pct(rs.map((r) => r.ttft), 50), ttft99: pct(rs.map((r) => r.ttft), 99),
    gap50: pct(gaps, 50), gap99: pct(gaps, 99),
  };
}

// Milliseconds to the first byte of a streamed completion's body, sent with node's http module
// (fetch's connection to a server busy with other streams is cut while the body waits: a
// client-side issue this bench steps around).
function firstByte(url, body) {
  return new Promise((resolve, reject) => {
    const t0 = performance.now();
    const data = JSON.stringify(body);
    const req = http.request(url + '/v1/completions', {
      method: 'POST', headers: { 'Content-Type': 'application/json', 'Content-Length': Buffer.byteLength(data) },
    }, (res) => {
      let first = null;
      res.on('data', () => { if (first === null) first = performance.now() - t0; });
      res.on('end', () => resolve(first));
    });
    req.on('error', reject);
    req.end(data);
  });
}

// Gaps between chunks of 3 running streams while a ~2k-token prompt is prefilled beside them.
async function longPrompt(url, draft) {
  // its first line differs from every earlier long prompt's, so no slot holds a prefix of it
  const longText = `Request ${draft} ${Date.now()}\n` +
    Array.from({ length: 170 }, (_, i) => `Item ${i}: a line of filler text.`).join('\n');
  const running = [0, 1, 2].map((i) => stream(url, PROMPTS[i], 160, draft));
  await new Promise((r) => setTimeout(r, 1500));
  const tl = performance.now();
  const ttft = await firstByte(url, { prompt: longText, max_tokens: 4, stream: true, logprobs: 0 });
  const tf = tl + ttft;
  const rs = await Promise.all(running);
  const during = rs.flatMap((r) => r.times.slice(1).map((t, i) => [r.times[i], t - r.times[i]]))
    .filter(([t]) => t >= tl && t <= tf).map(([, g]) => g);
  const before = rs.flatMap((r) => r.times.slice(1).map((t, i) => [r.times[i], t - r.times[i]]))
    .filter(([t]) => t < tl).map(([, g]) => g);
  return { ttft, n_gaps: during.length, p50: pct(during, 50), p99: pct(during, 99),
           max: Math.max(...during), base50: pct(before, 50) };
}

async function main() {
  const dir = tokenizerView(MODEL_DIR);
  const f = (x, d = 1) => (Number.isFinite(x) ? x.toFixed(d) : '-');
  console.log(`server batching bench: model ${MODEL_DIR}, max_tokens ${MAX_TOKENS}, ${os.cpus().length} cores` +
              (THREADS ? `, server threads ${THREADS}` : ''));
  console.log('mode        draft  C  aggregate tok/s  per-stream tok/s  TTFT p50/p99 ms   inter-token p50/p99 ms');
  const results = {};
  for (const parallel of [1, P]) {
    const srv = await startNextn(['-m', dir, '--queue', '64', '--parallel', String(parallel), '--ctx', '4096',
                                  '--cache-ram', '0', ...(THREADS ? ['--threads', THREADS] : [])]);
    for (const draft of DRAFTS) {
      // every slot warm (its --draft auto measurements made), as a server that has been serving
      await Promise.all([...Array(parallel).keys()].map((i) => stream(srv.url, PROMPTS[i % PROMPTS.length], 48, draft)));
      for (const C of CONC) {
        const r = await load(srv.url, C, draft);
        results[`${parallel}/${draft}/${C}`] = r;
        console.log(`${(parallel === 1 ? 'one-at-a-time' : `--parallel ${parallel}`).padEnd(13)} ${String(draft).padEnd(5)} ` +
                    `${String(C).padStart(1)}  ${f(r.agg).padStart(15)}  ${f(r.per).padStart(16)}  ` +
                    `${(f(r.ttft50, 0) + ' / ' + f(r.ttft99, 0)).padStart(15)}   ${f(r.gap50)} / ${f(r.gap99)}`);
      }
    }
    if (parallel > 1) {
      for (const draft of DRAFTS) {
        const l = await longPrompt(srv.url, draft);
        console.log(`--parallel ${parallel}, draft ${draft}: a ~2k-token prompt prefilled beside 3 streams: its TTFT ` +
                    `${f(l.ttft, 0)} ms; the streams' inter-token gaps meanwhile p50 ${f(l.p50)} / p99 ${f(l.p99)} / max ` +
                    `${f(l.max)} ms (${l.n_gaps} gaps; ${f(l.base50)} ms p50 before it arrived)`);
      }
    }
    srv.proc.kill('SIGTERM');
    await new Promise((r) => srv.proc.on('exit', r));
  }
  for (const draft of DRAFTS) {
    const solo = results[`1/${draft}/1`], one4 = results[`1/${draft}/4`], b4 = results[`${P}/${draft}/4`];
    if (solo && one4 && b4)
      console.log(`draft ${draft}, 4 concurrent: aggregate ${f(b4.agg / one4.agg, 2)}x one-at-a-time, ` +
                  `each stream ${f(b4.per / solo.per, 2)}x its solo speed`);
  }
}

main().catch((e) => { console.error('server_batch:', e.message); process.exit(1); });
