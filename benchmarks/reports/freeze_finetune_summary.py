"""Summary of benchmarks/experiments/freeze_finetune.py: every freezing arm against no freezing, paired by seed.

    python -m benchmarks.reports.freeze_finetune_summary RESULTS [--json OUT]

Per arm, over the seeds that finished both it and ``none``: the final (last epoch) and best-checkpoint test accuracy
with the paired 95% t interval of the difference to ``none``; the fit's wall-clock seconds and their ratio to
``none``'s (the geometric mean over seeds, with the paired interval of the log ratio); seconds per step; the time
to reach ``none``'s final validation accuracy (the epochs' own seconds summed up to the first epoch whose validation
accuracy reaches it, or "never"); the fit's CPU seconds and their ratio, where the files hold them; the ratio of the
epochs' own seconds (training and validation, without the start, the test and the export); the epoch at which each
layer froze. The goal of issue 61: an arm inside [-1, +1]
points of ``none``'s final accuracy (the whole interval) in at most 0.75 of its wall-clock time.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.naming import repo_relative
from benchmarks.reports.claims import Difference
from vitlab.environment import environment

MARGIN = 1.0  # points: the registered equivalence margin of the goal
GOAL_RATIO = 0.75


def paired(a: list[float], b: list[float]) -> dict[str, Any]:
    """Mean of a - b and its 95% paired t interval (:class:`benchmarks.reports.claims.Difference`; none with fewer
    than 2 pairs)."""
    difference = Difference(list(a), list(b), paired=True)
    out: dict[str, Any] = {"diff": difference.diff, "n": len(a)}
    if difference.resolved:
        out["ci95"] = list(difference.interval())
    return out


def time_to_reach(record: dict[str, Any], target: float) -> float | None:
    """Seconds of training epochs until the validation accuracy first reaches ``target``, or None."""
    curve = record.get("val_curve", {})
    elapsed = 0.0
    for acc, seconds in zip(curve.get("val/acc", []), curve.get("time/epoch_s", []), strict=False):
        elapsed += seconds or 0.0
        if acc is not None and acc >= target:
            return elapsed
    return None


def seconds_per_step(record: dict[str, Any]) -> float:
    """The training steps' own seconds (``time/step_s`` is an epoch's sum) over the steps of the run."""
    curve = record["val_curve"]
    return float(sum(curve["time/step_s"]) / (curve["step"][-1] + 1))  # the logged step counts from 0


def ratio(by_seed: dict[int, dict], base: dict[int, dict], seeds: list[int], key: str) -> dict[str, Any]:
    """The arm's ``key`` seconds over ``none``'s, per seed that recorded both: the geometric mean and the paired 95%
    interval of the log ratio (``fit_cpu_s``: the fit's CPU seconds, one thread, recorded from 2026-12-07's seeds 3-4
    on; the quiet machine's time, where the wall clock of a shared machine is not)."""
    have = [s for s in seeds if by_seed[s].get(key) and base[s].get(key)]
    if not have:
        return {}
    logs = [math.log(by_seed[s][key] / base[s][key]) for s in have]
    mean = paired(logs, [0.0] * len(logs))
    out = {"seeds": have, "geomean": math.exp(mean["diff"]), "values": [math.exp(v) for v in logs]}
    return out | ({"ci95": [math.exp(v) for v in mean["ci95"]]} if "ci95" in mean else {})


def accuracy(record: dict[str, Any], which: str) -> float:
    return 100 * record["test_last" if which == "final" else "test"]["test/acc"]


def summarize(folder: Path) -> dict[str, Any]:
    records: dict[str, dict[int, dict[str, Any]]] = {}
    for path in sorted(folder.glob("*-seed*.json")):
        record = json.loads(path.read_text())
        record["loop_s"] = record.get("timing", {}).get("time/epoch_total_s")  # the epochs: training + validation
        records.setdefault(record["arm"], {})[record["seed"]] = record
    base = records.get("none", {})
    summary: dict[str, Any] = {"folder": str(folder), "arms": {}}
    for arm, by_seed in records.items():
        seeds = sorted(set(by_seed) & set(base)) if arm != "none" else sorted(by_seed)
        if not seeds:
            continue
        row: dict[str, Any] = {"seeds": seeds}
        for which in ("final", "best"):
            values = [accuracy(by_seed[s], which) for s in seeds]
            row[which] = {"mean": float(np.mean(values)), "values": values}
            if arm != "none":
                row[which] |= paired(values, [accuracy(base[s], which) for s in seeds])
        row["fit_wall_s"] = [by_seed[s]["fit_wall_s"] for s in seeds]
        row["fit_cpu_s"] = [by_seed[s].get("fit_cpu_s") for s in seeds]
        row["step_s"] = [seconds_per_step(by_seed[s]) for s in seeds]
        row["steps_total_s"] = [float(sum(by_seed[s]["val_curve"]["time/step_s"])) for s in seeds]
        if arm != "none":
            row["wall_ratio"] = ratio(by_seed, base, seeds, "fit_wall_s")
            row["cpu_ratio"] = ratio(by_seed, base, seeds, "fit_cpu_s")
            row["loop_ratio"] = ratio(by_seed, base, seeds, "loop_s")
            targets = [base[s]["val_curve"]["val/acc"][-1] for s in seeds]
            row["time_to_none_final_val_s"] = [
                time_to_reach(by_seed[s], t) for s, t in zip(seeds, targets, strict=True)
            ]
            interval = row["final"].get("ci95")
            level = bool(interval and interval[0] >= -MARGIN and interval[1] <= MARGIN)
            for clock in ("wall", "cpu"):
                fast = row[f"{clock}_ratio"].get("ci95")
                row[f"meets_goal_{clock}"] = bool(level and fast and fast[1] <= GOAL_RATIO)
        row["frozen_per_layer"] = [by_seed[s].get("layer_freezing") for s in seeds]
        summary["arms"][arm] = row
    return summary


def render(summary: dict[str, Any]) -> str:
    lines = [
        "| arm | seeds | final test acc | vs none (paired 95%) | best test acc | vs none | fit wall s | ratio to none "
        "[95%] | fit CPU s | CPU ratio to none [95%] (seeds) | s/step | steps' share of fit "
        "| epochs' ratio to none [95%] | meets goal (wall / CPU) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]

    def interval(row: dict[str, Any]) -> str:
        if "diff" not in row:
            return ""
        ci = row.get("ci95")
        return f"{row['diff']:+.2f}" + (f" [{ci[0]:+.2f}, {ci[1]:+.2f}]" if ci else " (1 seed: not tested)")

    def ratio_text(ratio: dict[str, Any], seeds: bool = False) -> str:
        if not ratio:
            return ""
        ci = ratio.get("ci95")
        return (
            f"{ratio['geomean']:.3f}"
            + (f" [{ci[0]:.3f}, {ci[1]:.3f}]" if ci else "")
            + (f" ({','.join(map(str, ratio['seeds']))})" if seeds else "")
        )

    for arm, row in summary["arms"].items():
        cpu = [c for c in row["fit_cpu_s"] if c]
        goal = "" if arm == "none" else " / ".join("yes" if row[f"meets_goal_{c}"] else "no" for c in ("wall", "cpu"))
        lines.append(
            f"| {arm} | {len(row['seeds'])} | {row['final']['mean']:.2f} | {interval(row['final'])} | "
            f"{row['best']['mean']:.2f} | {interval(row['best'])} | {np.mean(row['fit_wall_s']):.0f} | "
            f"{ratio_text(row.get('wall_ratio', {}))} | {f'{np.mean(cpu):.0f}' if cpu else ''} | "
            f"{ratio_text(row.get('cpu_ratio', {}), seeds=True)} | {np.mean(row['step_s']):.3f} | "
            f"{np.mean(row['steps_total_s']) / np.mean(row['fit_wall_s']):.2f} | "
            f"{ratio_text(row.get('loop_ratio', {}))} | {goal} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", type=Path)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    summary = summarize(args.results)
    print(render(summary))
    if args.json:  # the summary's own command and revision (each per-seed file has its run's)
        record = environment()
        record["command"] = repo_relative(record["command"])
        args.json.write_text(json.dumps(summary | {"environment": record}, indent=1) + "\n")


if __name__ == "__main__":
    main()
