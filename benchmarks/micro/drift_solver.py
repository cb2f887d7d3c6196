"""Time of one exact drift problem on each patch grid: ``attention_drift`` against the implementation it replaced.

``attention_drift`` (ViTCAE, "Convergence diagnostics") solves one optimal-transport problem per image and head with
POT's network simplex (``emd_c``). It prepares the marginals of all problems in one vectorised pass and hands the
solver the whole cost matrix, which drops the zero-mass points itself. Before (issue 15's first pass) each problem
was cut to its support in Python first (``np.ix_``), :func:`previous_drift` below. This script times both on the
same random attention distributions (a probe's worth of images x 16 heads per grid), minimum of ``--repeats``, and
checks that they agree. ``--workers 2 4`` also times ``attention_drift(..., workers=n)`` (``dynamics.drift_workers``:
the problems split over threads) and checks that its values are identical to one thread's.

Run (single-threaded, about a minute)::

    python -m benchmarks.micro.drift_solver --threads 1
    python -m benchmarks.micro.drift_solver --threads 1 --workers 2   # on an idle 2-core machine

Writes ``benchmarks/results/micro/drift_solver_<device>_<date>.json`` (:mod:`benchmarks.naming`).
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
from functools import partial
from pathlib import Path

import numpy as np
import torch
from ot.lp.emd_wrap import emd_c

from vitlab.acceleration.compile_mode import fastest
from vitlab.diagnostics.dynamics import attention_drift, patch_grid_cost
from vitlab.environment import environment

if __package__ in (None, ""):  # run as a file: the suite is imported from the repository root
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.naming import results_path

# (grid side, probe images); 16 heads each
CASES = ((4, 180), (5, 100), (6, 100), (7, 60), (8, 64), (10, 16), (14, 8))
HEADS = 16


def previous_drift(p: torch.Tensor, q: torch.Tensor, cost: torch.Tensor) -> torch.Tensor:
    """``attention_drift`` as it was before: each Kantorovich-Rubinstein-reduced problem cut out in Python."""
    n = p.shape[-1]
    p64, q64 = p.double().reshape(-1, n), q.double().reshape(-1, n)
    difference = (p64 / p64.sum(-1, keepdim=True) - q64 / q64.sum(-1, keepdim=True)).numpy()
    cost_np = np.ascontiguousarray(cost.double().numpy())
    surplus, deficit = difference > 0, difference < 0
    moved_mass = np.where(surplus, difference, 0).sum(-1)
    drift = np.zeros(difference.shape[0])
    for i in np.flatnonzero((moved_mass > 0) & deficit.any(-1)):
        delta, rows, columns = difference[i], surplus[i], deficit[i]
        source = delta[rows] / moved_mass[i]
        target = -delta[columns]
        target = target / target.sum()
        target = target * source.sum(0) / target.sum(0, keepdims=True)
        drift[i] = moved_mass[i] * emd_c(source, target, cost_np[np.ix_(rows, columns)], 100_000, 1)[1]
    return torch.from_numpy(drift).reshape(p.shape[:-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--workers", type=int, nargs="*", default=[], help="also time these thread counts")
    parser.add_argument("--out", default=str(results_path("micro", "drift_solver")))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    rows = []
    for side, images in CASES:
        torch.manual_seed(0)
        cost = patch_grid_cost(side, side, units="image")
        logits = 2 * torch.randn(images, HEADS, side * side)
        p, q = logits.softmax(-1), (logits + 0.3 * torch.randn_like(logits)).softmax(-1)
        problems = images * HEADS
        now_s, now = fastest(partial(attention_drift, p, q, cost), args.repeats, warmup=1)
        before_s, before = fastest(partial(previous_drift, p, q, cost), args.repeats, warmup=1)
        rows.append(
            {
                "grid": side,
                "problems": problems,
                "us_per_problem": 1e6 * now_s / problems,
                "previous_us_per_problem": 1e6 * before_s / problems,
                "max_abs_difference": float((now - before).abs().max()),
                "workers": {},
            }
        )
        row = rows[-1]
        line = (
            f"{side:>2}x{side:<2} {problems:>5} problems: {row['us_per_problem']:7.1f} us per problem, before "
            f"{row['previous_us_per_problem']:7.1f} us ({before_s / now_s:.2f}x); largest difference "
            f"{row['max_abs_difference']:.1e}"
        )
        for workers in args.workers:
            threaded_s, threaded = fastest(
                partial(attention_drift, p, q, cost, workers=workers), args.repeats, warmup=1
            )
            row["workers"][str(workers)] = {
                "us_per_problem": 1e6 * threaded_s / problems,
                "speedup": now_s / threaded_s,
                "identical": bool(torch.equal(threaded, now)),
            }
            line += f"; {workers} workers {now_s / threaded_s:.2f}x (identical: {torch.equal(threaded, now)})"
        print(line)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    results = {
        "benchmark": "drift_solver",
        "torch": torch.__version__,
        "environment": environment(),
        "processor": platform.processor() or platform.machine(),
        "threads": args.threads,
        "workers": args.workers,
        "rows": rows,
    }
    out.write_text(json.dumps(results, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
