#!/usr/bin/env node
// Bounded load run against `nextn serve` on loopback: C concurrent clients issue R streaming
// greedy chat requests in total; reports requests/s, time to first token (p50/p99), end-to-end
// latency and generated tokens/s. Starts its own server unless --url names a running one.
//
//   node bench/server_load.js [--requests 64] [--concurrency 4] [--max-tokens 32]
//                             [--draft auto|0..8] [--threads N] [--url http://127.0.0.1:PORT] [-m DIR]
//
// The client runs on the same machine: on a small box give the server fewer compute threads
// than cores (--threads) so the two do not fight over CPUs.
'use strict';
const path = require('path');
const { sseChunks } = require('./sse');
const { startNextn, pct } = require('./serve');

const ROOT = path.resolve(__dirname, '..');
const args = process.argv.slice(2);
function opt(name, def) {
  const i = args.indexOf(name);
  return i >= 0 && i + 1 < args.length ? args[i + 1] : def;
}
const R = Math.max(1, Math.min(10000, Number(opt('--requests', 64))));
const C = Math.max(1, Math.min(256, Number(opt('--concurrency', 4))));
const MAX_TOKENS = Math.max(1, Number(opt('--max-tokens', 32)));
const DRAFT = opt('--draft', 'auto');
const MODEL_DIR = opt('-m', path.join(ROOT, 'models', 'nextn-hy3-tiny'));
const THREADS = opt('--threads', null);

const PROMPTS = [
  'Write a haiku about the sea.', 'Explain recursion to a child.', 'List three prime numbers.',
  'What is a hash table?', 'Describe a sunset.', 'Write a Python function that reverses a string.',
  'Why is the sky blue?', 'Summarize the plot of a heist movie.',
];



async function one(url, model, i) {
  const body = {
    model, messages: [{ role: 'user', content: PROMPTS[i % PROMPTS.length] }], max_tokens: MAX_TOKENS,
    temperature: 0, stream: true, stream_options: { include_usage: true },
    speculative: { draft: DRAFT === 'auto' ? 'auto' : Number(DRAFT) },
  };
  const t0 = performance.now();
  const res = await fetch(url + '/v1/chat/completions', {
    method: 'POST', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify(body),
  });
  if (res.status !== 200) throw new Error(`HTTP ${res.status}: ${await res.text()}`);
  let ttft = null, usage = null;
  for await (const c of sseChunks(res)) {
    if (c.usage) usage = c.usage;
    if (ttft === null && c.choices.some((ch) => ch.delta && ch.delta.content)) ttft = performance.now() - t0;
  }
  return { ttft: ttft === null ? performance.now() - t0 : ttft, total: performance.now() - t0, usage };
}

async function main() {
  for (const u of [opt('--url', null)].filter(Boolean))
    if (!/^http:\/\/(127\.0\.0\.1|localhost|\[::1\])(:\d+)?\/?$/.test(u)) throw new Error('--url must be loopback');
  const srv = opt('--url', null) ? { url: opt('--url').replace(/\/$/, '') } : await startNextn(['-m', MODEL_DIR, '--queue', String(C + 8), ...(THREADS ? ['--threads', THREADS] : [])]);
  const model = (await (await fetch(srv.url + '/v1/models')).json()).data[0].id;
  await one(srv.url, model, 0); // warm-up, not counted

  const results = [];
  let next = 0;
  const t0 = performance.now();
  await Promise.all([...Array(C)].map(async () => {
    while (next < R) {
      const i = next++;
      results.push(await one(srv.url, model, i));
    }
  }));
  const wall = (performance.now() - t0) / 1000;
  const ttft = results.map((r) => r.ttft).sort((a, b) => a - b);
  const lat = results.map((r) => r.total).sort((a, b) => a - b);
  const toks = results.reduce((s, r) => s + (r.usage ? r.usage.completion_tokens : 0), 0);
  const drafted = results.reduce((s, r) => s + (r.usage ? r.usage.speculative.drafted : 0), 0);
  const accepted = results.reduce((s, r) => s + (r.usage ? r.usage.speculative.accepted : 0), 0);
  const f = (x) => x.toFixed(1);
  console.log(`server load: ${R} streaming chat requests, ${C} concurrent clients, max_tokens ${MAX_TOKENS}, ` +
              `draft ${DRAFT}, model ${model}` + (THREADS ? `, server threads ${THREADS}` : ''));
  console.log(`  requests/s        ${(R / wall).toFixed(2)}   (${wall.toFixed(2)} s wall)`);
  console.log(`  TTFT p50 / p99    ${f(pct(ttft, 50))} / ${f(pct(ttft, 99))} ms`);
  console.log(`  latency p50 / p99 ${f(pct(lat, 50))} / ${f(pct(lat, 99))} ms`);
  console.log(`  generated tok/s   ${(toks / wall).toFixed(1)}   (${toks} tokens)`);
  if (drafted) console.log(`  MTP acceptance    ${(100 * accepted / drafted).toFixed(1)}% (${accepted}/${drafted})`);
  if (srv.proc) srv.proc.kill('SIGTERM');
}

main().catch((e) => { console.error('server_load:', e.message); process.exit(1); });
