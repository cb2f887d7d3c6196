"""The training curves of a report: ``metrics.jsonl`` rows (and ``steps.jsonl``) grouped into panels of series."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

Series = tuple[list[float], list[float]]  # (epochs, values)
PER_STEP = " (per step)"


def curve_panels(rows: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, Series]]:
    """Group the per-epoch rows of ``metrics.jsonl`` into panels of series: ``{panel: {series: (epochs, values)}}``.

    ``train/<term>`` and ``val/<term>`` share the panel ``<term>`` (series ``train`` and ``val``); learning-rate keys
    (``train/lr`` from vitlab's tasks; ``lr``, ``lr-AdamW``, ``lr-AdamW/pg1`` from Lightning's
    ``LearningRateMonitor``) share the panel ``learning rate``;
    any other key (``dynamics/mean_drift``) is a panel of its own. Panels come in the order loss, acc, learning rate,
    then the other train/val terms, then the rest, each group sorted by name; in a panel, train comes before val.
    ``epoch`` and ``step`` are the axis, not panels; values that are not finite numbers are left out.
    """
    panels: dict[str, dict[str, Series]] = {}
    for row in rows:
        epoch = row.get("epoch")
        if epoch is None:
            continue
        for key, value in row.items():
            numeric = isinstance(value, int | float) and not isinstance(value, bool)
            if key in ("epoch", "step") or not numeric or not math.isfinite(value):
                continue
            stage, _, term = key.partition("/")
            if key == "train/lr":  # logged by vitlab's tasks
                panel, series = "learning rate", "lr"
            elif stage in ("train", "val") and term:
                panel, series = term, stage
            elif key == "lr" or key.startswith("lr-"):
                panel, series = "learning rate", key
            else:
                panel, series = key, key
            epochs, values = panels.setdefault(panel, {}).setdefault(series, ([], []))
            epochs.append(float(epoch))
            values.append(float(value))

    train_val_first = {"train": 0, "val": 1}
    return {
        panel: {
            name: panels[panel][name] for name in sorted(panels[panel], key=lambda s: (train_val_first.get(s, 2), s))
        }
        for panel in sorted(panels, key=lambda p: panel_rank(p, panels[p]))
    }


def add_step_series(
    panels: dict[str, dict[str, Series]], steps: Sequence[Mapping[str, Any]], rows: Sequence[Mapping[str, Any]]
) -> dict[str, dict[str, Series]]:
    """Add the per-step training loss and learning rate of ``steps.jsonl`` to the ``loss`` and ``learning rate``
    panels (series ``train (per step)``, ``lr (per step)``), on the epoch axis: the last step of epoch ``e`` (the
    ``step`` of its ``metrics.jsonl`` row) lands at ``e``, where the epoch's mean is drawn."""
    ends = {int(row["epoch"]): int(row["step"]) for row in rows if row.get("step") is not None}
    for key, panel, series in (("loss", "loss", "train" + PER_STEP), ("lr", "learning rate", "lr" + PER_STEP)):
        xs, ys = [], []
        for record in steps:
            epoch, step, value = record.get("epoch"), record.get("step"), record.get(key)
            if epoch not in ends or step is None or not isinstance(value, int | float) or not math.isfinite(value):
                continue
            start = ends.get(epoch - 1, -1)
            xs.append(epoch - 1 + (step - start) / max(1, ends[epoch] - start))
            ys.append(float(value))
        if xs:
            panels.setdefault(panel, {})[series] = (xs, ys)
    return panels


def panel_rank(panel: str, series: Iterable[str]) -> tuple[int, str]:
    """Sort key of a panel: loss, acc, learning rate, then train/val terms, then other keys, each by name."""
    first = {"loss": 0, "acc": 1, "learning rate": 2}
    if panel in first:
        return first[panel], panel
    return (3 if {"train", "val"} & set(series) else 4), panel
