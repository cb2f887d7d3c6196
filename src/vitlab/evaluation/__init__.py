"""Evaluation: calibration, corruptions, the statistics of the comparisons between models, and the drivers that
run them on a trained run (``evaluate_run``) and compare runs (``compare_runs``). The rest is imported from the
module that defines it (``vitlab.evaluation.calibration``, ``.corruptions``, ``.stats``, ``.outputs``...)."""

from vitlab.evaluation.compare import compare_runs
from vitlab.evaluation.evaluate import evaluate_run
from vitlab.evaluation.outputs import classifier_logits

__all__ = ["classifier_logits", "compare_runs", "evaluate_run"]
