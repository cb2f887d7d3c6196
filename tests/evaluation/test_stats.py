"""Seed statistics against scipy and hand-worked formulas; the bootstrap interval on synthetic correlated data."""

import math

import numpy as np
import pytest
from scipy import stats

from vitlab.evaluation.stats import correlation_report, summarize, welch_ttest


def correlated_pairs(n: int, rho: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    covariance = [[1.0, rho], [rho, 1.0]]
    sample = np.random.default_rng(seed).multivariate_normal([0.0, 0.0], covariance, size=n)
    return sample[:, 0], sample[:, 1]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_welch_equals_scipy_and_the_welch_formula(seed):
    rng = np.random.default_rng(seed)
    a, b = rng.normal(0.80, 0.01, size=5), rng.normal(0.79, 0.03, size=7)
    t, p = welch_ttest(a, b)
    reference = stats.ttest_ind(a, b, equal_var=False)
    assert t == pytest.approx(reference.statistic, rel=1e-12) and p == pytest.approx(reference.pvalue, rel=1e-12)
    # Welch (1947): t = (mean_a - mean_b) / sqrt(s_a^2/n_a + s_b^2/n_b), Welch-Satterthwaite degrees of freedom
    va, vb = a.var(ddof=1) / len(a), b.var(ddof=1) / len(b)
    dof = (va + vb) ** 2 / (va**2 / (len(a) - 1) + vb**2 / (len(b) - 1))
    assert t == pytest.approx((a.mean() - b.mean()) / math.sqrt(va + vb), rel=1e-12)
    assert p == pytest.approx(2 * stats.t.sf(abs(t), dof), rel=1e-9)


def test_welch_rejects_degenerate_samples():
    with pytest.raises(ValueError, match="at least 2"):
        welch_ttest([0.8], [0.7, 0.75])
    with pytest.raises(ValueError, match="both samples are constant"):
        welch_ttest([0.8, 0.8], [0.7, 0.7])


def test_summarize_hand_worked():
    summary = summarize([1.0, 2.0, 4.0])
    assert summary["n"] == 3 and summary["mean"] == pytest.approx(7 / 3)
    assert summary["std"] == pytest.approx(math.sqrt(((1 - 7 / 3) ** 2 + (2 - 7 / 3) ** 2 + (4 - 7 / 3) ** 2) / 2))
    assert (summary["min"], summary["max"]) == (1.0, 4.0)
    assert math.isnan(summarize([0.5])["std"])
    with pytest.raises(ValueError, match="NaN"):
        summarize([1.0, float("nan")])


def test_correlation_report_matches_scipy_and_the_ci_covers_the_truth():
    x, y = correlated_pairs(200, rho=0.6, seed=0)
    report = correlation_report(x, y, n_boot=2000, seed=0)
    pearson, spearman = stats.pearsonr(x, y), stats.spearmanr(x, y)
    assert report["pearson_r"] == pytest.approx(pearson.statistic) and report["pearson_p"] == pytest.approx(
        pearson.pvalue
    )
    assert report["spearman_rho"] == pytest.approx(spearman.statistic)
    assert report["spearman_p"] == pytest.approx(spearman.pvalue)
    assert report["pearson_ci_low"] < 0.6 < report["pearson_ci_high"]
    assert report["pearson_ci_low"] < report["pearson_r"] < report["pearson_ci_high"]
    # The percentile bootstrap agrees with Fisher's z interval at this n.
    fisher = pearson.confidence_interval(0.95)
    assert report["pearson_ci_low"] == pytest.approx(fisher.low, abs=0.03)
    assert report["pearson_ci_high"] == pytest.approx(fisher.high, abs=0.03)
    assert report == correlation_report(x, y, n_boot=2000, seed=0)  # the seed fixes the interval


def test_bootstrap_ci_is_narrower_for_larger_n():
    widths = []
    for n in (50, 200, 1000):
        report = correlation_report(*correlated_pairs(n, rho=0.6, seed=1), n_boot=1000, seed=0)
        widths.append(report["pearson_ci_high"] - report["pearson_ci_low"])
    assert widths[0] > widths[1] > widths[2]


def test_bootstrap_drops_constant_resamples_for_tiny_n():
    report = correlation_report([0.1, 0.5, 0.9, 0.4], [0.2, 0.4, 0.8, 0.6], n_boot=500, seed=0)
    assert 0 < report["n_boot_used"] < 500  # with 4 pairs some resamples repeat one pair and have no r
    assert -1 <= report["pearson_ci_low"] <= report["pearson_ci_high"] <= 1


def test_correlation_report_rejects_bad_input():
    with pytest.raises(ValueError, match="paired"):
        correlation_report([1.0, 2.0, 3.0], [1.0, 2.0, 3.0, 4.0])
    with pytest.raises(ValueError, match="constant"):
        correlation_report([1.0, 1.0, 1.0], [1.0, 2.0, 3.0])


def test_welch_interval_hand_worked():
    """Difference 3.86 with Welch-Satterthwaite df, worked by hand from the t quantile."""
    import numpy as np
    from scipy import stats as scipy_stats

    from vitlab.evaluation.stats import welch_interval

    a, b = [34.83, 36.48, 36.94], [32.35, 31.76, 32.55]
    va, vb = np.var(a, ddof=1) / 3, np.var(b, ddof=1) / 3
    df = (va + vb) ** 2 / (va**2 / 2 + vb**2 / 2)
    half = scipy_stats.t.ppf(0.975, df) * np.sqrt(va + vb)
    difference, low, high = welch_interval(a, b)
    assert difference == pytest.approx(np.mean(a) - np.mean(b))
    assert (low, high) == pytest.approx((difference - half, difference + half))
    with pytest.raises(ValueError, match="level"):
        welch_interval(a, b, level=95)
