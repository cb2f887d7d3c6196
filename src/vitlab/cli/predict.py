"""``vitlab predict``: the top-k classes of image files with a trained run or export.

Examples::

    vitlab predict runs/vit-digits-20261130-101500 photos/ extra.png --topk 3 --out predictions.csv
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from vitlab.cli.registry import Runner, command, refuse_overrides, skip_unreadable


@command("predict", "top-k classes of image files or folders with a trained run or export")
def _predict(p: argparse.ArgumentParser) -> Runner:
    p.add_argument("model", help="run directory, export folder or .ckpt")
    p.add_argument("images", nargs="+", help="image files and folders (searched recursively for image files)")
    p.add_argument("--topk", type=int, default=5, help="classes per image (default 5, at most the class count)")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--out", help="also write the predictions: .csv, or JSON lines for any other suffix (.jsonl)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--force", action="store_true", help="replace an existing --out file (refused without it)")

    def run(args: argparse.Namespace, overrides: list[str]) -> int:
        from vitlab.errors import ConfigError
        from vitlab.evaluation.predict import image_files, load_predictor, predict, rows, write_rows
        from vitlab.export import check_device
        from vitlab.rundir import check_outputs

        refuse_overrides("predict", overrides)
        if args.topk < 1 or args.batch_size < 1:
            raise ConfigError("--topk and --batch-size must be >= 1")
        if args.out:
            check_outputs([args.out], force=args.force)
        device = check_device(args.device)
        model, info = load_predictor(args.model)
        model = model.to(device)
        skipped: list[Path] = []
        bad = skip_unreadable(skipped)
        files = list(image_files(args.images))
        records = list(rows(predict(model, info, files, topk=args.topk, batch_size=args.batch_size, on_error=bad)))
        width = max([len(r["path"]) for r in records] + [4])
        for r in records:
            ranked = [f"{r[f'top{i}']} {r[f'prob{i}']:.3f}" for i in range(1, args.topk + 1) if f"top{i}" in r]
            print(f"{r['path']:<{width}}  " + "  ".join(ranked))
        if args.out:
            write_rows(records, Path(args.out), force=True)
            print(f"wrote {len(records)} predictions to {args.out}")
        if skipped:
            print(f"{len(skipped)} of {len(files)} files skipped", file=sys.stderr)
        if not records:
            raise ConfigError(f"none of the {len(files)} files given is a readable image")
        return 0

    return run
