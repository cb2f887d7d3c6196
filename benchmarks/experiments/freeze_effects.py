"""When freezing costs ViTCAE's accuracy, and whether a frozen head's pattern goes stale (docs/dynamics.md, "Freezing
only the pattern"). Reads finished runs only (``metrics.jsonl``, ``dynamics.jsonl``); trains nothing.

Each ``NAME=PATTERN`` names one arm; ``{seed}`` in the pattern is replaced by each seed:

    python -m benchmarks.experiments.freeze_effects --seeds 0 1 2 \\
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
import sys
from pathlib import Path

import numpy as np

from vitlab.rundir import RunDir


def train_accuracy(run: RunDir) -> dict[int, float]:
    """``{training epoch t (from 1): train/acc}``; ``metrics.jsonl`` counts epochs from 0."""
    return {r["epoch"] + 1: r["train/acc"] for r in run.metrics() if "train/acc" in r}


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


def measure(arms: dict[str, str], seeds: list[int], epochs: list[int], rho: float | None, run_length: int) -> dict:
    """The per-seed values behind both tables, with each run's command, git revision and CPU (its ``env.json``).
    ``rho=None`` takes each run's own threshold from its ``dynamics.jsonl`` (``rho: auto`` calibrates it per run)."""
    result: dict = {"epochs": epochs, "run_length": run_length, "rho": rho, "arms": {}}
    for name, pattern in arms.items():
        per_seed = []
        for seed in seeds:
            run = RunDir(pattern.format(seed=seed))
            records = run.dynamics()  # one record per epoch (a resumed run may write one twice; the later wins)
            if not records:
                raise SystemExit(f"error: {run.path} has no dynamics.jsonl; pass finished ViTCAE run folders")
            run_rho = rho if rho is not None else next((r["rho"] for r in records if r.get("rho") is not None), 0.75)
            accuracy = train_accuracy(run)
            fixed = fixed_heads(records).sum(axis=(1, 2))
            env, test = run.env() or {}, run.test_metrics() or {}
            per_seed.append(
                {
                    "seed": seed,
                    "run": str(run.path),
                    "command": env.get("command"),
                    "git": env.get("git"),
                    "cpu": env.get("hardware", {}).get("cpu_model"),
                    "rho": run_rho,
                    "test_acc": test.get("test/acc"),
                    "train_acc": [accuracy.get(e) for e in epochs],
                    "fixed_heads": [int(fixed[e]) if e < len(fixed) else None for e in epochs],
                    "after_freezing": after_freezing(records, run_rho, run_length),
                }
            )
        result["arms"][name] = per_seed
    return result


def render(result: dict) -> str:
    """Both Markdown tables from :func:`measure`'s values."""
    epochs, k = result["epochs"], result["run_length"]
    lines = [
        f"| arm | train accuracy after epochs {', '.join(map(str, epochs))} (%, mean of seeds) | "
        "frozen (or converged) heads, per seed |",
        "|---|---|---|",
    ]
    for name, seeds in result["arms"].items():
        means = [
            np.mean([math.nan if s["train_acc"][i] is None else s["train_acc"][i] for s in seeds]) * 100
            for i in range(len(epochs))
        ]
        counts = " ; ".join(", ".join("-" if c is None else str(c) for c in s["fixed_heads"]) for s in seeds)
        lines.append(f"| {name} | {' / '.join(f'{m:.1f}' for m in means)} | {counts} |")
    lines += [
        "",
        "| arm | seed | rho | heads frozen (or converged) | drift, 3 epochs up to it | drift after it | "
        f"post-freeze epochs with directedness >= rho | heads with {k} such epochs in a row |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, seeds in result["arms"].items():
        for s in seeds:
            row = s["after_freezing"]
            lines.append(
                f"| {name} | {s['seed']} | {s['rho']:.3f} | {row['heads']} | {row['drift_before']:.4f} | "
                f"{row['drift_after']:.4f} | {100 * row['directed_share']:.0f}% | {row['directed_runs']} |"
            )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("arms", nargs="*", help="NAME=PATTERN, {seed} in PATTERN replaced by each seed")
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--epochs", nargs="+", type=int, default=[10, 20, 30, 40, 50])
    parser.add_argument(
        "--rho", type=float, default=None, help="directedness threshold (default: each run's own, from its records)"
    )
    parser.add_argument("--run-length", type=int, default=3, help="k directed post-freeze epochs in a row")
    parser.add_argument("--out", type=Path, help="write the per-seed values (JSON) here, then print the tables")
    parser.add_argument("--from", dest="source", type=Path, help="print the tables of a JSON written by --out")
    args = parser.parse_args()
    if args.source is not None:
        print(render(json.loads(args.source.read_text())))
        return
    if not args.arms:
        parser.error("give NAME=PATTERN arms, or --from FILE.json")
    result = measure(dict(arm.split("=", 1) for arm in args.arms), args.seeds, args.epochs, args.rho, args.run_length)
    result["command"] = ["python", "benchmarks/experiments/freeze_effects.py", *sys.argv[1:]]
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(render(result))


if __name__ == "__main__":
    main()
