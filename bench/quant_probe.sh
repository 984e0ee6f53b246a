#!/usr/bin/env bash
# The MTP head's acceptance ceiling at different precisions (model card table): the default model
# in bf16, with only the head quantized (8 and 4 bit), with the default conversion (trunk 4-bit,
# head 8-bit, eh_proj bf16) and with the whole model at 4 and 3 bits, on int8 activations (the
# default); the 4- and 3-bit ones also on int16 (--act-bits 16). `nextn probe` over the held-out
# texts in bench/texts, greedy and E[min(p,q)] at temperature 0.9.
set -euo pipefail
cd "$(dirname "$0")/.."
N=build/nextn
M=${1:-models/nextn-hy3-tiny}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
$N convert "$M" "$tmp/head8" --keep '*=bf16' --keep 'mtp.*=8' --quiet >/dev/null
$N convert "$M" "$tmp/head4" --keep '*=bf16' --keep 'mtp.*=4' --quiet >/dev/null
$N convert "$M" "$tmp/default4" --bits 4 --quiet >/dev/null
$N convert "$M" "$tmp/all4" --bits 4 --mtp-bits 4 --quiet >/dev/null
$N convert "$M" "$tmp/all3" --bits 3 --mtp-bits 3 --quiet >/dev/null
printf "| precision | size | code greedy | prose greedy | code E[min(p,q)] T=0.9 | prose E[min(p,q)] T=0.9 |\n|---|---|---|---|---|---|\n"
# "@16": the same files run with int16 activations for the 2-6-bit matmuls (--act-bits 16)
for v in "bf16:$M" "bf16 trunk, head 8-bit:$tmp/head8" "bf16 trunk, head 4-bit:$tmp/head4" \
         "trunk 4-bit, head 8-bit (convert default):$tmp/default4" \
         "trunk 4-bit, head 8-bit, --act-bits 16:$tmp/default4@16" "all 4-bit:$tmp/all4" \
         "all 4-bit, --act-bits 16:$tmp/all4@16" "all 3-bit:$tmp/all3" "all 3-bit, --act-bits 16:$tmp/all3@16"; do
    name=${v%%:*}; dir=${v#*:}; act=8
    case $dir in *@16) dir=${dir%@16}; act=16 ;; esac
    out=$($N probe -m "$dir" bench/texts/code.c bench/texts/prose.txt --temp 0.9 --act-bits $act)
    c=$(echo "$out" | sed -n '2p'); p=$(echo "$out" | sed -n '4p')
    g() { echo "$1" | grep -o "greedy vs trunk [0-9.]*" | awk '{print $4}'; }
    e() { echo "$1" | grep -o "E\[min(p,q)\] [0-9.]*" | awk '{print $2}'; }
    printf "| %s | %s | %s | %s | %s | %s |\n" "$name" "$(du -sh "$dir" | cut -f1)" "$(g "$c")" "$(g "$p")" "$(e "$c")" "$(e "$p")"
done
