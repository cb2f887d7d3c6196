"""The response rule (``dynamics.convergence: response``, the default): the decay test on each head's drift per
unit of learning rate, with the noise rule's directedness below ``rho``, so that a decaying schedule settles no head
by itself (ViTCAE eq. 26 needs a head that has settled; docs/dynamics.md, "The response rule")."""

import math

import pytest
import torch

from vitlab.config import from_dict
from vitlab.config.dynamics import DynamicsConfig
from vitlab.diagnostics.convergence import ConvergenceTracker
from vitlab.errors import ConfigError

ONES = torch.ones(1, 1)
JITTER = torch.full((1, 1), 0.5)  # the directedness of movement that goes nowhere
WALK = torch.full((1, 1), 0.71)  # ... of a random walk


def _tracker(**kwargs) -> ConvergenceTracker:
    options = dict(eps_d=0.01, eps_tau=0.05, patience=3, convergence="response", tau_clause="none", rho=0.66) | kwargs
    return ConvergenceTracker(1, 1, DynamicsConfig(**options))


def _feed(tracker, drifts, rates, directed=JITTER) -> list[bool]:
    out = []
    for d, r in zip(drifts, rates, strict=True):
        tracker.observe(torch.full((1, 1), d), r)
        out.append(bool(tracker.decide(torch.full((1, 1), d), ONES, directed)))
    return out


def cosine(epochs: int = 40) -> list[float]:
    return [0.5 * (1 + math.cos(math.pi * (t + 0.5) / epochs)) for t in range(epochs)]


def test_a_drift_that_only_follows_a_decaying_rate_never_settles_while_the_decay_rule_freezes_it():
    rates = cosine()
    drifts = [0.1 * r for r in rates]  # no settling at all: the head moves as far as the rate lets it
    assert not any(_feed(_tracker(), drifts, rates))
    decay = _tracker(convergence="decay")
    assert any(bool(decay.update(torch.full((1, 1), d), ONES)) for d in drifts)  # the old default freezes it


def test_a_drift_that_falls_at_a_constant_rate_settles_and_a_random_walk_of_the_same_size_does_not():
    drifts = [0.1 * 0.7**t for t in range(40)]
    settled = _feed(_tracker(), drifts, [1e-3] * 40)
    assert settled[-1] and settled.index(True) < 14
    assert not any(_feed(_tracker(), drifts, [1e-3] * 40, directed=WALK))  # still accumulating: not settled


def test_the_statistic_is_the_drift_per_unit_rate_and_a_missing_rate_is_one():
    tracker = _tracker(decay_window=1)
    tracker.observe(torch.full((1, 1), 0.4), 2e-3)
    tracker.observe(torch.full((1, 1), 0.1))
    assert torch.allclose(tracker.per_rate().flatten(), torch.tensor([200.0, 0.1], dtype=torch.float64))
    level, reference = tracker.decay_level(per_rate=True)
    assert (level.item(), reference.item()) == pytest.approx((0.1, 200.0))
    with pytest.raises(ValueError, match="rate must be > 0"):
        tracker.observe(torch.full((1, 1), 0.1), 0.0)


def test_thaw_releases_a_converged_head_that_moves_again_and_no_thaw_keeps_it():
    drifts = [0.1 * 0.6**t for t in range(15)] + [0.1] * 10  # settles, then moves as at the start
    kept = _feed(_tracker(), drifts, [1.0] * 25)
    thawed = _feed(_tracker(thaw=True), drifts, [1.0] * 25)
    assert kept[14] and thawed[14] and kept[-1]
    assert not thawed[-1]


def test_the_rate_history_rides_in_the_state_and_an_old_state_counts_rate_one():
    tracker = _tracker(response_ratio=0.3, thaw=True)
    _feed(tracker, [0.3, 0.2, 0.1], [2.0, 1.0, 0.5])
    restored = _tracker()
    restored.load_state_dict(tracker.state_dict())
    assert torch.equal(restored.rates, tracker.rates)
    old = {k: v for k, v in tracker.state_dict().items() if k != "rates"}
    restored = _tracker()
    restored.load_state_dict(old)
    assert torch.equal(restored.rates, torch.ones(3, 1, 1, dtype=torch.float64))


def test_a_head_whose_scores_keep_moving_is_not_settled_and_one_whose_scores_slow_is():
    """The score clause (``score_ratio`` 0.5): the same falling drift, with score drifts that stay at 1 (a saturating
    softmax whose logits keep walking) or fall with it; none passed: the drift alone is judged (older callers)."""
    drifts = [0.1 * 0.7**t for t in range(30)]

    def run(scores):
        tracker, out = _tracker(), []
        for d, s in zip(drifts, scores, strict=True):
            tracker.observe(torch.full((1, 1), d), 1.0, None if s is None else torch.full((1, 1), s))
            out.append(bool(tracker.decide(torch.full((1, 1), d), ONES, JITTER)))
        return out, tracker

    walking, tracker = run([1.0] * 30)
    assert not any(walking)
    level, reference = tracker.decay_level(per_rate=True, scores=True)
    assert (level.item(), reference.item()) == (1.0, 1.0)
    assert run([0.7**t for t in range(30)])[0][-1]
    assert run([None] * 30)[0][-1]  # no scores: the falling drift alone converges


def test_the_score_clause_has_its_own_ratio():
    """Score drifts that fall to 0.4 of their early level pass ``score_ratio`` 0.5 (the default), not 0.35."""
    drifts = [0.1 * 0.7**t for t in range(30)]
    scores = [1.0] * 10 + [0.4] * 20

    def converged(**ratio):
        tracker = _tracker(**ratio)
        for d, s in zip(drifts, scores, strict=True):
            tracker.observe(torch.full((1, 1), d), 1.0, torch.full((1, 1), s))
            tracker.decide(torch.full((1, 1), d), ONES, JITTER)
        return bool(tracker.converged)

    assert converged() and not converged(score_ratio=0.35)
    assert converged(response_ratio=0.3, score_ratio=0.5)  # the drift's ratio does not judge the scores


def test_the_score_history_rides_in_the_state_and_an_old_state_has_none():
    tracker = _tracker(score_ratio=0.4)
    for d in (0.3, 0.2, 0.1):
        tracker.observe(torch.full((1, 1), d), 1.0, torch.full((1, 1), 2 * d))
    restored = _tracker()
    restored.load_state_dict(tracker.state_dict())
    assert torch.equal(restored.scores, tracker.scores)
    restored.load_state_dict({k: v for k, v in tracker.state_dict().items() if k != "scores"})
    assert restored.scores.shape == (3, 1, 1) and restored.scores.isnan().all()
    for _ in range(5):  # resumed: the clause judges the score drifts measured since, once there are 2 x window
        restored.observe(torch.full((1, 1), 0.1), 1.0, torch.full((1, 1), 1.0))
        assert restored.decay_level(per_rate=True, scores=True)[0].isnan().all()
    restored.observe(torch.full((1, 1), 0.1), 1.0, torch.full((1, 1), 1.0))
    level, reference = restored.decay_level(per_rate=True, scores=True)
    assert (level.item(), reference.item()) == (1.0, 1.0)


@pytest.mark.parametrize(
    "values", [{"response_ratio": 1.5}, {"response_ratio": "x"}, {"score_ratio": 1.0}, {"thaw": "yes"}]
)
def test_bad_response_options_are_refused_by_name(values):
    with pytest.raises(ConfigError, match=next(iter(values))):
        from_dict(DynamicsConfig, values)


def test_the_head_table_shows_the_drift_per_unit_rate_beside_the_drift_and_the_rate_and_why():
    from vitlab.cli.dynamics import format_table
    from vitlab.diagnostics.plots import head_table

    record = {
        "epoch": 9,
        "convergence": "response",
        "rho": 0.66,
        "tau": [[1.0, 1.0]],
        "kappa": [[1.0, 1.0]],
        "drift": [[0.002, 0.004]],
        "rate": 1e-3,
        "drift_per_rate": [[2.0, 4.0]],
        "response_level": [[2.0, 4.0]],
        "threshold": [[5.0, 1.0]],
        "directedness": [[0.9, 0.5]],
        "converged": [[False, False]],
        "frozen": [[False, False]],
    }
    rows = head_table([record])
    assert (rows[0]["d"], rows[0]["d_per_rate"], rows[0]["rate"]) == (0.002, 2.0, 1e-3)
    assert rows[0]["decision"] == (
        "not settled: a recent drift per unit rate 2 vs threshold 5, directedness 0.90 >= rho 0.66"
    )
    text = format_table(rows, 9)
    assert "d/lr" in text and "mean learning rate 0.001" in text and "2.00" in text
    scored = record | {"score_per_rate": [[30.0, 8.0]], "score_level": [[36.0, 9.0]], "score_threshold": [[50.0, 5.0]]}
    rows = head_table([scored])
    assert rows[1]["s_per_rate"] == 8.0 and rows[1]["decision"].endswith("scores per unit rate 9 >= 5")
    assert "s/lr" in format_table(rows, 9) and "30.0" in format_table(rows, 9)
    waiting = scored | {"directedness": [[0.5, 0.5]]}  # head 0: every clause holds, not yet for patience epochs
    assert head_table([waiting])[0]["decision"] == (
        "stable, not yet for patience epochs in a row: a recent drift per unit rate 2 < threshold 5, directedness 0.50"
        " < rho 0.66, scores per unit rate 36 < 50"
    )


def test_the_head_table_of_a_decay_rule_run_with_several_layers_says_why_without_scores():
    """Records of other rules carry no score level (None): every layer's heads still get their reason."""
    from vitlab.diagnostics.plots import head_table

    two = [[0.1, 0.1], [0.2, 0.2]]
    record = {"epoch": 9, "convergence": "decay", "tau": two, "kappa": two, "drift": two, "decay_level": two}
    record |= {"threshold": [[0.5, 0.5], [0.1, 0.1]], "score_level": None, "score_threshold": None}
    record |= {"converged": [[True, True], [False, False]], "frozen": [[True, True], [False, False]]}
    rows = head_table([record])
    assert rows[3]["decision"] == "not settled: a recent drift 0.2 vs threshold 0.1"
