"""``vitlab bench``: training-step and inference throughput, FLOPs, MFU and peak memory of a preset, next to timm.

Examples::

    vitlab bench vit_tiny img_size=32 patch_size=4 num_classes=10 --batch-size 32 --vs timm
    vitlab bench vitcae_small img_size=32 patch_size=4 --precision bf16-mixed --vs timm --out bench.json
    vitlab bench vit_small --threads 2 --repeats 9 --no-memory
    vitlab bench vit_base img_size=224 patch_size=16 --device cuda --precision bf16-mixed --compile --vs timm

Measurements alternate between the networks and a matmul peak in one process (see ``docs/benchmarks.md``).
"""

from __future__ import annotations

import argparse
import functools
from pathlib import Path

from vitlab.cli.registry import Runner, command
from vitlab.jsonio import strict_dumps


@command("bench", "training/inference throughput, FLOPs, MFU and peak memory of a model, optionally next to timm")
def _bench(p: argparse.ArgumentParser) -> Runner:
    p.add_argument("model", help="registered preset, e.g. vit_tiny; then model options as key=value (img_size=32)")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument(
        "--precision",
        default="auto",
        choices=["auto", "32-true", "bf16-mixed"],
        help="auto (the default, as vitlab fit's): bf16-mixed where the device computes bf16 natively, else 32-true",
    )
    p.add_argument(
        "--compile",
        action="store_true",
        help="compile ours (trainer.compile: the network whole with its loss) and also time it eager; with --vs timm, "
        "timm eager and torch.compile(timm)",
    )
    p.add_argument(
        "--compile-mode",
        default="auto",
        help="torch.compile mode: auto (the default, trainer.compile_mode's: timed once per machine on CUDA, default "
        "elsewhere), default, reduce-overhead, max-autotune, max-autotune-no-cudagraphs",
    )
    p.add_argument("--compile-backend", default="inductor", help="torch.compile backend (aot_eager: trace only)")
    p.add_argument(
        "--fused",
        default="auto",
        choices=["auto", "true", "false"],
        help="our AdamW's optim.fused (timm's: torch's default)",
    )
    p.add_argument(
        "--grad-checkpointing",
        action="store_true",
        help="ours with gradient checkpointing (trainer.grad_checkpointing); the same network without, alternating",
    )
    p.add_argument("--vs", choices=["timm"], help="also time timm's network of the same shape, alternating")
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads (0: leave torch's default)")
    p.add_argument("--repeats", type=int, default=5, help="measurement rounds (median and spread over them)")
    p.add_argument("--warmup", type=int, default=2, help="untimed calls of each network before the rounds")
    p.add_argument("--sample-seconds", type=float, default=0.5, help="least seconds of one timed sample")
    p.add_argument("--matmul-size", type=int, default=1024, help="side of the square matmul of the FLOP/s peak")
    p.add_argument("--device", default="cpu", help="torch device, e.g. cpu or cuda")
    p.add_argument("--no-memory", action="store_true", help="skip the peak-memory measurement")
    p.add_argument("--out", help="write the JSON record here")
    p.add_argument("--force", action="store_true", help="replace an existing --out file (refused without it)")

    return functools.partial(_run, p)


#: ``vitlab bench`` options passed to :func:`vitlab.bench.bench` as they are
_AS_GIVEN = (
    "batch_size", "precision", "compile", "compile_mode", "compile_backend", "vs", "repeats", "warmup",
    "sample_seconds", "matmul_size", "device", "grad_checkpointing",
)  # fmt: skip


def _run(p: argparse.ArgumentParser, args: argparse.Namespace, overrides: list[str]) -> int:
    from vitlab.bench import bench, format_bench
    from vitlab.config import parse_overrides
    from vitlab.rundir import check_outputs, write_output

    if args.threads < 0:
        p.error(f"--threads must be >= 0, got {args.threads}")
    if args.out:
        check_outputs([args.out], force=args.force)
    result = bench(
        args.model,
        overrides=parse_overrides(overrides),
        fused={"true": True, "false": False}.get(args.fused, args.fused),
        threads=args.threads or None,
        memory=not args.no_memory,
        **{name: getattr(args, name) for name in _AS_GIVEN},
    )
    print(format_bench(result))
    if args.out:
        out = write_output(Path(args.out), strict_dumps(result, indent=2), force=True)
        print(f"wrote {out}")
    return 0
