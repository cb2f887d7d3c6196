#!/usr/bin/env bash
# The ViTCAE paper's Table I at CPU scale: controlled (eq. 20 schedule + eq. 26 freezing) against uncontrolled
# (tau = 1, no freezing), same data, budget and seeds; then the comparison over seeds.
#   bash benchmarks/experiments/table1.sh [CONFIG] [OUT] [extra overrides...]     e.g. bash benchmarks/experiments/table1.sh vitcae/digits runs/table1-digits
# The two arms of a seed train at the same time; JOBS=1 trains one run at a time (for timing on a shared machine).
# ARMS="controlled nofreeze uncontrolled" adds the counterfactual arm of issue 44: the schedule and the same
# convergence decisions without freezing, identical to the controlled arm (same seed, machine and threads) until
# the first head freezes, so the pair is a fork at the rule's first firing.
# ARMS=thaw: the controlled arm with dynamics.thaw=true (a frozen head whose attention moves again is released),
# identical to the controlled arm until the first release.
set -euo pipefail
CONFIG=${1:-vitcae/digits}
OUT=${2:-runs/table1-$(basename "$CONFIG")}
shift $(( $# > 2 ? 2 : $# ))
EXTRA=("$@")
VITLAB=${VITLAB:-.venv/bin/vitlab}
PYTHON=${PYTHON:-.venv/bin/python}
# RESULTS (optional): a folder that gets one JSON per finished run (benchmarks/experiments/run_result.py), to commit at once
RESULTS=${RESULTS:-}
run() {  # mode seed
  local dir="$OUT/$1-seed$2"
  if [ ! -f "$dir/test_metrics.json" ]; then
    if [ -f "$dir/checkpoints/last.ckpt" ]; then  # interrupted (a session ended): continue it exactly
      OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} "$VITLAB" fit --resume "$dir" >> "$dir.log" 2>&1
    else
      # log_model_tau (off by default) also records the controlled arm's drift at its own tau, beside the decision's
      local args=(dynamics.mode=schedule dynamics.freeze=true dynamics.log_model_tau=true)
      [ "$1" = uncontrolled ] && args=(dynamics.mode=fixed dynamics.freeze=false)
      [ "$1" = nofreeze ] && args=(dynamics.mode=schedule dynamics.freeze=false dynamics.log_model_tau=true)
      [ "$1" = thaw ] && args=(dynamics.mode=schedule dynamics.freeze=true dynamics.thaw=true dynamics.log_model_tau=true)
      OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} "$VITLAB" fit --config "$CONFIG" "${args[@]}" run.seed="$2" \
        data.seed="$2" run.dir="$dir" run.name="table1-$1" run.overwrite=true trainer.enable_progress_bar=false \
        ${EXTRA[@]+"${EXTRA[@]}"} > "$dir.log" 2>&1
    fi
  fi
  if [ -n "$RESULTS" ] && [ ! -f "$RESULTS/$1-seed$2.json" ]; then
    "$PYTHON" benchmarks/experiments/run_result.py "$dir" --experiment "table1-$(basename "$CONFIG")" --arm "$1" --seed "$2" \
      --out "$RESULTS/$1-seed$2.json"
  fi
}
mkdir -p "$OUT"
SEEDS=${SEEDS:-0 1 2}
ARMS=${ARMS:-controlled uncontrolled}
for seed in $SEEDS; do
  for arm in $ARMS; do
    if [ "${JOBS:-2}" = 1 ]; then
      run "$arm" "$seed"
    else
      run "$arm" "$seed" &
      while [ "$(jobs -rp | wc -l)" -ge "${JOBS:-2}" ]; do wait -n || true; done
    fi
  done
done
wait
ls -d "$OUT"/controlled-seed*/ "$OUT"/uncontrolled-seed*/ > /dev/null 2>&1 || exit 0  # one arm alone: nothing to compare
"$VITLAB" compare "$OUT"/controlled-seed*/ "$OUT"/uncontrolled-seed*/ --group-by dynamics.mode --metric test/acc --out "$OUT/table1" --force
