#!/usr/bin/env bash
# Paired A/B of two nextn builds on one model: runs A then B, REPS times, and prints the median
# and quartiles of B's weight-read rate over A's. This machine's bandwidth drifts minute to
# minute, so only ratios of runs taken back to back mean anything.
#   bench/ab.sh NEXTN_A NEXTN_B [REPS] [MODEL] [-- nextn bench options]
# e.g. make BUILD=/tmp/a; (change); make BUILD=/tmp/b; bench/ab.sh /tmp/a/nextn /tmp/b/nextn 8
# Where the bandwidth switches between levels (a shared VM), AB_MIN_GBS / AB_MAX_GBS keep only
# the pairs with build/bench/membw's reading inside that range both before and after the pair
# (it waits, up to AB_TRIES probes, for the range): a change can help in one level and not the
# other, and a pair that straddles a switch says nothing.
set -euo pipefail
A=${1:?usage: bench/ab.sh NEXTN_A NEXTN_B [REPS] [MODEL] [-- nextn bench options]}
B=${2:?usage: bench/ab.sh NEXTN_A NEXTN_B [REPS] [MODEL] [-- nextn bench options]}
REPS=${3:-8}
MODEL=${4:-/tmp/nextn-bench-big36-q4}
shift $(($# < 4 ? $# : 4))
[ "${1:-}" = "--" ] && shift
[ -x "$A" ] && [ -x "$B" ] || { echo "bench/ab.sh: $A and $B must be nextn binaries" >&2; exit 2; }
[ -f "$MODEL/config.json" ] || { echo "bench/ab.sh: no model at $MODEL (make bench generates it)" >&2; exit 2; }
MIN=${AB_MIN_GBS:-0}
MAX=${AB_MAX_GBS:-0}
TRIES=${AB_TRIES:-100}
MEMBW="$(dirname "$0")/../build/bench/membw"
rate() { "$1" bench -m "$MODEL" -n 64 --modes ar --repeat 1 "${@:2}" | grep -o 'weight_GB_s=[0-9.]*' | cut -d= -f2; }
in_range() { # the probe's reading now is within [MIN, MAX] (MAX 0: no upper bound)
    local bw
    bw=$("$MEMBW" | grep -o 'membw_gbs=[0-9.]*' | cut -d= -f2)
    awk -v b="$bw" -v lo="$MIN" -v hi="$MAX" 'BEGIN { exit !(b >= lo && (hi == 0 || b <= hi)) }'
}
filtered() { [ "$MIN" != 0 ] || [ "$MAX" != 0 ]; }
got=0
tries=0
while [ "$got" -lt "$REPS" ]; do
    if filtered; then
        tries=$((tries + 1))
        [ "$tries" -le "$TRIES" ] || { echo "bench/ab.sh: the bandwidth stayed out of range; $got pairs" >&2; break; }
        in_range || { sleep 5; continue; }
    fi
    a=$(rate "$A" "$@")
    b=$(rate "$B" "$@")
    if filtered && ! in_range; then continue; fi
    echo "$a $b"
    got=$((got + 1))
done | awk '{ r[NR] = $2 / $1; sa += $1; sb += $2 } END {
    if (NR == 0) exit 1
    for (i = 1; i <= NR; i++) for (j = i + 1; j <= NR; j++) if (r[j] < r[i]) { t = r[i]; r[i] = r[j]; r[j] = t }
    printf "B/A weight-read rate: median %.3f (quartiles %.3f-%.3f) over %d pairs; mean A %.2f GB/s, B %.2f GB/s\n",
        r[int((NR + 1) / 2)], r[int((NR + 3) / 4)], r[int((3 * NR + 1) / 4)], NR, sa / NR, sb / NR }'
