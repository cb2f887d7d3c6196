"""Each refusal names the problem and the fix in one line, and says no more than is true (no "full traceback" hint
where nothing was cut short)."""

from __future__ import annotations

import json

import pytest

import vitlab
from run_fixtures import make_run
from vitlab import manifest
from vitlab.atomic import atomic_write_text
from vitlab.cli.main import main
from vitlab.errors import CheckpointError, RunDirError
from vitlab.rundir import RunDir


def _err(capsys, *argv: str) -> tuple[int, list[str]]:
    rc = main(list(argv))
    return rc, capsys.readouterr().err.splitlines()


def test_the_traceback_hint_follows_only_an_error_that_cut_one_short(tmp_path, capsys):
    rc, lines = _err(capsys, "fit", "--config", "vit/digits", "data.batch_size=0")
    assert rc == 2 and lines == ["vitlab fit: error: data.batch_size must be >= 1, got 0"]
    (tmp_path / "truncated.ckpt").write_bytes(b"PK\x03\x04 cut")
    rc, lines = _err(capsys, "test", str(tmp_path / "truncated.ckpt"))
    assert rc == 2 and len(lines) == 2 and "cannot be read" in lines[0]
    assert lines[1] == "(set VITLAB_DEBUG=1 for the full traceback)", "torch's own error is behind this one"


def test_resuming_a_run_that_lost_its_config_says_how_to_go_on(tmp_path, capsys):
    run = tmp_path / "run"
    manifest.start(run, note=False)
    atomic_write_text(run / "checkpoints" / "last.ckpt", "weights")
    rc, lines = _err(capsys, "fit", "--resume", str(run))
    assert rc == 2 and lines == [
        f"vitlab fit: error: --resume {run}: the run directory {run} has lost its config.yaml, which the run, its "
        f"report and evaluation read; put it back, or start a new run from the weights with "
        f"model.pretrained={run / 'checkpoints' / 'last.ckpt'}"
    ]


def test_a_run_whose_manifest_was_deleted_is_refused_with_the_way_forward(tmp_path):
    run = tmp_path / "run"
    for name in ("config.yaml", "metrics.jsonl", "checkpoints/last.ckpt"):
        atomic_write_text(run / name, "x")
    with pytest.raises(RunDirError) as refused:
        RunDir(run).take_for_new_run(overwrite=True)
    assert "holds a run (config.yaml, metrics.jsonl or checkpoints/) but no run manifest" in str(refused.value)
    assert "delete the folder yourself if nothing in it is yours" in str(refused.value)
    assert sorted(p.name for p in run.iterdir()) == ["checkpoints", "config.yaml", "metrics.jsonl"]


def test_an_export_whose_config_was_edited_is_one_line_that_says_so(tmp_path):
    run = make_run(tmp_path)
    config = run / "export" / "config.json"
    meta = json.loads(config.read_text())
    meta["kwargs"]["num_classes"] = 5
    config.write_text(json.dumps(meta))
    with pytest.raises(CheckpointError) as refused:
        vitlab.load_model(run)
    message = str(refused.value)
    assert "\n" not in message and "corrupt" not in message
    assert "does not fit the model config.json describes (size mismatch for head.weight" in message
    assert "config.json was edited, or the two files come from different exports" in message
