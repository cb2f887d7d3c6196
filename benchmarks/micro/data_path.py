"""What the training data path costs: torchvision's per-image augmentation against :class:`BatchAugment`.

Two measurements, in alternating rounds so that a change of the machine's load reaches every arm:

1. **The loader alone.** The training loader of ``--config`` (its augmentation: for the comparison protocol pad-4
   crop, flip, AutoAugment, RandomErasing and MixUp) over ``--batches`` batches with ``data.augment.batched``
   false (torchvision's transforms image by image in the dataset) and true (the batch at once in the collate
   function), one thread, ``num_workers=0``: the seconds per batch, wall clock and this process's CPU time (the
   work itself, which a busy machine's time-slicing does not inflate), and their ratios. From one random state both
   give the same batches bit for bit (``tests/data/test_batch_augment.py``), so this is a pure speed comparison.
2. **A fit epoch** (``--fit``): one epoch of ``vitlab fit --config CONFIG`` on ``--limit-train`` images per arm
   (``batched=false``, ``batched=true``, and ``batched=true`` with ``data.num_workers=1``, the batch prepared in a
   worker process while the step runs): from ``timing.json``, the share of the epoch spent waiting for data and
   the training time per batch. A worker helps only where a core is free for it; the load average is recorded.

    python -m benchmarks.micro.data_path --data ../shared/datasets/cifar10.npz --fit

Writes ``benchmarks/results/micro/data_path_<device>_<date>.json`` (or ``--out``) with the per-round values, the
command, git revision, lscpu and the load average.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from vitlab.atomic import atomic_write_text
from vitlab.config import build_config
from vitlab.data import build_datamodule
from vitlab.environment import environment
from vitlab.jsonio import strict_dumps

if __package__ in (None, ""):  # run as a file: the suite is imported from the repository root
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.micro.fit_vs_bench import fit_epoch
from benchmarks.naming import results_path

FIT_ARMS = {
    "per_image": ["data.augment.batched=false"],
    "batched": ["data.augment.batched=true"],
    "batched_worker": ["data.augment.batched=true", "data.num_workers=1"],
}


def loader_seconds_per_batch(
    config: str, data: str, batched: bool, batches: int, overrides: list[str]
) -> tuple[float, float]:
    """Median seconds per batch of the training loader (dataset fetch, augmentation, collation), num_workers=0:
    ``(wall clock, this process's CPU time)``."""
    cfg = build_config(config, [f"data.path={data}", f"data.augment.batched={str(batched).lower()}", *overrides])
    cfg.data.num_workers = 0
    datamodule = build_datamodule(cfg.data)
    datamodule.setup("fit")
    torch.manual_seed(0)
    iterator = iter(datamodule.train_dataloader())
    next(iterator)  # the first batch pays one-time costs
    wall, cpu = [], []
    for _ in range(batches):
        start, start_cpu = time.perf_counter(), time.process_time()
        try:
            next(iterator)
        except StopIteration:
            break
        wall.append(time.perf_counter() - start)
        cpu.append(time.process_time() - start_cpu)
    return statistics.median(wall), statistics.median(cpu)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="compare/cifar10_p4_swin")
    parser.add_argument("--data", required=True, help="the CIFAR-10 npz (or what the config's data.name reads)")
    parser.add_argument("--batches", type=int, default=30, help="loader batches timed per arm and round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--fit", action="store_true", help="also one fit epoch per arm and round")
    parser.add_argument("--limit-train", type=int, default=2560)
    parser.add_argument("--out", type=Path, help="default: benchmarks/results/micro/data_path_<device>_<date>.json")
    parser.add_argument("overrides", nargs="*", help="config overrides for every arm")
    args = parser.parse_args()
    args.out = args.out or results_path("micro", "data_path")
    if args.out.exists():
        raise SystemExit(f"error: {args.out} exists; choose another --out")
    torch.set_num_threads(1)
    cfg = build_config(args.config, [f"data.path={args.data}", *args.overrides])
    load_before = os.getloadavg()
    loader_rounds: list[dict[str, float]] = []
    fit_rounds: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            row: dict[str, float] = {}
            for name, batched in (("per_image", False), ("batched", True)):
                wall, cpu = loader_seconds_per_batch(args.config, args.data, batched, args.batches, args.overrides)
                row[f"{name}_s_per_batch"], row[f"{name}_cpu_s_per_batch"] = wall, cpu
            row["per_image_over_batched"] = row["per_image_s_per_batch"] / row["batched_s_per_batch"]
            row["per_image_over_batched_cpu"] = row["per_image_cpu_s_per_batch"] / row["batched_cpu_s_per_batch"]
            loader_rounds.append(row)
            print(
                f"round {r}: loader per image {1e3 * row['per_image_s_per_batch']:.1f} ms/batch "
                f"(CPU {1e3 * row['per_image_cpu_s_per_batch']:.1f}), batched {1e3 * row['batched_s_per_batch']:.1f} "
                f"(CPU {1e3 * row['batched_cpu_s_per_batch']:.1f}): {row['per_image_over_batched']:.2f}x "
                f"(CPU {row['per_image_over_batched_cpu']:.2f}x)"
            )
            if not args.fit:
                continue
            batches = math.ceil(args.limit_train / cfg.data.batch_size)
            fits = {}
            for name, arm in FIT_ARMS.items():
                fit = fit_epoch(
                    args.config, args.data, args.limit_train, Path(tmp) / f"{name}{r}", [*arm, *args.overrides]
                )
                timing = fit["timing"]
                fits[name] = {
                    "data_wait_share": timing["data_wait_share"],
                    "train_per_batch_s": (timing["time/step_total_s"] + timing["time/data_wait_total_s"]) / batches,
                    "step_per_batch_s": timing["time/step_total_s"] / batches,
                    "precision": fit["precision"],
                }
                print(
                    f"round {r}: fit {name}: data wait {timing['data_wait_share']:.1%} of the epoch, "
                    f"{fits[name]['train_per_batch_s']:.3f} s/batch (step {fits[name]['step_per_batch_s']:.3f})"
                )
            fit_rounds.append(fits)
    ratios = [row["per_image_over_batched"] for row in loader_rounds]
    cpu_ratios = [row["per_image_over_batched_cpu"] for row in loader_rounds]
    record = {
        "experiment": "data_path",
        "config": args.config,
        "overrides": args.overrides,
        "augment": dict(vars(cfg.data.augment)),
        "batch_size": cfg.data.batch_size,
        "threads": 1,
        "loader": {
            "rounds": loader_rounds,
            "per_image_over_batched": {"median": statistics.median(ratios), "values": ratios},
            "per_image_over_batched_cpu": {"median": statistics.median(cpu_ratios), "values": cpu_ratios},
        },
        "fit": {"limit_train": args.limit_train, "arms": FIT_ARMS, "rounds": fit_rounds} if args.fit else None,
        "command": [sys.argv[0], *sys.argv[1:]],
        "environment": environment(),
        "lscpu": subprocess.run(["lscpu"], capture_output=True, text=True).stdout,
        "load_average": {"before": list(load_before), "after": list(os.getloadavg())},
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(args.out, strict_dumps(record, indent=1) + "\n")
    print(
        f"loader per image / batched over {len(ratios)} rounds: {', '.join(f'{v:.2f}' for v in ratios)} wall, "
        f"{', '.join(f'{v:.2f}' for v in cpu_ratios)} CPU -> {args.out}"
    )


if __name__ == "__main__":
    main()
