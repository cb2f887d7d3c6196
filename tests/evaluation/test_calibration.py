"""Calibration metrics against torchmetrics, and temperature scaling on over-confident synthetic logits."""

import pytest
import torch
from torchmetrics.classification import MulticlassCalibrationError

from vitlab.evaluation.calibration import (
    calibration_split_eval,
    expected_calibration_error,
    fit_temperature,
    reliability_diagram,
)


def overconfident_logits(num_samples: int, num_classes: int, scale: float, seed: int):
    """Labels drawn from softmax(true_logits): ``true_logits`` are calibrated, ``scale * true_logits`` are not."""
    generator = torch.Generator().manual_seed(seed)
    true_logits = 1.5 * torch.randn(num_samples, num_classes, generator=generator, dtype=torch.float64)
    labels = torch.multinomial(true_logits.softmax(-1), 1, generator=generator).squeeze(1)
    return scale * true_logits, labels


@pytest.mark.parametrize(("num_classes", "seed"), [(10, 0), (3, 1), (100, 2)])
def test_ece_equals_torchmetrics(num_classes, seed):
    generator = torch.Generator().manual_seed(seed)
    logits = 3 * torch.randn(500, num_classes, generator=generator)
    labels = torch.randint(num_classes, (500,), generator=generator)
    reference = MulticlassCalibrationError(num_classes=num_classes, n_bins=15, norm="l1")(logits, labels).item()
    assert expected_calibration_error(logits, labels) == pytest.approx(reference, abs=1e-6)
    assert expected_calibration_error(logits.softmax(-1), labels) == pytest.approx(reference, abs=1e-6)


def test_ece_hand_worked():
    # Two samples at confidence 0.9 (one right), one at 0.6 (right): bins 13 and 9 of 15.
    probs = torch.tensor([[0.9, 0.1], [0.9, 0.1], [0.4, 0.6]])
    labels = torch.tensor([0, 1, 1])
    expected = 2 / 3 * abs(0.5 - 0.9) + 1 / 3 * abs(1.0 - 0.6)
    assert expected_calibration_error(probs, labels) == pytest.approx(expected)


def test_ece_rejects_bad_input():
    logits = torch.randn(4, 3)
    with pytest.raises(ValueError, match=r"labels must lie in \[0, 3\)"):
        expected_calibration_error(logits, torch.tensor([0, 1, 2, 3]))
    with pytest.raises(ValueError, match="integer class indices"):
        expected_calibration_error(logits, torch.zeros(4))
    with pytest.raises(ValueError, match=r"\[B, K\]"):
        expected_calibration_error(logits[0], torch.tensor([0]))


def test_temperature_scaling_fixes_overconfidence_without_changing_accuracy():
    logits, labels = overconfident_logits(2000, 10, scale=3.0, seed=0)
    temperature = fit_temperature(logits, labels)
    assert temperature == pytest.approx(3.0, rel=0.15)  # it undoes the scale the logits were inflated by
    report = calibration_split_eval(logits, labels, seed=0)
    assert report["n_fit"] + report["n_eval"] == 2000
    assert report["temperature"] > 1
    assert report["nll_after"] < report["nll_before"]
    assert report["ece_after"] < report["ece_before"]
    assert report["top1_after"] == report["top1_before"]


def test_temperature_below_one_for_underconfident_logits():
    logits, labels = overconfident_logits(2000, 10, scale=0.4, seed=1)
    assert fit_temperature(logits, labels) < 1


def test_reliability_diagram_is_written(tmp_path):
    logits, labels = overconfident_logits(300, 5, scale=3.0, seed=2)
    single = reliability_diagram(logits.softmax(-1), labels, tmp_path / "single.png", title="over-confident")
    both = reliability_diagram(logits, labels, tmp_path / "plots" / "both.png", after=logits / 3.0)
    for path in (single, both):
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
