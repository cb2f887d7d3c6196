"""``vitlab compare`` counts each run once and says when the runs were trained on different data."""

from __future__ import annotations

import pytest
import yaml

from run_fixtures import make_run
from vitlab.cli.main import main
from vitlab.errors import ConfigError
from vitlab.evaluation.compare import compare_runs, comparison_markdown


def _runs(tmp_path, count: int = 2):
    return [
        make_run(tmp_path, f"seed{seed}", seed=seed, export=False, test_metrics={"test/acc": 0.5 + 0.1 * seed})
        for seed in range(count)
    ]


def test_a_run_given_twice_is_refused(tmp_path, capsys):
    a, b = _runs(tmp_path)
    with pytest.raises(ConfigError, match="is given twice"):
        compare_runs([a, b, a])
    with pytest.raises(ConfigError, match="is given twice"):
        compare_runs([a, tmp_path / "." / a.name])  # the same folder, spelled another way
    assert main(["compare", str(a), str(a)]) == 2
    assert "is given twice" in capsys.readouterr().err


def test_runs_on_different_datasets_are_a_warning(tmp_path, capsys):
    a, b = _runs(tmp_path)
    for run, name in ((a, "mnist.npz"), (b, "fashion.npz")):
        config = yaml.safe_load((run / "config.yaml").read_text())
        config["data"].update(name="npz", path=f"/data/{name}")
        (run / "config.yaml").write_text(yaml.safe_dump(config))
    comparison = compare_runs([a, b])
    assert comparison["datasets"] == {"npz mnist.npz": [str(a)], "npz fashion.npz": [str(b)]}
    (warning,) = comparison["warnings"]
    assert "different datasets (npz mnist.npz: 1 run, npz fashion.npz: 1 run)" in warning
    assert f"**Warning:** {warning}" in comparison_markdown(comparison)
    assert main(["compare", str(a), str(b)]) == 0
    assert "vitlab compare: warning: the runs were trained on different datasets" in capsys.readouterr().err
    assert compare_runs(_runs(tmp_path / "same"))["warnings"] == []


def test_compare_writes_numbers_out_as_a_reader_compares_them():
    from vitlab.evaluation.compare import plain_number

    assert [plain_number(v) for v in (12345.6, -12345.6, 0.012345, 0.91, 1.0)] == [
        "12346",
        "-12346",
        "0.01235",
        "0.91",
        "1",
    ]
    assert plain_number(0.01, 2) == "0.01" and plain_number(2.5e10) == "2.5e+10" and plain_number(3e-6) == "3e-06"
