"""The null models and positive controls of the convergence decision (issues 44, 53), at a test's size: under
every learning-rate schedule the default rule (``response``: drift per unit rate) calls no null process converged,
converges a geometric decay within ``patience + 2`` epochs of its floor, and never converges constant-speed directed
motion; the old default (``decay``) freezes heads whose drift only follows a decaying rate. The full tables are in
``benchmarks/results/experiments/convergence_nulls_*.json``."""

import pytest
import torch

from benchmarks.experiments.convergence_nulls import (
    BURN_IN,
    EPOCHS,
    NULLS,
    PATIENCE,
    SCHEDULES,
    decisions,
    drifts,
    jitter_floor,
    main,
    paths,
    schedule,
)
from vitlab.diagnostics.dynamics import patch_grid_cost
from vitlab.diagnostics.rho_calibration import calibrate_rho

GRID, IMAGES = (4, 4), 16
COST = patch_grid_cost(*GRID, "image")
RHO = calibrate_rho(GRID, IMAGES, "image")
STEP = {"attention_walk": 1e-3, "saturating_walk": 1.0}


def _measured(kind: str, step: float, name: str, runs: int = 3, images: int = IMAGES) -> list[tuple]:
    g, rate = torch.Generator().manual_seed(7), schedule(name)
    heads = [p for _ in range(runs) for p in paths(kind, GRID, images, step, g, rate)[0].unbind(1)]
    return [drifts(h, COST) for h in heads]


# fading_trend (issue 61): the default rule freezes it, the lag clause (off by default) is not yet strong enough at
# its epoch (docs/dynamics.md, "The lag clause"); strict, so that the day it passes the mark must go
_OPEN = pytest.mark.xfail(strict=True, reason="a steady sub-noise trend under falling noise is still frozen")


@pytest.mark.parametrize("name", SCHEDULES)
# attention_walk is the slow one (a real Attention under AdamW): its rows are in the results file
@pytest.mark.parametrize(
    "kind", [pytest.param(k, marks=_OPEN) if k == "fading_trend" else k for k in NULLS if k != "attention_walk"]
)
def test_no_null_process_is_called_converged_by_the_default_rule_under_any_schedule(kind, name):
    step = STEP.get(kind, 0.3)
    results = [decisions(m, "response", RHO, step * schedule(name)) for m in _measured(kind, step, name)]
    assert all(r["converged_at"] is None for r in results)
    assert max(r["stable_share"] for r in results) <= 0.1


def test_the_saturating_walk_is_frozen_by_the_decay_rule_but_never_by_the_default():
    """Its attention drift falls as the softmax saturates while its logits keep walking: the default's score clause
    sees the walk (issue 53)."""
    measured = _measured("saturating_walk", 1.0, "constant", runs=6)
    rate = schedule("constant")
    results = {rule: [decisions(m, rule, RHO, rate) for m in measured] for rule in ("response", "decay")}
    assert any(r["converged_at"] is not None for r in results["decay"])
    assert all(r["converged_at"] is None and r["stable_share"] == 0 for r in results["response"])  # not stable once


def test_the_old_decay_rule_freezes_a_walk_that_only_follows_a_cosine_rate():
    """Why the default changed (issue 53): the drift falls with the rate, and the decay rule reads that as settling."""
    measured = _measured("shared_walk", 0.3, "cosine")
    rate = 0.3 * schedule("cosine")
    assert any(decisions(m, "decay", RHO, rate)["converged_at"] is not None for m in measured)
    assert all(decisions(m, "response", RHO, rate)["converged_at"] is None for m in measured)


@pytest.mark.parametrize("name", ["constant", "cosine"])
def test_geometric_decay_converges_soon_after_its_floor_and_directed_motion_never(name):
    """At the digits probe's size (144 images; with 16 the directedness is too noisy for the default's clause)."""
    rate, images = schedule(name), 144
    rho = calibrate_rho(GRID, images, "image")
    floor = jitter_floor(GRID, images, COST, torch.Generator().manual_seed(8), rate)
    judged = 0
    for q in (0.6, 0.7, 0.85):
        for measured in _measured("decay", q, name, runs=2, images=images):
            result = decisions(measured, "response", rho, rate)
            reached = next((t + 1 for t, d in enumerate(result["drift"]) if d <= floor[t]), None)
            if reached is None:  # a cosine to 0 may end the approach before its floor: then nothing is promised
                assert name != "constant"
                continue
            if max(reached, BURN_IN) + PATIENCE + 2 > EPOCHS:  # too late to judge within the 40 epochs
                continue
            judged += 1
            assert result["converged_at"] is not None
            assert result["converged_at"] <= max(reached, BURN_IN) + PATIENCE + 2
    assert judged >= 2  # the q = 0.6 approach reaches its floor early under both rates
    assert all(decisions(m, "response", RHO, rate)["converged_at"] is None for m in _measured("directed", 1.0, name))


def test_the_decay_control_that_set_the_score_ratio_converges_at_0_5_and_not_at_0_35():
    """The results file's first ``decay`` run under cosine (q = 0.7; 10 paths, then the floor, from seed 46001, as
    ``run`` draws them): its floor epoch is 31; the default converges it at epoch 34, a score ratio of 0.35 not by 40
    (docs/experiments/dynamics_response_rule.md)."""
    rate, g = schedule("cosine"), torch.Generator().manual_seed(46001)
    heads = [paths("decay", GRID, 144, 0.7, g, rate)[0][:, 0] for _ in range(10)]
    floor = jitter_floor(GRID, 144, COST, g, rate)
    measured, rho = drifts(heads[0], COST), calibrate_rho(GRID, 144, "image")
    assert next(t + 1 for t, d in enumerate(measured[0]) if d <= floor[t]) == 31
    assert decisions(measured, "response", rho, rate)["converged_at"] == 34
    assert decisions(measured, "response", rho, rate, score_ratio=0.35)["converged_at"] is None


def test_the_json_records_carry_the_keys_the_issue_names(capsys):
    assert main(["--runs", "1", "--quick", "--json", "--schedule", "step"]) == 0
    import json

    records = json.loads(capsys.readouterr().out)
    keys = {"process", "schedule", "rule", "default", "stable_share", "converged_share"}
    assert records and all(keys <= set(r) for r in records)
    assert {r["schedule"] for r in records} == {"step"}
    assert {r["rule"] for r in records if r["default"]} == {"response"}
