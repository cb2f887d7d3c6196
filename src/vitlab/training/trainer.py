"""Lightning's ``Trainer`` as a vitlab run uses it: its callbacks and loggers, its precision, its CPU threads, and
its console (:mod:`vitlab.training.console`)."""

from __future__ import annotations

import os
from pathlib import Path

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import TensorBoardLogger
from lightning.pytorch.strategies import DDPStrategy
from lightning.pytorch.utilities.exceptions import MisconfigurationException

from vitlab.acceleration import PrecisionChoice, choose_precision
from vitlab.config import ConfigError, RunConfig
from vitlab.dynamics import DynamicsController
from vitlab.errors import VitlabError
from vitlab.rundir import METRICS_FILE, TENSORBOARD_DIR, RunDir
from vitlab.training.callbacks import (
    AtomicCheckpointIO,
    DDPConsistencyCheck,
    EpochSeed,
    FlushMetrics,
    JSONLinesLogger,
    PartStats,
    StepTimer,
)
from vitlab.training.console import EpochLines, ProgressBar, console_progress_bar, quiet_lightning, quiet_warnings
from vitlab.training.tasks import BaseTask


def run_callbacks(cfg: RunConfig, run_dir: Path, task: BaseTask, validate: bool = True) -> list[pl.Callback]:
    """The run's callbacks; without a validation set (``validate=False``) ``best.ckpt`` is the last epoch's."""
    monitor, mode = task.monitor if validate else ("step", "max")
    ckpt_dir = RunDir(run_dir).checkpoints_dir
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
    if cfg.run.part_stats_every:
        callbacks.append(PartStats(cfg.run.part_stats_every))
    callbacks.append(StepTimer(run_dir))  # after the controller, so the epoch time includes its measurement
    if console_progress_bar(cfg):
        callbacks.append(ProgressBar(refresh_rate=max(1, min(20, cfg.trainer.log_every_n_steps))))
    else:
        callbacks.append(EpochLines())
    return callbacks


def run_precision(cfg: RunConfig) -> PrecisionChoice:
    """The precision of ``cfg``'s trainer, ``auto`` resolved for its accelerator (:func:`choose_precision`)."""
    return choose_precision(str(cfg.trainer.precision), str(cfg.trainer.accelerator))


def make_trainer(cfg: RunConfig, run_dir: Path, callbacks: list[pl.Callback], validate: bool = True) -> pl.Trainer:
    """The run's trainer; a ``trainer.*`` value Lightning refuses is a :class:`ConfigError` naming it."""
    kwargs = cfg.trainer.lightning_kwargs()
    kwargs["precision"] = run_precision(cfg).precision
    kwargs["enable_progress_bar"] = console_progress_bar(cfg)
    if not validate:
        kwargs["limit_val_batches"] = 0
    quiet_lightning()
    loggers = [
        TensorBoardLogger(str(run_dir), name=TENSORBOARD_DIR, version=""),
        JSONLinesLogger(run_dir / METRICS_FILE),
    ]
    with quiet_warnings():
        try:
            trainer = pl.Trainer(
                **kwargs,
                enable_model_summary=False,  # fit prints one line instead (Lightning's table: a FLOPs column of zeros)
                default_root_dir=str(run_dir),
                gradient_clip_val=cfg.optim.grad_clip,
                gradient_clip_algorithm="norm",
                callbacks=callbacks,
                logger=loggers,
                plugins=[AtomicCheckpointIO()],
            )
        except (ValueError, TypeError, MisconfigurationException) as e:  # Lightning's answer to a bad trainer.* value
            if isinstance(e, VitlabError):
                raise
            first = str(e).split(". ")[0].rstrip(".")
            raise ConfigError(f"the trainer.* settings are not valid for Lightning: {first}; fix that setting") from e
    share_cpu_threads(trainer)
    if cfg.dynamics is not None and cfg.dynamics.freezes_layers and isinstance(trainer.strategy, DDPStrategy):
        # Frozen blocks stop producing gradients mid-run: DDP must look for unused parameters at every step, else
        # its buckets wait for gradients that never come and the replicas part (Lightning's
        # ddp_find_unused_parameters_true, whatever strategy name chose DDP).
        trainer.strategy._ddp_kwargs["find_unused_parameters"] = True
    return trainer


def share_cpu_threads(trainer: pl.Trainer) -> None:
    """Several CPU processes on one machine: give each ``cores / processes`` threads.

    Oversubscribed OpenMP threads wait for each other at every barrier; on a 2-core machine two DDP processes
    with two threads each run small ops tens of times slower than with one thread each.
    """
    if trainer.world_size > 1 and isinstance(trainer.accelerator, pl.accelerators.CPUAccelerator):
        local = max(1, trainer.world_size // max(1, trainer.num_nodes))
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // local))
