"""Backward time of one ``Attention`` layer with 0, half and all of its heads frozen (ViTCAE eq. 26), at a tiny size
where fixed per-call costs dominate and at training sizes; with ``--layers``, the time of a whole training step with
0, 2 and 4 of vit_pico's 4 blocks frozen (``dynamics.freeze: layers``), with and without the cache of the frozen
prefix's outputs.

The whole-model benchmark (``benchmarks/micro/freezing.py``) compares time with a FLOP prediction, which has no term for
what a call costs regardless of its size (Python, dispatch, small products). Here one layer ``[B, N, 256]``, 4 heads,
is timed alone: at ``B=1, N=5`` its backward is almost all fixed cost, so the difference between the frozen and the
unfrozen layer there is the fixed cost that freezing adds. Each variant is its own copy of the layer; rounds
alternate their order; minimum of the backward over the rounds, on this thread's CPU clock.

Run (single-threaded, about a minute)::

    python -m benchmarks.micro.frozen_layer

Writes ``benchmarks/results/micro/frozen_layer_<device>_<date>.json`` (:mod:`benchmarks.naming`).

``--layers`` (single-threaded, a few minutes): vit_pico, 32x32 RGB in 4x4 patches (64 tokens), batches of 64 from a
fixed set of 8 batches (the cache holds them all after one pass), forward + cross-entropy + backward + AdamW step
timed on this thread's CPU clock; each variant is its own copy of the model, rounds alternate the order, and every
round's mean seconds per step is kept, so that the ratios to the unfrozen model are paired within a round::

    python -m benchmarks.micro.frozen_layer --layers

writes ``benchmarks/results/micro/frozen_layers_<device>_<date>.json``.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import platform
import sys
import time
from pathlib import Path

import torch

from vitlab.dynamics import FrozenHeadAttention
from vitlab.dynamics.layer_cache import CachedPrefix, PrefixCache
from vitlab.dynamics.layer_freezing import LayerFreezer
from vitlab.environment import environment
from vitlab.layers import Attention
from vitlab.models import create_model

if __package__ in (None, ""):  # run as a file: the suite is imported from the repository root
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.naming import cpu_model, repo_relative, results_path

SIZES = ((1, 5), (8, 65), (32, 65), (8, 257))


def backward_minimum(sizes: tuple[int, int], rounds: int, steps: int) -> dict[int, float]:
    """Minimum backward seconds of a 256-wide, 4-head layer with 0, 2 and 4 heads frozen, at ``(B, N)``."""
    batch, tokens = sizes
    torch.manual_seed(0)
    base = Attention(256, num_heads=4, temperature=True)
    layers = {}
    for frozen in (0, 2, 4):
        layer = copy.deepcopy(base)
        mask = torch.zeros(4, dtype=torch.bool)
        mask[:frozen] = True
        FrozenHeadAttention.install(layer).set_frozen_heads(mask)
        layers[frozen] = layer
    x = torch.randn(batch, tokens, 256, requires_grad=True)
    grad = torch.randn(batch, tokens, 256)
    times: dict[int, list[float]] = {k: [] for k in layers}
    for round_ in range(rounds):
        for frozen in list(layers) if round_ % 2 == 0 else list(layers)[::-1]:
            for step in range(steps):
                layers[frozen].zero_grad(set_to_none=True)
                x.grad = None
                out = layers[frozen](x)
                started = time.thread_time()
                out.backward(grad)
                if round_ >= 2 and step:  # the first rounds and each visit's first step warm up
                    times[frozen].append(time.thread_time() - started)
    return {k: min(v) for k, v in times.items()}


#: (blocks frozen, cached) of the --layers variants
LAYER_VARIANTS = ((0, False), (2, False), (4, False), (2, True), (4, True))


def layer_step_times(rounds: int, steps: int, batches: int = 8) -> dict[str, list[float]]:
    """Mean seconds per training step of each :data:`LAYER_VARIANTS` (``"k"`` or ``"k+cache"``), one per round."""
    torch.manual_seed(0)
    base = create_model("vit_pico", img_size=32, patch_size=4, in_chans=3, num_classes=10)
    data = [(torch.randn(64, 3, 32, 32), torch.randint(0, 10, (64,))) for _ in range(batches)]
    variants = {}
    for frozen, cached in LAYER_VARIANTS:
        model = copy.deepcopy(base)
        freezer = LayerFreezer(model, max_frozen=4)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.05)
        freezer.attach(optimizer)
        freezer.freeze(frozen)
        prefix = (
            CachedPrefix(freezer.block_modules(model), PrefixCache(2**30, Path("unused.npy"), 0)) if cached else None
        )
        variants[f"{frozen}{'+cache' if cached else ''}"] = (model, optimizer, prefix, frozen)
    times: dict[str, list[float]] = {name: [] for name in variants}
    for round_ in range(rounds + 1):  # round 0 warms up and fills the caches: every batch once
        order = list(variants) if round_ % 2 == 0 else list(variants)[::-1]
        picks = [(round_ * steps + step) % batches for step in range(steps)] if round_ else range(batches)
        for name in order:
            model, optimizer, prefix, frozen = variants[name]
            started = time.thread_time()
            for pick in picks:
                x, y = data[pick]
                if prefix is not None:
                    prefix.start_batch(x, frozen)
                optimizer.zero_grad(set_to_none=True)
                torch.nn.functional.cross_entropy(model(x), y).backward()
                optimizer.step()
                if prefix is not None:
                    prefix.end_batch()
            if round_:
                times[name].append((time.thread_time() - started) / len(picks))
    return times


def main_layers(args: argparse.Namespace) -> None:
    """``--layers``: :func:`layer_step_times`, printed and written with the per-round ratios to the unfrozen model."""
    load_before = os.getloadavg()
    times = layer_step_times(args.rounds, args.steps)
    ratios = {name: [t / b for t, b in zip(v, times["0"], strict=True)] for name, v in times.items()}
    for name, values in times.items():
        median = sorted(ratios[name])[len(values) // 2]
        print(f"{name:>8}: {1e3 * min(values):7.1f} ms per step (min), median ratio to unfrozen {median:.3f}")
    out = Path(args.out if args.out != DEFAULT_OUT else str(results_path("micro", "frozen_layers")))
    out.parent.mkdir(parents=True, exist_ok=True)
    results = {
        "benchmark": "frozen_layers",
        "command": " ".join(["python -m benchmarks.micro.frozen_layer", *sys.argv[1:]]),
        "note": (
            "one thread on a shared, loaded machine (other processes ran beside it): thread CPU time per step; "
            "compare the per-round ratios, not the absolute times"
        ),
        "setup": "vit_pico, 32x32x3, patch 4 (64 tokens), batch 64, 8 fixed batches, AdamW, k of 4 blocks frozen",
        "cpu": cpu_model(),
        "load_average_before_after": [load_before, os.getloadavg()],
        "torch": torch.__version__,
        "environment": {**environment(), "command": ["python", *repo_relative(sys.argv)]},
        "processor": platform.processor(),
        "seconds_per_step": times,
        "ratio_to_unfrozen": ratios,
    }
    out.write_text(json.dumps(results, indent=2))
    print(f"wrote {out}")


DEFAULT_OUT = str(results_path("micro", "frozen_layer"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--out", default=DEFAULT_OUT)
    parser.add_argument("--layers", action="store_true", help="time training steps with frozen blocks instead")
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.layers:
        main_layers(args)
        return
    rows = []
    for sizes in SIZES:
        minima = backward_minimum(sizes, args.rounds, args.steps)
        rows.append(
            {"batch": sizes[0], "tokens": sizes[1], "backward_us": {str(k): 1e6 * v for k, v in minima.items()}}
        )
        us = rows[-1]["backward_us"]
        print(
            f"B={sizes[0]:>2} N={sizes[1]:>3}: backward {us['0']:8.0f} us unfrozen, {us['2']:8.0f} us half frozen "
            f"({us['2'] - us['0']:+.0f}), {us['4']:8.0f} us all frozen ({us['4'] - us['0']:+.0f})"
        )
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    results = {
        "benchmark": "frozen_layer",
        "torch": torch.__version__,
        "environment": {**environment(), "command": ["python", *repo_relative(sys.argv)]},
        "processor": platform.processor(),
        "rows": rows,
    }
    out.write_text(json.dumps(results, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
