"""The comparison page of several runs: their final metrics in one table (the better value of each marked), the
config keys in which they differ, and their curves overlaid."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from vitlab.config import RunConfig, to_dict
from vitlab.jsonio import flatten
from vitlab.report.curves import curve_panels
from vitlab.report.page import (
    DETAIL_METRICS,
    HIGHER_IS_BETTER,
    LOWER_IS_BETTER,
    Figure,
    Figures,
    Page,
    Plot,
    Section,
    Table,
    Text,
)
from vitlab.report.record import RunRecord
from vitlab.rundir import DYNAMICS_FILE, EVALUATION_DIR


def summary_metrics(run: RunRecord) -> dict[str, float]:
    """The run's final metrics (:meth:`vitlab.rundir.RunDir.final_metrics`) without :data:`DETAIL_METRICS`."""
    return {k: v for k, v in run.final_metrics.items() if not k.startswith(DETAIL_METRICS)}


def better_direction(metric: str) -> str | None:
    """``"max"`` or ``"min"`` for metrics whose best value is known from their last name part, else None."""
    leaf = metric.rsplit("/", 1)[-1]
    if leaf.endswith(HIGHER_IS_BETTER):
        return "max"
    if leaf.endswith(LOWER_IS_BETTER):
        return "min"
    return None


def config_differences(configs: Sequence[RunConfig]) -> dict[str, list[Any]]:
    """Dotted config keys whose values are not the same in every run: ``{key: [value per run]}``.

    ``run.dir`` is left out: it is where each run is (the runs table names them), not a setting."""
    flat = [flatten(to_dict(c)) for c in configs]
    for f in flat:
        f.pop("run.dir", None)
    keys = sorted(set().union(*flat))
    return {k: [f.get(k) for f in flat] for k in keys if len({json.dumps(f.get(k), default=str) for f in flat}) > 1}


def metrics_table(runs: Sequence[RunRecord]) -> Table | None:
    """Metrics (rows) by run (columns), the best value of each metric with a known direction in bold."""
    metrics = [summary_metrics(r) for r in runs]
    keys = list(dict.fromkeys(k for m in metrics for k in m))
    if not keys:
        return None
    rows, bold = [], set()
    for row_index, key in enumerate(keys):
        values = [m.get(key) for m in metrics]
        rows.append((key, *values))
        direction = better_direction(key)
        present = [v for v in values if v is not None]
        if direction and len(present) > 1:
            best = max(present) if direction == "max" else min(present)
            bold |= {(row_index, 1 + i) for i, v in enumerate(values) if v == best}
    return Table(["metric", *(r.name for r in runs)], rows, bold)


def collect_comparison(run_dirs: Sequence[str | Path | RunRecord]) -> Page:
    """The page comparing several runs."""
    runs = [r if isinstance(r, RunRecord) else RunRecord.load(r) for r in run_dirs]
    names = [run.name for run in runs]
    if len(set(names)) < len(names):  # same folder name under different parents: name them by their parents too
        for run in runs:
            run.name = f"{run.path.resolve().parent.name}/{run.path.resolve().name}"
    names = [run.name for run in runs]
    overview = Table(
        ["run", "model", "dataset", "epochs", "seed", "directory"],
        [(r.name, r.model_name, r.config.data.name, len(r.metrics), r.config.run.seed, str(r.path)) for r in runs],
    )
    sections = [Section("runs", "Runs", [overview])]
    table = metrics_table(runs)
    if table is not None:
        note = "Best value in bold where the direction is known (accuracy, PSNR, SSIM up; loss, NLL, ECE down)."
        sections.append(Section("metrics", "Final metrics", [Text(note), table]))
    differences = config_differences([r.config for r in runs])
    if differences:
        rows = [
            (key, *(json.dumps(v) if isinstance(v, list | dict) else v for v in values))
            for key, values in differences.items()
        ]
        sections.append(Section("config-diff", "Config differences", [Table(["key", *names], rows)]))
    curves = [(r.name, curve_panels(r.metrics)) for r in runs if r.metrics]
    if curves:
        plot = Plot("comparison_curves", {"runs": curves})
        sections.append(Section("curves", "Training curves", [Figures([Figure(plot=plot)])]))
    dynamics = [r for r in runs if (r.path / DYNAMICS_FILE).exists()]
    if len(dynamics) == 2:
        data = {"paths": [str(r.path / DYNAMICS_FILE) for r in dynamics], "labels": [r.name for r in dynamics]}
        figure = Figure("The two runs' heads side by side.", plot=Plot("dynamics_comparison", data))
        sections.append(Section("dynamics", "Attention dynamics", [Figures([figure])]))
    reliability = [(r.name, r.png(Path(EVALUATION_DIR) / "reliability.png")) for r in runs if r.evaluation]
    figures = [Figure(name, png=png, wide=False) for name, png in reliability if png]
    if figures:
        sections.append(Section("calibration", "Reliability diagrams", [Figures(figures)]))
    return Page(f"Comparison of {len(runs)} runs", ", ".join(names), sections)
