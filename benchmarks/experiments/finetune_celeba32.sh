#!/usr/bin/env bash
# The fine-tuning recipe of docs/recipes.md ("Pretrained weights and fine-tuning"): a vit_pico pretrained on the
# CIFAR-10 subset, fine-tuned on a tenth of CelebA-32's training images (the Male attribute), against the same network
# from scratch at the same budget and with the dynamics controller on, seeds 0, 1, 2; one training at a time. Then two
# more fine-tuning arms: a linear probe (frozen backbone, lr 1e-2) and layer-wise learning-rate decay 0.75.
#
#   benchmarks/experiments/finetune_celeba32.sh /path/to/cifar10.npz /path/to/celeba32_subset.npz [overrides for every fine-tune]
#
# RUNS (default runs/finetune) is where the runs go; a run whose test_metrics.json exists is skipped, so the script
# can be started again after a stop. Then: python benchmarks/reports/finetune_summary.py "$RUNS".
set -euo pipefail

if [[ $# -lt 2 ]]; then
    echo "usage: $0 PATH/TO/cifar10.npz PATH/TO/celeba32_subset.npz [overrides...]" >&2
    exit 2
fi
cifar=$1
celeba=$2
shift 2
runs=${RUNS:-runs/finetune}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
vitlab=${VITLAB:-vitlab}
mkdir -p "$runs"

train() {  # run_dir config [overrides...]
    local run_dir=$1 config=$2
    shift 2
    if [[ -f $run_dir/test_metrics.json ]]; then
        echo "done: $run_dir"
        return
    fi
    echo "training: $run_dir"
    rm -rf "$run_dir"
    /usr/bin/time -f "%e s" -o "$run_dir.time" $vitlab fit --config "$config" run.dir="$run_dir" \
        trainer.enable_progress_bar=false run.report=false "$@" > "$run_dir.log" 2>&1
}

train "$runs/pretrain" finetune/cifar10_pretrain data.path="$cifar"
for seed in 0 1 2; do
    common=(data.path="$celeba" run.seed=$seed)
    train "$runs/scratch-seed$seed" finetune/celeba32_male "${common[@]}" "$@"
    train "$runs/pretrained-seed$seed" finetune/celeba32_male "${common[@]}" model.pretrained="$runs/pretrain" "$@"
    train "$runs/controlled-seed$seed" finetune/celeba32_male "${common[@]}" model.pretrained="$runs/pretrain" \
        model.temperature=true dynamics.mode=schedule dynamics.freeze=true "$@"
done
for seed in 0 1 2; do
    common=(data.path="$celeba" run.seed=$seed model.pretrained="$runs/pretrain")
    train "$runs/probe-seed$seed" finetune/celeba32_male "${common[@]}" finetune.freeze=backbone optim.lr=1e-2 "$@"
    train "$runs/layerdecay-seed$seed" finetune/celeba32_male "${common[@]}" finetune.layer_decay=0.75 "$@"
done
