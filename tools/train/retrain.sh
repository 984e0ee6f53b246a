#!/bin/sh
# Rebuild models/nextn-hy3-tiny from scratch: corpus -> tokenizer -> train -> export
# -> evaluate (model card) -> golden fixtures.  ~40 minutes on 2 cores.
# Needs the Debian packages of scripts/setup-train.sh.  Deterministic (fixed seed, fixed
# step count) unless the machine is so loaded that the 35-minute time budget runs out
# first (the cosine schedule then follows wall-clock time; train.log says so).
set -e
cd "$(dirname "$0")/../.."
PY=/usr/bin/python3
NAME=${NAME:-nextn-hy3-tiny}
OUT=models/$NAME
STEPS=${STEPS:-1600}
# one intra-op thread: on a 2-core machine shared with other jobs, two OpenMP threads
# spend most of their time waiting for each other
THREADS=${THREADS:-1}
$PY tools/train/corpus.py --out .corpus
$PY tools/train/bpe.py train --corpus .corpus --vocab-size 4096 --out .corpus/tok
$PY tools/train/check_tokenizer.py .corpus/tok
$PY tools/train/bpe.py encode-corpus --tokenizer .corpus/tok --corpus .corpus
mkdir -p "$OUT"
rm -f "$OUT/train.log"
$PY tools/train/train.py --corpus .corpus --tokenizer .corpus/tok --out "$OUT" \
    --steps "$STEPS" --batch 8 --warmup 40 --eval-every 100 --code-frac 0.6 --seed 1234 \
    --max-minutes "${MAX_MINUTES:-35}" --threads "$THREADS" \
    --log "$OUT/train.log" --ckpt .corpus/train-state.pt
$PY tools/train/evaluate.py --model "$OUT" --corpus .corpus
$PY tests/ref/make_golden.py --model "$OUT" --out tests/fixtures
