#!/usr/bin/env node
// Clients that go away: a stream aborted mid-generation, a request aborted while it waits in
// the queue, and a non-streaming request abandoned. Each cancels its generation and frees its
// slot (the queue drains, far fewer tokens are generated than asked), and the server stays
// healthy and serves the next request correctly. Finally SIGTERM with a stream in flight. One
// slot (--parallel 1), so a second request waits in the queue.
'use strict';
const path = require('path');
const lib = require(path.join(__dirname, '..', 'server', 'lib.js'));
const { ok, is, note, done, metric } = lib;

lib.skipAllUnlessReady();

const LONG = { prompt: 'Tell me everything:', max_tokens: 16000, temperature: 0, ignore_eos: true, stream: true };
const post = (base, body, signal) => fetch(base + '/v1/completions', {
  method: 'POST', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify(body), signal,
});
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

// Reads SSE events until `count` have arrived.
async function readEvents(res, count) {
  const reader = res.body.getReader();
  const dec = new TextDecoder();
  let buf = '', n = 0;
  while (n < count) {
    const { value, done: end } = await reader.read();
    if (end) break;
    buf += dec.decode(value, { stream: true });
    n = buf.split('\n\n').length - 1;
  }
  return n;
}

async function waitIdle(base, ms = 10000) {
  const t0 = Date.now();
  for (;;) {
    const h = await (await fetch(base + '/health')).json();
    if (h.queued === 0 && h.active === 0) return Date.now() - t0;
    if (Date.now() - t0 > ms) return -1;
    await sleep(50);
  }
}

async function main() {
  const srv = await lib.startServer(['--parallel', '1', '-m', lib.longContextModel(), '--ctx', '16384']);
  const B = srv.base;
  const reference = await (await post(B, { prompt: 'Count: 1, 2, 3,', max_tokens: 16, temperature: 0 })).json();

  // 1. abort mid-stream
  const tokens0 = await metric(B, 'nextn_completion_tokens_total');
  const ac = new AbortController();
  const res = await post(B, LONG, ac.signal);
  const got = await readEvents(res, 5);
  ok(res.status === 200 && got >= 5, 'stream started', got);
  ac.abort();
  const idleMs = await waitIdle(B);
  ok(idleMs >= 0, `aborted stream frees the worker (${idleMs} ms)`);
  const tokens1 = await metric(B, 'nextn_completion_tokens_total');
  // the context holds ~1000 tokens; an uncancelled run would generate all of them
  ok(tokens1 - tokens0 < 400, 'generation stopped early', tokens1 - tokens0);
  ok((await metric(B, 'nextn_cancelled_total')) >= 1, 'metrics count the cancel');

  // 2. abort while waiting in the queue
  const acA = new AbortController(), acB = new AbortController();
  // plain decoding keeps A busy long enough to observe B waiting behind it
  const resA = await post(B, { ...LONG, speculative: { draft: 0 } }, acA.signal);
  await readEvents(resA, 2);
  const pB = post(B, LONG, acB.signal).catch(() => null);
  await sleep(300);
  let h = await (await fetch(B + '/health')).json();
  ok(h.queued === 1 && h.active === 1, 'second request waits in the queue', h);
  acB.abort();
  await pB;
  let queuedGone = false;
  for (let i = 0; i < 60 && !queuedGone; i++) {
    await sleep(50);
    h = await (await fetch(B + '/health')).json();
    queuedGone = h.queued === 0;
  }
  ok(queuedGone && h.active === 1, 'the aborted waiter leaves the queue while the first still runs', h);
  acA.abort();
  ok((await waitIdle(B)) >= 0, 'then the first one is cancelled too');

  // 3. a non-streaming request abandoned by its client
  const acC = new AbortController();
  const pC = post(B, { ...LONG, stream: false }, acC.signal).catch(() => null);
  await sleep(400);
  acC.abort();
  await pC;
  ok((await waitIdle(B)) >= 0, 'abandoned non-streaming request is cancelled');

  // the server is still correct
  const after = await (await post(B, { prompt: 'Count: 1, 2, 3,', max_tokens: 16, temperature: 0 })).json();
  is(after.choices[0].text, reference.choices[0].text, 'next request: same output as before the disconnects');
  ok((await (await fetch(B + '/health')).json()).status === 'ok', 'healthy');

  // 4. SIGTERM with a stream in flight: the client gets an end, the server exits cleanly
  const acD = new AbortController();
  const resD = await post(B, LONG, acD.signal);
  await readEvents(resD, 3);
  const t0 = Date.now();
  srv.stop();
  const code = await lib.waitExit(srv);
  is(code, 0, `SIGTERM mid-stream: exit 0 after ${Date.now() - t0} ms`);
  acD.abort();
  done();
}

main().catch((e) => { ok(false, 'unexpected exception', e && e.stack ? e.stack : String(e)); done(); });
