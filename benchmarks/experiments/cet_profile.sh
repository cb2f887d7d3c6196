#!/usr/bin/env bash
# Where CET-ViT's training step goes beside the matched ViT's (docs/baselines.md, "Why CET-ViT trains no faster"):
# benchmarks/micro/profile_step.py on cet_vit_nano and vit_matched_cet_vit_nano at compare/cifar10_p4's shape (patch 4,
# 10 classes, batch 128), with the protocol's dropout, stochastic depth and attention dropout and without them, and
# CET-ViT without them and with its window attention fused.
#   benchmarks/experiments/cet_profile.sh benchmarks/results      # writes profile_<model>_<drop|nodrop>.json there
set -euo pipefail
out=${1:-benchmarks/results}
python=${PYTHON:-python}
export OMP_NUM_THREADS=1
shape="img_size=32 patch_size=4 num_classes=10"
drop="drop_path_rate=0.1 drop_rate=0.05 attn_drop_rate=0.05"
nodrop="drop_path_rate=0 drop_rate=0 attn_drop_rate=0"
nodrop_fused="$nodrop fused_window_attention=true"   # CET-ViT only: timm's window attention through SDPA
for round in 1 2; do  # alternate the models, twice; the docs quote the faster round of each
    for model in cet_vit_nano vit_matched_cet_vit_nano; do
        modes="drop nodrop"
        [[ $model == cet_vit_nano ]] && modes="drop nodrop nodrop_fused"
        for mode in $modes; do
            # shellcheck disable=SC2086
            $python benchmarks/micro/profile_step.py "$model" $shape ${!mode} --batch-size 128 --steps 3 \
                --out "$out/profile_${model}_${mode}_round$round.json"
        done
    done
done
