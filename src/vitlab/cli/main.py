"""The ``vitlab`` command.

Examples::

    vitlab fit --config vit/digits                      # train; prints the run directory
    vitlab fit --config vit/mnist data.path=mnist.npz optim.lr=5e-4 --trainer.devices 2
    vitlab fit --config vit/digits --print-config       # show the resolved config and exit
    vitlab fit --resume runs/vit-digits-20261130-101500 # continue from last.ckpt
    vitlab test runs/vit-digits-20261130-101500
    vitlab export runs/vit-digits-20261130-101500/checkpoints/best.ckpt --out exported/
    vitlab list-models 'vit_*'
    vitlab info
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import warnings
from importlib import import_module
from pathlib import Path

from vitlab.cli.registry import COMMANDS, Runner, Setup, command

#: modules whose import registers further sub-commands (each in its own file); the families add theirs
#: (``Family.commands``, read from their declarations, which load no torch)
COMMAND_MODULES: list[str] = [
    "vitlab.cli.evaluate",
    "vitlab.cli.dynamics",
    "vitlab.cli.report",
    "vitlab.cli.bench",
    "vitlab.cli.probe",
    "vitlab.cli.params",
    "vitlab.cli.predict",
    "vitlab.cli.configs",
    "vitlab.cli.explain",
]


# -------------------------------------------------------------------------------------------------------------------
@command("fit", "train a model from a YAML config with dotted overrides")
def _fit(p: argparse.ArgumentParser) -> Runner:
    p.add_argument("--config", "-c", help="YAML file, or a packaged config name such as vit/digits")
    p.add_argument("--print-config", action="store_true", help="print the resolved config and exit")
    p.add_argument("--resume", help="run directory (or .ckpt) to continue from its last.ckpt")

    def run(args: argparse.Namespace, overrides: list[str]) -> int:
        import yaml

        from vitlab.config import build_config
        from vitlab.rundir import RunDir, config_with_overrides

        if args.resume and not args.config:
            from vitlab.export import checkpoint_hparams, read_checkpoint
            from vitlab.training.run_folder import resolve_resume

            run_dir, ckpt = resolve_resume(args.resume)
            if RunDir(run_dir).is_run():
                cfg = RunDir(run_dir).config(overrides)
            else:  # a checkpoint outside its run directory carries the run's config itself
                cfg = config_with_overrides(checkpoint_hparams(read_checkpoint(ckpt))["config"], overrides)
        else:
            cfg = build_config(args.config, overrides)  # every section checked: a typo costs no torch, no folder
            if not args.config:
                print(
                    f"vitlab fit: no --config: the defaults ({cfg.model['name']} on {cfg.data.name}, "
                    f"{cfg.trainer.max_epochs} epochs) where no override is given; `vitlab list-configs` lists recipes",
                    file=sys.stderr,
                )
        from vitlab.training.run import fit, resolved_config

        if args.print_config:
            print(yaml.safe_dump(resolved_config(cfg), sort_keys=False), end="")
            return 0
        run_dir = fit(cfg, resume=args.resume)
        if int(os.environ.get("LOCAL_RANK", 0)) == 0 and int(os.environ.get("NODE_RANK", 0)) == 0:
            _print_summary(run_dir)
        return 0

    return run


#: the share of the training epochs spent waiting for data above which ``vitlab fit`` says so in its summary
DATA_WAIT_NOTE = 0.15


def _print_summary(run_dir: Path) -> None:
    from vitlab.report.collect import fmt
    from vitlab.rundir import EXPORT_DIR, GENERATE_DIR, REPORT_FILE, RunDir

    run = RunDir(run_dir)
    lines = [f"run directory: {run_dir}"]
    metrics = run.test_metrics()
    if metrics is not None:
        lines.append("test: " + ", ".join(f"{k}={fmt(v)}" for k, v in metrics.items()))
    g = run.generate_metrics()
    if g is not None:
        keys = ("reconstruction/psnr", "reconstruction/ssim", "linear_probe/accuracy", "conditional/judge_accuracy")
        lines.append("generate: " + ", ".join(f"{k}={fmt(g[k])}" for k in keys if k in g))
    for name, label in ((EXPORT_DIR, "exported model"), (REPORT_FILE, "report"), (GENERATE_DIR, "generated grids")):
        if (run_dir / name).exists():
            lines.append(f"{label}: {run_dir / name}")
    wait = (run.timing() or {}).get("data_wait_share")
    if wait is not None and wait >= DATA_WAIT_NOTE:
        lines.append(
            f"data: the training waited for batches {wait:.0%} of its epochs (timing.json); where a core is free, "
            "data.num_workers=1 prepares them while the step runs"
        )
    print("\n".join(lines))


def _evaluation_loop(stage: str) -> Setup:
    """``vitlab validate`` / ``vitlab test``: the loop of ``stage`` on a run directory (best.ckpt) or a .ckpt."""

    def setup(p: argparse.ArgumentParser) -> Runner:
        p.add_argument("target", help="run directory or .ckpt")

        def run(args: argparse.Namespace, overrides: list[str]) -> int:
            from vitlab.training.run import evaluate

            print(json.dumps(evaluate(args.target, stage, overrides), indent=2))
            return 0

        return run

    return setup


command("validate", "run the validation loop of a run directory or checkpoint")(_evaluation_loop("validate"))
command("test", "run the test loop of a run directory or checkpoint")(_evaluation_loop("test"))


@command("export", "checkpoint -> model.safetensors + config.json (loadable offline)")
def _export(p: argparse.ArgumentParser) -> Runner:
    p.add_argument("checkpoint", help=".ckpt file or run directory (its best.ckpt)")
    p.add_argument("--out", help="output folder, new or empty (default: <run>/export; required for a .ckpt elsewhere)")
    p.add_argument(
        "--force",
        action="store_true",
        help="write into a folder that holds files: replace only the files an export wrote there",
    )
    from vitlab.cli.formats import write_extra_format
    from vitlab.export_formats import FORMATS, require_libraries

    p.add_argument(
        "--format",
        choices=FORMATS,
        default="safetensors",
        help="also write model.onnx (checked against onnxruntime) or model.pt2 (torch.export); dynamic batch",
    )

    def run(args: argparse.Namespace, overrides: list[str]) -> int:
        from vitlab.claim import RunClaim
        from vitlab.export import default_export_dir, export_model, model_from_checkpoint
        from vitlab.rundir import BEST_CHECKPOINT, locate_checkpoint

        require_libraries(args.format)  # before anything is written
        ckpt = locate_checkpoint(args.checkpoint, prefer=(BEST_CHECKPOINT,))
        model, hp = model_from_checkpoint(ckpt)
        out = Path(args.out) if args.out else default_export_dir(ckpt)
        with RunClaim.beside(out, what="export folder", other="--out"):  # a second export at once is refused
            out = export_model(model, out, {"data": hp["data_info"]}, force=args.force, formats=(args.format,))
            print(f"exported {hp['config']['model']['name']} to {out}")
            write_extra_format(model, out, args.format, hp)
        return 0

    return run


@command("list-models", "list the registered model presets")
def _list_models(p: argparse.ArgumentParser) -> Runner:
    p.add_argument("pattern", nargs="?", default="*", help="glob, e.g. 'vit_*'")

    def run(args: argparse.Namespace, overrides: list[str]) -> int:
        from fnmatch import fnmatch

        from vitlab.config.model import catalogue
        from vitlab.errors import UnknownModelError

        presets = catalogue()
        names = sorted(name for name in presets if fnmatch(name, args.pattern))
        if not names:
            raise UnknownModelError(
                f"no registered model matches {args.pattern!r}; `vitlab list-models` lists them all"
            )
        for name in names:
            print(f"{name:24s} {presets[name][1]}")
        return 0

    return run


@command("info", "versions, hardware and packaged configs")
def _info(p: argparse.ArgumentParser) -> Runner:
    def run(args: argparse.Namespace, overrides: list[str]) -> int:
        from vitlab.config import CONFIG_ROOT
        from vitlab.environment import environment

        env = environment()
        env["configs"] = sorted(str(c.relative_to(CONFIG_ROOT).with_suffix("")) for c in CONFIG_ROOT.rglob("*.yaml"))
        print(json.dumps(env, indent=2))
        return 0

    return run


# -------------------------------------------------------------------------------------------------------------------
def build_parser(argv: list[str] | None = None) -> tuple[argparse.ArgumentParser, dict[str, Runner]]:
    """The ``vitlab`` parser and the runner of each command set up.

    With ``argv``, only the command named in it gets its options (its setup may import what its options need,
    e.g. the export formats); ``vitlab --help`` then loads none of the library. Without ``argv``, every command.
    """
    from vitlab.family import families, load_part
    from vitlab.version import __version__

    for module in COMMAND_MODULES:
        import_module(module)
    for family in families():  # a plug-in's commands that fail to import cost one warning line, not the command
        for module in family.commands:
            load_part(family, lambda module=module: import_module(module), f"its commands {module}")

    parser = argparse.ArgumentParser(
        prog="vitlab",
        description="Train, control and inspect Vision Transformers.",
        epilog="Overrides: key.sub=value or --key.sub value (e.g. optim.lr=1e-3 --trainer.devices 2).",
    )
    parser.add_argument("--version", action="version", version=f"vitlab {__version__}")
    parser.add_argument(
        "--seed",
        type=int,
        dest="global_seed",
        metavar="N",
        help="shortcut for the override run.seed=N (before or after the command)",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    selected = None if argv is None else next((arg for arg in argv if arg in COMMANDS), "")
    runners = {}
    for name, (setup, help_) in COMMANDS.items():
        command_parser = sub.add_parser(name, help=help_, description=help_)
        command_parser.set_defaults(command_parser=command_parser)
        if selected is None or name == selected:
            runners[name] = setup(command_parser)
    return parser, runners


def one_line_warning(message: Warning | str, category: type[Warning], *args: object, **kwargs: object) -> None:
    """A Python warning on a user's terminal as one line, ``vitlab: warning: MESSAGE``, without the library's file,
    line and source line (``warnings.showwarning``'s signature); a category other than a plain ``UserWarning``
    (``FutureWarning``: a name going away) is named after the message."""
    text = str(message).strip().splitlines()[0] if str(message).strip() else category.__name__
    kind = "" if category is UserWarning else f" ({category.__name__})"
    print(f"vitlab: warning: {text}{kind}", file=sys.stderr)


def _place_strays(args: argparse.Namespace, argv: list[str], rest: list[str]) -> list[str]:
    """The overrides of ``rest``, once each positional word after the options has its place: a command that takes
    a list (``vitlab explain RUN --method lrp img.png``) gets it as ``parse_intermixed_args`` places it; any
    other is refused in one line, never read as an override (``vitlab test RUN RUN``)."""
    from vitlab.cli.options import seed_overrides, stray_arguments
    from vitlab.errors import ConfigError

    if not stray_arguments(rest):
        return rest
    command_parser = args.command_parser
    mixed, rest = command_parser.parse_known_intermixed_args(argv[argv.index(args.command) + 1 :])
    vars(args).update(vars(mixed))
    rest = seed_overrides(args.global_seed, rest)
    strays = stray_arguments(rest)
    if strays:
        usage = command_parser.format_usage().strip()
        raise ConfigError(f"unexpected argument {strays[0]!r} ({usage}); a config override looks like key.sub=value")
    return rest


def main(argv: list[str] | None = None) -> int:
    from vitlab.errors import VitlabError

    if argv is None:  # the command itself, not a caller in Python that handles warnings its own way
        warnings.showwarning = one_line_warning
    argv = sys.argv[1:] if argv is None else argv
    parser, runners = build_parser(argv)
    args, rest = parser.parse_known_args(argv)
    from vitlab.cli.options import seed_overrides

    rest = seed_overrides(args.global_seed, rest)
    unknown = [a for a in rest if a.startswith("-") and "." not in a.split("=")[0]]
    if unknown:
        parser.error(f"unrecognized arguments: {' '.join(unknown)} (config overrides look like --section.key value)")
    try:
        return runners[args.command](args, _place_strays(args, argv, rest))
    except (VitlabError, OSError, KeyboardInterrupt) as e:
        from vitlab.rundir import environment_error

        if os.environ.get("VITLAB_DEBUG"):
            raise
        interrupted = isinstance(e, KeyboardInterrupt)
        if isinstance(e, PermissionError) and not isinstance(e, VitlabError):  # the environment, not a bug
            message = f"permission denied: {e.filename}; run where you can write, or change that path's permissions"
        elif isinstance(e, OSError) and not isinstance(e, VitlabError):
            error = environment_error(e, e.filename or "a file")  # a full disk, a read-only folder: one line
            if error is None:
                raise
            message = str(error)
        elif interrupted and not isinstance(e, VitlabError):
            message = "interrupted"
        else:
            message = str(e)
        print(f"vitlab {args.command}: {'stopped' if interrupted else 'error'}: {message}", file=sys.stderr)
        if not interrupted and (e.__cause__ is not None or message != str(e)):
            print("(set VITLAB_DEBUG=1 for the full traceback)", file=sys.stderr)  # only where one was cut short
        return 130 if interrupted else 2


if __name__ == "__main__":
    sys.exit(main())
