#!/bin/sh
# Rebuild models/nextn-hy3-tiny from scratch: corpus -> tokenizer -> train -> export
# -> forge the MTP head on the trained trunk (nextn forge, as the shipped head was made; FORGE=0
# keeps the jointly trained head) -> evaluate (model card) -> golden fixtures.  ~40 minutes on
# 2 cores, plus up to FORGE_MINUTES (55) of head training and the forge's shard (~25 minutes).
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
if [ "${FORGE:-1}" = 1 ]; then
    # the model card's "Forged head": the trunk's own top-32 distributions over 3 M training
    # tokens, then the head put back into the single model file
    [ -x build/nextn ] || make -j2
    rm -rf .corpus/forged .corpus/forged.work
    build/nextn forge -m "$OUT" --corpus .corpus/train_code.jsonl .corpus/train_prose.jsonl \
        --heldout bench/texts/code.c bench/texts/prose.txt --tokens 3000000 --steps 4000 \
        --minutes "${FORGE_MINUTES:-55}" -t "$THREADS" -o .corpus/forged --work .corpus/forged.work
    $PY tools/forge/inline_head.py --model "$OUT" --head .corpus/forged.work/head
fi
$PY tools/train/evaluate.py --model "$OUT" --corpus .corpus
$PY tests/ref/make_golden.py --model "$OUT" --out tests/fixtures
