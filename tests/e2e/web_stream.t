#!/usr/bin/env node
// The chat page's server side without a browser: GET / and the page's files (types, caching
// headers, the bytes of web/), the key rules around them, and the stream's per-token draft sources
// ("nextn" in each chunk's choice) checked against the request's own speculative counters.
'use strict';
const fs = require('fs');
const path = require('path');
const lib = require(path.join(__dirname, '..', 'server', 'lib.js'));
const { ok, is, note, done } = lib;

lib.skipAllUnlessReady();

const WEB = path.join(lib.ROOT, 'web');
const TYPES = { '.html': 'text/html; charset=utf-8', '.css': 'text/css; charset=utf-8', '.js': 'text/javascript; charset=utf-8' };

async function stream(base, body, headers = {}) {
  const r = await fetch(base + '/v1/chat/completions', {
    method: 'POST', headers: { 'Content-Type': 'application/json', ...headers },
    body: JSON.stringify({ ...body, stream: true, stream_options: { include_usage: true } }) });
  const text = await r.text();
  const chunks = text.split('\n\n').filter((e) => e.startsWith('data: ') && e !== 'data: [DONE]').map((e) => JSON.parse(e.slice(6)));
  return { status: r.status, chunks };
}

// The tokens' sources in stream order (per choice), and the request's counters rebuilt from them:
// a cycle is its accepted drafts then one token of the trunk's, all carrying the cycle's k.
function sources(chunks, index = 0) {
  const toks = [];
  let shapeOk = true;
  for (const c of chunks) for (const ch of c.choices) {
    if (ch.index !== index || !ch.nextn) continue;
    const { drafted, draft_k: k } = ch.nextn;
    shapeOk = shapeOk && Array.isArray(drafted) && Array.isArray(k) && drafted.length === k.length && drafted.length > 0;
    drafted.forEach((d, i) => toks.push({ d, k: k[i] }));
  }
  const at = [], acc = [];
  let open = null, cycles = 0, accepted = 0, drafted = 0, sameK = true;
  for (const t of toks) {
    if (t.k > 0 && !open) open = { k: t.k, acc: 0 };
    if (open && t.k !== open.k) sameK = false;
    if (!open) { sameK = sameK && !t.d; continue; }
    if (t.d) { open.acc++; continue; }
    for (let i = 0; i < Math.min(open.k, open.acc + 1); i++) {
      at[i] = (at[i] || 0) + 1;
      acc[i] = (acc[i] || 0) + (i < open.acc ? 1 : 0);
    }
    cycles++; accepted += open.acc; drafted += open.k; open = null;
  }
  return { toks, shapeOk, sameK, at, acc, cycles, accepted, drafted, open };
}

function textOf(chunks) {
  let content = '', reasoning = '';
  for (const c of chunks) for (const ch of c.choices) {
    content += (ch.delta && ch.delta.content) || '';
    reasoning += (ch.delta && ch.delta.reasoning_content) || '';
  }
  return { content, reasoning };
}

async function main() {
  const srv = await lib.startServer(['--ctx', '1024']);
  const B = srv.base;

  // ---------------------------------------------------------------- the page's files
  const page = await fetch(B + '/');
  const html = await page.text();
  is(page.status, 200, 'GET / answers 200');
  is(page.headers.get('content-type'), TYPES['.html'], 'GET / is HTML');
  is(html, fs.readFileSync(path.join(WEB, 'index.html'), 'utf8'), 'GET / serves web/index.html');
  is(page.headers.get('cache-control'), 'no-cache', 'the page is revalidated on each load');
  const etag = page.headers.get('etag');
  ok(/^"[0-9a-f]{16}"$/.test(etag || ''), 'the page has an ETag', etag);
  ok(/script-src 'self'/.test(page.headers.get('content-security-policy') || ''), 'a content security policy', page.headers.get('content-security-policy'));
  is(page.headers.get('x-content-type-options'), 'nosniff', 'nosniff');
  const again = await fetch(B + '/', { headers: { 'If-None-Match': etag } });
  is(again.status, 304, 'If-None-Match with the ETag: 304');
  const refs = [...html.matchAll(/(?:src|href)="(\/[\w.-]+)"/g)].map((m) => m[1]);
  ok(refs.length >= 3, 'the page refers to its script and style files', refs);
  for (const ref of refs) {
    const r = await fetch(B + ref);
    const body = Buffer.from(await r.arrayBuffer());
    const file = path.join(WEB, ref.slice(1));
    ok(r.status === 200 && r.headers.get('content-type') === TYPES[path.extname(ref)] &&
       body.equals(fs.readFileSync(file)), `GET ${ref}: the bytes of web${ref}, typed ${TYPES[path.extname(ref)]}`,
       { status: r.status, type: r.headers.get('content-type') });
  }
  const head = await fetch(B + '/', { method: 'HEAD' });
  ok(head.status === 200 && (await head.text()) === '', 'HEAD / answers without a body');
  const post = await fetch(B + '/', { method: 'POST' });
  ok(post.status === 405 && post.headers.get('allow') === 'GET, HEAD', 'POST / is 405 naming GET and HEAD', post.status);
  is((await fetch(B + '/nope.js')).status, 404, 'a file the page does not have is 404');
  const health = await (await fetch(B + '/health')).json();
  is(health.api_key_required, false, '/health says no key is needed');

  // ---------------------------------------------------------------- the stream's draft sources
  const messages = [{ role: 'user', content: 'Write a C comment about a linked list.' }];
  const greedy = await (await fetch(B + '/v1/chat/completions', { method: 'POST', headers: { 'Content-Type': 'application/json' },
    body: JSON.stringify({ messages, max_tokens: 48, temperature: 0 }) })).json();
  const want = greedy.choices[0].message;
  ok(greedy.timings && greedy.timings.predicted_n === greedy.usage.completion_tokens - 1,
     'a response carries llama.cpp\'s timings', greedy.timings);

  for (const draft of [3, 1, 'auto', 0]) {
    const s = await stream(B, { messages, max_tokens: 48, temperature: 0, speculative: { draft } });
    const u = s.chunks[s.chunks.length - 1].usage;
    const src = sources(s.chunks);
    const sp = u.speculative;
    const t = textOf(s.chunks);
    is(t.content, want.content || '', `draft ${draft}: the streamed answer is the greedy answer`);
    is(t.reasoning, want.reasoning_content || '', `draft ${draft}: and so is its reasoning`);
    ok(src.shapeOk, `draft ${draft}: each "nextn" has one drafted flag and one k per token`);
    is(src.toks.length, u.completion_tokens, `draft ${draft}: one source per generated token`);
    is(src.toks.filter((x) => x.d).length, sp.accepted, `draft ${draft}: tokens marked drafted = accepted drafts`);
    ok(src.sameK, `draft ${draft}: a cycle's tokens share its k; plain steps are never drafted`);
    // a generation may end inside a cycle (max_tokens): its open cycle is counted as drafted
    const open = src.open ? src.open.k : 0;
    is(src.drafted + open, sp.drafted, `draft ${draft}: the cycles' k sum to the drafted tokens`);
    if (!src.open) {
      is(src.cycles, sp.drafts, `draft ${draft}: cycles rebuilt from the stream = drafts`);
      is(JSON.stringify(src.at), JSON.stringify(sp.drafted_at), `draft ${draft}: drafted per chain position`);
      is(JSON.stringify(src.acc), JSON.stringify(sp.accepted_at), `draft ${draft}: accepted per chain position`);
    }
    ok(src.toks.every((x) => x.k <= (draft === 'auto' ? 8 : draft)), `draft ${draft}: no cycle drafts more than asked`);
    if (sp.drafts > 0)
      ok(Math.abs(sp.mean_acceptance_length - (1 + sp.accepted / sp.drafts)) < 1e-6, `draft ${draft}: mean acceptance length = 1 + accepted/drafts`, sp);
    if (draft === 3) {
      ok(sp.accepted > 0, 'draft 3: the default model accepts some drafts', sp);
      // drafted_at counts judged drafts: the one at position k + 1 only after the one at k was accepted
      const lastAccepted = sp.accepted_at.reduce((m, a, i) => (a > 0 ? i + 1 : m), 0);
      is(sp.drafted_at.length, Math.min(3, lastAccepted + 1), 'draft 3: chain positions up to one past the last accepted', sp);
    }
    if (draft === 0) ok(src.toks.every((x) => !x.d && x.k === 0) && sp.drafted_at.length === 0, 'draft 0: every token is the trunk\'s');
  }

  // two choices: each stream's sources are its own
  const two = await stream(B, { messages, max_tokens: 24, temperature: 0.8, seed: 7, n: 2, speculative: { draft: 2 } });
  const u2 = two.chunks[two.chunks.length - 1].usage;
  const s0 = sources(two.chunks, 0), s1 = sources(two.chunks, 1);
  is(s0.toks.length + s1.toks.length, u2.completion_tokens, 'n 2: the choices\' sources cover every token');
  is(s0.toks.filter((x) => x.d).length + s1.toks.filter((x) => x.d).length, u2.speculative.accepted, 'n 2: and every accepted draft');

  // completions streams carry the same member
  const cr = await fetch(B + '/v1/completions', { method: 'POST', headers: { 'Content-Type': 'application/json' },
    body: JSON.stringify({ prompt: 'static int compare(const void *a, const void *b)', max_tokens: 32, temperature: 0,
      stream: true, stream_options: { include_usage: true }, speculative: { draft: 2 } }) });
  const cchunks = (await cr.text()).split('\n\n').filter((e) => e.startsWith('data: ') && e !== 'data: [DONE]').map((e) => JSON.parse(e.slice(6)));
  const cu = cchunks[cchunks.length - 1].usage, cs = sources(cchunks);
  ok(cs.shapeOk && cs.toks.length === cu.completion_tokens && cs.toks.filter((x) => x.d).length === cu.speculative.accepted,
     'completions: one source per token, the drafted ones the accepted drafts', { n: cs.toks.length, usage: cu });

  // a client that ignores the member sees the same OpenAI chunks
  const keys = new Set();
  for (const c of two.chunks) for (const ch of c.choices) for (const k of Object.keys(ch)) keys.add(k);
  is([...keys].sort().join(','), 'delta,finish_reason,index,logprobs,nextn', 'choices hold OpenAI\'s members and "nextn"');

  // ---------------------------------------------------------------- with --api-key
  const ks = await lib.startServer(['--ctx', '512', '--api-key', 'sesame']);
  const K = ks.base;
  const kp = await fetch(K + '/');
  ok(kp.status === 200 && kp.headers.get('content-type') === TYPES['.html'], 'with --api-key, GET / needs no key');
  is((await fetch(K + '/app.js')).status, 200, 'nor do the page\'s files');
  is((await fetch(K + '/v1/models')).status, 401, 'the API still does');
  is((await fetch(K + '/', { method: 'DELETE' })).status, 401, 'another method on / is 401 without the key (before 405)');
  is((await (await fetch(K + '/health')).json()).api_key_required, true, '/health says a key is needed');
  const same = await stream(K, { messages, max_tokens: 4 }, { Authorization: 'Bearer sesame', Origin: K });
  is(same.status, 200, 'the page\'s own origin may call the API with the key');
  const cross = await stream(K, { messages, max_tokens: 4 }, { Authorization: 'Bearer sesame', Origin: 'http://evil.example' });
  is(cross.status, 403, 'another origin may not');
  note(`greedy answer: ${JSON.stringify(want.content)}`);
  done();
}

main().catch((e) => { ok(false, 'no exception', e.stack || String(e)); done(); });
