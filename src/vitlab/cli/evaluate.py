"""``vitlab evaluate`` and ``vitlab compare``: the evaluation suite of a run, and the comparison of runs.

Examples::

    vitlab evaluate runs/cet-cifar100-seed0                      # -> runs/cet-cifar100-seed0/evaluation/
    vitlab evaluate runs/vit-digits-... --max-batches 2 --no-corruptions
    vitlab evaluate runs/vit-cifar10-... --data eval_batch_size=512 root=/data --device cuda
    vitlab evaluate runs/vit-cifar10-... --model tome_r=8 --no-corruptions   # ToMe at inference -> evaluation-tome_r=8/
    vitlab compare runs/cet-* runs/vit-* --metric test/acc --out results/compare.md
    vitlab compare runs/cet-* --group-by model.ei --pairs all
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from vitlab.cli.registry import Runner, command, refuse_overrides


def data_overrides(args: argparse.Namespace, overrides: list[str], command: str = "vitlab evaluate") -> dict[str, Any]:
    """``--data key=value ...`` merged with dotted ``data.key=value`` overrides: keys of the data section (any other
    key is an error of ``command``)."""
    from vitlab.config import deep_merge, parse_overrides
    from vitlab.errors import ConfigError

    dotted = parse_overrides(overrides)
    if set(dotted) - {"data"}:
        raise ConfigError(
            f"{command} takes only data overrides (--data key=value or data.key=value), got "
            f"{', '.join(sorted(set(dotted) - {'data'}))}"
        )
    flagged = parse_overrides([item for group in args.data or [] for item in group])
    return deep_merge(flagged, dotted.get("data", {}))


@command("evaluate", "evaluation suite of a run: accuracy, calibration, TTA, corruptions, per-class analysis")
def _evaluate(p: argparse.ArgumentParser) -> Runner:
    p.add_argument("target", help="run directory, its export/ folder, or a .ckpt file")
    p.add_argument("--data", nargs="+", action="append", metavar="KEY=VALUE", help="data config overrides")
    p.add_argument(
        "--model",
        nargs="+",
        action="append",
        metavar="KEY=VALUE",
        help="model options that leave the weights alone, e.g. tome_r=8 (Token Merging at inference)",
    )
    p.add_argument("--no-corruptions", action="store_true", help="skip the corruption suite")
    p.add_argument("--severities", type=int, nargs="+", default=[1, 2, 3, 4, 5], help="corruption severities 1..5")
    p.add_argument("--tta-views", type=int, default=5, help="test-time views (0 turns TTA off; default 5)")
    p.add_argument(
        "--hflip",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="allow the flip view (default: if trained with flips or the dataset is flip-invariant)",
    )
    p.add_argument("--tta-shift", type=int, help="pixels of the shift views (default max(1, img_size // 16))")
    p.add_argument("--max-batches", type=int, help="evaluate only the first N batches of each split (quick checks)")
    p.add_argument("--seed", type=int, default=0, help="calibration split, corruption noise and bootstrap seed")
    p.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1, mps")
    p.add_argument("--out", help="output folder (default: <run>/evaluation)")
    p.add_argument("--force", action="store_true", help="replace the evaluation files in an --out folder that has them")
    return _run_evaluate


def _run_evaluate(args: argparse.Namespace, overrides: list[str]) -> int:
    """``vitlab evaluate``: check the options and the ``--out`` folder, run the suite, print its summary."""
    from vitlab.config import parse_overrides
    from vitlab.errors import ConfigError
    from vitlab.evaluation.evaluate import EVALUATION_FILE, RELIABILITY_FILE, evaluate_run
    from vitlab.evaluation.terminal import format_evaluation
    from vitlab.rundir import check_outputs

    bad = [s for s in args.severities if not 1 <= s <= 5]
    if bad:
        raise ConfigError(f"--severities takes corruption severities 1..5, got {' '.join(map(str, bad))}")
    if args.out and not _holds_an_evaluation(Path(args.out)):  # an earlier `vitlab evaluate --out` is replaced
        check_outputs([Path(args.out) / EVALUATION_FILE, Path(args.out) / RELIABILITY_FILE], force=args.force)

    model_overrides = parse_overrides([item for group in args.model or [] for item in group])
    results = evaluate_run(
        args.target,
        data_overrides=data_overrides(args, overrides),
        tta_views=args.tta_views,
        hflip=args.hflip,
        tta_shift=args.tta_shift,
        corruptions=not args.no_corruptions,
        severities=tuple(args.severities),
        seed=args.seed,
        device=args.device,
        max_batches=args.max_batches,
        out_dir=args.out,
        model_overrides=model_overrides,
    )
    print(format_evaluation(results))
    out = Path(results["run"]["out_dir"])
    print(f"written: {out / EVALUATION_FILE}, {out / results['files']['reliability']}")
    return 0


def _holds_an_evaluation(folder: Path) -> bool:
    """True when ``folder`` holds what ``vitlab evaluate --out folder`` wrote (its ``evaluation.json`` names the
    folder as its ``out_dir``): that evaluation is replaced; any other file there is the user's."""
    from vitlab.evaluation.evaluate import EVALUATION_FILE

    try:
        stored = json.loads((folder / EVALUATION_FILE).read_text())
    except (OSError, ValueError):
        return False
    out_dir = stored.get("run", {}).get("out_dir") if isinstance(stored, dict) else None
    return isinstance(out_dir, str) and Path(out_dir).resolve() == folder.resolve()


@command("compare", "compare runs: metrics over seeds per group (Markdown + JSON), Welch's t-tests")
def _compare(p: argparse.ArgumentParser) -> Runner:
    p.add_argument("runs", nargs="+", help="run directories")
    p.add_argument("--group-by", default="model", help="'model' (preset name) or a dotted config key, e.g. model.ei")
    p.add_argument("--metric", default="test/acc", help="metric of the t-tests (default test/acc)")
    p.add_argument("--pairs", choices=["first", "all"], default="first", help="t-test each group vs the first, or all")
    p.add_argument("--out", help="write FILE.md and FILE.json (the suffix given is replaced)")
    p.add_argument("--force", action="store_true", help="replace FILE.md and FILE.json if they exist")

    def run(args: argparse.Namespace, overrides: list[str]) -> int:
        from vitlab.evaluation.compare import compare_runs, comparison_json, comparison_markdown
        from vitlab.rundir import check_outputs, write_output

        refuse_overrides("compare", overrides)
        if args.out:
            check_outputs([Path(args.out).with_suffix(".md"), Path(args.out).with_suffix(".json")], force=args.force)
        comparison = compare_runs(args.runs, group_by=args.group_by, metric=args.metric, pairs=args.pairs)
        markdown = comparison_markdown(comparison)
        print(markdown, end="")
        for warning in comparison["warnings"]:
            print(f"vitlab compare: warning: {warning}", file=sys.stderr)
        if args.out:
            out = Path(args.out)
            write_output(out.with_suffix(".md"), markdown, force=True)
            write_output(out.with_suffix(".json"), comparison_json(comparison), force=True)
            print(f"written: {out.with_suffix('.md')}, {out.with_suffix('.json')}")
        return 0

    return run
