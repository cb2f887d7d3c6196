"""The null models and positive controls of the convergence decision (issue 44), at a test's size: the default
rule calls no null process converged, converges a geometric decay within ``patience + 2`` epochs of its floor, and
never converges constant-speed directed motion. The full tables (3 settings x 2 steps x 20 runs) are in
``benchmarks/results/experiments/convergence_nulls_*.json``; the old default (``noise``) fails two nulls here."""

import pytest
import torch

from benchmarks.experiments.convergence_nulls import (
    BURN_IN,
    NULLS,
    PATIENCE,
    decisions,
    floor_epoch,
    jitter_floor,
    paths,
)
from vitlab.diagnostics.convergence import calibrate_rho
from vitlab.diagnostics.dynamics import patch_grid_cost

GRID, IMAGES = (4, 4), 16
COST = patch_grid_cost(*GRID, "image")
RHO_UNUSED = 0.75  # the decay rule reads no directedness


def _heads(kind: str, step: float, runs: int = 3) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(7)
    return [h for _ in range(runs) for h in paths(kind, GRID, IMAGES, step, g).unbind(1)]


@pytest.mark.parametrize("kind", NULLS)
def test_no_null_process_is_called_converged_by_the_default_rule(kind):
    step = 1e-3 if kind == "attention_walk" else 0.3
    results = [decisions(h, COST, "decay", RHO_UNUSED) for h in _heads(kind, step)]
    assert all(r["converged_at"] is None for r in results)
    assert max(r["stable_share"] for r in results) <= 0.1


def test_the_noise_rule_calls_a_shared_walk_and_jitter_converged():
    """Why the default changed: the directedness separates directed motion from jitter, not a settled head from a
    wandering one."""
    rho = calibrate_rho(GRID, IMAGES, "image")
    for kind in ("shared_walk", "jitter"):
        results = [decisions(h, COST, "noise", rho) for h in _heads(kind, 0.3)]
        assert any(r["converged_at"] is not None for r in results)


def test_geometric_decay_converges_soon_after_its_floor_and_directed_motion_never():
    floor = jitter_floor(GRID, IMAGES, COST, torch.Generator().manual_seed(8))
    for q in (0.7, 0.85):
        for head in _heads("decay", q, runs=2):
            result = decisions(head, COST, "decay", RHO_UNUSED)
            reached = floor_epoch(result["drift"], floor)
            assert reached is not None and result["converged_at"] is not None
            assert result["converged_at"] <= max(reached, BURN_IN) + PATIENCE + 2
    assert all(decisions(h, COST, "decay", RHO_UNUSED)["converged_at"] is None for h in _heads("directed", 1.0))
