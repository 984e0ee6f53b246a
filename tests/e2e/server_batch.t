#!/usr/bin/env node
// Continuous batching (`nextn serve --parallel 4`): requests that run at the same time share each
// step's forward, and every answer is exactly what the same request gets from a server with one
// slot (no batch at all): greedy text token for token, seeded sampling with `verify: match` (and
// with a fixed draft length, residual) the same text — with and without MTP drafts, short and
// long prompts, chat and completions, streaming or not, while another client hangs up mid-stream;
// on int8 activations (the default) and on int16 activations with an f16 cache.
// Also: GET /slots lists the four slots, slot actions address one slot, and /metrics shows
// forwards that held several sequences.
'use strict';
const path = require('path');
const fs = require('fs');
const os = require('os');
const lib = require(path.join(__dirname, '..', 'server', 'lib.js'));
const { ok, is, done } = lib;
const { CASES, ask, sameAsAlone, batchedForwards } = require(path.join(__dirname, '..', 'server', 'batch_cases.js'));

lib.skipAllUnlessReady();

async function main() {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'nextn-batch-'));
  const solo = await lib.startServer(['--parallel', '1', '--ctx', '1024']);
  const multi = await lib.startServer(['--parallel', '4', '--ctx', '1024', '--queue', '32', '--slot-save-path', dir]);

  const alone = [];
  for (const c of CASES) alone.push(await ask(solo.base, c));
  ok(alone.every((r) => r.status === 200), 'every request answers alone on one slot', alone.map((r) => r.status));

  const slots = await (await fetch(multi.base + '/slots')).json();
  ok(Array.isArray(slots) && slots.length === 4 && slots.every((s, i) => s.id === i && s.n_ctx === 1024),
     'GET /slots lists four slots with their ids and n_ctx', JSON.stringify(slots).slice(0, 300));
  const props = await (await fetch(multi.base + '/props')).json();
  is(props.total_slots, 4, 'GET /props: total_slots 4');

  await sameAsAlone(multi.base, CASES, alone);
  const text = await batchedForwards(multi.base);
  const val = (re) => { const m = text.match(re); return m ? Number(m[1]) : null; };
  is(val(/^nextn_slots (\d+)$/m), 4, '/metrics: nextn_slots 4');
  const perSlot = [...text.matchAll(/^nextn_slot_generations_total\{slot="(\d)"\} (\d+)$/gm)];
  ok(perSlot.length === 4 && perSlot.filter((m) => Number(m[2]) > 0).length >= 2,
     'requests ran on several slots', perSlot.map((m) => m[0]));

  // slot actions name one slot; its neighbours keep their rows
  const post = (url, body) => fetch(multi.base + url, { method: 'POST', headers: { 'Content-Type': 'application/json' },
                                                       body: body ? JSON.stringify(body) : undefined });
  let r = await post('/slots/2?action=save', { filename: 'two.state' });
  let j = await r.json();
  ok(r.status === 200 && j.id_slot === 2 && fs.existsSync(path.join(dir, 'two.state')), 'slot 2 saves', j);
  r = await post('/slots/3?action=erase');
  j = await r.json();
  ok(r.status === 200 && j.id_slot === 3, 'slot 3 erases', j);
  r = await post('/slots/4?action=erase');
  j = await r.json();
  ok(r.status === 400 && j.error && j.error.code === 'invalid_slot', '/slots/4 does not exist', j);
  r = await post('/slots/1?action=restore', { filename: 'two.state' });
  j = await r.json();
  ok(r.status === 200 && j.id_slot === 1 && j.n_restored > 0, 'slot 2\'s file restores into slot 1', j);
  const after = await ask(multi.base, CASES[0]);
  is(after.text[0], alone[0].text[0], 'after the slot actions: same text as alone');

  solo.stop();
  multi.stop();
  is(await lib.waitExit(multi), 0, 'clean shutdown');

  // the other kernel and cache paths: int16 activations, an f16 KV cache
  const flags = ['--act-bits', '16', '--kv-type', 'f16', '--ctx', '1024'];
  const solo16 = await lib.startServer(['--parallel', '1', ...flags]);
  const multi16 = await lib.startServer(['--parallel', '3', ...flags]);
  const some = CASES.slice(0, 6);
  const ref16 = [];
  for (const c of some) ref16.push(await ask(solo16.base, c));
  const got16 = await Promise.all(some.map((c) => ask(multi16.base, c)));
  for (let i = 0; i < some.length; i++)
    is(got16[i].text[0], ref16[i].text[0], `--act-bits 16 --kv-type f16, case ${i}: same text as alone`);
  solo16.stop();
  multi16.stop();
  fs.rmSync(dir, { recursive: true, force: true });
  done();
}

main().catch((e) => { ok(false, 'unexpected error', e.stack); done(); });
