"""Statistics of the comparisons: seeds summaries, Welch's t-test, correlations with a bootstrap interval.

CET-ViT card, "Results" and "Reversibility vs accuracy" (CET-ViT v4 model card): mean and standard deviation
over seeds, Welch's t-test between two models' seeds, and per-class Pearson / Spearman correlations with p-values
and a 95% percentile-bootstrap confidence interval (Efron & Tibshirani 1993, ch. 13).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from scipy import stats

ArrayLike = Sequence[float] | np.ndarray


def _as_sample(values: ArrayLike, name: str, minimum: int) -> np.ndarray:
    sample = np.asarray(values, dtype=np.float64)
    if sample.ndim != 1:
        raise ValueError(f"{name} must be a 1-D sequence of numbers, got shape {sample.shape}")
    if len(sample) < minimum:
        raise ValueError(f"{name} needs at least {minimum} values, got {len(sample)}")
    if not np.isfinite(sample).all():
        raise ValueError(f"{name} contains NaN or inf")
    return sample


def summarize(values: ArrayLike) -> dict[str, float | int]:
    """``mean``, ``std`` (sample, ddof=1; NaN for a single value), ``n``, ``min``, ``max`` of ``values: [n]``."""
    sample = _as_sample(values, "values", minimum=1)
    return {
        "mean": float(sample.mean()),
        "std": float(sample.std(ddof=1)) if len(sample) > 1 else float("nan"),
        "n": len(sample),
        "min": float(sample.min()),
        "max": float(sample.max()),
    }


def welch_ttest(a: ArrayLike, b: ArrayLike) -> tuple[float, float]:
    """Welch's unequal-variance t-test between two samples (e.g. two models' accuracies over seeds).

    ``a: [n_a]``, ``b: [n_b]``, at least 2 values each. Returns ``(t, two-sided p)``, as
    ``scipy.stats.ttest_ind(a, b, equal_var=False)``.
    """
    sample_a, sample_b = _as_sample(a, "a", minimum=2), _as_sample(b, "b", minimum=2)
    if sample_a.var() == 0 and sample_b.var() == 0:
        raise ValueError("both samples are constant: the t statistic is undefined (did every seed give one value?)")
    result = stats.ttest_ind(sample_a, sample_b, equal_var=False)
    return float(result.statistic), float(result.pvalue)


def welch_interval(a: ArrayLike, b: ArrayLike, level: float = 0.95) -> tuple[float, float, float]:
    """The difference of means ``mean(a) - mean(b)`` with its Welch confidence interval (Welch-Satterthwaite
    degrees of freedom), as ``scipy.stats.ttest_ind(a, b, equal_var=False).confidence_interval(level)``.

    ``a: [n_a]``, ``b: [n_b]``, at least 2 values each. Returns ``(difference, low, high)``.
    """
    sample_a, sample_b = _as_sample(a, "a", minimum=2), _as_sample(b, "b", minimum=2)
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), got {level}")
    if sample_a.var() == 0 and sample_b.var() == 0:
        raise ValueError("both samples are constant: the interval is undefined (did every seed give one value?)")
    interval = stats.ttest_ind(sample_a, sample_b, equal_var=False).confidence_interval(level)
    return float(sample_a.mean() - sample_b.mean()), float(interval.low), float(interval.high)


def _pearson_rows(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Pearson r of each row pair of ``x, y: [R, n]`` -> ``[R]``; NaN where a row is constant."""
    x = x - x.mean(axis=1, keepdims=True)
    y = y - y.mean(axis=1, keepdims=True)
    denominator = np.sqrt((x * x).sum(axis=1) * (y * y).sum(axis=1))
    with np.errstate(invalid="ignore", divide="ignore"):
        r = np.where(denominator > 0, (x * y).sum(axis=1) / denominator, np.nan)
    return np.clip(r, -1.0, 1.0)  # rounding can leave |r| a few ulps above 1


def correlation_report(
    x: ArrayLike, y: ArrayLike, n_boot: int = 2000, seed: int = 0, confidence: float = 0.95
) -> dict[str, float | int]:
    """Pearson and Spearman correlations of paired samples with p-values, and a bootstrap CI for Pearson r.

    ``x, y: [n]`` paired (e.g. per-class reversibility and accuracy), n >= 3, neither constant. The interval is the
    percentile bootstrap over ``n_boot`` resamples of the pairs; resamples in which x or y is constant have no r and
    are dropped (``n_boot_used`` says how many were kept), so small n does not turn the interval into NaN.
    """
    sample_x, sample_y = _as_sample(x, "x", minimum=3), _as_sample(y, "y", minimum=3)
    if len(sample_x) != len(sample_y):
        raise ValueError(f"x and y must be paired, got {len(sample_x)} and {len(sample_y)} values")
    if np.ptp(sample_x) == 0 or np.ptp(sample_y) == 0:
        raise ValueError("x or y is constant: the correlation is undefined")
    if n_boot < 1 or not 0 < confidence < 1:
        raise ValueError(f"need n_boot >= 1 and confidence in (0, 1), got {n_boot} and {confidence}")
    pearson = stats.pearsonr(sample_x, sample_y)
    spearman = stats.spearmanr(sample_x, sample_y)

    resample = np.random.default_rng(seed).integers(0, len(sample_x), size=(n_boot, len(sample_x)))
    boot_r = _pearson_rows(sample_x[resample], sample_y[resample])
    boot_r = boot_r[np.isfinite(boot_r)]
    tail = 100 * (1 - confidence) / 2
    low, high = np.percentile(boot_r, [tail, 100 - tail]) if len(boot_r) else (np.nan, np.nan)
    return {
        "pearson_r": float(pearson.statistic),
        "pearson_p": float(pearson.pvalue),
        "spearman_rho": float(spearman.statistic),
        "spearman_p": float(spearman.pvalue),
        "pearson_ci_low": float(low),
        "pearson_ci_high": float(high),
        "confidence": confidence,
        "n": len(sample_x),
        "n_boot_used": len(boot_r),
    }


def per_class_mean(values: torch.Tensor, labels: torch.Tensor, num_classes: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean of ``values: [B]`` over the images of each class (``labels: [B]``) -> ``(means [K], counts [K])``.

    Classes without images get NaN.
    """
    counts = torch.bincount(labels, minlength=num_classes)
    sums = torch.zeros(num_classes, dtype=torch.float64).index_add_(0, labels, values.to(torch.float64))
    return torch.where(counts > 0, sums / counts.clamp_min(1), torch.nan), counts
