"""Calibrating the ``noise`` and ``response`` rules' ``rho`` on simulated drifts (ViTCAE, "Convergence";
docs/dynamics.md, "Calibrating rho on simulated drifts"): three reference motions of CLS attention (directed, random
walk, jitter), the directedness series of a path as the controller computes it, and the quantile of a random walk's
directedness that becomes ``rho: auto``."""

from __future__ import annotations

import functools

import torch

from vitlab.diagnostics.convergence import directedness
from vitlab.diagnostics.dynamics import attention_drift, patch_grid_cost

DRIFT_KINDS = ("directed", "random_walk", "jitter")


def simulate_attention_paths(
    kind: str,
    grid: tuple[int, int],
    images: int,
    epochs: int,
    step: float,
    generator: torch.Generator,
    spread: float = 1.0,
) -> torch.Tensor:
    """Synthetic per-epoch CLS-to-patch attention for ``images`` probe images on a ``grid`` of patches, as
    softmaxes of logits ``[images, N]`` drawn ``N(0, spread^2)`` at epoch 0. Returns ``[epochs + 1, images, N]``.

    - ``directed``: the logits move in a straight line toward a second random pattern, ``step`` of the way per
      epoch (attention keeps moving the same way);
    - ``random_walk``: the logits take an independent ``N(0, step^2)`` step every epoch (movement that accumulates
      without a direction);
    - ``jitter``: fresh ``N(0, step^2)`` noise around the fixed epoch-0 logits every epoch (a settled head under
      gradient noise).

    The three reference motions against which the ``noise`` rule's ``rho`` is calibrated (:func:`calibrate_rho`).
    """
    if kind not in DRIFT_KINDS:
        raise ValueError(f"kind must be one of {', '.join(DRIFT_KINDS)}, got {kind!r}")
    if images < 1 or epochs < 2 or not step > 0:
        raise ValueError(f"need images >= 1, epochs >= 2 and step > 0, got {images}, {epochs}, {step}")
    num_patches = grid[0] * grid[1]
    options = dict(generator=generator, dtype=torch.float64)
    base = spread * torch.randn(images, num_patches, **options)
    if kind == "directed":
        direction = spread * torch.randn(images, num_patches, **options) - base
        logits = base + step * torch.arange(epochs + 1, dtype=torch.float64)[:, None, None] * direction
    elif kind == "random_walk":
        steps = step * torch.randn(epochs, images, num_patches, **options)
        logits = torch.cat([base[None], base + steps.cumsum(0)])
    else:
        logits = base + step * torch.randn(epochs + 1, images, num_patches, **options)
    return logits.softmax(-1)


def directedness_series(distributions: torch.Tensor, cost: torch.Tensor, workers: int = 1) -> torch.Tensor:
    """The ``noise`` rule's directedness at every epoch ``t >= 2`` of a path of probe distributions, as the
    controller computes it (means over the probe images first). ``distributions: [T + 1, P, N] -> [T - 1]``."""
    one = attention_drift(distributions[:-1], distributions[1:], cost, workers).mean(-1)  # d(t-1, t), [T]
    two = attention_drift(distributions[:-2], distributions[2:], cost, workers).mean(-1)  # d(t-2, t), [T - 1]
    return directedness(two, one[:-1], one[1:])


RHO_CALIBRATION_STEPS: tuple[float, ...] = (0.03, 0.1, 0.3)


@functools.lru_cache(maxsize=16)
def calibrate_rho(
    grid: tuple[int, int],
    images: int,
    units: str = "image",
    quantile: float = 0.02,
    epochs: int = 30,
    steps: tuple[float, ...] = RHO_CALIBRATION_STEPS,
    seed: int = 0,
) -> float:
    """The ``noise`` rule's ``rho`` for a probe of ``images`` images on ``grid``: the ``quantile`` of a simulated
    random walk's directedness (:func:`simulate_attention_paths`, one walk of ``epochs`` epochs per step size in
    ``steps``), the smallest over the step sizes.

    The spec (ViTCAE, "Convergence") asks that a random walk converge in at most ~5% of epochs and directed motion
    never. The quantile is ``mean - z sd`` of the walk's directedness (close to normal when averaged over the probe's
    images; docs/dynamics.md, "Calibrating rho on simulated drifts"). Deterministic (``seed``) and cached.
    """
    if not 0 < quantile < 0.5:
        raise ValueError(f"quantile must be in (0, 0.5), got {quantile}")
    z = -torch.distributions.Normal(0.0, 1.0).icdf(torch.tensor(quantile)).item()
    cost = patch_grid_cost(grid[0], grid[1], units)
    generator = torch.Generator().manual_seed(seed)
    levels = []
    for step in steps:
        ratios = directedness_series(
            simulate_attention_paths("random_walk", grid, images, epochs, step, generator), cost
        )
        levels.append((ratios.mean() - z * ratios.std()).item())
    return float(min(levels))
