"""The noise rule's rho against simulated drifts (ViTCAE spec, "Convergence"): for each probe grid and image count,
the calibrated rho (:func:`vitlab.diagnostics.rho_calibration.calibrate_rho`) and, on fresh seeds and step sizes, the
share of epochs in which directed motion, a random walk and jitter around a settled pattern are judged stable, under the
calibrated rho and under the earlier default 0.75; with patience 3, the share of epochs at which a head would be
declared converged.

    python -m benchmarks.micro.rho_calibration --out benchmarks/results/micro/rho_calibration_epyc_2026-12-02.json
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import torch

from vitlab.diagnostics.dynamics import patch_grid_cost
from vitlab.diagnostics.rho_calibration import (
    DRIFT_KINDS,
    calibrate_rho,
    directedness_series,
    simulate_attention_paths,
)
from vitlab.rundir import environment

# (grid side, probe images): digits and MNIST (4x4 patches), CelebA-32 (8x8), and smaller probes
SETTINGS = ((4, 256), (8, 256), (4, 64), (8, 64), (4, 16))
STEPS = (0.02, 0.06, 0.15, 0.5)  # none of them a calibration step size
SEEDS = range(100, 106)


def converged_share(stable: torch.Tensor, patience: int) -> float:
    """Share of epochs that close a run of ``patience`` stable epochs (where the rule would declare convergence)."""
    streak, hits = 0, 0
    for value in stable.tolist():
        streak = streak + 1 if value else 0
        hits += streak >= patience
    return hits / len(stable)


def measure(side: int, images: int, epochs: int) -> dict:
    grid = (side, side)
    started = time.perf_counter()
    rho = calibrate_rho(grid, images)
    seconds = time.perf_counter() - started
    cost = patch_grid_cost(side, side, units="image")
    kinds = {}
    for kind in DRIFT_KINDS:
        ratios = []
        for seed in SEEDS:
            for step in STEPS:
                generator = torch.Generator().manual_seed(seed)
                ratios.append(
                    directedness_series(simulate_attention_paths(kind, grid, images, epochs, step, generator), cost)
                )
        pooled = torch.cat(ratios)
        kinds[kind] = {
            "directedness_median": pooled.median().item(),
            "directedness_5_95": [pooled.quantile(0.05).item(), pooled.quantile(0.95).item()],
            "stable_share": (pooled < rho).double().mean().item(),
            "stable_share_worst_walk": max((r < rho).double().mean().item() for r in ratios),
            "converged_share_patience3": sum(converged_share(r < rho, 3) for r in ratios) / len(ratios),
            "stable_share_rho_0.75": (pooled < 0.75).double().mean().item(),
            "converged_share_patience3_rho_0.75": sum(converged_share(r < 0.75, 3) for r in ratios) / len(ratios),
        }
    return {"grid": list(grid), "images": images, "rho": rho, "calibration_seconds": seconds, "kinds": kinds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=40)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    torch.set_num_threads(1)
    rows = [measure(side, images, args.epochs) for side, images in SETTINGS]
    for row in rows:
        walk, directed, jitter = (row["kinds"][k] for k in ("random_walk", "directed", "jitter"))
        print(
            f"grid {row['grid'][0]}x{row['grid'][1]} images {row['images']:4d}: rho {row['rho']:.3f} | stable share "
            f"directed {directed['stable_share']:.3f} random walk {walk['stable_share']:.3f} jitter "
            f"{jitter['stable_share']:.3f} | at rho 0.75: random walk {walk['stable_share_rho_0.75']:.3f}"
        )
    env = environment()
    result = {
        "what": "rho calibration of the noise convergence rule on simulated drifts",
        "command": "python -m benchmarks.micro.rho_calibration "
        + " ".join(f"--{k} {v}" for k, v in vars(args).items()),
        "git": env["git"],
        "cpu": env["hardware"]["cpu_model"],
        "torch": torch.__version__,
        "python": platform.python_version(),
        "steps": list(STEPS),
        "seeds": list(SEEDS),
        "epochs": args.epochs,
        "settings": rows,
    }
    args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
