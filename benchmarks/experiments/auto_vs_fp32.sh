#!/usr/bin/env bash
# Accuracy under trainer.precision=auto (bf16-mixed on a CPU with amx_bf16 or avx512_bf16) against 32-true: the
# protocol ViT (compare/cifar10_p4_vit) and cet_vit_nano_global (compare/cifar10_p4_global), seeds 0, 1, 2 each, twelve
# CPU runs; then, per model, `vitlab compare --group-by trainer.precision` (the mean over seeds per precision and
# Welch's t-test between them; docs/benchmarks.md, "Precision auto").
#
#   JOBS=2 benchmarks/experiments/auto_vs_fp32.sh /path/to/cifar10.npz
#   benchmarks/experiments/auto_vs_fp32.sh /path/to/cifar10.npz trainer.max_epochs=2 data.limit_train=2000   # a quick look
#
# On a CPU without native bf16, auto is 32-true and the two arms are the same computation. Finished runs
# (test_metrics.json present) are skipped and interrupted ones resumed, so the script can be started again.
# RUNS (default runs/auto-vs-fp32) is where the runs go; each run's output goes to <run dir>.log.
set -euo pipefail

data=${1:?usage: $0 PATH/TO/cifar10.npz [config overrides...]}
shift
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
runs=${RUNS:-runs/auto-vs-fp32} jobs_max=${JOBS:-1} vitlab=${VITLAB:-vitlab}
mkdir -p "$runs"
source "$(dirname "$0")/fit_runs.sh"

configs=(compare/cifar10_p4_vit compare/cifar10_p4_global)
for seed in 0 1 2; do
    for config in "${configs[@]}"; do
        for precision in auto 32-true; do
            wait_for_slot
            fit_once "$runs/$(basename "$config")-$precision-seed$seed" "$config" data.path="$data" \
                run.seed="$seed" trainer.precision="$precision" "$@" &
        done
    done
done
wait || true
for config in "${configs[@]}"; do
    name=$(basename "$config")
    $vitlab compare "$runs/$name"-{auto,32-true}-seed{0,1,2} --group-by trainer.precision --out "$runs/$name-comparison"
done
