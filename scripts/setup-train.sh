#!/bin/sh
# Debian packages needed to rebuild the corpus and retrain / evaluate the tiny
# hy_v3 model (tools/train/), and to run the python reference helpers (tests/ref/).
set -e
export DEBIAN_FRONTEND=noninteractive
apt-get update
apt-get install -y \
    python3 python3-torch python3-numpy python3-regex python3-jinja2 libopenblas0-pthread \
    linux-source-6.1 python3.11-doc debian-reference-en gnu-standards fortunes fortunes-min \
    nodejs
