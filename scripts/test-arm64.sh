#!/usr/bin/env bash
# `make test-arm64`'s runs, after the cross build into build-arm64/: the kernel tests and the
# end-to-end checks under qemu-aarch64 on a CPU with every NEON extension the tables use ("max":
# dotprod, i8mm) and on one with none (cortex-a53); the other unit tests on "max"; and a short
# end-to-end run on one with dotprod alone (cortex-a76), for the dispatcher's choice there. Two
# at a time (prove -j2).
set -euo pipefail
cd "$(dirname "$0")/.."
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
# one TAP script per run: prove runs each as a job
for cpu in max:neoni8mm cortex-a53:neon; do
    name=${cpu%%:*} isa=${cpu##*:}
    printf '#!/bin/sh\nCMOCKA_MESSAGE_OUTPUT=TAP exec qemu-aarch64 -cpu %s build-arm64/tests/test_kernels\n' \
        "$name" > "$dir/kernels-$name.t"
    printf '#!/bin/sh\nQEMU_CPU=%s EXPECT_ISA=%s exec /usr/bin/python3 scripts/arm64_e2e.py\n' \
        "$name" "$isa" > "$dir/e2e-$name.t"
done
printf '#!/bin/sh\nARM64_E2E_QUICK=1 QEMU_CPU=cortex-a76 EXPECT_ISA=neondot exec /usr/bin/python3 scripts/arm64_e2e.py\n' \
    > "$dir/e2e-cortex-a76.t"
units=()
for t in build-arm64/tests/test_*; do
    case "$t" in *.d | */test_kernels) continue ;; esac
    printf '#!/bin/sh\nCMOCKA_MESSAGE_OUTPUT=TAP exec qemu-aarch64 -cpu max %s\n' "$t" > "$dir/unit-${t##*/}.t"
    units+=("$dir/unit-${t##*/}.t")
done
prove -f -j2 --exec /bin/sh "$dir"/kernels-max.t "$dir"/e2e-max.t "$dir"/kernels-cortex-a53.t "$dir"/e2e-cortex-a53.t \
    "$dir"/e2e-cortex-a76.t "${units[@]}"
