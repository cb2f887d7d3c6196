"""The test metrics of a run mean one thing: ``vitlab fit`` and ``vitlab test`` agree on the same ``best.ckpt``, and
a DDP run tests every test image exactly once (no images repeated to even out the shards)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import vitlab
from run_fixtures import TINY
from vitlab.cli.main import main
from vitlab.training.run import evaluate


def test_cet_vit_test_loss_is_the_same_in_fit_and_in_test(tmp_path):
    run_dir = tmp_path / "cet"
    ramp = ["loss.ei_start=0", "loss.ei_end=2"]  # the EI weight is > 0 after epoch 0, 0 at its start
    argv = [
        "fit",
        "--config",
        "cet_vit/digits",
        f"run.dir={run_dir}",
        "trainer.max_epochs=1",
        *[a for a in TINY if not a.startswith("model.")],
        *ramp,
    ]
    assert main([*argv, "run.export=false"]) == 0
    written = json.loads((run_dir / "test_metrics.json").read_text())
    again = evaluate(run_dir, "test")
    assert written["test/loss"] == pytest.approx(again["test/loss"], abs=1e-6)
    assert written["test/loss"] == pytest.approx(written["test/ce"], abs=1e-6), "test/loss is the cross-entropy"
    assert written["test/acc"] == again["test/acc"]


def test_vitcae_test_loss_is_the_same_in_fit_and_in_test(tmp_path):
    run_dir = tmp_path / "vitcae"
    curriculum = ["loss.warmup_epochs=1"]  # fit tests after the switch to the MMD blend, `vitlab test` at epoch 1
    argv = ["fit", "--config", "vitcae/digits", f"run.dir={run_dir}", "trainer.max_epochs=1", *TINY, *curriculum]
    assert main([*argv, "run.export=false"]) == 0
    written = json.loads((run_dir / "test_metrics.json").read_text())
    again = evaluate(run_dir, "test")
    assert written["test/loss"] == pytest.approx(again["test/loss"], abs=1e-6)
    assert written["test/loss"] == pytest.approx(written["test/monitor"], abs=1e-6)
    assert "test/objective" in written and written["test/acc"] == again["test/acc"]
    assert evaluate(run_dir, "test") == again  # its MMD terms draw prior samples: seeded, the same every time


def test_a_bf16_run_is_tested_in_float32_like_its_export_and_records_both_precisions(tmp_path):
    import torch.nn.functional as F

    from vitlab.data import build_datamodule
    from vitlab.rundir import RunDir

    run_dir = tmp_path / "bf16"
    argv = ["fit", "--config", "vit/digits", f"run.dir={run_dir}", "trainer.max_epochs=1", *TINY]
    assert main([*argv, "trainer.precision=bf16-mixed"]) == 0
    written = json.loads((run_dir / "test_metrics.json").read_text())
    assert written["test_precision"] == "32-true" and written["train_precision"] == "bf16-mixed"
    model = vitlab.load_model(run_dir / "export")
    dm = build_datamodule(RunDir(run_dir).config().data)
    dm.setup("test")
    losses, correct, count = 0.0, 0, 0
    with torch.no_grad():
        for x, y in dm.test_dataloader():
            logits = model(x)
            losses += float(F.cross_entropy(logits, y, reduction="sum"))
            correct, count = correct + int((logits.argmax(-1) == y).sum()), count + len(y)
    assert written["test/loss"] == pytest.approx(losses / count, abs=1e-5)
    assert written["test/acc"] == pytest.approx(correct / count, abs=1e-7)
    assert evaluate(run_dir, "test")["test/loss"] == pytest.approx(written["test/loss"], abs=1e-6)


@pytest.mark.slow
def test_a_ddp_run_tests_every_image_once_and_its_log_has_no_lightning_warnings(tmp_path):
    run_dir = tmp_path / "ddp"
    source = str(Path(vitlab.__file__).parents[1])
    env = {
        **os.environ,
        "PYTHONUNBUFFERED": "1",
        "PYTHONPATH": os.pathsep.join([source, os.environ.get("PYTHONPATH", "")]),
    }
    env.pop("VITLAB_RUN_DIR", None)
    cmd = [sys.executable, "-m", "vitlab.cli.main", "fit", "--config", "vit/digits", f"run.dir={run_dir}"]
    cmd += ["trainer.max_epochs=1", "trainer.strategy=ddp", "trainer.devices=2", "data.eval_batch_size=50", *TINY]
    cmd += ["trainer.precision=32-true"]  # exact sums: bf16 would round the shards and the single pass apart
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    log = proc.stdout + proc.stderr
    for noise in ("DistributedSampler", "all_gather", "deprecated", "Warning"):
        assert noise not in log, (noise, log[-3000:])
    # the digits' test split holds 360 images: two shards of 180, in batches of 50, would be padded by nobody, so
    # an odd eval batch size makes uneven last batches; the single-process test of best.ckpt is the reference
    written = json.loads((run_dir / "test_metrics.json").read_text())
    single = evaluate(run_dir, "test")
    assert written["test/acc"] == pytest.approx(single["test/acc"], abs=1e-7)
    assert written["test/loss"] == pytest.approx(single["test/loss"], abs=1e-6)
