"""Training end to end: the vitlab command, run directories, exact resume, export, errors, DDP."""

import json
import os
import subprocess
import sys
from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch

import vitlab
from run_fixtures import TINY
from vitlab.cli.main import main
from vitlab.config import ConfigError, build_config
from vitlab.rundir import RunDir
from vitlab.training.run import fit


def _fit_cli(tmp_path: Path, *extra: str, config: str = "vit/digits") -> Path:
    run_dir = tmp_path / "run"
    rc = main(["fit", "--config", config, f"run.dir={run_dir}", "trainer.max_epochs=2", *TINY, *extra])
    assert rc == 0
    return run_dir


def test_cli_fit_writes_a_complete_run_directory(tmp_path, capsys):
    run_dir = _fit_cli(tmp_path, "run.report=true")
    out = capsys.readouterr().out
    assert f"run directory: {run_dir}" in out and "test: " in out
    for name in (
        "config.yaml",
        "env.json",
        "metrics.jsonl",
        "test_metrics.json",
        "checkpoints/last.ckpt",
        "checkpoints/best.ckpt",
        "export/model.safetensors",
        "export/config.json",
    ):
        assert (run_dir / name).is_file(), name
    assert list((run_dir / "tb").rglob("events.out.tfevents.*")), "TensorBoard events missing"
    rows = RunDir(run_dir).metrics()
    assert [r["epoch"] for r in rows] == [0, 1]
    assert {"train/loss", "train/lr", "val/loss", "val/acc"} <= set(rows[-1])
    for row in rows:  # StepTimer: backward inside the steps, the steps and the waits for data inside the epoch
        assert 0 < row["time/backward_s"] < row["time/step_s"] < row["time/epoch_s"], row
        assert 0 < row["time/data_wait_s"] < row["time/epoch_s"] - row["time/step_s"], row
    timing = json.loads((run_dir / "timing.json").read_text())
    assert timing["epochs"] == 2
    assert timing["time/backward_total_s"] == pytest.approx(sum(r["time/backward_s"] for r in rows), rel=1e-5)
    assert timing["time/epoch_total_s"] == pytest.approx(sum(r["time/epoch_s"] for r in rows), rel=1e-5)
    waits = sum(r["time/data_wait_s"] for r in rows)
    assert timing["time/data_wait_total_s"] == pytest.approx(waits, rel=1e-5)
    assert timing["data_wait_share"] == pytest.approx(waits / timing["time/epoch_total_s"], rel=1e-5)
    assert (run_dir / "report.html").stat().st_mode & 0o044, "the report must be readable by others (umask permitting)"
    env = json.loads((run_dir / "env.json").read_text())
    assert env["versions"]["torch"] == torch.__version__ and "git" in env
    assert not list(run_dir.rglob("*.tmp")), "temporary files left behind"


def test_exported_model_loads_offline_and_matches_the_checkpoint(tmp_path):
    run_dir = _fit_cli(tmp_path)
    ckpt = torch.load(run_dir / "checkpoints" / "best.ckpt", map_location="cpu", weights_only=True)
    exported = vitlab.load_model(run_dir / "export")
    from_ckpt = vitlab.load_model(run_dir / "checkpoints" / "best.ckpt")
    x = torch.randn(3, 1, 8, 8)
    torch.testing.assert_close(exported(x), from_ckpt(x))
    assert set(ckpt["hyper_parameters"]) == {"config", "model_kwargs", "data_info"}
    # the run directory itself is accepted too
    torch.testing.assert_close(vitlab.load_model(run_dir)(x), exported(x))


def test_cli_test_validate_export(tmp_path, capsys):
    run_dir = _fit_cli(tmp_path)
    capsys.readouterr()
    assert main(["test", str(run_dir), "trainer.enable_progress_bar=false"]) == 0
    assert "test/acc" in json.loads(capsys.readouterr().out)
    assert main(["validate", str(run_dir), "trainer.enable_progress_bar=false"]) == 0
    assert "val/acc" in json.loads(capsys.readouterr().out)
    out = tmp_path / "exp"
    assert main(["export", str(run_dir / "checkpoints" / "last.ckpt"), "--out", str(out)]) == 0
    assert (out / "model.safetensors").is_file()


class StopAfterFirstEpoch(pl.Callback):
    def on_train_epoch_end(self, trainer, pl_module):
        trainer.should_stop = True


def _weights(run_dir: Path) -> dict[str, torch.Tensor]:
    return torch.load(run_dir / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)["state_dict"]


@pytest.mark.parametrize("config", ["vit/digits", "vitcae/digits"])
def test_resume_gives_the_same_weights_as_an_uninterrupted_run(tmp_path, config):
    overrides = [
        *TINY,
        "trainer.max_epochs=3",
        "trainer.deterministic=true",
        "run.test=false",
        "run.export=false",
        "data.augment.random_crop=true",
        "model.drop_path_rate=0.1",
        "loss.warmup_epochs=1",
    ]
    if config.startswith("vit/"):
        overrides.remove("loss.warmup_epochs=1")
    full = fit(build_config(config, [*overrides, f"run.dir={tmp_path / 'full'}"]))
    part = fit(build_config(config, [*overrides, f"run.dir={tmp_path / 'part'}"]), callbacks=[StopAfterFirstEpoch()])
    assert torch.load(part / "checkpoints" / "last.ckpt", weights_only=True)["epoch"] == 0
    resumed = fit(build_config(config, [*overrides, f"run.dir={part}"]), resume=part)
    a, b = _weights(full), _weights(resumed)
    # the timing totals continue across the resume: three epochs, as many as the uninterrupted run
    assert json.loads((resumed / "timing.json").read_text())["epochs"] == 3
    assert json.loads((full / "timing.json").read_text())["epochs"] == 3
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), f"{key} differs after resume"


def test_a_resume_past_the_end_of_the_cosine_schedule_warns_and_names_a_new_run_from_its_weights(tmp_path, capsys):
    run_dir = tmp_path / "run"
    argv = ["fit", "--config", "vit/digits", *TINY, "optim.warmup_epochs=0", "run.test=false", "run.export=false"]
    assert main([*argv, "trainer.max_epochs=1", f"run.dir={run_dir}"]) == 0
    capsys.readouterr()
    assert main(["fit", "--resume", str(run_dir), "--trainer.max_epochs", "3", "run.report=false"]) == 0
    err = capsys.readouterr().err
    warnings = [line for line in err.splitlines() if "cosine schedule" in line]
    assert len(warnings) == 1, err
    assert "ended at epoch 1 and a resume keeps it: epochs 2..3 train at its final rate (1e-06)" in warnings[0]
    assert f"model.pretrained={run_dir} trainer.max_epochs=2 run.dir=NEW_FOLDER" in warnings[0]
    rates = [row["train/lr"] for row in RunDir(run_dir).metrics() if "train/lr" in row]
    assert rates[-1] == pytest.approx(1e-6)
    command = warnings[0].split("vitlab ", 1)[1].replace("NEW_FOLDER", str(tmp_path / "new")).split()
    assert main([*command, *TINY, "trainer.max_epochs=1", "run.test=false", "run.export=false"]) == 0
    assert RunDir(tmp_path / "new").metrics()[-1]["train/lr"] > 1e-4, "the new run has a schedule of its own"


def _cli_error(capsys, *argv: str) -> str:
    assert main(list(argv)) == 2
    return capsys.readouterr().err


def test_clear_errors(tmp_path, capsys):
    err = _cli_error(capsys, "fit", "--config", "vit/digits", "data.name=imagenet-1k")
    assert "unknown dataset" in err and "digits" in err and "Traceback" not in err
    err = _cli_error(capsys, "fit", "--config", "vit/digits", "model.patch_size=3", f"run.dir={tmp_path / 'r'}", *TINY)
    assert "not divisible by the patch size 3" in err
    err = _cli_error(capsys, "fit", "--config", "vit/digits", "optim.lrr=1")
    assert "unknown config key 'optim.lrr'" in err and "Did you mean 'lr'" in err
    err = _cli_error(capsys, "fit", "--config", "vit/digits", "model.name=vit_tinyy")
    assert "unknown model 'vit_tinyy'" in err
    err = _cli_error(capsys, "fit", "--config", "vit/digits", "data.name=mnist", f"data.root={tmp_path}")
    assert str(tmp_path) in err and "download" in err


def test_corrupt_checkpoint_is_a_clear_error(tmp_path, capsys):
    run_dir = _fit_cli(tmp_path)
    bad = tmp_path / "bad.ckpt"
    data = (run_dir / "checkpoints" / "last.ckpt").read_bytes()
    bad.write_bytes(data[: len(data) // 2])
    err = _cli_error(capsys, "export", str(bad))
    assert "corrupt" in err and str(bad) in err
    garbage = tmp_path / "garbage.ckpt"
    garbage.write_bytes(b"not a checkpoint at all")
    assert "corrupt" in _cli_error(capsys, "test", str(garbage))
    assert "corrupt" in _cli_error(capsys, "fit", "--resume", str(garbage), "--config", "vit/digits")


def test_gradient_clipping_reaches_the_trainer(tmp_path):
    seen = {}

    class Spy(pl.Callback):
        def on_fit_start(self, trainer, pl_module):
            seen["clip"] = (trainer.gradient_clip_val, trainer.gradient_clip_algorithm)

    cfg = build_config(
        "vit/digits",
        [
            *TINY,
            "trainer.max_epochs=1",
            "data.limit_train=64",
            "optim.grad_clip=0.25",
            "run.test=false",
            "run.export=false",
            f"run.dir={tmp_path / 'r'}",
        ],
    )
    fit(cfg, callbacks=[Spy()])
    assert seen["clip"] == (0.25, "norm")


def test_print_config(capsys):
    assert main(["fit", "--config", "vit/digits", "optim.lr=0.5", "--print-config"]) == 0
    out = capsys.readouterr().out
    assert "lr: 0.5" in out and "name: vit_nano" in out


@pytest.mark.slow
def test_ddp_two_processes_on_cpu_keep_the_same_weights(tmp_path):
    run_dir = tmp_path / "ddp"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop("VITLAB_RUN_DIR", None)
    cmd = [
        sys.executable,
        "-m",
        "vitlab.cli.main",
        "fit",
        "--config",
        "vit/digits",
        f"run.dir={run_dir}",
        "trainer.max_epochs=1",
        "trainer.strategy=ddp",
        "trainer.devices=2",
        *TINY,
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    check = json.loads((run_dir / "ddp_check.json").read_text())
    assert check["world_size"] == 2 and check["in_sync"] is True
    assert check["checksums"][0] == check["checksums"][1]
    assert (run_dir / "export" / "model.safetensors").is_file()


def test_part_stats_gives_each_parts_gradient_norm_and_its_update_over_weight_ratio():
    from types import SimpleNamespace

    from vitlab.training.callbacks import PartStats

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2), torch.nn.Linear(2, 2))
    model[2].requires_grad_(False)  # a frozen part is not a part
    module = torch.nn.Module()
    module.model = model
    logged = {}
    module.log = lambda key, value, **kwargs: logged.__setitem__(key, float(value))
    callback = PartStats(every=2)
    trainer = SimpleNamespace(global_step=0)
    callback.on_train_start(trainer, module)
    assert list(callback._parts) == ["0", "1"]
    callback.on_train_epoch_start(trainer, module)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    expected = {}
    for step in range(3):  # steps 0 and 2 are sampled
        trainer.global_step = step
        optimizer.zero_grad()
        model(torch.randn(5, 3)).square().sum().backward()
        callback.on_before_optimizer_step(trainer, module, optimizer)
        if step % 2 == 0:
            for name in ("0", "1"):
                part = model[int(name)]
                grad = torch.cat([p.grad.flatten() for p in part.parameters()]).norm()
                weight = torch.cat([p.detach().flatten() for p in part.parameters()]).norm()
                expected.setdefault(f"parts/{name}/grad_norm", []).append(float(grad))
                expected.setdefault(f"parts/{name}/update_ratio", []).append(float(0.1 * grad / weight))  # plain SGD
        optimizer.step()
        callback.on_train_batch_end(trainer, module, None, None, step)
    callback.on_train_epoch_end(trainer, module)
    assert set(logged) == set(expected)
    for key, values in expected.items():
        assert logged[key] == pytest.approx(sum(values) / len(values), rel=1e-5), key


def test_part_stats_lands_in_the_metrics_of_a_run(tmp_path):
    run_dir = _fit_cli(tmp_path, "run.part_stats_every=3", "run.export=false", "run.test=false")
    rows = RunDir(run_dir).metrics()
    for row in rows:
        for part in ("patch_embed", "blocks", "head"):
            assert row[f"parts/{part}/grad_norm"] > 0 and 0 < row[f"parts/{part}/update_ratio"] < 1, (part, row)


def test_a_negative_part_stats_interval_is_refused():
    with pytest.raises(ConfigError, match="run.part_stats_every must be 0"):
        build_config("vit/digits", ["run.part_stats_every=-1"])
