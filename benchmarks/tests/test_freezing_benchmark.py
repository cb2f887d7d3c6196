"""benchmarks.micro.freezing: its FLOP prediction against PyTorch's counter, its paired statistics and its verdicts."""

import argparse

import pytest

from benchmarks.micro import freezing as freezing_module


@pytest.fixture(scope="module")
def freezing():
    return freezing_module


def test_verdict_needs_the_whole_interval_on_one_side_of_the_bar(freezing):
    assert freezing.verdict(0.72, 0.9, 0.7, at_least=True) == "met"
    assert freezing.verdict(0.5, 0.69, 0.7, at_least=True) == "missed"
    assert freezing.verdict(0.6, 0.8, 0.7, at_least=True) == "undecided"
    assert freezing.verdict(-0.01, 0.019, 0.02, at_least=False) == "met"
    assert freezing.verdict(0.021, 0.05, 0.02, at_least=False) == "missed"
    assert freezing.verdict(0.0, 0.03, 0.02, at_least=False) == "undecided"


@pytest.mark.slow  # the benchmark script, end to end
def test_a_tiny_run_counts_the_predicted_flops_and_pairs_every_row_with_the_base(freezing):
    args = argparse.Namespace(dim=32, heads=4, depth=2, batch=2, warmup=1, repeats=3, clock="wall", compare_split=True)
    case = freezing.benchmark(4, args)
    paths = [(row["frozen_heads_per_layer"], row["path"]) for row in case["rows"]]
    assert paths[:7] == [
        (0, "one call"),
        (1, "one call"),
        (2, "one call"),
        (3, "one call"),
        (4, "one call"),
        (4, "one call, no skip"),
        (0, "A/A control"),
    ]
    assert {path for _, path in paths[7:]} == {"two calls"}
    for row in case["rows"]:
        counted, flops = row["counted_matmul_flops"], row["flops"]
        assert counted["forward"] == flops["forward_matmul"] and counted["backward"] == flops["backward_matmul"]
        for stat in row["paired"].values():
            assert stat["low"] <= stat["median"] <= stat["high"]
    assert set(case["rows"][2]["bars"]) == {
        "forward_overhead_at_most_2%",
        "backward_at_or_above_prediction",
        "step_at_least_70%_of_prediction",
    }
    assert "step_at_least_70%_of_prediction" not in case["rows"][1]["bars"]
