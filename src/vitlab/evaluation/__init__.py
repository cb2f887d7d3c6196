"""Evaluation: calibration, corruptions, the statistics of the comparisons between models, and the drivers that
run them on a trained run (``evaluate_run``) and compare runs (``compare_runs``)."""

from vitlab.evaluation.calibration import (
    calibration_split_eval,
    expected_calibration_error,
    fit_temperature,
    reliability_diagram,
)
from vitlab.evaluation.compare import compare_runs, comparison_json, comparison_markdown
from vitlab.evaluation.corruptions import (
    CORRUPTIONS,
    SEVERITY_PARAMETERS,
    add_gaussian_noise,
    apply_corruption,
    blur,
    scale_contrast,
    shift_brightness,
)
from vitlab.evaluation.evaluate import evaluate_run, format_evaluation
from vitlab.evaluation.outputs import build_tta_views, classifier_logits, logits_and_assignment, translate
from vitlab.evaluation.stats import correlation_report, summarize, welch_ttest
from vitlab.evaluation.target import load_evaluation_target

__all__ = [
    "CORRUPTIONS",
    "SEVERITY_PARAMETERS",
    "add_gaussian_noise",
    "apply_corruption",
    "blur",
    "build_tta_views",
    "calibration_split_eval",
    "classifier_logits",
    "compare_runs",
    "comparison_json",
    "comparison_markdown",
    "correlation_report",
    "evaluate_run",
    "expected_calibration_error",
    "fit_temperature",
    "format_evaluation",
    "load_evaluation_target",
    "logits_and_assignment",
    "reliability_diagram",
    "scale_contrast",
    "shift_brightness",
    "summarize",
    "translate",
    "welch_ttest",
]
