#!/usr/bin/env bash
# `make bench`: the machine's read bandwidth, kernel throughput, and AR vs MTP decoding on the
# default model and on a generated memory-bound model (>= 2 GB of bf16 weights, larger than any
# cache), all in one run so the ratios compare like with like.
set -euo pipefail
cd "$(dirname "$0")/.."
B=build
NEXTN=$B/nextn
BIG=${NEXTN_BIG_MODEL:-/tmp/nextn-bench-big}
BIGQ4=${NEXTN_BIG_Q4_MODEL:-/tmp/nextn-bench-big36-q4}
N=${NEXTN_BENCH_TOKENS:-96}

echo "== memory read bandwidth"
bw_out=$($B/bench/membw)
echo "$bw_out"
bw_line=$(echo "$bw_out" | grep -o "membw_gbs=[0-9.]*" | tail -1 || true)
BW=${bw_line#membw_gbs=}
echo "== kernels"
kout=$($B/bench/kernels --membw "${BW:-0}" || true)
echo "$kout"
echo "== kernels, int8 activations (--act-bits 8): 2-, 3- and 4-bit"
kout8=$(NX_ACT_BITS=8 $B/bench/kernels --membw "${BW:-0}" --dtypes q2,q3,q4 || true)
echo "$kout8"
# the quantized-decode figures: 4-bit (the common recipe) and 8-bit (heads, attention overrides)
# on int16 activations, and 4-bit on int8 (--act-bits 8)
for q in q4 q8 q4-act8; do
    case $q in *-act8) ko=$kout8 ;; *) ko=$kout ;; esac
    echo "$ko" | awk -v lab="$q" 'BEGIN { q = lab; sub(/-act8$/, "", q) } $1 == "bench=matmul" {
        for (i = 2; i <= NF; i++) { split($i, kv, "="); f[kv[1]] = kv[2] }
        if (f["dtype"] != q) next
        ms[f["T"]] = f["ms"]; frac[f["T"]] = f["membw_frac"]; gf[f["T"]] = f["gflops"]; isa = f["isa"]
    } END {
        if (ms[1] > 0 && ms[2] > 0)
            printf "%s (%s): 1-row decode reads weights at %.0f%% of membw; a 2-row verify call costs %.2fx a 1-row call; T=64 (prefill) %.0f GFLOP/s\n",
                lab, isa, 100 * frac[1], ms[2] / ms[1], gf[64]
    }'
done

echo "== prefill (plain trunk over a long prompt)"
ids=$($NEXTN tokenize "$(head -c 3000 bench/texts/code.c)" | tr ' ' ',')
echo "default model: $($NEXTN run --prompt-tokens "$ids" -n 1 --draft 0 2>&1 >/dev/null | grep -o 'prefill: [^|]*')"
echo "== default model: AR vs MTP, greedy"
$NEXTN bench -n "$N" --modes ar,1,2,3,auto
echo "== default model: AR vs MTP auto, temperature 0.9"
$NEXTN bench -n "$N" --modes ar,auto,1 --temp 0.9 --seed 1

if [ ! -f "$BIG/config.json" ]; then
    echo "== generating the memory-bound random model in $BIG"
    /usr/bin/python3 tests/ref/make_random_ckpt.py --preset big --layout tencent --mtp inline --seed 11 --out "$BIG"
fi
$NEXTN inspect -m "$BIG"
echo "memory-bound model: $($NEXTN run -m "$BIG" --prompt-tokens "$(seq 1 512 | paste -sd,)" -n 1 --draft 0 2>&1 >/dev/null | grep -o 'prefill: [^|]*')"
echo "== memory-bound model: AR vs MTP with synthetic acceptance 0.8"
# this machine's bandwidth drifts from minute to minute: measure it right before and after each
# model run and hold the decode (fastest of 3 runs) to the higher reading
around() { # NAME GBS PRE POST DENSE_VERIFY
    awk -v n="$1" -v a="$2" -v p="$3" -v q="$4" -v dv="$5" 'BEGIN {
        b = p > q ? p : q
        printf "%s AR decode reads weights at %.1f GB/s = %.0f%% of the %.1f GB/s measured around it (before %.1f, after %.1f); a 2-row verify of the dense parts costs %.2fx a 1-row step\n", n, a, 100 * a / b, b, p, q, dv
    }'
}
membw_now() { $B/bench/membw | grep -o "membw_gbs=[0-9.]*" | cut -d= -f2; }
bw_pre=$(membw_now)
out=$($NEXTN bench -m "$BIG" -n 48 --modes ar,1,2 --synthetic-accept 0.8 --repeat 3)
bw_post=$(membw_now)
echo "$out"
around "bf16" "$(echo "$out" | grep '^mode=ar ' | grep -o 'weight_GB_s=[0-9.]*' | cut -d= -f2)" "$bw_pre" "$bw_post" \
    "$(echo "$out" | grep -o 'dense_verify2/step=[0-9.]*' | cut -d= -f2)"

# A memory-bound 4-bit model (>= 2 GB packed): a 36-layer variant of the same shapes, generated in
# bf16 once, converted with `nextn convert` (trunk 4-bit g64, head 8-bit), the bf16 copy removed.
if [ ! -f "$BIGQ4/config.json" ]; then
    echo "== generating the memory-bound 4-bit model in $BIGQ4"
    tmpbf=$(mktemp -d)
    /usr/bin/python3 tests/ref/make_random_ckpt.py --preset big --layers 36 --layout tencent --mtp inline \
        --seed 12 --out "$tmpbf/m"
    $NEXTN convert "$tmpbf/m" "$BIGQ4" --bits 4 --group-size 64 --quiet
    rm -rf "$tmpbf"
fi
$NEXTN inspect -m "$BIGQ4" | grep -E "weights|parameters"
echo "== memory-bound 4-bit model: AR vs MTP with synthetic acceptance 0.8"
bw_pre=$(membw_now)
outq=$($NEXTN bench -m "$BIGQ4" -n 48 --modes ar,1 --synthetic-accept 0.8 --repeat 3)
bw_post=$(membw_now)
echo "$outq"
around "4-bit" "$(echo "$outq" | grep '^mode=ar ' | grep -o 'weight_GB_s=[0-9.]*' | cut -d= -f2)" "$bw_pre" "$bw_post" \
    "$(echo "$outq" | grep -o 'dense_verify2/step=[0-9.]*' | cut -d= -f2)"
bw_pre=$(membw_now)
outq8=$($NEXTN bench -m "$BIGQ4" -n 48 --modes ar,1 --synthetic-accept 0.8 --repeat 3 --act-bits 8)
bw_post=$(membw_now)
echo "$outq8"
around "4-bit (--act-bits 8)" "$(echo "$outq8" | grep '^mode=ar ' | grep -o 'weight_GB_s=[0-9.]*' | cut -d= -f2)" "$bw_pre" "$bw_post" \
    "$(echo "$outq8" | grep -o 'dense_verify2/step=[0-9.]*' | cut -d= -f2)"
