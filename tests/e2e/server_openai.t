#!/usr/bin/env node
// `nextn serve` driven by the official `openai` npm client: models, chat and completions
// (streaming and not), logprobs, per-request speculative settings, and the client's typed
// errors for 400 / 401 / 404 answers.
'use strict';
const path = require('path');
const lib = require(path.join(__dirname, '..', 'server', 'lib.js'));
const { ok, is, note, done } = lib;

lib.skipAllUnlessReady();
const OpenAI = require('openai');

async function collectChat(stream) {
  let text = '', finish = null, usage = null, role = null, ids = new Set(), n = 0;
  for await (const chunk of stream) {
    n++;
    ids.add(chunk.id);
    if (chunk.usage) usage = chunk.usage;
    for (const c of chunk.choices) {
      if (c.delta.role) role = c.delta.role;
      text += c.delta.content || '';
      if (c.finish_reason) finish = c.finish_reason;
    }
  }
  return { text, finish, usage, role, ids, n };
}

async function main() {
  const srv = await lib.startServer(['--parallel', '1', '--ctx', '1024']);
  const client = new OpenAI({ baseURL: srv.base + '/v1', apiKey: 'unused', maxRetries: 0, timeout: 120000 });

  const models = await client.models.list();
  const ids = models.data.map((m) => m.id);
  ok(ids.length === 1, 'models.list: one model', ids);
  const model = ids[0];

  const messages = [
    { role: 'system', content: 'You answer briefly.' },
    { role: 'user', content: 'What is the capital of France?' },
    { role: 'assistant', content: 'Paris.' },
    { role: 'user', content: 'And of Italy?' },
  ];
  const chat = await client.chat.completions.create({ model, messages, max_tokens: 20, temperature: 0 });
  ok(chat.object === 'chat.completion' && chat.choices.length === 1 &&
     chat.choices[0].message.role === 'assistant' && typeof chat.choices[0].message.content === 'string',
     'chat.completions.create', chat);
  ok(chat.usage.prompt_tokens > 0 && chat.usage.completion_tokens > 0 &&
     chat.usage.total_tokens === chat.usage.prompt_tokens + chat.usage.completion_tokens, 'chat usage', chat.usage);
  ok(chat.usage.speculative && 'acceptance_rate' in chat.usage.speculative, 'usage.speculative present',
     chat.usage);
  note(`chat: ${JSON.stringify(chat.choices[0].message.content)}`);

  const s = await collectChat(await client.chat.completions.create(
    { model, messages, max_tokens: 20, temperature: 0, stream: true, stream_options: { include_usage: true } }));
  is(s.text, chat.choices[0].message.content, 'streamed chat equals the non-streamed one');
  is(s.finish, chat.choices[0].finish_reason, 'streamed finish_reason');
  is(s.role, 'assistant', 'streamed role');
  ok(s.ids.size === 1, 'one id across the stream', [...s.ids]);
  ok(s.usage && s.usage.completion_tokens === chat.usage.completion_tokens, 'stream_options.include_usage', s.usage);

  const comp = await client.completions.create({ model, prompt: 'def fibonacci(n):', max_tokens: 24, temperature: 0 });
  ok(comp.object === 'text_completion' && typeof comp.choices[0].text === 'string' && comp.choices[0].text.length > 0,
     'completions.create', comp);
  let streamed = '', finish = null;
  for await (const chunk of await client.completions.create(
    { model, prompt: 'def fibonacci(n):', max_tokens: 24, temperature: 0, stream: true })) {
    for (const c of chunk.choices) { streamed += c.text; if (c.finish_reason) finish = c.finish_reason; }
  }
  is(streamed, comp.choices[0].text, 'streamed completion equals the non-streamed one');
  is(finish, comp.choices[0].finish_reason, 'streamed completion finish_reason');

  const lp = await client.chat.completions.create(
    { model, messages, max_tokens: 8, temperature: 0.7, seed: 3, logprobs: true, top_logprobs: 2 });
  const content = lp.choices[0].logprobs && lp.choices[0].logprobs.content;
  ok(Array.isArray(content) && content.length > 0 &&
     content.every((t) => t.logprob <= 1e-6 && t.top_logprobs.length >= 1 && t.top_logprobs.length <= 2),
     'logprobs and top_logprobs', content);

  const stopText = comp.choices[0].text;
  const cut = stopText.slice(4, 8);
  if (cut.length === 4) {
    const stopped = await client.completions.create(
      { model, prompt: 'def fibonacci(n):', max_tokens: 24, temperature: 0, stop: [cut] });
    is(stopped.choices[0].text, stopText.slice(0, stopText.indexOf(cut)), `stop ${JSON.stringify(cut)}`);
    is(stopped.choices[0].finish_reason, 'stop', 'stop: finish_reason stop');
  }

  const plain = await client.completions.create(
    { model, prompt: 'def fibonacci(n):', max_tokens: 24, temperature: 0, speculative: { draft: 0 } });
  is(plain.usage.speculative.drafted, 0, 'speculative {draft: 0} turns drafting off');
  is(plain.choices[0].text, comp.choices[0].text, 'greedy output does not depend on drafting');
  const spec = await client.completions.create(
    { model, prompt: 'def fibonacci(n):', max_tokens: 24, temperature: 0, speculative: { draft: 3, verify: 'match' } });
  ok(spec.usage.speculative.drafted > 0 && spec.usage.speculative.verify === 'match', 'speculative {draft: 3, verify: match}',
     spec.usage.speculative);

  // ------------------------------------------------------------ errors as the client sees them
  async function expectError(promise, status, cls, name, check) {
    try {
      await promise;
      ok(false, name, 'no error');
    } catch (e) {
      ok(e instanceof cls && e.status === status && (!check || check(e)), name,
         `${e.constructor.name} ${e.status} ${e.message}`);
    }
  }
  await expectError(client.chat.completions.create({ model, messages, temperature: 5 }), 400,
                    OpenAI.BadRequestError, 'temperature 5: BadRequestError', (e) => e.param === 'temperature');
  await expectError(client.chat.completions.create({ model: 'gpt-4o', messages }), 400,
                    OpenAI.BadRequestError, 'unknown model: BadRequestError', (e) => e.code === 'model_not_found');
  await expectError(client.chat.completions.create({ model, messages: [] }), 400, OpenAI.BadRequestError,
                    'empty messages: BadRequestError');
  await expectError(client.completions.create({ model, prompt: 'x', n: 0 }), 400, OpenAI.BadRequestError,
                    'n=0: BadRequestError', (e) => e.param === 'n');
  await expectError(client.chat.completions.create({ model, messages, stream: true, speculative: { draft: 'many' } }),
                    400, OpenAI.BadRequestError, 'bad speculative.draft on a stream: 400 before streaming');
  await expectError(client.get('/does-not-exist'), 404, OpenAI.NotFoundError, 'unknown route: NotFoundError');
  // prefix reuse: a chat's next turn keeps the cached rows of what it shares with the last
  // request (usage.prompt_tokens_details.cached_tokens); after another prompt took the context,
  // the prompt cache (--cache-ram) gives the conversation its rows back. A server without the
  // prompt cache prefills it again, and all three answer alike.
  const turn1 = [{ role: 'user', content: 'Tell me about rivers.' }];
  const a1 = await client.chat.completions.create({ model, messages: turn1, max_tokens: 12, temperature: 0 });
  const turn2 = [...turn1, { role: 'assistant', content: a1.choices[0].message.content },
    { role: 'user', content: 'And lakes?' }];
  const warm = await client.chat.completions.create({ model, messages: turn2, max_tokens: 12, temperature: 0 });
  await client.completions.create({ model, prompt: 'Unrelated text', max_tokens: 2 });
  const back = await client.chat.completions.create({ model, messages: turn2, max_tokens: 12, temperature: 0 });
  const cached = warm.usage.prompt_tokens_details && warm.usage.prompt_tokens_details.cached_tokens;
  ok(cached > a1.usage.prompt_tokens && cached < warm.usage.prompt_tokens,
     'next turn: the shared prefix is served from the cache', warm.usage);
  is(back.usage.prompt_tokens_details.cached_tokens, warm.usage.prompt_tokens - 1,
     'after another prompt: the prompt cache restores the conversation (all but the last token)', back.usage);
  is(warm.choices[0].message.content, back.choices[0].message.content, 'restored from the prompt cache: the same answer');
  const metrics = await (await fetch(srv.base + '/metrics')).text();
  const metric = (name) => Number((metrics.match(new RegExp('^' + name + ' (\\S+)$', 'm')) || [])[1]);
  ok(metric('nextn_prompt_cache_restores_total') >= 1 && metric('nextn_prompt_cache_entries') >= 1 &&
     metric('nextn_prompt_cache_bytes') > 0 && metric('nextn_prompt_cache_budget_bytes') === 1024 * 1048576,
     'metrics: the prompt cache restored, holds entries, default budget 1 GiB');
  const nocache = await lib.startServer(['--parallel', '1', '--ctx', '1024', '--cache-ram', '0']);
  const c0 = new OpenAI({ baseURL: nocache.base + '/v1', apiKey: 'unused', maxRetries: 0, timeout: 120000 });
  await c0.chat.completions.create({ model, messages: turn2, max_tokens: 12, temperature: 0 });
  await c0.completions.create({ model, prompt: 'Unrelated text', max_tokens: 2 });
  const cold = await c0.chat.completions.create({ model, messages: turn2, max_tokens: 12, temperature: 0 });
  ok(cold.usage.prompt_tokens_details.cached_tokens < cached, '--cache-ram 0: after another prompt, prefilled again',
     cold.usage);
  is(warm.choices[0].message.content, cold.choices[0].message.content, 'next turn: the same answer from scratch');
  nocache.stop();

  // /tokenize and /detokenize (vLLM's and llama.cpp's shapes) against the independent
  // @huggingface/tokenizers on the model's tokenizer.json; a chat's messages tokenize to the
  // prompt the chat endpoint counts
  const { Tokenizer } = require(path.join(lib.ROOT, 'node_modules', '@huggingface', 'tokenizers'));
  const hf = new Tokenizer(JSON.parse(require('fs').readFileSync(path.join(lib.MODEL, 'tokenizer.json'), 'utf8')), {});
  const post = async (route, body) => {
    const r = await fetch(srv.base + route, { method: 'POST', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify(body) });
    return { status: r.status, body: await r.json() };
  };
  for (const text of ['Hello world', 'def f(x):\n    return x * 2  # ok', 'naïve café 中文 😀', '<｜hy_User:opensource｜>hi']) {
    const want = hf.encode(text, { add_special_tokens: false }).ids;
    const a = await post('/tokenize', { prompt: text });
    const b = await post('/tokenize', { content: text, return_token_strs: true });
    is(JSON.stringify(a.body.tokens), JSON.stringify(want), `/tokenize ${JSON.stringify(text)}: the reference's ids`);
    ok(b.body.count === want.length && b.body.token_strs.length === want.length &&
       b.body.token_strs.every((s, i) => s === hf.id_to_token(want[i])), '/tokenize: content, count, token_strs', b.body);
    const d = await post('/detokenize', { tokens: want });
    is(d.body.prompt, hf.decode(want, { skip_special_tokens: false, clean_up_tokenization_spaces: false }),
       `/detokenize ${JSON.stringify(text)}: the reference's text`);
  }
  const chatUsage = (await client.chat.completions.create({ model, messages, max_tokens: 1, temperature: 0 })).usage;
  const tm = await post('/tokenize', { model, messages });
  is(tm.body.count, chatUsage.prompt_tokens, '/tokenize messages: the chat prompt the endpoint counts');
  const badIds = await post('/detokenize', { tokens: [1, 1e9] });
  ok(badIds.status === 400 && badIds.body.error.param === 'tokens', '/detokenize: an id past the vocabulary is a 400', badIds.body);
  const bad2 = await post('/tokenize', { prompt: 7 });
  ok(bad2.status === 400 && bad2.body.error.param === 'prompt', '/tokenize: a non-string prompt is a 400', bad2.body);
  const bad3 = await post('/tokenize', { prompt: 'x', parse_special: 'yes' });
  ok(bad3.status === 400 && bad3.body.error.param === 'parse_special', '/tokenize: a non-boolean flag is a 400', bad3.body);
  const literal = await post('/tokenize', { prompt: '<｜hy_User:opensource｜>', parse_special: false });
  ok(literal.body.count > 1, '/tokenize parse_special false: a special token\'s text is plain text', literal.body);

  // response_format json_object: every answer is a JSON object or a prefix of one cut by
  // max_tokens; the finished ones parse (the default model is no JSON expert: without the mask
  // none of the same samples does), streamed too; json_schema is refused by name
  const jreq = { model, messages: [{ role: 'user', content: 'Describe a river as JSON.' }], max_tokens: 150,
    temperature: 0.7, seed: 3, n: 8, speculative: { draft: 2 } };
  const jr = await client.chat.completions.create({ ...jreq, response_format: { type: 'json_object' } });
  const parses = (t) => { try { const v = JSON.parse(t); return v !== null && typeof v === 'object' && !Array.isArray(v); } catch (e) { return false; } };
  const finished = jr.choices.filter((c) => c.finish_reason === 'stop');
  ok(finished.length >= 1 && finished.every((c) => parses(c.message.content)),
     `json_object: the ${finished.length} finished answers of 8 are JSON objects`, jr.choices.map((c) => c.message.content));
  ok(jr.choices.every((c) => c.message.content.startsWith('{')), 'json_object: every answer opens an object');
  const free = await client.chat.completions.create(jreq);
  ok(free.choices.every((c) => !parses(c.message.content)), 'without response_format: no answer is a JSON object');
  const js = await client.chat.completions.create({ ...jreq, n: 4, stream: true, response_format: { type: 'json_object' } });
  const jt = ['', '', '', ''], jf = [null, null, null, null];
  for await (const ch of js)
    for (const c of ch.choices) {
      jt[c.index] += c.delta.content || '';
      if (c.finish_reason) jf[c.index] = c.finish_reason;
    }
  ok(jt.every((t, i) => t.startsWith('{') && (jf[i] !== 'stop' || parses(t))), 'json_object stream: objects', jt);
  // json_schema (the structured-outputs subset): the finished answers of 8 validate against the
  // schema with ajv (an independent JSON Schema validator), every answer starts with the first
  // required key, and the unconstrained answers do not validate; a keyword outside the subset
  // is a 400 naming it
  const Ajv = require('ajv');
  // (free text only with a maxLength: the default model rambles inside an unbounded string, and
  // the check needs finished answers; ajv counts code points as the automaton does)
  const schema = { type: 'object', properties: { kind: { enum: ['river', 'lake', null] }, deep: { type: 'boolean' },
    depth: { type: 'integer', minimum: -3, maximum: 40 }, label: { type: 'string', minLength: 2, maxLength: 6 },
    tags: { type: 'array', items: { enum: ['a', 'b'] }, maxItems: 3 },
    code: { type: 'string', pattern: '^[A-Z]{2}-[0-9]{1,3}$' }, when: { type: 'string', format: 'date' },
    host: { type: 'string', format: 'hostname' }, ip6: { type: 'string', format: 'ipv6' },
    span: { type: 'string', format: 'duration', maxLength: 12 },
    note: { type: 'null' } }, required: ['kind', 'deep', 'depth', 'label', 'code', 'when', 'host', 'ip6', 'span'],
    additionalProperties: false };
  const ajv = new Ajv();
  require('ajv-formats')(ajv); // real calendar dates (leap years), as RFC 3339 has them
  const check = ajv.compile(schema);
  const sr = await client.chat.completions.create({ ...jreq, max_tokens: 1000,
    response_format: { type: 'json_schema', json_schema: { name: 'place', schema, strict: true } } });
  const sdone = sr.choices.filter((c) => c.finish_reason === 'stop');
  ok(sdone.length >= 1 && sdone.every((c) => { try { return check(JSON.parse(c.message.content)); } catch (e) { return false; } }),
     `json_schema: the ${sdone.length} finished answers of 8 validate (ajv)`, sr.choices.map((c) => c.message.content));
  ok(sr.choices.every((c) => /^\{\s*"kind"/.test(c.message.content)), 'json_schema: every answer opens with the first key');
  ok(free.choices.every((c) => { try { return !check(JSON.parse(c.message.content)); } catch (e) { return true; } }),
     'without response_format: no answer validates');
  // the shapes Pydantic writes: $defs and $ref (a recursive one), anyOf for Optional, oneOf of
  // different kinds, unions of alike branches (two object shapes told apart by a literal, a
  // number beside an integer); checked with ajv's JSON Schema 2020-12 validator
  const Ajv2020 = require('ajv/dist/2020');
  const pschema = { $defs: { Level: { enum: ['low', 'high'], title: 'Level' },
    Pt: { type: 'object', properties: { x: { type: 'integer' }, up: { type: 'boolean' },
      next: { anyOf: [{ $ref: '#/$defs/Pt' }, { type: 'null' }] } }, required: ['x', 'up'], additionalProperties: false },
    Cat: { type: 'object', properties: { kind: { const: 'cat' }, lives: { type: 'integer', minimum: 0, maximum: 9 } },
      required: ['kind', 'lives'], additionalProperties: false },
    Dog: { type: 'object', properties: { kind: { const: 'dog' }, good: { type: 'boolean' } },
      required: ['kind', 'good'], additionalProperties: false } },
  type: 'object', properties: { level: { anyOf: [{ $ref: '#/$defs/Level' }, { type: 'null' }], default: null },
    at: { $ref: '#/$defs/Pt' }, alt: { oneOf: [{ type: 'integer' }, { type: 'array', items: { type: 'boolean' }, maxItems: 2 }] },
    pet: { oneOf: [{ $ref: '#/$defs/Cat' }, { $ref: '#/$defs/Dog' }] },
    size: { anyOf: [{ type: 'integer' }, { type: 'number' }] },
    score: { type: 'number', minimum: 0.1, exclusiveMaximum: 1 },
    counts: { type: 'object', additionalProperties: { type: 'integer', minimum: 0 },
      propertyNames: { pattern: '^[a-z]{1,8}$' }, maxProperties: 3 },
    colors: { type: 'array', items: { enum: ['red', 'green', 'blue'] }, uniqueItems: true } },
  required: ['level', 'at', 'pet', 'score'], additionalProperties: false };
  const pcheck = new Ajv2020().compile(pschema);
  const pr = await client.chat.completions.create({ ...jreq, max_tokens: 1000,
    response_format: { type: 'json_schema', json_schema: { name: 'pydantic', schema: pschema, strict: true } } });
  const pdone = pr.choices.filter((c) => c.finish_reason === 'stop');
  ok(pdone.length >= 1 && pdone.every((c) => { try { return pcheck(JSON.parse(c.message.content)); } catch (e) { return false; } }),
     `json_schema with $defs, $ref, anyOf, oneOf, alike branches, number bounds, a dict, a set: the ${pdone.length} finished answers of 8 validate (ajv 2020-12)`,
     pr.choices.map((c) => c.message.content));
  await expectError(client.chat.completions.create({ model, messages, response_format: { type: 'json_schema',
    json_schema: { name: 'x', schema: { type: 'object', properties: { a: { anyOf: Array(9).fill({ type: 'object' }) } } } } } }),
                    400, OpenAI.BadRequestError, 'json_schema with 9 alike anyOf branches: 400 saying so',
                    (e) => e.param === 'response_format' && /more than 8/.test(e.message) && /#\/properties\/a/.test(e.message));
  await expectError(client.chat.completions.create({ model, messages, response_format: { type: 'json_schema',
    json_schema: { name: 'x', schema: { type: 'object', properties: { a: { type: 'string', format: 'uri' } } } } } }),
                    400, OpenAI.BadRequestError, 'json_schema with an unsupported format: 400 naming it',
                    (e) => e.param === 'response_format' && /format 'uri'/.test(e.message) && /#\/properties\/a/.test(e.message));
  await expectError(client.chat.completions.create({ model, messages, response_format: { type: 'json_schema',
    json_schema: { name: 'x', schema: { type: 'object', properties: { a: { type: 'string', pattern: '(?<=a)b' } } } } } }),
                    400, OpenAI.BadRequestError, 'json_schema with a lookbehind pattern: 400 saying which part',
                    (e) => e.param === 'response_format' && /pattern: lookarounds/.test(e.message) && /#\/properties\/a/.test(e.message));
  await expectError(client.chat.completions.create({ model, messages, response_format: { type: 'json_schema' } }),
                    400, OpenAI.BadRequestError, 'json_schema without a schema: 400', (e) => e.param === 'response_format');

  // n: several choices per prompt. A seeded request's choice k uses seed + k, so choice 0 is the
  // n = 1 answer (with a fixed draft length: --draft auto's choices follow measured timings, and
  // at temperature > 0 a different draft length draws a different sample); the prompt's tokens
  // count once in usage
  const seeded = { model, messages, max_tokens: 8, temperature: 1, seed: 11, speculative: { draft: 2 } };
  const one = await client.chat.completions.create(seeded);
  const three = await client.chat.completions.create({ ...seeded, n: 3 });
  is(JSON.stringify(three.choices.map((c) => c.index)), '[0,1,2]', 'n=3: three choices in order');
  is(three.choices[0].message.content, one.choices[0].message.content, 'n=3: choice 0 is the n=1 answer (same seed)');
  ok(new Set(three.choices.map((c) => c.message.content)).size > 1, 'n=3: sampled choices differ',
     three.choices.map((c) => c.message.content));
  is(three.usage.prompt_tokens, one.usage.prompt_tokens, 'n=3: the prompt counts once');
  // verify "match" draws each token by its position's seeded race: the same text whatever the
  // draft length, --draft auto included
  const raced = { model, messages, max_tokens: 24, temperature: 1, seed: 5 };
  const texts0 = [];
  for (const draft of [0, 3, 'auto', 'auto']) {
    const r = await client.chat.completions.create({ ...raced, speculative: { draft, verify: 'match' } });
    texts0.push(r.choices[0].message.content);
  }
  ok(texts0[0].length > 0 && texts0.every((x) => x === texts0[0]),
     'verify match, seed 5: draft 0, 3, auto and auto again give the same text', texts0);
  const sn = await client.chat.completions.create({ model, messages, max_tokens: 6, temperature: 0, n: 2, stream: true });
  const texts = ['', ''], fins = [null, null];
  for await (const ch of sn)
    for (const c of ch.choices) {
      texts[c.index] += c.delta.content || '';
      if (c.finish_reason) fins[c.index] = c.finish_reason;
    }
  ok(texts[0].length > 0 && texts[0] === texts[1] && fins[0] && fins[1], 'n=2 stream: both choices, greedy alike',
     { texts, fins });
  const multi = await client.completions.create({ model, prompt: ['def f(x):', 'The'], max_tokens: 4, temperature: 0,
    n: 2 });
  const mt = multi.choices.map((c) => c.text);
  ok(multi.choices.length === 4 && multi.choices.every((c, i) => c.index === i) && mt[0] === mt[1] &&
     mt[2] === mt[3] && mt[0] !== mt[2], 'completions: 2 prompts x n=2 in prompt order', mt);
  await expectError(client.chat.completions.create({ model, messages, n: 17 }), 400, OpenAI.BadRequestError,
                    'n=17 is a 400');

  // logit_bias: +100 on a token makes it the whole answer, greedy or sampled, with speculative
  // decoding on (drafts and verification see the same biased distribution) or off
  const forcedText = require('child_process').execFileSync(lib.NEXTN, ['detokenize', '-m', lib.MODEL, '2000'],
                                                           { encoding: 'utf8' }).replace(/\n$/, '');
  for (const [temperature, draft] of [[0, 'auto'], [0, 0], [1, 3]]) {
    const f = await client.completions.create({ model, prompt: 'def fibonacci(n):', max_tokens: 6, temperature,
      seed: 1, logit_bias: { 2000: 100 }, speculative: { draft } });
    is(f.choices[0].text, forcedText.repeat(6), `logit_bias +100 forces token 2000 (temperature ${temperature}, draft ${draft})`);
  }
  // -100 on the tokens of the unbiased greedy answer: none of them comes back
  const plainIds = require('child_process').execFileSync(lib.NEXTN, ['tokenize', '-m', lib.MODEL, comp.choices[0].text],
                                                         { encoding: 'utf8' }).trim().split(/\s+/);
  const ban = {};
  for (const id of plainIds) ban[id] = -100;
  const banned = await client.completions.create({ model, prompt: 'def fibonacci(n):', max_tokens: 24, temperature: 0,
    logit_bias: ban });
  ok(banned.choices[0].text !== comp.choices[0].text && banned.choices[0].text.length > 0,
     'logit_bias -100 on the greedy answer\'s tokens changes it', banned.choices[0].text);
  await expectError(client.completions.create({ model, prompt: 'x', logit_bias: { 999999: 1 } }), 400,
                    OpenAI.BadRequestError, 'logit_bias: a token id past the vocabulary is a 400');
  // vLLM's stop_token_ids and min_tokens: a forced stop token ends the answer at once, or right
  // after min_tokens others (masked until then, for the drafts too)
  for (const [min_tokens, draft] of [[0, 0], [5, 0], [5, 3], [5, 'auto']]) {
    const f = await client.completions.create({ model, prompt: 'def fibonacci(n):', max_tokens: 20, temperature: 0.8,
      seed: 2, logit_bias: { 2000: 100 }, stop_token_ids: [2000], min_tokens, speculative: { draft } });
    ok(f.choices[0].finish_reason === 'stop' && f.usage.completion_tokens === min_tokens + 1 &&
       f.choices[0].text.endsWith(forcedText) && !f.choices[0].text.slice(0, -forcedText.length).includes(forcedText),
       `stop_token_ids with min_tokens ${min_tokens} (draft ${draft}): ${min_tokens} tokens, then the stop token`,
       { text: f.choices[0].text, usage: f.usage });
  }
  await expectError(client.completions.create({ model, prompt: 'x', stop_token_ids: [5, -1] }), 400,
                    OpenAI.BadRequestError, 'stop_token_ids: a negative id is a 400', (e) => e.param === 'stop_token_ids');
  await expectError(client.completions.create({ model, prompt: 'x', min_tokens: -3 }), 400,
                    OpenAI.BadRequestError, 'min_tokens < 0 is a 400', (e) => e.param === 'min_tokens');

  srv.stop();
  await lib.waitExit(srv);

  const keyed = await lib.startServer(['--api-key', 'k3y']);
  const bad = new OpenAI({ baseURL: keyed.base + '/v1', apiKey: 'wrong', maxRetries: 0 });
  await expectError(bad.models.list(), 401, OpenAI.AuthenticationError, 'wrong key: AuthenticationError');
  const good = new OpenAI({ baseURL: keyed.base + '/v1', apiKey: 'k3y', maxRetries: 0 });
  const m2 = await good.models.list();
  ok(m2.data.length === 1, 'right key: models.list');
  const c2 = await good.completions.create({ model, prompt: 'Hi', max_tokens: 3 });
  ok(c2.choices.length === 1, 'right key: completions');
  keyed.stop();
  await lib.waitExit(keyed);
  done();
}

main().catch((e) => { ok(false, 'unexpected exception', e && e.stack ? e.stack : String(e)); done(); });
