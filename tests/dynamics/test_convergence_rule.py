"""The convergence rule on simulated drifts (ViTCAE spec, "Convergence"): rho calibrated so that a random walk is
stable in at most ~5% of epochs and directed motion never is, and one rule for both arms of a comparison."""

import pytest
import torch

from vitlab.diagnostics.convergence import ConvergenceTracker
from vitlab.diagnostics.dynamics import patch_grid_cost
from vitlab.diagnostics.rho_calibration import calibrate_rho, directedness_series, simulate_attention_paths
from vitlab.dynamics import DynamicsConfig, DynamicsController

GRID, IMAGES, EPOCHS = (4, 4), 64, 40


def _directedness(kind, step, seed):
    paths = simulate_attention_paths(kind, GRID, IMAGES, EPOCHS, step, torch.Generator().manual_seed(seed))
    return directedness_series(paths, patch_grid_cost(*GRID, units="image"))


def _stable_share(kind, rho, step, seed, patience=1):
    """Share of epochs in which a tracker under the noise rule calls the simulated head converged; patience 1
    counts each stable epoch (the per-epoch decision), the run's patience counts convergences."""
    ratios = _directedness(kind, step, seed)
    options = dict(eps_d=0.01, eps_tau=0.05, patience=patience, convergence="noise", rho=rho, tau_clause="none")
    tracker = ConvergenceTracker(1, 1, DynamicsConfig(**options))
    tau = torch.ones(1, 1)
    tracker.update(torch.zeros(1, 1), tau)  # the first call only records tau
    calls = []
    for ratio in ratios:
        tracker.converged.zero_()  # count each epoch's decision afresh
        calls.append(bool(tracker.update(torch.ones(1, 1), tau, ratio.view(1, 1))))
    return sum(calls) / len(calls)


def test_simulated_motions_have_the_directedness_the_rule_assumes():
    directed, walk, jitter = (_directedness(k, 0.1, seed=3) for k in ("directed", "random_walk", "jitter"))
    assert directed.min() > 0.99
    assert 0.65 < walk.median() < 0.76  # about 1 / sqrt 2
    assert 0.45 < jitter.median() < 0.55


@pytest.mark.parametrize("step", [0.05, 0.1, 0.3])
def test_calibrated_rho_lets_a_random_walk_converge_in_at_most_5_percent_of_epochs_and_directed_motion_never(step):
    rho = calibrate_rho(GRID, IMAGES)
    # seeds other than the calibration's, and a step size it did not use (0.1, 0.3): out of sample
    walk = [_stable_share("random_walk", rho, step, seed) for seed in (11, 12, 13)]
    assert sum(walk) / len(walk) <= 0.05
    assert _stable_share("directed", rho, step, seed=11) == 0.0
    # and a settled head (jitter) is stable in nearly every epoch, so the rule still converges
    assert _stable_share("jitter", rho, step, seed=11) >= 0.95


def test_the_previous_rho_let_most_random_walk_epochs_pass():
    """The earlier default 0.75 sits above a 64-image random walk's directedness in most epochs."""
    assert _stable_share("random_walk", 0.75, 0.1, seed=11) > 0.5


def test_calibration_is_deterministic_and_depends_on_the_probe():
    assert calibrate_rho(GRID, IMAGES) == calibrate_rho.__wrapped__(GRID, IMAGES)
    assert calibrate_rho(GRID, 8) < calibrate_rho(GRID, IMAGES)  # fewer images: a noisier ratio, a lower rho


def _arm_tracker(mode):
    """The tracker that a controller of each Table I arm builds for the same model and probe."""
    from vitlab.models import create_model

    torch.manual_seed(0)
    model = create_model("vit_pico", img_size=8, patch_size=2, in_chans=1, num_classes=3, depth=2, temperature=True)
    config = DynamicsConfig(mode=mode, freeze=mode == "schedule")
    controller = DynamicsController(config, probe=torch.zeros(IMAGES, 1, 8, 8))
    controller.attach(model)
    return controller._new_tracker()


def test_both_arms_are_judged_by_the_same_function_with_the_same_arguments():
    controlled, uncontrolled = _arm_tracker("schedule"), _arm_tracker("fixed")
    settings = ("eps_d", "eps_tau", "patience", "convergence", "rel_d", "tau_clause", "decay_ratio", "decay_window")
    assert [getattr(controlled.config, k) for k in settings] == [getattr(uncontrolled.config, k) for k in settings]
    assert controlled.rho == uncontrolled.rho and controlled.config.tau_clause == "none"
    g = torch.Generator().manual_seed(0)
    for epoch in range(12):  # the same decaying drift, but tau scheduled in one arm and held at 1 in the other
        shape = (controlled.num_layers, controlled.num_heads)
        drift = torch.rand(shape, generator=g, dtype=torch.float64) / 20 * 0.6**epoch
        ratio = 0.4 + 0.6 * torch.rand(shape, generator=g, dtype=torch.float64)
        scheduled = 1 / (1 + 4 * drift)
        a = controlled.update(drift, scheduled, ratio)
        b = uncontrolled.update(drift, torch.ones(shape), ratio)
        assert torch.equal(a, b)
    assert controlled.converged.any()


def test_the_paper_tau_clause_judges_the_arms_differently():
    """With tau_clause own, the same drift converges in the fixed arm and not in the scheduled one."""
    options = dict(eps_d=0.01, eps_tau=0.05, patience=2, convergence="noise", rho=0.6, tau_clause="own")
    trackers = [ConvergenceTracker(1, 1, DynamicsConfig(**options)) for _ in range(2)]
    ratio = torch.full((1, 1), 0.5)
    for epoch in range(6):
        scheduled = torch.full((1, 1), 0.5 + 0.1 * (epoch % 2))  # the schedule moves tau by 0.1 each epoch
        trackers[0].update(torch.ones(1, 1), scheduled, ratio)
        trackers[1].update(torch.ones(1, 1), torch.ones(1, 1), ratio)
    assert not trackers[0].converged.item() and trackers[1].converged.item()


def test_rho_and_tau_clause_are_checked():
    from vitlab.errors import ConfigError

    with pytest.raises(ConfigError, match="dynamics.rho must be 'auto' or a directedness"):
        DynamicsConfig(rho="calibrated")
    with pytest.raises(ConfigError, match="dynamics.rho"):
        DynamicsConfig(rho=1.5)
    with pytest.raises(ConfigError, match="dynamics.tau_clause must be one of none, own"):
        DynamicsConfig(tau_clause="paper")
