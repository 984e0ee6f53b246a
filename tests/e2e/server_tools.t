#!/usr/bin/env node
// Hy3 reasoning and tool calls through `nextn serve`, read by the official `openai` npm client.
// A scripted copy of the default model (tests/ref/make_scripted_ckpt.py: greedy decoding after
// the assistant marker emits a fixed token sequence) says
//   <think>Hmm</think>Sure<tool_calls><tool_call>get_weather<tool_sep>
//   <arg_key>days</arg_key><arg_value>3</arg_value></tool_call></tool_calls>
// with every marker the real special token of the shipped tokenizer (":opensource" suffix).
// Checked: reasoning_content / content / tool_calls (typed by the request's schema) with
// finish_reason "tool_calls", streaming and not (the calls stream as deltas: id and name first,
// then the arguments pair by pair; the client's own stream accumulator rebuilds the message); no tools offered, or tool_choice "none": no split of the calls; cut short by
// max_tokens: "length"; tool_choice "required" or a named function opens the call in the
// prompt, and its arguments follow the tool's schema where the script does not; --reasoning-format
// none leaves the reasoning in the content.
'use strict';
const { execFileSync } = require('child_process');
const fs = require('fs');
const os = require('os');
const path = require('path');
const lib = require(path.join(__dirname, '..', 'server', 'lib.js'));
const { ok, is, done } = lib;

lib.skipAllUnlessReady();
const OpenAI = require('openai');

const SCRIPT = '<think:opensource>Hmm</think:opensource>Sure<tool_calls:opensource><tool_call:opensource>get_weather' +
  '<tool_sep:opensource><arg_key:opensource>days</arg_key:opensource><arg_value:opensource>3</arg_value:opensource>' +
  '</tool_call:opensource></tool_calls:opensource>';
const TOOLS = [{
  type: 'function',
  function: { name: 'get_weather', parameters: { type: 'object', properties: { days: { type: 'integer' } } } },
}];

function tokenize(text) {
  return execFileSync(lib.NEXTN, ['tokenize', '-m', lib.MODEL, text], { encoding: 'utf8' }).trim().split(/\s+/).map(Number);
}

async function main() {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'nextn-scripted-'));
  process.on('exit', () => fs.rmSync(dir, { recursive: true, force: true }));
  const [after] = tokenize('<｜hy_Assistant:opensource｜>');
  const script = tokenize(SCRIPT);
  const eos = JSON.parse(fs.readFileSync(path.join(lib.MODEL, 'config.json'), 'utf8')).eos_token_id;
  execFileSync('/usr/bin/python3', [path.join(lib.ROOT, 'tests', 'ref', 'make_scripted_ckpt.py'), '--base', lib.MODEL,
    '--after', String(after), '--script', script.join(','), '--eos', String(eos), '--out', dir]);
  const srv = await lib.startServer(['-m', dir, '--model-id', 'scripted']);
  const client = new OpenAI({ baseURL: srv.base + '/v1', apiKey: 'unused', maxRetries: 0, timeout: 120000 });
  const base = { model: 'scripted', messages: [{ role: 'user', content: 'Weather in 3 days?' }], temperature: 0 };

  // not streaming
  let r = await client.chat.completions.create({ ...base, tools: TOOLS });
  let c = r.choices[0], m = c.message;
  is(c.finish_reason, 'tool_calls', 'finish_reason tool_calls');
  is(m.content, 'Sure', 'content: the text between the reasoning and the calls');
  is(m.reasoning_content, 'Hmm', 'reasoning_content');
  ok(Array.isArray(m.tool_calls) && m.tool_calls.length === 1, 'one tool call', m.tool_calls);
  const call = m.tool_calls[0];
  ok(/^call_[0-9a-f]{16}$/.test(call.id), 'call id', call.id);
  is(call.type, 'function', 'call type');
  is(call.function.name, 'get_weather', 'function name');
  is(JSON.stringify(JSON.parse(call.function.arguments)), '{"days":3}', 'arguments: days an integer, per the schema');

  // a string schema keeps the value's text
  r = await client.chat.completions.create({ ...base,
    tools: [{ type: 'function', function: { name: 'get_weather',
      parameters: { type: 'object', properties: { days: { type: 'string' } } } } }] });
  is(r.choices[0].message.tool_calls[0].function.arguments, '{"days":"3"}', 'arguments: days a string, per the schema');

  // streaming: the client's accumulator rebuilds the same message
  const stream = client.chat.completions.stream({ ...base, tools: TOOLS });
  let reasoning = '', chunks = 0, lastFinish = null, callChunks = 0, firstCall = null;
  const argParts = [];
  stream.on('chunk', (ch) => {
    chunks++;
    for (const x of ch.choices) {
      reasoning += x.delta.reasoning_content || '';
      if (x.delta.tool_calls) callChunks++;
      for (const tc of x.delta.tool_calls || []) {
        if (!firstCall) firstCall = tc;
        if (tc.function && tc.function.arguments !== undefined) argParts.push(tc.function.arguments);
      }
      if (x.finish_reason) lastFinish = x.finish_reason;
    }
  });
  const fin = await stream.finalChatCompletion();
  const fm = fin.choices[0].message;
  is(fin.choices[0].finish_reason, 'tool_calls', 'stream: finish_reason tool_calls');
  is(lastFinish, 'tool_calls', 'stream: the last chunk carries it');
  is(fm.content, 'Sure', 'stream: content');
  is(reasoning, 'Hmm', 'stream: reasoning_content deltas');
  // the call streams as OpenAI's deltas: its id and name once the name is complete, the
  // arguments as each key/value pair completes, the closing brace at the end
  ok(callChunks === 3 && fm.tool_calls && fm.tool_calls.length === 1, `stream: the call in ${callChunks} chunks`,
     fm.tool_calls);
  is(JSON.stringify(argParts), JSON.stringify(['', '{', '"days":3', '}']), 'stream: the argument fragments in order');
  ok(firstCall && firstCall.id === fm.tool_calls[0].id && firstCall.function.name === 'get_weather' &&
     firstCall.type === 'function', 'stream: the first delta names the call, with the id it keeps', firstCall);
  is(fm.tool_calls[0].function.name, 'get_weather', 'stream: function name');
  is(fm.tool_calls[0].function.arguments, '{"days":3}', 'stream: arguments');
  ok(/^call_[0-9a-f]{16}$/.test(fm.tool_calls[0].id), 'stream: call id', fm.tool_calls[0].id);

  // no tools offered, or tool_choice "none": the calls are not split out (their special tokens
  // are not text); the reasoning still is
  for (const extra of [{}, { tools: TOOLS, tool_choice: 'none' }]) {
    const what = extra.tools ? 'tool_choice none' : 'no tools';
    r = await client.chat.completions.create({ ...base, ...extra });
    c = r.choices[0];
    is(c.finish_reason, 'stop', `${what}: finish_reason stop`);
    ok(!c.message.tool_calls, `${what}: no tool_calls`, c.message.tool_calls);
    is(c.message.content, 'Sureget_weatherdays3', `${what}: content`);
    is(c.message.reasoning_content, 'Hmm', `${what}: reasoning_content`);
  }

  // cut short inside the call: what parsed so far, finish_reason "length"
  const upToKey = tokenize(SCRIPT.slice(0, SCRIPT.indexOf('</arg_key:opensource>'))).length;
  r = await client.chat.completions.create({ ...base, tools: TOOLS, max_tokens: upToKey + 1 });
  c = r.choices[0];
  is(c.finish_reason, 'length', 'cut short: finish_reason length');
  ok(c.message.tool_calls && c.message.tool_calls[0].function.name === 'get_weather' &&
     c.message.tool_calls[0].function.arguments === '{}', 'cut short: the call without its unfinished argument',
     c.message.tool_calls);

  // tool_choice "required" or a named function: the prompt opens the call, the answer is one
  // (the scripted model goes on from the last token it is given: the separator, or <tool_call>)
  const TWO = [...TOOLS, { type: 'function', function: { name: 'other' } }];
  for (const [choice, name, args] of [['required', 'get_weather', '{"days":3}'],
    [{ type: 'function', function: { name: 'get_weather' } }, 'get_weather', '{"days":3}'],
    [{ type: 'function', function: { name: 'other' } }, 'other', '{"days":"3"}']]) {
    const what = typeof choice === 'string' ? choice : 'named ' + name;
    r = await client.chat.completions.create({ ...base, tools: TWO, tool_choice: choice });
    c = r.choices[0];
    is(c.finish_reason, 'tool_calls', `tool_choice ${what}: finish_reason tool_calls`);
    ok(c.message.content === null && c.message.tool_calls && c.message.tool_calls.length === 1 &&
       c.message.tool_calls[0].function.name === name && c.message.tool_calls[0].function.arguments === args,
       `tool_choice ${what}: the call, typed by its function's schema`, c.message);
  }
  const forcedStream = await client.chat.completions.stream({ ...base, tools: TWO, tool_choice: 'required' });
  const ff = await forcedStream.finalChatCompletion();
  is(ff.choices[0].message.tool_calls[0].function.arguments, '{"days":3}', 'tool_choice required, streamed');
  // a forced call's arguments follow the tool's schema, whatever the model would write: the
  // scripted "days" = 3 is refused where days is at most 2, and a required city comes first
  // (from there the bigram model has no preference: greedy takes the lowest allowed id)
  const CONSTRAINED = [
    { type: 'function', function: { name: 'few_days', parameters: { type: 'object',
      properties: { days: { type: 'integer', minimum: 0, maximum: 2 } }, required: ['days'] } } },
    { type: 'function', function: { name: 'by_city', parameters: { type: 'object',
      properties: { city: { type: 'string' }, days: { type: 'integer' } }, required: ['city'] } } },
  ];
  const checks = {
    few_days: (a) => Object.keys(a).join() === 'days' && Number.isInteger(a.days) && a.days >= 0 && a.days <= 2,
    by_city: (a) => typeof a.city === 'string' && Object.keys(a)[0] === 'city' &&
      Object.keys(a).every((k) => k === 'city' || (k === 'days' && Number.isInteger(a.days))),
  };
  for (const name of ['few_days', 'by_city']) {
    for (const stream of [false, true]) {
      const req = { ...base, tools: CONSTRAINED, tool_choice: { type: 'function', function: { name } } };
      const res = stream ? await client.chat.completions.stream(req).finalChatCompletion()
        : await client.chat.completions.create(req);
      const call = res.choices[0].message.tool_calls && res.choices[0].message.tool_calls[0];
      let args = null;
      try { args = JSON.parse(call.function.arguments); } catch (e) { /* reported below */ }
      ok(res.choices[0].finish_reason === 'tool_calls' && call.function.name === name && args && checks[name](args),
         `tool_choice ${name}${stream ? ', streamed' : ''}: arguments that match its schema`, res.choices[0]);
    }
  }
  // tool_choice required: the name is one of the tools' too
  r = await client.chat.completions.create({ ...base, tools: CONSTRAINED, tool_choice: 'required' });
  c = r.choices[0];
  ok(c.finish_reason === 'tool_calls' && c.message.tool_calls.length >= 1 &&
     c.message.tool_calls.every((t) => checks[t.function.name] && checks[t.function.name](JSON.parse(t.function.arguments))),
     'tool_choice required: calls of the given tools, with valid arguments', c.message);
  // more tools or properties than a forced call's grammar tells apart: a 400 naming them
  const many = Array.from({ length: 65 }, (_, i) => ({ type: 'function', function: { name: `t${i}` } }));
  const wide = [{ type: 'function', function: { name: 'wide', parameters: { type: 'object',
    properties: Object.fromEntries(Array.from({ length: 65 }, (_, i) => [`p${i}`, { type: 'integer' }])) } } }];
  for (const [tools, why] of [[many, '65 tools'], [wide, '65 properties']]) {
    try {
      await client.chat.completions.create({ ...base, tools, tool_choice: 'required' });
      ok(false, `tool_choice required with ${why}: a 400`);
    } catch (e) {
      ok(e instanceof OpenAI.BadRequestError && e.param === 'tools' && /64/.test(e.message),
         `tool_choice required with ${why}: a 400`, `${e.constructor.name} ${e.status} ${e.param} ${e.message}`);
    }
  }
  for (const [choice, tools, why] of [[{ type: 'function', function: { name: 'missing' } }, TWO, 'an unknown name'],
    ['required', undefined, 'no tools'], ['sometimes', TWO, 'an unknown choice']]) {
    try {
      await client.chat.completions.create({ ...base, tools, tool_choice: choice });
      ok(false, `tool_choice with ${why}: a 400`);
    } catch (e) {
      ok(e instanceof OpenAI.BadRequestError && /tool_choice/.test(e.param || ''), `tool_choice with ${why}: a 400`,
         `${e.constructor.name} ${e.status} ${e.param} ${e.message}`);
    }
  }
  // The round trip of the official clients: the assistant's calls sent back with "content": null
  // (arguments as a JSON string) and the tool's result. The template renders them as the model
  // writes calls (string arguments raw, others JSON) and wraps the result; the prompt the server
  // rendered has exactly the tokens of that text, which @huggingface/jinja renders alike.
  const back = [
    { role: 'user', content: 'Weather in 3 days?' },
    { role: 'assistant', content: null,
      tool_calls: [{ id: call.id, type: 'function', function: { name: 'get_weather', arguments: '{"days":3,"unit":"C"}' } }] },
    { role: 'tool', tool_call_id: call.id, content: '{"temp":21}' },
  ];
  r = await client.chat.completions.create({ model: 'scripted', messages: back, tools: TOOLS, temperature: 0, max_tokens: 4 });
  is(r.choices.length, 1, 'round trip: assistant tool_calls with content null and a tool result: 200');
  const tcfg = JSON.parse(fs.readFileSync(path.join(lib.MODEL, 'tokenizer_config.json'), 'utf8'));
  const expected = '<｜hy_begin_of_sentence:opensource｜><tool_calls:opensource>' + JSON.stringify(TOOLS).replace(/,/g, ', ').replace(/:/g, ': ') +
    '</tool_calls:opensource><｜hy_User:opensource｜>Weather in 3 days?<｜hy_Assistant:opensource｜>' +
    '<tool_calls:opensource>\n<tool_call:opensource>get_weather<tool_sep:opensource>\n' +
    '<arg_key:opensource>days</arg_key:opensource>\n<arg_value:opensource>3</arg_value:opensource>\n' +
    '<arg_key:opensource>unit</arg_key:opensource>\n<arg_value:opensource>C</arg_value:opensource>\n' +
    '</tool_call:opensource>\n</tool_calls:opensource><｜hy_eos:opensource｜>' +
    '<tool_response:opensource>{"temp":21}</tool_response:opensource><｜hy_Assistant:opensource｜>';
  const { Template } = require('@huggingface/jinja');
  const parsed = back.map((m) => m.tool_calls ? { ...m, tool_calls: m.tool_calls.map((tc) => ({ ...tc,
    function: { ...tc.function, arguments: JSON.parse(tc.function.arguments) } })) } : m);
  is(new Template(tcfg.chat_template).render({ messages: parsed, tools: TOOLS, add_generation_prompt: true,
    bos_token: tcfg.bos_token, eos_token: tcfg.eos_token }), expected, 'round trip: the reference renderer agrees');
  is(r.usage.prompt_tokens, tokenize(expected).length, 'round trip: the prompt is the call and the result as rendered');
  // the same with the arguments as an object (some clients send them parsed)
  back[1].tool_calls[0].function.arguments = { days: 3, unit: 'C' };
  r = await client.chat.completions.create({ model: 'scripted', messages: back, tools: TOOLS, temperature: 0, max_tokens: 4 });
  is(r.usage.prompt_tokens, tokenize(expected).length, 'round trip: object arguments render the same');
  srv.stop();

  // --reasoning-format none: the reasoning stays in the content (its markers are not text)
  const plain = await lib.startServer(['-m', dir, '--model-id', 'scripted', '--reasoning-format', 'none']);
  const pc = new OpenAI({ baseURL: plain.base + '/v1', apiKey: 'unused', maxRetries: 0, timeout: 120000 });
  r = await pc.chat.completions.create({ ...base, tools: TOOLS });
  c = r.choices[0];
  is(c.message.content, 'HmmSure', '--reasoning-format none: content');
  ok(c.message.reasoning_content === undefined, '--reasoning-format none: no reasoning_content', c.message);
  is(c.message.tool_calls && c.message.tool_calls[0].function.arguments, '{"days":3}',
     '--reasoning-format none: the tool call still parsed');
  plain.stop();
  done();
}

main().catch((e) => { ok(false, 'unexpected error', e.stack || String(e)); done(); });
