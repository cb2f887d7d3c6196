"""Table of the CET-ViT ablation (benchmarks/experiments/cet_ablation.sh) beside the matched baselines' 3-seed runs.

    python -m benchmarks.reports.cet_ablation_summary runs/cet-ablation \
        --baselines benchmarks/results/experiments/compare_cifar10_p4_cpu_2026-11-30.json \
        --out benchmarks/results/experiments/cet_ablation_<device>_<date>
    python -m benchmarks.reports.cet_ablation_summary runs/cet-decomp \
        --previous benchmarks/results/experiments/cet_ablation_cpu_2026-12-01.json \
        --baselines benchmarks/results/experiments/compare_cifar10_p4_cpu_2026-11-30.json \
        --out benchmarks/results/experiments/cet_ablation_<device>_<date>

Several run folders may be given; ``--previous`` keeps the variants of an earlier ``<out>.json`` that no given run
folder has (the first ablation's runs are not in the repository, their numbers are).

Per variant: test top-1 per seed (``test_metrics.json``), the test-time grouping ablation and slot-usage K at init
and at the end (``grouping.json``), and Welch's t-test (``vitlab.evaluation.stats.welch_ttest``) against the ViT and
Swin seeds of ``compare_cifar10_p4.json`` (and today's CET-ViT 3-seed runs there) when the variant has 2+ seeds.
Writes ``<out>.json`` and ``<out>.md``.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import numpy as np

from vitlab.evaluation.stats import welch_ttest
from vitlab.rundir import METRICS_FILE, RunDir

VARIANTS = (
    "base",
    "pos",
    "slots",
    "select",
    "eicard",
    "micro",
    "widep4",
    "widep2",
    "widew8",
    "widemicro",
    "vithalf",
    "vitcurves",
    "swinasvit",
    "swinasvitw4",
    "globalmicro",
    "global",
    "globalnoei",
    "globalexactk",
)
LABELS = {
    "base": "today's CET-ViT (`cet_vit_nano`)",
    "pos": "+ `pos_embed: learned`",
    "slots": "+ `slot_ratio: 8`, `mask_empty_slots: true` (8 slots)",
    "select": "+ `select_grad: dense_st`",
    "eicard": "+ EI 0.01 constant (card v4)",
    # the decomposition (docs/cet_vit.md, "Which element costs the accuracy"), each from the 8-slot variant
    "micro": "8-slot variant, micro encoder alone (`grouping: none`)",
    "widep4": "8-slot variant as `cet_vit_nano_wide` (width-96 micro encoder)",
    "widep2": "`cet_vit_nano_wide` at patch 2 (256 tokens, 32 slots), no dropout/drop-path: NOT the protocol",
    # the third round (docs/cet_vit.md, "Is it the windows, the branch, or the blocks?")
    "widew8": "`cet_vit_nano_wide`, 8 slots, window 8 (global attention in the micro encoder)",
    "widemicro": "`cet_vit_nano_wide`'s micro encoder alone (`grouping: none`)",
    "vithalf": "ViT at the micro encoder's size (width 96, depth 5; 0.39M)",
    "vitcurves": "matched ViT, seed 0 re-run (with per-part curves)",
    "swinasvit": "micro encoder alone shaped like that ViT (window 8, width 96, depth 5, 4 heads, MLP 2; 0.39M)",
    "swinasvitw4": "the same with windows of 4 (local attention)",
    "globalmicro": "`cet_vit_nano_global`'s micro encoder alone (`grouping: none`)",
    "global": "`cet_vit_nano_global` (global width-128 micro encoder, MLP 2, 8 slots)",
    "globalnoei": "`cet_vit_nano_global`, `ei: none`",
    "globalexactk": "`cet_vit_nano_global`, `dynamic_k: exact`, K in {4, 6, 8}",
}
# the decomposition and the third round: each tested against the 8-slot variant too
DECOMPOSITION = VARIANTS[VARIANTS.index("micro") :]
REFERENCES = {"ViT": "vit_matched_cet_vit_nano", "Swin": "swin_matched_cet_vit_nano", "CET today": "cet_vit_nano"}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("runs", type=Path, nargs="+")
    p.add_argument("--previous", type=Path, help="an earlier <out>.json whose variants are kept")
    p.add_argument("--baselines", type=Path, required=True)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--skip", nargs="*", type=Path, default=[], help="run folders to leave out (e.g. one stopped early)")
    args = p.parse_args()
    skip = {path.resolve() for path in args.skip}
    groups = json.loads(args.baselines.read_text())["groups"]
    refs = {name: groups[key]["values"]["test/acc"] for name, key in REFERENCES.items()}
    table: dict[str, dict] = {}
    stopped: dict[str, dict[int, list[float]]] = {}  # runs stopped before their test: validation curve only
    for run in sorted(run for folder in args.runs for run in folder.glob("*-seed*")):
        match = re.fullmatch(r"(\w+)-seed(\d+)", run.name)
        if not match or not (run / METRICS_FILE).exists() or run.resolve() in skip:
            continue
        variant, seed = match.group(1), int(match.group(2))
        rundir = RunDir(run)
        curve = [e["val/acc"] for e in rundir.metrics() if "val/acc" in e]
        test = rundir.test_metrics()
        if test is None:
            if curve:
                stopped.setdefault(variant, {})[seed] = curve
            continue
        entry = table.setdefault(variant, {"seeds": [], "acc": [], "grouping": [], "val_acc_by_epoch": {}})
        entry["val_acc_by_epoch"][seed] = curve
        entry["seeds"].append(seed)
        entry["acc"].append(test["test/acc"])
        grouping = rundir.json("grouping.json")  # benchmarks/experiments/cet_grouping.py's record
        if grouping is not None:
            entry["grouping"].append(grouping)
    if args.previous is not None:
        for variant, entry in json.loads(args.previous.read_text())["variants"].items():
            if variant not in table:
                entry["val_acc_by_epoch"] = {int(k): v for k, v in entry["val_acc_by_epoch"].items()}
                table[variant] = entry
    rows = []
    for variant in [v for v in VARIANTS if v in table]:
        entry = table[variant]
        acc = np.array(entry["acc"])
        entry["mean"], entry["std"] = float(acc.mean()), float(acc.std(ddof=1)) if len(acc) > 1 else None
        entry["welch"] = {}
        if len(acc) > 1:
            # the decomposition's variants are also tested against the 8-slot variant they start from
            others = {"8-slot": table["slots"]["acc"]} if variant in DECOMPOSITION and "slots" in table else {}
            for name, ref in {**refs, **others}.items():
                t, pval = welch_ttest(acc, ref)
                entry["welch"][name] = {"difference": float(acc.mean() - np.mean(ref)), "t": t, "p": pval}
        g = entry["grouping"]

        def mean_of(part: str, key: str, g=g) -> str:
            return f"{np.mean([x[part][key] for x in g]):.{2 if key == 'slot_usage_k' else 1}f}" if g else "n/a"

        seeds = ", ".join(f"{100 * a:.2f}" for a in entry["acc"])
        std = f" ± {100 * entry['std']:.2f}" if entry["std"] is not None else ""
        welch = "; ".join(
            f"{n} {100 * w['difference']:+.1f} (t = {w['t']:.2f}, p = {w['p']:.3f})" for n, w in entry["welch"].items()
        )
        slot_k = f"{mean_of('init', 'slot_usage_k')} -> {mean_of('final', 'slot_usage_k')}" if g else "n/a"
        rows.append(
            f"| {LABELS[variant]} | {g[0]['num_slots'] if g else 'none'} | {100 * entry['mean']:.2f}{std} ({seeds}; "
            f"seeds {', '.join(map(str, entry['seeds']))}) | {mean_of('final', 'points_random')} | "
            f"{mean_of('final', 'points_uniform')} | {slot_k} | {welch or '1 seed'} |"
        )
    ref_rows = [
        f"| {name} (`{REFERENCES[name]}`, benchmarks/results/experiments/compare_cifar10_p4_cpu_2026-11-30.json) | | "
        f"{100 * np.mean(v):.2f} ± {100 * np.std(v, ddof=1):.2f} ({', '.join(f'{100 * a:.2f}' for a in v)}) | | | | |"
        for name, v in refs.items()
    ]
    md = "\n".join(
        [
            "| variant | slots | test top-1 % (seeds) | random-S costs (points) | uniform-S costs "
            "(points) | slot-usage K init -> end | Welch vs the 3-seed references |",
            "|---|---:|---|---:|---:|---|---|",
            *rows,
            *ref_rows,
        ]
    )
    curves = [
        f"| {LABELS[v]} (seed {seed}) | " + " | ".join(f"{100 * a:.1f}" for a in accs) + " |"
        for v in VARIANTS
        if v in table
        for seed, accs in sorted(table[v]["val_acc_by_epoch"].items())
    ]
    curves += [
        f"| {LABELS.get(v, v)} (seed {seed}; stopped after epoch {len(accs)}, no test) | "
        + " | ".join(f"{100 * a:.1f}" for a in accs)
        + " |"
        for v, by_seed in stopped.items()
        for seed, accs in sorted(by_seed.items())
    ]
    width = max((len(table[v]["val_acc_by_epoch"][s]) for v in table for s in table[v]["val_acc_by_epoch"]), default=0)
    md += "\n\nValidation accuracy (%) after each epoch:\n\n| run | " + " | ".join(str(i + 1) for i in range(width))
    md += " |\n|---|" + "---:|" * width + "\n" + "\n".join(curves)
    args.out.with_suffix(".json").write_text(
        json.dumps({"variants": table, "stopped": stopped, "references": refs}, indent=2)
    )
    args.out.with_suffix(".md").write_text(md + "\n")
    print(md)


if __name__ == "__main__":
    main()
