"""``vitlab probe``: the CET-ViT v4 model card's diagnostics ("Reproduce the diagnostics"), for any model of the
project.

Examples::

    vitlab probe gradients --config cet_vit/digits                 # exit code 1 if a parameter gets no gradient
    vitlab probe gradients --config vit/digits model.depth=2 data.batch_size=16
    vitlab probe gradients runs/cet-cifar10-cpu-...                # the run's config and trained weights
    vitlab probe init-distance runs/cet-cifar10-cpu-... --seeds 5  # exit code 1 if a tensor looks untrained

A family adds its own probes with :func:`probe` (CET-ViT's ``reversibility`` and ``slot-k``).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from vitlab.cli.registry import Runner, Setup, command, refuse_overrides
from vitlab.jsonio import strict_dumps

#: probe name -> (setup of its options, returning its runner; help): the core's and those the families add
PROBES: dict[str, tuple[Setup, str]] = {}


def probe(name: str, help_: str) -> Callable[[Setup], Setup]:
    """Register a ``vitlab probe NAME`` sub-command (decorates its setup, as :func:`vitlab.cli.registry.command`)."""
    return command(name, help_, PROBES)


def add_json_option(p: argparse.ArgumentParser, what: str = "report") -> None:
    p.add_argument("--json", metavar="PATH", help=f"write the {what} as JSON to PATH ('-': print it instead)")
    p.add_argument("--force", action="store_true", help="replace an existing --json file (or --out files)")


def check_json(args: argparse.Namespace) -> None:
    """Refuse an existing ``--json`` file before any work (unless ``--force``)."""
    from vitlab.rundir import check_outputs

    if args.json and args.json != "-":
        check_outputs([args.json], force=args.force)


def write_json(report: Any, destination: str | None, text: str) -> None:
    """Print ``text``, or the JSON when ``destination`` is ``-``; also write the JSON to a file ``destination``."""
    from vitlab.rundir import write_output

    if destination == "-":
        print(json.dumps(report, indent=2))
        return
    print(text)
    if destination:
        path = write_output(destination, strict_dumps(report, indent=2), force=True)  # checked by check_json
        print(f"written: {path}")


# -------------------------------------------------------------------------------------------------------------------
@probe("gradients", "every parameter with no or an all-zero gradient under the training loss")
def _gradients(p: argparse.ArgumentParser) -> Runner:
    p.add_argument("target", nargs="?", help="run directory: its config and its trained weights (instead of --config)")
    p.add_argument("--config", "-c", help="YAML file or packaged config name; the model is freshly initialised")
    add_json_option(p)

    def run(args: argparse.Namespace, overrides: list[str]) -> int:
        check_json(args)
        import lightning.pytorch as pl

        from vitlab.config import build_config, to_dict
        from vitlab.data import build_datamodule
        from vitlab.diagnostics.probes import format_gradient_flow, gradient_flow
        from vitlab.errors import ConfigError
        from vitlab.export import load_model
        from vitlab.models.builder import create_model
        from vitlab.rundir import RunDir
        from vitlab.training.preflight import data_info, model_kwargs_for
        from vitlab.training.run import build_task

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
        write_json(report, args.json, f"{cfg.model['name']}: {format_gradient_flow(report)}")
        return 1 if report["dead"] else 0

    return run


@probe("init-distance", "parameter tensors whose statistics match a fresh initialisation")
def _init_distance(p: argparse.ArgumentParser) -> Runner:
    p.add_argument("target", help="run directory, its export/ folder, or a .ckpt file")
    p.add_argument("--seeds", type=int, default=5, help="fresh initialisations to compare with (default 5)")
    p.add_argument("--k", type=float, default=3.0, help="flag within k seed-spreads of a fresh init (default 3)")
    add_json_option(p)

    def run(args: argparse.Namespace, overrides: list[str]) -> int:
        check_json(args)
        import torch

        from vitlab.diagnostics.probes import format_init_distance, init_distance
        from vitlab.export import load_model
        from vitlab.models.builder import create_model

        refuse_overrides("probe init-distance", overrides)
        model = load_model(args.target)

        def make_fresh(seed: int) -> torch.nn.Module:
            torch.manual_seed(seed)
            return create_model(model.preset, **model.init_kwargs)

        report = init_distance(model, make_fresh, n_seeds=args.seeds, k=args.k)
        report["model"] = model.preset
        write_json(report, args.json, f"{model.preset}: {format_init_distance(report)}")
        return 1 if report["indistinguishable"] else 0

    return run


@command("probe", "diagnostics: gradient flow, distance from init, and the probes the families add")
def _probe(p: argparse.ArgumentParser) -> Runner:
    sub = p.add_subparsers(dest="probe", required=True, metavar="PROBE")
    runners = {
        name: setup(sub.add_parser(name, help=help_, description=help_)) for name, (setup, help_) in PROBES.items()
    }

    def run(args: argparse.Namespace, overrides: list[str]) -> int:
        return runners[args.probe](args, overrides)

    return run
