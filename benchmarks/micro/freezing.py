"""Backward and whole-step time against the fraction of frozen heads (ViTCAE eq. 26), with the FLOP prediction.

A frozen head's attention is computed without autograd: its Q/K projections, logits, softmax and weight gradients
drop out of the backward pass, only the input gradient through its value path remains. This script measures what
that saves on a ViT (SDPA attention, AdamW, the controller's ``FrozenHeadGuard`` attached) with 0, 25, 50, 75 and
100% of the heads of every layer frozen, and compares it with the saving a FLOP count predicts.

The FLOP count (:func:`step_flops`) counts every matrix product of the model, forward and backward, and the
softmax (5 N^2 per head forward, 4 N^2 backward); its matrix-product part is checked against
``torch.utils.flop_counter`` on the eager attention path (that counter does not see the CPU SDPA kernel).

With ``--compare-split`` every frozen fraction is also timed on the two-call path (``FrozenHeadAttention.split_frozen``:
the frozen and the active heads attend in two calls whose outputs are concatenated, what the CPU path was before
the single flash call), interleaved with the default path in the same process, so the two compare within one run.

Run (single-threaded; a few minutes on an idle core)::

    python -m benchmarks.micro.freezing --threads 1 --repeats 10 --compare-split
    python -m benchmarks.micro.freezing --tokens 64 --repeats 3   # a quicker look
    python -m benchmarks.micro.freezing --device cuda --tokens 64 196 --dim 512 --heads 8 --depth 6 --batch 64 \
        --repeats 20

On CUDA each phase is timed on the wall clock after ``torch.cuda.synchronize()`` (the frozen heads take the two-call
path there). ``benchmarks/experiments/gpu_check.py`` runs it at that size.

Writes ``benchmarks/results/micro/freezing_<device>_<date>.json`` (:mod:`benchmarks.naming`).
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import platform
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

from vitlab.acceleration.precision import choose_precision
from vitlab.bench.timing import autocast, bootstrap_median
from vitlab.dynamics import FrozenHeadGuard
from vitlab.environment import environment
from vitlab.models.vit import VisionTransformer

if __package__ in (None, ""):  # run as a file: the suite is imported from the repository root
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.naming import results_path

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


def cuda_clock() -> float:
    """The wall clock after the device's queued work: what a phase of a CUDA step took (a host sync per reading)."""
    torch.cuda.synchronize()
    return time.perf_counter()


def timed_step(model, optimizer, x, y, clock=time.thread_time, precision="32-true") -> tuple[float, float, float]:
    """Seconds of forward, backward and optimizer step (the guard's hooks included) on ``clock``.

    The default clock is the calling thread's CPU time (``time.thread_time``): single-threaded, all the work runs on
    this thread, and the time the scheduler gives other processes on a shared core is not counted, where the wall
    clock counts it (what made rows of earlier runs on a loaded machine differ by 2x).
    """
    optimizer.zero_grad(set_to_none=True)
    start = clock()
    with autocast(precision, x.device):  # bf16-mixed as `vitlab fit` runs it, where `--precision` resolves to it
        logits = model(x)
    loss = F.cross_entropy(logits.float(), y)
    after_forward = clock()
    loss.backward()
    after_backward = clock()
    optimizer.step()
    end = clock()
    return after_forward - start, after_backward - after_forward, end - after_backward


def verdict(low: float, high: float, bar: float, at_least: bool) -> str:
    """``met`` / ``missed`` when the whole interval ``[low, high]`` is on one side of ``bar``, else ``undecided``."""
    if at_least:
        return "met" if low >= bar else "missed" if high < bar else "undecided"
    return "met" if high <= bar else "missed" if low > bar else "undecided"


# Issue 15's bars: forward overhead <= 2% at every fraction; whole-step saving >= 70% of the FLOP prediction at 50%
# and 100%; backward saving at or above its prediction.
FORWARD_BAR, STEP_BAR, BACKWARD_BAR = 0.02, 0.70, 1.0


def benchmark(tokens: int, args: argparse.Namespace) -> dict:
    grid = math.isqrt(tokens)
    if grid * grid != tokens:
        raise SystemExit(f"--tokens must be square numbers of patches, got {tokens}")
    patch = 4
    torch.manual_seed(0)
    base = VisionTransformer(
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
    device = torch.device(getattr(args, "device", "cpu"))
    base = base.to(device)
    x = torch.randn(args.batch, 3, grid * patch, grid * patch).to(device)
    y = torch.randint(0, 10, (args.batch,)).to(device)
    clock = cuda_clock if device.type == "cuda" else CLOCKS[args.clock]
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
    # (frozen heads per layer, path). The 0% row is the base of every path. "no skip": the optimizer still updates
    # the parameters frozen whole (and the guard undoes it), the behaviour before FrozenHeadGuard skipped them.
    # "A/A control": a second copy of the unfrozen model. Its paired difference from the base is the resolution of
    # the method on this machine (two copies of one model differ only in where their memory lies).
    # The default path: one flash call over all heads on the CPU, two calls elsewhere (Attention._single_call_applies)
    default = "one call" if device.type == "cpu" else "two calls"
    variants = [(k, default) for k in counts] + [(args.heads, f"{default}, no skip"), (0, "A/A control")]
    if args.compare_split and device.type == "cpu":
        variants += [(k, "two calls") for k in counts if k]
    # Every variant is its own copy of the model, with its own AdamW and guard, frozen once before the timing: no
    # head permutation or optimizer-state move happens between timed steps (switching one model between fractions
    # made each timed step the first after a permutation, and a row's place in the round moved it by ~2 ms).
    setups, rows = [], []
    for k, path in variants:
        model = copy.deepcopy(base)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.05)
        guard = FrozenHeadGuard([block.attn for block in model.blocks])
        guard.attach(optimizer)
        mask = frozen_mask(args.depth, args.heads, k)
        counted_forward, counted_backward = counted_flops(model, guard, mask, x, y)
        set_path(guard, mask, path == "two calls" and default == "one call")
        if path == f"{default}, no skip":
            guard.drop_frozen_gradients = lambda: None  # the hook calls it by name: the update runs and is undone
        setups.append((model, optimizer))
        rows.append(
            {
                "frozen_fraction": k / args.heads,
                "frozen_heads_per_layer": k,
                "path": path,
                "flops": step_flops(**shape, frozen=k),
                "counted_matmul_flops": {"forward": counted_forward, "backward": counted_backward},
            }
        )
    # Rounds: one step of every variant, every other round in reverse order, so that what changes over time (load,
    # clock) spreads evenly over the variants and each round pairs every variant with the base it ran beside.
    times: list[list[tuple[float, float, float]]] = [[] for _ in variants]
    for repeat in range(args.warmup + args.repeats):
        order = range(len(variants)) if repeat % 2 == 0 else reversed(range(len(variants)))
        for index in order:
            sample = timed_step(*setups[index], x, y, clock, getattr(args, "precision_used", "32-true"))
            if repeat >= args.warmup:
                times[index].append(sample)
    base_samples, base_flops = times[0], rows[0]["flops"]
    base_forward, base_backward, base_optim = (min(s[i] for s in base_samples) for i in range(3))
    base_step = base_forward + base_backward + base_optim
    for row, samples in zip(rows, times, strict=True):
        forward, backward, optim = (min(s[i] for s in samples) for i in range(3))
        row["seconds"] = {
            "forward": forward,
            "backward": backward,
            "optimizer": optim,
            "step": forward + backward + optim,
        }
        flops = row["flops"]
        predicted_backward = 1 - flops["backward"] / base_flops["backward"]
        predicted_step = 1 - (flops["forward"] + flops["backward"]) / (base_flops["forward"] + base_flops["backward"])
        measured_backward = 1 - backward / base_backward
        measured_step = 1 - row["seconds"]["step"] / base_step
        # Paired within rounds: this row's time over the base row's in the same round, the median over rounds and a
        # 95% bootstrap interval; it cancels what changes between rounds, where the minima can come from different
        # rounds.
        pairs = list(zip(samples, base_samples, strict=True))
        paired = {
            "forward_overhead": [s[0] / b[0] - 1 for s, b in pairs],
            "backward_saving": [1 - s[1] / b[1] for s, b in pairs],
            "step_saving": [1 - sum(s) / sum(b) for s, b in pairs],
            "forward_backward_saving": [1 - (s[0] + s[1]) / (b[0] + b[1]) for s, b in pairs],
        }
        row["paired"] = {
            key: dict(zip(("median", "low", "high"), bootstrap_median(v), strict=True)) for key, v in paired.items()
        }
        row["paired_median"] = {key: value["median"] for key, value in row["paired"].items()}  # earlier files' key
        row["forward_overhead"] = forward / base_forward - 1
        row["saving"] = {
            "backward_predicted": predicted_backward,
            "backward_measured": measured_backward,
            "backward_measured_over_predicted": measured_backward / predicted_backward if predicted_backward else None,
            "step_predicted": predicted_step,
            "step_measured": measured_step,
            "step_measured_over_predicted": measured_step / predicted_step if predicted_step else None,
        }
        if row["frozen_heads_per_layer"] and row["path"] == default:
            step, back, fwd = (
                row["paired"]["step_saving"],
                row["paired"]["backward_saving"],
                row["paired"]["forward_overhead"],
            )
            row["bars"] = {"forward_overhead_at_most_2%": verdict(fwd["low"], fwd["high"], FORWARD_BAR, at_least=False)}
            row["bars"]["backward_at_or_above_prediction"] = verdict(
                back["low"] / predicted_backward, back["high"] / predicted_backward, BACKWARD_BAR, at_least=True
            )
            if row["frozen_fraction"] in (0.5, 1.0):
                row["bars"]["step_at_least_70%_of_prediction"] = verdict(
                    step["low"] / predicted_step, step["high"] / predicted_step, STEP_BAR, at_least=True
                )
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
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="cuda: the wall clock, synchronised")
    parser.add_argument("--out", help="default: benchmarks/results/micro/freezing_<device>_<date>.json")
    parser.add_argument(
        "--precision",
        choices=("auto", "32-true", "bf16-mixed"),
        default="auto",
        help="auto (the default of vitlab fit): bf16-mixed where the device computes bf16 natively, else fp32",
    )
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device here (torch.cuda.is_available() is False)")
    if args.device == "cuda":
        args.clock = "wall"  # synchronised with the device before each reading; a thread's CPU time misses the GPU
    if args.clock == "thread" and args.threads != 1:
        parser.error("--clock thread counts one thread's CPU time: use it with --threads 1, or pass --clock wall")
    args.out = args.out or str(results_path("micro", "freezing", device=args.device))
    choice = choose_precision(args.precision, args.device)
    args.precision_used = choice.precision
    print(f"precision {choice.precision} ({args.precision}: {choice.reason})")
    torch.set_num_threads(args.threads)
    results = {
        "benchmark": "freezing",
        "torch": torch.__version__,
        "environment": environment(),
        "processor": platform.processor() or platform.machine(),
        "threads": args.threads,
        "precision_choice": choice.record(),
        "settings": vars(args),
        "cases": [benchmark(tokens, args) for tokens in args.tokens],
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2))
    for case in results["cases"]:
        print(
            f"N = {case['tokens']} patch tokens (+ CLS), dim {args.dim}, {args.heads} heads, depth {args.depth}, "
            f"batch {args.batch}; minima over {args.repeats} rounds"
        )
        print(
            f"{'frozen':>7} {'path':>17} {'fwd s':>7} {'fwd +':>6} {'bwd s':>7} {'opt s':>6} {'step s':>7} | "
            f"{'bwd saving pred':>15} {'meas':>6} {'ratio':>6} | {'step saving pred':>16} {'meas':>6} {'ratio':>6} | "
            "matmul FLOPs counted/analytic"
        )
        ratio = lambda value: "-" if value is None else f"{value:.2f}"  # noqa: E731
        for row in case["rows"]:
            s, v, f, c = row["seconds"], row["saving"], row["flops"], row["counted_matmul_flops"]
            agreement = (c["forward"] + c["backward"]) / (f["forward_matmul"] + f["backward_matmul"])
            print(
                f"{row['frozen_fraction']:>7.0%} {row['path']:>17} {s['forward']:>7.3f} "
                f"{row['forward_overhead']:>+6.1%} {s['backward']:>7.3f} {s['optimizer']:>6.3f} {s['step']:>7.3f} | "
                f"{v['backward_predicted']:>15.1%} {v['backward_measured']:>6.1%} "
                f"{ratio(v['backward_measured_over_predicted']):>6} | {v['step_predicted']:>16.1%} "
                f"{v['step_measured']:>6.1%} {ratio(v['step_measured_over_predicted']):>6} | {agreement:.4f}"
            )
        print("  paired within rounds: median [95% bootstrap interval]; verdicts against issue 15's bars")

        def interval(p: dict, scale: float = 1.0) -> str:
            scale = scale or 1.0  # the A/A control has no predicted saving: its raw paired difference
            return f"{p['median'] / scale:+.3f} [{p['low'] / scale:+.3f}, {p['high'] / scale:+.3f}]"

        for row in case["rows"][1:]:
            p, v = row["paired"], row["saving"]
            print(
                f"{row['frozen_fraction']:>7.0%} {row['path']:>17}  fwd + {interval(p['forward_overhead'])}"
                f"  bwd/pred {interval(p['backward_saving'], v['backward_predicted'])}"
                f"  step/pred {interval(p['step_saving'], v['step_predicted'])}"
                f"  fwd+bwd/pred {interval(p['forward_backward_saving'], v['step_predicted'])}"
                f"  {' '.join(f'{k}: {v}' for k, v in row.get('bars', {}).items())}"
            )
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
