"""What ``vitlab fit --resume`` may change (docs/rundir.md, "Resume"): the keys it honours take effect and are said
in one line and written to the run's ``config.yaml``; any other change, given as an override or edited into
``config.yaml``, is refused before a file changes, naming the key and the command for a new run from the weights;
the warning of a schedule the resume outlasts names the rates the run will train at."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest

from run_fixtures import TINY
from vitlab.cli.main import main
from vitlab.config import build_config
from vitlab.export import read_checkpoint
from vitlab.rundir import RESUMES_FILE, RunDir
from vitlab.training.resume import honoured, schedule_note


def _cli(capsys, *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    captured = capsys.readouterr()
    return rc, captured.out, captured.err


def _digests(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha1(p.read_bytes()).hexdigest() for p in folder.rglob("*") if p.is_file()
    }


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    """One epoch of vit/digits, whose warm-up (2 epochs) the run stops inside."""
    run_dir = tmp_path_factory.mktemp("trained") / "run"
    args = ["fit", "--config", "vit/digits", f"run.dir={run_dir}", "trainer.max_epochs=1", *TINY]
    assert main([*args, "run.test=false", "run.export=false"]) == 0
    return run_dir


@pytest.fixture
def run(trained, tmp_path) -> Path:
    """A copy of the trained run for a test that resumes it."""
    return Path(shutil.copytree(trained, tmp_path / "run"))


def _edit_config(run: Path, old: str, new: str) -> None:
    text = (run / "config.yaml").read_text()
    assert old in text
    (run / "config.yaml").write_text(text.replace(old, new))


@pytest.mark.parametrize(
    ("override", "edit", "key"),
    [
        (["optim.lr=0.1"], None, "optim.lr"),
        ([], ("lr: 0.002", "lr: 0.01"), "optim.lr"),
        (["data.batch_size=16"], None, "data.batch_size"),
        (["dynamics.mode=fixed"], None, "dynamics (checkpoint none, now a section)"),
    ],
    ids=["lr-override", "lr-edited-in-config", "batch-size", "dynamics-added"],
)
def test_a_change_a_resume_cannot_honour_is_refused_before_any_file_changes(run, capsys, override, edit, key):
    if edit:
        _edit_config(run, *edit)
    before = _digests(run)
    rc, out, err = _cli(capsys, "fit", "--resume", str(run), *override)
    assert rc == 2 and "Traceback" not in err and "resuming from" not in out
    assert key in err and "nothing was written" in err
    assert f"model.pretrained={run}/checkpoints/last.ckpt" in err and "run.dir=NEW_FOLDER" in err
    assert _digests(run) == before


def test_an_emptied_config_is_refused_as_empty(run, capsys):
    (run / "config.yaml").write_text("")
    rc, _, err = _cli(capsys, "fit", "--resume", str(run))
    assert rc == 2 and "has an empty config.yaml" in err and "model.pretrained=" in err


def test_a_change_a_resume_honours_is_said_recorded_and_written_to_the_config(run, capsys):
    env = (run / "env.json").read_bytes()
    rc, out, _ = _cli(capsys, "fit", "--resume", str(run), "trainer.max_epochs=2", "optim.grad_clip=0.5")
    assert rc == 0
    assert "resume changes optim.grad_clip 1.0 -> 0.5, trainer.max_epochs 1 -> 2" in out.splitlines()
    assert RunDir(run).config().trainer.max_epochs == 2 and RunDir(run).config().optim.grad_clip == 0.5
    assert (run / "env.json").read_bytes() == env
    (record,) = [json.loads(line) for line in (run / RESUMES_FILE).read_text().splitlines()]
    assert record["changed"] == {"optim.grad_clip": [1.0, 0.5], "trainer.max_epochs": [1, 2]}
    assert read_checkpoint(RunDir(run).last_checkpoint)["hyper_parameters"]["config"]["trainer"]["max_epochs"] == 2

    # a later resume starts from what the run is now (its config.yaml says 2 epochs, not the first run's 1)
    rc, out, _ = _cli(capsys, "fit", "--resume", str(run), "trainer.max_epochs=3")
    assert rc == 0 and "resume changes trainer.max_epochs 2 -> 3" in out
    assert [m["epoch"] for m in RunDir(run).metrics()] == [0, 1, 2]


def test_a_resume_past_a_warm_up_the_first_run_stopped_inside_names_the_warm_up_rates(trained):
    """vit/digits warms up over 2 epochs (lr 0.002); the first run stopped after 1, where its schedule ends."""
    note = schedule_note(read_checkpoint(RunDir(trained).last_checkpoint), 3, trained)
    assert "inside its warm-up" in note and "epochs 2..3 go on with the warm-up" in note
    assert "up to 0.002" in note and "final rate (1e-06)" in note
    assert "train at its final rate" not in note  # what it said before: that epochs 2..3 train at 1e-06


def test_a_warm_up_longer_than_the_run_is_said(tmp_path, capsys):
    args = ["fit", "--config", "vit/digits", f"run.dir={tmp_path / 'run'}", "trainer.max_epochs=1", *TINY]
    rc, _, err = _cli(capsys, *args, "run.test=false", "run.export=false", "trainer.limit_train_batches=1")
    assert rc == 0
    assert "optim.warmup_epochs=2 is longer than trainer.max_epochs=1" in err and "never reaching optim.lr" in err


def test_a_resume_honours_the_dynamics_thresholds_and_not_the_keys_that_shape_its_measurements():
    cfg = build_config("vit/digits", ["dynamics.mode=fixed"])
    assert honoured("dynamics.decay_ratio", cfg) and honoured("dynamics.decay_window", cfg)
    assert not honoured("dynamics.probe_size", cfg) and not honoured("dynamics.target", cfg)
    assert honoured("trainer.max_epochs", cfg) and not honoured("optim.lr", cfg) and not honoured("model.depth", cfg)
