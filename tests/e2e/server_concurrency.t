#!/usr/bin/env node
// Concurrency: N >= 8 greedy streaming clients at once on loopback. Every request completes,
// none is lost or mixed with another's tokens, and each output equals what the same request
// produces when it runs alone.
'use strict';
const path = require('path');
const lib = require(path.join(__dirname, '..', 'server', 'lib.js'));
const { ok, is, note, done } = lib;

lib.skipAllUnlessReady();

const N = Number(process.env.NEXTN_SERVER_CLIENTS || 10);
const PROMPTS = [
  'The history of the printing press',
  'def quicksort(items):',
  'A recipe for bread:',
  'Once upon a time in a small village',
  'The mitochondria is',
  '#include <stdio.h>\nint main(void) {',
  'Dear Sir or Madam,',
  'In 1969, astronauts',
  'SELECT name FROM',
  'The weather today is',
  'for (int i = 0;',
  'Photosynthesis converts',
];

// One streaming request with fetch; returns the concatenated text, finish reason and the
// set of ids seen on its chunks.
async function streamOnce(base, i) {
  const body = {
    prompt: PROMPTS[i % PROMPTS.length], max_tokens: 24 + (i % 3) * 8, temperature: 0, stream: true,
  };
  const chat = i % 2 === 1;
  const url = base + (chat ? '/v1/chat/completions' : '/v1/completions');
  if (chat) {
    body.messages = [{ role: 'user', content: body.prompt }];
    delete body.prompt;
  }
  const res = await fetch(url, { method: 'POST', headers: { 'Content-Type': 'application/json' },
                                 body: JSON.stringify(body) });
  const raw = await res.text();
  let text = '', finish = null, done = false;
  const ids = new Set();
  for (const block of raw.split('\n\n')) {
    if (!block.startsWith('data: ')) continue;
    const data = block.slice(6);
    if (data === '[DONE]') { done = true; continue; }
    const c = JSON.parse(data);
    ids.add(c.id);
    for (const ch of c.choices) {
      text += chat ? (ch.delta.content || '') : ch.text;
      if (ch.finish_reason) finish = ch.finish_reason;
    }
  }
  return { status: res.status, text, finish, ids, done };
}

async function main() {
  const srv = await lib.startServer(['--queue', String(N + 4)]);
  const alone = [];
  for (let i = 0; i < N; i++) alone.push(await streamOnce(srv.base, i));
  ok(alone.every((r) => r.status === 200 && r.done && r.finish), `${N} requests alone`);

  const t0 = Date.now();
  const together = await Promise.all([...Array(N).keys()].map((i) => streamOnce(srv.base, i)));
  note(`${N} parallel streams in ${((Date.now() - t0) / 1000).toFixed(2)} s`);
  ok(together.every((r) => r.status === 200 && r.done), `all ${N} parallel streams complete with [DONE]`,
     together.map((r) => r.status));
  for (let i = 0; i < N; i++) {
    is(together[i].text, alone[i].text, `client ${i}: same text as alone`);
    is(together[i].finish, alone[i].finish, `client ${i}: same finish_reason`);
    ok(together[i].ids.size === 1, `client ${i}: every chunk carries its own id`, [...together[i].ids]);
  }
  const allIds = new Set(together.map((r) => [...r.ids][0]));
  is(allIds.size, N, 'distinct completion ids');

  // a client has its [DONE] a moment before the worker finishes the request's bookkeeping:
  // the queue must drain, within a few seconds
  let health;
  for (const t1 = Date.now(); ; await new Promise((r) => setTimeout(r, 50))) {
    health = await (await fetch(srv.base + '/health')).json();
    if ((health.queued === 0 && health.active === 0) || Date.now() - t1 > 5000) break;
  }
  ok(health.queued === 0 && health.active === 0, 'queue drained', health);
  srv.stop();
  is(await lib.waitExit(srv), 0, 'clean shutdown');
  done();
}

main().catch((e) => { ok(false, 'unexpected exception', e && e.stack ? e.stack : String(e)); done(); });
