"""The quantus faithfulness table of docs/explain.md, beside the project's own deletion and insertion gains over a
random order (``vitlab explain RUN --evaluate``'s ``explain_evaluation.json``, one per run, in the runs' order).
Prints Markdown (means over the images).

    python -m benchmarks.reports.explain_quantus_table benchmarks/results/experiments/explain_quantus_*.json \\
        --evaluations RUN1/explain/explain_evaluation.json RUN2/explain/explain_evaluation.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

METRICS = ("faithfulness_correlation", "pixel_flipping", "road", "random_logit", "sparseness")


def _gains(evaluation: dict | None, method: str) -> list[str]:
    """Deletion gain (random AUC - method's) and insertion gain (method's - random), or dashes."""
    if evaluation is None or method not in evaluation["methods"]:
        return ["-", "-"]
    s = evaluation["methods"][method]["summary"]
    return [
        f"{s['random_deletion_auc'] - s['deletion_auc']:+.3f}",
        f"{s['insertion_auc'] - s['random_insertion_auc']:+.3f}",
    ]


def table(results: dict, evaluations: list[dict | None]) -> str:
    lines = []
    for run, evaluation in zip(results["runs"], evaluations, strict=True):
        spread = np.median(run["masking_spread"])
        lines += [
            f"**{run['run']}** ({run['kind']}, {results['images']} images; the logit's drop under random masking "
            f"spreads by {spread:.3f} of the logit, median)",
            "",
            "| method | deletion gain | insertion gain | Faithfulness Corr. (high) | pixel flipping (low) | ROAD (low) "
            "| random logit (low) | sparseness |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for method, values in run["methods"].items():
            cells = [f"{np.nanmean(values[m]):.3f}" for m in METRICS]
            lines.append(f"| {method} | " + " | ".join(_gains(evaluation, method) + cells) + " |")
        lines.append("")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", type=Path)
    parser.add_argument("--evaluations", type=Path, nargs="*", default=[])
    args = parser.parse_args()
    results = json.loads(args.results.read_text())
    evaluations = [json.loads(p.read_text()) for p in args.evaluations]
    evaluations += [None] * (len(results["runs"]) - len(evaluations))
    print(table(results, evaluations))


if __name__ == "__main__":
    main()
