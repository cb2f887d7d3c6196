#!/usr/bin/env bash
# The GPU check (benchmarks/experiments/gpu_check.py; docs/benchmarks.md): CUDA tests, vitlab bench eager and compiled against
# timm, 200 steps of configs/cet_vit/cifar100.yaml on synthetic CIFAR-shaped data. Under 8 minutes on a GPU; writes
# OUT/gpu_check.json and OUT/gpu_check.md. Without CUDA it says so, runs a CPU dry run of the same code paths and
# exits 0.
#   bash benchmarks/experiments/gpu_check.sh [OUT] [--budget-s 420] [--dry-run]      OUT default: benchmarks/results/experiments/gpu_check
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${1:-benchmarks/results/experiments/gpu_check}
shift $(( $# > 0 ? 1 : 0 ))
PYTHON=${PYTHON:-python}
# the tree's own sources first, so the check measures this checkout even where another vitlab is installed
PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" exec "$PYTHON" benchmarks/experiments/gpu_check.py --out "$OUT" "$@"
