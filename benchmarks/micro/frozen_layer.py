"""Backward time of one ``Attention`` layer with 0, half and all of its heads frozen (ViTCAE eq. 26), at a tiny size
where fixed per-call costs dominate and at training sizes.

The whole-model benchmark (``benchmarks/micro/freezing.py``) compares time with a FLOP prediction, which has no term for
what a call costs regardless of its size (Python, dispatch, small products). Here one layer ``[B, N, 256]``, 4 heads,
is timed alone: at ``B=1, N=5`` its backward is almost all fixed cost, so the difference between the frozen and the
unfrozen layer there is the fixed cost that freezing adds. Each variant is its own copy of the layer; rounds
alternate their order; minimum of the backward over the rounds, on this thread's CPU clock.

Run (single-threaded, about a minute)::

    python -m benchmarks.micro.frozen_layer

Writes ``benchmarks/results/micro/frozen_layer_<device>_<date>.json`` (:mod:`benchmarks.naming`).
"""

from __future__ import annotations

import argparse
import copy
import json
import platform
import sys
import time
from pathlib import Path

import torch

from vitlab.dynamics import FrozenHeadAttention
from vitlab.environment import environment
from vitlab.layers import Attention

if __package__ in (None, ""):  # run as a file: the suite is imported from the repository root
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.naming import results_path

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--out", default=str(results_path("micro", "frozen_layer")))
    args = parser.parse_args()
    torch.set_num_threads(1)
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
        "environment": environment(),
        "processor": platform.processor(),
        "rows": rows,
    }
    out.write_text(json.dumps(results, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
