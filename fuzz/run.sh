#!/usr/bin/env bash
# `make fuzz`: builds every fuzz/fuzz_<name>.c as a libFuzzer binary (clang, ASan + UBSan) against
# the library, and runs each for $1 seconds (default 20), seeded from fuzz/corpus/<name>/ when
# present. The library is compiled once, each kernel file with its own ISA flags as in the
# Makefile. New inputs go to a scratch corpus so the committed seeds stay as they are.
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-20}
out=build-fuzz
mkdir -p "$out/obj"
deps="jansson libpcre2-8 libutf8proc libmicrohttpd zlib"
cflags="-std=c11 -D_GNU_SOURCE -g -O1 -fno-omit-frame-pointer -Iinclude -Isrc $(pkg-config --cflags $deps)"
san="-fsanitize=address,undefined -fno-sanitize-recover=undefined"
libs="$(pkg-config --libs $deps) -lm -lpthread"
avx2="-mavx2 -mfma -mf16c"
avx512="$avx2 -mavx512f -mavx512bw -mavx512vl -mavx512dq"

objs=()
# no header dependencies are tracked: a header newer than an object rebuilds it (a struct that
# changed shape under a stale object reads as garbage)
newest_h=$(ls -t include/*.h src/*/*.h | head -1)
for src in src/*/*.c; do
    [ "$src" = src/dist/dist.c ] && continue # no MPI here: dist_none.c
    obj="$out/obj/$(echo "$src" | tr / _).o"
    isa=""
    case "$src" in
        src/kernels/avx2.c | src/kernels/avx2_int8.c | src/kernels/*_avx2.c) isa=$avx2 ;;
        src/kernels/avx2_vnni.c) isa="$avx2 -mavxvnni" ;;
        src/kernels/avx512.c | src/kernels/avx512_t0.c | src/kernels/*_avx512.c) isa=$avx512 ;;
        src/kernels/avx512_vnni.c | src/kernels/avx512_vnni_t0.c) isa="$avx512 -mavx512vnni" ;;
        src/kernels/avx512_vbmi.c | src/kernels/avx512_vbmi_t0.c) isa="$avx512 -mavx512vnni -mavx512vbmi -mgfni" ;;
    esac
    if [ ! -f "$obj" ] || [ "$src" -nt "$obj" ] || [ "$newest_h" -nt "$obj" ]; then
        if [ -n "$isa" ]; then
            # SIMD kernels read no untrusted input and their unrolled variants take minutes to
            # build instrumented: plain -O1 (linked with the instrumented rest, as usual for ASan)
            clang $cflags $isa -c "$src" -o "$obj"
        else
            clang $cflags $san -fsanitize=fuzzer-no-link $isa -c "$src" -o "$obj"
        fi
    fi
    objs+=("$obj")
done

status=0
for target in fuzz/fuzz_*.c; do
    name=$(basename "$target" .c)
    corpus_name=${name#fuzz_}
    echo "== $name ($secs s)"
    clang $cflags $san -fsanitize=fuzzer -o "$out/$name" "$target" "${objs[@]}" $libs
    work="$out/corpus-$corpus_name"
    mkdir -p "$work"
    seeds=()
    [ -d "fuzz/corpus/$corpus_name" ] && seeds+=("fuzz/corpus/$corpus_name")
    if ! "$out/$name" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -print_final_stats=0 \
            -artifact_prefix="$out/$name-" "$work" "${seeds[@]}" 2> "$out/$name.log"; then
        tail -40 "$out/$name.log"
        echo "!! $name found a failure (artifacts: $out/$name-*)"
        status=1
    else
        grep -E "^#[0-9]+ *DONE" "$out/$name.log" | tail -1 || true
    fi
done
exit $status
