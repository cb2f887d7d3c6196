"""The response rule's lag clause (``dynamics.lag``; docs/dynamics.md, "The lag clause"): the variance ratio of a
head's score displacements, on hand-worked sequences, and the tracker with and without it."""

import math

import pytest
import torch

from vitlab.config import from_dict
from vitlab.config.dynamics import DynamicsConfig
from vitlab.diagnostics.convergence import ConvergenceTracker
from vitlab.diagnostics.dynamics import score_drift
from vitlab.diagnostics.trend import LagWindow, lag_excess, lag_series
from vitlab.errors import ConfigError

ONES, JITTER = torch.ones(1, 1), torch.full((1, 1), 0.5)


def test_lag_excess_hand_worked():
    # J = (1 + 3) / 2 = 2; excess 10 - 2 = 8; ratio 8 / 2 = 4; speed sqrt(8 / (3^2 - 1)) = 1
    ratio, speed = lag_excess(torch.tensor(10.0), torch.tensor(1.0), torch.tensor(3.0), 3)
    assert (ratio.item(), speed.item()) == pytest.approx((4.0, 1.0))
    # a steady movement of v = 0.5 an epoch, no jitter: MSD over K = (K v)^2, over one epoch v^2 -> K^2 - 1, v
    ratio, speed = lag_excess(torch.tensor(4 * 4 * 0.25), torch.tensor(0.25), torch.tensor(0.25), 4)
    assert (ratio.item(), speed.item()) == pytest.approx((15.0, 0.5))
    # jitter that alternates between two points: over 2 epochs no displacement, over 1 the whole: -1, no speed
    ratio, speed = lag_excess(torch.tensor(0.0), torch.tensor(1.0), torch.tensor(1.0), 2)
    assert (ratio.item(), speed.item()) == (-1.0, 0.0)
    assert lag_excess(torch.tensor(0.0), torch.tensor(0.0), torch.tensor(0.0), 2)[0].item() == 0  # nothing moved
    with pytest.raises(ValueError, match="lag must be >= 2"):
        lag_excess(torch.tensor(1.0), torch.tensor(1.0), torch.tensor(1.0), 1)


def _softmax_path(logits: list[list[float]]) -> list[torch.Tensor]:
    """One head, one image: ``[1, 1, 1, N]`` distributions of the given logits per epoch."""
    return [torch.tensor(z, dtype=torch.float64).softmax(-1).view(1, 1, 1, -1) for z in logits]


def test_the_window_gives_the_score_msds_over_one_and_lag_epochs_nan_until_it_is_full():
    # centred logits (-t, t) / 1: each epoch moves every score by 1, so the MSD over k epochs is k^2
    window = LagWindow(3)
    out = [window.push(p) for p in _softmax_path([[-t, t] for t in range(5)])]
    assert out[0].isnan().all() and out[1][0].item() == pytest.approx(1.0) and out[2][1].isnan().all()
    assert [o[1].item() for o in out[3:]] == pytest.approx([9.0, 9.0])
    assert [o[0].item() for o in out[1:]] == pytest.approx([1.0] * 4)


def test_lag_series_reads_the_window_s_two_ends_and_the_mean_rate():
    # epochs 0..3 of MSDs over one and over two epochs; lag 2: the ends are epochs t and t - 1
    lagged = torch.tensor([[1.0, math.nan], [3.0, 10.0], [1.0, 6.0], [1.0, 2.0]]).view(4, 2, 1, 1)
    rates = torch.tensor([1.0, 1.0, 2.0, 2.0]).view(4, 1, 1)
    ratio, speed = lag_series(lagged, rates, 2)
    # t = 1: J = (3 + 1) / 2 = 2, ratio 4, speed sqrt(8 / 3) / rate 1; t = 2: J 2, ratio 2, speed sqrt(4/3) / 1.5
    assert ratio.flatten()[1:].tolist() == pytest.approx([4.0, 2.0, 1.0])
    assert speed.flatten()[1:3].tolist() == pytest.approx([math.sqrt(8 / 3), math.sqrt(4 / 3) / 1.5])
    assert ratio[0].isnan().all()


def _tracker(lag: int, **kwargs) -> ConvergenceTracker:
    options = dict(eps_d=0.01, eps_tau=0.05, patience=3, convergence="response", tau_clause="none", rho=0.66)
    return ConvergenceTracker(1, 1, DynamicsConfig(**options | {"lag": lag, "lag_ratio": 1.0} | kwargs))


def _run(tracker, drifts, lagged) -> int | None:
    """Feed the epochs; the first epoch at which the head is converged (None: never)."""
    for epoch, (d, m) in enumerate(zip(drifts, lagged, strict=True), start=1):
        tracker.observe(torch.full((1, 1), d), 1.0, None, None if m is None else torch.tensor(m).view(2, 1, 1))
        if tracker.decide(torch.full((1, 1), d), ONES, JITTER).item():
            return epoch
    return None


def _fading_trend(epochs: int = 40, lag: int = 6, v2: float = 0.0016) -> tuple[list, list]:
    """A steady movement of ``v`` per epoch (``v^2 = v2``) under jitter whose variance falls from 1 to 0.0025
    (``s_t``): the drift follows the jitter; the score MSDs are their expectations (module doc of
    ``vitlab.diagnostics.trend``)."""
    s = [0.0025 + 0.9975 * 0.7**t for t in range(epochs + 1)]
    drifts = [math.sqrt(s[t] + s[t - 1] + v2) for t in range(1, epochs + 1)]
    lagged = [[s[t] + s[t - 1] + v2, s[t] + s[t - lag] + lag**2 * v2 if t >= lag else math.nan] for t in range(1, 41)]
    return drifts, lagged


def test_a_steady_trend_under_falling_noise_is_not_settled_with_the_lag_clause_and_is_without():
    drifts, lagged = _fading_trend()
    assert math.sqrt(0.0016) < math.sqrt(0.0025)  # it moves less per epoch than the noise
    assert _run(_tracker(0), drifts, lagged) is not None  # today's rule freezes it
    assert _run(_tracker(6, lag_ratio=0.5), drifts, lagged) is None


def test_an_abrupt_stop_converges_at_the_minimum_delay_without_the_clause_and_at_most_lag_epochs_later_with_it():
    """Movement of 1 an epoch for 15 epochs, then jitter of variance 0.01: the one-epoch MSD drops at once, the one
    over ``lag`` epochs once the window has passed the stop."""
    stop, lag, s = 15, 6, 0.01
    drifts = [1.0] * stop + [math.sqrt(2 * s)] * 25
    moved = [min(t, stop) for t in range(41)]  # the position of the movement at epoch t
    lagged = [
        [(moved[t] - moved[t - 1]) ** 2 + 2 * s, (moved[t] - moved[t - lag]) ** 2 + 2 * s if t >= lag else math.nan]
        for t in range(1, 41)
    ]
    without = _run(_tracker(0), drifts, lagged)
    assert without == stop + 3 + 3 - 1  # decay_window epochs below, then patience epochs in a row
    with_lag = _run(_tracker(lag, lag_ratio=0.5), drifts, lagged)
    assert with_lag is not None and without < with_lag <= without + lag


def test_without_lag_measurements_the_clause_is_not_judged_and_the_state_keeps_them():
    drifts, lagged = _fading_trend()
    assert _run(_tracker(6), drifts, [None] * 40) == _run(_tracker(0), drifts, lagged)
    tracker = _tracker(6, lag_ratio=0.7)
    _run(tracker, drifts[:8], lagged[:8])
    restored = _tracker(6)
    restored.load_state_dict(tracker.state_dict())
    assert torch.equal(restored.lagged.isnan(), tracker.lagged.isnan()) and restored.lag_seen
    restored.load_state_dict({k: v for k, v in tracker.state_dict().items() if k not in ("lagged", "lag_seen")})
    assert restored.lagged.shape == (8, 2, 1, 1) and restored.lagged.isnan().all() and not restored.lag_seen


def test_the_score_drift_reads_attention_below_1e_12():
    """Logits 0 and -40 / -50 (attention ~4e-18 and ~2e-22): the centred scores move by 10 on one patch of two, so
    the RMS change is 5; a floor at 1e-12 read both as the floor (0)."""
    p = torch.tensor([0.0, -40.0], dtype=torch.float64).softmax(-1)
    q = torch.tensor([0.0, -50.0], dtype=torch.float64).softmax(-1)
    assert p[1] < 1e-12 and score_drift(p, q).item() == pytest.approx(5.0)
    zero = torch.tensor([1.0, 0.0], dtype=torch.float32)  # a float32 softmax that underflowed
    assert torch.isfinite(score_drift(zero, zero)) and score_drift(zero, zero).item() == 0


@pytest.mark.parametrize("values", [{"lag": 1}, {"lag": -2}, {"lag": 2.5}, {"lag": True}, {"lag_ratio": 0}])
def test_bad_lag_options_are_refused_by_name(values):
    with pytest.raises(ConfigError, match=next(iter(values))):
        from_dict(DynamicsConfig, values, "dynamics")
