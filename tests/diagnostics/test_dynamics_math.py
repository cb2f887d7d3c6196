"""The pure algorithms of ViTCAE's attention dynamics against POT, hand-worked cases and eq. 20."""

import math

import numpy as np
import ot
import pytest
import torch

from vitlab.config.dynamics import DynamicsConfig
from vitlab.diagnostics import dynamics
from vitlab.diagnostics.convergence import ConvergenceTracker
from vitlab.diagnostics.dynamics import (
    attention_drift,
    attention_to_cls_distribution,
    consensus_clusters,
    patch_grid_cost,
    temperature_update,
)


def random_distributions(batch: int, num_patches: int, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    # Peaked (low temperature) rows, as trained attention is, plus a few exact zeros.
    p = torch.softmax(3 * torch.randn(batch, num_patches, generator=generator, dtype=torch.float64), dim=-1)
    p[:, ::5] = 0
    return p / p.sum(-1, keepdim=True)


def test_patch_grid_cost_is_euclidean_between_row_major_centres():
    cost = patch_grid_cost(2, 3)
    assert cost.shape == (6, 6) and cost.dtype == torch.float64
    assert cost[0, 1] == 1  # (0, 0) -> (0, 1)
    assert cost[0, 3] == 1  # (0, 0) -> (1, 0)
    assert cost[0, 5] == pytest.approx(math.sqrt(1 + 4))  # (0, 0) -> (1, 2)
    assert torch.equal(cost, cost.T) and torch.all(cost.diagonal() == 0)


@pytest.mark.parametrize("units", ["image", "patch"])
@pytest.mark.parametrize("side", [6, 7, 14])
def test_patch_grid_cost_is_an_exact_metric_on_grids_whose_centres_are_not_binary_fractions(side, units):
    """A 14x14 grid is ViT-B/16 at 224 pixels. cdist's matrix-product route (its default beyond 25 points) left
    the image-unit cost of these grids asymmetric and 1.5e-8 off zero on the diagonal, so attention_drift refused
    it and the controller could not run on them."""
    cost = patch_grid_cost(side, side, units=units)
    assert torch.equal(cost, cost.T) and torch.all(cost.diagonal() == 0)
    p = random_distributions(3, side * side, seed=0)
    q = random_distributions(3, side * side, seed=1)
    reference = [ot.emd2(a.numpy(), b.numpy(), cost.numpy()) for a, b in zip(p, q, strict=True)]
    np.testing.assert_allclose(attention_drift(p, q, cost).numpy(), reference, atol=1e-10)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("grid", [(4, 4), (8, 8), (3, 5), (2, 2), (9, 9)])
def test_attention_drift_equals_pot_emd2(grid, dtype):
    """The fast W1 (POT's C solver on the Kantorovich-Rubinstein reduction) against ot.emd2 on the full problem."""
    cost = patch_grid_cost(*grid)
    p = random_distributions(12, cost.shape[0], seed=0).to(dtype)
    q = random_distributions(12, cost.shape[0], seed=1).to(dtype)
    q[3] = p[3]  # nothing to move
    reference = [ot.emd2(a.double().numpy(), b.double().numpy(), cost.numpy()) for a, b in zip(p, q, strict=True)]
    drift = attention_drift(p, q, cost)
    assert drift.shape == (12,)
    np.testing.assert_allclose(drift.numpy(), reference, atol=1e-10)


def test_attention_drift_of_rows_one_ulp_apart_is_zero_and_does_not_crash_the_solver():
    """Two rows one ulp apart differ after normalisation only by rounding, and here every difference is >= 0: no
    deficit to move the surplus onto. The solver crashed the process on that empty problem (seen after freezing,
    where a head's attention barely changes); the distance is 0 to rounding, as ot.emd2 says."""
    p = torch.tensor(
        [float.fromhex(h) for h in ("0x1.1c10cc7e26a2fp-2", "0x1.d59146f58df40p-4")]
        + [float.fromhex(h) for h in ("0x1.07447908abe8bp-3", "0x1.eae8a5401febep-2")],
        dtype=torch.float64,
    )
    q = p.clone()
    q[3] = float.fromhex("0x1.eae8a5401febfp-2")
    difference = p / p.sum() - q / q.sum()
    assert (difference > 0).any() and not (difference < 0).any()  # the case the solver must not see
    cost = patch_grid_cost(2, 2)
    drift = attention_drift(torch.stack([p, q]), torch.stack([q, q]), cost)
    assert drift[0] == 0 and drift[1] == 0
    assert ot.emd2(p.numpy(), q.numpy(), cost.numpy()) < 1e-15


def test_attention_drift_hand_worked_and_batched_shape():
    cost = patch_grid_cost(3, 3)
    corner, opposite = torch.zeros(9), torch.zeros(9)
    corner[0], opposite[8] = 1, 1
    half = (corner + opposite) / 2
    p = torch.stack([corner, corner, corner]).reshape(1, 3, 9)
    q = torch.stack([opposite, corner, half]).reshape(1, 3, 9)
    drift = attention_drift(p, q, cost)
    assert drift.shape == (1, 3)
    # all mass across the diagonal: 2*sqrt(2); no move: 0; half the mass across the diagonal: sqrt(2)
    torch.testing.assert_close(drift[0], torch.tensor([2 * math.sqrt(2), 0.0, math.sqrt(2)], dtype=torch.float64))


@pytest.mark.parametrize("workers", [2, 3])
def test_attention_drift_on_several_threads_gives_the_same_values_as_one(workers, monkeypatch):
    """``workers`` splits the problems over threads (POT's C solver releases the GIL) from 25 patches on; each
    problem is solved as on one thread, so the values are identical, not merely close, including the rows with
    nothing to move. Smaller grids stay on one thread (and give the same values too)."""
    pools = []

    class CountedPool(dynamics.ThreadPoolExecutor):
        def __init__(self, count):
            pools.append(count)
            super().__init__(count)

    monkeypatch.setattr(dynamics, "ThreadPoolExecutor", CountedPool)
    for side, threaded in ((5, [workers]), (4, [])):
        pools.clear()
        cost = patch_grid_cost(side, side)
        p = random_distributions(40, side * side, seed=0).view(2, 4, 5, side * side)
        q = random_distributions(40, side * side, seed=1).view(2, 4, 5, side * side)
        q[1, 2] = p[1, 2]
        one = attention_drift(p, q, cost)
        assert torch.equal(attention_drift(p, q, cost, workers=workers), one)
        assert pools == threaded
        assert one.shape == (2, 4, 5) and torch.all(one[1, 2] == 0) and torch.all(one[0] > 0)
    with pytest.raises(ValueError, match="workers must be at least 1"):
        attention_drift(p, q, cost, workers=0)


def test_attention_drift_rejects_bad_input():
    cost = patch_grid_cost(2, 2)
    p = torch.full((4,), 0.25)
    with pytest.raises(ValueError, match="sum to 1"):
        attention_drift(p * 2, p, cost)
    with pytest.raises(ValueError, match="same shape"):
        attention_drift(p, p[None], cost)
    with pytest.raises(ValueError, match=r"\[N, N\]"):
        attention_drift(p, p, patch_grid_cost(3, 3))
    with pytest.raises(ValueError, match="metric"):
        attention_drift(p, p, cost + 1)


def test_attention_to_cls_distribution_takes_the_cls_row_over_patches():
    attn = torch.softmax(torch.randn(2, 3, 5, 5, generator=torch.Generator().manual_seed(0)), dim=-1)
    dist = attention_to_cls_distribution(attn)
    assert dist.shape == (2, 3, 4)
    torch.testing.assert_close(dist.sum(-1), torch.ones(2, 3))
    torch.testing.assert_close(dist[1, 2], attn[1, 2, 0, 1:] / attn[1, 2, 0, 1:].sum())
    with_register = attention_to_cls_distribution(attn, num_prefix_tokens=2)
    torch.testing.assert_close(with_register[0, 0], attn[0, 0, 0, 2:] / attn[0, 0, 0, 2:].sum())
    with pytest.raises(ValueError, match=r"\[B, H, T, T\]"):
        attention_to_cls_distribution(attn[0])


def block_diagonal_stochastic(block_sizes: list[int], seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    blocks = [torch.softmax(0.5 * torch.randn(n, n, generator=generator), dim=-1) for n in block_sizes]
    return torch.block_diag(*blocks)


@pytest.mark.parametrize("block_sizes", [[3, 4, 5], [6, 6], [2, 3, 3, 4]])
def test_consensus_clusters_counts_the_blocks(block_sizes):
    attn = block_diagonal_stochastic(block_sizes, seed=len(block_sizes))
    permutation = torch.randperm(attn.shape[0], generator=torch.Generator().manual_seed(1))
    shuffled = attn[permutation][:, permutation]  # relabelling tokens does not change the spectrum
    assert consensus_clusters(torch.stack([attn, shuffled])).tolist() == [len(block_sizes)] * 2


def test_consensus_clusters_rank_one_and_identity():
    stationary = torch.softmax(torch.randn(7, generator=torch.Generator().manual_seed(0)), dim=0)
    rank_one = stationary.expand(7, 7)
    batch = torch.stack([rank_one, torch.eye(7)]).reshape(2, 1, 7, 7)
    kappa = consensus_clusters(batch)
    assert kappa.shape == (2, 1) and kappa.dtype == torch.int64
    assert kappa.flatten().tolist() == [1, 7]


def test_consensus_clusters_nearly_decoupled_blocks_depend_on_eps():
    # Two uniform blocks leaking mass `leak` to each other: eigenvalues 1 and 1 - 2 * leak.
    leak = 0.03
    attn = torch.full((4, 4), leak / 2)
    attn[:2, :2] = attn[2:, 2:] = (1 - leak) / 2
    assert consensus_clusters(attn, eps=0.1).item() == 2
    assert consensus_clusters(attn, eps=0.05).item() == 1
    with pytest.raises(ValueError, match="row-stochastic"):
        consensus_clusters(attn * 2)
    with pytest.raises(ValueError, match="eps"):
        consensus_clusters(attn, eps=1.5)


def test_consensus_clusters_in_float32_counts_as_float64_away_from_the_threshold():
    generator = torch.Generator().manual_seed(0)
    blocks = torch.block_diag(*[torch.ones(n, n) / n for n in (3, 4, 5)])
    attn = torch.softmax(torch.randn(16, 12, 12, generator=generator), -1) * 0.05 + blocks * 0.95
    assert torch.equal(consensus_clusters(attn, 0.1, dtype=torch.float32), consensus_clusters(attn, 0.1))
    with pytest.raises(ValueError, match="float64 or torch.float32"):
        consensus_clusters(attn, 0.1, dtype=torch.float16)


def test_temperature_update_is_eq_20():
    drift = torch.tensor([[0.0, 1.0], [3.0, 0.5]])
    torch.testing.assert_close(temperature_update(drift, alpha=2.0), 1 / (1 + 2 * drift))
    assert temperature_update(0.0).item() == 1.0
    with pytest.raises(ValueError, match="alpha"):
        temperature_update(drift, alpha=0.0)
    with pytest.raises(ValueError, match="non-negative"):
        temperature_update(-drift)


def test_convergence_tracker_needs_a_full_streak_and_resets_when_broken():
    tracker = ConvergenceTracker(1, 2, _paper_rule(patience=2))
    tau = torch.ones(1, 2)
    calm, agitated = torch.tensor([[0.05, 0.05]]), torch.tensor([[0.05, 0.5]])
    # first epoch: no previous tau, no streak yet
    assert tracker.update(calm, tau).tolist() == [[False, False]]
    assert tracker.update(calm, tau).tolist() == [[False, False]]
    assert tracker.update(agitated, tau).tolist() == [[True, False]]  # head 1's streak is broken at 1
    assert tracker.streak.tolist() == [[2, 0]]
    assert tracker.update(calm, tau).tolist() == [[True, False]]
    assert tracker.update(calm, tau).tolist() == [[True, True]]


def test_convergence_tracker_tau_jump_breaks_the_streak_and_converged_stays_converged():
    tracker = ConvergenceTracker(2, 1, _paper_rule(patience=1))
    drift = torch.zeros(2, 1)
    tracker.update(drift, torch.ones(2, 1))
    assert tracker.update(drift, torch.tensor([[1.0], [0.5]])).flatten().tolist() == [True, False]
    # head 0 now drifts a lot: it stays converged
    assert tracker.update(torch.tensor([[5.0], [0.0]]), torch.tensor([[0.2], [0.5]])).flatten().tolist() == [True, True]


def _paper_rule(**options) -> DynamicsConfig:
    """The paper's rule: an absolute drift threshold and the tau clause."""
    return DynamicsConfig(convergence="absolute", tau_clause="own", eps_d=0.1, eps_tau=0.01, **options)


def test_convergence_tracker_state_dict_round_trip():
    tracker = ConvergenceTracker(1, 3, _paper_rule(patience=3))
    tracker.update(torch.zeros(1, 3), torch.ones(1, 3))
    tracker.update(torch.tensor([[0.0, 0.0, 1.0]]), torch.ones(1, 3))
    restored = ConvergenceTracker(1, 3, _paper_rule(patience=3))
    restored.load_state_dict(tracker.state_dict())
    assert restored.streak.tolist() == [[1, 1, 0]]
    for _ in range(2):
        assert torch.equal(
            restored.update(torch.zeros(1, 3), torch.ones(1, 3)), tracker.update(torch.zeros(1, 3), torch.ones(1, 3))
        )
    assert restored.converged.tolist() == [[True, True, False]]
    with pytest.raises(ValueError, match="head grid"):
        ConvergenceTracker(2, 3, _paper_rule(patience=3)).load_state_dict(tracker.state_dict())


def test_a_restored_tracker_judges_by_its_own_config_and_the_saved_history():
    """Resume restores state, not options: a history saved under patience 3 goes on under the new config's 9."""
    tracker = ConvergenceTracker(1, 3, _paper_rule(patience=3))
    for _ in range(3):
        tracker.update(torch.zeros(1, 3), torch.ones(1, 3))
    restored = ConvergenceTracker(1, 3, _paper_rule(patience=9))
    restored.load_state_dict(tracker.state_dict())
    assert restored.streak.tolist() == [[2, 2, 2]] and not restored.converged.any()
    assert not restored.update(torch.zeros(1, 3), torch.ones(1, 3)).any()  # the saved tracker's patience would say yes
    assert tracker.update(torch.zeros(1, 3), torch.ones(1, 3)).all()
    with pytest.raises(ValueError, match=r"\[L, H\]"):
        tracker.update(torch.zeros(3), torch.ones(3))
