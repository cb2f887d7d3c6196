"""CET-ViT's ``vitlab probe`` sub-commands: the card's reversibility table and the slot-usage K with segment maps.

Examples::

    vitlab probe reversibility --json -                            # the card's reading table, as JSON
    vitlab probe slot-k runs/cet-cifar10-cpu-... --num-images 8    # -> <run>/probes/slot_k.json, segments.png
    vitlab probe slot-k runs/cet-cifar10-cpu-... --data path=/data/cifar10.npz eval_batch_size=256
    vitlab probe slot-k RUN_DIR --class-names airplane automobile bird cat deer dog frog horse ship truck
"""

from __future__ import annotations

import argparse
import functools
import itertools
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vitlab.cli.probe import add_json_option, check_json, probe, write_json
from vitlab.cli.registry import Runner, refuse_overrides
from vitlab.jsonio import strict_dumps

if TYPE_CHECKING:
    import torch

SLOT_K_FILE = "slot_k.json"
SEGMENTS_FILE = "segments.png"


@probe("reversibility", "the CET-ViT card's reversibility table on synthetic assignments")
def _reversibility(p: argparse.ArgumentParser) -> Runner:
    p.add_argument("--tokens", type=int, default=256, help="micro tokens N (card: 256)")
    p.add_argument("--slots", type=int, default=32, help="macro slots K_max (card: 32)")
    p.add_argument("--batch", type=int, default=16, help="random matrices averaged per row")
    p.add_argument("--seed", type=int, default=0)
    add_json_option(p, "table")

    def run(args: argparse.Namespace, overrides: list[str]) -> int:
        check_json(args)
        from vitlab.families.cet_vit.probes import format_reversibility_table, reversibility_table

        refuse_overrides("probe reversibility", overrides)
        rows = reversibility_table(args.tokens, args.slots, args.batch, args.seed)
        write_json(rows, args.json, format_reversibility_table(rows))
        return 0

    return run


@probe("slot-k", "slot-usage K per image and class on the test set, and segment maps of S")
def _slot_k(p: argparse.ArgumentParser) -> Runner:
    p.add_argument("target", help="run directory, its export/ folder, or a .ckpt file of a CET-ViT")
    p.add_argument("--data", nargs="+", action="append", metavar="KEY=VALUE", help="data config overrides")
    p.add_argument("--num-images", type=int, default=8, help="test images drawn as segment maps (default 8)")
    p.add_argument("--alpha", type=float, default=0.45, help="opacity of the segment colours in the overlay")
    p.add_argument("--max-batches", type=int, help="only the first N test batches (quick checks)")
    p.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1, mps")
    p.add_argument("--out", help="output folder (default: <run>/probes)")
    p.add_argument("--class-names", nargs="+", metavar="NAME", help="names of the classes, for data that carry none")
    p.add_argument("--force", action="store_true", help="replace slot_k.json and segments.png in an --out folder")

    return functools.partial(_run_slot_k, p)


def _run_slot_k(p: argparse.ArgumentParser, args: argparse.Namespace, overrides: list[str]) -> int:
    from vitlab.cli.evaluate import data_overrides
    from vitlab.data import denormalize, normalize
    from vitlab.errors import ConfigError
    from vitlab.evaluation.target import load_evaluation_target
    from vitlab.families.cet_vit.probes import collect_assignments, format_slot_usage, slot_usage_summary
    from vitlab.models.protocols import SlotAssigner
    from vitlab.rundir import check_outputs, write_output

    if args.num_images < 0 or (args.max_batches is not None and args.max_batches < 1):
        p.error("--num-images must be >= 0 and --max-batches >= 1")
    if args.out:  # the run's own probes/ is replaced; a folder the user names keeps its files unless --force
        check_outputs([Path(args.out) / SLOT_K_FILE, Path(args.out) / SEGMENTS_FILE], force=args.force)
    data = data_overrides(args, overrides, "vitlab probe slot-k")
    target = load_evaluation_target(args.target, data, args.device)
    model, dm = target.model, target.datamodule
    if not isinstance(model, SlotAssigner):
        raise ConfigError(f"{args.target} holds a {type(model).__name__}, which has no slot assignment S")
    names = args.class_names or dm.class_names
    if len(names) != dm.num_classes:
        raise ConfigError(f"--class-names gives {len(names)} names for the {dm.num_classes} classes of the data")

    def batches():
        # through [0, 1] pixels: the model is fed the normalisation it was trained with
        for x, y in itertools.islice(dm.test_dataloader(), args.max_batches):
            yield normalize(denormalize(x, dm.mean, dm.std), target.mean, target.std), y

    collected = collect_assignments(model, batches(), keep_images=args.num_images, device=args.device)
    summary = slot_usage_summary(collected["slot_k"], collected["labels"], names, collected["predictions"])
    summary["source"] = str(target.source)
    summary["per_image"] = collected["slot_k"].tolist()
    out = Path(args.out) if args.out else target.out_dir.parent / "probes"
    write_output(out / SLOT_K_FILE, strict_dumps(summary, indent=2), force=True)
    print(format_slot_usage(summary))
    print(f"written: {out / SLOT_K_FILE}")
    if args.num_images:
        pixels = denormalize(collected["images"], target.mean, target.std)
        print(f"written: {_save_segments(out / SEGMENTS_FILE, pixels, collected, names, model.grid_size, args.alpha)}")
    return 0


def _save_segments(
    path: Path, pixels: torch.Tensor, collected: dict[str, Any], names: list[str], grid: tuple[int, int], alpha: float
) -> Path:
    """The segment maps of the kept images (``pixels``: [n, C, H, W] in [0, 1]), each titled with its class, the
    prediction and its slot count K."""
    from vitlab.diagnostics.segments import save_segment_maps

    shown = len(collected["images"])
    titles = [
        f"{names[label]}\npred {names[pred]}, K={k}"
        for label, pred, k in zip(
            collected["labels"][:shown].tolist(),
            collected["predictions"][:shown].tolist(),
            collected["slot_k"][:shown].tolist(),
            strict=True,
        )
    ]
    return save_segment_maps(path, pixels, collected["S"], tuple(grid), titles=titles, alpha=alpha)
