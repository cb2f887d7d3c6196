"""Every explanation method on every architecture: the tiny models of ``vitlab.testing_models`` (vitlab's five
families, eleven of timm's, torchvision's ViT and Swin, seven of HF transformers'; the tests of ``tests/explain``
build the same), briefly trained, in float64. Per architecture and method: applied or refused (with the reason), the
conservation error of the LRP variants and the completeness error of integrated gradients, the input's own share of
the logit, seconds per image.

    python -m benchmarks.experiments.explain_architectures \
        --out benchmarks/results/experiments/explain_architectures_<cpu>_<date>.json
    python -m benchmarks.reports.explain_architectures_table benchmarks/results/experiments/explain_architectures_*.json
"""

from __future__ import annotations

import argparse
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import torch

from benchmarks.naming import repo_relative
from vitlab.atomic import atomic_write_text
from vitlab.explain import METHODS, MethodRefused, explain
from vitlab.jsonio import strict_dumps
from vitlab.rundir import environment
from vitlab.testing_models import ARCHITECTURES, tiny_model


def method_results(name: str) -> dict[str, Any]:
    """Each method on the trained tiny ``name``: ``{"refused": reason}`` or per-image values."""
    model, x = tiny_model(name, trained=True)
    out: dict[str, Any] = {}
    for method in METHODS:
        start = time.perf_counter()
        try:
            e = explain(model, x, method=method)
        except MethodRefused as err:
            out[method] = {"refused": str(err)}
            continue
        out[method] = {
            "seconds_per_image": (time.perf_counter() - start) / x.shape[0],
            "conservation": None if e.conservation is None else e.conservation.tolist(),
            "input_share": None if e.input_share is None else e.input_share.tolist(),
            "finite": bool(torch.isfinite(e.maps).all()),
        }
    return out


def write_record(path: Path, record: dict[str, Any], load_before: tuple[float, ...]) -> None:
    """``record`` with the environment (versions, git revision), lscpu and the load average, written as JSON: what
    every explanation benchmark's results file holds."""

    def relative(value: Any) -> Any:  # paths beside the checkout, written relative to it (benchmarks.naming)
        if isinstance(value, dict):
            return {k: relative(v) for k, v in value.items()}
        if isinstance(value, list):
            return [relative(v) for v in value]
        return repo_relative(value) if isinstance(value, str) and value.startswith("/") else value

    record = {
        **relative(record),
        "environment": relative(environment()),
        "lscpu": subprocess.run(["lscpu"], capture_output=True, text=True).stdout,
        "load_average": {"before": list(load_before), "after": list(os.getloadavg())},
    }
    atomic_write_text(path, strict_dumps(record, indent=1) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--architectures", nargs="+", default=list(ARCHITECTURES))
    args = parser.parse_args()
    load_before = os.getloadavg()
    results = {name: method_results(name) for name in args.architectures}
    trained = "three Adam steps (lr 1e-2) on random labels"
    record = {"architectures": results, "images": 3, "dtype": "float64", "trained": trained}
    write_record(args.out, record, load_before)


if __name__ == "__main__":
    main()
