#!/usr/bin/env bash
# The pre-registered budget curve of docs/card_claim.md (benchmarks/experiments/card_claim.sh) on one CUDA GPU, many
# runs at once: the same configs, fp32 (torch's default "highest" float32 matmul precision, so no TF32), one process
# per run with one CPU thread each (the protocol's CPU data path: AutoAugment, RandomErasing, Mixup). Made for a lent
# machine that holds no data and no POT: DATA is a folder of benchmarks/experiments/npz_transport.py (unpacked and
# verified by SHA-256 first) or an npz; POT, if missing, is stood in for by a module that raises when called (the
# card-claim models never call the Wasserstein solver of ViTCAE's diagnostics). Interrupted runs resume when the
# script is started again on the same machine (runs under RUNS). Results: RESULTS (one JSON per finished run).
#
#   JOBS=14 GIT_REVISION=$(git rev-parse HEAD) bash benchmarks/experiments/card_claim_cuda.sh DATA RUNS RESULTS [TIMEOUT_S]
set -euo pipefail
cd "$(dirname "$0")/../.."
if [[ $# -lt 3 ]]; then
    echo "usage: $0 DATA(npz or npz_transport folder) RUNS_DIR RESULTS_DIR [TIMEOUT_S]" >&2
    exit 2
fi
data=$1 runs=$2 results=$3 limit=${4:-0}
PYTHON=${PYTHON:-python3}
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=1
export PYTHONPATH="$PWD/src:$PWD${PYTHONPATH:+:$PYTHONPATH}"
if ! "$PYTHON" -c "import ot" 2>/dev/null; then
    stub=$(mktemp -d)
    mkdir -p "$stub/ot/lp"
    : > "$stub/ot/__init__.py"
    : > "$stub/ot/lp/__init__.py"
    printf 'def emd_c(*args, **kwargs):\n    raise RuntimeError("POT is not installed here; install POT")\n' > "$stub/ot/lp/emd_wrap.py"
    export PYTHONPATH="$PYTHONPATH:$stub"
    echo "POT missing: a stand-in module that raises when called"
fi
if [[ -d $data ]]; then
    npz=$(mktemp -d)/data.npz
    "$PYTHON" -m benchmarks.experiments.npz_transport unpack "$data" "$npz"
    data=$npz
fi
wrapper=$(mktemp -d)/vitlab
printf '#!/bin/sh\nexec "%s" -c "import sys; from vitlab.cli.main import main; sys.exit(main())" "$@"\n' "$(command -v "$PYTHON")" > "$wrapper"
chmod +x "$wrapper"
"$PYTHON" -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else '', 'fp32 matmul', torch.get_float32_matmul_precision())"
accelerator=gpu
"$PYTHON" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" || accelerator=cpu
run=(env VITLAB="$wrapper" PYTHON="$PYTHON" RESULTS="$results" RECORDED="$results" JOBS="${JOBS:-14}"
    bash benchmarks/experiments/card_claim.sh "$data" "$runs" trainer.accelerator="$accelerator" "${@:5}")
if (( limit > 0 )); then
    timeout --signal=TERM "$limit" "${run[@]}" || echo "stopped at the ${limit} s limit; start again to resume"
else
    "${run[@]}"
fi
