// The requests tests/e2e/server_batch*.t send to a server of several slots and to one of a single
// slot (greedy, seeded `verify: match`, a fixed draft with residual verification, MTP on and off,
// short and long prompts, chat and completions, streamed or not), and how they are sent.
'use strict';
const lib = require('./lib.js');

const LONG = Array.from({ length: 24 }, (_, i) => `Line ${i}: the quick brown fox jumps over the lazy dog.`)
  .join('\n');
const CASES = [
  { prompt: 'The history of the printing press', max_tokens: 40, temperature: 0 },
  { prompt: 'def quicksort(items):', max_tokens: 33, temperature: 0, speculative: { draft: 0 } },
  { chat: 'Write a haiku about rain.', max_tokens: 30, temperature: 0, speculative: { draft: 3 } },
  { prompt: LONG + '\nSummary:', max_tokens: 28, temperature: 0 },
  { prompt: 'Once upon a time', max_tokens: 36, temperature: 0.9, seed: 11, speculative: { verify: 'match' } },
  { chat: 'Name three colours.', max_tokens: 32, temperature: 0.8, top_p: 0.9, seed: 5,
    speculative: { draft: 2, verify: 'residual' } },
  { prompt: 'SELECT name FROM', max_tokens: 25, temperature: 1.0, seed: 3, speculative: { draft: 0 } },
  { prompt: '#include <stdio.h>\nint main(void) {', max_tokens: 38, temperature: 0, stream: false },
  { chat: LONG.slice(0, 900) + '\nWhat is line 7?', max_tokens: 24, temperature: 0.7, seed: 99,
    speculative: { draft: 'auto', verify: 'match' }, stream: false },
  { prompt: 'Dear Sir or Madam,', max_tokens: 30, temperature: 0, n: 2, stream: false },
];

function bodyOf(c) {
  const b = { max_tokens: c.max_tokens, temperature: c.temperature, stream: c.stream !== false };
  for (const k of ['seed', 'top_p', 'speculative', 'n']) if (c[k] !== undefined) b[k] = c[k];
  if (c.chat) b.messages = [{ role: 'user', content: c.chat }];
  else b.prompt = c.prompt;
  return b;
}

// One request; the text of each choice (streamed or whole) and the finish reasons.
async function ask(base, c, signal) {
  const url = base + (c.chat ? '/v1/chat/completions' : '/v1/completions');
  const res = await fetch(url, { method: 'POST', headers: { 'Content-Type': 'application/json' },
                                 body: JSON.stringify(bodyOf(c)), signal });
  const text = {}, finish = {};
  if (c.stream === false) {
    const j = await res.json();
    for (const ch of j.choices || []) {
      text[ch.index] = c.chat ? ch.message.content : ch.text;
      finish[ch.index] = ch.finish_reason;
    }
    return { status: res.status, text, finish };
  }
  const raw = await res.text();
  for (const block of raw.split('\n\n')) {
    if (!block.startsWith('data: ') || block === 'data: [DONE]') continue;
    for (const ch of JSON.parse(block.slice(6)).choices || []) {
      text[ch.index] = (text[ch.index] || '') + (c.chat ? (ch.delta.content || '') : ch.text);
      if (ch.finish_reason) finish[ch.index] = ch.finish_reason;
    }
  }
  return { status: res.status, text, finish, done: raw.includes('data: [DONE]') };
}

// A streaming request whose client goes away after its first chunk.
async function hangUp(base) {
  const ctl = new AbortController();
  const res = await fetch(base + '/v1/completions', {
    method: 'POST', headers: { 'Content-Type': 'application/json' }, signal: ctl.signal,
    body: JSON.stringify({ prompt: 'A very long story:', max_tokens: 400, temperature: 0, stream: true }),
  });
  const reader = res.body.getReader();
  await reader.read();
  ctl.abort();
  return res.status;
}

// Two rounds of every case sent at once to the server of several slots (base), beside a client that
// hangs up mid-stream: each answer must be the one-slot server's (alone[i]), choice by choice.
async function sameAsAlone(base, cases, alone) {
  const { ok, is } = lib;
  for (let round = 0; round < 2; round++) {
    const jobs = cases.map((c) => ask(base, c));
    jobs.push(hangUp(base));
    const got = await Promise.all(jobs);
    ok(got[cases.length] === 200, `round ${round}: a client hangs up mid-stream`);
    for (let i = 0; i < cases.length; i++) {
      const c = cases[i];
      ok(got[i].status === 200 && (c.stream === false || got[i].done), `round ${round}, case ${i}: answered`,
         got[i].status);
      const nChoices = c.n || 1;
      for (let k = 0; k < nChoices; k++) {
        is(got[i].text[k], alone[i].text[k], `round ${round}, case ${i}${nChoices > 1 ? ` choice ${k}` : ''}: ` +
           `same text as alone (${c.temperature ? 'seeded' : 'greedy'}, draft ${JSON.stringify((c.speculative || {}).draft ?? 'auto')})`);
        is(got[i].finish[k], alone[i].finish[k], `round ${round}, case ${i}: same finish_reason`);
      }
    }
  }
}

// /metrics of the server at base: the forwards really held several sequences. Returns the text.
async function batchedForwards(base) {
  const text = await (await fetch(base + '/metrics')).text();
  const val = (re) => { const m = text.match(re); return m ? Number(m[1]) : null; };
  const one = val(/^nextn_batch_sequences_bucket\{le="1"\} (\d+)$/m);
  const all = val(/^nextn_batch_sequences_count (\d+)$/m);
  lib.note(`batched forwards: ${all}, of which ${one} held one sequence`);
  lib.ok(all > 0 && one !== null && all - one > 10, 'many forwards held two or more sequences', text.slice(0, 200));
  return text;
}

module.exports = { LONG, CASES, ask, hangUp, sameAsAlone, batchedForwards };
