#!/usr/bin/env bash
# Chat template parity: renders the real Qwen3 and DeepSeek-V3 chat templates, the default
# model's (models/*/tokenizer_config.json, when present) and tests/chat/templates/*.jinja on the
# conversations of tests/chat/conversations.json, and requires nextn's output to be
# byte-identical to the npm @huggingface/jinja reference. One TAP line per (template, conversation).
# When the reference raises, nextn must fail too.
set -u
cd "$(dirname "$0")/../.." || exit 1
BIN="${BUILD:-build}/tests/test_jinja"

if ! command -v node >/dev/null 2>&1; then echo "not ok 1 - node is not installed"; echo 1..1; exit 1; fi
if [ ! -d node_modules/@huggingface/jinja ]; then echo "not ok 1 - node_modules/@huggingface/jinja missing (npm ci)"; echo 1..1; exit 1; fi
if [ ! -x "$BIN" ]; then echo "not ok 1 - $BIN is not built"; echo 1..1; exit 1; fi

out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
if ! node tests/chat/reference.js "$out" 2>"$out/reference.log"; then
    echo "1..1"
    echo "not ok 1 - reference renderer failed"
    sed 's/^/# /' "$out/reference.log"
    exit 1
fi

n=$(wc -l <"$out/cases.tsv")
echo "1..$n"
i=0
failed=0
while IFS=$'\t' read -r tmpl conv config; do
    i=$((i + 1))
    base="$out/${tmpl}__${conv}"
    why=""
    if [ -f "$base.expected" ]; then
        if ! "$BIN" --render "$out/$tmpl.jinja" "$base.ctx.json" >"$base.got" 2>"$base.log"; then
            why="nextn failed: $(head -c 300 "$base.log")"
        elif ! cmp -s "$base.expected" "$base.got"; then
            why="render differs from the reference"
        elif [ -n "$config" ]; then
            if ! "$BIN" --chat "$config" "$base.conv.json" >"$base.chat" 2>"$base.log"; then
                why="chat API failed: $(head -c 300 "$base.log")"
            elif ! cmp -s "$base.expected" "$base.chat"; then
                why="chat API render differs from the reference"
                cp "$base.chat" "$base.got"
            fi
        fi
    else
        if "$BIN" --render "$out/$tmpl.jinja" "$base.ctx.json" >/dev/null 2>&1; then
            why="the reference raised ($(head -c 200 "$base.error")) but nextn rendered"
        fi
    fi
    if [ -z "$why" ]; then
        echo "ok $i - $tmpl / $conv"
    else
        failed=$((failed + 1))
        echo "not ok $i - $tmpl / $conv"
        echo "# $why"
        if [ -f "$base.expected" ] && [ -f "$base.got" ]; then
            diff <(od -c "$base.expected") <(od -c "$base.got") | head -20 | sed 's/^/# /'
        fi
    fi
done <"$out/cases.tsv"
[ "$failed" -eq 0 ]
