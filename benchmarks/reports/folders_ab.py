"""Two folders of per-run results files (``benchmarks/experiments/run_result.py``) made by one driver under two
settings that no config records (an environment switch such as ``VITLAB_DROPOUT=mask``, or two revisions): per arm,
the test accuracies of each folder, the difference of means (A minus B) with its 95% Welch interval and Welch's p.

    python -m benchmarks.reports.folders_ab FOLDER_A FOLDER_B [--out SUMMARY.json]
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
from vitlab.environment import environment
from vitlab.evaluation.stats import welch_interval, welch_ttest


def accuracies(folder: Path) -> dict[str, list[float]]:
    """arm -> test top-1 (points) per seed, in seed order."""
    arms: dict[str, list[tuple[int, float]]] = {}
    for path in sorted(folder.glob("*.json")):
        record = json.loads(path.read_text())
        arms.setdefault(record["arm"], []).append((record["seed"], 100 * record["test"]["test/acc"]))
    return {arm: [acc for _, acc in sorted(values)] for arm, values in arms.items()}


def compare(a: Path, b: Path) -> dict[str, Any]:
    first, second = accuracies(a), accuracies(b)
    rows = []
    for arm in sorted(set(first) & set(second)):
        row: dict[str, Any] = {"arm": arm, "a": first[arm], "b": second[arm]}
        if len(first[arm]) >= 2 and len(second[arm]) >= 2:
            diff, low, high = welch_interval(first[arm], second[arm])
            row |= {"a_minus_b": diff, "ci95": [low, high], "p": welch_ttest(first[arm], second[arm])[1]}
        rows.append(row)
    return {"a": str(a), "b": str(b), "rows": rows, "environment": environment()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("a", type=Path)
    parser.add_argument("b", type=Path)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    summary = compare(args.a, args.b)
    for row in summary["rows"]:
        test = (
            f"{row['a_minus_b']:+.2f} [{row['ci95'][0]:+.2f}, {row['ci95'][1]:+.2f}], p = {row['p']:.2g}"
            if "ci95" in row
            else "fewer than two seeds: no test"
        )
        a, b = ", ".join(f"{v:.2f}" for v in row["a"]), ", ".join(f"{v:.2f}" for v in row["b"])
        print(f"| {row['arm']} | {a} | {b} | {test} |")
    if args.out is not None:
        atomic_write_json(args.out, summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
