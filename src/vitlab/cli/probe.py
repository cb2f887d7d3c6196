"""``vitlab probe``: the CET-ViT v4 model card's diagnostics ("Reproduce the diagnostics"), for any model of the
project.

Examples::

    vitlab probe gradients --config cet_vit/digits                 # exit code 1 if a parameter gets no gradient
    vitlab probe gradients --config vit/digits model.depth=2 data.batch_size=16
    vitlab probe gradients runs/cet-cifar10-cpu-...                # the run's config and trained weights
    vitlab probe init-distance runs/cet-cifar10-cpu-... --seeds 5  # exit code 1 if a tensor looks untrained
    vitlab probe reversibility --json -                            # the card's reading table, as JSON
    vitlab probe slot-k runs/cet-cifar10-cpu-... --num-images 8    # -> <run>/probes/slot_k.json, segments.png
    vitlab probe slot-k runs/cet-cifar10-cpu-... --data path=/data/cifar10.npz eval_batch_size=256
    vitlab probe slot-k RUN_DIR --class-names airplane automobile bird cat deer dog frog horse ship truck
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from vitlab.cli.registry import Runner, command
from vitlab.jsonio import strict_dumps

SLOT_K_FILE = "slot_k.json"
SEGMENTS_FILE = "segments.png"


def _add_json_option(p: argparse.ArgumentParser, what: str = "report") -> None:
    p.add_argument("--json", metavar="PATH", help=f"write the {what} as JSON to PATH ('-': print it instead)")
    p.add_argument("--force", action="store_true", help="replace an existing --json file (or --out files)")


def _check_json(args: argparse.Namespace) -> None:
    """Refuse an existing ``--json`` file before any work (unless ``--force``)."""
    from vitlab.rundir import check_outputs

    if args.json and args.json != "-":
        check_outputs([args.json], force=args.force)


def _write_json(report: Any, destination: str | None, text: str) -> None:
    """Print ``text``, or the JSON when ``destination`` is ``-``; also write the JSON to a file ``destination``."""
    from vitlab.rundir import write_output

    if destination == "-":
        print(json.dumps(report, indent=2))
        return
    print(text)
    if destination:
        path = write_output(destination, strict_dumps(report, indent=2), force=True)  # checked by _check_json
        print(f"written: {path}")


def _refuse_overrides(name: str, overrides: list[str]) -> None:
    from vitlab.errors import ConfigError

    if overrides:
        raise ConfigError(f"vitlab probe {name} takes no config overrides, got {' '.join(overrides)}")


# -------------------------------------------------------------------------------------------------------------------
def _gradients(p: argparse.ArgumentParser) -> Runner:
    p.add_argument("target", nargs="?", help="run directory: its config and its trained weights (instead of --config)")
    p.add_argument("--config", "-c", help="YAML file or packaged config name; the model is freshly initialised")
    _add_json_option(p)

    def run(args: argparse.Namespace, overrides: list[str]) -> int:
        _check_json(args)
        import lightning.pytorch as pl

        from vitlab.config import build_config, to_dict
        from vitlab.data import build_datamodule
        from vitlab.diagnostics.probes import format_gradient_flow, gradient_flow
        from vitlab.errors import ConfigError
        from vitlab.export import load_model
        from vitlab.models.builder import create_model
        from vitlab.rundir import RunDir
        from vitlab.training.run import build_task, data_info, model_kwargs_for

        target = args.target
        if target is not None and "=" in target and not Path(target).exists():
            overrides, target = [target, *overrides], None  # a key=value override, not a run directory
        if target is not None and args.config:
            raise ConfigError("pass either a run directory or --config, not both")
        cfg = RunDir(target).config(overrides) if target is not None else build_config(args.config, overrides)
        pl.seed_everything(cfg.run.seed, verbose=False)
        dm = build_datamodule(cfg.data)
        dm.prepare_data()
        dm.setup("fit")
        info = data_info(dm)
        if target is not None:
            model = load_model(target)
            kwargs = model.init_kwargs
        else:
            kwargs = model_kwargs_for(cfg, info)
            model = create_model(cfg.model["name"], **kwargs)
        task = build_task(cfg, model, {"config": to_dict(cfg), "model_kwargs": kwargs, "data_info": info})
        report = gradient_flow(task, next(iter(dm.train_dataloader())))
        report["model"] = cfg.model["name"]
        _write_json(report, args.json, f"{cfg.model['name']}: {format_gradient_flow(report)}")
        return 1 if report["dead"] else 0

    return run


def _init_distance(p: argparse.ArgumentParser) -> Runner:
    p.add_argument("target", help="run directory, its export/ folder, or a .ckpt file")
    p.add_argument("--seeds", type=int, default=5, help="fresh initialisations to compare with (default 5)")
    p.add_argument("--k", type=float, default=3.0, help="flag within k seed-spreads of a fresh init (default 3)")
    _add_json_option(p)

    def run(args: argparse.Namespace, overrides: list[str]) -> int:
        _check_json(args)
        import torch

        from vitlab.diagnostics.probes import format_init_distance, init_distance
        from vitlab.export import load_model
        from vitlab.models.builder import create_model

        _refuse_overrides("init-distance", overrides)
        model = load_model(args.target)

        def make_fresh(seed: int) -> torch.nn.Module:
            torch.manual_seed(seed)
            return create_model(model.preset, **model.init_kwargs)

        report = init_distance(model, make_fresh, n_seeds=args.seeds, k=args.k)
        report["model"] = model.preset
        _write_json(report, args.json, f"{model.preset}: {format_init_distance(report)}")
        return 1 if report["indistinguishable"] else 0

    return run


def _reversibility(p: argparse.ArgumentParser) -> Runner:
    p.add_argument("--tokens", type=int, default=256, help="micro tokens N (card: 256)")
    p.add_argument("--slots", type=int, default=32, help="macro slots K_max (card: 32)")
    p.add_argument("--batch", type=int, default=16, help="random matrices averaged per row")
    p.add_argument("--seed", type=int, default=0)
    _add_json_option(p, "table")

    def run(args: argparse.Namespace, overrides: list[str]) -> int:
        _check_json(args)
        from vitlab.diagnostics.probes import format_reversibility_table, reversibility_table

        _refuse_overrides("reversibility", overrides)
        rows = reversibility_table(args.tokens, args.slots, args.batch, args.seed)
        _write_json(rows, args.json, format_reversibility_table(rows))
        return 0

    return run


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

    def run(args: argparse.Namespace, overrides: list[str]) -> int:
        import itertools

        from vitlab.cli.evaluate import data_overrides
        from vitlab.data import denormalize, normalize
        from vitlab.diagnostics.probes import collect_assignments, format_slot_usage, slot_usage_summary
        from vitlab.diagnostics.segments import save_segment_maps
        from vitlab.errors import ConfigError
        from vitlab.evaluation.evaluate import load_evaluation_target
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
            pixels = denormalize(collected["images"], target.mean, target.std)
            path = save_segment_maps(
                out / SEGMENTS_FILE, pixels, collected["S"], tuple(model.grid_size), titles=titles, alpha=args.alpha
            )
            print(f"written: {path}")
        return 0

    return run


@command("probe", "diagnostics: gradient flow, distance from init, reversibility table, slot-usage K + segment maps")
def _probe(p: argparse.ArgumentParser) -> Runner:
    sub = p.add_subparsers(dest="probe", required=True, metavar="PROBE")
    probes = {
        "gradients": (_gradients, "every parameter with no or an all-zero gradient under the training loss"),
        "init-distance": (_init_distance, "parameter tensors whose statistics match a fresh initialisation"),
        "reversibility": (_reversibility, "the CET-ViT card's reversibility table on synthetic assignments"),
        "slot-k": (_slot_k, "slot-usage K per image and class on the test set, and segment maps of S"),
    }
    runners = {
        name: setup(sub.add_parser(name, help=help_, description=help_)) for name, (setup, help_) in probes.items()
    }

    def run(args: argparse.Namespace, overrides: list[str]) -> int:
        return runners[args.probe](args, overrides)

    return run
