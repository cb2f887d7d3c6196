"""Which part of ViTCAE's control costs accuracy on digits, from the per-seed results files of
``benchmarks/experiments/control_parts.sh`` and ``benchmarks/experiments/table1.sh``
(``benchmarks/experiments/run_result.py``): per arm the test accuracy per seed, mean ± std, the difference to the
uncontrolled arm with its 95% Welch interval and p, and the epochs at which heads first converged (seed 0). Writes
nothing; prints a Markdown table.

    python -m benchmarks.reports.control_parts_summary benchmarks/results/experiments/table1_digits_epyc_2026-12-02 \
        benchmarks/results/experiments/control_parts_digits_epyc_2026-12-02
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from vitlab.evaluation.stats import summarize, welch_interval, welch_ttest

ARMS = {
    "uncontrolled": "uncontrolled (tau = 1, no freezing)",
    "schednofreeze": "eq. 20 schedule, no freezing",
    "fixedfreeze": "freezing at tau = 1, no schedule",
    "controlled": "both (the default controlled arm)",
    "pattern": "both, freezing only the pattern (`freeze_scope: pattern`)",
}


def load(folders: list[Path]) -> dict[str, dict[int, dict]]:
    results: dict[str, dict[int, dict]] = {}
    for folder in folders:
        for path in sorted(folder.glob("*-seed*.json")):
            result = json.loads(path.read_text())
            results.setdefault(result["arm"], {})[result["seed"]] = result
    return results


def table(results: dict[str, dict[int, dict]]) -> str:
    accuracy = {arm: [100 * r["test"]["test/acc"] for _, r in sorted(runs.items())] for arm, runs in results.items()}
    reference = accuracy.get("uncontrolled", [])
    lines = [
        "| arm (digits, 50 epochs) | test accuracy per seed, % | mean ± std | against uncontrolled [95% CI], p | "
        "first-converged epochs of the heads (seed 0) |",
        "|---|---|---|---|---|",
    ]
    for arm, label in ARMS.items():
        if arm not in accuracy:
            continue
        values = accuracy[arm]
        seeds = ", ".join(f"{v:.2f}" for v in values) + f" (seeds {', '.join(map(str, sorted(results[arm])))})"
        s = summarize(values)
        mean = f"{s['mean']:.2f} ± {s['std']:.2f}" if s["n"] > 1 else f"{s['mean']:.2f}"
        versus = ""
        if arm != "uncontrolled" and len(values) > 1 and len(reference) > 1:
            difference, low, high = welch_interval(values, reference)
            versus = f"{difference:+.2f} [{low:+.2f}, {high:+.2f}], p = {welch_ttest(values, reference)[1]:.2g}"
        first = results[arm].get(0, {}).get("dynamics", {}).get("first_converged_epochs", [])
        lines.append(f"| {label} | {seeds} | {mean} | {versus} | {', '.join(map(str, first)) or '-'} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folders", nargs="+", type=Path)
    print(table(load(parser.parse_args().folders)))


if __name__ == "__main__":
    main()
