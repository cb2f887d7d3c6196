"""Nothing lost, nothing silently wrong for a new user: exports that keep files, diverging runs, NaN in metrics,
hidden folders, gray images, reused run folders, truncated images, one-line errors; each test fails on code
without the behaviour it names."""

from __future__ import annotations

import json
import math
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

import vitlab
from data_fixtures import write_imagefolder, write_mnist, write_png
from run_fixtures import TINY
from vitlab.atomic import atomic_write_json
from vitlab.cli.main import main
from vitlab.config import DataConfig, build_config
from vitlab.data import DataError, build_datamodule
from vitlab.export import ExportError, export_model
from vitlab.jsonio import strict_dumps
from vitlab.manifest import MANIFEST_FILE
from vitlab.rundir import RunDir
from vitlab.training.callbacks import JSONLinesLogger
from vitlab.training.run import fit


def _strict_json(text: str):
    """Parse as a strict parser would: NaN / Infinity tokens are an error."""

    def refuse(token):
        raise ValueError(f"non-standard JSON token {token}")

    return json.loads(text, parse_constant=refuse)


def _cli(capsys, *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    captured = capsys.readouterr()
    return rc, captured.out, captured.err


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    """One tiny trained run, shared by the tests that only read it."""
    run_dir = tmp_path_factory.mktemp("trained") / "run"
    assert main(["fit", "--config", "vit/digits", f"run.dir={run_dir}", "trainer.max_epochs=1", *TINY]) == 0
    return run_dir


# -- 1. export never deletes a user's files -------------------------------------------------------------------------
def test_export_refuses_a_folder_with_files_and_keeps_them(trained, tmp_path, capsys):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("my notes")
    rc, _, err = _cli(capsys, "export", str(trained / "checkpoints" / "best.ckpt"), "--out", str(out))
    assert rc == 2 and "not empty" in err and "--force" in err and "Traceback" not in err
    assert (out / "notes.txt").read_text() == "my notes" and sorted(p.name for p in out.iterdir()) == ["notes.txt"]
    # --force writes the export's own files beside the user's and leaves those alone
    rc, _, _ = _cli(capsys, "export", str(trained / "checkpoints" / "best.ckpt"), "--out", str(out), "--force")
    assert rc == 0 and (out / "notes.txt").read_text() == "my notes"
    assert sorted(p.name for p in out.iterdir()) == [MANIFEST_FILE, "config.json", "model.safetensors", "notes.txt"]
    x = torch.randn(2, 1, 8, 8)
    torch.testing.assert_close(vitlab.load_model(out)(x), vitlab.load_model(trained / "export")(x))


def test_export_to_the_current_folder(trained, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "keep.py").write_text("print('mine')")
    rc, _, err = _cli(capsys, "export", str(trained), "--out", ".")
    assert rc == 2 and "not empty" in err
    assert (tmp_path / "keep.py").exists()
    rc, _, _ = _cli(capsys, "export", str(trained), "--out", ".", "--force")
    assert rc == 0 and (tmp_path / "keep.py").exists() and (tmp_path / "model.safetensors").is_file()
    empty = tmp_path / "empty"
    empty.mkdir()
    rc, _, _ = _cli(capsys, "export", str(trained), "--out", str(empty))
    assert rc == 0 and (empty / "config.json").is_file(), "an empty folder is a fine target"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".") and p.name != MANIFEST_FILE], "staging left"


# -- 2. a non-finite loss stops the run; metrics files are strict JSON ----------------------------------------------
def test_a_diverging_run_stops_with_a_hint_and_exports_nothing(tmp_path, capsys):
    run_dir = tmp_path / "run"
    rc, _, err = _cli(capsys, "fit", "--config", "vit/digits", "optim.lr=1e3", f"run.dir={run_dir}", *TINY)
    assert rc == 2 and "Traceback" not in err
    line = err.splitlines()[0]
    assert re.search(r"training loss is nan at epoch \d+, step \d+: the run diverged", line), line
    assert "optim.lr (now 1000)" in line and "optim.grad_clip" in line
    assert not (run_dir / "export").exists() and not (run_dir / "test_metrics.json").exists()


def test_metrics_files_write_nan_as_null(tmp_path):
    logger = JSONLinesLogger(tmp_path / "metrics.jsonl")
    logger.log_metrics({"epoch": 0, "val/loss": float("nan"), "train_step/loss": float("inf")}, step=3)
    logger.finalize("success")
    for name in ("metrics.jsonl", "steps.jsonl"):
        records = [_strict_json(line) for line in (tmp_path / name).read_text().splitlines()]
        assert records and all(None in record.values() for record in records), name
    assert _strict_json(strict_dumps({"a": [1.0, math.nan], "b": {"c": -math.inf}})) == {
        "a": [1.0, None],
        "b": {"c": None},
    }


# -- 3. hidden files and folders are not data -----------------------------------------------------------------------
def test_hidden_folders_are_neither_classes_nor_images(tmp_path):
    write_imagefolder(tmp_path / "pets", {"": 4}, classes=("airplane", "cat", "dog"))
    write_png(tmp_path / "pets" / ".ipynb_checkpoints" / "0.png", np.zeros((10, 12, 3), np.uint8))
    write_png(tmp_path / "pets" / "airplane" / ".thumbs" / "0.png", np.zeros((10, 12, 3), np.uint8))
    (tmp_path / "pets" / "cat" / ".DS_Store").write_bytes(b"\0\0")
    dm = build_datamodule(DataConfig(name="imagefolder", path=str(tmp_path / "pets")))
    dm.setup()
    assert dm.num_classes == 3 and dm.class_names == ["airplane", "cat", "dog"]
    paths = {str(p) for split in (dm.train_set, dm.val_set, dm.test_set) for p in split.pool.paths}
    assert len(paths) == 12 and not any("/." in p for p in paths)


# -- 4. the channels are those of most images (or the config's), and every image is converted -----------------------
def test_one_gray_image_does_not_decide_the_channels(tmp_path):
    write_imagefolder(tmp_path / "rgb", {"": 4}, classes=("a", "b"))
    write_png(tmp_path / "rgb" / "a" / "0.png", np.full((10, 12), 7, np.uint8))  # sorts first, gray
    dm = build_datamodule(DataConfig(name="imagefolder", path=str(tmp_path / "rgb")))
    dm.setup()
    assert dm.in_chans == 3
    images = [dm.train_set.pool[i][0] for i in range(len(dm.train_set.pool))]
    assert {tuple(image.shape) for image in images} == {(3, 10, 10)}
    gray = build_datamodule(DataConfig(name="imagefolder", path=str(tmp_path / "rgb"), in_chans=1))
    gray.setup()
    assert gray.in_chans == 1 and gray.train_set.pool[0][0].shape == (1, 10, 10)
    with pytest.raises(DataError, match="in_chans"):
        build_datamodule(DataConfig(name="digits", in_chans=3))


# -- 5. a run directory that holds a run is refused -----------------------------------------------------------------
def test_reusing_a_run_directory_is_refused_unless_overwrite(tmp_path, capsys):
    run_dir = tmp_path / "run"
    args = ["fit", "--config", "vit/digits", f"run.dir={run_dir}", "trainer.max_epochs=1", *TINY, "run.export=false"]
    assert main(args) == 0
    before = (run_dir / "metrics.jsonl").read_text()
    (run_dir / "my_notes.md").write_text("keep")
    rc, _, err = _cli(capsys, *args, "optim.lr=5e-4")
    assert rc == 2 and "already holds a run" in err and "--resume" in err and "run.overwrite=true" in err
    assert (run_dir / "metrics.jsonl").read_text() == before and "lr: 0.0005" not in (
        run_dir / "config.yaml"
    ).read_text()
    atomic_write_json(run_dir / "evaluation-tome_r=8" / "evaluation.json", {})  # `vitlab evaluate --model tome_r=8`
    assert main([*args, "optim.lr=5e-4", "run.overwrite=true"]) == 0
    assert not (run_dir / "evaluation-tome_r=8").exists(), "the old run's evaluation would describe the new run"
    assert len((run_dir / "metrics.jsonl").read_text().splitlines()) == 1, "the old run's lines were kept"
    assert "lr: 0.0005" in (run_dir / "config.yaml").read_text() and (run_dir / "my_notes.md").read_text() == "keep"


def _tree(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_a_run_dir_holding_a_users_files_is_refused_and_left_alone(tmp_path, capsys):
    mine = tmp_path / "mine"
    (mine / "export").mkdir(parents=True)
    (mine / "report.html").write_text("my report")
    (mine / "export" / "model.onnx").write_bytes(b"my model")
    before = _tree(mine)
    for extra in ([], ["run.overwrite=true"]):
        rc, _, err = _cli(capsys, "fit", "--config", "vit/digits", f"run.dir={mine}", *TINY, *extra)
        assert rc == 2 and "Traceback" not in err, err
        line = err.splitlines()[0]
        assert "files vitlab did not write" in line and "report.html" in line and "new or empty run.dir" in line
        assert _tree(mine) == before and sorted(p.name for p in mine.iterdir()) == ["export", "report.html"]
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["fit", "--config", "vit/digits", f"run.dir={empty}", "trainer.max_epochs=1", *TINY]) == 0


def test_a_users_config_yaml_is_not_called_a_run_and_overwrite_keeps_the_users_files(tmp_path, capsys):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "config.yaml").write_text("my: settings\n")
    rc, _, err = _cli(capsys, "fit", "--config", "vit/digits", f"run.dir={mine}", *TINY, "run.overwrite=true")
    assert rc == 2 and "files vitlab did not write" in err and "already holds a run" not in err, err
    assert [p.name for p in mine.iterdir()] == ["config.yaml"]
    assert (mine / "config.yaml").read_text() == "my: settings\n"

    run_dir = tmp_path / "run"
    args = ["fit", "--config", "vit/digits", f"run.dir={run_dir}", "trainer.max_epochs=1", *TINY, "run.export=false"]
    assert main(args) == 0
    atomic_write_json(run_dir / "evaluation" / "evaluation.json", {})  # what `vitlab evaluate` wrote for this run
    users = [run_dir / "checkpoints" / "notes.txt", run_dir / "tb" / "notes.txt", run_dir / "evaluation" / "mine.csv"]
    for path in users:
        path.write_text("mine")
    old_events = set((run_dir / "tb").glob("events.out.tfevents.*"))
    assert main([*args, "run.overwrite=true"]) == 0
    assert all(path.read_text() == "mine" for path in users)
    assert not (run_dir / "evaluation" / "evaluation.json").exists(), "the old run's evaluation was kept"
    assert not old_events & set((run_dir / "tb").glob("events.out.tfevents.*")), "the old run's events were kept"
    (run_dir / "export").mkdir()
    (run_dir / "export" / "config.json").write_text("{}")  # a user's file where the next run would write its own
    rc, _, err = _cli(capsys, *args, "run.overwrite=true")
    assert rc == 2 and "holds export/config.json, which vitlab did not write" in err, err
    assert (run_dir / "export" / "config.json").read_text() == "{}" and (run_dir / "metrics.jsonl").exists()


# -- 6. an unreadable image is named and skipped (or an error under strict_images) ----------------------------------
def test_a_truncated_image_is_named_and_skipped(tmp_path, capsys):
    write_imagefolder(tmp_path / "pets", {"": 5})
    bad = tmp_path / "pets" / "dog" / "3.png"
    bad.write_bytes(bad.read_bytes()[:40])
    dm = build_datamodule(DataConfig(name="imagefolder", path=str(tmp_path / "pets")))
    dm.setup()
    err = capsys.readouterr().err
    assert "skipped 1 unreadable image of 10" in err and str(bad) in err
    assert all(str(p) != str(bad) for p in dm.train_set.pool.paths) and len(dm.train_set.pool) == 9
    with pytest.raises(DataError, match=rf"cannot read image {bad}"):
        build_datamodule(DataConfig(name="imagefolder", path=str(tmp_path / "pets"), strict_images=True))


# -- 7. no traceback for user errors ---------------------------------------------------------------------------------
def test_dynamics_on_a_run_without_dynamics_is_one_line(trained, capsys):
    rc, _, err = _cli(capsys, "dynamics", str(trained))
    assert rc == 2 and "without the dynamics controller" in err and "Traceback" not in err


def test_an_unwritable_run_root_is_one_line(tmp_path, monkeypatch, capsys):
    locked = tmp_path / "locked"
    locked.mkdir()
    if os.geteuid() == 0:  # root writes anywhere: answer as the file system answers other users
        real_mkdir = Path.mkdir

        def mkdir(self, *args, **kwargs):
            if locked in self.parents:
                raise PermissionError(13, "Permission denied", str(self))
            return real_mkdir(self, *args, **kwargs)

        monkeypatch.setattr(Path, "mkdir", mkdir)
    else:
        locked.chmod(0o555)
    rc, _, err = _cli(capsys, "fit", "--config", "vit/digits", f"run.root={locked}", *TINY)
    assert rc == 2 and "Traceback" not in err
    assert f"cannot create run directory {locked}" in err and "run.root=" in err


def test_a_read_only_dataset_folder_unpacks_into_the_cache(tmp_path, monkeypatch):
    write_mnist(tmp_path, "FashionMNIST", n_train=20, n_test=10, gz=True)
    raw = tmp_path / "FashionMNIST" / "raw"
    before = sorted(p.name for p in raw.iterdir())
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda path, mode: False if Path(path) == raw else real_access(path, mode))
    monkeypatch.setenv("VITLAB_CACHE", str(tmp_path / "cache"))
    dm = build_datamodule(DataConfig(name="fashion-mnist", root=str(tmp_path)))
    dm.setup()
    assert len(dm.test_set) == 10 and sorted(p.name for p in raw.iterdir()) == before, "wrote into the data folder"
    assert len(list((tmp_path / "cache").rglob("*-ubyte"))) == 4


# -- 8. fashion-mnist honours data.path, and its error says how to fix it --------------------------------------------
def test_fashion_mnist_reads_data_path(tmp_path):
    arrays = write_mnist(tmp_path / "mine", "", n_train=20, n_test=10)  # the IDX files directly in mine/raw
    dm = build_datamodule(DataConfig(name="fashion-mnist", path=str(tmp_path / "mine" / "raw")))
    dm.setup()
    assert len(dm.test_set) == 10 and torch.equal(dm.test_set.pool.images[:, 0], torch.from_numpy(arrays["x_test"]))
    with pytest.raises(DataError) as error:
        build_datamodule(DataConfig(name="fashion-mnist", root=str(tmp_path / "nothing"))).setup()
    message = str(error.value)
    assert "data.path=" in message and "prepare_data" not in message and "FashionMNIST/raw" in message


# -- 9. config.yaml stores absolute data paths ----------------------------------------------------------------------
def test_relative_data_paths_are_stored_absolute(tmp_path, monkeypatch):
    work = tmp_path / "work"
    write_imagefolder(work / "pets", {"": 5}, size=(8, 8), gray=True)
    monkeypatch.chdir(work)
    cfg = build_config("vit/digits", ["data.name=imagefolder", "data.path=pets", "run.dir=run", *TINY])
    cfg.trainer.max_epochs = 1
    run_dir = fit(cfg)
    stored = RunDir(work / "run").config()
    assert Path(stored.data.path) == work / "pets" and Path(stored.data.root).is_absolute()
    monkeypatch.chdir(tmp_path)  # from elsewhere, the run's own config still finds the data
    assert len(build_datamodule(RunDir(work / run_dir).config().data).test_dataloader().dataset) == 2


# -- 10. resume, truncated checkpoints and Ctrl+C say what happened and what to do ----------------------------------
def test_resume_of_a_missing_run_names_it(capsys):
    rc, _, err = _cli(capsys, "fit", "--resume", "runs/nope")
    assert rc == 2 and "runs/nope" in err and " . " not in err


def test_truncated_checkpoint_message_is_whole(trained, tmp_path, capsys):
    bad = tmp_path / "bad.ckpt"
    data = (trained / "checkpoints" / "last.ckpt").read_bytes()
    bad.write_bytes(data[: len(data) // 3])
    rc, _, err = _cli(capsys, "export", str(bad))
    line = err.splitlines()[0]
    assert rc == 2 and line.endswith("or train again") and "corrupt, truncated or not a checkpoint" in line
    assert "high likelihood that your checkpoint file is)" not in line


def test_resume_of_a_copied_run_continues_the_copy_and_leaves_the_original_alone(tmp_path, capsys):
    import shutil

    original, copy = tmp_path / "run", tmp_path / "copy"
    assert main(["fit", "--config", "vit/digits", f"run.dir={original}", "trainer.max_epochs=1", *TINY]) == 0
    shutil.copytree(original, copy)
    before = (original / "metrics.jsonl").read_bytes()
    assert main(["fit", "--resume", str(copy), "trainer.max_epochs=2"]) == 0
    assert (original / "metrics.jsonl").read_bytes() == before  # config.yaml's run.dir still names the original
    assert [m["epoch"] for m in RunDir(copy).metrics() if "val/loss" in m][-1] == 1  # epochs count from 0


@pytest.mark.slow  # fits in subprocesses
def test_ctrl_c_exits_130_and_says_how_to_resume(tmp_path):
    run_dir = tmp_path / "run"
    cmd = [sys.executable, "-m", "vitlab.cli.main", "fit", "--config", "vit/digits", f"run.dir={run_dir}"]
    cmd += ["trainer.max_epochs=200", *TINY]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    # SIGINT back to its default in the child: a test run started in the background by a shell without job control
    # (`cmd &` in a script, as some CI runners do) ignores SIGINT, the child inherits that, and Python then installs
    # no KeyboardInterrupt handler, so the run would simply finish (seen in a CI simulation: exit code 0)
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    while proc.poll() is None and not (run_dir / "checkpoints" / "last.ckpt").exists():  # training, however slowly
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate()
    assert proc.returncode == 130, err
    assert f"vitlab fit --resume {run_dir}" in err and "Traceback" not in err


# -- 11. exports are readable by other users (umask permitting) -----------------------------------------------------
def test_exported_files_follow_the_umask(tmp_path):
    old = os.umask(0o022)
    try:
        model = vitlab.create_model("vit_pico", img_size=8, in_chans=1, num_classes=10)
        out = export_model(model, tmp_path / "export")
    finally:
        os.umask(old)
    assert out.stat().st_mode & 0o777 == 0o755
    assert {(out / name).stat().st_mode & 0o777 for name in ("model.safetensors", "config.json")} == {0o644}
    with pytest.raises(ExportError):
        export_model(model, out)


# -- 12. logs to a file read one line per epoch, with no noise ------------------------------------------------------
def test_piped_log_is_one_line_per_epoch(tmp_path, capfd):
    run_dir = tmp_path / "run"
    assert main(["fit", "--config", "vit/digits", f"run.dir={run_dir}", "trainer.max_epochs=3", *TINY[1:]]) == 0
    out, err = capfd.readouterr()
    log = out + err
    epochs = [line for line in out.splitlines() if line.startswith("epoch ")]
    assert [line.split()[1] for line in epochs] == ["1/3", "2/3", "3/3"] and all("val/loss" in e for e in epochs)
    for noise in ("\r", "v_num", "Tip", "Total Flops", "LeafSpec", "Sanity Checking"):
        assert noise not in log, noise


def test_generate_reports_its_progress(tmp_path, capsys):
    run_dir = tmp_path / "run"
    args = ["fit", "--config", "vitcae/digits", f"run.dir={run_dir}", "trainer.max_epochs=1", *TINY[:-2]]
    assert main([*args, "run.report=false"]) == 0
    out = capsys.readouterr().out
    stages = [line for line in out.splitlines() if line.startswith("generate: ") and " done in " in line]
    assert len(stages) == 8 and "training the CNN judge done in" in out


# -- 13. --print-config resolves every default; per-step loss and lr reach TensorBoard, steps.jsonl, the report -----
def test_print_config_shows_the_resolved_model(capsys):
    rc, out, _ = _cli(capsys, "fit", "--config", "vit/digits", "--print-config")
    import yaml

    model = yaml.safe_load(out)["model"]
    assert rc == 0 and {"embed_dim", "depth", "num_heads", "img_size", "in_chans", "num_classes"} <= set(model)
    assert (model["img_size"], model["in_chans"], model["num_classes"]) == (8, 1, 10)


def test_per_step_loss_and_lr_are_logged(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from vitlab.report.curves import add_step_series, curve_panels
    from vitlab.report.record import RunRecord

    run_dir = tmp_path / "run"
    args = ["fit", "--config", "vit/digits", f"run.dir={run_dir}", "trainer.max_epochs=2", *TINY]
    assert main([*args, "trainer.log_every_n_steps=2", "optim.warmup_epochs=1"]) == 0
    steps = RunDir(run_dir).steps()
    assert [s["step"] for s in steps] == [1, 3, 5, 7]  # 4 steps an epoch, every second one logged
    assert all(s["loss"] > 0 for s in steps) and steps[0]["lr"] < steps[2]["lr"], "the warm-up is visible per step"
    events = EventAccumulator(str(run_dir / "tb")).Reload()
    assert {"train_step/loss", "train_step/lr"} <= set(events.Tags()["scalars"])
    record = RunRecord.load(run_dir)
    panels = add_step_series(curve_panels(record.metrics), record.steps, record.metrics)
    assert len(panels["loss"]["train (per step)"][0]) == 4 and len(panels["learning rate"]["lr (per step)"][0]) == 4
