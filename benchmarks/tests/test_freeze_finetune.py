"""The fine-tuning protocol's smoke test (benchmarks/experiments/freeze_finetune.py and its summary): the paired
comparison, the goal's rule and the clause pass epochs on hand-made records."""

import json

import pytest

from benchmarks.experiments.freeze_finetune import PRETRAIN, arm_overrides, clause_pass_epochs, pretrain_name
from benchmarks.reports.freeze_finetune_summary import summarize, time_to_reach


def _record(arm, seed, final, best, wall, val, cpu=None):
    curve = {"val/acc": val, "time/epoch_s": [10.0] * len(val), "time/step_s": [9.0] * len(val), "step": [8, 17]}
    return {
        "arm": arm,
        "seed": seed,
        "test": {"test/acc": best},
        "test_last": {"test/acc": final},
        "fit_wall_s": wall,
        "fit_cpu_s": cpu,
        "val_curve": curve,
    }


def test_the_summary_pairs_by_seed_and_applies_the_goal(tmp_path):
    rows = [
        ("none", 0, 0.800, 0.810, 100.0, [0.70, 0.78]),
        ("none", 1, 0.790, 0.800, 110.0, [0.70, 0.77]),
        ("fast", 0, 0.801, 0.805, 60.0, [0.78, 0.79]),
        ("fast", 1, 0.792, 0.801, 66.0, [0.76, 0.77]),
        ("slow", 0, 0.700, 0.700, 100.0, [0.60, 0.70]),
        ("slow", 1, 0.690, 0.700, 110.0, [0.60, 0.70]),
    ]
    for arm, seed, *values in rows:
        (tmp_path / f"{arm}-seed{seed}.json").write_text(json.dumps(_record(arm, seed, *values)))
    arms = summarize(tmp_path)["arms"]
    fast, slow = arms["fast"], arms["slow"]
    assert fast["final"]["diff"] == pytest.approx(0.15) and fast["meets_goal_wall"]
    assert fast["wall_ratio"]["geomean"] == pytest.approx(0.6)
    assert fast["cpu_ratio"] == {} and not fast["meets_goal_cpu"]  # no CPU seconds recorded
    assert fast["time_to_none_final_val_s"] == [10.0, 20.0]
    assert not slow["meets_goal_wall"] and slow["time_to_none_final_val_s"] == [None, None]
    assert arms["none"]["step_s"] == [1.0, 1.0]  # 18 s of steps over 18 steps


def test_time_to_reach_sums_the_epochs_up_to_the_first_that_reaches_it():
    record = _record("a", 0, 0, 0, 0, [0.5, 0.7, 0.6])
    assert time_to_reach(record, 0.65) == 20.0 and time_to_reach(record, 0.9) is None


def test_clause_pass_epochs_name_the_first_epoch_every_head_of_a_layer_passes():
    records = [
        {"epoch": e, "tau": [[1, 1], [1, 1]], "response_level": lv, "threshold": [[1, 1], [1, 1]], "rho": 0.5,
         "directedness": [[0.9, 0.9], [0.1, 0.1]], "converged": [[False, False], [e >= 2, e >= 2]]}
        for e, lv in enumerate([[[2, 2], [2, 0]], [[0, 2], [0, 0]], [[0, 0], [0, 0]]])
    ]  # fmt: skip
    got = clause_pass_epochs(records)
    assert got["drift"] == [2, 1] and got["directed"] == [None, 0] and got["converged"] == [None, 2]
    assert got["score"] == [None, None]  # no score levels recorded


def test_the_static_arm_freezes_half_the_blocks():
    assert arm_overrides("static", 12)[-1] == "dynamics.freeze_layers=6"
    assert arm_overrides("none", 4) == ["dynamics=null"]


def test_a_vitcae_pretraining_has_its_own_runs_and_loads_its_temperatures():
    assert pretrain_name("cross", 4, 4, 0) == "pre-cifar10-p4-d4-s0"  # the ViT runs of 2026-12-07 keep their names
    assert pretrain_name("within", 2, 12, 3, "vitcae") == "pre-cifar10a-vitcae-p2-d12-s3"
    assert "model.name=vitcae_pico" in PRETRAIN["vitcae"][0] and PRETRAIN["vitcae"][1] == ["model.temperature=true"]


def test_the_cpu_ratio_pairs_only_the_seeds_that_recorded_cpu_seconds(tmp_path):
    rows = [
        ("none", 0, 0.80, 0.80, 100.0, [0.8], None),
        ("none", 1, 0.80, 0.80, 100.0, [0.8], 90.0),
        ("none", 2, 0.80, 0.80, 100.0, [0.8], 100.0),
        ("fast", 0, 0.80, 0.80, 100.0, [0.8], None),
        ("fast", 1, 0.80, 0.80, 100.0, [0.8], 45.0),
        ("fast", 2, 0.80, 0.80, 100.0, [0.8], 52.0),
    ]
    for arm, seed, *values in rows:
        (tmp_path / f"{arm}-seed{seed}.json").write_text(json.dumps(_record(arm, seed, *values)))
    fast = summarize(tmp_path)["arms"]["fast"]
    assert fast["cpu_ratio"]["seeds"] == [1, 2] and fast["cpu_ratio"]["values"] == pytest.approx([0.5, 0.52])
    assert fast["meets_goal_cpu"] and not fast["meets_goal_wall"]  # level at 0.51 of the CPU time, 1.0 of the wall
