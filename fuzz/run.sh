#!/usr/bin/env bash
# Builds every fuzz/fuzz_<name>.c as a libFuzzer binary (ASan + UBSan) against the library
# sources and runs each for $1 seconds (default 20), seeded from fuzz/corpus/<name>/ when present.
# New inputs go to a scratch corpus so the committed seeds stay as they are.
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-20}
out=build-fuzz
mkdir -p "$out"
deps="jansson libpcre2-8 libutf8proc libmicrohttpd"
cflags="-std=c11 -D_GNU_SOURCE -g -O1 -fno-omit-frame-pointer -Iinclude -Isrc $(pkg-config --cflags $deps)"
san="-fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined"
libs="$(pkg-config --libs $deps) -lm -lpthread"
lib_src=$(ls src/*/*.c)
status=0
for target in fuzz/fuzz_*.c; do
    name=$(basename "$target" .c)
    corpus_name=${name#fuzz_}
    echo "== $name"
    clang $cflags $san -o "$out/$name" "$target" $lib_src $libs
    work="$out/corpus-$corpus_name"
    mkdir -p "$work"
    seeds=()
    [ -d "fuzz/corpus/$corpus_name" ] && seeds+=("fuzz/corpus/$corpus_name")
    if ! "$out/$name" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 \
            -artifact_prefix="$out/$name-" "$work" "${seeds[@]}"; then
        echo "!! $name found a failure (artifacts: $out/$name-*)"
        status=1
    fi
done
exit $status
