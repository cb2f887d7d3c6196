"""Shared run-directory fixtures: the overrides that make a ``vitlab fit`` on the digits take a second or two, and
the one builder of run directories (as ``vitlab fit`` leaves them, without training) that the tests share.
Everything is written through :class:`vitlab.rundir.RunDir`, so the fixtures follow the layout it owns."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import matplotlib.image
import numpy as np
import torch

import vitlab
from vitlab.config import DataConfig, RunConfig, RunSection
from vitlab.data import build_datamodule
from vitlab.export import export_model
from vitlab.rundir import GENERATE_DIR, GENERATE_METRICS_FILE, METRICS_FILE, TEST_METRICS_FILE, RunDir
from vitlab.training.preflight import data_info

TINY = [
    "trainer.enable_progress_bar=false",
    "trainer.accelerator=cpu",
    "model.depth=1",
    "data.limit_train=256",
    "run.generate=false",
    "run.report=false",
]


def write_png(path: Path, shape: tuple[int, int] = (6, 10)) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    matplotlib.image.imsave(path, np.linspace(0, 1, shape[0] * shape[1]).reshape(shape), cmap="gray")


def epoch_rows(epochs: int, seed: int = 0) -> list[dict[str, Any]]:
    """``metrics.jsonl`` rows of a classifier whose losses fall and accuracies rise over ``epochs`` epochs."""
    return [
        {
            "epoch": epoch,
            "step": 10 * (epoch + 1),
            "train/loss": 2.3 - 0.2 * epoch - 0.01 * seed,
            "val/loss": 2.2 - 0.1 * epoch,
            "train/acc": 0.1 + 0.2 * epoch,
            "val/acc": 0.1 + 0.15 * epoch + 0.01 * seed,
            "train/kl_cls": 1.0 / (epoch + 1),
            "lr-AdamW": 1e-3 * (1 - epoch / epochs),
        }
        for epoch in range(epochs)
    ]


def make_run(
    root: Path,
    name: str | None = None,
    *,
    preset: str = "vit_pico",
    seed: int = 0,
    lr: float | None = None,
    batch_size: int = 32,
    export: bool = True,
    env: bool = False,
    epochs: int = 0,
    test_metrics: Mapping[str, float] | None = None,
    generate: Mapping[str, float] | None = None,
) -> Path:
    """A run directory as ``vitlab fit`` leaves it, without training.

    ``export``: an untrained ``preset`` exported for 8x8 one-channel digits (``patch_size=2``); ``env``: an
    ``env.json``; ``epochs``: that many :func:`epoch_rows` in ``metrics.jsonl``; ``test_metrics``: the
    ``test_metrics.json``; ``generate``: a ViTCAE-style ``generate/`` folder (a grid PNG and these metrics).
    """
    run = RunDir(root / (name or f"{preset}-{seed}"))
    run.path.mkdir(parents=True, exist_ok=True)
    data = DataConfig(name="digits", batch_size=batch_size)
    model_cfg: dict[str, Any] = {"name": preset}
    if export:
        torch.manual_seed(seed)
        model = vitlab.create_model(preset, img_size=8, patch_size=2, in_chans=1, num_classes=10)
        export_model(model, run.export_dir, {"data": data_info(build_datamodule(data))})
        model_cfg["patch_size"] = 2
    cfg = RunConfig(model=model_cfg, data=data, run=RunSection(name=run.path.name, seed=seed))
    if lr is not None:
        cfg.optim.lr = lr
    run.write_config(cfg)
    if env:
        run.write_env()
    if epochs:
        (run / METRICS_FILE).write_text("".join(json.dumps(row) + "\n" for row in epoch_rows(epochs, seed)))
    if test_metrics is not None:
        run.write_json(TEST_METRICS_FILE, dict(test_metrics))
    if generate is not None:
        write_png(run / GENERATE_DIR / "reconstruction.png")
        run.write_json(f"{GENERATE_DIR}/{GENERATE_METRICS_FILE}", dict(generate))
    return run.path


def write_checkpoint(run_dir: Path, name: str = "best.ckpt") -> torch.nn.Module:
    """A Lightning-style checkpoint of the run's exported model under ``checkpoints/``, holding what ``vitlab fit``
    stores (the config, the constructor arguments, the data description); returns the model."""
    run = RunDir(run_dir)
    model = vitlab.load_model(run.export_dir)
    info = json.loads((run.export_dir / "config.json").read_text())
    hparams = {"config": run.config_dict(), "model_kwargs": info["kwargs"], "data_info": info["data"]}
    run.checkpoints_dir.mkdir(exist_ok=True)
    state = {f"model.{key}": value for key, value in model.state_dict().items()}
    torch.save({"state_dict": state, "hyper_parameters": hparams}, run.checkpoints_dir / name)
    return model
