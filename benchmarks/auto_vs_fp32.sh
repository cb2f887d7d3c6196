#!/usr/bin/env bash
# Accuracy under trainer.precision=auto (bf16-mixed on a CPU with amx_bf16 or avx512_bf16) against 32-true: the
# protocol ViT (compare/cifar10_p4_vit) and cet_vit_nano_global (compare/cifar10_p4_global), seeds 0, 1, 2 each, twelve
# CPU runs; then, per model, `vitlab compare --group-by trainer.precision` (the mean over seeds per precision and
# Welch's t-test between them; docs/benchmarks.md, "Precision auto").
#
#   JOBS=2 benchmarks/auto_vs_fp32.sh /path/to/cifar10.npz
#   benchmarks/auto_vs_fp32.sh /path/to/cifar10.npz trainer.max_epochs=2 data.limit_train=2000   # a quick look
#
# On a CPU without native bf16, auto is 32-true and the two arms are the same computation. Finished runs
# (test_metrics.json present) are skipped and interrupted ones resumed, so the script can be started again.
# RUNS (default runs/auto-vs-fp32) is where the runs go; each run's output goes to <run dir>.log.
set -euo pipefail

if [[ $# -lt 1 ]]; then
    echo "usage: $0 PATH/TO/cifar10.npz [config overrides...]" >&2
    exit 2
fi
data=$1
shift
runs=${RUNS:-runs/auto-vs-fp32}
jobs_max=${JOBS:-1}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
vitlab=${VITLAB:-vitlab}
mkdir -p "$runs"

train() {  # config precision seed [overrides...]
    local config=$1 precision=$2 seed=$3
    shift 3
    local run_dir=$runs/$(basename "$config")-$precision-seed$seed
    if [[ -f $run_dir/test_metrics.json ]]; then
        echo "done: $run_dir"
    elif [[ -f $run_dir/checkpoints/last.ckpt ]]; then
        echo "resuming: $run_dir"
        $vitlab fit --resume "$run_dir" > "$run_dir.log" 2>&1
    else
        echo "training: $run_dir"
        $vitlab fit --config "$config" data.path="$data" run.seed="$seed" run.dir="$run_dir" \
            trainer.precision="$precision" trainer.enable_progress_bar=false "$@" > "$run_dir.log" 2>&1
    fi
}

configs=(compare/cifar10_p4_vit compare/cifar10_p4_global)
for seed in 0 1 2; do
    for config in "${configs[@]}"; do
        for precision in auto 32-true; do
            while (( $(jobs -rp | wc -l) >= jobs_max )); do
                wait -n || true
            done
            train "$config" "$precision" "$seed" "$@" &
        done
    done
done
wait || true
for config in "${configs[@]}"; do
    name=$(basename "$config")
    $vitlab compare "$runs/$name"-{auto,32-true}-seed{0,1,2} --group-by trainer.precision --out "$runs/$name-comparison"
done
