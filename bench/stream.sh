#!/usr/bin/env bash
# Bigger than memory (docs/design.md, "Bigger than memory"): decoding a model in a memory cgroup
# of 60% and 40% of its weights, by plain mmap paging (the kernel evicts and faults pages) and by
# streaming the routed experts (--max-memory: the rest resident, experts through the expert
# cache, read directly and, as a control, through the page cache), against the same model
# unconstrained; AR and MTP (synthetic acceptance 0.8). Needs
# root (it creates a child memory cgroup, v2 or v1). Usage: bench/stream.sh [MODEL]
# (default: the 4-bit Hy3-shaped bench model bench/run.sh generates).
set -euo pipefail
cd "$(dirname "$0")/.."
NEXTN=build/nextn
MODEL=${1:-${NEXTN_HY3_Q4_MODEL:-/tmp/nextn-bench-hy3shape-q4}}
N=${NEXTN_STREAM_TOKENS:-48}
# memory the process needs besides the weights (KV caches, scratch, code, the tokenizer): the
# expert cache gets the cgroup's limit less this
OVERHEAD=${NEXTN_STREAM_OVERHEAD:-$((256 << 20))}

if [ ! -f "$MODEL/config.json" ]; then
    echo "stream.sh: no model at $MODEL (bench/run.sh generates the Hy3-shaped one)" >&2
    exit 1
fi
if [ "$(id -u)" != 0 ]; then
    echo "stream.sh: needs root for a memory cgroup" >&2
    exit 1
fi

drop_from_cache() {
    sync
    /usr/bin/python3 -c 'import os, sys
for f in sys.argv[1:]:
    fd = os.open(f, os.O_RDONLY); os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED); os.close(fd)' "$1"/*.safetensors
}

# A child memory cgroup with a limit of $1 bytes (no swap), its path on stdout.
make_cgroup() {
    local cg
    if grep -qw memory /sys/fs/cgroup/cgroup.controllers 2>/dev/null; then
        cg=/sys/fs/cgroup/nextn-stream-$$
        mkdir -p "$cg"
        echo "$1" >"$cg/memory.max"
        echo 0 >"$cg/memory.swap.max" 2>/dev/null || true
    else
        cg=/sys/fs/cgroup/memory$(awk -F: '$2 == "memory" { print $3 }' /proc/self/cgroup)/nextn-stream-$$
        mkdir -p "$cg"
        echo "$1" >"$cg/memory.limit_in_bytes"
        echo "$1" >"$cg/memory.memsw.limit_in_bytes" 2>/dev/null || true
    fi
    echo "$cg"
}

# Runs the command in a fresh cgroup of $1 bytes (0: none), the model out of the page cache first
# (pages cached earlier would be charged elsewhere and read for free).
run_limited() {
    local lim=$1 cg rc=0
    shift
    drop_from_cache "$MODEL"
    if [ "$lim" = 0 ]; then
        "$@" || rc=$?
        return $rc
    fi
    cg=$(make_cgroup "$lim")
    sh -c 'echo $$ >"$1/cgroup.procs"; shift; exec "$@"' sh "$cg" "$@" || rc=$?
    rmdir "$cg" 2>/dev/null || true
    return $rc
}

tok_s() { # MODE < bench output
    awk -v m="mode=$1" '$1 == m { for (i = 2; i <= NF; i++) if ($i ~ /^tok_s=/) { sub("tok_s=", "", $i); print $i } }'
}

SIZE=$($NEXTN inspect -m "$MODEL" --json | /usr/bin/python3 -c 'import json, sys; print(json.load(sys.stdin)["weight_bytes"])')
echo "== streaming experts: $MODEL, $((SIZE >> 20)) MiB of weights, $N tokens per prompt"
declare -A AR MTP
measure() { # LABEL LIMIT [nextn options...]
    local label=$1 lim=$2 out
    shift 2
    out=$(run_limited "$lim" ${MEASURE_ENV:+env $MEASURE_ENV} $NEXTN bench -m "$MODEL" -n "$N" --modes ar,2 \
        --synthetic-accept 0.8 "$@" 2>&1) || {
        echo "$label: failed (exit $?)"
        echo "$out" | tail -3
        AR[$label]=0 MTP[$label]=0
        return 0
    }
    AR[$label]=$(echo "$out" | tok_s ar)
    MTP[$label]=$(echo "$out" | tok_s 2)
    printf "%-34s AR %6.2f tok/s   MTP (draft 2, acceptance 0.8) %6.2f tok/s\n" "$label" "${AR[$label]}" "${MTP[$label]}"
}
measure "unconstrained" 0
for pct in 60 40; do
    lim=$((SIZE * pct / 100))
    measure "cgroup $pct%: mmap paging" "$lim"
    cap=$((lim - OVERHEAD))
    if ! plan=$($NEXTN inspect -m "$MODEL" --memory "$cap" 2>&1); then
        echo "  --max-memory $cap: ${plan#nextn: }"
        continue
    fi
    echo "$plan" | grep -E "^(residency|disk reads)" | sed 's/^/  /'
    measure "cgroup $pct%: --max-memory $((cap >> 20))M" "$lim" --max-memory "$cap"
    # the same reads through the page cache instead of direct I/O
    MEASURE_ENV=NX_DIRECT_IO=0 measure "cgroup $pct%: --max-memory, page cache" "$lim" --max-memory "$cap"
    st=$(run_limited "$lim" $NEXTN run -m "$MODEL" --prompt-tokens 1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16 -n "$N" \
        --ignore-eos --draft 2 --synthetic-accept 0.8 --stats --max-memory "$cap" 2>&1 >/dev/null | grep "^streamed" || true)
    echo "  $st"
done
echo "== relative to unconstrained"
for k in "cgroup 60%: mmap paging" "cgroup 60%: --max-memory"* "cgroup 40%: mmap paging" "cgroup 40%: --max-memory"*; do
    for label in "${!AR[@]}"; do
        case $label in $k)
            /usr/bin/python3 -c 'import sys; l, a, m, ua, um = sys.argv[1:]; a, m, ua, um = map(float, (a, m, ua, um))
print(f"{l:34s} AR {a / ua:.2f}x   MTP {m / um:.2f}x (MTP over AR there: {m / a if a else 0:.2f}x)")' \
                "$label" "${AR[$label]}" "${MTP[$label]}" "${AR[unconstrained]}" "${MTP[unconstrained]}"
            ;;
        esac
    done
done
