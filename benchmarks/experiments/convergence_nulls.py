"""Null models and positive controls of ViTCAE's convergence decision (issue 44; docs/dynamics.md, "The convergence
rule"): how often each rule calls a head converged that has not settled, and how soon it calls one that has.

    python -m benchmarks.experiments.convergence_nulls \
        --out benchmarks/results/experiments/convergence_nulls_<cpu>_<date>.json
    python -m benchmarks.experiments.convergence_nulls --runs 2 --quick --out /tmp/nulls.json   # seconds (tests)
    python -m benchmarks.experiments.convergence_nulls --schedule cosine --json --runs 20 --out FILE  # one schedule
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
- ``jitter``: fresh ``N(0, step^2)`` noise around fixed logits each epoch (movement that goes nowhere);
- ``saturating_walk``: a shared walk with large steps (1.0): the softmax saturates, so the drift falls while the
  logits keep moving (issue 53);
- ``fading_trend``: a steady movement of the logits one way (a shared direction, ``step / 60`` an epoch) under fresh
  jitter that falls from ``step`` to ``step / 30`` (``1/30 + 29/30 * 0.75^t`` of it): each epoch it moves by less
  than that epoch's noise, and the drift falls with the noise (issue 61);
- ``settle_move``: the decay control until epoch 24, then a constant-speed move to a third pattern: a head that pauses
  and moves again, judged by whether it is still frozen at epoch 40 (``thaw``; ``dynamics.thaw``).

``--schedule`` scales every process's step per epoch as a learning-rate schedule would (``constant``, ``cosine`` to 0,
``step`` x0.1 at epochs 14 and 27, ``plateau`` x0.5 at epochs 14 and 27, ``warmup_cosine``: 3 epochs of linear
warm-up, then cosine, ``sgdr``: cosine with warm restarts every 10 epochs, Loshchilov and Hutter, ICLR 2017), AdamW's
rate for the attention walk, and the time of the decay control's approach; the ``response`` rule reads the drift and
the score drift (:func:`vitlab.diagnostics.dynamics.score_drift`, as the controller measures it) per unit of that
rate, and the score MSDs over 1 and ``lag`` epochs (:class:`vitlab.diagnostics.trend.LagWindow`, its lag clause).
``response_update`` (attention processes only) divides by each head's own update instead, ``||delta W_q,h|| +
||delta W_k,h||`` over the epoch: measured beside it to choose. ``response+lag``, ``response-score`` and
``response-directedness``: the default rule with the lag clause, without the score clause, without the directedness.
The nulls are open-loop: the paths never change when a head is called converged (nothing is frozen), so a decision
never feeds back into the movement it judges.

Positive controls: ``decay`` (the distributions approach a second pattern geometrically, ``1 - q^t``, under a
jitter floor: the head settles; its *floor epoch* is the first at which the approach's own drift is below the
floor's) and ``directed`` (a constant-speed path between two patterns: W1 along a mixture path is linear, so the
drift is constant; it never settles). For each process, setting and rule: the share of deciding epochs in which a
head is stable, the share of runs in which it is converged (frozen) by epoch 40, and for ``decay`` the epochs from
the floor to convergence.
"""

from __future__ import annotations

import argparse
import dataclasses
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
from vitlab.diagnostics.convergence import ConvergenceTracker, directedness
from vitlab.diagnostics.dynamics import attention_drift, patch_grid_cost, score_drift
from vitlab.diagnostics.rho_calibration import calibrate_rho
from vitlab.diagnostics.trend import LagWindow
from vitlab.environment import environment

EPOCHS, BURN_IN, PATIENCE = 40, 5, 3
SETTINGS = (((4, 4), 144), ((8, 8), 64), ((16, 16), 16))  # digits/MNIST probe, CelebA-32, a 256-token grid
NULLS = ("independent_walk", "shared_walk", "heavy_walk", "attention_walk", "jitter", "saturating_walk", "fading_trend")
CONTROLS = ("decay", "directed", "attention_settle", "settle_move")
# the attention walk's learning rates; the decay's q; the share of the path the directed motion covers in 40 epochs
STEPS = {
    "attention_walk": (1e-3, 1e-4),
    "attention_settle": (1e-3,),
    "decay": (0.7, 0.85),
    "settle_move": (0.7,),
    "directed": (1.0, 0.25),
    "saturating_walk": (1.0,),
}
DEFAULT_STEPS = (0.03, 0.3)
RULES = ("response", "decay", "noise", "relative")
#: the default rule with the lag clause (``response+lag``: ``lag`` LAG epochs, ``lag_ratio`` LAG_RATIO) or less one
#: clause (``-score``: no score clause; ``-directedness``: no directedness clause), to measure what each clause stops
ABLATIONS = ("response+lag", "response-score", "response-directedness")
LAG, LAG_RATIO = 6, 0.5
ATTENTION = ("attention_walk", "attention_settle")
MOVE_AT = 25  # settle_move: the epoch its second movement starts


def _cosine(t: torch.Tensor, length: float) -> torch.Tensor:
    return 0.5 * (1 + torch.cos(math.pi * t / length))


def schedule(name: str, epochs: int = EPOCHS) -> torch.Tensor:
    """Each epoch's rate factor ``[epochs]`` float64 (taken at the epoch's middle)."""
    t = torch.arange(epochs, dtype=torch.float64) + 0.5
    one = torch.ones(epochs, dtype=torch.float64)
    if name == "constant":
        return one
    if name == "cosine":
        return _cosine(t, epochs)
    if name in ("step", "plateau"):
        factor = 0.1 if name == "step" else 0.5
        return one * factor ** ((t > 13).double() + (t > 26).double())
    if name == "warmup_cosine":
        warm = 3
        return torch.where(t < warm, t / warm, _cosine(t - warm, epochs - warm))
    if name == "sgdr":
        return _cosine(t % 10, 10)
    raise ValueError(f"schedule must be one of {', '.join(SCHEDULES)}, got {name!r}")


SCHEDULES = ("constant", "cosine", "step", "plateau", "warmup_cosine", "sgdr")


def paths(
    kind: str, grid: tuple[int, int], images: int, step: float, g: torch.Generator, rate: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One process's distributions ``[EPOCHS + 1, heads, images, N]`` (one head, except the attention processes: 4)
    under the rate factors ``rate: [EPOCHS]``, and for the attention processes each head's update ``[EPOCHS, 4]``."""
    n = grid[0] * grid[1]
    o = dict(generator=g, dtype=torch.float64)
    base = torch.randn(images, n, **o)
    scale = rate[:, None, None]
    if kind in ATTENTION:
        return attention_walk(grid, images, step, g, rate, settle=kind == "attention_settle")
    if kind in ("independent_walk", "shared_walk", "saturating_walk"):
        shared = 1 if kind != "independent_walk" else images
        logits = torch.cat([base[None], base + (step * scale * torch.randn(EPOCHS, shared, n, **o)).cumsum(0)])
    elif kind == "heavy_walk":
        # a multivariate Student-t step (3 degrees of freedom, unit variance per logit): the whole step's size is
        # heavy-tailed, so now and then every patch jumps at once
        chi2 = torch.randn(EPOCHS, 1, 1, 3, **o).pow(2).sum(-1)
        t = torch.randn(EPOCHS, 1, n, **o) / (chi2 / 3).sqrt() / math.sqrt(3)
        logits = torch.cat([base[None], base + (step * scale * t).cumsum(0)])
    elif kind == "fading_trend":
        direction, noise = torch.randn(1, n, **o), step * (1 / 30 + 29 / 30 * 0.75 ** torch.arange(EPOCHS + 1.0))
        moved = torch.cat([torch.zeros(1, dtype=torch.float64), rate.cumsum(0)])[:, None, None] * step / 60
        jitter = (noise * torch.cat([torch.ones(1, dtype=torch.float64), rate]))[:, None, None]
        logits = base + moved * direction + jitter * torch.randn(EPOCHS + 1, images, n, **o)
    elif kind == "jitter":
        logits = base + step * torch.cat([torch.ones(1, 1, 1, dtype=torch.float64), scale]) * torch.randn(
            EPOCHS + 1, images, n, **o
        )
    else:
        target = (2 * torch.randn(images, n, **o)).softmax(-1)
        time_ = torch.cat([torch.zeros(1, dtype=torch.float64), rate.cumsum(0)])  # the approach runs at the rate
        lam = 1 - step**time_ if kind in ("decay", "settle_move") else step * time_ / EPOCHS
        p = (1 - lam)[:, None, None] * base.softmax(-1) + lam[:, None, None] * target
        if kind == "directed":
            return p[:, None], None
        if kind == "settle_move":  # from MOVE_AT on, a constant-speed move to a third pattern
            third = (2 * torch.randn(images, n, **o)).softmax(-1)
            moved = ((time_ - time_[MOVE_AT - 1]) / (time_[-1] - time_[MOVE_AT - 1])).clamp(0, 1)[:, None, None]
            p = (1 - moved) * p + moved * third
        return jittered(p, g, rate)[:, None], None
    return logits.softmax(-1)[:, None], None


FLOOR_JITTER = 1e-3  # the decay control's jitter floor, in logits


def jittered(p: torch.Tensor, g: torch.Generator, rate: torch.Tensor) -> torch.Tensor:
    """Distributions ``p: [T, images, N]`` under fresh ``N(0, (FLOOR_JITTER r_t)^2)`` noise of their logits each
    epoch (``rate: [T - 1]``, the noise of a step scales with its rate; epoch 0 at 1)."""
    scale = torch.cat([torch.ones(1, dtype=torch.float64), rate])[:, None, None]
    return (p.log() + FLOOR_JITTER * scale * torch.randn(p.shape, generator=g, dtype=torch.float64)).softmax(-1)


def jitter_floor(
    grid: tuple[int, int], images: int, cost: torch.Tensor, g: torch.Generator, rate: torch.Tensor
) -> torch.Tensor:
    """The decay control's floor, per epoch ``[EPOCHS]``: the drift of the same jitter around a fixed pattern."""
    fixed = torch.randn(images, grid[0] * grid[1], generator=g, dtype=torch.float64).softmax(-1)
    still = jittered(fixed.expand(EPOCHS + 1, -1, -1), g, rate)
    return attention_drift(still[:-1], still[1:], cost).mean(-1)


def attention_walk(
    grid: tuple[int, int], images: int, lr: float, g: torch.Generator, rate: torch.Tensor, settle: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """CLS-to-patch attention of a real ``Attention`` (dim 64, 4 heads) on fixed random tokens while AdamW steps its
    ``W_qkv`` (at ``lr`` times the epoch's ``rate``), 50 steps an epoch, on pure-noise gradients or, with ``settle``,
    on the gradient of ``||W - W*||^2 / 2`` toward a fixed ``W*`` plus the same noise (the head settles at ``W*``).
    Returns ``[EPOCHS + 1, 4, images, N]`` and each head's update per epoch ``[EPOCHS, 4]`` (the norms of its q and
    k rows' change, summed)."""
    from vitlab.diagnostics.capture import capture_attention
    from vitlab.layers import Attention

    torch.manual_seed(int(torch.randint(0, 2**31, (1,), generator=g)))
    n = grid[0] * grid[1]
    attn = Attention(64, num_heads=4)
    tokens = torch.randn(images, 1 + n, 64, generator=g)
    weight = attn.qkv.weight
    target = 3 * torch.randn(weight.shape, generator=g) / 8 if settle else None
    opt = torch.optim.AdamW([weight], lr=lr, weight_decay=0.05)
    out, updates = [], []
    for epoch in range(EPOCHS + 1):
        if epoch:
            for group in opt.param_groups:
                group["lr"] = lr * float(rate[epoch - 1])
            before = weight.detach().clone()
            for _ in range(50):
                noise = torch.randn(weight.shape, generator=g)
                weight.grad = noise if target is None else (weight.detach() - target) + 0.1 * noise
                opt.step()
            change = (weight.detach() - before)[:128].view(2, 4, 16, 64)  # q and k rows, per head
            updates.append(change.flatten(2).norm(dim=-1).sum(0))
        maps = next(iter(capture_attention(_Wrap(attn), tokens).values()))  # [images, 4, 1 + n, 1 + n]
        cls = maps[:, :, 0, 1:].double()
        out.append((cls / cls.sum(-1, keepdim=True)).transpose(0, 1))
    return torch.stack(out), torch.stack(updates).double()


class _Wrap(torch.nn.Module):
    def __init__(self, attn: torch.nn.Module) -> None:
        super().__init__()
        self.attn = attn

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.attn(x)


def drifts(p: torch.Tensor, cost: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """One head's path ``[EPOCHS + 1, images, N]`` -> its drifts ``d(t-1, t)`` (t = 1..EPOCHS) and ``d(t-2, t)``
    (t = 2..EPOCHS) and its score drifts (t = 1..EPOCHS), each averaged over the images as the controller does, and
    its score MSDs over 1 and ``lag`` epochs ``[EPOCHS, 2]`` (:class:`LagWindow`, as the controller measures them)."""
    window = LagWindow(DynamicsConfig().lag or LAG)
    lagged = torch.stack([window.push(epoch[None, None]).flatten() for epoch in p])[1:]
    return (
        attention_drift(p[:-1], p[1:], cost).mean(-1),
        attention_drift(p[:-2], p[2:], cost).mean(-1),
        score_drift(p[1:], p[:-1]).mean(-1),
        lagged,
    )


def decisions(
    measured: tuple, rule: str, rho: float, rate: torch.Tensor, thaw: bool = False, **options: Any
) -> dict[str, Any]:
    """Run the tracker over one head's :func:`drifts` as the controller does, the drift of epoch ``t`` observed
    with ``rate[t - 1]`` (the response rule's unit); ``options``: ``DynamicsConfig`` fields other than the defaults."""
    cfg = DynamicsConfig(**options)
    drift, two, score, lagged = measured
    tracker_rule = "response" if rule == "response_update" or rule in ABLATIONS else rule
    lag = {"lag": LAG, "lag_ratio": LAG_RATIO} if rule == "response+lag" else {}
    cfg = dataclasses.replace(cfg, patience=PATIENCE, convergence=tracker_rule, tau_clause="none", thaw=thaw, **lag)
    tracker = ConvergenceTracker(1, 1, cfg, rho=rho)
    stable, deciding, converged_at, converged = 0, 0, None, torch.zeros(1, 1, dtype=torch.bool)
    ones = torch.ones(1, 1)
    for epoch in range(1, EPOCHS + 1):
        d = drift[epoch - 1].view(1, 1)
        scored = None if rule == "response-score" else score[epoch - 1].view(1, 1)
        tracker.observe(d, float(rate[epoch - 1]), scored, lagged[epoch - 1].view(2, 1, 1))
        if epoch < BURN_IN:
            continue
        before = tracker.streak.clone()
        r = None if epoch < 2 else directedness(two[epoch - 2], drift[epoch - 2], drift[epoch - 1]).view(1, 1)
        r = torch.zeros(1, 1) if rule == "response-directedness" else r
        converged = tracker.decide(d, ones, r)
        if epoch > BURN_IN:  # the first decision only records tau
            deciding += 1
            stable += int(tracker.streak.item() > before.item())
        if converged.item() and converged_at is None:
            converged_at = epoch
    return {
        "stable_share": stable / max(deciding, 1),
        "converged_at": converged_at,
        "converged_at_end": bool(converged.item()),
        "drift": drift.tolist(),
    }


def _row(kind, grid, images, step, name, rule, results, thaw=False) -> dict[str, Any]:
    return {
        "process": kind,
        "schedule": name,
        "grid": list(grid),
        "images": images,
        "step": step,
        "rule": rule + ("+thaw" if thaw else ""),
        "default": rule == DynamicsConfig().convergence and thaw == DynamicsConfig().thaw,
        "heads": len(results),
        "stable_share": sum(r["stable_share"] for r in results) / len(results),
        "converged_share": sum(r["converged_at"] is not None for r in results) / len(results),
        "converged_at_end_share": sum(r["converged_at_end"] for r in results) / len(results),
        "converged_at": [r["converged_at"] for r in results],
    }


def run(runs: int, settings: tuple, quick: bool, name: str = "constant", verbose: bool = True) -> dict[str, Any]:
    rows = []
    rate = schedule(name)
    for grid, images in settings:
        cost = patch_grid_cost(*grid, "image")
        rho = calibrate_rho(grid, images, "image")
        for kind in NULLS + CONTROLS:
            for step in STEPS.get(kind, DEFAULT_STEPS)[: 1 if quick else None]:
                g = torch.Generator().manual_seed(1000 * len(rows) + 1)
                heads = []
                for _ in range(runs):
                    p, updates = paths(kind, grid, images, step, g, rate)
                    heads += [(p[:, h], None if updates is None else updates[:, h]) for h in range(p.shape[1])]
                floors = jitter_floor(grid, images, cost, g, rate) if kind == "decay" else None
                measured = [drifts(h, cost) for h, _ in heads]
                variants = [(rule, False) for rule in RULES + ABLATIONS]
                variants += [("response_update", False)] if kind in ATTENTION else []
                variants += [("response", True)] if kind == "settle_move" else []
                for rule, thaw in variants:
                    results = [
                        decisions(m, rule, rho, u if rule == "response_update" else step * rate, thaw)
                        for m, (_, u) in zip(measured, heads, strict=True)
                    ]
                    row = _row(kind, grid, images, step, name, rule, results, thaw)
                    if floors is not None:
                        reached = [
                            next((t + 1 for t, d in enumerate(r["drift"]) if d <= floors[t]), None) for r in results
                        ]
                        row["floor_epoch"] = reached
                        row["late_by"] = [
                            None if c is None or f is None else c - max(f, BURN_IN)
                            for c, f in zip(row["converged_at"], reached, strict=True)
                        ]
                    rows.append(row)
                    if verbose:
                        print(
                            f"{kind:17s} {name:13s} grid {grid[0]}x{grid[1]} P={images:3d} step {step:g} "
                            f"{row['rule']:15s} stable {row['stable_share']:.3f} "
                            f"converged {row['converged_share']:.2f}",
                            file=sys.stderr,
                            flush=True,
                        )
    return {"rows": rows}


def table(result: dict[str, Any]) -> str:
    """The docs' table: per process, schedule and rule, the worst setting's share of stable epochs and of runs
    converged by epoch 40 (a null's must stay under 5% and 0%), and for the decay control the latest convergence
    after its floor; settle_move: the share still converged at epoch 40 (through its second movement)."""
    rules = sorted({r["rule"] for r in result["rows"]}, key=lambda r: (r.split("+")[0] not in RULES, r))
    rules = [r for r in rules if r not in ABLATIONS]
    lines = [
        "| process | schedule | " + " | ".join(f"{rule}: stable / converged" for rule in rules) + " |",
        "|---|---|" + "---|" * len(rules),
    ]
    for kind in NULLS + CONTROLS:
        for name in SCHEDULES:
            cells = []
            for rule in rules:
                rows = [r for r in result["rows"] if (r["process"], r["schedule"], r["rule"]) == (kind, name, rule)]
                if not rows:
                    cells.append("")
                    continue
                stable = max(r["stable_share"] for r in rows)
                key = "converged_at_end_share" if kind == "settle_move" else "converged_share"
                converged = (min if kind == "decay" else max)(r[key] for r in rows)
                cells.append(f"{100 * stable:.1f}% / {100 * converged:.0f}%")
            if any(cells):
                lines.append(f"| {kind} | {name} | " + " | ".join(cells) + " |")
    lines += ["", decay_control_line(result)]
    return "\n".join(lines)


def decay_control_line(result: dict[str, Any]) -> str:
    """The decay control under the default rule: of the heads that reached their floor early enough to be judged
    (floor epoch + patience + 2 <= 40), how many converged within patience + 2 epochs of it, and how late."""
    default, bound = DynamicsConfig().convergence, result["patience"] + 2
    rows = [r for r in result["rows"] if r["process"] == "decay" and r["rule"] == default]
    heads = [(f, c) for r in rows for f, c in zip(r["floor_epoch"], r["converged_at"], strict=True)]
    judged = [(f, c) for f, c in heads if f is not None and max(f, BURN_IN) + bound <= EPOCHS]
    late = [None if c is None else c - max(f, BURN_IN) for f, c in judged]
    within = sum(x is not None and x <= bound for x in late)
    known = [x for x in late if x is not None]
    spread = f", {min(known)} to {max(known)} epochs after it (negative: before)" if known else ""
    censored = sum(f is not None for f, _ in heads) - len(judged)
    return (
        f"Decay control, default rule ({default}): {len(judged)} of {len(heads)} heads reached their floor by epoch "
        f"{EPOCHS - bound} (floor, or the first deciding epoch if later; {censored} later, too late to judge); "
        f"{within} of them converged within patience + 2 = {bound} epochs of it{spread}."
    )


def main(argv: list[str] | None = None) -> int:
    if argv is None:
        argv = sys.argv[1:]
    if argv[:1] == ["table"]:  # python -m benchmarks.experiments.convergence_nulls table FILE [FILE ...]
        results = [json.loads(Path(f).read_text()) for f in argv[1:]]
        print(table({**results[0], "rows": [row for r in results for row in r["rows"]]}))
        return 0
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, help="the results file (required unless --json)")
    parser.add_argument("--json", action="store_true", help="print the records as a JSON list to stdout")
    parser.add_argument("--runs", type=int, default=20, help="runs (paths) per process, setting and step")
    parser.add_argument("--quick", action="store_true", help="the first setting and step only (the test's size)")
    parser.add_argument("--schedule", choices=SCHEDULES, nargs="+", default=["constant"], help="rate schedules")
    parser.add_argument(
        "--settings", type=int, nargs="+", default=[0, 1, 2], help=f"indices into the settings {SETTINGS}"
    )
    args = parser.parse_args(argv)
    if args.out is None and not args.json:
        parser.error("pass --out FILE, --json, or both")
    if args.out is not None and args.out.exists():
        raise SystemExit(f"error: {args.out} exists; pass another --out (results are never overwritten)")
    torch.set_num_threads(1)
    start, env = time.perf_counter(), environment()  # the revision that runs, before anything can change the tree
    settings = SETTINGS[:1] if args.quick else tuple(SETTINGS[i] for i in args.settings)
    rows = [row for name in args.schedule for row in run(args.runs, settings, args.quick, name)["rows"]]
    if args.json:
        keys = ("process", "schedule", "rule", "default", "stable_share", "converged_share")
        print(json.dumps([{k: row[k] for k in keys} | {"step": row["step"], "grid": row["grid"]} for row in rows]))
    if args.out is not None:
        result = {
            "rows": rows,
            "epochs": EPOCHS,
            "burn_in": BURN_IN,
            "patience": PATIENCE,
            "defaults": {
                k: getattr(DynamicsConfig(), k)
                for k in (
                    "convergence",
                    "decay_ratio",
                    "decay_window",
                    "response_ratio",
                    "score_ratio",
                    "lag",
                    "lag_ratio",
                    "thaw",
                )
            },
            "runs": args.runs,
            "seconds": time.perf_counter() - start,
            "environment": env | {"command": ["python", *repo_relative(sys.argv)]},
        }
        atomic_write_text(args.out, json.dumps(result, indent=1) + "\n")
        print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
