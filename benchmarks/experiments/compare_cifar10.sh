#!/usr/bin/env bash
# CET-ViT against its size-matched Swin, ToMe-ViT and ViT on the CIFAR-10 subset, seeds 0, 1, 2, under one protocol
# (configs/compare/<protocol>*.yaml; docs/baselines.md). Twelve CPU runs, then `vitlab compare` over seeds with
# Welch's t-tests against CET-ViT. See docs/baselines.md for the cost of each model under each protocol.
#
#   benchmarks/experiments/compare_cifar10.sh /path/to/cifar10.npz                 # the protocol as written (compare/cifar10_cpu)
#   PROTOCOL=compare/cifar10_p4 JOBS=2 benchmarks/experiments/compare_cifar10.sh /path/to/cifar10.npz   # the run in the docs
#   benchmarks/experiments/compare_cifar10.sh /path/to/cifar10.npz trainer.max_epochs=2 data.limit_train=2000   # a quick look
#
# PROTOCOL (default compare/cifar10_cpu) names the CET-ViT config; <PROTOCOL>_{swin,tome,vit} are its baselines.
# JOBS (default 1) runs that many trainings at once, one thread each (OMP_NUM_THREADS=1): on a CPU, one per core.
# Finished runs (test_metrics.json present) are skipped and interrupted ones resumed from their last.ckpt, so the
# script can be started again after a stop. RUNS (default runs/compare-<protocol name>) is where the runs go; each
# run's output goes to <run dir>.log.
set -euo pipefail

if [[ $# -lt 1 ]]; then
    echo "usage: $0 PATH/TO/cifar10.npz [config overrides...]" >&2
    exit 2
fi
data=$1
shift
protocol=${PROTOCOL:-compare/cifar10_cpu}
runs=${RUNS:-runs/compare-$(basename "$protocol")}
jobs_max=${JOBS:-1}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
vitlab=${VITLAB:-vitlab}
mkdir -p "$runs"

source "$(dirname "$0")/fit_runs.sh"

train() {  # variant seed [overrides...]
    local variant=$1 seed=$2 name=${1#_}
    shift 2
    fit_once "$runs/${name:-cet_vit}-seed$seed" "$protocol$variant" data.path="$data" run.seed="$seed" "$@"
}

for seed in 0 1 2; do
    for variant in "" _swin _tome _vit; do
        wait_for_slot
        train "$variant" "$seed" "$@" &
    done
done
wait || true
missing=0
for run_dir in "$runs"/{cet_vit,swin,tome,vit}-seed{0,1,2}; do
    if [[ ! -f $run_dir/test_metrics.json ]]; then
        echo "not finished: $run_dir (see $run_dir.log; run the script again to resume it)" >&2
        missing=1
    fi
done
(( missing == 0 )) || exit 1

$vitlab compare "$runs"/{cet_vit,swin,tome,vit}-seed{0,1,2} --out "$runs/comparison"
