"""``vitlab generate``: ViTCAE's four generative tasks (the paper's "four distinct tasks") and the linear probe on
a finished run.

Examples::

    vitlab generate runs/vitcae-digits-20261130-101500
    vitlab generate runs/vitcae-cifar10-20261130-101500 --device cuda --out grids/ --max-images 2000
    vitlab generate runs/vitcae-mnist-20261130-101500 data.path=/data/mnist.npz   # data moved since training
"""

from __future__ import annotations

import argparse
from pathlib import Path

from vitlab.cli.registry import Runner, command


@command("generate", "ViTCAE reconstruction, class-conditional samples, interpolation, inpainting and linear probe")
def _generate(p: argparse.ArgumentParser) -> Runner:
    p.add_argument("run_dir", help="run directory of a ViTCAE run (its export/ holds the model)")
    p.add_argument("--out", help="output folder for the grids and metrics.json (default: RUN_DIR/generate)")
    p.add_argument("--device", default="cpu", help="torch device, e.g. cpu or cuda")
    p.add_argument("--max-images", type=int, help="use at most this many training and test images each")
    p.add_argument("--seed", type=int, help="seed of every random draw (default: the run's seed)")
    p.add_argument("--force", action="store_true", help="replace the grids and metrics.json in an --out folder")

    def run(args: argparse.Namespace, overrides: list[str]) -> int:
        from vitlab.config import check_seed
        from vitlab.data import build_datamodule
        from vitlab.errors import ConfigError
        from vitlab.export import load_model
        from vitlab.families.vitcae.generative import run_generative_tasks
        from vitlab.families.vitcae.pieces import GRID_FILES
        from vitlab.models.protocols import GenerativeModel
        from vitlab.rundir import GENERATE_DIR, GENERATE_METRICS_FILE, RunDir, check_outputs

        if args.max_images is not None and args.max_images < 2:
            p.error(f"--max-images must be at least 2, got {args.max_images}")
        if args.seed is not None:
            check_seed(args.seed, "--seed")
        if args.out:  # the run's own generate/ is replaced; a folder the user names keeps its files unless --force
            files = [*GRID_FILES.values(), GENERATE_METRICS_FILE]
            check_outputs([Path(args.out) / file for file in files], force=args.force)
        run_dir = Path(args.run_dir)
        cfg = RunDir(run_dir).config(overrides)
        model = load_model(run_dir, map_location=args.device)  # export/, else best.ckpt, else last.ckpt
        if not isinstance(model, GenerativeModel):
            raise ConfigError(
                f"vitlab generate needs a ViTCAE run, but {run_dir} holds a {type(model).__name__} "
                f"({cfg.model['name']}); train one with a vitcae_* model"
            )
        out = Path(args.out) if args.out else run_dir / GENERATE_DIR
        seed = cfg.run.seed if args.seed is None else args.seed
        metrics = run_generative_tasks(
            model, build_datamodule(cfg.data), out, seed=seed, device=args.device, max_images=args.max_images
        )
        from vitlab.report.collect import fmt

        width = max(len(name) for name in metrics)
        print("\n".join(f"{name:<{width}}  {fmt(value)}" for name, value in metrics.items()))
        print(f"metrics: {out / GENERATE_METRICS_FILE}")
        for task, file in GRID_FILES.items():
            print(f"{task} grid: {out / file}")
        return 0

    return run
