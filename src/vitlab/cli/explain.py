"""``vitlab explain``: which pixels a prediction rests on, for image files or, with ``--evaluate``, how faithful
each method is on a run's test set.

Examples::

    vitlab explain runs/vit-cifar10 cat.png dog.png --method lrp --out explained/    # overlays + maps.npz
    vitlab explain runs/vit-cifar10/export images/ --method rollout --target 3 --out explained/
    vitlab explain runs/vit-cifar10 --evaluate                                       # -> runs/vit-cifar10/explain/
    vitlab explain --model timm:deit_small_patch16_224 --weights deit.safetensors cat.png --method lrp --out o/
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from vitlab.cli.registry import Runner, command, refuse_overrides, skip_unreadable

METHOD_NAMES = (
    "attention", "rollout", "grad_rollout", "lrp", "cp_lrp", "lrp_epsilon", "lrp_gamma", "gradcam", "saliency",
    "input_x_gradient", "smoothgrad", "gradient_shap", "occlusion", "integrated_gradients",
)  # fmt: skip


def _check_target(args: argparse.Namespace) -> None:
    """What explain works on: a run (``RUN_OR_EXPORT``) or ``--model timm:NAME`` (then the positional target, if
    any, is the first image), checked before anything loads."""
    from vitlab.errors import ConfigError

    if args.model:
        if not args.model.startswith("timm:"):
            raise ConfigError(f"--model takes timm:NAME, got {args.model!r}; pass a run directory as RUN_OR_EXPORT")
        if args.evaluate:
            raise ConfigError("--evaluate reads a run's test set; pass a run directory instead of --model")
        if args.target and _holds_a_model(Path(args.target)):
            raise ConfigError(
                f"{args.target} holds a model of its own and --model {args.model} names another; pass the run alone "
                "(vitlab explain RUN IMAGES ...) or --model alone (vitlab explain --model timm:NAME IMAGES ...)"
            )
        args.images = [args.target, *args.images] if args.target else args.images
        args.target = args.model
    elif args.weights or args.img_size is not None:
        raise ConfigError("--weights and --img-size belong to --model timm:NAME; a run directory has its own")
    if not args.target:
        raise ConfigError("name a run directory (RUN_OR_EXPORT) or a timm model (--model timm:NAME --weights FILE)")
    if args.evaluate:
        if args.images or args.method:
            raise ConfigError("--evaluate reads the run's test set; drop IMAGES and --method (use --methods)")
        if args.num_images < 1:
            raise ConfigError(f"--num-images must be at least 1, got {args.num_images}")


def _holds_a_model(path: Path) -> bool:
    """A run directory, an export folder or a checkpoint, not an image or a folder of images."""
    from vitlab.rundir import CHECKPOINTS_DIR, CONFIG_FILE, EXPORT_CONFIG_FILE

    markers = (CONFIG_FILE, EXPORT_CONFIG_FILE, CHECKPOINTS_DIR)
    return path.suffix == ".ckpt" or (path.is_dir() and any((path / marker).exists() for marker in markers))


@command("explain", "explanation maps (attention, rollout, LRP, Grad-CAM, integrated gradients) and their faithfulness")
def _explain(p: argparse.ArgumentParser) -> Runner:
    p.add_argument(
        "target", nargs="?", metavar="RUN_OR_EXPORT", help="run directory, its export/ folder, or a .ckpt file"
    )
    p.add_argument("images", nargs="*", metavar="IMAGES", help="image files or folders of images")
    p.add_argument("--method", choices=METHOD_NAMES, help="the explanation method (for IMAGES)")
    p.add_argument("--target", dest="target_class", type=int, help="class to explain (default: the predicted one)")
    p.add_argument("--out", help="output folder (IMAGES: required; --evaluate: default RUN/explain)")
    p.add_argument("--evaluate", action="store_true", help="deletion/insertion AUC, sanity check, conservation, time")
    p.add_argument("--num-images", type=int, default=32, help="test images for --evaluate (default 32)")
    p.add_argument(
        "--methods",
        nargs="+",
        choices=METHOD_NAMES,
        help="methods for --evaluate (default: the overview six that apply)",
    )
    p.add_argument(
        "--class-names",
        help="comma-separated class names for the captions, where the run stored none (e.g. an npz without names)",
    )
    p.add_argument("--force", action="store_true", help="replace existing output files")
    p.add_argument("--model", help="timm:NAME, a timm model built offline (instead of RUN_OR_EXPORT; needs --weights)")
    p.add_argument("--weights", help="the --model's weights: a local .safetensors or .pth file")
    p.add_argument("--img-size", type=int, help="the --model's input size (default: its pretrained config's)")

    return _run


def _run(args: argparse.Namespace, overrides: list[str]) -> int:
    from vitlab.errors import ConfigError

    refuse_overrides("explain", overrides)
    names = [n.strip() for n in args.class_names.split(",")] if args.class_names else None
    if names is not None and not all(names):
        raise ConfigError(f"--class-names has an empty name: {args.class_names!r}; separate names by commas")
    _check_target(args)
    if args.evaluate:
        from vitlab.explain.run import evaluate_run, evaluation_table

        results = evaluate_run(
            args.target,
            images=args.num_images,
            methods=args.methods,
            out_dir=args.out,
            force=args.force,
            class_names=names,
        )
        print(evaluation_table(results))
        return 0
    if not args.images or not args.method or not args.out:
        raise ConfigError("name IMAGES, --method and --out (or pass --evaluate to measure the methods)")
    return _explain_images(args, names)


def _explain_images(args: argparse.Namespace, names: list[str] | None) -> int:
    """``vitlab explain TARGET IMAGES --method M --out DIR``: an overlay per readable image and the maps."""
    from vitlab.errors import ConfigError
    from vitlab.evaluation.predict import image_files
    from vitlab.explain.run import explain_files

    files = list(image_files(args.images))
    if not files:
        raise ConfigError(f"no image files in {' '.join(args.images)}")
    skipped: list[Path] = []
    written = explain_files(
        args.target,
        files,
        method=args.method,
        out_dir=args.out,
        target_class=args.target_class,
        force=args.force,
        class_names=names,
        on_error=skip_unreadable(skipped),
        weights=args.weights,
        img_size=args.img_size,
    )
    print(f"written: {len(written) - 1} overlays and {written[-1]}")
    if skipped:
        print(f"{len(skipped)} of {len(files)} files skipped", file=sys.stderr)
    return 0
