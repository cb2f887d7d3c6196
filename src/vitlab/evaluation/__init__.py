"""Evaluation: calibration, corruptions and the statistics of the comparisons between models."""

from vitlab.evaluation.calibration import (
    calibration_split_eval,
    expected_calibration_error,
    fit_temperature,
    reliability_diagram,
)
from vitlab.evaluation.corruptions import (
    CORRUPTIONS,
    SEVERITY_PARAMETERS,
    add_gaussian_noise,
    apply_corruption,
    blur,
    scale_contrast,
    shift_brightness,
)
from vitlab.evaluation.stats import correlation_report, summarize, welch_ttest

__all__ = [
    "CORRUPTIONS",
    "SEVERITY_PARAMETERS",
    "add_gaussian_noise",
    "apply_corruption",
    "blur",
    "calibration_split_eval",
    "correlation_report",
    "expected_calibration_error",
    "fit_temperature",
    "reliability_diagram",
    "scale_contrast",
    "shift_brightness",
    "summarize",
    "welch_ttest",
]
