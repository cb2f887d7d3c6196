#!/usr/bin/env bash
# CET-ViT against its size-matched Swin, ToMe-ViT and ViT on the CIFAR-10 subset, seeds 0, 1, 2, under one protocol
# (configs/compare/cifar10_cpu*.yaml; docs/baselines.md). Twelve CPU runs, then `vitlab compare` over seeds with
# Welch's t-tests against CET-ViT. Hours on a CPU: see docs/baselines.md for the cost of each model.
#
#   benchmarks/compare_cifar10.sh /path/to/cifar10.npz                 # the protocol as written
#   benchmarks/compare_cifar10.sh /path/to/cifar10.npz trainer.max_epochs=2 data.limit_train=2000   # a quick look
#
# Finished runs (test_metrics.json present) are skipped and interrupted ones resumed from their last.ckpt, so the
# script can be started again after a stop. RUNS (default runs/compare-cifar10) is where the runs go.
set -euo pipefail

if [[ $# -lt 1 ]]; then
    echo "usage: $0 PATH/TO/cifar10.npz [config overrides...]" >&2
    exit 2
fi
data=$1
shift
runs=${RUNS:-runs/compare-cifar10}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
vitlab=${VITLAB:-vitlab}

for seed in 0 1 2; do
    for variant in "" _swin _tome _vit; do
        name=${variant#_}
        run_dir=$runs/${name:-cet_vit}-seed$seed
        if [[ -f $run_dir/test_metrics.json ]]; then
            echo "done: $run_dir"
        elif [[ -f $run_dir/checkpoints/last.ckpt ]]; then
            $vitlab fit --resume "$run_dir"
        else
            $vitlab fit --config "compare/cifar10_cpu$variant" data.path="$data" run.seed="$seed" run.dir="$run_dir" "$@"
        fi
    done
done

$vitlab compare "$runs"/cet_vit-seed* "$runs"/swin-seed* "$runs"/tome-seed* "$runs"/vit-seed* --out "$runs/comparison"
