"""The controller's defaults (issue 14): drift in image sides, a convergence rule free of the grid and of the
learning rate's scale, and the convergence probe at tau = 1 for both arms."""

import math

import pytest
import torch

from model_fixtures import tiny_vit
from vitlab.diagnostics.convergence import ConvergenceTracker
from vitlab.diagnostics.dynamics import attention_drift, patch_grid_cost
from vitlab.dynamics import DynamicsConfig, DynamicsController, controlled_modules
from vitlab.errors import ConfigError
from vitlab.models import create_model


def upsample(p: torch.Tensor, side: int, factor: int) -> torch.Tensor:
    """A distribution on a ``side x side`` grid as the same picture on a grid ``factor`` times finer."""
    fine = p.view(side, side).repeat_interleave(factor, 0).repeat_interleave(factor, 1) / factor**2
    return fine.flatten()


def test_drift_in_image_units_is_the_same_for_the_same_pattern_on_a_4x4_and_an_8x8_grid():
    generator = torch.Generator().manual_seed(0)
    blob = torch.zeros(4, 4)
    blob[:, :2] = torch.rand(4, 2, generator=generator)  # attention on the left half, shifted right by a quarter
    p4, q4 = (blob / blob.sum()).flatten(), (blob.roll(1, dims=1) / blob.sum()).flatten()
    p8, q8 = upsample(p4, 4, 2), upsample(q4, 4, 2)
    image4 = attention_drift(p4, q4, patch_grid_cost(4, 4, units="image"))
    image8 = attention_drift(p8, q8, patch_grid_cost(8, 8, units="image"))
    torch.testing.assert_close(image4, torch.tensor(0.25, dtype=torch.float64))  # a quarter of the image side
    torch.testing.assert_close(image8, image4)
    patch4 = attention_drift(p4, q4, patch_grid_cost(4, 4, units="patch"))
    patch8 = attention_drift(p8, q8, patch_grid_cost(8, 8, units="patch"))
    torch.testing.assert_close(patch8, 2 * patch4)  # in patch widths the finer grid doubles it


def test_image_units_scale_rows_and_columns_by_their_own_side():
    cost = patch_grid_cost(2, 4, units="image")
    assert cost[0, 1].item() == pytest.approx(0.25) and cost[0, 4].item() == pytest.approx(0.5)
    with pytest.raises(ValueError, match="units"):
        patch_grid_cost(2, 2, units="pixel")


def decisions(drifts: list[float], rule: str, **kwargs) -> list[bool]:
    """Converged after each epoch of one head's drift curve (tau held at 1: the uncontrolled arm)."""
    options = dict(eps_d=0.05, eps_tau=0.05, patience=2, convergence=rule, tau_clause="own") | kwargs
    tracker = ConvergenceTracker(1, 1, DynamicsConfig(**options))
    tau = torch.ones(1, 1, dtype=torch.float64)
    return [bool(tracker.update(torch.full((1, 1), d, dtype=torch.float64), tau)) for d in drifts]


def test_relative_rule_gives_the_same_decisions_at_two_learning_rates():
    # A head's drift per epoch: a fast fall from its peak, then a plateau at a fifth of it (what a constant learning
    # rate gives), then the fall when the rate is lowered. At half the rate every drift is half as large.
    curve = [0.8, 1.0, 0.5, 0.3, 0.15, 0.14, 0.15, 0.13, 0.05, 0.04]
    high = [0.1 * d for d in curve]  # lr = 2e-3
    low = [0.05 * d for d in curve]  # lr = 1e-3
    relative_high = decisions(high, "relative", rel_d=0.2)
    assert relative_high == decisions(low, "relative", rel_d=0.2)
    assert relative_high.index(True) == 5  # stable at epochs 4 and 5 (0.15 and 0.14 < 0.2 * 1.0): patience 2
    # the paper's absolute threshold converges at one rate and not at the other on the same curve
    absolute_high, absolute_low = decisions(high, "absolute", eps_d=0.01), decisions(low, "absolute", eps_d=0.01)
    assert absolute_high.index(True) == 9 and absolute_low.index(True) == 5


def noise_decisions(drifts: list[float], directed: list[float | None], rho: float = 0.75) -> list[bool]:
    tracker = ConvergenceTracker(1, 1, DynamicsConfig(patience=2, convergence="noise", rho=rho, tau_clause="own"))
    tau = torch.ones(1, 1, dtype=torch.float64)
    out = []
    for d, r in zip(drifts, directed, strict=True):
        r = None if r is None else torch.full((1, 1), r, dtype=torch.float64)
        out.append(bool(tracker.update(torch.full((1, 1), d, dtype=torch.float64), tau, r)))
    return out


def test_noise_rule_gives_the_same_decisions_at_two_learning_rates_and_ignores_the_drift_level():
    # learning for four epochs (attention keeps moving one way: r near 1), then jitter at the rate's noise level
    curve = [0.8, 1.0, 0.5, 0.3, 0.3, 0.32, 0.29, 0.31]
    directed = [None, None, 0.95, 0.9, 0.55, 0.6, 0.5, 0.58]
    at_high = noise_decisions([0.1 * d for d in curve], directed)
    assert at_high == noise_decisions([0.05 * d for d in curve], directed)
    assert at_high.index(True) == 5  # stable at epochs 4 and 5
    # a head that keeps moving one way never converges, however small its drift
    assert not any(noise_decisions([1e-4] * 8, [None, None, *[0.97] * 6]))


def point_mass_path(patches: list[int], side: int = 4) -> list[torch.Tensor]:
    out = []
    for patch in patches:
        p = torch.zeros(1, 1, 4, side * side)
        p[..., patch] = 1
        out.append(p)
    return out


def test_controller_directedness_tells_moving_attention_from_jitter():
    from vitlab.dynamics import ProbeMeasurement

    controller = DynamicsController(
        DynamicsConfig(mode="fixed", convergence="noise", burn_in=0, patience=2, probe_size=4, kappa_images=4)
    )
    controller.attach(create_model("vit_pico", img_size=8, patch_size=2, in_chans=1, num_classes=3, depth=1))
    moving, jitter = point_mass_path([0, 1, 2, 3, 7, 11]), point_mass_path([5, 6, 5, 6, 5, 6])
    kappa = torch.ones(1, 4, dtype=torch.float64)
    heads = [torch.cat([a, b, a, b], dim=1) for a, b in zip(moving, jitter, strict=True)]  # [1, 4, 4, 16]
    records = [controller.advance(ProbeMeasurement(dist, kappa)) for dist in heads]
    assert records[1]["directedness"] is None and records[2]["directedness"] is not None
    last = torch.tensor(records[-1]["directedness"])  # heads 0, 2: moving; heads 1, 3: jitter
    assert last[0, 0] == pytest.approx(1.0) and last[0, 1] == pytest.approx(0.0)
    assert records[-1]["converged"] == [[False, True, False, True]]


def test_relative_rule_peak_counts_drift_seen_before_the_decisions_start():
    tracker = ConvergenceTracker(1, 1, DynamicsConfig(patience=1, convergence="relative", rel_d=0.5, tau_clause="own"))
    tracker.observe(torch.full((1, 1), 2.0))  # a burn-in epoch
    tau = torch.ones(1, 1)
    tracker.update(torch.full((1, 1), 0.9), tau)  # only records tau
    assert tracker.threshold().item() == pytest.approx(1.0)
    assert bool(tracker.update(torch.full((1, 1), 0.9), tau))
    restored = ConvergenceTracker(1, 1, tracker.config)
    restored.load_state_dict(tracker.state_dict())
    assert restored.peak.item() == pytest.approx(2.0) and restored.threshold().item() == pytest.approx(1.0)


def test_probing_at_unit_tau_gives_the_same_drift_for_both_arms_on_identical_weights():
    probe = torch.randn(6, 1, 8, 8, generator=torch.Generator().manual_seed(1))
    arms = {}
    for mode in ("schedule", "fixed"):
        controller = DynamicsController(DynamicsConfig(mode=mode, probe_size=6, kappa_images=2, burn_in=0))
        controller.attach(tiny_vit())  # identical weights; fixed mode sets tau = 1
        arms[mode] = controller
    scheduled = arms["schedule"]
    for _, module in controlled_modules(scheduled.model, None):
        with torch.no_grad():
            module.log_tau.fill_(math.log(0.67))  # a typical schedule value
    records = {mode: [] for mode in arms}
    for epoch in range(2):
        if epoch:  # the same weight update in both arms
            for controller in arms.values():
                torch.manual_seed(2)
                with torch.no_grad():
                    for _, module in controlled_modules(controller.model, None):
                        module.qkv.weight.add_(0.3 * torch.randn_like(module.qkv.weight))
        for mode, controller in arms.items():
            own = None
            if mode == "schedule":
                own = controller.measure(probe, kappa=False, probe_tau="model").distributions
            records[mode].append(controller.advance(controller.measure(probe), epoch, model_tau=own))
    drift_schedule = torch.tensor(records["schedule"][1]["drift"])
    assert torch.equal(drift_schedule, torch.tensor(records["fixed"][1]["drift"]))
    assert drift_schedule.min() > 0
    # at its own tau the scheduled arm measures a different (here: lower) drift of the same weights
    own_tau = torch.tensor(records["schedule"][1]["drift_model_tau"])
    assert (own_tau < drift_schedule).float().mean() > 0.5


def test_config_names_the_bad_units_and_rule():
    with pytest.raises(ConfigError, match="drift_units"):
        DynamicsConfig(drift_units="pixel")
    with pytest.raises(ConfigError, match="convergence"):
        DynamicsConfig(convergence="peak")
    with pytest.raises(ConfigError, match="rel_d"):
        DynamicsConfig(rel_d=1.5)


def test_defaults_are_image_units_the_response_rule_and_the_unit_tau_probe():
    cfg = DynamicsConfig()
    assert (cfg.drift_units, cfg.convergence, cfg.probe_tau, cfg.alpha) == ("image", "response", "unit", 4.0)
    assert (cfg.decay_ratio, cfg.decay_window, cfg.patience) == (0.5, 3, 3)


def lr_records(rates: list[float], scale: float) -> list[dict]:
    records = []
    for epoch, rate in enumerate(rates):
        drift = None if epoch == 0 else [[scale * rate, 2 * scale * rate]]
        frozen = [[epoch >= 3, False]]
        tau = [[1.0, 1.0]]
        record = {"epoch": epoch, "drift": drift, "kappa": tau, "tau": tau, "converged": frozen, "frozen": frozen}
        records.append({**record, "lr": rate})
    return records


def test_drift_vs_lr_plot_draws_both_arms_and_names_runs_without_a_rate(tmp_path):
    import matplotlib.image

    from vitlab.diagnostics.plots import plot_drift_vs_lr
    from vitlab.errors import RunFileError

    rates = [2e-3, 2e-3, 2e-3, 1e-3, 5e-4]
    path = plot_drift_vs_lr(
        {"uncontrolled": lr_records(rates, 10.0), "controlled": lr_records(rates, 8.0)}, tmp_path / "lr.png"
    )
    assert matplotlib.image.imread(path).shape[0] > 200
    old = lr_records(rates, 1.0)
    del old[2]["lr"]
    with pytest.raises(RunFileError, match="old"):
        plot_drift_vs_lr({"old": old}, tmp_path / "old.png")
