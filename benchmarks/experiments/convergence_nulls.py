"""Null models and positive controls of ViTCAE's convergence decision (issue 44; docs/dynamics.md, "The convergence
rule"): how often each rule calls a head converged that has not settled, and how soon it calls one that has.

    python -m benchmarks.experiments.convergence_nulls \
        --out benchmarks/results/experiments/convergence_nulls_<cpu>_<date>.json
    python -m benchmarks.experiments.convergence_nulls --runs 2 --quick --out /tmp/nulls.json   # seconds (tests)
    python -m benchmarks.experiments.convergence_nulls table FILE [FILE ...]   # the docs' table

A head's probe is ``images`` CLS-to-patch distributions on a ``grid``; a *process* moves them for 40 epochs; the
drift of every epoch (:func:`vitlab.diagnostics.dynamics.attention_drift`, averaged over the images, as the
controller does) goes through :class:`vitlab.diagnostics.convergence.ConvergenceTracker` exactly as
:class:`vitlab.dynamics.DynamicsPolicy` calls it (observed every epoch, decided from ``burn_in`` on, tau held at 1,
``tau_clause: none``). Null processes (a head that has not settled: it keeps moving by a constant step):

- ``independent_walk``: every image's logits take their own ``N(0, step^2)`` step each epoch;
- ``shared_walk``: one step shared by all images (a change of the head's weights moves every image's attention);
- ``heavy_walk``: a shared step with Student-t tails (3 degrees of freedom, unit variance);
- ``attention_walk``: a real :class:`vitlab.layers.Attention`'s ``W_qkv`` under ``torch.optim.AdamW`` with
  pure-noise gradients at a constant learning rate (``step``), 50 steps an epoch, weight decay 0.05; its heads;
- ``jitter``: fresh ``N(0, step^2)`` noise around fixed logits each epoch (movement that goes nowhere).

Positive controls: ``decay`` (the distributions approach a second pattern geometrically, ``1 - q^t``, under a
jitter floor: the head settles; its *floor epoch* is the first at which the approach's own drift is below the
floor's) and ``directed`` (a constant-speed path between two patterns: W1 along a mixture path is linear, so the
drift is constant; it never settles). For each process, setting and rule: the share of deciding epochs in which a
head is stable, the share of runs in which it is converged (frozen) by epoch 40, and for ``decay`` the epochs from
the floor to convergence.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

import torch

from benchmarks.naming import repo_relative
from vitlab.atomic import atomic_write_text
from vitlab.config.dynamics import DynamicsConfig
from vitlab.diagnostics.convergence import ConvergenceTracker, calibrate_rho, directedness
from vitlab.diagnostics.dynamics import attention_drift, patch_grid_cost
from vitlab.environment import environment

EPOCHS, BURN_IN, PATIENCE = 40, 5, 3
SETTINGS = (((4, 4), 144), ((8, 8), 64), ((16, 16), 16))  # digits/MNIST probe, CelebA-32, a 256-token grid
NULLS = ("independent_walk", "shared_walk", "heavy_walk", "attention_walk", "jitter")
CONTROLS = ("decay", "directed")
# the attention walk's learning rates; the decay's q; the share of the path the directed motion covers in 40 epochs
STEPS = {"attention_walk": (1e-3, 1e-4), "decay": (0.7, 0.85), "directed": (1.0, 0.25)}
DEFAULT_STEPS = (0.03, 0.3)
RULES = ("decay", "noise", "relative")


def paths(kind: str, grid: tuple[int, int], images: int, step: float, g: torch.Generator) -> torch.Tensor:
    """One process's distributions ``[EPOCHS + 1, heads, images, N]`` (one head, except ``attention_walk``: 4)."""
    n = grid[0] * grid[1]
    o = dict(generator=g, dtype=torch.float64)
    base = torch.randn(images, n, **o)
    if kind == "attention_walk":
        return attention_walk(grid, images, step, g)
    if kind == "independent_walk":
        logits = torch.cat([base[None], base + (step * torch.randn(EPOCHS, images, n, **o)).cumsum(0)])
    elif kind == "shared_walk":
        logits = torch.cat([base[None], base + (step * torch.randn(EPOCHS, 1, n, **o)).cumsum(0)])
    elif kind == "heavy_walk":
        # a multivariate Student-t step (3 degrees of freedom, unit variance per logit): the whole step's size is
        # heavy-tailed, so now and then every patch jumps at once
        chi2 = torch.randn(EPOCHS, 1, 1, 3, **o).pow(2).sum(-1)
        t = torch.randn(EPOCHS, 1, n, **o) / (chi2 / 3).sqrt() / math.sqrt(3)
        logits = torch.cat([base[None], base + (step * t).cumsum(0)])
    elif kind == "jitter":
        logits = base + step * torch.randn(EPOCHS + 1, images, n, **o)
    else:
        target = (2 * torch.randn(images, n, **o)).softmax(-1)
        t = torch.arange(EPOCHS + 1, dtype=torch.float64)
        lam = 1 - step**t if kind == "decay" else step * t / EPOCHS
        p = (1 - lam)[:, None, None] * base.softmax(-1) + lam[:, None, None] * target
        if kind == "directed":
            return p[:, None]
        return jittered(p, g)[:, None]
    return logits.softmax(-1)[:, None]


FLOOR_JITTER = 1e-3  # the decay control's jitter floor, in logits


def jittered(p: torch.Tensor, g: torch.Generator) -> torch.Tensor:
    """Distributions ``p: [T, images, N]`` under fresh ``N(0, FLOOR_JITTER^2)`` noise of their logits each epoch."""
    return (p.log() + FLOOR_JITTER * torch.randn(p.shape, generator=g, dtype=torch.float64)).softmax(-1)


def jitter_floor(grid: tuple[int, int], images: int, cost: torch.Tensor, g: torch.Generator) -> float:
    """The decay control's floor: the median drift of the same jitter around a fixed pattern."""
    fixed = torch.randn(images, grid[0] * grid[1], generator=g, dtype=torch.float64).softmax(-1)
    still = jittered(fixed.expand(EPOCHS + 1, -1, -1), g)
    return float(attention_drift(still[:-1], still[1:], cost).mean(-1).median())


def attention_walk(grid: tuple[int, int], images: int, lr: float, g: torch.Generator) -> torch.Tensor:
    """CLS-to-patch attention of a real ``Attention`` (dim 64, 4 heads) on fixed random tokens while AdamW steps its
    ``W_qkv`` on pure-noise gradients, 50 steps an epoch: ``[EPOCHS + 1, 4, images, N]``."""
    from vitlab.diagnostics.capture import capture_attention
    from vitlab.layers import Attention

    torch.manual_seed(int(torch.randint(0, 2**31, (1,), generator=g)))
    n = grid[0] * grid[1]
    attn = Attention(64, num_heads=4)
    tokens = torch.randn(images, 1 + n, 64, generator=g)
    opt = torch.optim.AdamW([attn.qkv.weight], lr=lr, weight_decay=0.05)
    out = []
    for epoch in range(EPOCHS + 1):
        if epoch:
            for _ in range(50):
                attn.qkv.weight.grad = torch.randn(attn.qkv.weight.shape, generator=g)
                opt.step()
        maps = next(iter(capture_attention(_Wrap(attn), tokens).values()))  # [images, 4, 1 + n, 1 + n]
        cls = maps[:, :, 0, 1:].double()
        out.append((cls / cls.sum(-1, keepdim=True)).transpose(0, 1))
    return torch.stack(out)


class _Wrap(torch.nn.Module):
    def __init__(self, attn: torch.nn.Module) -> None:
        super().__init__()
        self.attn = attn

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.attn(x)


def drifts(p: torch.Tensor, cost: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One head's path ``[EPOCHS + 1, images, N]`` -> its drifts ``d(t-1, t)`` (t = 1..EPOCHS) and ``d(t-2, t)``
    (t = 2..EPOCHS), each averaged over the images as the controller does."""
    return attention_drift(p[:-1], p[1:], cost).mean(-1), attention_drift(p[:-2], p[2:], cost).mean(-1)


def decisions(p: torch.Tensor | tuple, cost: torch.Tensor, rule: str, rho: float) -> dict[str, Any]:
    """Run the tracker over one head's path (or its :func:`drifts`) as the controller does."""
    cfg = DynamicsConfig()
    drift, two = drifts(p, cost) if torch.is_tensor(p) else p
    tracker = ConvergenceTracker(1, 1, cfg.eps_d, cfg.eps_tau, PATIENCE, rule=rule, rho=rho, tau_clause="none")
    stable, deciding, converged_at = 0, 0, None
    ones = torch.ones(1, 1)
    for epoch in range(1, EPOCHS + 1):
        d = drift[epoch - 1].view(1, 1)
        tracker.observe(d)
        if epoch < BURN_IN:
            continue
        before = tracker.streak.clone()
        r = None if epoch < 2 else directedness(two[epoch - 2], drift[epoch - 2], drift[epoch - 1]).view(1, 1)
        converged = tracker.decide(d, ones, r)
        if epoch > BURN_IN:  # the first decision only records tau
            deciding += 1
            stable += int(tracker.streak.item() > before.item())
        if converged.item() and converged_at is None:
            converged_at = epoch
    return {"stable_share": stable / max(deciding, 1), "converged_at": converged_at, "drift": drift.tolist()}


def floor_epoch(drift: list[float], floor: float) -> int | None:
    """The first epoch whose drift is at most ``floor``."""
    return next((t + 1 for t, d in enumerate(drift) if d <= floor), None)


def run(runs: int, settings: tuple, quick: bool) -> dict[str, Any]:
    rows = []
    for grid, images in settings:
        cost = patch_grid_cost(*grid, "image")
        rho = calibrate_rho(grid, images, "image")
        for kind in NULLS + CONTROLS:
            for step in STEPS.get(kind, DEFAULT_STEPS)[: 1 if quick else None]:
                g = torch.Generator().manual_seed(1000 * len(rows) + 1)
                heads = [h for _ in range(runs) for h in paths(kind, grid, images, step, g).unbind(1)]
                floors = None
                if kind == "decay":
                    floors = jitter_floor(grid, images, cost, g)
                measured = [drifts(h, cost) for h in heads]
                for rule in RULES:
                    results = [decisions(m, cost, rule, rho) for m in measured]
                    row = {
                        "process": kind,
                        "grid": list(grid),
                        "images": images,
                        "step": step,
                        "rule": rule,
                        "heads": len(results),
                        "stable_share": sum(r["stable_share"] for r in results) / len(results),
                        "converged_share": sum(r["converged_at"] is not None for r in results) / len(results),
                        "converged_at": [r["converged_at"] for r in results],
                    }
                    if floors is not None:
                        reached = [floor_epoch(r["drift"], float(floors)) for r in results]
                        row["floor_epoch"] = reached
                        row["late_by"] = [
                            None if c is None or f is None else c - max(f, BURN_IN)
                            for c, f in zip(row["converged_at"], reached, strict=True)
                        ]
                    rows.append(row)
                    print(
                        f"{kind:17s} grid {grid[0]}x{grid[1]} P={images:3d} step {step:g} {rule:8s} "
                        f"stable {row['stable_share']:.3f} converged {row['converged_share']:.2f}",
                        flush=True,
                    )
    return {"rows": rows}


def table(result: dict[str, Any]) -> str:
    """The docs' table: per process and rule, the worst setting's share of stable epochs and of runs converged by
    epoch 40 (the nulls' must stay under 5%), and for the decay control the latest convergence after its floor."""
    lines = [
        "| process | " + " | ".join(f"{rule}: stable / converged" for rule in RULES) + " |",
        "|---|" + "---|" * len(RULES),
    ]
    for kind in NULLS + CONTROLS:
        cells = []
        for rule in RULES:
            rows = [r for r in result["rows"] if r["process"] == kind and r["rule"] == rule]
            stable = max(r["stable_share"] for r in rows)
            converged = (min if kind in CONTROLS and kind == "decay" else max)(r["converged_share"] for r in rows)
            cells.append(f"{100 * stable:.1f}% / {100 * converged:.0f}%")
        lines.append(f"| {kind} | " + " | ".join(cells) + " |")
    late = [x for r in result["rows"] if r["process"] == "decay" and r["rule"] == "decay" for x in r["late_by"]]
    known = [x for x in late if x is not None]
    lines.append("")
    converged = sum(c is not None for r in result["rows"] if r["process"] == "decay" for c in r["converged_at"])
    reach = (
        f"converged {min(known)} to {max(known)} epochs after its floor epoch (or after the first deciding epoch, "
        "if later; negative: before)"
        if known
        else "no head reached its floor within 40 epochs"
    )
    lines.append(
        f"Decay control, default rule: {reach}; {len(known)} of {len(late)} heads reached their floor "
        f"(bound: patience + 2 = {result['patience'] + 2})."
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    if argv is None:
        argv = sys.argv[1:]
    if argv[:1] == ["table"]:  # python -m benchmarks.experiments.convergence_nulls table FILE [FILE ...]
        results = [json.loads(Path(f).read_text()) for f in argv[1:]]
        print(table({**results[0], "rows": [row for r in results for row in r["rows"]]}))
        return 0
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--runs", type=int, default=20, help="runs (paths) per process, setting and step")
    parser.add_argument("--quick", action="store_true", help="the first setting and step only (the test's size)")
    parser.add_argument(
        "--settings", type=int, nargs="+", default=[0, 1, 2], help=f"indices into the settings {SETTINGS}"
    )
    args = parser.parse_args(argv)
    if args.out.exists():
        raise SystemExit(f"error: {args.out} exists; pass another --out (results are never overwritten)")
    torch.set_num_threads(1)
    start = time.perf_counter()
    result = run(args.runs, SETTINGS[:1] if args.quick else tuple(SETTINGS[i] for i in args.settings), args.quick)
    result |= {
        "epochs": EPOCHS,
        "burn_in": BURN_IN,
        "patience": PATIENCE,
        "defaults": {k: getattr(DynamicsConfig(), k) for k in ("convergence", "decay_ratio", "decay_window")},
        "runs": args.runs,
        "seconds": time.perf_counter() - start,
        "environment": environment() | {"command": ["python", *repo_relative(sys.argv)]},
    }
    atomic_write_text(args.out, json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
