"""``vitlab predict`` (top-k classes of image files) and ``vitlab list-configs``; the ``--seed`` and
``--format`` helpers that ``vitlab.cli.main`` calls.

Examples::

    vitlab predict runs/vit-digits-20261130-101500 photos/ extra.png --topk 3 --out predictions.csv
    vitlab list-configs vitcae
    vitlab --seed 3 fit --config vit/digits        # = vitlab fit --config vit/digits run.seed=3
    vitlab export runs/vit-digits-20261130-101500 --format onnx
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from vitlab.cli.registry import Runner, command


def seed_overrides(seed: int | None, rest: list[str]) -> list[str]:
    """``--seed N`` (before or after the command) as the override ``run.seed=N``; ``rest`` without it."""
    out, i = [], 0
    while i < len(rest):
        arg = rest[i]
        if arg == "--seed" and i + 1 < len(rest):
            seed, i = int(rest[i + 1]), i + 2
            continue
        if arg.startswith("--seed="):
            seed = int(arg.split("=", 1)[1])
        else:
            out.append(arg)
        i += 1
    return out if seed is None else [*out, f"run.seed={seed}"]


def add_format_option(p: argparse.ArgumentParser) -> None:
    """``vitlab export --format``: the deployment format written beside model.safetensors + config.json."""
    from vitlab.export_formats import FORMATS

    p.add_argument(
        "--format",
        choices=FORMATS,
        default="safetensors",
        help="also write model.onnx (checked against onnxruntime) or model.pt2 (torch.export); dynamic batch",
    )


def write_extra_format(model, out: Path, fmt: str) -> None:
    """After the safetensors export: the ``--format`` file, with a line saying what was written."""
    from vitlab.export_formats import CHECK_BATCH, write_format

    written = write_format(model, out, fmt)
    if written is not None:
        path, diff = written
        print(f"wrote {path} (dynamic batch; on a batch of {CHECK_BATCH}, max |logits - model's| = {diff:.1e})")


# -------------------------------------------------------------------------------------------------------------------
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
        from vitlab.rundir import check_outputs

        if overrides:
            raise ConfigError(f"vitlab predict takes no config overrides, got {' '.join(overrides)}")
        if args.topk < 1 or args.batch_size < 1:
            raise ConfigError("--topk and --batch-size must be >= 1")
        if args.out:
            check_outputs([args.out], force=args.force)
        model, info = load_predictor(args.model)
        model = model.to(args.device)
        skipped: list[str] = []

        def bad(path: Path, e: Exception) -> None:
            reason = str(e).splitlines()[0] if str(e) else type(e).__name__
            print(f"skipped {path}: not a readable image ({reason})", file=sys.stderr)
            skipped.append(str(path))

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


@command("list-configs", "list the packaged configs (for --config) with their first comment line")
def _list_configs(p: argparse.ArgumentParser) -> Runner:
    p.add_argument("pattern", nargs="?", default="*", help="glob on the name, e.g. 'vitcae/*' or '*cifar*'")

    def run(args: argparse.Namespace, overrides: list[str]) -> int:
        import fnmatch

        from vitlab.config import CONFIG_ROOT

        for path in sorted(CONFIG_ROOT.rglob("*.yaml")):
            name = str(path.relative_to(CONFIG_ROOT).with_suffix(""))
            if not (fnmatch.fnmatch(name, args.pattern) or fnmatch.fnmatch(name, f"*{args.pattern}*")):
                continue
            print(f"{name:32s} {config_summary(path.read_text())}")
        return 0

    return run


def config_summary(text: str) -> str:
    """The first sentence of a config file's leading comment, whole (it may run over several comment lines);
    command lines in the comment (``vitlab fit ...``) are not part of it."""
    words = []
    for line in text.splitlines():
        if not line.startswith("#"):
            break
        content = line.lstrip("#").strip()
        if content.startswith("vitlab "):
            break
        words.append(content)
    joined = " ".join(words)
    depth = 0
    for i, char in enumerate(joined):
        depth += {"(": 1, ")": -1}.get(char, 0)
        if char == "." and depth == 0 and (i + 1 == len(joined) or joined[i + 1] == " "):
            return joined[: i + 1]
    return joined
