"""The training step of the five protocol models (compare/cifar10_p4: patch 4 on 32x32, their dropouts, batch 128)
before and after the CPU speed-ups, measured alternately in one process, one thread.

    OMP_NUM_THREADS=1 python -m benchmarks.micro.cpu_step_speed --out benchmarks/results/cpu_step_speed_<cpu>.json
        [--models cet_vit_nano ...] [--repeats 5] [--batch-size 128]

Four ways to run each model's step (``vitlab.bench.timing.Subject``: forward, cross-entropy, backward, AdamW
fused=auto):

- ``fp32_before``: float32, torch's ``nn.Dropout``, SDPA for vitlab's attention and timm's default (eager softmax)
  for Swin's window attention: the step as it ran before these changes;
- ``fp32_after``: float32 with vitlab's dropout (:mod:`vitlab.layers.dropout`) and the attention path chosen by
  measurement (:mod:`vitlab.layers.attention_path`);
- ``bf16_before``: bf16-mixed with torch's dropout and SDPA (the precision alone);
- ``auto_after``: what ``trainer.precision: auto`` runs on this CPU with the new dropout and attention path.

Every round times each of them (and the matmul peaks of both precisions) once, the order reversing every other
round; the factor of a way over ``fp32_before`` is formed per round. ``limit``: the step's seconds if its counted
FLOPs (matrix products and attention) ran at the round's matmul peak of the precision used, beside the measured
seconds. A dropout section times ``F.dropout`` against vitlab's on the protocol ViT's MLP hidden ``[128, 65, 256]``
and attention probabilities ``[128, 4, 65, 65]``, next to the matching matrix product. A path table times
every attention path (:mod:`vitlab.layers.attention_path`) on the protocol ViT's attention shape, fp32 and bf16,
forward only and with backward, attention dropout off and on. The record holds the per-round seconds, the paths
chosen in the steps (with their timings), the path table, the command, git revision, ``lscpu`` and the load
average before and after.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from vitlab.acceleration.precision import choose_precision
from vitlab.atomic import atomic_write_json
from vitlab.bench.flops import training_flops_per_image
from vitlab.bench.specs import NetworkSpec
from vitlab.bench.timing import Runner, Subject, _Matmul, _measure_alternating, _Task, quartile_summary
from vitlab.layers import attention_path
from vitlab.layers.dropout import Dropout, dropout
from vitlab.rundir import environment

PROTOCOL = dict(patch_size=4, drop_path_rate=0.1, drop_rate=0.05, attn_drop_rate=0.05, img_size=32, num_classes=10)
MODELS = (
    "cet_vit_nano",
    "cet_vit_nano_global",
    "vit_matched_cet_vit_nano",
    "swin_matched_cet_vit_nano",
    "tome_matched_cet_vit_nano",
)
WAYS = ("fp32_before", "fp32_after", "bf16_before", "auto_after")


def torch_dropout(model: nn.Module) -> nn.Module:
    """``model`` with vitlab's :class:`Dropout` modules put back to torch's ``nn.Dropout`` (the step before)."""
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if isinstance(child, Dropout):
                setattr(module, name, nn.Dropout(child.p))
    return model


def forced(path: str | None, run):
    """``run`` with the attention path held to ``path`` (None: chosen by measurement) while it runs."""

    def call() -> None:
        attention_path.force_attention_path(path)
        try:
            run()
        finally:
            attention_path.force_attention_path(None)

    return call


def step_tasks(models: list[str], batch_size: int, auto: str) -> tuple[dict[str, _Task], dict[str, dict]]:
    tasks, info = {}, {}
    cpu = torch.device("cpu")
    for name in models:
        before_path = "eager" if name.startswith("swin") else "sdpa"  # timm's WindowAttention: fused_attn off
        for way in WAYS:
            torch.manual_seed(0)
            network = NetworkSpec("vitlab", name, dict(PROTOCOL)).build()
            if way.endswith("before"):
                network = torch_dropout(network)
            precision = {"fp32_before": "32-true", "fp32_after": "32-true", "bf16_before": "bf16-mixed"}.get(way, auto)
            subject = Subject(network, batch_size=batch_size, precision=precision, device=cpu, runner=Runner("none"))
            path = before_path if way.endswith("before") else None
            tasks[f"{name} {way}"] = _Task(forced(path, subject.train_step))
            info.setdefault(name, {"flops_per_image": training_flops_per_image(network), "precision": {}})
            info[name]["precision"][way] = precision
    return tasks, info


def dropout_tasks() -> dict[str, _Task]:
    torch.manual_seed(0)
    hidden, probs = torch.randn(128, 65, 256), torch.randn(128, 4, 65, 65)
    tokens, weight = torch.randn(128 * 65, 128), torch.randn(256, 128)
    tasks = {}
    for dtype, tag in ((torch.float32, "fp32"), (torch.bfloat16, "bf16")):
        h, a, t, w = (x.to(dtype) for x in (hidden, probs, tokens, weight))
        tasks[f"dropout mlp torch {tag}"] = _Task(lambda h=h: F.dropout(h, 0.05))
        tasks[f"dropout mlp vitlab {tag}"] = _Task(lambda h=h: dropout(h, 0.05))
        tasks[f"dropout attn torch {tag}"] = _Task(lambda a=a: F.dropout(a, 0.05))
        tasks[f"dropout attn vitlab {tag}"] = _Task(lambda a=a: dropout(a, 0.05))
        tasks[f"matmul fc1 {tag}"] = _Task(lambda t=t, w=w: t @ w.T)
    return tasks


def summarize(tasks: dict[str, _Task], matmuls: dict, info: dict, args: argparse.Namespace, clock: str) -> dict:
    """Per model and way, on ``clock`` (``cpu``: this process's CPU time; ``wall``): seconds per round, images
    per second, the factor over ``fp32_before`` per round, the matmul-peak limit; the dropout times in ms."""
    seconds = {name: task.seconds[clock] for name, task in tasks.items()}
    peaks = {p: [m.flops / s for s in seconds[f"matmul {p}"]] for p, m in matmuls.items()}
    models = {}
    for name in args.models:
        flops = info[name]["flops_per_image"]["training"] * args.batch_size
        ways = {}
        for way in WAYS:
            step = seconds[f"{name} {way}"]
            precision = info[name]["precision"][way]
            limit = [flops / peak for peak in peaks[precision]]
            ways[way] = {
                "precision": precision,
                "seconds_per_step": step,
                "images_per_s": quartile_summary([args.batch_size / s for s in step]),
                "factor_over_fp32_before": quartile_summary(
                    [b / s for s, b in zip(step, seconds[f"{name} fp32_before"], strict=True)]
                ),
                "limit_seconds_at_matmul_peak": quartile_summary(limit),
                "measured_over_limit": quartile_summary([s / x for s, x in zip(step, limit, strict=True)]),
            }
        models[name] = {"flops_per_image": info[name]["flops_per_image"], "ways": ways}
    return {
        "matmul_peak_flops_per_s": {p: {"per_round": v, **quartile_summary(v)} for p, v in peaks.items()},
        "models": models,
        "dropout_ms": {
            name: {"per_round": [s * 1e3 for s in seconds[name]], **quartile_summary([s * 1e3 for s in seconds[name]])}
            for name in tasks
            if name.startswith(("dropout", "matmul fc1"))
        },
    }


def path_table(batch_size: int) -> list[dict]:
    """Every attention path timed on the protocol ViT's attention ``[B, 4, 65, 32]`` (the ToMe and CET-ViT global
    blocks have the same heads and width), fp32 and bf16, with and without backward and attention dropout 0.05: the
    table behind the chooser's rules (with dropout the eager path runs without timing; here all three are timed)."""
    for dtype in (torch.float32, torch.bfloat16):
        for backward in (True, False):
            for drop in (0.0, 0.05):
                torch.manual_seed(0)
                q, k, v = (torch.randn(batch_size, 4, 65, 32, dtype=dtype, requires_grad=backward) for _ in range(3))
                shape = (batch_size, 4, 65, 32)
                key = attention_path.AttentionKey("table", "cpu", str(dtype), shape, drop > 0, backward, False)

                def candidate(name: str, drop: float = drop, q=q, k=k, v=v):
                    return lambda: attention_path.run_path(name, q, k, v, None, scale=32**-0.5, dropout_p=drop)

                candidates = {name: candidate(name) for name in attention_path.PATHS}
                attention_path._decide(key, candidates, [q, k, v] if backward else None)
    return [d for d in attention_path.decisions() if d["kind"] == "table"]


def lscpu() -> str:
    try:
        return subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
    except OSError:
        return ""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(MODELS))
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    out = Path(args.out)
    if out.exists():
        sys.exit(f"{out} exists; choose another --out (results are never overwritten)")
    torch.set_num_threads(1)
    auto = choose_precision("auto", "cpu")
    load_before, env = os.getloadavg(), environment()
    cpu = torch.device("cpu")
    matmuls = {p: _Matmul(1024, p, cpu) for p in ("32-true", "bf16-mixed")}
    tasks = {f"matmul {p}": _Task(m) for p, m in matmuls.items()}
    steps, info = step_tasks(args.models, args.batch_size, auto.precision)
    tasks |= steps | dropout_tasks()
    _measure_alternating(tasks, repeats=args.repeats, warmup=2, sample_seconds=0.3, device=cpu)
    measured = {clock: summarize(tasks, matmuls, info, args, clock) for clock in ("cpu", "wall")}
    record = {
        "benchmark": "cpu_step_speed",
        "command": sys.argv,
        "settings": {"batch_size": args.batch_size, "repeats": args.repeats, "threads": 1, "protocol": PROTOCOL},
        "auto_precision": auto.record(),
        "load_average": {"before": load_before, "after": os.getloadavg()},
        "environment": env,
        "lscpu": lscpu(),
        "clocks": measured,
        "attention_paths_chosen": [d for d in attention_path.decisions() if d["kind"] != "table"],
        "attention_path_table": path_table(args.batch_size),
    }
    atomic_write_json(out, record)
    print(f"auto: {auto.line()}; load average {load_before[0]:.2f} -> {os.getloadavg()[0]:.2f}")
    cpu_clock = measured["cpu"]
    for p, v in cpu_clock["matmul_peak_flops_per_s"].items():
        print(f"matmul peak {p} (CPU clock): {v['median'] / 1e9:.0f} GFLOP/s")
    for name, entry in cpu_clock["models"].items():
        cells = [
            f"{way} {w['images_per_s']['median']:.0f} img/s x{w['factor_over_fp32_before']['median']:.2f} "
            f"(limit {w['limit_seconds_at_matmul_peak']['median']:.3f} s)"
            for way, w in entry["ways"].items()
        ]
        print(f"{name}: " + "; ".join(cells))
    print(json.dumps({k: round(v["median"], 2) for k, v in cpu_clock["dropout_ms"].items()}))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
