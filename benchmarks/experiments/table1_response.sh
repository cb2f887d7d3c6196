#!/usr/bin/env bash
# Table I and the freezing forks under the response rule (the default since 2026-12-07; docs/experiments/
# dynamics_response_rule.md), resumable: pass 1 trains the controlled and uncontrolled arms of every seed; pass 2 the
# fork without freezing (nofreeze) only for the seeds whose controlled run froze a head, since a run that froze none
# is the same run as its fork (same seed, machine and threads). Each finished run's per-seed file (best checkpoint and
# last epoch) goes to RESULTS at once, to commit.
#   bash benchmarks/experiments/table1_response.sh digits|mnist|celeba32 [OUT]
# DATA=folder of the npz files (default ../shared/datasets); VITLAB/PYTHON as table1.sh.
set -euo pipefail
DATASET=${1:?usage: table1_response.sh digits|mnist|celeba32 [OUT]}
OUT=${2:-runs/table1-$DATASET-response}
DATA=${DATA:-../shared/datasets}
RESULTS=${RESULTS:-benchmarks/results/experiments/table1_${DATASET}_response_${CPU_TAG:-xeon}_${DATE_TAG:-2026-12-07}}
COMMON=(trainer.precision=32-true trainer.attention_path=sdpa)
case "$DATASET" in
  digits) CONFIG=vitcae/digits SEEDS=${SEEDS:-0 1 2 3 4} EXTRA=() ;;
  mnist) CONFIG=vitcae/mnist SEEDS=${SEEDS:-0 1 2} EXTRA=(data.name=npz data.path="$DATA/mnist.npz"
    data.limit_train=30000 trainer.max_epochs=15 dynamics.burn_in=2) ;;
  celeba32) CONFIG=vitcae/celeba32 SEEDS=${SEEDS:-0 1 2} EXTRA=(data.path="$DATA/celeba32_subset.npz"
    dynamics.burn_in=2) ;;
  *) echo "unknown dataset $DATASET (digits, mnist or celeba32)" >&2; exit 2 ;;
esac
RESULTS=$RESULTS SEEDS="$SEEDS" ARMS="controlled uncontrolled" \
  bash benchmarks/experiments/table1.sh "$CONFIG" "$OUT" "${EXTRA[@]}" "${COMMON[@]}"
FORKS=""
for seed in $SEEDS; do
  file=$RESULTS/controlled-seed$seed.json
  if [ -f "$file" ] && python3 -c "import json,sys; sys.exit(0 if json.load(open('$file'))['dynamics']['frozen'] else 1)"; then
    FORKS="$FORKS $seed"
  fi
done
echo "seeds whose controlled run froze a head (their forks run now):${FORKS:- none}"
if [ -n "$FORKS" ]; then
  RESULTS=$RESULTS SEEDS="$FORKS" ARMS=nofreeze bash benchmarks/experiments/table1.sh "$CONFIG" "$OUT" "${EXTRA[@]}" "${COMMON[@]}"
fi
