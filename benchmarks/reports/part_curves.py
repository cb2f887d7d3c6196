"""Training curves per part, several runs side by side (issue 13: where CET-ViT falls behind the matched ViT).

    python -m benchmarks.reports.part_curves runs/vit-seed0 runs/cet-seed0 \
        --out benchmarks/results/experiments/part_curves_<device>_<date>

Each run must have been trained with ``run.part_stats_every=N`` (``vitlab.training.callbacks.PartStats``). Per run
and epoch: validation accuracy and loss, and for every part its gradient norm and update/weight ratio (the means
over the sampled steps of that epoch); CET-ViT runs add the V-CEO top-k margin and slot-usage K (train and
validation). Writes ``<out>.json`` (every number) and ``<out>.md`` (the tables).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from vitlab.rundir import RunDir

EXTRA = ("train/vceo_margin", "val/vceo_margin", "train/slot_k", "val/slot_k")


def curves(run: Path) -> dict:
    rows = RunDir(run).metrics()
    parts = list(dict.fromkeys(key.split("/")[1] for row in rows for key in row if key.startswith("parts/")))
    if not parts:
        raise SystemExit(f"{run} has no parts/* metrics: train it with run.part_stats_every=N")
    out = {
        "epochs": [row["epoch"] for row in rows],
        "val/acc": [row.get("val/acc") for row in rows],
        "val/loss": [row.get("val/loss") for row in rows],
        "parts": {
            part: {kind: [row.get(f"parts/{part}/{kind}") for row in rows] for kind in ("grad_norm", "update_ratio")}
            for part in parts
        },
    }
    for key in EXTRA:
        if any(key in row for row in rows):
            out[key] = [row.get(key) for row in rows]
    test = RunDir(run).test_metrics()
    out["test/acc"] = None if test is None else test.get("test/acc")
    return out


def _fmt(value: float | None, digits: str) -> str:
    return "" if value is None else format(value, digits)


def markdown(table: dict[str, dict]) -> str:
    lines = []
    for name, c in table.items():
        epochs = c["epochs"]
        head = "| | " + " | ".join(str(e + 1) for e in epochs) + " |"
        rule = "|---|" + "---:|" * len(epochs)
        test = "" if c["test/acc"] is None else f", test top-1 {100 * c['test/acc']:.2f}%"
        lines += [f"### {name}{test}", "", head, rule]
        lines.append(
            "| val acc % | " + " | ".join(_fmt(None if v is None else 100 * v, ".1f") for v in c["val/acc"]) + " |"
        )
        for key in EXTRA:
            if key in c:
                lines.append(f"| {key} | " + " | ".join(_fmt(v, ".3f") for v in c[key]) + " |")
        for part, kinds in c["parts"].items():
            lines.append(f"| {part}: grad norm | " + " | ".join(_fmt(v, ".3f") for v in kinds["grad_norm"]) + " |")
            lines.append(
                f"| {part}: update/weight | " + " | ".join(_fmt(v, ".2e") for v in kinds["update_ratio"]) + " |"
            )
        lines.append("")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("runs", type=Path, nargs="+")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args()
    table = {str(run): curves(run) for run in args.runs}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps(table, indent=1) + "\n")
    args.out.with_suffix(".md").write_text(markdown(table))
    print(markdown(table))


if __name__ == "__main__":
    main()
