#!/usr/bin/env node
// Expected tokenizer output from the independent reference implementation
// (@huggingface/tokenizers): for each text of a cases file, the ids of encode() with added/special
// tokens parsed, and decode() of those ids with and without special tokens.
// Usage: node reference.js <tokenizer.json> <out.json> <cases.json>...
'use strict';
const fs = require('fs');
const path = require('path');

const root = path.resolve(__dirname, '..', '..');
const { Tokenizer } = require(path.join(root, 'node_modules', '@huggingface', 'tokenizers'));

const [tokPath, outPath, ...casesPaths] = process.argv.slice(2);
if (!tokPath || !outPath || casesPaths.length === 0) {
    console.error('usage: reference.js <tokenizer.json> <out.json> <cases.json>...');
    process.exit(2);
}
const tokJson = JSON.parse(fs.readFileSync(tokPath, 'utf8'));
// An empty config: the comparison is about tokenizer.json alone (no tokenizer_config.json extras
// such as additional special tokens or clean-up of spaces).
const tok = new Tokenizer(tokJson, {});
const cases = casesPaths.flatMap((p) => JSON.parse(fs.readFileSync(p, 'utf8')));

const decode = (ids, skip) =>
    ids.length === 0 ? '' : tok.decode(ids, { skip_special_tokens: skip, clean_up_tokenization_spaces: false });

const out = cases.map((c) => {
    const ids = tok.encode(c.text, { add_special_tokens: false }).ids;
    return { name: c.name, text: c.text, ids, decoded: decode(ids, false), decoded_skip: decode(ids, true) };
});
fs.writeFileSync(outPath, JSON.stringify({ tokenizer: tokPath, cases: out }));
