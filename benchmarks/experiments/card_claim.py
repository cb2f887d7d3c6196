"""The card's claim against budget (docs/card_claim.md, the pre-registered protocol): one results file per run, and
the analysis fixed by the pre-registration.

    python -m benchmarks.experiments.card_claim record RUN_DIR --model cet_card --epochs 8 --seed 0 --tokens 64 \\
        --out FILE.json
    python -m benchmarks.experiments.card_claim summarise benchmarks/results/experiments/card_claim \\
        --out benchmarks/results/experiments/card_claim.json [--figures docs/img]

``record`` reads a finished run (``benchmarks/experiments/run_result.py``: test metrics, validation curve, command, git
revision, CPU) and adds the model key, budget, tokens, parameters and forward GFLOPs per image (of the run's own
model, rebuilt from the run directory). ``summarise`` collects every per-run file into ``card_claim.json``
(``{"runs": [{"model", "epochs", "seed", "tokens", "params", "gflops", "test_acc", "val_curve", "git", "cpu"}],
...}``), prints per budget the means with Welch intervals against each baseline, and tests the hypotheses:

- H1a / H1b: the gap of the card-shaped CET-ViT (``cet_card``) to the matched ViT / Swin shrinks with budget;
- H2: ``cet_global`` minus the matched ViT grows with budget;

each by the least-squares fit ``acc = budget intercept + gamma * is_cet + beta * is_cet * log2(epochs)`` over the
64-token runs of the pair, ``beta``'s 95% t interval and the verdict rule of the pre-registration (holds: the
interval above 0; does not hold: below 0; else not resolved, with the slope the design detects at 80% power).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

import numpy as np
from scipy import stats

if __package__ in (
    None,
    "",
):  # run as a file (python -m benchmarks.experiments.card_claim): the suite is imported from the repository root
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.naming import repo_relative

#: the pre-registered hypotheses: name -> (CET-ViT variant, baseline, statement)
HYPOTHESES = {
    "H1a": ("cet_card", "vit", "the card-shaped CET-ViT's gap to the matched ViT shrinks as the budget grows"),
    "H1b": ("cet_card", "swin", "the card-shaped CET-ViT's gap to the matched Swin shrinks as the budget grows"),
    "H2": ("cet_global", "vit", "the grouping branch's value (cet_vit_nano_global - ViT) grows with the budget"),
}
MODELS = ["cet_card", "cet_global", "vit", "swin", "tome"]
#: the pre-registered budgets (epochs): a slope over fewer of them is an interim reading, not the test
BUDGETS = (8, 24, 48)
#: the pre-registered seeds per budget (docs/card_claim.md, "Budgets, seeds, data"): with fewer, a slope is interim
SEEDS = {8: 2, 24: 2, 48: 3}
#: the baselines among themselves: reported beside the CET-ViT gaps, no hypothesis of their own
BASELINE_PAIRS = [("vit", "swin"), ("vit", "tome"), ("tome", "swin")]


# ------------------------------------------------------------------------------------------------------------------
# One run
# ------------------------------------------------------------------------------------------------------------------
def record(run: Path, model: str, epochs: int, seed: int, tokens: int, git: str | None = None) -> dict[str, Any]:
    """The per-run record of ``card_claim.json`` for a finished run directory. ``git``: the revision the caller ran,
    which wins over the run's own ``env.json`` (a copy of the tree whose history is missing or stale, as on a lent GPU
    machine, where it named the parent commit)."""
    from benchmarks.experiments.run_result import run_result
    from vitlab.export import load_model
    from vitlab.models.sizing import count_params, flops_per_image
    from vitlab.rundir import RunDir

    result = run_result(run)
    rundir = RunDir(run)
    hardware = (rundir.env() or {}).get("hardware", {})
    on_gpu = str(rundir.config_dict().get("trainer", {}).get("accelerator")) in ("gpu", "cuda", "auto")
    network = load_model(run)
    return {
        "model": model,
        "preset": getattr(network, "preset", type(network).__name__),
        "epochs": epochs,
        "seed": seed,
        "tokens": tokens,
        "params": count_params(network)["total"],
        "gflops": flops_per_image(network) / 1e9,
        "test_acc": result["test"].get("test/acc"),
        "val_curve": (result.get("val_curve") or {}).get("val/acc"),
        "git": result.get("git") if git is None else {"revision": git, "recorded_in_run": result.get("git")},
        "cpu": result.get("cpu"),
        "gpu": (hardware.get("cuda") or [None])[0] if on_gpu else None,
        "precision": result.get("precision"),
        "torch": result.get("torch"),
        "command": repo_relative(result.get("command")),
        "timing": result.get("timing"),
    }


# ------------------------------------------------------------------------------------------------------------------
# The analysis
# ------------------------------------------------------------------------------------------------------------------
def slope_test(runs: list[dict[str, Any]], cet: str, baseline: str, power: float = 0.8) -> dict[str, Any] | None:
    """``beta`` of ``acc = budget intercept + gamma * is_cet + beta * is_cet * log2(epochs)`` (accuracy in points)
    over the 64-token runs of ``cet`` and ``baseline``: the change of the gap per doubling of the budget, its 95%
    t interval, and the smallest slope this design detects with ``power`` at the 5% level (at the fit's own
    residual spread). ``None`` when the runs cannot identify it (fewer than two budgets, or no residual freedom)."""
    pair = [r for r in runs if r["tokens"] == 64 and r["model"] in (cet, baseline) and r["test_acc"] is not None]
    budgets = sorted({r["epochs"] for r in pair})
    if len(budgets) < 2:
        return None

    def row(r: dict[str, Any]) -> list[float]:
        is_cet = float(r["model"] == cet)
        return [*(float(r["epochs"] == b) for b in budgets), is_cet, is_cet * math.log2(r["epochs"])]

    X = np.array([row(r) for r in pair])
    y = np.array([100 * r["test_acc"] for r in pair])
    rank = int(np.linalg.matrix_rank(X))
    dof = len(y) - rank
    if rank < X.shape[1] or dof < 1:
        return None
    coef, *_ = np.linalg.lstsq(X, y, rcond=None)
    residual = y - X @ coef
    sigma = math.sqrt(float(residual @ residual) / dof)
    se = sigma * math.sqrt(float(np.linalg.inv(X.T @ X)[-1, -1]))
    t = float(stats.t.ppf(0.975, dof))
    beta = float(coef[-1])
    low, high = beta - t * se, beta + t * se
    detectable = _detectable(se, dof, power) if se > 0 else math.nan
    if low > 0:
        verdict = "holds"
    elif high < 0:
        verdict = "does not hold"
    else:
        verdict = "not resolved at this power"
    return {
        "beta_points_per_doubling": beta,
        "ci95": [low, high],
        "se": se,
        "dof": dof,
        "runs": len(y),
        "budgets": budgets,
        "budgets_of_both": sorted(
            {r["epochs"] for r in pair if r["model"] == cet} & {r["epochs"] for r in pair if r["model"] == baseline}
        ),
        "residual_sd_points": sigma,
        "detectable_slope_80pct": detectable,
        "verdict": verdict,
    }


def _detectable(se: float, dof: int, power: float) -> float:
    """The slope a two-sided t test at 5% detects with ``power`` (noncentral t)."""
    from scipy.optimize import brentq

    t = stats.t.ppf(0.975, dof)

    def miss(slope: float) -> float:
        nc = slope / se
        return 1 - stats.nct.cdf(t, dof, nc) + stats.nct.cdf(-t, dof, nc) - power

    upper = 4 * se
    while True:  # widen until the power is reached; far out the noncentral t's tail is NaN
        value = miss(upper)
        if math.isnan(value) or upper > 1e3 * se:
            return math.nan
        if value > 0:
            return float(brentq(miss, 1e-6 * se, upper))
        upper *= 2


def per_budget(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (tokens, epochs, model): the seeds' test accuracies, and the Welch difference of each CET-ViT variant
    against each baseline, and of the baselines among themselves (reported, not tested)."""
    from vitlab.evaluation.stats import welch_interval, welch_ttest

    cells: dict[tuple[int, int], dict[str, list[float]]] = {}
    for r in runs:
        if r["test_acc"] is not None:
            cells.setdefault((r["tokens"], r["epochs"]), {}).setdefault(r["model"], []).append(100 * r["test_acc"])
    rows = []
    for (tokens, epochs), models in sorted(cells.items()):
        row: dict[str, Any] = {"tokens": tokens, "epochs": epochs, "models": models, "gaps": {}}
        pairs = [(cet, base) for cet in ("cet_card", "cet_global") for base in ("vit", "swin", "tome")]
        for first, second in pairs + BASELINE_PAIRS:
            a, b = models.get(first, []), models.get(second, [])
            if len(a) >= 2 and len(b) >= 2:
                diff, low, high = welch_interval(a, b)
                _, p = welch_ttest(a, b)
                row["gaps"][f"{first}-{second}"] = {"diff": diff, "ci95": [low, high], "p": p}
        rows.append(row)
    return rows


def summarise(results: Path | list[Path]) -> dict[str, Any]:
    """Every per-run file of the folders ``results`` (one per session and machine: the runs of one design, wherever
    they ran); a run recorded twice (the same model, epochs, tokens and seed) is refused."""
    folders = [results] if isinstance(results, Path) else list(results)
    runs = [json.loads(p.read_text()) for folder in folders for p in sorted(folder.glob("*.json"))]
    if not runs:
        names = " ".join(map(str, folders))
        raise SystemExit(f"error: no per-run results in {names}; run benchmarks/experiments/card_claim.sh first")
    keys = [(r["model"], r["epochs"], r["tokens"], r["seed"]) for r in runs]
    twice = sorted({k for k in keys if keys.count(k) > 1})
    if twice:
        raise SystemExit(f"error: runs recorded twice (model, epochs, tokens, seed): {twice}; keep one file each")
    return {
        "protocol": "docs/card_claim.md",
        "runs": runs,
        "per_budget": per_budget(runs),
        "hypotheses": {
            name: {
                "statement": text,
                "cet": cet,
                "baseline": base,
                **_interim(slope_test(runs, cet, base) or {}, runs, cet, base),
            }
            for name, (cet, base, text) in HYPOTHESES.items()
        },
    }


def _interim(test: dict[str, Any], runs: list[dict[str, Any]], cet: str, baseline: str) -> dict[str, Any]:
    """A slope over only some of the pre-registered budgets, or with fewer seeds than registered in a cell of
    either model, is marked interim, in its verdict too: the test of docs/card_claim.md is the fit over all three
    budgets with every registered seed."""
    if not test:
        return test
    missing = []
    if not set(test["budgets_of_both"]) >= set(BUDGETS):
        have = ", ".join(map(str, test["budgets_of_both"]))
        missing.append(f"budgets {have} of {', '.join(map(str, BUDGETS))}")
    for model in (cet, baseline):
        for epochs, wanted in SEEDS.items():
            have = len({r["seed"] for r in runs if (r["model"], r["epochs"], r["tokens"]) == (model, epochs, 64)})
            if epochs in test["budgets_of_both"] and have < wanted:
                missing.append(f"{model} {have} of {wanted} seeds at {epochs}")
    if not missing:
        return test
    return {**test, "interim": True, "verdict": f"interim, {test['verdict']} ({'; '.join(missing)})"}


def devices(first: list[Path], second: list[Path]) -> dict[str, Any]:
    """The same runs (model, epochs, tokens, seed) recorded on two devices (folders ``first``, e.g. a GPU replicate,
    and ``second``, e.g. the CPU sessions): each run's difference of test top-1 (points, first minus second), and
    their mean with its 95% t interval: the device's effect on a result, beside the seed spread."""
    from scipy import stats as st

    def load(folders: list[Path]) -> dict[tuple, dict[str, Any]]:
        runs = [json.loads(p.read_text()) for folder in folders for p in sorted(folder.glob("*.json"))]
        return {(r["model"], r["epochs"], r["tokens"], r["seed"]): r for r in runs if r["test_acc"] is not None}

    a, b = load(first), load(second)
    pairs = [
        {
            "model": k[0],
            "epochs": k[1],
            "tokens": k[2],
            "seed": k[3],
            "first": 100 * a[k]["test_acc"],
            "second": 100 * b[k]["test_acc"],
            "difference": 100 * (a[k]["test_acc"] - b[k]["test_acc"]),
            "devices": [a[k].get("gpu") or a[k].get("cpu"), b[k].get("gpu") or b[k].get("cpu")],
        }
        for k in sorted(set(a) & set(b))
    ]
    d = np.array([p["difference"] for p in pairs])
    out: dict[str, Any] = {"first": [str(f) for f in first], "second": [str(f) for f in second], "runs": pairs}
    if len(d) >= 2:
        half = float(st.t.ppf(0.975, len(d) - 1) * d.std(ddof=1) / math.sqrt(len(d)))
        out |= {"mean": float(d.mean()), "sd": float(d.std(ddof=1)), "ci95": [d.mean() - half, d.mean() + half]}
        out |= {"max_abs": float(np.abs(d).max()), "n": len(d)}
    return out


def render(summary: dict[str, Any]) -> str:
    lines = ["| tokens | epochs | model | test top-1 per seed, % | mean |", "|---|---|---|---|---|"]
    for row in summary["per_budget"]:
        for model in MODELS:
            values = row["models"].get(model)
            if values:
                seeds = ", ".join(f"{v:.2f}" for v in values)
                lines.append(f"| {row['tokens']} | {row['epochs']} | {model} | {seeds} | {np.mean(values):.2f} |")
    lines += ["", "| tokens | epochs | gap | difference [95% Welch CI], p |", "|---|---|---|---|"]
    for row in summary["per_budget"]:
        for name, gap in row["gaps"].items():
            low, high = gap["ci95"]
            lines.append(
                f"| {row['tokens']} | {row['epochs']} | {name} | {gap['diff']:+.2f} [{low:+.2f}, {high:+.2f}], "
                f"p = {gap['p']:.2g} |"
            )
    lines += [
        "",
        "| hypothesis | beta (points per doubling) [95% CI] | detectable at 80% | verdict |",
        "|---|---|---|---|",
    ]
    for name, h in summary["hypotheses"].items():
        if "beta_points_per_doubling" not in h:
            lines.append(f"| {name}: {h['statement']} | not enough budgets yet | | not tested |")
            continue
        low, high = h["ci95"]
        lines.append(
            f"| {name}: {h['statement']} | {h['beta_points_per_doubling']:+.2f} [{low:+.2f}, {high:+.2f}] "
            f"({h['runs']} runs, {h['dof']} dof) | {h['detectable_slope_80pct']:.2f} | {h['verdict']} |"
        )
    return "\n".join(lines)


def figures(summary: dict[str, Any], folder: Path) -> list[Path]:
    """``card_claim_accuracy.png`` (test accuracy against budget per model, every seed shown; the 256-token arm as
    open squares) and ``card_claim_gaps.png`` (the CET-ViT gaps against budget with their Welch intervals, the
    baselines' gaps among themselves dashed; the series side by side around each budget so no interval hides
    another). The x axis is log-scaled and labelled with the budgets themselves."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from vitlab.atomic import save_figure

    budgets = sorted({r["epochs"] for r in summary["per_budget"]})

    def budget_axis(ax: Any, label: str) -> None:
        ax.set_xscale("log", base=2)
        ax.set_xticks(budgets, [str(e) for e in budgets])
        ax.minorticks_off()
        ax.set_xlim(min(budgets) / 1.35, max(budgets) * 1.35)
        ax.set_xlabel(label)

    written = []
    fig, ax = plt.subplots(figsize=(5.5, 3.6))
    colors = {model: f"C{i}" for i, model in enumerate(MODELS)}
    for tokens, marker, fill in ((64, "o", True), (256, "s", False)):
        for model in MODELS:
            rows = [r for r in summary["per_budget"] if r["tokens"] == tokens and r["models"].get(model)]
            if not rows:
                continue
            epochs = [r["epochs"] for r in rows]
            means = [float(np.mean(r["models"][model])) for r in rows]
            face = colors[model] if fill else "none"
            label = model if tokens == 64 else f"{model}, {tokens} tokens"
            ax.plot(epochs, means, marker=marker, color=colors[model], mfc=face, ls="-" if fill else ":", label=label)
            seeds = [(r["epochs"], v) for r in rows for v in r["models"][model]]
            ax.scatter(*zip(*seeds, strict=True), color=colors[model], marker=marker, s=10, alpha=0.6)
    budget_axis(ax, "epochs of the 10k-image protocol (log scale)")
    ax.set_ylabel("test top-1, % (seeds as small marks)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    written.append(save_figure(fig, folder / "card_claim_accuracy.png", dpi=150))
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(5.5, 3.6))
    baselines = [f"{a}-{b}" for a, b in BASELINE_PAIRS]
    series = [(name, 64) for name in ("cet_card-vit", "cet_card-swin", "cet_global-vit", *baselines)]
    series.append(("cet_card-swin", 256))
    for k, (name, tokens) in enumerate(series):
        rows = [r for r in summary["per_budget"] if r["tokens"] == tokens and name in r["gaps"]]
        if not rows:
            continue
        dodge = 2 ** (0.045 * (k - (len(series) - 1) / 2))  # side by side, in the log axis's own units
        e = np.array([r["epochs"] for r in rows], dtype=float) * dodge
        d = np.array([r["gaps"][name]["diff"] for r in rows])
        err = np.array(
            [[d[i] - r["gaps"][name]["ci95"][0], r["gaps"][name]["ci95"][1] - d[i]] for i, r in enumerate(rows)]
        ).T
        label = name if tokens == 64 else f"{name}, {tokens} tokens"
        if name in baselines:
            style: dict[str, Any] = dict(ls="--", alpha=0.5, label=f"{label} (baselines)")
        else:
            style = dict(label=label, marker="o" if tokens == 64 else "s", mfc=None if tokens == 64 else "none")
        ax.errorbar(e, d, yerr=err, capsize=3, **{"marker": "o", **style})
    ax.axhline(0, color="grey", lw=0.8)
    budget_axis(ax, "epochs (log scale)")
    ax.set_ylabel("top-1 difference, points (95% Welch CI)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    written.append(save_figure(fig, folder / "card_claim_gaps.png", dpi=150))
    plt.close(fig)
    return written


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    rec = sub.add_parser("record", help="one finished run -> its results file")
    rec.add_argument("run", type=Path)
    rec.add_argument("--model", required=True, choices=MODELS)
    rec.add_argument("--epochs", type=int, required=True)
    rec.add_argument("--seed", type=int, required=True)
    rec.add_argument("--tokens", type=int, required=True)
    rec.add_argument("--out", type=Path, required=True)
    rec.add_argument("--git", help="the revision that ran (wins over the run's env.json)")
    summ = sub.add_parser("summarise", help="every results file -> card_claim.json and the tables")
    summ.add_argument("results", type=Path, nargs="+", help="folders of per-run files (one per session)")
    summ.add_argument("--out", type=Path)
    summ.add_argument("--figures", type=Path)
    dev = sub.add_parser("devices", help="the same runs on two devices: their differences")
    dev.add_argument("first", type=Path, nargs="+", help="folders of the first device (then --against)")
    dev.add_argument("--against", type=Path, nargs="+", required=True, help="folders of the second device")
    dev.add_argument("--out", type=Path)
    args = parser.parse_args()

    from vitlab.atomic import atomic_write_text
    from vitlab.environment import environment

    if args.command == "record":
        if not (args.run / "test_metrics.json").is_file():
            raise SystemExit(f"error: {args.run} has not finished (no test_metrics.json); resume it first")
        atomic_write_text(
            args.out, json.dumps(record(args.run, args.model, args.epochs, args.seed, args.tokens, args.git), indent=1)
        )
        return
    if args.command == "devices":
        result = devices(args.first, args.against)
        result["environment"] = environment()
        if args.out is not None:
            atomic_write_text(args.out, json.dumps(result, indent=1) + "\n")
        for p in result["runs"]:
            run = f"{p['model']} e{p['epochs']} t{p['tokens']} seed {p['seed']}"
            print(f"{run}: {p['first']:.2f} - {p['second']:.2f} = {p['difference']:+.2f}")
        if "mean" in result:
            low, high = result["ci95"]
            print(f"mean {result['mean']:+.2f} [{low:+.2f}, {high:+.2f}], sd {result['sd']:.2f}, n {result['n']}")
        return
    summary = summarise(args.results)
    if args.out is not None:
        summary["environment"] = environment()
        atomic_write_text(args.out, json.dumps(summary, indent=1) + "\n")
    if args.figures is not None:
        figures(summary, args.figures)
    print(render(summary))


if __name__ == "__main__":
    main()
