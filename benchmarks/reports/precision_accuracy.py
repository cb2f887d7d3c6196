"""Accuracy under two training precisions (docs/benchmarks.md, "Precision auto"): the per-run files that
``benchmarks/experiments/auto_vs_fp32.sh`` writes, summarised per model with Welch's t-test and the 95% interval of
the difference, so the page quotes nothing by hand.

    python -m benchmarks.reports.precision_accuracy benchmarks/results/experiments/precision_accuracy_<device>_<date>
        [--out SUMMARY.json]

Each file is a ``benchmarks/experiments/run_result.py`` record whose ``arm`` is ``<config>:<requested precision>``;
the table gives, per config and precision, the precision the run resolved to (``env.json``), the per-seed test
accuracies, their mean, and the difference of the first precision named against ``32-true`` with its Welch interval
and p. With fewer than two seeds in an arm the test is left out and the table says so.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a file: the suite is imported from the repository root
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from vitlab.atomic import atomic_write_json
from vitlab.evaluation.stats import welch_interval, welch_ttest
from vitlab.rundir import environment

REFERENCE = "32-true"


def _epoch_seconds(timing: dict[str, Any]) -> float | None:
    total, epochs = timing.get("time/epoch_total_s"), timing.get("epochs")
    return total / epochs if total and epochs else None


def load(folder: Path) -> list[dict[str, Any]]:
    files = sorted(folder.glob("*.json"))
    if not files:
        raise SystemExit(f"error: {folder} holds no per-run JSON; run benchmarks/experiments/auto_vs_fp32.sh first")
    runs = []
    for file in files:
        record = json.loads(file.read_text())
        if record.get("experiment") != "precision_accuracy":
            continue
        config, _, requested = record["arm"].partition(":")
        runs.append(
            {
                "file": file.name,
                "config": config,
                "requested": requested,
                "resolved": (record.get("precision") or {}).get("precision", requested),
                "seed": record["seed"],
                "test_acc": 100 * record["test"]["test/acc"],
                "cpu": record.get("cpu"),
                "git": (record.get("git") or {}).get("revision"),
                "epoch_s": _epoch_seconds(record.get("timing") or {}),
            }
        )
    return runs


def summarise(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per config: per requested precision the resolved precision and seeds; the comparison against 32-true."""
    out: dict[str, Any] = {}
    for config in sorted({r["config"] for r in runs}):
        arms: dict[str, dict[str, Any]] = {}
        for r in sorted((r for r in runs if r["config"] == config), key=lambda r: (r["requested"], r["seed"])):
            arm = arms.setdefault(r["requested"], {"resolved": set(), "seeds": [], "test_acc": [], "epoch_s": []})
            arm["resolved"].add(r["resolved"])
            arm["seeds"].append(r["seed"])
            arm["test_acc"].append(r["test_acc"])
            arm["epoch_s"].append(r["epoch_s"])
        for arm in arms.values():
            arm["resolved"] = sorted(arm["resolved"])
            arm["mean"] = sum(arm["test_acc"]) / len(arm["test_acc"])
        entry: dict[str, Any] = {"arms": arms, "comparisons": {}}
        reference = arms.get(REFERENCE)
        for name, arm in arms.items():
            if name == REFERENCE or reference is None:
                continue
            if len(arm["test_acc"]) < 2 or len(reference["test_acc"]) < 2:
                entry["comparisons"][name] = {"note": "fewer than two seeds in an arm: no test"}
                continue
            difference, low, high = welch_interval(arm["test_acc"], reference["test_acc"])
            t, p = welch_ttest(arm["test_acc"], reference["test_acc"])
            entry["comparisons"][name] = {"difference": difference, "ci95": [low, high], "t": t, "p": p}
        out[config] = entry
    return out


def table(summary: dict[str, Any], runs: list[dict[str, Any]]) -> str:
    cpus = sorted({r["cpu"] for r in runs if r["cpu"]})
    gits = sorted({(r["git"] or "")[:7] for r in runs})
    lines = [
        f"CPU: {', '.join(cpus)}; git {', '.join(gits)}; test accuracy in %, per seed.",
        "",
        "| config | precision (resolved) | seeds | test acc per seed | mean | epoch s (mean) "
        "| minus 32-true [95% Welch] | p |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for config, entry in summary.items():
        for name, arm in entry["arms"].items():
            per_seed = ", ".join(f"{a:.2f}" for a in arm["test_acc"])
            seconds = [s for s in arm["epoch_s"] if s]
            epoch_s = f"{sum(seconds) / len(seconds):.0f}" if seconds else "-"
            comparison = entry["comparisons"].get(name)
            if comparison and "difference" in comparison:
                low, high = comparison["ci95"]
                diff = f"{comparison['difference']:+.2f} [{low:+.2f}, {high:+.2f}]"
                p = f"{comparison['p']:.2f}"
            else:
                diff, p = (comparison or {}).get("note", "-"), "-"
            seeds = ",".join(str(s) for s in arm["seeds"])
            lines.append(
                f"| `{config}` | {name} ({', '.join(arm['resolved'])}) | {seeds} | {per_seed} | "
                f"{arm['mean']:.2f} | {epoch_s} | {diff} | {p} |"
            )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument("--out", type=Path, help="write the summary (per-seed values included) as JSON")
    args = parser.parse_args()
    runs = load(args.folder)
    summary = summarise(runs)
    print(table(summary, runs))
    if args.out:
        atomic_write_json(args.out, {"environment": environment(), "runs": runs, "summary": summary})


if __name__ == "__main__":
    main()
