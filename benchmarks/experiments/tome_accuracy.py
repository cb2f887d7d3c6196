"""What Token Merging costs in accuracy on trained models: each run evaluated at several ``r`` (tokens per block).

The same trained weights are evaluated with ``tome_r`` changed at inference (``vitlab evaluate RUN --model tome_r=R``,
which rebuilds the model with the option changed; ToMe adds no parameters). Runs trained without merging (the plain
ViT baseline) show what merging at inference costs; runs trained with ``r = 8`` (the ToMe baseline) show what
turning it off gives back. Test top-1 and NLL over the whole test set, no TTA, no corruptions; mean ± std over runs.

    OMP_NUM_THREADS=1 python -m benchmarks.experiments.tome_accuracy runs/compare-cifar10_p4/vit-seed{0,1,2} \
        runs/compare-cifar10_p4/tome-seed{0,1,2} --r 0 4 8

writes ``benchmarks/results/experiments/tome_accuracy_<device>_<date>.json`` (:mod:`benchmarks.naming`).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

from vitlab.evaluation.evaluate import evaluate_run
from vitlab.rundir import EXPORT_DIR, RunDir

if __package__ in (None, ""):  # run as a file: the suite is imported from the repository root
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.naming import results_path


def trained_r(run: Path) -> int:
    """``tome_r`` the run was trained with (its export's constructor arguments)."""
    return int(RunDir(run).json(Path(EXPORT_DIR) / "config.json")["kwargs"].get("tome_r", 0))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path, help="run directories of trained ViTs (with export/)")
    parser.add_argument("--r", nargs="+", type=int, default=[0, 4, 8], help="tokens merged per block at inference")
    parser.add_argument("--out", type=Path, default=results_path("experiments", "tome_accuracy"))
    args = parser.parse_args()

    results = []
    for run in args.runs:
        model = RunDir(run).config_dict()["model"]["name"]
        for r in args.r:
            start = time.perf_counter()
            ev = evaluate_run(
                run,
                model_overrides={"tome_r": r},
                tta_views=0,
                corruptions=False,
                out_dir=run / f"evaluation-tome_r={r}",
            )
            row = {
                "run": str(run),
                "model": model,
                "trained_r": trained_r(run),
                "r": r,
                "top1": ev["test"]["top1"],
                "nll": ev["test"]["nll"],
                "n_test": ev["run"]["n_test"],
                "seconds": time.perf_counter() - start,
            }
            results.append(row)
            print(json.dumps(row))

    lines = ["| trained with | evaluated at r | runs | test top-1, % | test NLL |", "|---|---|---|---|---|"]
    for trained in sorted({row["trained_r"] for row in results}):
        for r in args.r:
            rows = [row for row in results if row["trained_r"] == trained and row["r"] == r]
            top1 = 100 * np.array([row["top1"] for row in rows])
            nll = np.array([row["nll"] for row in rows])
            spread = (lambda v: f" ± {v.std(ddof=1):.2f}") if len(rows) > 1 else (lambda v: "")
            lines.append(
                f"| r = {trained} ({rows[0]['model']}) | {r} | {len(rows)} | {top1.mean():.2f}{spread(top1)} | "
                f"{nll.mean():.3f}{spread(nll)} |"
            )
    table = "\n".join(lines) + "\n"
    print(table, end="")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"benchmark": "tome_accuracy", "rows": results, "table": table}, indent=2))
    print(f"written: {args.out}")


if __name__ == "__main__":
    main()
