#!/usr/bin/env bash
# The 24 GB-machine check: the whole GLM-4.7-Flash and Qwen3.6-35B-A3B shapes (every layer, the
# real vocabularies, MLX 4-bit + an agreeing 4-bit MTP sidecar, random weights) loaded, decoded
# with and without MTP, at a short and a 4096-token context, and served; the engine's own memory
# (RssAnon) against the machine's. Not part of `make bench`: generating the two checkpoints (~17
# and ~20 GB) takes about an hour of one core the first time.
#   bench/full_size.sh [flash] [qwen36]      (default both)
#   NEXTN_FULL_PARTS="short long serve" picks the parts (default all three)
set -euo pipefail
cd "$(dirname "$0")/.."
NEXTN=build/nextn
FLASH=${NEXTN_FLASH_FULL:-/tmp/nextn-full-flash}
QWEN36=${NEXTN_QWEN36_FULL:-/tmp/nextn-full-qwen36}
N=${NEXTN_BENCH_TOKENS:-64}
PORT=${NEXTN_FULL_PORT:-18480}
which=${*:-flash qwen36}
PARTS=" ${NEXTN_FULL_PARTS:-short long serve} "

gen() { # NAME DIR
    [ -f "$2/config.json" ] && return
    echo "== generating the whole $1 shape in $2 (about half an hour)"
    case $1 in
    flash) /usr/bin/python3 tests/ref/make_random_mla.py --family glm4_moe_lite --preset flash --layout mlx \
        --quant 4:64 --mtp sidecar --agree 0.05 --shards 4 --out "$2" ;;
    qwen36) /usr/bin/python3 tests/ref/make_random_qwen35.py --family qwen3_5_moe --preset qwen36 --layout mlx \
        --quant 4:64 --mtp sidecar --agree 0.05 --shards 4 --out "$2" ;;
    esac
    # the default model's byte-level tokenizer, for the server (ids past it decode to nothing, as
    # a real checkpoint's padded vocabulary does)
    cp models/nextn-hy3-tiny/tokenizer.json "$2/"
}

kb() { awk -v k="$2" '$1 == k":" { print $2 }' "/proc/$1/status"; }

ids() { # N VOCAB: N token ids, comma-separated, fixed by a seed
    /usr/bin/python3 -c "import random, sys; r = random.Random(7); n, v = map(int, sys.argv[1:]); print(','.join(str(r.randrange(100, v)) for _ in range(n)))" "$1" "$2"
}

modes() { # FIELDS: of each mode=... line of `nextn bench` on stdin, the fields named (a|b|c)
    grep -E "^mode=" | tr ' ' '\n' | awk -F= -v want="^($1)$" '
        $1 == "mode" { if (m != "") print line; m = $2; line = "mode " m }
        $1 ~ want { line = line " " $1 "=" $2 }
        END { print line }'
}

check() { # NAME DIR VOCAB
    local name=$1 m=$2 vocab=$3
    gen "$name" "$m"
    echo "== $name: $(du -sh "$m" | cut -f1) on disk; memory: $(awk '$1 == "MemTotal:" { printf "%.1f GiB", $2 / 1048576 }' /proc/meminfo)"
    /usr/bin/time -f "inspect: %e s, max RSS %M KB" $NEXTN inspect -m "$m" 2>&1 |
        grep -E "^inspect:|parameters|kv cache|family|MTP" | head -8
    [[ $PARTS == *" short "* ]] && short "$m" "$vocab"
    [[ $PARTS == *" long "* ]] && long "$m" "$vocab"
    [[ $PARTS == *" serve "* ]] && serve "$m" "$vocab"
    return 0
}

short() { # DIR VOCAB
    local m=$1 vocab=$2
    echo "-- decode after a 16-token prompt"
    $NEXTN bench -m "$m" --prompt-tokens "$(ids 16 "$vocab")" -n "$N" --modes ar,1,2,auto --membw 1024 |
        modes 'tok_s|ratio|acceptance|cost_verify/C1|c_mtp|byte_ceiling|weight_frac|membw_GB_s|weight_GB_s'
}

long() { # DIR VOCAB
    local m=$1 vocab=$2
    echo "-- decode after a 4096-token prompt"
    $NEXTN bench -m "$m" --prompt-tokens "$(ids 4096 "$vocab")" -n "$N" --modes ar,1,auto |
        modes 'tok_s|prefill_tok_s|ratio|acceptance|attn_us|ar_step_us'
}

serve() { # DIR VOCAB
    local m=$1 vocab=$2 pid t0
    echo "-- serve (--ctx 32768), one request of 4096 prompt tokens"
    $NEXTN serve -m "$m" --port "$PORT" --ctx 32768 > /tmp/nextn-full-serve.log 2>&1 &
    pid=$!
    for _ in $(seq 600); do
        kill -0 $pid 2> /dev/null || { cat /tmp/nextn-full-serve.log; return 1; }
        curl -sf "localhost:$PORT/health" > /dev/null && break
        sleep 1
    done
    echo "after load: RssAnon $(kb $pid RssAnon) kB, RssFile $(kb $pid RssFile) kB"
    t0=$(date +%s.%N)
    curl -sf "localhost:$PORT/v1/completions" -H 'Content-Type: application/json' \
        -d "{\"prompt\": [$(ids 4096 "$vocab")], \"max_tokens\": $N, \"temperature\": 0}" |
        /usr/bin/python3 -c 'import json, sys; r = json.load(sys.stdin); u = r["usage"]; t = r["timings"]; print("completion: %d prompt + %d tokens, prefill %.1f tok/s, decode %.1f tok/s, drafts %d accepted %d" % (u["prompt_tokens"], u["completion_tokens"], t["prompt_per_second"], t["predicted_per_second"], t["draft_n"], t["draft_n_accepted"]))'
    echo "request: $(echo "$(date +%s.%N) - $t0" | bc) s; peak RSS $(kb $pid VmHWM) kB, RssAnon $(kb $pid RssAnon) kB; MemAvailable $(awk '$1 == "MemAvailable:" { print $2 }' /proc/meminfo) kB"
    kill $pid
    wait $pid 2> /dev/null || true
}

for w in $which; do
    case $w in
    flash) check flash "$FLASH" 154880 ;;
    qwen36) check qwen36 "$QWEN36" 248320 ;;
    *) echo "unknown model $w (flash, qwen36)" >&2; exit 2 ;;
    esac
done
