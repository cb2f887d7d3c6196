"""The ViTCAE paper's Table I from the runs of ``benchmarks/experiments/table1.sh``: controlled against uncontrolled.

Reads ``<RUNS>/{controlled,uncontrolled}-seed*/``: ``test_metrics.json`` (accuracy), ``generate/metrics.json``
(linear probe, PSNR, class consistency), ``dynamics.jsonl`` (the controller's last record: non-converged and frozen
heads, mean drift) and ``timing.json`` (step, backward and epoch time; runs made before it existed show ``-``).
Prints a Markdown table of mean ± std over seeds, with the per-seed values of the head counts and Welch's t-test on
each metric, and writes it to ``<RUNS>/table1_summary.md``.

    python -m benchmarks.reports.table1_summary runs/table1-mnist-long
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import torch

from vitlab.config.dynamics import DynamicsConfig
from vitlab.diagnostics.convergence import ConvergenceTracker
from vitlab.evaluation.stats import summarize, welch_interval, welch_ttest
from vitlab.rundir import RunDir

ARMS = ("controlled", "uncontrolled")


def _freeze_epochs(records: list[dict]) -> list[int]:
    """The epoch each head first counted as converged (measured in both arms; frozen in the controlled one)."""
    first: dict[tuple[int, int], int] = {}
    for record in records:
        for layer, row in enumerate(record.get("converged", [])):
            for head, done in enumerate(row):
                if done:
                    first.setdefault((layer, head), record["epoch"])
    return sorted(first.values())


def paper_rule_replay(run: RunDir, records: list[dict], grid_side: int | None) -> float:
    """Non-converged heads at the end by the paper's absolute rule (``d < 0.05`` patch widths, ``|dtau| < 0.05``,
    patience 3, the run's burn-in), replayed on this run's logged drift: the old rule's verdict on the same curves.
    Exact for the uncontrolled arm; for the controlled arm a counterfactual (its heads froze by the new rule)."""
    if not records or records[-1].get("drift") is None:
        return math.nan
    units = records[-1].get("drift_units", "patch")
    grid = records[-1].get("grid") or ([grid_side, grid_side] if grid_side else None)
    if units == "image" and (grid is None or grid[0] != grid[1]):
        return math.nan  # patch widths from image sides need a square grid's side
    factor = grid[0] if units == "image" else 1
    config = run.config_dict() if run.config_file.is_file() else {}
    burn_in = (config.get("dynamics") or {}).get("burn_in", 5)
    shape = torch.tensor(records[-1]["tau"]).shape
    paper_rule = DynamicsConfig(eps_d=0.05, eps_tau=0.05, patience=3, convergence="absolute", tau_clause="own")
    tracker = ConvergenceTracker(*shape, paper_rule)
    for record in records:
        if record["epoch"] < burn_in:
            continue
        drift = torch.zeros(shape) if record["drift"] is None else factor * torch.tensor(record["drift"])
        tracker.update(drift, torch.tensor(record["tau"]))
    return float((~tracker.converged).sum())


def run_row(run: RunDir, grid_side: int | None = None) -> dict[str, float]:
    """The Table I numbers of one run (missing ones are NaN)."""
    test, gen, timing = run.test_metrics() or {}, run.generate_metrics() or {}, run.timing() or {}
    records = run.dynamics()
    dyn = records[-1] if records else {}
    frozen = sum(sum(layer) for layer in dyn.get("frozen", [])) if dyn else math.nan
    nan = math.nan
    last_epoch = dyn.get("epoch", 0)
    converged_at = _freeze_epochs(records)
    units = dyn.get("drift_units", "patch")
    return {
        "classification accuracy (test), %": 100 * test.get("test/acc", nan),
        "linear probe on mu_cls, %": 100 * gen.get("linear_probe/accuracy", nan),
        "reconstruction PSNR, dB": gen.get("reconstruction/psnr", nan),
        "class consistency of samples (CNN judge), %": 100 * gen.get("conditional/judge_accuracy", nan),
        "class consistency of the prior mean, %": 100 * gen.get("conditional/prior_mean_judge_accuracy", nan),
        "class consistency of g(z_cls), %": 100 * gen.get("conditional/estimator_judge_accuracy", nan),
        "judge on real test images (upper bound), %": 100 * gen.get("conditional/judge_test_accuracy", nan),
        "judge on reconstructions (upper bound), %": 100 * gen.get("reconstruction/judge_accuracy", nan),
        "non-converged heads at the end": dyn.get("non_converged", nan),
        "non-converged heads by the paper's rule, replayed on the same drift": paper_rule_replay(
            run, records, grid_side
        ),
        "frozen heads at the end": frozen,
        "heads converged before the last third of training": (
            sum(e <= 2 * last_epoch / 3 for e in converged_at) if records else nan
        ),
        "epoch of the first converged head": converged_at[0] if converged_at else nan,
        f"mean drift in the last epoch ({'image sides' if units == 'image' else 'patch widths'})": dyn.get(
            "mean_drift", nan
        ),
        "train time: optimisation steps, s": timing.get("time/step_total_s", nan),
        "train time: backward passes, s": timing.get("time/backward_total_s", nan),
        "train time: epochs (with validation and probe), s": timing.get("time/epoch_total_s", nan),
    }


def result_row(result: dict) -> dict[str, float]:
    """The Table I numbers of one run from its results file (``benchmarks/experiments/run_result.py``), as
    :func:`run_row`."""
    nan = math.nan
    test, gen, timing, dyn = (result.get(k) or {} for k in ("test", "generate", "timing", "dynamics"))
    converged_at = dyn.get("first_converged_epochs", [])
    last_epoch = dyn.get("epochs") or 0
    return {
        "classification accuracy (test), %": 100 * test.get("test/acc", nan),
        "linear probe on mu_cls, %": 100 * gen.get("linear_probe/accuracy", nan),
        "reconstruction PSNR, dB": gen.get("reconstruction/psnr", nan),
        "class consistency of samples (CNN judge), %": 100 * gen.get("conditional/judge_accuracy", nan),
        "non-converged heads at the end": dyn.get("non_converged", nan),
        "non-converged heads by the paper's rule, replayed on the same drift": dyn.get(
            "non_converged_paper_rule_replay", nan
        ),
        "frozen heads at the end": dyn.get("frozen", nan),
        "heads converged before the last third of training": sum(e <= 2 * last_epoch / 3 for e in converged_at),
        "epoch of the first converged head": converged_at[0] if converged_at else nan,
        "mean drift in the last epoch (image sides)": dyn.get("mean_drift_last_epoch", nan),
        "train time: optimisation steps, s": timing.get("time/step_total_s", nan),
        "train time: epochs (with validation and probe), s": timing.get("time/epoch_total_s", nan),
    }


def _cell(values: list[float], per_seed: bool) -> str:
    present = [x for x in values if not math.isnan(x)]
    if not present:
        return "-"
    s = summarize(present)
    text = f"{s['mean']:.4g} ± {s['std']:.2g}" if s["n"] > 1 else f"{s['mean']:.4g}"
    if per_seed:
        text += " (" + ", ".join(f"{x:g}" for x in values) + ")"
    return text


def _welch(a: list[float], b: list[float]) -> str:
    """Controlled minus uncontrolled with its 95% Welch interval, t and p."""
    a, b = [x for x in a if not math.isnan(x)], [x for x in b if not math.isnan(x)]
    try:
        t, p = welch_ttest(a, b)
        difference, low, high = welch_interval(a, b)
    except ValueError:  # fewer than 2 values, or both arms constant
        return "-"
    return f"{difference:+.3g} [{low:+.3g}, {high:+.3g}], t = {t:.2f}, p = {p:.2g}"


def summarise(runs_dir: Path, grid_side: int | None = None) -> str:
    """The table from run directories (``<arm>-seed*/``) or from results files (``<arm>-seed*.json``)."""
    rows: dict[str, dict[str, list[float]]] = {}
    seeds: dict[str, list[str]] = {}
    for arm in ARMS:
        files = sorted(runs_dir.glob(f"{arm}-seed*.json"))
        runs = [r for r in sorted(runs_dir.glob(f"{arm}-seed*/")) if r.is_dir()]
        if not runs and not files:
            raise SystemExit(f"no {arm}-seed*/ run directories or {arm}-seed*.json results in {runs_dir}")
        sources = files or runs
        seeds[arm] = [r.name.split("-seed")[-1].removesuffix(".json") for r in sources]
        for source in sources:
            row = result_row(json.loads(source.read_text())) if files else run_row(RunDir(source), grid_side)
            for metric, value in row.items():
                rows.setdefault(metric, {a: [] for a in ARMS})[arm].append(value)
    lines = [
        f"Table I from {runs_dir}: mean ± std over seeds {', '.join(seeds['controlled'])} (controlled) and "
        f"{', '.join(seeds['uncontrolled'])} (uncontrolled)",
        "",
        "| | controlled | uncontrolled | controlled - uncontrolled [95% Welch CI], Welch's t-test |",
        "|---|---|---|---|",
    ]
    for metric, by_arm in rows.items():
        per_seed = "heads" in metric or "epoch of" in metric or "accuracy (test)" in metric
        cells = [_cell(by_arm[arm], per_seed) for arm in ARMS]
        lines.append(f"| {metric} | {cells[0]} | {cells[1]} | {_welch(by_arm['controlled'], by_arm['uncontrolled'])} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "runs",
        type=Path,
        help="the OUT folder of benchmarks/experiments/table1.sh, or its RESULTS folder of per-seed JSON files",
    )
    parser.add_argument(
        "--grid", type=int, help="side of the (square) patch grid, for runs whose dynamics.jsonl does not name it"
    )
    args = parser.parse_args()
    table = summarise(args.runs, args.grid)
    print(table, end="")
    if not any(args.runs.glob("*-seed*.json")):  # a results folder holds data only; the table is printed
        (args.runs / "table1_summary.md").write_text(table)


if __name__ == "__main__":
    main()
