#!/usr/bin/env bash
# A model across MPI ranks on this machine (docs/multinode.md): `nextn bench --split` on 1, 2 and 3
# localhost ranks for both splits, AR and MTP k = 2, with rank 0's network traffic per plain step
# and per verify cycle and the whole job's bytes and messages per generated token; then the
# messages and bytes the step model counts for the same shapes (they must match the measured
# job_msgs_token of the AR runs), and its projection to 2-8 real nodes on 10/25/100 Gb Ethernet
# for the Hy3 and DeepSeek-V3 shapes (bench/mpi_model.py). Localhost ranks share this machine's
# cores, so their tok/s measure the protocol's overhead, not a cluster's speed.
#   bash bench/mpi.sh [MODEL_DIR]     (default: the shipped model; NEXTN=path/to/nextn)
set -euo pipefail
cd "$(dirname "$0")/.."
NEXTN=${NEXTN:-build/nextn}
MODEL=${1:-models/nextn-hy3-tiny}
MPIRUN=(mpirun --oversubscribe --allow-run-as-root)
for n in 1 2 3; do
    for split in pipeline experts; do
        echo "== $n rank(s), --split $split"
        "${MPIRUN[@]}" -n "$n" "$NEXTN" bench -m "$MODEL" --split "$split" -n 64 --modes ar,2 -t 1 2>/dev/null |
            grep '^mode=' | tr ' ' '\n' | grep -E '^(mode|tok_s|acceptance|net_|job_)' | paste -sd' '
    done
done
shape=$(/usr/bin/python3 -c '
import json, sys
c = json.load(open(sys.argv[1] + "/config.json"))
L = c["num_hidden_layers"]
dense = c.get("first_k_dense_replace", 0)
print(c["hidden_size"], c["vocab_size"], L - dense, c.get("num_experts_per_tok", 0))' "$MODEL")
/usr/bin/python3 bench/mpi_model.py --local $shape
