#!/usr/bin/env bash
# Training at the GPU's speed (benchmarks/experiments/gpu_speed.py; docs/benchmarks.md): vitlab bench vit_small and
# vit_base compiled against timm compiled, vitlab fit from an npz and a JPEG folder. Under 8 minutes on a GPU; writes
# DIR/gpu_speed_<device>_<date>/. Without CUDA it says so, runs a CPU dry run of the same code paths and exits 0.
#   bash benchmarks/experiments/gpu_speed.sh [DIR] [--budget-s 420] [--dry-run]      DIR default: benchmarks/results/experiments
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${1:-benchmarks/results/experiments}
shift $(( $# > 0 ? 1 : 0 ))
PYTHON=${PYTHON:-python}
# the tree's own sources first, so the script measures this checkout even where another vitlab is installed
PYTHONPATH="$PWD/src:$PWD${PYTHONPATH:+:$PYTHONPATH}" exec "$PYTHON" benchmarks/experiments/gpu_speed.py --out "$OUT" "$@"
