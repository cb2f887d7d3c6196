"""The singular values of CET-ViT's assignment matrices on CUDA: the EI term's one host synchronisation, four ways.

CET-ViT's EI term (``vitlab.families.cet_vit.ei.assignment_singular_values``) takes ``torch.linalg.svdvals`` of
``S: [B, N, K]`` at every training step with EI on and at every validation step. On a shared H200 (15 processes,
2026-12-04) CET-ViT's steps took ~20x the matched ViT's with EI on (docs/experiments/baselines_cifar10.md, "The GPU
replicate"). torch's cuSOLVER SVD reads a convergence flag back to the host, and for matrices taller than 32 rows it
calls the solver once per matrix. This script times, forward and backward, on the device's clock (CUDA events; medians):

- ``svdvals``: ``torch.linalg.svdvals(S)``, what the EI term does now;
- ``qr_then_svdvals``: ``R`` of ``torch.linalg.qr(S)`` (``[B, K, K]``, the same singular values), then ``svdvals(R)``;
- ``host``: ``svdvals`` of ``S`` copied to the CPU, the values copied back;
- ``gram_eigvalsh``: the square roots of ``eigvalsh(S^T S)`` (squares the condition number: its error is reported,
  not recommended);
- ``gram_f64``: the same in float64 with ``svdvals``'s gradient, CET-ViT's ``model.ei_svd=gram``
  (``assignment_singular_values(S, "gram")``);

each with its largest relative error against a float64 CPU reference, values and gradient, and the number of host
synchronisations ``torch.cuda.set_sync_debug_mode`` reports per call. Without CUDA, ``--dry-run`` runs the same
code on the CPU (no sync count) in seconds.

    python -m benchmarks.micro.ei_svd_cuda --out FILE.json [--batch 128] [--tokens 64 256] [--slots 8 32]
    python -m benchmarks.micro.ei_svd_cuda --dry-run --out FILE.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import torch

from vitlab.atomic import atomic_write_text
from vitlab.environment import environment
from vitlab.families.cet_vit.ei import assignment_singular_values


def _host(S: torch.Tensor) -> torch.Tensor:
    return torch.linalg.svdvals(S.cpu()).to(S.device)


def _qr(S: torch.Tensor) -> torch.Tensor:
    return torch.linalg.svdvals(torch.linalg.qr(S).R)


def _gram(S: torch.Tensor) -> torch.Tensor:
    return torch.linalg.eigvalsh(S.transpose(-2, -1) @ S).clamp_min(0).sqrt().flip(-1)


WAYS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "svdvals": torch.linalg.svdvals,
    "qr_then_svdvals": _qr,
    "host": _host,
    "gram_eigvalsh": _gram,
    "gram_f64": lambda S: assignment_singular_values(S, "gram"),
}


def assignment(batch: int, tokens: int, slots: int, generator: torch.Generator) -> torch.Tensor:
    """Top-3 sparse row-stochastic ``S`` as CET-ViT's V-CEO makes it: three slots per token, weights summing to 1."""
    logits = torch.randn(batch, tokens, slots, generator=generator, dtype=torch.float64)
    top = logits.topk(3, dim=-1)
    return torch.zeros_like(logits).scatter_(-1, top.indices, top.values.softmax(-1))


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_way(way: Callable, S: torch.Tensor, weight: torch.Tensor, repeats: int) -> list[float]:
    """Milliseconds of forward and backward (``(values * weight).sum()``), per call, after two warm-up calls."""
    times = []
    for i in range(repeats + 2):
        x = S.detach().requires_grad_(True)
        _sync(S.device)
        if S.device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
        else:
            t0 = time.perf_counter()
        (way(x) * weight).sum().backward()
        if S.device.type == "cuda":
            end.record()
            torch.cuda.synchronize(S.device)
            elapsed = start.elapsed_time(end)
        else:
            elapsed = (time.perf_counter() - t0) * 1e3
        if i >= 2:
            times.append(elapsed)
    return times


def errors(way: Callable, S: torch.Tensor, weight: torch.Tensor) -> dict[str, float]:
    """Largest relative error of the values and of the gradient against float64 ``svdvals`` on the CPU."""
    ref_x = S.detach().cpu().double().requires_grad_(True)
    ref = torch.linalg.svdvals(ref_x)
    (ref * weight.cpu().double()).sum().backward()
    x = S.detach().requires_grad_(True)
    values = way(x)
    (values * weight).sum().backward()
    value_error = ((values.double().cpu() - ref).abs().max() / ref.abs().max()).item()
    grad_error = ((x.grad.double().cpu() - ref_x.grad).abs().max() / ref_x.grad.abs().max()).item()
    return {"values": value_error, "gradient": grad_error}


def syncs(way: Callable, S: torch.Tensor, weight: torch.Tensor) -> int | None:
    """Host synchronisations of one forward and backward, as ``torch.cuda.set_sync_debug_mode('warn')`` reports."""
    if S.device.type != "cuda":
        return None
    x = S.detach().requires_grad_(True)
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            (way(x) * weight).sum().backward()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    return sum("synchroniz" in str(w.message) for w in caught)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--tokens", type=int, nargs="+", default=[64, 256])
    parser.add_argument("--slots", type=int, nargs="+", default=[8, 32])
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--dry-run", action="store_true", help="the CPU, a small batch, 2 repeats")
    args = parser.parse_args(argv)
    if args.out.exists():
        raise SystemExit(f"error: {args.out} exists; pass another --out (results are never overwritten)")
    if not torch.cuda.is_available() and not args.dry_run:
        raise SystemExit("error: no CUDA device; pass --dry-run to run the same code on the CPU")
    device = torch.device("cpu" if args.dry_run else "cuda")
    batch, repeats = (4, 2) if args.dry_run else (args.batch, args.repeats)
    generator = torch.Generator().manual_seed(0)
    rows = []
    for tokens in args.tokens:
        for slots in args.slots:
            S = assignment(batch, tokens, slots, generator).float().to(device)
            weight = torch.randn(batch, slots, generator=generator).to(device)
            for name, way in WAYS.items():
                ms = time_way(way, S, weight, repeats)
                row = {"tokens": tokens, "slots": slots, "way": name, "ms_median": statistics.median(ms), "ms": ms}
                row |= {"relative_error": errors(way, S, weight), "host_syncs": syncs(way, S, weight)}
                rows.append(row)
                print(
                    f"N={tokens:4d} K={slots:3d} {name:16s} {row['ms_median']:8.3f} ms  "
                    f"err values {row['relative_error']['values']:.1e} grad {row['relative_error']['gradient']:.1e}  "
                    f"syncs {row['host_syncs']}"
                )
    record = {
        "benchmark": "ei_svd_cuda",
        "device": torch.cuda.get_device_name(0) if device.type == "cuda" else "cpu (dry run)",
        "batch": batch,
        "rows": rows,
        "environment": environment(),
    }
    atomic_write_text(args.out, json.dumps(record, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
