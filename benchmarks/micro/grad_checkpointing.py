"""Gradient checkpointing (``trainer.grad_checkpointing``): the same loss and gradients, and what it costs and saves.

For each preset, at 32x32 RGB inputs and 10 classes:

1. one training batch's loss and gradients with and without checkpointing, from the same weights and the same
   seed, compared element by element (the largest absolute difference and whether they are bit-identical);
2. ``vitlab bench trainer.grad_checkpointing=true``: training and inference throughput of both settings, alternating
   round by round in one process (their ratio is formed per round, so load from other processes hits both alike), and
   the peak memory of each as the peak RSS growth of a fresh process over building the network and two training steps.

    OMP_NUM_THREADS=1 python -m benchmarks.micro.grad_checkpointing \
        --out benchmarks/results/micro/grad_checkpointing_<device>_<date>.json
    python -m benchmarks.micro.grad_checkpointing \
        --from benchmarks/results/micro/grad_checkpointing_epyc_2026-12-02.json   # the docs table
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from typing import Any

import torch
import torch.nn.functional as F

import vitlab
from vitlab.atomic import check_outputs, write_output
from vitlab.bench.run import bench
from vitlab.jsonio import strict_dumps

SHAPE = dict(img_size=32, in_chans=3, num_classes=10)


def loss_and_grads(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> tuple[float, list[torch.Tensor]]:
    model.zero_grad(set_to_none=True)
    torch.manual_seed(1)
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    return float(loss), [p.grad.clone() for p in model.parameters()]


def gradient_check(name: str, batch_size: int) -> dict[str, Any]:
    """Loss and gradients of one batch with and without checkpointing (same weights, same seed)."""
    torch.manual_seed(0)
    model = vitlab.create_model(name, **SHAPE).train()
    x = torch.randn(batch_size, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    y = torch.arange(batch_size) % SHAPE["num_classes"]
    loss, grads = loss_and_grads(model, x, y)
    model.set_grad_checkpointing(True)
    loss_ckpt, grads_ckpt = loss_and_grads(model, x, y)
    return {
        "loss": loss,
        "loss_checkpointed": loss_ckpt,
        "max_abs_grad_difference": max(float((a - b).abs().max()) for a, b in zip(grads, grads_ckpt, strict=True)),
        "bit_identical": loss == loss_ckpt and all(torch.equal(a, b) for a, b in zip(grads, grads_ckpt, strict=True)),
        "parameter_tensors": len(grads),
    }


def lscpu() -> dict[str, str]:
    out = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout
    fields = dict(line.split(":", 1) for line in out.splitlines() if ":" in line)
    flags = fields.get("Flags", "").split()
    return {
        "model_name": fields.get("Model name", "").strip(),
        "cpus": fields.get("CPU(s)", "").strip(),
        "avx512_bf16": str("avx512_bf16" in flags).lower(),
        "amx": str(any(f.startswith("amx") for f in flags)).lower(),
    }


def table(record: dict[str, Any]) -> str:
    """The Markdown table of docs/benchmarks.md ("Gradient checkpointing") from a results file."""
    rows = [
        "| network | gradients | peak RSS growth, MiB: with / without | training images/s, CPU clock: with / without "
        "| with / without, train (range) | with / without, inference | load avg |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, result in record["models"].items():
        nets, grads = result["bench"]["networks"], result["gradients"]
        ours, plain = nets["ours"], nets["ours_no_checkpointing"]
        speed = [net["train"]["cpu"]["images_per_s"]["median"] for net in (ours, plain)]
        ratio = result["bench"]["ours_over_ours_no_checkpointing"]["cpu"]
        load = result["bench"]["load_average"]
        same = "bit-identical" if grads["bit_identical"] else f"max diff {grads['max_abs_grad_difference']:.1e}"
        rows.append(
            f"| {name} | {same} ({grads['parameter_tensors']} tensors) | {ours['peak_memory']['mib']:.0f} / "
            f"{plain['peak_memory']['mib']:.0f} ({ours['peak_memory']['mib'] / plain['peak_memory']['mib'] - 1:+.0%}) "
            f"| {speed[0]:.2f} / {speed[1]:.2f} "
            f"| {ratio['train']['median']:.3f} ({ratio['train']['min']:.3f}-{ratio['train']['max']:.3f}) "
            f"| {ratio['inference']['median']:.3f} | {load['before'][0]:.1f} -> {load['after'][0]:.1f} |"
        )
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=["vit_small", "cet_vit_tiny"])
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out")
    parser.add_argument("--force", action="store_true")
    parser.add_argument("--from", dest="source", help="print the docs table of this results file and stop")
    args = parser.parse_args()
    if args.source:
        with open(args.source) as f:
            print(table(json.load(f)))
        return
    if not args.out:
        parser.error("--out FILE.json is needed to measure (or --from FILE.json to print the table)")
    check_outputs([args.out], force=args.force)
    load_before = os.getloadavg()
    results = {}
    for name in args.models:
        print(f"{name}: gradients", flush=True)
        gradients = gradient_check(name, args.batch_size)
        print(f"{name}: bench", flush=True)
        record = bench(
            name,
            overrides=SHAPE,
            batch_size=args.batch_size,
            grad_checkpointing=True,
            repeats=args.repeats,
            warmup=1,
            threads=1,
        )
        results[name] = {"gradients": gradients, "bench": record}
    record = {
        "benchmark": "grad_checkpointing",
        "command": [sys.executable, *sys.argv],
        "load_average": {"before": load_before, "after": os.getloadavg()},
        "lscpu": lscpu(),
        "environment": results[args.models[0]]["bench"]["environment"],
        "settings": {"batch_size": args.batch_size, "repeats": args.repeats, "threads": 1, **SHAPE},
        "models": results,
    }
    print(f"wrote {write_output(args.out, strict_dumps(record, indent=2), force=args.force)}")


if __name__ == "__main__":
    main()
