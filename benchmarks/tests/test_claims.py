"""benchmarks/reports/claims.py: the claims of docs/results.md recomputed from the per-seed results files, checked in
CI."""

from pathlib import Path

import pytest

from benchmarks.reports import claims as claims_module

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "results.md"


@pytest.fixture(scope="module")
def claims():
    return claims_module


def test_the_results_page_shows_the_recomputed_numbers(claims):
    results = claims.evaluate()
    assert claims.check(results, PAGE) == []
    assert all(r["verdict"] for r in results.values())


def test_an_edited_number_of_the_summary_fails_the_check(claims, tmp_path):
    results = claims.evaluate()
    summary = claims.summary(PAGE)
    expected = results["vitcae-table1-digits"]["readme"][0]
    assert expected in summary
    edited = tmp_path / "results.md"
    edited.write_text(PAGE.read_text().replace(summary, summary.replace(expected, expected.replace("87.93", "88.93"))))
    problems = claims.check(results, edited)
    assert len(problems) == 1 and problems[0].startswith("vitcae-table1-digits")


def test_a_stale_results_page_fails_the_check(claims, tmp_path):
    page = tmp_path / "results.md"
    head, marker, generated = PAGE.read_text().partition(claims.GENERATED)
    page.write_text(head + marker + generated.replace("does not hold", "holds", 1))
    problems = claims.check(claims.evaluate(), page)
    assert problems == [f"{page} is not the recomputed page; run python -m benchmarks.reports.claims --write {page}"]


def test_the_verdict_rule(claims):
    D = claims.Difference
    assert claims.verdict("raises", D([3.0, 3.2, 3.1], [1.0, 1.1, 0.9])) == "holds"
    assert claims.verdict("raises", D([1.0, 1.1, 0.9], [3.0, 3.2, 3.1])) == "does not hold"
    assert claims.verdict("raises", D([1.0, 3.0, 2.0], [2.0, 1.0, 3.0])) == "not resolved"
    assert claims.verdict("keeps", D([2.0, 2.1, 1.9], [2.2, 2.3, 2.1])) == "holds"  # within the 1-point margin
    assert claims.verdict("keeps", D([1.0, 1.1, 0.9], [3.0, 3.2, 3.1])) == "does not hold"
    assert claims.verdict("keeps", D([1.0, 3.0, 2.0], [2.0, 1.0, 3.0])) == "not resolved"
    assert claims.verdict("raises", D([2.0], [1.0])) == "not tested (1 seed)"
    low, high = D([1.0, 2.0, 3.0], [0.0, 1.0, 2.0]).interval()
    assert low == pytest.approx(1 - 2.7764 * (2 / 3) ** 0.5, abs=1e-3) and high == pytest.approx(2 - low, abs=1e-9)


def test_the_budget_slopes_are_recomputed_from_the_per_run_files(claims, tmp_path):
    """The pre-registered slopes (docs/card_claim.md) come from the per-run files, agree with the committed summary,
    and an edited slope in the summary of docs/results.md fails the check."""
    import json

    results = claims.evaluate()
    summaries = sorted((ROOT / "benchmarks/results/experiments").glob("card_claim_summary_cpu_*.json"))
    hypotheses = json.loads(summaries[-1].read_text())["hypotheses"]
    for slope in claims.SLOPES:
        r, committed = results[slope.id], hypotheses[slope.hypothesis]
        assert r["beta_points_per_doubling"] == pytest.approx(committed["beta_points_per_doubling"], abs=1e-9)
        assert r["ci95"] == pytest.approx(committed["ci95"], abs=1e-9) and r["verdict"] == committed["verdict"]
        assert [e for e, _ in r["gaps"]] == [8, 24, 48]
    expected = results["cet-card-slope-swin"]["readme"][0]
    summary = claims.summary(PAGE)
    assert expected in summary
    edited = tmp_path / "results.md"
    edited.write_text(
        PAGE.read_text().replace(summary, summary.replace(expected, expected.replace("holds", "does not hold")))
    )
    problems = claims.check(results, edited)
    assert len(problems) == 1 and problems[0].startswith("cet-card-slope-swin")


def test_a_claim_with_fewer_seeds_than_planned_is_pending_not_judged():
    """A verdict on part of the registered seeds would be a peek: the claim stays pending until every seed is in."""
    from benchmarks.reports.claims import Claim, Difference

    def claim(planned):
        return Claim(
            "x",
            "src",
            "s",
            "n",
            "keeps",
            "scale",
            "cmd",
            lambda: Difference([90.5, 91.5], [90.0, 91.0], paired=True),
            planned=planned,
        )

    with pytest.raises(FileNotFoundError, match="2 of the 3 planned seeds"):
        claim(3).compute()
    assert claim(2).compute()["verdict"] == "holds"


def test_a_comparison_on_fewer_seeds_than_ran_says_so():
    """A fork compares only the seeds that froze a head: its section says how many (issue 61: "5 seeds" stood where
    the comparison rested on one)."""
    from benchmarks.reports.claims import compared_scale

    scale = "digits, 50 epochs, 5 seeds, paired"
    assert compared_scale(scale, {"a": [90.8], "b": [89.7]}) == "digits, 50 epochs, 5 seeds run, 1 compared, paired"
    assert compared_scale(scale, {"a": [1.0] * 5, "b": [1.0] * 5}) == scale
