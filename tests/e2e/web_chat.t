#!/usr/bin/env node
// The chat page in a real browser: headless Chromium (Debian's chromium, driven by puppeteer-core)
// loads GET / from a server on the default model, chats through the page's own controls, and the
// page must show the API's greedy answer, mark exactly the text the stream says came from accepted
// drafts, show the server's speculation figures, keep the conversation across a reload, regenerate
// and edit, and ask for the key of a server started with --api-key. Any page error or console
// error fails the test. Screenshots at 1440 and 360 px wide go to BUILD/test-out/web_chat/.
'use strict';
const fs = require('fs');
const path = require('path');
const lib = require(path.join(__dirname, '..', 'server', 'lib.js'));
const { ok, is, note, done } = lib;

lib.skipAllUnlessReady();
const puppeteer = require('puppeteer-core');

const CHROMIUM = process.env.CHROMIUM || '/usr/bin/chromium';
const OUT = path.join(path.dirname(lib.NEXTN), 'test-out', 'web_chat');
const MAX_TOKENS = 40, DRAFT = 3;

// The API's answer to what the page sends: greedy, streamed, with the chunks' draft sources. A
// chunk's text counts as drafted when every token behind it was an accepted draft (the page's rule).
async function apiStream(base, messages, headers = {}) {
  const r = await fetch(base + '/v1/chat/completions', {
    method: 'POST', headers: { 'Content-Type': 'application/json', ...headers },
    body: JSON.stringify({ messages, temperature: 0, max_tokens: MAX_TOKENS, stream: true,
      stream_options: { include_usage: true }, speculative: { draft: DRAFT, verify: 'residual' } }) });
  const text = await r.text();
  let content = '', reasoning = '', usage = null;
  const cflags = [], rflags = [];
  for (const ev of text.split('\n\n')) {
    if (!ev.startsWith('data: ') || ev === 'data: [DONE]') continue;
    const c = JSON.parse(ev.slice(6));
    if (c.usage) usage = c.usage;
    for (const ch of c.choices) {
      const d = ch.delta || {};
      const dr = !!(ch.nextn && ch.nextn.drafted.length && ch.nextn.drafted.every(Boolean));
      for (const [s, flags] of [[d.content || '', cflags], [d.reasoning_content || '', rflags]])
        for (let i = 0; i < s.length; i++) flags.push(dr);
      content += d.content || '';
      reasoning += d.reasoning_content || '';
    }
  }
  return { content, reasoning, cflags, rflags, usage };
}

async function apiGreedy(base, messages, headers = {}) {
  const r = await fetch(base + '/v1/chat/completions', {
    method: 'POST', headers: { 'Content-Type': 'application/json', ...headers },
    body: JSON.stringify({ messages, temperature: 0, max_tokens: MAX_TOKENS }) });
  return (await r.json()).choices[0].message;
}

// The page's last assistant message once it is done: its text, and the drafted marks in it.
async function lastAnswer(page) {
  await page.waitForSelector('#messages .msg.assistant:last-child[data-state="done"]', { timeout: 60000 });
  return page.evaluate(() => {
    const m = [...document.querySelectorAll('#messages .msg.assistant')].pop();
    const body = m.querySelector('.body');
    const marks = (root) => [...root.querySelectorAll('.dr')].map((s) => ({ o: Number(s.dataset.o), t: s.textContent }));
    const r = m.querySelector('.reasoning .text');
    return { text: body.textContent, raw: body.classList.contains('raw'), marks: marks(body), error: m.classList.contains('error'),
      reasoning: r ? r.textContent : '', rmarks: r ? marks(r) : [], folded: r ? !m.querySelector('.reasoning').open : null,
      count: document.querySelectorAll('#messages .msg').length };
  });
}

// Marks agree with the flags: each mark is the source's text at its offset, drafted throughout, and
// (exact, for raw text where every character is shown) the marks cover every drafted character.
function marksMatch(marks, src, flags, exact) {
  const seen = new Array(src.length).fill(false);
  for (const m of marks) {
    if (src.substr(m.o, m.t.length) !== m.t) return `mark at ${m.o} is ${JSON.stringify(m.t)}, the text there is ${JSON.stringify(src.substr(m.o, m.t.length))}`;
    for (let i = m.o; i < m.o + m.t.length; i++) {
      if (!flags[i]) return `character ${i} (${JSON.stringify(src[i])}) is marked but the stream did not draft it`;
      seen[i] = true;
    }
  }
  if (exact) for (let i = 0; i < src.length; i++) if (flags[i] && !seen[i]) return `character ${i} was drafted but is not marked`;
  return null;
}

async function send(page, text) {
  await page.focus('#prompt');
  await page.keyboard.type(text);
  await page.keyboard.press('Enter');
  return lastAnswer(page);
}

async function main() {
  fs.mkdirSync(OUT, { recursive: true });
  const srv = await lib.startServer(['--ctx', '1024']);
  const browser = await puppeteer.launch({ executablePath: CHROMIUM, headless: true,
    args: ['--no-sandbox', '--disable-gpu', '--disable-dev-shm-usage', '--no-first-run'] });
  const problems = [];
  const page = await browser.newPage();
  page.on('pageerror', (e) => problems.push('page error: ' + e.message));
  page.on('console', (m) => { if (m.type() === 'error') problems.push('console error: ' + m.text()); });
  page.on('requestfailed', (r) => problems.push('request failed: ' + r.url()));
  await page.setViewport({ width: 1440, height: 900 });
  await page.goto(srv.base + '/', { waitUntil: 'networkidle0' });
  await page.waitForSelector('body[data-ready="true"]');
  ok(/nextn-hy3-tiny/.test(await page.$eval('#model', (e) => e.textContent)), 'the page names the model');

  // settings through the page's controls, keyboard only where a user would type
  await page.click('#toggle-settings');
  is(await page.$eval('#settings', (e) => !e.hidden), true, 'Settings opens the panel');
  await page.click('#temperature', { clickCount: 3 });
  await page.keyboard.type('0');
  await page.click('#max_tokens', { clickCount: 3 });
  await page.keyboard.type(String(MAX_TOKENS));
  await page.keyboard.press('Tab');
  await page.select('#draft', String(DRAFT));
  await page.select('#verify', 'residual');
  await page.click('#close-settings');

  const q1 = 'Write a C comment about a linked list.';
  const a1 = await send(page, q1);
  const msgs1 = [{ role: 'user', content: q1 }];
  const api = await apiStream(srv.base, msgs1);
  const greedy = await apiGreedy(srv.base, msgs1);
  ok(!a1.error, 'the answer streamed without an error');
  is(api.content, greedy.content || '', 'the API\'s streamed and plain greedy answers agree');
  is(a1.reasoning, greedy.reasoning_content || '', 'the page\'s reasoning is the API\'s');
  ok(a1.folded !== false, 'reasoning is folded');
  const stored = await page.evaluate(() => {
    const convs = JSON.parse(localStorage.getItem('nextn.convs'));
    return convs[0].messages[1].content;
  });
  is(stored, greedy.content || '', 'the page\'s answer is the API\'s greedy answer');
  ok(api.cflags.some(Boolean), 'the stream marks some of the answer as accepted drafts', api.usage);
  const mdBad = marksMatch(a1.marks, stored, api.cflags, false);
  ok(mdBad === null && a1.marks.length > 0, 'markdown view: every marked span is text the stream drafted', mdBad);
  const rBad = marksMatch(a1.rmarks, a1.reasoning, api.rflags, true);
  ok(rBad === null, 'reasoning: marked exactly where the stream drafted', rBad);

  // the panel shows the server's figures for this request
  const sp = api.usage.speculative;
  const panel = await page.evaluate(() => ({ tau: document.getElementById('s-tau').textContent,
    rate: document.getElementById('s-rate').textContent, k: document.getElementById('s-k').textContent,
    bars: [...document.querySelectorAll('#s-pos .bar')].map((b) => b.title), tps: document.getElementById('s-tps').textContent }));
  is(panel.tau, sp.mean_acceptance_length.toFixed(2), 'panel: the mean acceptance length is the server\'s');
  is(panel.rate, Math.round(sp.acceptance_rate * 100) + '%', 'panel: the acceptance rate is the server\'s');
  is(JSON.stringify(panel.bars), JSON.stringify(sp.drafted_at.map((n, i) => `position ${i + 1}: ${sp.accepted_at[i]} of ${n} accepted`)),
     'panel: acceptance per chain position is the server\'s');
  ok(Number(panel.tps) > 0, 'panel: tokens/s', panel);
  ok(Number(panel.k) >= 0 && Number(panel.k) <= DRAFT, 'panel: the current k', panel);
  await page.screenshot({ path: path.join(OUT, 'chat-1440.png'), fullPage: false });

  // raw text: every character shown, so the marks must be exactly the drafted characters
  await page.click('#toggle-settings');
  await page.click('#raw');
  await page.click('#close-settings');
  const raw = await lastAnswer(page);
  is(raw.text, stored, 'raw view shows the answer as generated');
  const exact = marksMatch(raw.marks, raw.text, api.cflags, true);
  ok(raw.raw && exact === null, 'raw view: marked exactly where the stream drafted', exact);

  // regenerate (greedy: the same answer again), then a reload keeps the conversation
  await page.click('#messages .msg.assistant:last-child .actions button:nth-child(2)');
  await page.waitForSelector('#messages .msg.assistant:last-child[data-state="streaming"], #messages .msg.assistant:last-child[data-state="done"]');
  const again = await lastAnswer(page);
  ok(again.text === stored && again.count === 2, 'Regenerate: the greedy answer again, in place', again);
  await page.reload({ waitUntil: 'networkidle0' });
  await page.waitForSelector('body[data-ready="true"]');
  const kept = await lastAnswer(page);
  ok(kept.text === stored && kept.count === 2, 'a reload keeps the conversation (local storage)', kept);

  // edit the question: what followed goes, the new answer is the API's for the new question
  await page.click('#messages .msg.user .actions button');
  await page.waitForSelector('#messages textarea.edit');
  const q2 = 'Name three sorting algorithms.';
  await page.$eval('#messages textarea.edit', (e, v) => { e.value = v; }, q2);
  await page.click('#messages .msg.user .actions button');
  await page.waitForSelector('#messages .msg.assistant[data-state="streaming"], #messages .msg.assistant[data-state="done"]');
  const a2 = await lastAnswer(page);
  const g2 = await apiGreedy(srv.base, [{ role: 'user', content: q2 }]);
  ok(a2.text === (g2.content || '') && a2.count === 2, 'Edit: the edited question gets the API\'s answer', { page: a2.text, api: g2.content });

  // a follow-up turn sends the history
  const q3 = 'And one more?';
  const a3 = await send(page, q3);
  const g3 = await apiGreedy(srv.base, [{ role: 'user', content: q2 }, { role: 'assistant', content: g2.content || '' }, { role: 'user', content: q3 }]);
  ok(a3.text === (g3.content || '') && a3.count === 4, 'a second turn gets the API\'s answer to the whole conversation', { page: a3.text, api: g3.content });

  // a tool call in the history is shown as a call
  await page.evaluate(() => {
    const convs = JSON.parse(localStorage.getItem('nextn.convs'));
    convs[0].messages.push({ role: 'assistant', content: '', tool_calls: [{ id: 'call_1', type: 'function',
      function: { name: 'get_weather', arguments: '{"city":"Paris"}' } }] });
    localStorage.setItem('nextn.convs', JSON.stringify(convs));
  });
  await page.reload({ waitUntil: 'networkidle0' });
  await page.waitForSelector('body[data-ready="true"]');
  const call = await page.$eval('#messages .msg.assistant:last-child .tool-call', (e) => e.textContent);
  ok(/^call get_weather\(\{\s*"city": "Paris"\s*\}\)$/.test(call), 'a tool call is shown as a call', call);

  // markdown and code highlighting, drafted text marked through both (a stored answer, all drafted)
  const md = 'Here:\n\n```c\nint main(void) { return 0; } // done\n```\n\n**bold** and `code`\n\n- one\n- two';
  await page.evaluate((content) => {
    const convs = JSON.parse(localStorage.getItem('nextn.convs'));
    convs[0].messages.push({ role: 'assistant', content, pieces: [[content, true]] });
    localStorage.setItem('nextn.convs', JSON.stringify(convs));
  }, md);
  await page.reload({ waitUntil: 'networkidle0' });
  await page.waitForSelector('body[data-ready="true"]');
  await page.click('#toggle-settings');
  await page.click('#raw'); // back to markdown
  await page.click('#close-settings');
  const shown = await page.evaluate(() => {
    const m = [...document.querySelectorAll('#messages .msg.assistant')].pop();
    const cls = (c) => [...m.querySelectorAll('.hl-' + c)].map((e) => e.textContent);
    return { kw: cls('kw'), fn: cls('fn'), num: cls('num'), com: cls('com'), lang: m.querySelector('pre code').dataset.lang,
      strong: m.querySelector('strong').textContent, code: m.querySelector(':not(pre) > code').textContent,
      items: [...m.querySelectorAll('li')].map((e) => e.textContent),
      marks: [...m.querySelectorAll('.body .dr')].map((e) => ({ o: Number(e.dataset.o), t: e.textContent })) };
  });
  is(JSON.stringify([shown.kw, shown.fn, shown.num, shown.com, shown.lang]),
     JSON.stringify([['int', 'void', 'return'], ['main'], ['0'], ['// done'], 'c']), 'a C code block is highlighted');
  ok(shown.strong === 'bold' && shown.code === 'code' && shown.items.join('|') === 'one|two', 'markdown: bold, code, lists', shown);
  const allMarked = marksMatch(shown.marks, md, new Array(md.length).fill(true), false);
  const markedText = shown.marks.map((x) => x.t).join('');
  ok(allMarked === null && markedText === 'Here:int main(void) { return 0; } // donebold and codeonetwo',
     'markdown: drafted text is marked inside code, bold and lists', { allMarked, markedText });

  // narrow: readable at 360 px (no sideways scrolling), panels closed
  await page.setViewport({ width: 360, height: 740 });
  const wide = await page.evaluate(() => document.documentElement.scrollWidth);
  ok(wide <= 360, 'at 360 px nothing scrolls sideways', wide);
  await page.screenshot({ path: path.join(OUT, 'chat-360.png'), fullPage: false });
  await page.setViewport({ width: 1440, height: 900 });

  // keyboard: Tab from the message box reaches the Send button
  await page.focus('#prompt');
  await page.keyboard.press('Tab');
  is(await page.evaluate(() => document.activeElement.id), 'send', 'Tab from the message box reaches Send');
  ok(problems.length === 0, 'no page or console errors (server without a key)', problems);

  // Stop: a long answer (a model view with room for thousands of tokens) is cut short, the
  // server goes on serving; the aborted request is the one failure expected
  const long = await lib.startServer(['-m', lib.longContextModel(), '--ctx', '8192']);
  const sp2 = await browser.newPage();
  const sproblems = [];
  sp2.on('pageerror', (e) => sproblems.push('page error: ' + e.message));
  sp2.on('console', (m) => { if (m.type() === 'error') sproblems.push('console error: ' + m.text()); });
  sp2.on('requestfailed', (r) => { if (!(r.failure() && /ERR_ABORTED/.test(r.failure().errorText))) sproblems.push('request failed: ' + r.url()); });
  // the page's request gets ignore_eos, so the sampled answer cannot end before Escape does
  await sp2.setRequestInterception(true);
  sp2.on('request', (r) => {
    if (r.method() === 'POST' && r.url().endsWith('/v1/chat/completions')) {
      const b = JSON.parse(r.postData());
      b.ignore_eos = true;
      r.continue({ postData: JSON.stringify(b) });
    } else r.continue();
  });
  await sp2.goto(long.base + '/', { waitUntil: 'networkidle0' });
  await sp2.waitForSelector('body[data-ready="true"]');
  await sp2.evaluate(() => { localStorage.setItem('nextn.settings', JSON.stringify({ max_tokens: 7000, temperature: 0.8, draft: 'auto', verify: 'residual', showDrafts: true, raw: true })); });
  await sp2.reload({ waitUntil: 'networkidle0' });
  await sp2.waitForSelector('body[data-ready="true"]');
  await sp2.focus('#prompt');
  await sp2.keyboard.type('Tell a long story.');
  await sp2.keyboard.press('Enter');
  await sp2.waitForFunction(() => { const m = document.querySelector('#messages .msg.assistant .body'); return m && m.textContent.length > 20; }, { timeout: 30000 });
  ok(await sp2.$eval('#stop', (e) => !e.hidden), 'Stop shows while the answer streams');
  await sp2.keyboard.press('Escape');
  await sp2.waitForSelector('#messages .msg.assistant[data-state="done"]', { timeout: 10000 });
  const stopped = await sp2.$eval('#messages .msg.assistant', (e) => ({ role: e.querySelector('.role').textContent, error: e.classList.contains('error') }));
  ok(/stopped/.test(stopped.role) && !stopped.error, 'Escape stops the answer', stopped);
  // the server notices the closed stream at its next write: within a few seconds
  let active = -1;
  for (let i = 0; i < 100 && active !== 0; i++) {
    active = (await (await fetch(long.base + '/health')).json()).active;
    if (active !== 0) await new Promise((res) => setTimeout(res, 100));
  }
  ok(active === 0, 'the server stops generating for nobody', active);
  ok(sproblems.length === 0, 'no page or console errors (stop)', sproblems);
  await sp2.close();
  long.stop();

  // a server with a key: the page loads, asks for it, and chats with it
  const ks = await lib.startServer(['--ctx', '512', '--api-key', 'sesame']);
  const kp = await browser.newPage();
  const kproblems = [];
  kp.on('pageerror', (e) => kproblems.push('page error: ' + e.message));
  kp.on('console', (m) => { if (m.type() === 'error') kproblems.push('console error: ' + m.text()); });
  await kp.setViewport({ width: 1440, height: 900 });
  await kp.goto(ks.base + '/', { waitUntil: 'networkidle0' });
  await kp.waitForSelector('#key-dialog[open]', { timeout: 10000 });
  ok(true, 'with --api-key the page asks for the key');
  await kp.type('#key-input', 'sesame');
  await kp.keyboard.press('Enter');
  await kp.waitForSelector('#key-dialog:not([open])');
  await kp.click('#toggle-settings');
  await kp.click('#temperature', { clickCount: 3 });
  await kp.keyboard.type('0');
  await kp.click('#max_tokens', { clickCount: 3 });
  await kp.keyboard.type(String(MAX_TOKENS));
  await kp.keyboard.press('Tab');
  await kp.click('#close-settings');
  const ka = await send(kp, q1);
  const kg = await apiGreedy(ks.base, msgs1, { Authorization: 'Bearer sesame' });
  ok(!ka.error && ka.text === (kg.content || ''), 'with the key the page chats', { page: ka.text, api: kg.content });
  ok(kproblems.length === 0, 'no page or console errors (server with a key)', kproblems);
  await kp.screenshot({ path: path.join(OUT, 'chat-key-1440.png') });

  await browser.close();
  for (const f of ['chat-1440.png', 'chat-360.png']) ok(fs.statSync(path.join(OUT, f)).size > 1000, `screenshot ${f}`);
  note(`screenshots in ${OUT}`);
  done();
}

main().catch((e) => { ok(false, 'no exception', e.stack || String(e)); done(); });
