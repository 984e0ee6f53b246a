#!/usr/bin/env bash
# Paired A/B of two nextn builds on one model: runs A then B, REPS times, and prints the median
# and quartiles of B's weight-read rate over A's. This machine's bandwidth drifts minute to
# minute, so only ratios of runs taken back to back mean anything.
#   bench/ab.sh NEXTN_A NEXTN_B [REPS] [MODEL] [-- nextn bench options]
# e.g. make BUILD=/tmp/a; (change); make BUILD=/tmp/b; bench/ab.sh /tmp/a/nextn /tmp/b/nextn 8
set -euo pipefail
A=${1:?usage: bench/ab.sh NEXTN_A NEXTN_B [REPS] [MODEL] [-- nextn bench options]}
B=${2:?usage: bench/ab.sh NEXTN_A NEXTN_B [REPS] [MODEL] [-- nextn bench options]}
REPS=${3:-8}
MODEL=${4:-/tmp/nextn-bench-big36-q4}
shift $(($# < 4 ? $# : 4))
[ "${1:-}" = "--" ] && shift
[ -x "$A" ] && [ -x "$B" ] || { echo "bench/ab.sh: $A and $B must be nextn binaries" >&2; exit 2; }
[ -f "$MODEL/config.json" ] || { echo "bench/ab.sh: no model at $MODEL (make bench generates it)" >&2; exit 2; }
rate() { "$1" bench -m "$MODEL" -n 64 --modes ar --repeat 1 "${@:2}" | grep -o 'weight_GB_s=[0-9.]*' | cut -d= -f2; }
for _ in $(seq "$REPS"); do
    a=$(rate "$A" "$@")
    b=$(rate "$B" "$@")
    echo "$a $b"
done | awk '{ r[NR] = $2 / $1; sa += $1; sb += $2 } END {
    for (i = 1; i <= NR; i++) for (j = i + 1; j <= NR; j++) if (r[j] < r[i]) { t = r[i]; r[i] = r[j]; r[j] = t }
    printf "B/A weight-read rate: median %.3f (quartiles %.3f-%.3f) over %d pairs; mean A %.2f GB/s, B %.2f GB/s\n",
        r[int((NR + 1) / 2)], r[int((NR + 3) / 4)], r[int((3 * NR + 1) / 4)], NR, sa / NR, sb / NR }'
