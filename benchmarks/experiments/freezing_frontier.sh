#!/usr/bin/env bash
# Issue 44, item 4: the freezing frontier at 256 tokens. CelebA-32 at patch 2 (16x16 = 256 tokens), ViTCAE pico,
# a cosine schedule (the paper's plateau schedule kept the rate, and the drift, constant for 15 epochs on CelebA-32,
# so no head settled: docs/experiments/dynamics_decay_rule.md), per seed one run without freezing (the decisions are
# logged, nothing freezes: it is also the reference of every threshold, since without freezing the threshold changes
# nothing in training) and one controlled run per decay_ratio. Runs one training at a time (JOBS=1) and resumes.
#   bash benchmarks/experiments/freezing_frontier.sh OUT [RESULTS]
# then: python -m benchmarks.experiments.freezing_frontier OUT --out FILE (the replay timing, table and figure)
set -euo pipefail
OUT=${1:?usage: freezing_frontier.sh OUT [RESULTS]}
RESULTS=${2:-}
DATA=${DATA:-../shared/datasets/celeba32_subset.npz}
RATIOS=${RATIOS:-0.5 0.7 0.85}
for seed in ${SEEDS:-0 1 2}; do
  for ratio in $RATIOS; do
    arms=controlled
    [ "$ratio" = "$(echo $RATIOS | cut -d' ' -f1)" ] && arms="nofreeze controlled"
    JOBS=1 SEEDS=$seed ARMS=$arms RESULTS=${RESULTS:+$RESULTS/r$ratio} \
      bash benchmarks/experiments/table1.sh vitcae/celeba32 "$OUT/r$ratio" data.path="$DATA" model.patch_size=2 \
      data.limit_train=3200 trainer.max_epochs=12 optim.schedule=cosine optim.warmup_epochs=1 dynamics.burn_in=2 \
      dynamics.decay_ratio="$ratio" trainer.precision=32-true trainer.attention_path=sdpa run.generate=false \
      run.report=false || true  # table1.sh's closing comparison needs an uncontrolled arm; the runs are what counts
  done
done
