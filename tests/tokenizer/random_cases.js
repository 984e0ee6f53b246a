#!/usr/bin/env node
// Seeded random texts for the tokenizer parity test: mixes of ASCII, whitespace kinds, Latin,
// Greek, Cyrillic, Hebrew, Arabic, Devanagari, Thai, kana, CJK, Hangul, emoji (with skin tones,
// ZWJ, flags), combining marks, digits and special-token strings, so that rarely-combined
// neighbours meet at pre-tokenizer boundaries.
// Usage: node random_cases.js <count> <seed> <out.json>
'use strict';
const fs = require('fs');

const [count, seed, outPath] = process.argv.slice(2);
if (!outPath) {
    console.error('usage: random_cases.js <count> <seed> <out.json>');
    process.exit(2);
}
let state = BigInt(seed) & 0xffffffffffffffffn;
const next = () => { // 64-bit LCG, high bits
    state = (state * 6364136223846793005n + 1442695040888963407n) & 0xffffffffffffffffn;
    return Number(state >> 33n) / 2 ** 31;
};
const pick = (a) => a[Math.floor(next() * a.length)];
const pools = [ // [first, last, weight]
    [0x20, 0x7e, 8], [0x0a, 0x0a, 2], [0x0d, 0x0d, 1], [0x09, 0x09, 1], [0xa0, 0xff, 2],
    [0x100, 0x17f, 1], [0x300, 0x36f, 2], [0x391, 0x3c9, 1], [0x410, 0x44f, 1], [0x5d0, 0x5ea, 1],
    [0x621, 0x64a, 1], [0x660, 0x669, 1], [0x905, 0x939, 1], [0x93e, 0x94d, 1], [0x966, 0x96f, 1],
    [0xe01, 0xe30, 1], [0x3041, 0x3096, 1], [0x30a1, 0x30fa, 1], [0x4e00, 0x9fa5, 3],
    [0xac00, 0xd7a3, 1], [0xff01, 0xff5e, 1], [0x1f300, 0x1f64f, 2], [0x1f3fb, 0x1f3ff, 1],
    [0x200d, 0x200d, 1], [0xfe0f, 0xfe0f, 1], [0x1f1e6, 0x1f1ff, 1], [0x2000, 0x200a, 1],
    [0x3000, 0x3000, 1], [0x30, 0x39, 4], [0x27, 0x27, 2], [0x20, 0x20, 6], [0x2019, 0x2019, 1],
    [0x85, 0x85, 1], [0x2028, 0x2029, 1], [0x1d400, 0x1d6a5, 1], [0x20000, 0x2a6d6, 1],
];
const total = pools.reduce((s, p) => s + p[2], 0);
const specials = ['<|im_start|>', '<|im_end|>', '<|endoftext|>', '<think>', '</think>',
    '<｜begin▁of▁sentence｜>', '<｜User｜>', '<｜Assistant｜>', '<｜tool▁sep｜>', '<|im_start', '｜>', '▁'];
const words = ['the', 'The', ' and', "'s", "'S", "'ll", "don't", 'int', 'return', '    ', '\n\n',
    '\r\n', '123456', '3.14', '日本', '中文', '😀', '👍🏽', 'ed', 'ing', '::', '->', '==='];
const char = () => {
    let r = next() * total;
    for (const [a, b, w] of pools) {
        if (r < w) return String.fromCodePoint(a + Math.floor(next() * (b - a + 1)));
        r -= w;
    }
    return 'x';
};
const cases = [];
for (let i = 0; i < Number(count); i++) {
    const n = 1 + Math.floor(next() * 80);
    let s = '';
    for (let k = 0; k < n; k++) {
        const x = next();
        s += x < 0.05 ? pick(specials) : x < 0.25 ? pick(words) : char();
    }
    cases.push({ name: `random${i}`, text: s });
}
fs.writeFileSync(outPath, JSON.stringify(cases));
