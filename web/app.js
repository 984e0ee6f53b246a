// The chat page of `nextn serve`: conversations kept in local storage, streamed through
// /v1/chat/completions, with the text of accepted drafts marked and a panel of speculation figures
// (live from each chunk's "nextn" member, then the server's own counts from the final usage).
'use strict';
(function () {
  const $ = (id) => document.getElementById(id);
  const store = {
    get(k, d) { try { const v = localStorage.getItem('nextn.' + k); return v === null ? d : JSON.parse(v); } catch { return d; } },
    set(k, v) { try { localStorage.setItem('nextn.' + k, JSON.stringify(v)); } catch { /* full or disabled */ } },
  };
  const NUM = ['temperature', 'top_p', 'top_k', 'min_p', 'max_tokens', 'seed'];
  const settings = Object.assign({ draft: 'auto', verify: 'residual', showDrafts: true, raw: false }, store.get('settings', {}));
  let convs = store.get('convs', []);
  let current = store.get('current', null);
  let busy = null; // {ctrl, msg, conv} while a generation streams

  // ------------------------------------------------------------ settings
  function loadSettings() {
    for (const k of NUM) $(k).value = settings[k] ?? '';
    $('draft').value = settings.draft;
    $('verify').value = settings.verify;
    $('show-drafts').checked = settings.showDrafts;
    $('raw').checked = settings.raw;
    document.body.classList.toggle('show-drafts', settings.showDrafts);
  }
  function saveSettings() {
    for (const k of NUM) settings[k] = $(k).value === '' ? null : Number($(k).value);
    settings.draft = $('draft').value;
    settings.verify = $('verify').value;
    settings.showDrafts = $('show-drafts').checked;
    settings.raw = $('raw').checked;
    document.body.classList.toggle('show-drafts', settings.showDrafts);
    store.set('settings', settings);
  }

  // ------------------------------------------------------------ conversations
  const conv = () => convs.find((c) => c.id === current);
  function newConv() {
    const c = { id: Date.now().toString(36) + Math.random().toString(36).slice(2, 6), title: 'New chat', system: '', messages: [] };
    convs.unshift(c);
    current = c.id;
    persist();
    return c;
  }
  function persist() {
    store.set('convs', convs);
    store.set('current', current);
  }
  function renderList() {
    const ul = $('conv-list');
    ul.textContent = '';
    for (const c of convs) {
      const li = document.createElement('li');
      if (c.id === current) li.className = 'current';
      const open = document.createElement('button');
      open.type = 'button';
      open.className = 'open';
      open.textContent = c.title;
      open.title = c.title;
      if (c.id === current) open.setAttribute('aria-current', 'true');
      open.onclick = () => { if (!busy) { current = c.id; persist(); showConv(); $('sidebar').classList.remove('open'); } };
      const del = document.createElement('button');
      del.type = 'button';
      del.textContent = '×';
      del.setAttribute('aria-label', 'Delete ' + c.title);
      del.onclick = () => {
        if (busy && busy.conv === c) return;
        convs = convs.filter((x) => x !== c);
        if (current === c.id) current = convs.length ? convs[0].id : null;
        persist();
        showConv();
      };
      li.append(open, del);
      ul.appendChild(li);
    }
  }
  function showConv() {
    const c = conv() || newConv();
    $('system').value = c.system || '';
    renderList();
    const box = $('messages');
    box.textContent = '';
    c.messages.forEach((m, i) => box.appendChild(renderMsg(m, i)));
    box.scrollTop = box.scrollHeight;
    const last = c.messages.filter((m) => m.usage).pop();
    if (last) finalSpec({ k: last.k }, last.usage, last.timings);
    else showSpec({});
  }

  // ------------------------------------------------------------ rendering
  // Per character of text: whether it came from an accepted draft, from the pieces [text, drafted].
  function flagsOf(pieces) {
    const f = [];
    for (const [t, d] of pieces || []) for (let i = 0; i < t.length; i++) f.push(!!d);
    return (i) => f[i] === true;
  }
  function renderMsg(m, index) {
    const d = document.createElement('div');
    d.className = 'msg ' + m.role + (m.error ? ' error' : '');
    d.dataset.index = String(index);
    d.dataset.state = m.streaming ? 'streaming' : 'done';
    const role = document.createElement('div');
    role.className = 'role';
    role.textContent = m.role === 'user' ? 'You' : 'Assistant' + (m.stopped ? ' (stopped)' : '');
    d.appendChild(role);
    if (m.reasoning) {
      const det = document.createElement('details');
      det.className = 'reasoning';
      det.open = !!m.reasoningOpen;
      det.ontoggle = () => { m.reasoningOpen = det.open; };
      const sum = document.createElement('summary');
      sum.textContent = m.streaming && !m.content ? 'Reasoning…' : 'Reasoning';
      const t = document.createElement('div');
      t.className = 'text';
      NxMarkdown.text(t, m.reasoning, 0, m.reasoning.length, flagsOf(m.rpieces));
      det.append(sum, t);
      d.appendChild(det);
    }
    const body = document.createElement('div');
    body.className = 'body' + (settings.raw || m.role === 'user' ? ' raw' : '');
    const text = m.content || '';
    if (m.role === 'user' || settings.raw) NxMarkdown.text(body, text, 0, text.length, m.role === 'user' ? null : flagsOf(m.pieces));
    else NxMarkdown.render(body, text, flagsOf(m.pieces));
    d.appendChild(body);
    for (const tc of m.tool_calls || []) {
      const t = document.createElement('div');
      t.className = 'tool-call';
      const f = document.createElement('span');
      f.className = 'fname';
      f.textContent = (tc.function && tc.function.name) || '?';
      let args = (tc.function && tc.function.arguments) || '';
      try { args = JSON.stringify(JSON.parse(args), null, 2); } catch { /* still streaming */ }
      t.append('call ', f, '(' + args + ')');
      d.appendChild(t);
    }
    if (m.error) {
      const e = document.createElement('div');
      e.textContent = m.error;
      d.appendChild(e);
    }
    if (m.stats) {
      const s = document.createElement('div');
      s.className = 'small muted';
      s.textContent = m.stats;
      d.appendChild(s);
    }
    if (!m.streaming) d.appendChild(actions(m, index));
    return d;
  }
  function button(label, fn, aria) {
    const b = document.createElement('button');
    b.type = 'button';
    b.textContent = label;
    if (aria) b.setAttribute('aria-label', aria);
    b.onclick = fn;
    return b;
  }
  function actions(m, index) {
    const a = document.createElement('div');
    a.className = 'actions';
    if (m.role === 'user') {
      a.appendChild(button('Edit', () => editMsg(index), 'Edit this message'));
    } else {
      a.appendChild(button('Copy', async (ev) => {
        const b = ev.currentTarget;
        try { await navigator.clipboard.writeText(asMarkdown(m)); b.textContent = 'Copied'; } catch { b.textContent = 'Copy failed'; }
        setTimeout(() => { b.textContent = 'Copy'; }, 1500);
      }, 'Copy as markdown'));
      const c = conv();
      if (c && index === c.messages.length - 1) a.appendChild(button('Regenerate', regenerate, 'Regenerate this answer'));
    }
    return a;
  }
  function asMarkdown(m) {
    let s = m.content || '';
    for (const tc of m.tool_calls || []) s += '\n\n```json\n' + JSON.stringify({ name: tc.function.name, arguments: tc.function.arguments }) + '\n```';
    return s;
  }
  function updateStreaming(m, index) {
    if (m._raf) return;
    m._raf = requestAnimationFrame(() => {
      m._raf = 0;
      const box = $('messages');
      const old = box.querySelector(`.msg[data-index="${index}"]`);
      const near = box.scrollHeight - box.scrollTop - box.clientHeight < 80;
      const n = renderMsg(m, index);
      if (old) old.replaceWith(n); else box.appendChild(n);
      if (near) box.scrollTop = box.scrollHeight;
    });
  }

  // ------------------------------------------------------------ speculation panel
  function newSpec() { return { tokens: 0, t0: 0, cycles: 0, accepted: 0, drafted: 0, at: [], acc: [], open: null, k: null }; }
  // A cycle is its accepted drafts, then one token of the trunk's; its k is the drafts verified.
  function specToken(sp, drafted, k) {
    const now = performance.now();
    if (!sp.tokens) sp.t0 = now;
    sp.tokens++;
    sp.t1 = now;
    sp.k = k;
    if (k > 0 && !sp.open) sp.open = { k, acc: 0 };
    if (!sp.open) return;
    if (drafted) { sp.open.acc++; return; }
    const { k: kk, acc } = sp.open;
    for (let i = 0; i < Math.min(kk, acc + 1); i++) {
      sp.at[i] = (sp.at[i] || 0) + 1;
      sp.acc[i] = (sp.acc[i] || 0) + (i < acc ? 1 : 0);
    }
    sp.cycles++;
    sp.accepted += acc;
    sp.drafted += kk;
    sp.open = null;
  }
  function showSpec(v) {
    $('s-tps').textContent = v.tps == null ? '–' : v.tps.toFixed(1);
    $('s-tau').textContent = v.tau == null ? '–' : v.tau.toFixed(2);
    $('s-rate').textContent = v.rate == null ? '–' : Math.round(v.rate * 100) + '%';
    $('s-k').textContent = v.k == null ? '–' : String(v.k);
    const bars = $('s-pos');
    bars.textContent = '';
    (v.at || []).forEach((n, i) => {
      const r = n ? (v.acc[i] || 0) / n : 0;
      const b = document.createElement('div');
      b.className = 'bar';
      b.title = `position ${i + 1}: ${v.acc[i] || 0} of ${n} accepted`;
      const fill = document.createElement('span');
      fill.style.height = Math.round(r * 100) + '%';
      const lab = document.createElement('b');
      lab.textContent = String(i + 1);
      b.append(fill, lab);
      bars.appendChild(b);
    });
    $('s-src').textContent = v.src || '';
  }
  function liveSpec(sp) {
    const dt = (sp.t1 - sp.t0) / 1000;
    showSpec({ tps: sp.tokens > 1 && dt > 0 ? (sp.tokens - 1) / dt : null, tau: sp.cycles ? 1 + sp.accepted / sp.cycles : null,
      rate: sp.drafted ? sp.accepted / sp.drafted : null, k: sp.k, at: sp.at, acc: sp.acc, src: 'live, from the stream' });
  }
  function finalSpec(sp, usage, timings) {
    const s = usage.speculative || {};
    showSpec({ tps: timings ? timings.predicted_per_second : null, tau: s.mean_acceptance_length, rate: s.acceptance_rate,
      k: sp.k, at: s.drafted_at, acc: s.accepted_at,
      src: `server: ${usage.completion_tokens} tokens, draft ${s.draft}, verify ${s.verify}, ${s.accepted}/${s.drafted} drafts accepted` });
  }

  // ------------------------------------------------------------ requests
  function headers() {
    const h = { 'Content-Type': 'application/json' };
    const key = store.get('apiKey', '');
    if (key) h.Authorization = 'Bearer ' + key;
    return h;
  }
  function requestBody(c) {
    const msgs = [];
    if (c.system && c.system.trim()) msgs.push({ role: 'system', content: c.system });
    for (const m of c.messages) {
      if (m.error && !m.content) continue;
      const o = { role: m.role, content: m.content || (m.tool_calls ? null : '') };
      if (m.tool_calls && m.tool_calls.length) o.tool_calls = m.tool_calls;
      msgs.push(o);
    }
    const body = { messages: msgs, stream: true, stream_options: { include_usage: true },
      speculative: { draft: settings.draft === 'auto' ? 'auto' : Number(settings.draft), verify: settings.verify } };
    for (const k of NUM) if (settings[k] !== null && settings[k] !== undefined && settings[k] !== '') body[k] = settings[k];
    return body;
  }
  function askKey() {
    $('key-input').value = store.get('apiKey', '');
    if (!$('key-dialog').open) $('key-dialog').showModal();
  }

  async function generate() {
    const c = conv();
    const body = JSON.stringify(requestBody(c)); // the history, before the answer joins it
    const m = { role: 'assistant', content: '', reasoning: '', pieces: [], rpieces: [], streaming: true };
    c.messages.push(m);
    const index = c.messages.length - 1;
    const ctrl = new AbortController();
    busy = { ctrl, msg: m, conv: c };
    setBusy(true);
    const sp = newSpec();
    showSpec({ src: 'waiting for the first token' });
    updateStreaming(m, index);
    try {
      const r = await fetch('/v1/chat/completions', { method: 'POST', headers: headers(), body, signal: ctrl.signal });
      if (!r.ok) {
        let msg = `HTTP ${r.status}`;
        try { const j = await r.json(); msg += ': ' + (j.error && j.error.message); } catch { /* not JSON */ }
        if (r.status === 401) askKey();
        throw new Error(msg);
      }
      await readStream(r, (ev) => onEvent(ev, m, index, sp));
    } catch (e) {
      if (e.name === 'AbortError') m.stopped = true;
      else m.error = String(e.message || e);
    }
    m.streaming = false;
    m.k = sp.k;
    delete m._raf;
    busy = null;
    setBusy(false);
    if (!m.content && !m.reasoning && !m.tool_calls && !m.error && !m.stopped) m.error = 'The answer is empty.';
    persist();
    const box = $('messages');
    const old = box.querySelector(`.msg[data-index="${index}"]`);
    if (old) old.replaceWith(renderMsg(m, index)); else box.appendChild(renderMsg(m, index));
    box.scrollTop = box.scrollHeight;
    // the previous last message loses its Regenerate button
    if (index > 0) {
      const prev = box.querySelector(`.msg[data-index="${index - 1}"]`);
      if (prev) prev.replaceWith(renderMsg(c.messages[index - 1], index - 1));
    }
  }

  async function readStream(r, onEv) {
    const reader = r.body.getReader();
    const dec = new TextDecoder();
    let buf = '';
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buf += dec.decode(value, { stream: true });
      let at;
      while ((at = buf.indexOf('\n\n')) >= 0) {
        const ev = buf.slice(0, at);
        buf = buf.slice(at + 2);
        const data = ev.split('\n').filter((l) => l.startsWith('data:')).map((l) => l.slice(5).trimStart()).join('\n');
        if (!data || data === '[DONE]') continue;
        onEv(JSON.parse(data));
      }
    }
  }

  function onEvent(ev, m, index, sp) {
    if (ev.error) throw new Error(ev.error.message || 'error');
    if (ev.usage) {
      m.usage = ev.usage;
      m.timings = ev.timings;
      const t = ev.timings;
      m.stats = `${ev.usage.completion_tokens} tokens` + (t ? `, ${t.predicted_per_second.toFixed(1)} tokens/s` : '') +
        (ev.usage.speculative.mean_acceptance_length ? `, ${ev.usage.speculative.mean_acceptance_length.toFixed(2)} tokens per verify` : '');
      finalSpec(sp, ev.usage, ev.timings);
    }
    for (const ch of ev.choices || []) {
      const d = ch.delta || {};
      const src = ch.nextn;
      let drafted = false;
      if (src && src.drafted.length) {
        drafted = src.drafted.every(Boolean);
        src.drafted.forEach((x, i) => specToken(sp, x, src.draft_k[i]));
      }
      if (d.content) { m.content += d.content; m.pieces.push([d.content, drafted]); }
      if (d.reasoning_content) { m.reasoning += d.reasoning_content; m.rpieces.push([d.reasoning_content, drafted]); }
      for (const tc of d.tool_calls || []) {
        m.tool_calls = m.tool_calls || [];
        const t = m.tool_calls[tc.index] || (m.tool_calls[tc.index] = { id: '', type: 'function', function: { name: '', arguments: '' } });
        if (tc.id) t.id = tc.id;
        if (tc.function && tc.function.name) t.function.name = tc.function.name;
        if (tc.function && tc.function.arguments) t.function.arguments += tc.function.arguments;
      }
      if (ch.finish_reason) m.finish = ch.finish_reason;
    }
    if (!ev.usage && sp.tokens) liveSpec(sp);
    updateStreaming(m, index);
  }

  function setBusy(on) {
    $('send').hidden = on;
    $('stop').hidden = !on;
    $('messages').setAttribute('aria-busy', on ? 'true' : 'false'); // read once the answer is whole
  }

  function send(text) {
    if (busy || !text.trim()) return;
    const c = conv() || newConv();
    c.system = $('system').value;
    if (!c.messages.length) c.title = text.trim().slice(0, 48);
    c.messages.push({ role: 'user', content: text });
    persist();
    showConv();
    generate();
  }
  function regenerate() {
    const c = conv();
    if (busy || !c || !c.messages.length) return;
    if (c.messages[c.messages.length - 1].role === 'assistant') c.messages.pop();
    persist();
    showConv();
    generate();
  }
  function editMsg(index) {
    if (busy) return;
    const c = conv();
    const m = c.messages[index];
    const node = $('messages').querySelector(`.msg[data-index="${index}"]`);
    const ta = document.createElement('textarea');
    ta.className = 'edit';
    ta.value = m.content;
    ta.setAttribute('aria-label', 'Edit the message');
    const save = button('Save and send', () => {
      m.content = ta.value;
      c.messages.length = index + 1; // what followed answered the old text
      persist();
      showConv();
      generate();
    });
    const cancel = button('Cancel', () => showConv());
    const row = document.createElement('div');
    row.className = 'actions';
    row.append(save, cancel);
    node.replaceChildren(ta, row);
    ta.focus();
  }

  // ------------------------------------------------------------ wiring
  function togglePanel(btn, panel, on) {
    const open = on === undefined ? panel.hidden : on;
    panel.hidden = !open;
    btn.setAttribute('aria-expanded', String(open));
    if (open) panel.querySelector('textarea, input, select, button').focus();
  }

  async function start() {
    loadSettings();
    showConv();
    for (const id of [...NUM, 'draft', 'verify', 'show-drafts', 'raw']) $(id).addEventListener('change', () => {
      saveSettings();
      if (id === 'raw') showConv();
    });
    $('system').addEventListener('change', () => { const c = conv(); if (c) { c.system = $('system').value; persist(); } });
    $('composer').addEventListener('submit', (e) => {
      e.preventDefault();
      const t = $('prompt').value;
      if (busy || !t.trim()) return;
      $('prompt').value = '';
      send(t);
    });
    $('prompt').addEventListener('keydown', (e) => {
      if (e.key === 'Enter' && !e.shiftKey && !e.isComposing) { e.preventDefault(); $('composer').requestSubmit(); }
    });
    document.addEventListener('keydown', (e) => {
      if (e.key !== 'Escape' || $('key-dialog').open) return;
      if (busy) busy.ctrl.abort();
      else if (!$('settings').hidden) $('close-settings').click();
    });
    $('stop').onclick = () => { if (busy) busy.ctrl.abort(); };
    $('new-chat').onclick = () => { if (!busy) { newConv(); showConv(); $('prompt').focus(); } };
    $('toggle-settings').onclick = () => togglePanel($('toggle-settings'), $('settings'));
    $('close-settings').onclick = () => { togglePanel($('toggle-settings'), $('settings'), false); $('toggle-settings').focus(); };
    $('toggle-sidebar').onclick = () => {
      const open = $('sidebar').classList.toggle('open');
      $('toggle-sidebar').setAttribute('aria-expanded', String(open));
      if (open) $('new-chat').focus();
    };
    $('key-button').onclick = askKey;
    $('key-cancel').onclick = () => $('key-dialog').close();
    $('key-form').addEventListener('submit', () => store.set('apiKey', $('key-input').value.trim()));
    try {
      const h = await (await fetch('/health')).json();
      $('model').textContent = `${h.model} · MTP ${h.mtp}`;
      if (h.api_key_required && !store.get('apiKey', '')) askKey();
    } catch { $('model').textContent = 'server not answering'; }
    $('prompt').focus();
    document.body.dataset.ready = 'true';
  }
  document.addEventListener('DOMContentLoaded', start);
})();
