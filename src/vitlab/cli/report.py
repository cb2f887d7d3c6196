"""``vitlab report``: one self-contained HTML page per run, or a comparison page for several runs.

Examples::

    vitlab report runs/vitcae-digits-20261130-101500              # -> runs/vitcae-digits-20261130-101500/report.html
    vitlab report runs/cet-cifar100-seed0 --attention-images 8
    vitlab report runs/vit-digits-* --out results/vit-digits.html  # comparison of the runs
"""

from __future__ import annotations

import argparse

from vitlab.cli.registry import Runner, command, refuse_overrides


@command("report", "self-contained HTML report of a run (curves, metrics, grids, attention), or a comparison of runs")
def _report(p: argparse.ArgumentParser) -> Runner:
    p.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="run directories; several give a comparison page")
    p.add_argument("--out", help="output file (default: RUN_DIR/report.html, or ./report.html for several runs)")
    p.add_argument("--force", action="store_true", help="replace an existing --out file (or ./report.html)")
    p.add_argument(
        "--attention-images", type=int, default=4, help="test images whose attention maps are shown (0: none)"
    )

    def run(args: argparse.Namespace, overrides: list[str]) -> int:
        from vitlab.report import write_report

        refuse_overrides("report", overrides)
        path = write_report(args.run_dirs, args.out, attention_images=args.attention_images, force=args.force)
        print(f"report: {path}")
        return 0

    return run
