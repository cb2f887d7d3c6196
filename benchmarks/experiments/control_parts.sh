#!/usr/bin/env bash
# Which part of ViTCAE's control costs accuracy on the digits Table I recipe (docs/dynamics.md, "Where the digits
# points go"): one arm, seeds 0, 1, 2, one run at a time, one thread each.
#   bash benchmarks/experiments/control_parts.sh OUT ARM [overrides...]
#   bash benchmarks/experiments/control_parts.sh runs/parts schednofreeze dynamics.mode=schedule dynamics.freeze=false
#   bash benchmarks/experiments/control_parts.sh runs/parts fixedfreeze dynamics.mode=fixed dynamics.freeze=true
#   bash benchmarks/experiments/control_parts.sh runs/parts pattern dynamics.mode=schedule dynamics.freeze=true dynamics.freeze_scope=pattern
# Finished runs (test_metrics.json present) are skipped. The controlled and uncontrolled arms are benchmarks/experiments/table1.sh.
set -euo pipefail
if [[ $# -lt 2 ]]; then
  echo "usage: $0 OUT ARM [config overrides...]" >&2
  exit 2
fi
OUT=$1 ARM=$2
shift 2
VITLAB=${VITLAB:-.venv/bin/vitlab}
PYTHON=${PYTHON:-.venv/bin/python}
# RESULTS (optional): a folder that gets one JSON per finished run (benchmarks/experiments/run_result.py), to commit at once
RESULTS=${RESULTS:-}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
mkdir -p "$OUT"
for seed in ${SEEDS:-0 1 2}; do
  dir=$OUT/$ARM-seed$seed
  if [[ ! -f $dir/test_metrics.json ]]; then
    if [[ -f $dir/checkpoints/last.ckpt ]]; then  # interrupted (a session ended): continue it exactly
      "$VITLAB" fit --resume "$dir" >> "$dir.log" 2>&1
    else
      "$VITLAB" fit --config vitcae/digits run.seed="$seed" data.seed="$seed" run.dir="$dir" run.name="table1-$ARM" \
        run.overwrite=true trainer.enable_progress_bar=false "$@" > "$dir.log" 2>&1
    fi
  fi
  if [[ -n $RESULTS && ! -f $RESULTS/$ARM-seed$seed.json ]]; then
    "$PYTHON" benchmarks/experiments/run_result.py "$dir" --experiment control-parts-digits --arm "$ARM" --seed "$seed" \
      --out "$RESULTS/$ARM-seed$seed.json"
  fi
done
