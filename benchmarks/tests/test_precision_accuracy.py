"""The precision-accuracy report (benchmarks/reports/precision_accuracy.py) reads per-run records, groups them by
config and precision, and tests each precision against 32-true with Welch's t-test."""

from __future__ import annotations

import json

import pytest
from scipy import stats

from benchmarks.reports import precision_accuracy


def _record(folder, config, precision, resolved, seed, acc):
    record = {
        "experiment": "precision_accuracy",
        "arm": f"{config}:{precision}",
        "seed": seed,
        "precision": {"requested": precision, "precision": resolved, "reason": "test"},
        "test": {"test/acc": acc},
        "cpu": "Test CPU",
        "git": {"revision": "abcdef1234567"},
        "timing": {"time/epoch_total_s": 80.0, "epochs": 8},
    }
    (folder / f"{config}-{precision}-seed{seed}.json").write_text(json.dumps(record))


def test_each_precision_is_tested_against_fp32_per_config(tmp_path):
    bf16, fp32 = [0.41, 0.43, 0.42], [0.40, 0.44, 0.45]
    for seed, (a, b) in enumerate(zip(bf16, fp32, strict=True)):
        _record(tmp_path, "cifar10_p4_vit", "bf16-mixed", "bf16-mixed", seed, a)
        _record(tmp_path, "cifar10_p4_vit", "32-true", "32-true", seed, b)
    _record(tmp_path, "cifar10_p4_global", "auto", "32-true", 0, 0.5)
    _record(tmp_path, "cifar10_p4_global", "32-true", "32-true", 0, 0.5)
    (tmp_path / "other.json").write_text(json.dumps({"experiment": "something else"}))
    runs = precision_accuracy.load(tmp_path)
    summary = precision_accuracy.summarise(runs)
    vit = summary["cifar10_p4_vit"]
    assert vit["arms"]["bf16-mixed"]["test_acc"] == pytest.approx([41, 43, 42])
    expected = stats.ttest_ind([41, 43, 42], [40, 44, 45], equal_var=False)
    comparison = vit["comparisons"]["bf16-mixed"]
    assert comparison["p"] == pytest.approx(expected.pvalue)
    assert comparison["difference"] == pytest.approx(42 - 43)
    assert comparison["ci95"][0] < -1 < comparison["ci95"][1]
    assert "fewer than two seeds" in summary["cifar10_p4_global"]["comparisons"]["auto"]["note"]
    text = precision_accuracy.table(summary, runs)
    assert "| `cifar10_p4_vit` | bf16-mixed (bf16-mixed) | 0,1,2 | 41.00, 43.00, 42.00 | 42.00 | 10 |" in text
    assert "auto (32-true)" in text


def test_an_empty_folder_is_a_clear_error(tmp_path):
    with pytest.raises(SystemExit, match="holds no per-run JSON"):
        precision_accuracy.load(tmp_path)
