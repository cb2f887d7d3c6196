#!/usr/bin/env bash
# One call on a lent CUDA GPU for the card claim's GPU replicate (docs/card_claim.md, amendments of 2026-12-04):
#   1. benchmarks/micro/ei_svd_cuda.py times the EI term's singular values on this GPU: svdvals on the device, on
#      the host, and the float64 Gram way (the same values; its errors against a float64 reference are in its JSON);
#   2. the fastest of the three for the design's shapes (N=64, K=8 and N=256, K=32, summed) becomes model.ei_svd;
#   3. benchmarks/experiments/card_claim_cuda.sh runs the design's budgets (BUDGETS, default "8 24") until TIMEOUT_S,
#      skipping the runs already recorded in RECORDED_FROM (copied into the results first);
#   4. what comes back is packed into at most four files under OUT: the SVD benchmark's JSON, the way chosen, the new
#      per-run JSONs with every run's timing.json and log (one .tar.gz), and the driver's log.
#
#   GIT_REVISION=$(git rev-parse HEAD) bash benchmarks/experiments/card_claim_cuda_call.sh DATA RECORDED_FROM OUT TIMEOUT_S
set -euo pipefail
cd "$(dirname "$0")/../.."
if [[ $# -lt 4 ]]; then
    echo "usage: $0 DATA(npz_transport folder or npz) RECORDED_FROM(results folder) OUT TIMEOUT_S" >&2
    exit 2
fi
data=$1 recorded=$2 out=$3 limit=$4
PYTHON=${PYTHON:-python3}
[[ -d $recorded ]] || { echo "error: $recorded is not a folder of recorded runs" >&2; exit 2; }
[[ -n ${GIT_REVISION:-} ]] || { echo "error: set GIT_REVISION (the revision the runs record)" >&2; exit 2; }
start=$(date +%s)
device=$(PYTHONPATH="$PWD" "$PYTHON" -c "import torch; from benchmarks.naming import device_name; print(device_name(torch.cuda.get_device_name(0)))")
day=$(date -u +%F)
svd_json=$out/ei_svd_cuda_${device}_${day}.json
PYTHONPATH="$PWD/src:$PWD" "$PYTHON" -m benchmarks.micro.ei_svd_cuda --out "$svd_json" | tee "$out/ei_svd_cuda.log"
way=$("$PYTHON" - "$svd_json" <<'EOF'
import json, sys
rows = json.load(open(sys.argv[1]))["rows"]
ways = {"svdvals": "device", "host": "host", "gram_f64": "gram"}  # the benchmark's names -> model.ei_svd
cost = {way: sum(r["ms_median"] for r in rows if r["way"] == way and (r["tokens"], r["slots"]) in {(64, 8), (256, 32)})
        for way in ways}
print(ways[min(cost, key=cost.get)])
EOF
)
echo "model.ei_svd=$way (from $svd_json)" | tee "$out/ei_svd_chosen.txt"
results=runs/card_claim_results
mkdir -p "$results"
cp "$recorded"/*.json "$results"/
before=$(ls "$results")
left=$(( limit - ($(date +%s) - start) ))
BUDGETS=${BUDGETS:-"8 24"} JOBS=${JOBS:-6} bash benchmarks/experiments/card_claim_cuda.sh "$data" runs/cc-gpu "$results" "$left" \
    model.ei_svd="$way" > "$out/driver.log" 2>&1 || echo "driver stopped: $?" >> "$out/driver.log"
new=()
for f in "$results"/*.json; do
    grep -qxF "$(basename "$f")" <<< "$before" || new+=("$f")
done
echo "new runs recorded: ${#new[@]}" | tee -a "$out/driver.log"
tar -czf "$out/card_claim_gpu_call.tar.gz" "${new[@]}" runs/cc-gpu/*.log runs/cc-gpu/*/timing.json runs/cc-gpu/*/metrics.jsonl \
    2>/dev/null || true
