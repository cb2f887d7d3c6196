#!/usr/bin/env bash
# Accuracy under trainer.precision=auto (bf16-mixed on a CPU with amx_bf16, or avx512_bf16 where bf16 matmuls are
# faster) against 32-true: the protocol ViT (compare/cifar10_p4_vit) and cet_vit_nano_global
# (compare/cifar10_p4_global), seeds 0, 1, 2 each, twelve CPU runs; each finished run gets one JSON in RESULTS at once
# (benchmarks/experiments/run_result.py), then, per model, `vitlab compare --group-by trainer.precision` over the runs
# and `python -m benchmarks.reports.precision_accuracy RESULTS` (Welch's t-test and interval per model;
# docs/benchmarks.md, "Precision auto").
#
#   JOBS=2 benchmarks/experiments/auto_vs_fp32.sh /path/to/cifar10.npz
#   PRECISIONS="bf16-mixed 32-true" JOBS=2 benchmarks/experiments/auto_vs_fp32.sh DATA   # bf16 where auto is fp32
#   benchmarks/experiments/auto_vs_fp32.sh /path/to/cifar10.npz trainer.max_epochs=2 data.limit_train=2000   # a quick look
#
# On a CPU where auto is 32-true the two arms of the default are the same computation: PRECISIONS names the arms
# (the precision bf16-mixed runs is the same on every CPU; only its speed differs). Finished runs (test_metrics.json
# present) are skipped and interrupted ones resumed, so the script can be started again. RUNS (default
# runs/auto-vs-fp32) is where the runs go, each run's output in <run dir>.log; RESULTS (default
# benchmarks/results/experiments/precision_accuracy_<device>_<date>) the per-run JSONs.
set -euo pipefail

data=${1:?usage: $0 PATH/TO/cifar10.npz [config overrides...]}
shift
[[ -f $data ]] || { echo "error: $data is not a file; pass the CIFAR-10 npz (x_train, y_train, x_test, y_test)" >&2; exit 2; }
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
runs=${RUNS:-runs/auto-vs-fp32} jobs_max=${JOBS:-1} vitlab=${VITLAB:-vitlab} python=${PYTHON:-python}
read -r -a precisions <<< "${PRECISIONS:-auto 32-true}"
if [[ -z ${RESULTS:-} ]]; then
    device=$("$python" -c "from benchmarks.naming import cpu_model, device_name; print(device_name(cpu_model()))")
    RESULTS=benchmarks/results/experiments/precision_accuracy_${device}_$(date -u +%F)
fi
mkdir -p "$runs" "$RESULTS"
source "$(dirname "$0")/fit_runs.sh"

run_and_record() {  # RUN_DIR CONFIG PRECISION SEED [overrides...]
    local run_dir=$1 config=$2 precision=$3 seed=$4
    shift 4
    fit_once "$run_dir" "$config" data.path="$data" run.seed="$seed" trainer.precision="$precision" "$@" \
        || { echo "failed: $run_dir (see $run_dir.log)" >&2; return 0; }
    local out=$RESULTS/$(basename "$run_dir").json
    [[ -f $out ]] || "$python" -m benchmarks.experiments.run_result "$run_dir" --experiment precision_accuracy \
        --arm "$(basename "$config"):$precision" --seed "$seed" --out "$out"
}

configs=(compare/cifar10_p4_vit compare/cifar10_p4_global)
for seed in 0 1 2; do
    for config in "${configs[@]}"; do
        for precision in "${precisions[@]}"; do
            wait_for_slot
            run_and_record "$runs/$(basename "$config")-$precision-seed$seed" "$config" "$precision" "$seed" "$@" &
        done
    done
done
wait || true
for config in "${configs[@]}"; do
    name=$(basename "$config")
    dirs=()
    for precision in "${precisions[@]}"; do dirs+=("$runs/$name-$precision"-seed{0,1,2}); done
    $vitlab compare "${dirs[@]}" --group-by trainer.precision --out "$runs/$name-comparison" || true
done
"$python" -m benchmarks.reports.precision_accuracy "$RESULTS"
