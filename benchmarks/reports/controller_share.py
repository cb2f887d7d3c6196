"""What the dynamics controller cost over whole runs: its seconds against the epochs' (issue 15).

    python -m benchmarks.reports.controller_share runs/exact runs/adaptive --out benchmarks/results/controller_share

Per run, from ``dynamics.jsonl``: the controller's seconds summed over every epoch after the first measurement
(``seconds``, the probe passes, drift, kappa and decisions) over the epochs' seconds (``epoch_seconds``, training
and validation), the seconds per part (``seconds_parts``), the heads frozen after every tenth epoch, the epochs in
which the adaptive probe was extended (some head averaged over more than ``probe_min`` images), and the test
accuracy. Both sums come from the same run, so the share is a ratio within one run. Writes ``<out>.json`` and
``<out>.md``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from vitlab.rundir import RunDir


def share(run: Path) -> dict:
    records = RunDir(run).dynamics()
    epochs = [r for r in records if r.get("epoch_seconds") is not None]  # epoch 0 measures before training
    if not epochs:
        raise SystemExit(f"{run} has no dynamics records with epoch_seconds")
    controller = sum(r["seconds"] for r in epochs)
    total = sum(r["epoch_seconds"] for r in epochs)
    parts: dict[str, float] = {}
    for r in epochs:
        for part, seconds in (r.get("seconds_parts") or {}).items():
            parts[part] = parts.get(part, 0.0) + seconds
    frozen = {r["epoch"]: sum(map(sum, r["frozen"])) for r in records if r["epoch"] % 10 == 0 and r["epoch"] > 0}
    probe_min = min((min(map(min, r["drift_images"])) for r in epochs if r.get("drift_images")), default=None)
    extended = [
        r["epoch"] for r in epochs if r.get("drift_images") and max(map(max, r["drift_images"])) > (probe_min or 0)
    ]
    test = RunDir(run).test_metrics() or {}
    return {
        "epochs": len(epochs),
        "controller_s": controller,
        "epochs_s": total,
        "share": controller / total,
        "parts_s": parts,
        "frozen_after": frozen,
        "extended_epochs": extended if probe_min is not None else None,
        "test/acc": test.get("test/acc"),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("runs", type=Path, nargs="+")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args()
    table = {str(run): share(run) for run in args.runs}
    lines = [
        "| run | controller / epochs | share | parts (s) | frozen heads after epochs | extended epochs | test acc |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, r in table.items():
        parts = ", ".join(f"{k} {v:.1f}" for k, v in sorted(r["parts_s"].items()))
        frozen = ", ".join(f"{e}: {n}" for e, n in r["frozen_after"].items())
        ext = "-" if r["extended_epochs"] is None else f"{len(r['extended_epochs'])} of {r['epochs']}"
        acc = "" if r["test/acc"] is None else f"{100 * r['test/acc']:.2f}%"
        lines.append(
            f"| {name} | {r['controller_s']:.1f} / {r['epochs_s']:.1f} s | {100 * r['share']:.2f}% | {parts} | "
            f"{frozen} | {ext} | {acc} |"
        )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps(table, indent=1) + "\n")
    args.out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
