"""The run directory's owner (``vitlab.rundir``): where the model is, the JSON-lines reader, the final metrics in
one schema, the config with overrides, atomic writes and the environment record."""

import json
import os
import shutil

import pytest
import torch

import vitlab
from run_fixtures import make_run, write_checkpoint
from vitlab.errors import CheckpointError, ConfigError
from vitlab.evaluation import evaluate_run
from vitlab.rundir import (
    RunDir,
    atomic_write_text,
    environment,
    locate_checkpoint,
    locate_model,
    read_jsonl,
)


# -------------------------------------------------------------------------------------------------------------------
def test_locate_model_in_each_kind_of_folder(tmp_path):
    run = make_run(tmp_path)
    write_checkpoint(run, "best.ckpt")
    write_checkpoint(run, "last.ckpt")
    assert locate_model(run) == locate_model(run / "export")
    assert (locate_model(run).source, locate_model(run).run_dir) == (run / "export", run)
    assert locate_model(run / "checkpoints" / "last.ckpt").run_dir == run
    lone = tmp_path / "lone-export"
    shutil.copytree(run / "export", lone)
    assert (locate_model(lone).source, locate_model(lone).run_dir) == (lone, None)

    shutil.rmtree(run / "export")  # a copy of a run without export/: best.ckpt, then last.ckpt
    assert locate_model(run).source == run / "checkpoints" / "best.ckpt"
    (run / "checkpoints" / "best.ckpt").unlink()
    assert locate_model(run).source == run / "checkpoints" / "last.ckpt"
    assert locate_checkpoint(run) == run / "checkpoints" / "last.ckpt"
    (run / "checkpoints" / "last.ckpt").unlink()
    with pytest.raises(CheckpointError, match="holds no export/ folder and no checkpoint"):
        locate_model(run)
    with pytest.raises(CheckpointError, match="has no checkpoints/best.ckpt or checkpoints/last.ckpt"):
        locate_checkpoint(run)
    with pytest.raises(ConfigError, match="does not exist"):
        locate_model(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="neither a run directory"):
        locate_model(tmp_path / "empty")


def test_load_model_of_a_run_copied_without_export_matches_evaluate(tmp_path):
    """The bug this module fixed: `vitlab evaluate` found best.ckpt but `vitlab.load_model(run_dir)` failed."""
    run = make_run(tmp_path)
    model = write_checkpoint(run)
    shutil.rmtree(run / "export")
    loaded = vitlab.load_model(run)
    x = torch.randn(2, 1, 8, 8)
    torch.testing.assert_close(loaded(x), model.eval()(x))
    results = evaluate_run(run, max_batches=1, tta_views=0, corruptions=False)
    assert results["run"]["source"] == str(run / "checkpoints" / "best.ckpt")


# -------------------------------------------------------------------------------------------------------------------
def test_read_jsonl_merges_lines_of_a_key_and_skips_a_partial_last_line(tmp_path):
    path = tmp_path / "metrics.jsonl"
    assert read_jsonl(path, "epoch") == []
    lines = [{"epoch": 1, "a": 1}, {"epoch": 0, "a": 0}, {"epoch": 1, "b": 2}, {"epoch": 1, "a": 3}]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines) + '{"epoch": 2, "a"')
    assert read_jsonl(path, "epoch") == [{"epoch": 0, "a": 0}, {"epoch": 1, "a": 3, "b": 2}]
    assert read_jsonl(path) == lines
    path.write_text('{"epoch": 0}\n{broken\n{"epoch": 1}\n')
    with pytest.raises(ConfigError, match="line 2, is not valid JSON"):
        read_jsonl(path, "epoch")


def test_final_metrics_in_one_schema(tmp_path):
    run_dir = make_run(tmp_path, export=False, test_metrics={"test/acc": 0.75, "test/loss": 0.5, "epoch": 3})
    run = RunDir(run_dir)
    run.write_json("timing.json", {"time/step_total_s": 12.5, "epochs": 3})
    evaluation = {
        "run": {"seed": 0, "source": "x"},
        "test": {"top1": 0.7, "nll": float("nan")},
        "test_calibrated": {"temperature": 1.5, "ece": 0.02},
        "mean_corrupted": 0.4,
        "corruptions": {"contrast": {"by_severity": {"1": 0.5}, "mean": 0.5}},
        "per_class": [{"accuracy": 0.5}],
        "tta": None,
    }
    run.write_json("evaluation/evaluation.json", evaluation)
    run.write_json("generate/metrics.json", {"reconstruction/psnr": 21.5})
    assert run.final_metrics() == {
        "test/acc": 0.75,
        "test/loss": 0.5,
        "epoch": 3.0,
        "time/step_total_s": 12.5,
        "eval/test/top1": 0.7,
        "eval/test_calibrated/temperature": 1.5,
        "eval/test_calibrated/ece": 0.02,
        "eval/corruptions/contrast/by_severity/1": 0.5,
        "eval/corruptions/contrast/mean": 0.5,
        "eval/mean_corrupted": 0.4,
        "generate/reconstruction/psnr": 21.5,
    }
    assert RunDir(make_run(tmp_path, "bare", export=False)).final_metrics() == {}


def test_config_with_overrides_and_errors(tmp_path):
    run = RunDir(make_run(tmp_path, export=False, lr=5e-4))
    assert run.config().optim.lr == 5e-4
    cfg = run.config(["optim.lr=1e-2", "data.batch_size=8"])
    assert (cfg.optim.lr, cfg.data.batch_size, cfg.data.name) == (1e-2, 8, "digits")
    assert run.config({"optim": {"lr": 0.5}}).optim.lr == 0.5
    with pytest.raises(ConfigError, match="unknown config key 'optim.learning_rate'"):
        run.config(["optim.learning_rate=1"])
    with pytest.raises(ConfigError, match="not a run directory"):
        RunDir(tmp_path).config()
    assert RunDir(tmp_path).json("env.json") is None and RunDir(tmp_path).metrics() == []


def test_atomic_write_and_environment(tmp_path):
    target = tmp_path / "sub" / "file.txt"
    atomic_write_text(target, "one")
    atomic_write_text(target, "two")
    assert target.read_text() == "two" and os.listdir(target.parent) == ["file.txt"]
    umask = os.umask(0)
    os.umask(umask)
    assert target.stat().st_mode & 0o777 == 0o666 & ~umask

    env = environment()
    assert env["versions"]["vitlab"] == vitlab.__version__ and env["versions"]["torch"] == torch.__version__
    assert {"revision", "dirty"} <= set(env["git"]) and env["hardware"]["cpu_count"] == os.cpu_count()
