"""The CET-ViT ablations re-run after the EI degeneracy term's fix (docs/cet_vit.md, "The ablations after the
degeneracy fix"), from the per-seed results files of ``benchmarks/experiments/cet_ablation.sh`` (``RESULTS=...``):
per variant the test accuracy per seed, mean ± std, the validation slot-usage K after every epoch (the collapse that
the old term caused read as K = 1 of 8 from epoch 3 on), the Dynamic-K shares of the chosen budgets, and the
difference to the ``slots`` variant of ``benchmarks/results/experiments/cet_ablation_cpu_2026-12-01.json`` (the same
protocol without the change, 3 seeds, run earlier on another processor) with its 95% Welch interval. Prints a
Markdown table.

    python -m benchmarks.reports.cet_degeneracy_fix_summary \\
        benchmarks/results/experiments/cet_ablation_degeneracy_fix_epyc_2026-12-02 \\
        --reference benchmarks/results/experiments/cet_ablation_cpu_2026-12-01.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from vitlab.evaluation.stats import summarize, welch_interval, welch_ttest

LABELS = {
    "select": "dense straight-through selection + EI (`select_grad: dense_st`)",
    "gumbel": "straight-through Gumbel Dynamic-K over 4, 6, 8 slots + EI (`dynamic_k: gumbel`)",
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", type=Path)
    parser.add_argument("--reference", type=Path, required=True, help="cet_ablation.json with the slots variant")
    args = parser.parse_args()
    reference = [100 * a for a in json.loads(args.reference.read_text())["variants"]["slots"]["acc"]]
    runs: dict[str, list[dict]] = {}
    for path in sorted(args.results.glob("*-seed*.json")):
        result = json.loads(path.read_text())
        runs.setdefault(result["arm"], []).append(result)
    print(
        "| variant (compare/cifar10_p4, 8 slots, learned position) | test accuracy per seed, % | mean ± std | "
        "against `slots` [95% CI], p | validation slot-usage K by epoch (each seed) | K = 4 share, last epoch |"
    )
    print("|---|---|---|---|---|---|")
    ref = f"{summarize(reference)['mean']:.2f} ± {summarize(reference)['std']:.2f}"
    print(f"| `slots` (reference, the earlier runs) | {', '.join(f'{a:.2f}' for a in reference)} | {ref} | | | |")
    for arm, label in LABELS.items():
        results = sorted(runs.get(arm, []), key=lambda r: r["seed"])
        if not results:
            continue
        accuracy = [100 * r["test"]["test/acc"] for r in results]
        s = summarize(accuracy)
        mean = f"{s['mean']:.2f} ± {s['std']:.2f}" if s["n"] > 1 else f"{s['mean']:.2f}"
        versus = ""
        if len(accuracy) > 1:
            difference, low, high = welch_interval(accuracy, reference)
            versus = f"{difference:+.2f} [{low:+.2f}, {high:+.2f}], p = {welch_ttest(accuracy, reference)[1]:.2g}"
        curves = "; ".join(" ".join(f"{k:.1f}" for k in r["val_curve"]["val/slot_k"]) for r in results)
        shares = ", ".join(
            f"{r['val_curve']['train/k_frac_4'][-1]:.0%}" for r in results if "train/k_frac_4" in r["val_curve"]
        )
        seeds = ", ".join(f"{a:.2f}" for a in accuracy) + f" (seeds {', '.join(str(r['seed']) for r in results)})"
        print(f"| {label} | {seeds} | {mean} | {versus} | {curves} | {shares or '-'} |")


if __name__ == "__main__":
    main()
