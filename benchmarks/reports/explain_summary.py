"""The methods x families table of docs/explain.md, from the per-run results of ``vitlab explain RUN --evaluate``
(``benchmarks/results/explain/*.json``, one per trained run).

Per run and method, over the evaluated test images: the deletion gain (random order's AUC minus the method's;
positive: removing the patches the method ranks first hurts the prediction sooner than removing random ones) and
the insertion gain (the method's AUC minus the random order's), each with a 95% t-interval over the images (paired:
the same images in both orders); the Spearman rank correlation with the maps of a re-initialised model (Adebayo et
al. 2018: low passes); the largest conservation error; seconds per image. Prints Markdown.

    python -m benchmarks.reports.explain_summary benchmarks/results/explain
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
from scipy import stats

ORDER = ("vit", "vitcae", "tome", "swin", "cet_vit")
METHODS = ("attention", "rollout", "grad_rollout", "lrp", "gradcam", "integrated_gradients")


def paired_gain(a: list[float], b: list[float]) -> str:
    """``mean(a - b)`` with its 95% t-interval, as text."""
    diff = np.asarray(a) - np.asarray(b)
    low, high = stats.ttest_1samp(diff, 0.0).confidence_interval(0.95)
    return f"{diff.mean():+.3f} [{low:+.3f}, {high:+.3f}]"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", type=Path)
    args = parser.parse_args()
    runs = [json.loads(p.read_text()) for p in sorted(args.results.glob("*.json"))]
    runs.sort(key=lambda r: (ORDER.index(r["kind"]) if r["kind"] in ORDER else len(ORDER), r["model"]))
    print(
        "| family | model (test acc.) | method | deletion gain [95% CI] | insertion gain [95% CI] | "
        "rank corr. vs randomised | conservation (max) | s / image |"
    )
    print("|---|---|---|---|---|---|---|---|")
    refusals = []
    for r in runs:
        acc = (r.get("test_metrics") or {}).get("test/acc")
        label = f"{r['model']} ({100 * acc:.1f}%)" if acc is not None else r["model"]
        for method in METHODS:
            if method in r["refused"]:
                refusals.append(f"- {r['kind']}, {method}: {r['refused'][method]}")
                print(f"| {r['kind']} | {label} | {method} | refused | | | | |")
                continue
            if method not in r["methods"]:
                continue
            image = r["methods"][method]["per_image"]
            s = r["methods"][method]["summary"]
            deletion = paired_gain(image["random_deletion_auc"], image["deletion_auc"])
            insertion = paired_gain(image["insertion_auc"], image["random_insertion_auc"])
            conservation = f"{s['conservation_max']:.1e}" if "conservation_max" in s else "-"
            print(
                f"| {r['kind']} | {label} | {method} | {deletion} | {insertion} | "
                f"{s['randomisation_spearman']:+.2f} | {conservation} | {s['seconds_per_image']:.3f} |"
            )
    images = sorted({r["images"] for r in runs})
    print(f"\n{len(runs)} runs, {', '.join(map(str, images))} test images each; refused (by name, with the reason):")
    print("\n".join(dict.fromkeys(refusals)))


if __name__ == "__main__":
    main()
