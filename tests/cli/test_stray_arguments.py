"""A word on the command line is what it is: a stray argument is named as one (not as a config override), a run
given beside ``--model`` is named as the real problem, and a second export into a folder another export holds
names that process."""

from __future__ import annotations

import os
import socket

import pytest

from run_fixtures import make_run, write_checkpoint, write_png
from vitlab.cli.main import main


@pytest.mark.parametrize(
    ("argv", "stray"),
    [
        (["test", "{run}", "{run}"], "{run}"),
        (["fit", "--config", "vit/digits", "--trainer.max_epochs", "2", "digits"], "digits"),
    ],
)
def test_a_stray_argument_is_named_as_one_not_as_an_override(tmp_path, capsys, argv, stray):
    run = make_run(tmp_path)
    assert main([a.format(run=run) for a in argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"error: unexpected argument {stray.format(run=run)!r} (usage: vitlab " in err[0]
    assert "override" in err[0] and "cannot read override" not in err[0]


def test_a_run_beside_model_is_named_as_the_problem(tmp_path, capsys):
    run, image = make_run(tmp_path), tmp_path / "img.png"
    write_png(image)
    argv = ["explain", str(run), "--model", "timm:deit_tiny_patch16_224", str(image), "--method", "attention"]
    assert main([*argv, "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        f"vitlab explain: error: {run} holds a model of its own and --model timm:deit_tiny_patch16_224 names another; "
        "pass the run alone (vitlab explain RUN IMAGES ...) or --model alone (vitlab explain --model timm:NAME "
        "IMAGES ...)"
    ]
    assert not (tmp_path / "o").exists()


def test_a_second_export_into_the_same_folder_at_once_names_the_process(tmp_path, capsys):
    run = make_run(tmp_path)
    write_checkpoint(run)
    out, lock = tmp_path / "exported", tmp_path / ".exported.export.lock"
    lock.write_text(f"{os.getpid()} {socket.gethostname()}\n")  # a live export holds the folder
    assert main(["export", str(run), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        f"vitlab export: error: export folder {out} is being written by vitlab process {os.getpid()} on "
        f"{socket.gethostname()}; wait for it to finish, or choose another --out (if no such process runs, delete "
        f"{lock})"
    ]
    assert not out.exists(), "nothing written beside a live lock"
    lock.unlink()
    assert main(["export", str(run), "--out", str(out)]) == 0
    assert sorted(p.name for p in out.iterdir()) == [".vitlab-manifest.jsonl", "config.json", "model.safetensors"]
    assert not lock.exists()
