#!/usr/bin/env bash
# finetune.layer_decay on the families other than the ViT (CET-ViT, Swin): a tiny pretraining run of each on the
# CIFAR-10 subset, then the CelebA-32 fine-tuning recipe from it with layer decay and gradient checkpointing.
# A smoke run of the options, not an experiment (one epoch on 256 images each; no hub weights exist offline, so the
# pretrained weights are the tiny local run's). The recipe's dynamics section measures a ViT's CLS attention, so it
# is switched off here. Usage: benchmarks/experiments/finetune_layer_decay.sh OUT_DIR [CIFAR10_NPZ] [CELEBA32_NPZ]
set -euo pipefail
out=${1:?usage: $0 OUT_DIR [CIFAR10_NPZ] [CELEBA32_NPZ]}
cifar=${2:-/work/shared/datasets/cifar10.npz}
celeba=${3:-/work/shared/datasets/celeba32_subset.npz}
quick=(trainer.max_epochs=1 data.limit_train=256 trainer.enable_progress_bar=false run.report=false)
export OMP_NUM_THREADS=1
for model in cet_vit_pico swin_pico; do
  vitlab fit --config finetune/cifar10_pretrain model.name=$model data.path="$cifar" "${quick[@]}" \
    run.dir="$out/$model-pretrain"
  vitlab fit --config finetune/celeba32_male model.name=$model data.path="$celeba" "${quick[@]}" dynamics=null \
    model.pretrained="$out/$model-pretrain" finetune.layer_decay=0.75 trainer.grad_checkpointing=true \
    run.dir="$out/$model-finetune"
done
