"""``fit`` / ``evaluate`` orchestration: config -> data -> model -> task -> Lightning Trainer -> run directory.

A run directory holds: ``config.yaml`` (resolved), ``env.json``, ``metrics.jsonl``, ``tb/`` (TensorBoard),
``checkpoints/last.ckpt`` and ``checkpoints/best.ckpt`` (atomic), ``export/`` (``model.safetensors`` +
``config.json``), ``test_metrics.json``, and whatever the task's callbacks add (dynamics, grids, report).
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import ModelCheckpoint, TQDMProgressBar
from lightning.pytorch.loggers import TensorBoardLogger

from vitlab.config import ConfigError, RunConfig, deep_merge, dump_yaml, from_dict, parse_overrides, to_dict
from vitlab.data import VisionDataModule, build_datamodule
from vitlab.diagnostics.controller import DynamicsController
from vitlab.errors import VitlabError
from vitlab.export import CheckpointError, export_model, read_checkpoint
from vitlab.models.registry import constructor_args, create_model, get_preset
from vitlab.training.callbacks import (
    AtomicCheckpointIO,
    DDPConsistencyCheck,
    EpochSeed,
    FlushMetrics,
    JSONLinesLogger,
    StepTimer,
    atomic_write_text,
)
from vitlab.training.finetune import setup_finetuning
from vitlab.training.tasks import BaseTask, ClassificationTask

RUN_DIR_ENV = "VITLAB_RUN_DIR"


# -------------------------------------------------------------------------------------------------------------------
def environment() -> dict[str, Any]:
    """Versions, git revision and hardware, for ``env.json``."""
    import lightning
    import timm
    import torchvision

    import vitlab

    def git(*args: str) -> str | None:
        try:
            out = subprocess.run(["git", *args], capture_output=True, text=True, timeout=5, cwd=Path(__file__).parent)
            return out.stdout.strip() if out.returncode == 0 else None
        except (OSError, subprocess.TimeoutExpired):
            return None

    return {
        "time": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "command": sys.argv,
        "versions": {
            "python": platform.python_version(),
            "vitlab": vitlab.__version__,
            "torch": torch.__version__,
            "torchvision": torchvision.__version__,
            "timm": timm.__version__,
            "lightning": lightning.__version__,
        },
        "git": {"revision": git("rev-parse", "HEAD"), "dirty": bool(git("status", "--porcelain"))},
        "hardware": {
            "platform": platform.platform(),
            "processor": platform.processor() or platform.machine(),
            "cpu_count": os.cpu_count(),
            "torch_threads": torch.get_num_threads(),
            "cuda": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())],
        },
    }


def make_run_dir(cfg: RunConfig) -> Path:
    """The run directory: ``run.dir`` if set, else ``<run.root>/<run.name>-<timestamp>``.

    DDP children started by Lightning inherit ``VITLAB_RUN_DIR`` so every process writes to the same folder.
    """
    if cfg.run.dir:
        path = Path(cfg.run.dir)
    elif os.environ.get(RUN_DIR_ENV):
        path = Path(os.environ[RUN_DIR_ENV])
    else:
        stamp = os.environ.get("TORCHELASTIC_RUN_ID") or _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
        path = Path(cfg.run.root) / f"{cfg.run.name}-{stamp}"
    os.environ[RUN_DIR_ENV] = str(path.resolve())
    return path


def data_info(dm: VisionDataModule) -> dict[str, Any]:
    return {
        "dataset": dm.cfg.name,
        "num_classes": dm.num_classes,
        "in_chans": dm.in_chans,
        "img_size": dm.img_size,
        "mean": list(dm.mean),
        "std": list(dm.std),
        "class_names": list(dm.class_names),
    }


def model_kwargs_for(cfg: RunConfig, info: dict[str, Any]) -> dict[str, Any]:
    """Model overrides from the config, with image size, channels and classes filled in from the data."""
    kwargs = {k: v for k, v in cfg.model.items() if k not in ("name", "pretrained")}  # pretrained: weights, not shape
    preset = get_preset(cfg.model["name"])
    accepted = constructor_args(preset.cls)
    for key, value in (
        ("img_size", info["img_size"]),
        ("in_chans", info["in_chans"]),
        ("num_classes", info["num_classes"]),
    ):
        if key in accepted:
            kwargs.setdefault(key, value)
    if kwargs.get("img_size", info["img_size"]) != info["img_size"]:
        raise ConfigError(
            f"model.img_size={kwargs['img_size']} but the data gives {info['img_size']}x{info['img_size']} images; "
            "set data.img_size to resize the data instead"
        )
    return kwargs


def build_task(cfg: RunConfig, model: torch.nn.Module, hparams: dict[str, Any]) -> BaseTask:
    """The Lightning task for a model: each model family names its task through ``TASKS``."""
    from vitlab.training import TASKS

    factory = TASKS.get(type(model).__name__, ClassificationTask)
    return factory(model, cfg=cfg, hparams=hparams)


def _callbacks(cfg: RunConfig, run_dir: Path, task: BaseTask) -> list[pl.Callback]:
    monitor, mode = task.monitor
    ckpt_dir = run_dir / "checkpoints"
    callbacks: list[pl.Callback] = [
        ModelCheckpoint(
            dirpath=ckpt_dir, filename="best", monitor=monitor, mode=mode, save_top_k=1, enable_version_counter=False
        ),
        # Lightning's save_last only copies when a monitored checkpoint is written; resuming needs every epoch.
        ModelCheckpoint(dirpath=ckpt_dir, filename="last", save_top_k=1, enable_version_counter=False),
        EpochSeed(cfg.run.seed),
        FlushMetrics(),
        DDPConsistencyCheck(run_dir),
        *task.extra_callbacks(run_dir),
    ]
    if cfg.dynamics is not None:
        callbacks.append(DynamicsController.from_config(cfg.dynamics, run_dir))
    callbacks.append(StepTimer(run_dir))  # after the controller, so the epoch time includes its measurement
    if cfg.trainer.enable_progress_bar:
        callbacks.append(TQDMProgressBar(refresh_rate=max(1, min(20, cfg.trainer.log_every_n_steps))))
    return callbacks


def make_trainer(cfg: RunConfig, run_dir: Path, callbacks: list[pl.Callback]) -> pl.Trainer:
    t = cfg.trainer
    kwargs = {k: v for k, v in to_dict(t).items() if v is not None}
    trainer = pl.Trainer(
        **kwargs,
        default_root_dir=str(run_dir),
        gradient_clip_val=cfg.optim.grad_clip,
        gradient_clip_algorithm="norm",
        callbacks=callbacks,
        logger=[TensorBoardLogger(str(run_dir), name="tb", version=""), JSONLinesLogger(run_dir / "metrics.jsonl")],
        plugins=[AtomicCheckpointIO()],
    )
    share_cpu_threads(trainer)
    return trainer


def share_cpu_threads(trainer: pl.Trainer) -> None:
    """Several CPU processes on one machine: give each ``cores / processes`` threads.

    Oversubscribed OpenMP threads wait for each other at every barrier; on a 2-core machine two DDP processes
    with two threads each run small ops tens of times slower than with one thread each.
    """
    if trainer.world_size > 1 and isinstance(trainer.accelerator, pl.accelerators.CPUAccelerator):
        local = max(1, trainer.world_size // max(1, trainer.num_nodes))
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // local))


def fit(cfg: RunConfig, resume: str | Path | None = None, callbacks: list[pl.Callback] | None = None) -> Path:
    """Train a model as ``cfg`` says; returns the run directory.

    ``resume``: a run directory or a ``.ckpt`` to continue from; ``callbacks``: extra Lightning callbacks.
    """
    ckpt_path = None
    if resume is not None:
        ckpt_path = Path(resume)
        if ckpt_path.is_dir():
            ckpt_path = ckpt_path / "checkpoints" / "last.ckpt"
        read_checkpoint(ckpt_path)  # fail early, with a clear message, on a corrupt file
        if not cfg.run.dir:
            cfg.run.dir = str(ckpt_path.parent.parent)

    pl.seed_everything(cfg.run.seed, workers=True, verbose=False)
    run_dir = make_run_dir(cfg)
    dm = build_datamodule(cfg.data)
    dm.prepare_data()
    dm.setup("fit")
    info = data_info(dm)
    kwargs = model_kwargs_for(cfg, info)
    try:
        pretrained = None if ckpt_path else cfg.model.get("pretrained")  # a resumed run has its weights
        model = create_model(cfg.model["name"], pretrained=pretrained, **kwargs)
    except (ValueError, TypeError) as e:
        if isinstance(e, ConfigError | VitlabError):
            raise
        raise ConfigError(f"cannot build model {cfg.model['name']!r} with {kwargs}: {e}") from e
    hparams = {"config": to_dict(cfg), "model_kwargs": kwargs, "data_info": info}
    task = build_task(cfg, model, hparams)
    finetune_callbacks = setup_finetuning(cfg, model, task.monitor)
    trainer = make_trainer(cfg, run_dir, _callbacks(cfg, run_dir, task) + finetune_callbacks + list(callbacks or []))

    if trainer.is_global_zero:
        run_dir.mkdir(parents=True, exist_ok=True)
        atomic_write_text(run_dir / "config.yaml", dump_yaml(cfg))
        atomic_write_text(run_dir / "env.json", json.dumps(environment(), indent=2))

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*does not have many workers.*")
        warnings.filterwarnings("ignore", message=".*number of training batches.*")
        trainer.fit(task, datamodule=dm, ckpt_path=str(ckpt_path) if ckpt_path else None, weights_only=True)
        if cfg.run.test:
            best = run_dir / "checkpoints" / "best.ckpt"
            results = trainer.test(
                task, datamodule=dm, ckpt_path=str(best) if best.exists() else None, verbose=False, weights_only=True
            )
            if trainer.is_global_zero and results:
                atomic_write_text(run_dir / "test_metrics.json", json.dumps(results[0], indent=2))
    if trainer.is_global_zero:
        if cfg.run.export:
            export_model(task.model, run_dir / "export", {"data": info})
        task.on_run_end(run_dir, dm)
        if cfg.run.report:
            from vitlab.report import write_report

            write_report([run_dir])
    return run_dir


def load_run_config(run_dir: str | Path) -> RunConfig:
    """The resolved config of a run directory."""
    import yaml

    path = Path(run_dir) / "config.yaml"
    if not path.exists():
        raise ConfigError(f"{run_dir} is not a run directory (no config.yaml); pass the folder `vitlab fit` printed")
    return from_dict(RunConfig, yaml.safe_load(path.read_text()))


def evaluate(target: str | Path, stage: str = "test", overrides: list[str] | None = None) -> dict[str, float]:
    """Run the validation or test loop of a run directory (best checkpoint) or a ``.ckpt`` file."""
    target = Path(target)
    if target.is_dir():
        ckpt = target / "checkpoints" / "best.ckpt"
        if not ckpt.exists():
            ckpt = target / "checkpoints" / "last.ckpt"
    else:
        ckpt = target
    ckpt_data = read_checkpoint(ckpt)
    hp = ckpt_data.get("hyper_parameters") or {}
    if "config" not in hp:
        raise CheckpointError(f"{ckpt} has no vitlab config; was it written by vitlab fit?")
    cfg = from_dict(RunConfig, deep_merge(hp["config"], parse_overrides(overrides or [])))
    dm = build_datamodule(cfg.data)
    model = create_model(cfg.model["name"], **hp["model_kwargs"])
    task = build_task(cfg, model, hp)
    trainer = pl.Trainer(
        accelerator=cfg.trainer.accelerator,
        devices=1,
        precision=cfg.trainer.precision,
        logger=False,
        enable_progress_bar=cfg.trainer.enable_progress_bar,
    )
    run = trainer.validate if stage == "validate" else trainer.test
    results = run(task, datamodule=dm, ckpt_path=str(ckpt), verbose=False, weights_only=True)
    return results[0] if results else {}
