"""benchmarks/experiments/run_result.py's summary of a run's last decision: why its heads were or were not
converged under the decay or response rule (issue 53: a reader sees why a head froze or did not)."""

from benchmarks.experiments.run_result import last_decision


def _record(convergence: str, **extra) -> dict:
    return {"epoch": 9, "convergence": convergence, "threshold": [[1.0, 2.0, None]], **extra}


def test_response_counts_heads_below_the_threshold_and_below_rho():
    record = _record(
        "response", response_level=[[0.5, 3.0, None]], rho=0.66, directedness=[[0.9, 0.5, 0.7]], decay_level=None
    )
    assert last_decision(record) == {
        "epoch": 9,
        "heads": 3,
        "below_threshold": 1,  # 0.5 < 1.0; 3.0 >= 2.0; no level yet
        "rho": 0.66,
        "directedness_range": [0.5, 0.9],
        "directedness_below_rho": 1,
    }


def test_decay_has_no_directedness_and_other_rules_say_nothing():
    assert last_decision(_record("decay", decay_level=[[0.1, 0.1, 0.1]])) == {
        "epoch": 9,
        "heads": 3,
        "below_threshold": 2,
    }
    assert last_decision(_record("noise", rho=0.7, directedness=[[0.1, 0.2, 0.3]])) == {}


def test_response_counts_heads_whose_scores_are_below_their_threshold():
    record = _record(
        "response",
        response_level=[[0.5, 3.0, None]],
        score_level=[[1.0, 9.0, None]],
        score_threshold=[[2.0, 4.0, None]],
    )
    assert last_decision(record)["scores_below_threshold"] == 1  # 1 < 2; 9 >= 4; not judged yet
