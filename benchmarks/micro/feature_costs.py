"""What vitlab's optional features cost when switched on, as throughput ratios ON / OFF with their spread.

Each feature is a pair of networks measured alternately in one process (``vitlab.bench.timing.measure_networks``: the
training step and inference, round after round, next to a matmul peak, on the wall clock and on the process's CPU
time):

- ``temperature``: a ViT with the per-head temperature of ViTCAE eq. 19 (``temperature=True``: q scaled by tau per
  head before SDPA) against the same ViT without it.
- ``capture``: attention capture on (every shared ``Attention`` runs its eager path and keeps ``[B, H, N, N]``)
  against off (SDPA). The controller of ``benchmarks/micro/controller_cost.py`` turns capture on for its probe only.
- ``dynamic_k``: CET-ViT with the Dynamic-K estimator (``dynamic_k="gumbel"``: straight-through Gumbel over slot
  budgets ahead of V-CEO) against V-CEO with a fixed top-k (``dynamic_k="none"``).
- ``identical``: the ViT against an exact copy of itself. Its ratio is 1 but for measurement noise, so its spread
  is the noise floor the other ratios (and ``vitlab bench --vs timm``) are read against.

What the features cost when they are off is the ratio of our plain ViT to timm's (``vitlab bench vit_tiny --vs
timm``): the plain path then runs the same kernels as timm. Frozen heads have their own benchmark
(``benchmarks/micro/freezing.py``).

Run (single-threaded, about 10 minutes on one core)::

    python -m benchmarks.micro.feature_costs --threads 1
    python -m benchmarks.micro.feature_costs --features temperature --repeats 3   # a quicker look

Writes ``benchmarks/results/micro/feature_costs_<device>_<date>.json`` (:mod:`benchmarks.naming`).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys
from pathlib import Path

import torch
from torch import nn

from vitlab.bench.specs import PHASES
from vitlab.bench.timing import measure_networks, round_ratio, torch_threads
from vitlab.layers import attention_modules
from vitlab.models import create_model
from vitlab.rundir import environment as run_environment

if __package__ in (None, ""):  # run as a file: the suite is imported from the repository root
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.naming import results_path

FEATURES = ("identical", "temperature", "capture", "dynamic_k")
CIFAR = dict(img_size=32, in_chans=3, num_classes=10)


def feature_pair(feature: str, args: argparse.Namespace) -> tuple[str, dict[str, nn.Module]]:
    """``(model description, {"off": network, "on": network})`` for ``feature``, built from the same seed."""
    if feature == "temperature":
        torch.manual_seed(0)
        off = create_model(args.model, patch_size=4, temperature=False, **CIFAR)
        torch.manual_seed(0)
        on = create_model(args.model, patch_size=4, temperature=True, **CIFAR)
        return f"{args.model}, 32x32, patch 4", {"off": off, "on": on}
    if feature == "identical":
        torch.manual_seed(0)
        off = create_model(args.model, patch_size=4, **CIFAR)
        return f"{args.model}, 32x32, patch 4", {"off": off, "on": copy.deepcopy(off)}
    if feature == "capture":
        torch.manual_seed(0)
        off = create_model(args.model, patch_size=4, **CIFAR)
        on = copy.deepcopy(off)
        for _, attention in attention_modules(on):
            attention.capture = True
        return f"{args.model}, 32x32, patch 4", {"off": off, "on": on}
    if feature == "dynamic_k":
        torch.manual_seed(0)
        off = create_model(args.cet_model, dynamic_k="none", **CIFAR)
        torch.manual_seed(0)
        on = create_model(args.cet_model, dynamic_k="gumbel", **CIFAR)
        return f"{args.cet_model}, 32x32, patch 2", {"off": off, "on": on}
    raise ValueError(f"unknown feature {feature!r}; choose from {', '.join(FEATURES)}")


def measure_feature(feature: str, args: argparse.Namespace) -> dict:
    description, networks = feature_pair(feature, args)
    load_before = os.getloadavg()
    result = measure_networks(
        networks,
        batch_size=args.batch_size,
        precision=args.precision,
        repeats=args.repeats,
        warmup=args.warmup,
        sample_seconds=args.sample_seconds,
        matmul_size=args.matmul_size,
    )
    result["on_over_off"] = {
        clock: {phase: round_ratio(result, "on", "off", phase, clock) for phase in PHASES} for clock in result["clocks"]
    }
    return {
        "feature": feature,
        "model": description,
        "load_average": {"before": load_before, "after": os.getloadavg()},
        **result,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--features", nargs="+", default=list(FEATURES), choices=FEATURES)
    parser.add_argument("--model", default="vit_tiny", help="ViT preset for temperature and capture")
    parser.add_argument("--cet-model", default="cet_vit_nano", help="CET-ViT preset for Dynamic-K")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--precision", default="32-true", choices=["32-true", "bf16-mixed"])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--sample-seconds", type=float, default=0.5)
    parser.add_argument("--matmul-size", type=int, default=1024)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", default=str(results_path("micro", "feature_costs")))
    args = parser.parse_args()
    with torch_threads(args.threads):
        cases = [measure_feature(feature, args) for feature in args.features]
        environment = run_environment()
    results = {"benchmark": "feature_costs", "settings": vars(args), "environment": environment, "cases": cases}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2))
    print(f"batch {args.batch_size}, {args.precision}, threads {args.threads}, {args.repeats} rounds")
    print(f"{'feature':<12} {'model':<26} {'clock':<5} {'train ON/OFF':>28} {'inference ON/OFF':>28} {'load':>5}")
    for case in cases:
        for clock, ratios in case["on_over_off"].items():
            cells = [
                f"{r['median']:.3f} (IQR {r['q1']:.3f}-{r['q3']:.3f})" for r in (ratios["train"], ratios["inference"])
            ]
            print(
                f"{case['feature']:<12} {case['model']:<26} {clock:<5} {cells[0]:>28} {cells[1]:>28} "
                f"{case['load_average']['before'][0]:>5.2f}"
            )
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
