"""Compare runs: group them (by model or any config key), summarise every metric over seeds, Welch's t-tests.

CET-ViT v4 model card, "Results": top-1 accuracy as mean and standard deviation over seeds,
and Welch's unequal-variance t-test between two models' seeds. A run contributes the numbers of its
``test_metrics.json`` (as logged, e.g. ``test/acc``) and, when ``vitlab evaluate`` has run, the float values of
``evaluation/evaluation.json`` flattened to ``eval/<section>/<key>`` (e.g. ``eval/tta/top1``,
``eval/corruptions/contrast/mean``), and with the test metrics the training times of ``timing.json``
(``time/step_total_s``, ``time/backward_total_s``, ``time/epoch_total_s``).
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from vitlab.errors import ConfigError
from vitlab.evaluation.stats import summarize, welch_ttest
from vitlab.jsonio import strict_dumps
from vitlab.rundir import EVALUATION_DIR, EVALUATION_FILE, TEST_METRICS_FILE, RunDir

PAIRINGS = ("first", "all")


def run_metrics(run_dir: str | Path) -> dict[str, float]:
    """The final metrics of one run (:meth:`vitlab.rundir.RunDir.final_metrics`); an error if it has none."""
    metrics = RunDir(run_dir).final_metrics()
    if not metrics:
        raise ConfigError(
            f"{run_dir} has no {TEST_METRICS_FILE} and no {EVALUATION_DIR}/{EVALUATION_FILE}: test the run "
            f"(`vitlab test {run_dir}`) or evaluate it (`vitlab evaluate {run_dir}`) first"
        )
    return metrics


def _config_value(config: Mapping[str, Any], key_path: str, run_dir: Path) -> Any:
    node: Any = config
    for part in key_path.split("."):
        if not isinstance(node, Mapping) or part not in node:
            raise ConfigError(
                f"{run_dir}/config.yaml has no key {key_path!r}; group by 'model' or a dotted config key such as "
                "'model.topk', 'optim.lr' or 'data.name'"
            )
        node = node[part]
    return node


def _group_label(config: Mapping[str, Any], group_by: str, run_dir: Path) -> str:
    """``group_by="model"`` -> the preset name (``model.name``); any other value is a dotted key of config.yaml."""
    value = _config_value(config, "model.name" if group_by == "model" else group_by, run_dir)
    return value if isinstance(value, str) else json.dumps(value)


def _welch(groups: Mapping[str, Any], a: str, b: str, metric: str) -> dict[str, Any]:
    """Welch's t-test of ``metric`` between groups ``a`` and ``b``, or the reason it cannot be run."""
    values_a, values_b = groups[a]["values"].get(metric, []), groups[b]["values"].get(metric, [])
    entry: dict[str, Any] = {"a": a, "b": b, "metric": metric, "n_a": len(values_a), "n_b": len(values_b)}
    if len(values_a) < 2 or len(values_b) < 2:
        return {**entry, "skipped": "each group needs at least 2 runs (seeds) with this metric"}
    try:
        t, p = welch_ttest(values_a, values_b)
    except ValueError as e:
        return {**entry, "skipped": str(e)}
    difference = sum(values_a) / len(values_a) - sum(values_b) / len(values_b)
    return {**entry, "difference": difference, "t": t, "p": p}


def compare_runs(
    run_dirs: Sequence[str | Path], group_by: str = "model", metric: str = "test/acc", pairs: str = "first"
) -> dict[str, Any]:
    """Group runs, summarise each metric per group over its runs (seeds), and t-test ``metric`` between groups.

    Args:
        run_dirs: run directories, each with ``config.yaml`` and ``test_metrics.json`` and/or an evaluation.
        group_by: ``model`` (the preset name) or a dotted key of config.yaml (``model.topk``, ``optim.lr``).
        metric: the metric of the t-tests (a key of the summaries, e.g. ``test/acc`` or ``eval/tta/top1``).
        pairs: ``first`` (each group against the first, in the order the runs were given) or ``all`` pairs.

    Returns ``{"group_by", "metric", "datasets": {dataset: [runs]}, "warnings": [...], "groups": {label: {"runs",
    "seeds", "metrics": {key: summarize(...)}}}, "tests": [...]}``; a group's ``values`` hold the raw per-run
    numbers, in run order. A run given twice is an error; runs on different datasets are a warning.
    """
    if not run_dirs:
        raise ConfigError("compare needs at least one run directory")
    if pairs not in PAIRINGS:
        raise ConfigError(f"pairs must be one of {', '.join(PAIRINGS)}, got {pairs!r}")
    seen: dict[Path, Path] = {}
    for run_dir in map(Path, run_dirs):
        first = seen.setdefault(run_dir.resolve(), run_dir)
        if first is not run_dir:
            spelled = f" (as {first} and {run_dir})" if str(first) != str(run_dir) else ""
            raise ConfigError(f"run {run_dir} is given twice{spelled}; each run is one seed: pass every run once")
    groups, datasets = _group_runs(run_dirs, group_by)
    if not any(metric in group["values"] for group in groups.values()):
        available = sorted(set().union(*(group["values"] for group in groups.values())))
        raise ConfigError(f"no run has the metric {metric!r}; available: {', '.join(available)}")
    labels = list(groups)
    pairings = (
        [(labels[0], other) for other in labels[1:]] if pairs == "first" else list(itertools.combinations(labels, 2))
    )
    warnings = []
    if len(datasets) > 1:
        counts = ", ".join(f"{label}: {len(runs)} run{'s' * (len(runs) > 1)}" for label, runs in datasets.items())
        warnings.append(f"the runs were trained on different datasets ({counts}); their metrics are not comparable")
    return {
        "group_by": group_by,
        "metric": metric,
        "datasets": datasets,
        "warnings": warnings,
        "groups": groups,
        "tests": [_welch(groups, a, b, metric) for a, b in pairings],
    }


def _group_runs(
    run_dirs: Sequence[str | Path], group_by: str
) -> tuple[dict[str, dict[str, Any]], dict[str, list[str]]]:
    """The runs by group (``runs``, ``seeds``, per-run ``values`` and their ``metrics`` summaries) and by dataset."""
    groups: dict[str, dict[str, Any]] = {}
    datasets: dict[str, list[str]] = {}
    for run_dir in map(Path, run_dirs):
        config = RunDir(run_dir).config_dict()
        datasets.setdefault(dataset_label(config.get("data") or {}), []).append(str(run_dir))
        group = groups.setdefault(_group_label(config, group_by, run_dir), {"runs": [], "seeds": [], "values": {}})
        group["runs"].append(str(run_dir))
        group["seeds"].append((config.get("run") or {}).get("seed"))
        for key, value in run_metrics(run_dir).items():
            group["values"].setdefault(key, []).append(value)
    for group in groups.values():
        group["metrics"] = {key: summarize(values) for key, values in group["values"].items()}
    return groups, datasets


def dataset_label(data: Mapping[str, Any]) -> str:
    """A run's dataset in words: its name, the file or folder it was read from, and the class column if any
    (``npz mnist.npz``, ``celeba (target Smiling)``)."""
    label = str(data.get("name", "?"))
    if data.get("path"):
        label += f" {Path(str(data['path'])).name}"
    if data.get("target") is not None:
        label += f" (target {data['target']})"
    return label


def comparison_json(comparison: Mapping[str, Any]) -> str:
    """The comparison as strict JSON text (NaN written as null)."""
    return strict_dumps(comparison, indent=2)


def plain_number(value: float, digits: int = 4) -> str:
    """``value`` to ``digits`` significant digits, written out (``12346``, ``0.01235``, not ``1.235e+04``) between
    1e-4 and 1e9, where a reader compares columns of them; in scientific notation outside."""
    if value == 0 or not math.isfinite(value) or not 1e-4 <= abs(value) < 1e9:
        return f"{value:.{digits}g}"
    text = f"{value:.{max(0, digits - 1 - math.floor(math.log10(abs(value))))}f}"
    return text.rstrip("0").rstrip(".") if "." in text else text  # as ``g`` does: 0.91, not 0.9100


def _cell(summary: Mapping[str, float] | None, runs: int) -> str:
    if summary is None:
        return "-"
    text = plain_number(summary["mean"])
    if summary["n"] > 1:
        text += f" ± {plain_number(summary['std'], 2)}"
    if summary["n"] != runs:
        text += f" (n={summary['n']})"
    return text


def comparison_markdown(comparison: Mapping[str, Any]) -> str:
    """Markdown: a table of ``mean ± std`` per metric (rows) and group (columns), then the t-tests.

    A cell shows ``(n=k)`` when fewer than all the group's runs report the metric, and ``-`` when none does.
    """
    groups = comparison["groups"]
    labels = list(groups)
    # The tested metric first, then the others in the order the runs report them (test metrics, then evaluation).
    metrics = list(
        dict.fromkeys([comparison["metric"], *(key for group in groups.values() for key in group["metrics"])])
    )
    header = ["metric", *(f"{label} (n={len(groups[label]['runs'])})" for label in labels)]
    lines = [
        f"## Runs grouped by {comparison['group_by']}",
        "",
        *(f"**Warning:** {warning}\n" for warning in comparison.get("warnings", [])),
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
    ]
    for key in metrics:
        cells = [_cell(groups[label]["metrics"].get(key), len(groups[label]["runs"])) for label in labels]
        lines.append(f"| {key} | " + " | ".join(cells) + " |")
    if comparison["tests"]:
        lines += [
            "",
            f"## Welch's t-test on {comparison['metric']}",
            "",
            "| group | vs | difference | t | p |",
            "|---|---|---|---|---|",
        ]
        for test in comparison["tests"]:
            if "skipped" in test:
                lines.append(f"| {test['a']} | {test['b']} | - | - | skipped: {test['skipped']} |")
            else:
                sign = "+" if test["difference"] >= 0 else ""
                lines.append(
                    f"| {test['a']} | {test['b']} | {sign}{plain_number(test['difference'])} | {test['t']:.3f} | "
                    f"{test['p']:.3g} |"
                )
    return "\n".join(lines) + "\n"
