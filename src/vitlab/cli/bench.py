"""``vitlab bench``: training-step and inference throughput, FLOPs, MFU and peak memory of a preset, next to timm.

Examples::

    vitlab bench vit_tiny img_size=32 patch_size=4 num_classes=10 --batch-size 32 --vs timm
    vitlab bench vitcae_small img_size=32 patch_size=4 trainer.precision=bf16-mixed --vs timm --out bench.json
    vitlab bench vit_small --threads 2 --repeats 9 --no-memory
    vitlab bench vit_base img_size=224 patch_size=16 --device cuda trainer.precision=bf16-mixed trainer.compile=true

Model options are bare ``key=value``; how ours trains is ``vitlab fit``'s own options, dotted and checked by the same
dataclasses (:data:`FROM_FIT`). Measurements alternate between the networks and a matmul peak in one process (see
``docs/benchmarks.md``).
"""

from __future__ import annotations

import argparse
import functools
from pathlib import Path

from vitlab.cli.registry import Runner, command
from vitlab.jsonio import strict_dumps


@command("bench", "training/inference throughput, FLOPs, MFU and peak memory of a model, optionally next to timm")
def _bench(p: argparse.ArgumentParser) -> Runner:
    p.add_argument(
        "model",
        help="registered preset, e.g. vit_tiny; then model options as key=value (img_size=32) and vitlab fit's "
        f"options of the step ({', '.join(f'{s}.{k}' for s, keys in FROM_FIT.items() for k in keys)})",
    )
    p.add_argument("--batch-size", type=int, default=64)
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


#: ``vitlab bench`` options passed to :func:`vitlab.bench.run.bench` as they are
_AS_GIVEN = ("batch_size", "vs", "repeats", "warmup", "sample_seconds", "matmul_size", "device")
#: ``vitlab fit``'s options that decide how ours trains, which bench takes as fit does (``trainer.compile=true``):
#: section -> its keys, each a keyword of :func:`vitlab.bench.run.bench`. With ``trainer.compile`` ours is also timed
#: eager (and, with ``--vs timm``, timm eager and ``torch.compile(timm)``); with ``trainer.grad_checkpointing``, ours
#: without it beside.
FROM_FIT = {
    "trainer": ("precision", "compile", "compile_mode", "compile_backend", "grad_checkpointing"),
    "optim": ("fused",),
}


def fit_options(overrides: dict) -> dict:
    """The keywords of :func:`vitlab.bench.run.bench` that the ``trainer.*`` and ``optim.*`` sections of ``overrides``
    (taken out of it) set, each checked by fit's own dataclass; a key bench does not use is a ConfigError."""
    from vitlab.config import OptimConfig, TrainerConfig
    from vitlab.config.coerce import from_dict
    from vitlab.errors import ConfigError

    kwargs = {}
    for section, cls in (("trainer", TrainerConfig), ("optim", OptimConfig)):
        values = overrides.pop(section, {})
        built = from_dict(cls, values, section)  # fit's types, checks and suggestions for a typo
        unused = [f"{section}.{key}" for key in values if key not in FROM_FIT[section]]
        if unused:
            taken = ", ".join(f"{s}.{k}" for s, keys in FROM_FIT.items() for k in keys)
            raise ConfigError(f"vitlab bench does not use {', '.join(unused)}; it takes {taken}")
        kwargs |= {key: getattr(built, key) for key in FROM_FIT[section]}
    return kwargs


def _run(p: argparse.ArgumentParser, args: argparse.Namespace, overrides: list[str]) -> int:
    from vitlab.bench.run import bench, format_bench
    from vitlab.config import parse_overrides
    from vitlab.rundir import check_outputs, write_output

    if args.threads < 0:
        p.error(f"--threads must be >= 0, got {args.threads}")
    if args.out:
        check_outputs([args.out], force=args.force)
    model_options = parse_overrides(overrides)
    step = fit_options(model_options)
    result = bench(
        args.model,
        overrides=model_options,
        **step,
        threads=args.threads or None,
        memory=not args.no_memory,
        **{name: getattr(args, name) for name in _AS_GIVEN},
    )
    print(format_bench(result))
    if args.out:
        out = write_output(Path(args.out), strict_dumps(result, indent=2), force=True)
        print(f"wrote {out}")
    return 0
