"""What layer freezing did in a run (``dynamics.freeze: layers``): the epoch each block froze at and what it saved,
from ``layers.jsonl`` and the step times of ``metrics.jsonl`` (collect only: plain data for the command's table and
the report)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from vitlab.rundir import LAYERS_FILE, METRICS_FILE, read_jsonl


def layer_summary(run_dir: str | Path) -> dict[str, Any] | None:
    """The run's frozen prefix (None without ``layers.jsonl``): ``signal``, ``blocks``, ``frozen_layers`` and
    ``frozen_share`` at the last epoch, ``rows`` (``block``, ``frozen_at``: epoch or None) and ``step_seconds``:
    the mean seconds per training step (``time/step_s`` over the epoch's steps) of the epochs trained with each
    prefix length ``k`` (``{k: seconds}``; the first epoch, which pays the warm-up, left out where others exist)."""
    run_dir = Path(run_dir)
    records = read_jsonl(run_dir / LAYERS_FILE, "epoch")
    if not records:
        return None
    final = records[-1]
    by_epoch = {r["epoch"]: r for r in records}
    per_k: dict[int, list[float]] = {}
    for row in read_jsonl(run_dir / METRICS_FILE, "epoch"):
        trained_with, ended = by_epoch.get(row["epoch"]), by_epoch.get(row["epoch"] + 1)  # record e: after epoch e
        if trained_with is None or ended is None or not ended.get("steps") or row.get("time/step_s") is None:
            continue
        if row["epoch"] == 0 and len(records) > 2:
            continue
        per_k.setdefault(trained_with["frozen_layers"], []).append(row["time/step_s"] / ended["steps"])
    return {
        "signal": final["layer_signal"],
        "blocks": final["blocks"],
        "frozen_layers": final["frozen_layers"],
        "frozen_share": final["frozen_share"],
        "rows": [{"block": block, "frozen_at": epoch} for block, epoch in enumerate(final["freeze_epochs"])],
        "step_seconds": {k: sum(v) / len(v) for k, v in sorted(per_k.items())},
    }


def format_layer_table(summary: dict[str, Any]) -> str:
    """:func:`layer_summary` as aligned text: one line per block, then the saving."""
    lines = [
        f"frozen encoder blocks ({summary['signal']} signal): {summary['frozen_layers']}/{summary['blocks']} "
        f"({100 * summary['frozen_share']:.0f}% of the blocks' FLOPs)",
        f"{'block':>5} {'frozen at':>9}",
    ]
    lines += [f"{r['block']:>5} {'-' if r['frozen_at'] is None else r['frozen_at']:>9}" for r in summary["rows"]]
    seconds = summary["step_seconds"]
    if seconds:
        steps = ", ".join(f"{k} frozen {1e3 * s:.1f} ms" for k, s in seconds.items())
        lines.append(f"seconds per training step (mean over the epochs trained so): {steps}")
    return "\n".join(lines)
