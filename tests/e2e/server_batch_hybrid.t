#!/usr/bin/env node
// Continuous batching on a Gated-DeltaNet hybrid (a random qwen3_5_moe checkpoint of
// tests/ref/make_random_qwen35.py with the default model's tokenizer): the DeltaNet layers'
// projections run once over every sequence's rows and each sequence's recurrence over its own
// state, so requests in flight at `--parallel 4` must each answer exactly what a one-slot server
// answers — greedy, seeded `verify: match`, a fixed draft with residual verification, MTP on and
// off, and prompts longer than one prefill chunk — and /metrics must show forwards that held
// several sequences (the batched path ran).
'use strict';
const path = require('path');
const fs = require('fs');
const os = require('os');
const { execFileSync } = require('child_process');
const lib = require(path.join(__dirname, '..', 'server', 'lib.js'));
const { ok, is, done } = lib;
const { LONG, CASES, ask, sameAsAlone, batchedForwards } = require(path.join(__dirname, '..', 'server', 'batch_cases.js'));

lib.skipAllUnlessReady();

// Longer than a prefill chunk (512 rows): its prompt's chunks share forwards with the others' steps.
const HYBRID_CASES = CASES.concat([
  { prompt: LONG + '\n' + LONG + '\nAnd then', max_tokens: 30, temperature: 0 },
  { prompt: LONG + '\n' + LONG.slice(0, 600) + '\nNext:', max_tokens: 26, temperature: 0.8, seed: 21,
    speculative: { draft: 2, verify: 'match' } },
]);

function makeModel(dir) {
  const tok = JSON.parse(fs.readFileSync(path.join(lib.MODEL, 'tokenizer.json'), 'utf8'));
  const vocab = Object.keys(tok.model.vocab).length + (tok.added_tokens || []).length;
  execFileSync('/usr/bin/python3', [path.join(lib.ROOT, 'tests', 'ref', 'make_random_qwen35.py'), '--family',
                                    'qwen3_5_moe', '--seed', '1', '--vocab', String(vocab), '--out', dir], { stdio: 'ignore' });
  for (const f of ['tokenizer.json', 'tokenizer_config.json'])
    fs.copyFileSync(path.join(lib.MODEL, f), path.join(dir, f));
  const cfgPath = path.join(dir, 'config.json');
  const cfg = JSON.parse(fs.readFileSync(cfgPath, 'utf8'));
  const base = JSON.parse(fs.readFileSync(path.join(lib.MODEL, 'config.json'), 'utf8'));
  (cfg.text_config || cfg).eos_token_id = base.eos_token_id;
  fs.writeFileSync(cfgPath, JSON.stringify(cfg));
}

async function main() {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'nextn-batch-hybrid-'));
  process.on('exit', () => fs.rmSync(dir, { recursive: true, force: true }));
  makeModel(dir);
  const flags = ['--ctx', '2048', '--queue', '32'];
  const solo = await lib.startServer(['--parallel', '1', ...flags], 180000, dir);
  const multi = await lib.startServer(['--parallel', '4', ...flags], 180000, dir);

  const alone = [];
  for (const c of HYBRID_CASES) alone.push(await ask(solo.base, c));
  ok(alone.every((r) => r.status === 200), 'every request answers alone on one slot', alone.map((r) => r.status));
  ok(alone.some((r) => (r.text[0] || '').length > 0), 'the answers are not empty');

  await sameAsAlone(multi.base, HYBRID_CASES, alone);
  await batchedForwards(multi.base);

  solo.stop();
  multi.stop();
  is(await lib.waitExit(multi), 0, 'clean shutdown');
  done();
}

main().catch((e) => { ok(false, 'unexpected error', e.stack); done(); });
