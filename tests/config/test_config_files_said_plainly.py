"""A config that cannot be used is said in one line before anything is written: a file without settings, brackets
nested past what a parser reads, a run folder name the file system refuses; the defaults are named when used."""

from __future__ import annotations

import pytest

from vitlab.cli.main import main


@pytest.mark.parametrize("text", ["", "# only a comment\n", "---\n"])
def test_a_config_file_without_settings_is_refused(tmp_path, capsys, text):
    (tmp_path / "empty.yaml").write_text(text)
    assert main(["fit", "--config", str(tmp_path / "empty.yaml"), f"run.dir={tmp_path / 'run'}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        f"vitlab fit: error: config {tmp_path / 'empty.yaml'} is empty (no settings); write its settings, or leave "
        "out --config to train the defaults"
    ]
    assert not (tmp_path / "run").exists()


def test_fit_without_a_config_says_the_defaults_are_used(capsys):
    assert main(["fit", "--print-config", "trainer.max_epochs=3"]) == 0
    err = capsys.readouterr().err
    assert "vitlab fit: no --config: the defaults (vit_pico on digits, 3 epochs) where no override is given" in err


def test_brackets_nested_too_deep_are_one_line_not_a_recursion_error(tmp_path, capsys):
    (tmp_path / "deep.yaml").write_text("model: " + "[" * 2000 + "]" * 2000 + "\n")
    assert main(["fit", "--config", str(tmp_path / "deep.yaml")]) == 2
    assert "deep.yaml nests its brackets too deep to read" in capsys.readouterr().err
    assert main(["fit", "optim.betas=" + "[" * 2000]) == 2
    assert "override optim.betas= nests its brackets too deep to read" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("run.dir={tmp}/" + "x" * 300, "run.dir gives a folder name of 300 bytes"),
        ("run.dir={tmp}/" + "x/" * 2100, "run.dir is "),
        ("run.name=" + "x" * 250, "run.name gives a folder name of 268 bytes with the time stamp"),
        ("run.root={tmp}/" + "é" * 200, "run.root gives a folder name of 400 bytes"),
    ],
)
def test_a_run_folder_name_the_file_system_refuses_is_one_line(tmp_path, capsys, override, message):
    assert main(["fit", "--config", "vit/digits", override.format(tmp=tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0] and "a file system takes at most" in err[0]
    assert list(tmp_path.iterdir()) == []
