#!/usr/bin/env node
// What recurrent-state checkpoints save a hybrid model's server (Qwen3.5/3.6, Qwen3-Next): the
// time to first token of a second request that shares a long prefix with the first, served by
// `nextn serve --ctx-checkpoints 4` (default) and by `--ctx-checkpoints 0`, one slot each.
//   - document: a ~2k-token document and a question, then the same document and another question
//     (/v1/completions; checkpoints every --every tokens of the prefill, default 512);
//   - chat: a conversation's second turn (/v1/chat/completions with the model's template; the
//     first turn's answer rendered back as the client sends it).
// Prints, per case and server, the second request's time to its first token and to the end of an
// 8-token answer (MTP drafting on: the head's cache is caught up after the first token) and its
// cached prompt tokens.
//
//   node bench/server_checkpoints.js [-m DIR] [--every 512] [--threads N]
//
// DIR: a hybrid model (default the Qwen3.6-shaped bench model make bench writes); one without a
// tokenizer is served with the default model's tokenizer files linked beside its weights.
'use strict';
const { startNextn, tokenizerView } = require('./serve');
const { sseChunks } = require('./sse');

const args = process.argv.slice(2);
const opt = (name, def) => { const i = args.indexOf(name); return i >= 0 && i + 1 < args.length ? args[i + 1] : def; };
const MODEL_DIR = opt('-m', '/tmp/nextn-bench-qwen36shape-q4');
const EVERY = opt('--every', '512');
const THREADS = opt('--threads', null);

const DOC = Array.from({ length: 60 }, (_, i) =>
  `Section ${i}: the river crosses the plain, the towns trade salt and timber, and the delta has seven channels.`)
  .join('\n');

// A streamed greedy request: ms to its first token and to its end, prompt and cached tokens, and
// its text (the usage comes in the last chunk: stream_options.include_usage).
async function post(url, path, body) {
  const t0 = performance.now();
  const r = await fetch(url + path, { method: 'POST', headers: { 'content-type': 'application/json' },
                                      body: JSON.stringify({ model: 'm', max_tokens: 8, temperature: 0, stream: true, ignore_eos: true,
                                                             stream_options: { include_usage: true }, ...body }) });
  if (!r.ok) throw new Error(`${path}: ${r.status} ${(await r.text()).slice(0, 300)}`);
  let first = NaN, text = '', u = {};
  for await (const ch of sseChunks(r)) {
    const c = (ch.choices || [])[0];
    const piece = c ? (c.text ?? c.delta?.content ?? c.delta?.reasoning_content ?? '') : '';
    if ((piece || c?.logprobs) && Number.isNaN(first)) first = performance.now() - t0; /* a token, text or not */
    text += piece;
    if (ch.usage) u = ch.usage;
  }
  return { ttft: first, ms: performance.now() - t0, prompt: u.prompt_tokens,
           cached: (u.prompt_tokens_details || {}).cached_tokens, text };
}

async function cases(url) {
  const out = {};
  await post(url, '/v1/completions', { prompt: `${DOC}\nQuestion: what do the towns trade?\nAnswer:` });
  out.document = await post(url, '/v1/completions',
                            { prompt: `${DOC}\nQuestion: how many channels?\nAnswer:`, logprobs: 0 });
  const turn1 = [{ role: 'system', content: DOC }, { role: 'user', content: 'What do the towns trade?' }];
  const a = await post(url, '/v1/chat/completions', { messages: turn1 });
  out.chat = await post(url, '/v1/chat/completions', { logprobs: true,
    messages: [...turn1, { role: 'assistant', content: a.text }, { role: 'user', content: 'And the channels?' }] });
  return out;
}

async function main() {
  const dir = tokenizerView(MODEL_DIR);
  console.log(`checkpoints bench: model ${MODEL_DIR}, --checkpoint-every ${EVERY}`);
  console.log('case       server                 prompt  cached  second request: TTFT ms  8 tokens ms');
  for (const n of ['4', '0']) {
    const srv = await startNextn(['-m', dir, '--model-id', 'm', '--parallel', '1', '--ctx', '4096', '--cache-ram', '0',
                                  '--ctx-checkpoints', n, '--checkpoint-every', EVERY,
                                  ...(THREADS ? ['--threads', THREADS] : [])]);
    const r = await cases(srv.url);
    for (const [name, x] of Object.entries(r))
      console.log(`${name.padEnd(10)} --ctx-checkpoints ${n.padEnd(4)} ${String(x.prompt).padStart(7)} ` +
                  `${String(x.cached).padStart(7)}  ${x.ttft.toFixed(0).padStart(23)}  ${x.ms.toFixed(0).padStart(11)}`);
    srv.proc.kill('SIGTERM');
  }
}

main().catch((e) => { console.error(e.message); process.exit(1); });
