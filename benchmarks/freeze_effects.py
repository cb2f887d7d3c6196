"""When freezing costs ViTCAE's accuracy, and whether a frozen head's pattern goes stale (docs/dynamics.md, "Freezing
only the pattern"). Reads finished runs only (``metrics.jsonl``, ``dynamics.jsonl``); trains nothing.

Each ``NAME=PATTERN`` names one arm; ``{seed}`` in the pattern is replaced by each seed:

    python benchmarks/freeze_effects.py --seeds 0 1 2 \\
        uncontrolled=runs/table1-digits-v2/uncontrolled-seed{seed} \\
        controlled=runs/table1-digits-v2/controlled-seed{seed} \\
        schednofreeze=runs/parts/schednofreeze-seed{seed} fixedfreeze=runs/parts/fixedfreeze-seed{seed}

Prints two Markdown tables:

1. per arm, the training accuracy (the epoch's mean over the training set; the validation set of the digits recipe
   has 144 images, too few to follow) after epochs 10, 20, ..., mean over seeds, and the frozen heads (converged heads
   in an arm without freezing) after the same epochs, per seed;
2. per arm, the heads that froze (or converged): their mean drift over the 3 epochs up to freezing and over the
   epochs after it, and the directedness after it (the quantity the default ``noise`` rule tests, ``< rho``): the
   share of post-freeze epochs at or above ``rho`` (moving one way again) and the heads with ``k`` such epochs in a
   row. A directedness computed from epochs ``t-2, t-1, t`` counts as post-freeze when ``t-2`` is the freezing
   epoch or later.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import numpy as np


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.is_file() else []


def train_accuracy(run: Path) -> dict[int, float]:
    """``{training epoch t (from 1): train/acc}``; ``metrics.jsonl`` counts epochs from 0."""
    return {r["epoch"] + 1: r["train/acc"] for r in _lines(run / "metrics.jsonl") if "train/acc" in r}


def dynamics(run: Path) -> list[dict]:
    """The controller's records, the last line of each epoch (a resumed run may write one twice)."""
    by_epoch = {r["epoch"]: r for r in _lines(run / "dynamics.jsonl")}
    return [by_epoch[e] for e in sorted(by_epoch)]


def fixed_heads(records: list[dict]) -> np.ndarray:
    """``[E, L, H]`` bool: frozen heads, or converged heads where nothing froze (an arm without freezing)."""
    frozen = np.array([r["frozen"] for r in records], dtype=bool)
    return frozen if frozen.any() else np.array([r["converged"] for r in records], dtype=bool)


def after_freezing(records: list[dict], rho: float, run_length: int) -> dict[str, float]:
    """Drift and directedness of each head that froze (or converged), before and after."""
    fixed = fixed_heads(records)
    nan = np.full(fixed.shape[1:], np.nan)
    drift = np.array([nan if r["drift"] is None else np.array(r["drift"], dtype=float) for r in records])
    directed = np.array(
        [nan if r.get("directedness") is None else np.array(r["directedness"], dtype=float) for r in records]
    )
    before, after, shares, runs = [], [], [], 0
    for layer, head in zip(*np.nonzero(fixed.any(0)), strict=True):
        t = int(np.argmax(fixed[:, layer, head]))  # index = epoch: records start at epoch 0
        before.append(np.nanmean(drift[max(t - 2, 1) : t + 1, layer, head]))
        if t + 1 < len(records):
            after.append(np.nanmean(drift[t + 1 :, layer, head]))
        post = directed[t + 2 :, layer, head]
        post = post[~np.isnan(post)]
        if len(post):
            shares.append(float(np.mean(post >= rho)))
            streak = best = 0
            for value in post:
                streak = streak + 1 if value >= rho else 0
                best = max(best, streak)
            runs += best >= run_length
    return {
        "heads": len(before),
        "drift_before": float(np.mean(before)) if before else math.nan,
        "drift_after": float(np.mean(after)) if after else math.nan,
        "directed_share": float(np.mean(shares)) if shares else math.nan,
        "directed_runs": runs,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("arms", nargs="+", help="NAME=PATTERN, {seed} in PATTERN replaced by each seed")
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--epochs", nargs="+", type=int, default=[10, 20, 30, 40, 50])
    parser.add_argument("--rho", type=float, default=0.75, help="the noise rule's directedness threshold")
    parser.add_argument("--run-length", type=int, default=3, help="k directed post-freeze epochs in a row")
    args = parser.parse_args()
    arms = dict(arm.split("=", 1) for arm in args.arms)

    epochs = ", ".join(str(e) for e in args.epochs)
    print(f"| arm | train accuracy after epochs {epochs} (%, mean of seeds) | frozen (or converged) heads, per seed |")
    print("|---|---|---|")
    for name, pattern in arms.items():
        runs = [Path(pattern.format(seed=seed)) for seed in args.seeds]
        accuracy = [train_accuracy(run) for run in runs]
        means = [np.mean([a.get(e, math.nan) for a in accuracy]) * 100 for e in args.epochs]
        counts = []
        for run in runs:
            fixed = fixed_heads(dynamics(run)).sum(axis=(1, 2))
            counts.append(", ".join(str(int(fixed[e])) if e < len(fixed) else "-" for e in args.epochs))
        print(f"| {name} | {' / '.join(f'{m:.1f}' for m in means)} | {' ; '.join(counts)} |")

    print()
    print(
        f"| arm | seed | heads frozen (or converged) | drift, 3 epochs up to it | drift after it | "
        f"post-freeze epochs with directedness >= {args.rho} | heads with {args.run_length} such epochs in a row |"
    )
    print("|---|---|---|---|---|---|---|")
    for name, pattern in arms.items():
        for seed in args.seeds:
            row = after_freezing(dynamics(Path(pattern.format(seed=seed))), args.rho, args.run_length)
            print(
                f"| {name} | {seed} | {row['heads']} | {row['drift_before']:.4f} | {row['drift_after']:.4f} | "
                f"{100 * row['directed_share']:.0f}% | {row['directed_runs']} |"
            )


if __name__ == "__main__":
    main()
