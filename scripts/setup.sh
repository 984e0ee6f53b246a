#!/usr/bin/env bash
# Installs everything nextn needs to build, test and benchmark on Debian: the C toolchain and
# libraries, Python (PyTorch + NumPy, for the reference forward and test fixtures) and the npm
# reference implementations pinned in package-lock.json, and Chromium, in which the chat page is
# tested. Safe to run repeatedly.
set -euo pipefail
cd "$(dirname "$0")/.."

pkgs=(build-essential pkg-config clang libclang-rt-14-dev
      libjansson-dev libpcre2-dev libutf8proc-dev libmicrohttpd-dev libcmocka-dev zlib1g-dev
      libopenmpi-dev openmpi-bin
      python3 python3-numpy python3-torch python3-regex libopenblas0-pthread
      curl perl chromium strace
      gcc-aarch64-linux-gnu qemu-user
      libjansson-dev:arm64 libpcre2-dev:arm64 libutf8proc-dev:arm64 libmicrohttpd-dev:arm64
      libcmocka-dev:arm64 zlib1g-dev:arm64)
command -v node >/dev/null || pkgs+=(nodejs)
command -v npm >/dev/null || pkgs+=(npm)
missing=()
for p in "${pkgs[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO=sudo
    # the :arm64 libraries of the cross build (make test-arm64) come from Debian's multiarch
    dpkg --print-foreign-architectures | grep -qx arm64 || $SUDO dpkg --add-architecture arm64
    echo "setup: installing ${missing[*]}"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi
if [ ! -d node_modules ] || [ package-lock.json -nt node_modules ]; then
    npm ci --no-audit --no-fund --loglevel=error
fi
echo "setup: ok"
