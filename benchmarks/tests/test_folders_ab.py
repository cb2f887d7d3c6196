"""benchmarks/reports/folders_ab.py: two folders of per-run files compared arm by arm."""

import json

import pytest

from benchmarks.reports import folders_ab


def _write(folder, arm, accs):
    folder.mkdir(exist_ok=True)
    for seed, acc in enumerate(accs):
        record = {"arm": arm, "seed": seed, "test": {"test/acc": acc / 100}}
        (folder / f"{arm.replace(':', '-')}-seed{seed}.json").write_text(json.dumps(record))


def test_each_arm_of_both_folders_gets_its_welch_difference(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    _write(a, "m:auto", [43.0, 42.0, 44.0])
    _write(b, "m:auto", [38.0, 37.0, 39.0])
    _write(a, "only_a:auto", [1.0, 2.0])
    _write(b, "one_seed:auto", [1.0])
    _write(a, "one_seed:auto", [1.0, 2.0])
    summary = folders_ab.compare(a, b)
    rows = {row["arm"]: row for row in summary["rows"]}
    assert set(rows) == {"m:auto", "one_seed:auto"}  # arms in both folders only
    assert rows["m:auto"]["a_minus_b"] == pytest.approx(5.0) and rows["m:auto"]["ci95"][0] > 0
    assert rows["m:auto"]["a"] == pytest.approx([43.0, 42.0, 44.0])
    assert "ci95" not in rows["one_seed:auto"]
    assert summary["environment"]["versions"]["torch"]
