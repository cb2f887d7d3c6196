"""The decay rule (``dynamics.convergence: decay``, the default): a head is stable when each of its last
``decay_window`` drifts is below ``decay_ratio`` times the median of its earlier drifts (ViTCAE eq. 26 needs a head
that has settled; issue 44)."""

import numpy as np
import pytest
import torch

from vitlab.config import from_dict
from vitlab.config.dynamics import DynamicsConfig
from vitlab.diagnostics.convergence import ConvergenceTracker
from vitlab.errors import ConfigError

ONES = torch.ones(1, 1)


def _tracker(**kwargs) -> ConvergenceTracker:
    options = dict(eps_d=0.01, eps_tau=0.05, patience=1, convergence="decay", tau_clause="none") | kwargs
    return ConvergenceTracker(1, 1, DynamicsConfig(**options))


def _feed(tracker: ConvergenceTracker, drifts: list[float]) -> list[bool]:
    return [bool(tracker.update(torch.full((1, 1), d), ONES)) for d in drifts]


def test_the_level_is_the_largest_recent_drift_and_the_reference_the_earlier_median():
    tracker = _tracker()
    for d in (4.0, 1.0, 2.0, 0.5, 0.1, 0.3):
        tracker.observe(torch.full((1, 1), d))
    level, reference = tracker.decay_level()
    assert level.item() == 0.5 and reference.item() == 2.0  # max(0.5, 0.1, 0.3); median(4, 1, 2)
    assert tracker.threshold().item() == 1.0


def test_too_little_history_is_never_stable():
    tracker = _tracker()
    assert _feed(tracker, [1.0, 0.0, 0.0, 0.0, 0.0]) == [False] * 5  # 5 < 2 * window drifts
    assert torch.isnan(_tracker().decay_level()[0]).all()


def test_a_constant_drift_never_settles_and_a_decayed_one_does():
    assert not any(_feed(_tracker(patience=3), [0.1] * 40))
    decayed = _feed(_tracker(patience=3), [0.1 * 0.7**t for t in range(40)])
    assert decayed[-1] and decayed.index(True) < 12


def test_one_spike_does_not_make_the_quiet_epochs_after_it_stable():
    """A single large jump inflates a peak (the relative rule's reference) but not a median."""
    drifts = [0.1] * 10 + [5.0] + [0.1] * 29
    assert not any(_feed(_tracker(patience=3), drifts))
    relative = _tracker(patience=3, convergence="relative", rel_d=0.2)
    assert any(bool(relative.update(torch.full((1, 1), d), ONES)) for d in drifts)


def test_the_history_rides_in_the_state_and_an_old_state_starts_it_empty():
    tracker = _tracker(decay_ratio=0.4, decay_window=2)
    _feed(tracker, [3.0, 2.0, 1.0])
    restored = _tracker(decay_ratio=0.4, decay_window=2)
    restored.load_state_dict(tracker.state_dict())
    assert torch.equal(restored.history, tracker.history)
    fresh = _tracker()
    fresh.load_state_dict({k: v for k, v in tracker.state_dict().items() if k != "history"})
    assert fresh.history.shape == (0, 1, 1)


@pytest.mark.parametrize(
    ("key", "value", "words"),
    [("decay_ratio", 1.0, "decay_ratio must be in (0, 1)"), ("decay_window", 0, "decay_window must be an integer")],
)
def test_the_rule_s_settings_are_checked(key, value, words):
    with pytest.raises(ConfigError, match=words.replace("(", r"\(").replace(")", r"\)")):
        from_dict(DynamicsConfig, {key: value}, "dynamics")


def test_the_head_table_says_why_each_head_is_or_is_not_frozen():
    from vitlab.diagnostics.plots import head_table

    def record(epoch, level, threshold, converged):
        flags = [[converged, False]]
        return {
            "epoch": epoch,
            "convergence": "decay",
            "tau": [[1.0, 1.0]],
            "kappa": [[1.0, 1.0]],
            "drift": [[level, 0.2]],
            "decay_level": [[level, 0.2]],
            "threshold": [[threshold, 0.05]],
            "converged": flags,
            "frozen": flags,
        }

    records = [record(5, None, None, False), record(6, 0.3, 0.1, False), record(7, 0.01, 0.1, True)]
    records[0]["decay_level"] = records[0]["threshold"] = [[None, None]]
    rows = head_table(records)
    assert rows[0]["decision"] == "frozen at epoch 7: recent drift <= 0.01 < threshold 0.1"
    assert rows[1]["decision"] == "not settled: a recent drift 0.2 vs threshold 0.05"
    assert head_table(records[:1])[0]["decision"] == "too few epochs to judge"


def test_the_drift_figure_draws_each_heads_decay_threshold(tmp_path):
    from vitlab.diagnostics.plots import dynamics_arrays, plot_dynamics

    def record(epoch, threshold):
        flags = [[False, False]]
        drift = None if epoch == 0 else [[0.1, 0.2]]
        return {"epoch": epoch, "convergence": "decay", "tau": [[1.0, 1.0]], "kappa": [[1.0, 1.0]], "drift": drift,
                "threshold": threshold, "decay_level": threshold, "converged": flags, "frozen": flags,
                "mode": "schedule", "non_converged": 2}  # fmt: skip

    records = [record(0, None), record(1, [[None, None]]), record(2, [[0.05, 0.1]])]
    threshold = dynamics_arrays(records)["threshold"]
    assert threshold.shape == (3, 1, 2) and np.isnan(threshold[:2]).all() and threshold[2].tolist() == [[0.05, 0.1]]
    assert plot_dynamics(records, tmp_path / "dynamics.png").stat().st_size > 0
