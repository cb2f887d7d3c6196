"""Does the data path keep the step fed? A ``vitlab fit`` epoch against ``vitlab bench``'s step of the same model.

Per round: one epoch of ``vitlab fit --config CONFIG`` on ``--limit-train`` images (validation and test cut to one
batch, no report or export), then ``vitlab.bench.run.bench`` of the same preset, overrides, batch size and precision,
one thread each; the rounds alternate, so a change of the machine's load reaches both. From the fit's
``timing.json``: the training time per batch (``time/step_total_s + time/data_wait_total_s``: the steps and the
waits for the data loader) and the step alone; from the bench, the median wall-clock step per batch. The ratio
``fit_train_per_batch / bench_step_per_batch`` is what the data path (augmentation, collation, Lightning's
per-batch work) adds to the step; within 1.10 the data path is not the bottleneck.

    python -m benchmarks.micro.fit_vs_bench --config compare/cifar10_p4_vit --data ../shared/datasets/cifar10.npz

Writes ``benchmarks/results/micro/fit_vs_bench_<device>_<date>.json`` (or ``--out``) with the per-round values,
the command, git revision, lscpu and the load average.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from vitlab.atomic import atomic_write_text
from vitlab.bench.run import bench
from vitlab.config import build_config
from vitlab.environment import environment
from vitlab.jsonio import strict_dumps

if __package__ in (None, ""):  # run as a file: the suite is imported from the repository root
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.naming import results_path


def fit_epoch(config: str, data: str, limit: int, run_dir: Path, extra: list[str]) -> dict[str, Any]:
    """One training epoch of ``vitlab fit``; its ``timing.json`` and the batches it ran."""
    command = [
        sys.executable,
        "-m",
        "vitlab.cli.main",
        "fit",
        "--config",
        config,
        f"data.path={data}",
        f"data.limit_train={limit}",
        "trainer.max_epochs=1",
        "trainer.limit_val_batches=1",
        "trainer.limit_test_batches=1",
        "trainer.enable_progress_bar=false",
        "run.report=false",
        "run.export=false",
        f"run.dir={run_dir}",
        *extra,
    ]
    subprocess.run(command, check=True, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True)
    timing = json.loads((run_dir / "timing.json").read_text())
    env = json.loads((run_dir / "env.json").read_text())
    return {"timing": timing, "precision": (env.get("precision") or {}).get("precision"), "command": command}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="compare/cifar10_p4_vit")
    parser.add_argument("--data", required=True, help="the CIFAR-10 npz (or what the config's data.name reads)")
    parser.add_argument("--limit-train", type=int, default=2560)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5, help="bench rounds per fit round")
    parser.add_argument("--out", type=Path, help="default: benchmarks/results/micro/fit_vs_bench_<device>_<date>.json")
    parser.add_argument("overrides", nargs="*", help="config overrides for both (e.g. trainer.precision=32-true)")
    args = parser.parse_args()
    args.out = args.out or results_path("micro", "fit_vs_bench")
    if args.out.exists():
        raise SystemExit(f"error: {args.out} exists; choose another --out")
    cfg = build_config(args.config, [f"data.path={args.data}", *args.overrides])
    model = dict(cfg.model)
    name = model.pop("name")
    batch = cfg.data.batch_size
    batches = math.ceil(args.limit_train / batch)
    load_before = os.getloadavg()
    rounds = []
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            fit = fit_epoch(args.config, args.data, args.limit_train, Path(tmp) / f"round{r}", args.overrides)
            timing = fit["timing"]
            result = bench(
                name,
                overrides=model,
                batch_size=batch,
                precision=fit["precision"] or "auto",
                repeats=args.repeats,
                memory=False,
            )
            step = result["networks"]["ours"]["train"]["wall"]
            bench_per_batch = sorted(step["seconds_per_batch"])[len(step["seconds_per_batch"]) // 2]
            fit_train = (timing["time/step_total_s"] + timing["time/data_wait_total_s"]) / batches
            fit_step = timing["time/step_total_s"] / batches
            rounds.append(
                {
                    "fit_train_per_batch_s": fit_train,
                    "fit_step_per_batch_s": fit_step,
                    "fit_data_wait_share": timing["data_wait_share"],
                    "bench_step_per_batch_s": bench_per_batch,
                    "bench_seconds_per_batch": step["seconds_per_batch"],
                    "fit_train_over_bench": fit_train / bench_per_batch,
                    "fit_step_over_bench": fit_step / bench_per_batch,
                    "precision": result["settings"]["precision"],
                    "objective": result["networks"]["ours"]["objective"],
                }
            )
            print(
                f"round {r}: fit {fit_train:.3f} s/batch (step {fit_step:.3f}, data wait "
                f"{timing['data_wait_share']:.1%} of the epoch), bench {bench_per_batch:.3f} s/batch: "
                f"fit / bench {fit_train / bench_per_batch:.3f}"
            )
    ratios = [r["fit_train_over_bench"] for r in rounds]
    lscpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    record = {
        "experiment": "fit_vs_bench",
        "config": args.config,
        "model": name,
        "model_kwargs": model,
        "batch_size": batch,
        "limit_train": args.limit_train,
        "batches": batches,
        "rounds": rounds,
        "fit_train_over_bench": {"mean": sum(ratios) / len(ratios), "values": ratios},
        "within_10_percent": all(v <= 1.10 for v in ratios),
        "command": [sys.argv[0], *sys.argv[1:]],
        "environment": environment(),
        "lscpu": lscpu,
        "load_average": {"before": list(load_before), "after": list(os.getloadavg())},
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(args.out, strict_dumps(record, indent=1) + "\n")
    print(f"fit / bench over {len(ratios)} rounds: {', '.join(f'{v:.3f}' for v in ratios)} -> {args.out}")


if __name__ == "__main__":
    main()
