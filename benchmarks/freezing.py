"""Backward and whole-step time against the fraction of frozen heads (ViTCAE eq. 26), with the FLOP prediction.

A frozen head's attention is computed without autograd: its Q/K projections, logits, softmax and weight gradients
drop out of the backward pass, only the input gradient through its value path remains. This script measures what
that saves on a ViT (SDPA attention, AdamW, the controller's ``FrozenHeadGuard`` attached) with 0, 25, 50, 75 and
100% of the heads of every layer frozen, and compares it with the saving a FLOP count predicts.

The FLOP count (:func:`step_flops`) counts every matrix product of the model, forward and backward, and the
softmax (5 N^2 per head forward, 4 N^2 backward); its matrix-product part is checked against
``torch.utils.flop_counter`` on the eager attention path (that counter does not see the CPU SDPA kernel).

With ``--compare-split`` every frozen fraction is also timed on the two-call path (``Attention.split_frozen``:
the frozen and the active heads attend in two calls whose outputs are concatenated, what the CPU path was before
the single flash call), interleaved with the default path in the same process, so the two compare within one run.

Run (single-threaded; a few minutes on an idle core)::

    python benchmarks/freezing.py --threads 1 --repeats 10 --compare-split
    python benchmarks/freezing.py --tokens 64 --repeats 3   # a quicker look

Writes ``benchmarks/results/freezing.json``.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

from vitlab.diagnostics import FrozenHeadGuard
from vitlab.models.vit import VisionTransformer

FRACTIONS = (0.0, 0.25, 0.5, 0.75, 1.0)
SOFTMAX_FORWARD, SOFTMAX_BACKWARD = 5, 4  # elementwise operations per logit: max, sub, exp, sum, div / P*(dP - sum)


def step_flops(
    *,
    batch: int,
    tokens: int,
    dim: int,
    heads: int,
    depth: int,
    mlp_hidden: int,
    patch_dim: int,
    classes: int,
    frozen: int,
) -> dict[str, float]:
    """FLOPs of one training step of a ViT with ``frozen`` of its ``heads`` frozen in every layer.

    ``tokens`` N counts the CLS token; ``patch_dim`` is C_in * P^2. Matrix products count 2 m n k. Returns forward
    and backward FLOPs, each also without the softmax (``*_matmul``: what ``FlopCounterMode`` sees).
    """
    n, c, d = tokens, dim, dim // heads
    active = heads - frozen
    patches = n - 1
    # forward per image and layer: qkv, QK^T, AV, output projection, MLP (the frozen heads compute the same)
    forward_layer = 2 * n * c * 3 * c + 2 * (2 * n * n * c) + 2 * n * c * c + 2 * (2 * n * c * mlp_hidden)
    # backward per image and layer. Active head: qkv weight and input gradients (12 N C d), dP, dV, dQ, dK (8 N^2 d).
    # Frozen head (eq. 26): only the value path's input gradient, dV = P^T dO (2 N^2 d) and dX = dV W_v (2 N d C).
    backward_heads = active * (12 * n * c * d + 8 * n * n * d) + frozen * (2 * n * n * d + 2 * n * d * c)
    backward_layer = backward_heads + 2 * (2 * n * c * c) + 2 * (2 * 2 * n * c * mlp_hidden)
    softmax_forward = SOFTMAX_FORWARD * n * n * heads
    softmax_backward = SOFTMAX_BACKWARD * n * n * active
    embed_forward, embed_backward = 2 * patches * patch_dim * c, 2 * patches * patch_dim * c  # no input gradient
    head_forward, head_backward = 2 * c * classes, 2 * 2 * c * classes
    forward_matmul = batch * (depth * forward_layer + embed_forward + head_forward)
    backward_matmul = batch * (depth * backward_layer + embed_backward + head_backward)
    return {
        "forward": forward_matmul + batch * depth * softmax_forward,
        "backward": backward_matmul + batch * depth * softmax_backward,
        "forward_matmul": forward_matmul,
        "backward_matmul": backward_matmul,
    }


def frozen_mask(depth: int, heads: int, count: int) -> torch.Tensor:
    """``[L, H]``: the first ``count`` heads of every layer frozen."""
    mask = torch.zeros(depth, heads, dtype=torch.bool)
    mask[:, :count] = True
    return mask


def set_path(guard: FrozenHeadGuard, mask: torch.Tensor, split: bool) -> None:
    """Freeze ``mask`` and choose the frozen heads' path: one flash call over all heads, or two calls (``split``)."""
    guard.freeze(mask)
    for module in guard.modules:
        module.split_frozen = split


def counted_flops(model: VisionTransformer, guard: FrozenHeadGuard, mask: torch.Tensor, x, y) -> tuple[int, int]:
    """Forward and backward matrix-product FLOPs that ``FlopCounterMode`` counts on the eager attention path."""
    set_path(guard, mask, False)
    for module in guard.modules:
        module.fused = False
    with FlopCounterMode(display=False) as forward_counter:
        loss = F.cross_entropy(model(x), y)
    with FlopCounterMode(display=False) as backward_counter:
        loss.backward()
    for module in guard.modules:
        module.fused = True
    model.zero_grad(set_to_none=True)
    return forward_counter.get_total_flops(), backward_counter.get_total_flops()


CLOCKS = {"thread": time.thread_time, "wall": time.perf_counter}


def timed_step(model, optimizer, x, y, clock=time.thread_time) -> tuple[float, float, float]:
    """Seconds of forward, backward and optimizer step (the guard's restore hook included) on ``clock``.

    The default clock is the calling thread's CPU time (``time.thread_time``): single-threaded, all the work runs on
    this thread, and the time the scheduler gives other processes on a shared core is not counted, where the wall
    clock counts it (what made rows of earlier runs on a loaded machine differ by 2x).
    """
    optimizer.zero_grad(set_to_none=True)
    start = clock()
    loss = F.cross_entropy(model(x), y)
    after_forward = clock()
    loss.backward()
    after_backward = clock()
    optimizer.step()
    end = clock()
    return after_forward - start, after_backward - after_forward, end - after_backward


def benchmark(tokens: int, args: argparse.Namespace) -> dict:
    grid = math.isqrt(tokens)
    if grid * grid != tokens:
        raise SystemExit(f"--tokens must be square numbers of patches, got {tokens}")
    patch = 4
    torch.manual_seed(0)
    model = VisionTransformer(
        img_size=grid * patch,
        patch_size=patch,
        in_chans=3,
        num_classes=10,
        embed_dim=args.dim,
        depth=args.depth,
        num_heads=args.heads,
        mlp_ratio=4.0,
        temperature=True,
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.05)
    guard = FrozenHeadGuard([block.attn for block in model.blocks])
    guard.attach(optimizer)
    x = torch.randn(args.batch, 3, grid * patch, grid * patch)
    y = torch.randint(0, 10, (args.batch,))
    shape = dict(
        batch=args.batch,
        tokens=tokens + 1,
        dim=args.dim,
        heads=args.heads,
        depth=args.depth,
        mlp_hidden=4 * args.dim,
        patch_dim=3 * patch * patch,
        classes=10,
    )
    counts = [round(f * args.heads) for f in FRACTIONS]
    # (frozen heads per layer, two-call path): the 0% row is the base of both paths
    variants = [(k, False) for k in counts] + ([(k, True) for k in counts if k] if args.compare_split else [])
    masks = [frozen_mask(args.depth, args.heads, k) for k, _ in variants]
    rows = []
    for (k, split), mask in zip(variants, masks, strict=True):
        predicted = step_flops(**shape, frozen=k)
        counted_forward, counted_backward = counted_flops(model, guard, mask, x, y)
        rows.append(
            {
                "frozen_fraction": k / args.heads,
                "frozen_heads_per_layer": k,
                "path": "two calls" if split else "one call",
                "flops": predicted,
                "counted_matmul_flops": {"forward": counted_forward, "backward": counted_backward},
            }
        )
    # Interleave the fractions, so that load from other processes spreads evenly over them, and run every other
    # round in reverse order: a variant's place in the round (what the allocator and caches hold from the previous
    # one) moved a 65-token step by about 2 ms in a given process.
    times: list[list[tuple[float, float, float]]] = [[] for _ in masks]
    for repeat in range(args.warmup + args.repeats):
        order = range(len(variants)) if repeat % 2 == 0 else reversed(range(len(variants)))
        for index in order:
            (_, split), mask = variants[index], masks[index]
            set_path(guard, mask, split)
            sample = timed_step(model, optimizer, x, y, CLOCKS[args.clock])
            if repeat >= args.warmup:
                times[index].append(sample)
    base_backward = base_step = None
    base_samples = times[0]  # the 0% row, timed in the same rounds as every other row
    for row, samples in zip(rows, times, strict=True):
        forward, backward, optim = (min(s[i] for s in samples) for i in range(3))
        row["seconds"] = {
            "forward": forward,
            "backward": backward,
            "optimizer": optim,
            "step": forward + backward + optim,
        }
        if base_backward is None:
            base_forward, base_backward, base_step, base_flops = forward, backward, row["seconds"]["step"], row["flops"]
        flops = row["flops"]
        predicted_backward = 1 - flops["backward"] / base_flops["backward"]
        predicted_step = 1 - (flops["forward"] + flops["backward"]) / (base_flops["forward"] + base_flops["backward"])
        measured_backward = 1 - backward / base_backward
        measured_step = 1 - row["seconds"]["step"] / base_step
        # Paired within rounds: the median over rounds of this row's time over the 0% row's time in the same round,
        # which cancels what changes between rounds (load, clock); the minima above can come from different rounds.
        paired_backward = statistics.median(s[1] / b[1] for s, b in zip(samples, base_samples, strict=True))
        paired_step = statistics.median(sum(s) / sum(b) for s, b in zip(samples, base_samples, strict=True))
        row["paired_median"] = {"backward_saving": 1 - paired_backward, "step_saving": 1 - paired_step}
        row["forward_overhead"] = forward / base_forward - 1
        row["saving"] = {
            "backward_predicted": predicted_backward,
            "backward_measured": measured_backward,
            "backward_measured_over_predicted": measured_backward / predicted_backward if predicted_backward else None,
            "step_predicted": predicted_step,
            "step_measured": measured_step,
            "step_measured_over_predicted": measured_step / predicted_step if predicted_step else None,
        }
    return {"tokens": tokens, "shape": shape, "rows": rows}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, nargs="+", default=[64, 256], help="patch tokens (square numbers)")
    parser.add_argument("--dim", type=int, default=256)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--depth", type=int, default=4)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument(
        "--clock",
        choices=sorted(CLOCKS),
        default="thread",
        help="thread: this thread's CPU time (needs --threads 1; robust to other processes); wall: perf_counter",
    )
    parser.add_argument(
        "--compare-split", action="store_true", help="also time the two-call frozen path, interleaved (one run)"
    )
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "freezing.json"))
    args = parser.parse_args()
    if args.clock == "thread" and args.threads != 1:
        parser.error("--clock thread counts one thread's CPU time: use it with --threads 1, or pass --clock wall")
    torch.set_num_threads(args.threads)
    results = {
        "benchmark": "freezing",
        "torch": torch.__version__,
        "processor": platform.processor() or platform.machine(),
        "threads": args.threads,
        "settings": vars(args),
        "cases": [benchmark(tokens, args) for tokens in args.tokens],
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2))
    for case in results["cases"]:
        print(
            f"N = {case['tokens']} patch tokens (+ CLS), dim {args.dim}, {args.heads} heads, depth {args.depth}, "
            f"batch {args.batch}"
        )
        print(
            f"{'frozen':>7} {'path':>9} {'fwd s':>7} {'fwd +':>6} {'bwd s':>7} {'step s':>7} | "
            f"{'bwd saving pred':>15} {'meas':>6} {'ratio':>6} | {'step saving pred':>16} {'meas':>6} {'ratio':>6} | "
            f"{'paired: bwd':>11} {'step':>6} {'ratio':>6} | matmul FLOPs counted/analytic"
        )
        for row in case["rows"]:
            s, v, f, c = row["seconds"], row["saving"], row["flops"], row["counted_matmul_flops"]
            m = row["paired_median"]
            ratio = lambda value: "-" if value is None else f"{value:.2f}"  # noqa: E731
            agreement = (c["forward"] + c["backward"]) / (f["forward_matmul"] + f["backward_matmul"])
            print(
                f"{row['frozen_fraction']:>7.0%} {row['path']:>9} {s['forward']:>7.3f} "
                f"{row['forward_overhead']:>+6.1%} {s['backward']:>7.3f} {s['step']:>7.3f} | "
                f"{v['backward_predicted']:>15.1%} {v['backward_measured']:>6.1%} "
                f"{ratio(v['backward_measured_over_predicted']):>6} | {v['step_predicted']:>16.1%} "
                f"{v['step_measured']:>6.1%} {ratio(v['step_measured_over_predicted']):>6} | "
                f"{m['backward_saving']:>11.1%} {m['step_saving']:>6.1%} "
                f"{ratio(m['step_saving'] / v['step_predicted'] if v['step_predicted'] else None):>6} | {agreement:.4f}"
            )
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
