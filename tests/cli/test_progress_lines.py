"""Every command that can run for minutes says what it is doing and how far it is: a tqdm bar on a terminal, one line
per stage on standard error otherwise (a log file, a pipe, these tests), as ``vitlab fit`` does."""

from __future__ import annotations

import pytest

from run_fixtures import make_run
from vitlab import progress
from vitlab.cli.main import main


def test_off_a_terminal_each_stage_is_one_line_and_on_one_a_bar(capsys, monkeypatch):
    assert list(progress.progress(["a", "b"], "vitlab x: step", name=str.upper)) == ["a", "b"]
    assert capsys.readouterr().err.splitlines() == ["vitlab x: step 1/2: A", "vitlab x: step 2/2: B"]
    monkeypatch.setattr(progress, "on_terminal", lambda: True)
    assert list(progress.progress(range(3), "vitlab x: step")) == [0, 1, 2]
    err = capsys.readouterr().err
    assert "vitlab x: step:   0%" in err and "0/3" in err and "\r" in err  # tqdm redraws one line


def test_bench_names_its_stages_and_counts_its_rounds(capsys):
    argv = ["bench", "vit_pico", "img_size=8", "patch_size=4", "in_chans=1", "--batch-size", "2", "--repeats", "2"]
    assert (
        main([*argv, "--warmup", "1", "--sample-seconds", "0.01", "--matmul-size", "32", "trainer.precision=32-true"])
        == 0
    )
    lines = capsys.readouterr().err.splitlines()
    for expected in (
        "vitlab bench: peak memory of ours",
        "vitlab bench: building ours and counting their FLOPs",
        "vitlab bench: warm-up 1/3: matmul 32-true",
        "vitlab bench: warm-up 3/3: ours inference",
        "vitlab bench: timing round 1/2",
        "vitlab bench: timing round 2/2",
    ):
        assert expected in lines, lines


@pytest.mark.parametrize("tta", [[], ["--tta-views", "2"]], ids=["plain", "tta"])
def test_evaluate_counts_the_batches_of_each_pass(tmp_path, capsys, tta):
    run = make_run(tmp_path, batch_size=64)
    assert main(["evaluate", str(run), "--no-corruptions", "--out", str(tmp_path / "e"), *tta]) == 0
    lines = capsys.readouterr().err.splitlines()
    assert "vitlab evaluate: validation batch 1/3" in lines, lines
    assert [line for line in lines if line.startswith("vitlab evaluate: test set batch")] == [
        f"vitlab evaluate: test set batch {k}/6" for k in range(1, 7)
    ]
