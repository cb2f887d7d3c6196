"""``fit`` / ``evaluate`` orchestration: config -> data -> model -> task -> Lightning Trainer -> run directory
(its files: :mod:`vitlab.rundir`, docs/rundir.md)."""

from __future__ import annotations

import contextlib
import inspect
import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import TensorBoardLogger
from lightning.pytorch.strategies import DDPStrategy
from lightning.pytorch.utilities.exceptions import MisconfigurationException

from vitlab import manifest
from vitlab.acceleration.precision import PrecisionChoice, choose_precision
from vitlab.atomic import environment_error
from vitlab.config import ConfigError, RunConfig, to_dict
from vitlab.config.loss import build_loss
from vitlab.data import VisionDataModule, build_datamodule
from vitlab.dynamics import DynamicsController
from vitlab.errors import OutputError, VitlabError
from vitlab.export import checkpoint_hparams, export_model, read_checkpoint
from vitlab.family import family_of_class
from vitlab.layers import attention_path
from vitlab.models.builder import create_model
from vitlab.models.protocols import GradCheckpointing, PretrainedConfigured
from vitlab.models.registry import constructor_args, get_preset
from vitlab.models.sizing import parameter_count
from vitlab.rundir import (
    ATTENTION_PATHS_FILE,
    METRICS_FILE,
    TENSORBOARD_DIR,
    TEST_METRICS_FILE,
    RunDir,
    config_with_overrides,
    locate_checkpoint,
)
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
from vitlab.training.finetune import pretrained_normalisation, setup_finetuning
from vitlab.training.preflight import (
    absolute_data_paths,
    check_first_batch_fits,
    check_resume_matches,
    check_schedule,
    data_info,
    model_kwargs_for,
    warmup_warning,
)
from vitlab.training.resume import Resume, read_resume, record_resume
from vitlab.training.run_folder import claim_run_dir, is_launching_process, recovery_hint, run_dir_path
from vitlab.training.tasks import BaseTask, ClassificationTask

#: the files TensorBoard writes into ``tb/`` (a user's file beside them stays)
TENSORBOARD_FILES = ("events.out.tfevents.*", "hparams.yaml")

__all__ = ["RunInterrupted", "evaluate", "fit"]


# -------------------------------------------------------------------------------------------------------------------
class RunInterrupted(VitlabError, KeyboardInterrupt):
    """Training was stopped by Ctrl+C (SIGINT); the message says how to continue."""


def model_line(preset: str, model: torch.nn.Module) -> str:
    """``model vit_nano (VisionTransformer): 0.80 M parameters, 0.80 M trainable``."""
    total, trainable = parameter_count(model), parameter_count(model, trainable=True)
    return f"model {preset} ({type(model).__name__}): {total / 1e6:.2f} M parameters, {trainable / 1e6:.2f} M trainable"


def resolved_config(cfg: RunConfig) -> dict[str, Any]:
    """Every value a run of ``cfg`` uses, as plain data (what ``vitlab fit --print-config`` shows): the model's
    constructor defaults, the preset's values, what the data fills in and the config's own; the defaults of the
    ``loss`` and ``dynamics`` sections too (typed, so ``to_dict`` gives every field)."""
    from vitlab.data import DataError, dataset_info

    preset = get_preset(cfg.model["name"])
    try:
        info = dataset_info(cfg.data)
    except DataError:  # the data is not there yet: show what the config and the preset say, without the data's part
        filled = {k: v for k, v in cfg.model.items() if k != "name"}
    else:
        filled = model_kwargs_for(
            cfg, {"img_size": info.img_size, "in_chans": info.in_chans, "num_classes": info.num_classes}
        )
    defaults = {
        name: param.default
        for name, param in constructor_args(preset.cls).items()
        if param.default is not inspect.Parameter.empty
    }
    out = to_dict(cfg)
    out["model"] = to_dict({"name": preset.name, **defaults, **preset.kwargs, **filled})
    family = family_of_class(preset.cls)
    loss_config = family.config_type("loss") if family else None
    if loss_config is not None:
        out["loss"] = to_dict(build_loss(loss_config, cfg.loss))
    return out


def enable_grad_checkpointing(model: torch.nn.Module) -> None:
    """``trainer.grad_checkpointing=true``: the model's blocks recompute their activations in the backward pass."""
    if not isinstance(model, GradCheckpointing):
        raise ConfigError(
            f"trainer.grad_checkpointing=true, but {type(model).__name__} has no set_grad_checkpointing (timm's "
            "switch); unset trainer.grad_checkpointing"
        )
    model.set_grad_checkpointing(True)


def build_task(cfg: RunConfig, model: torch.nn.Module, hparams: dict[str, Any]) -> BaseTask:
    """The Lightning task for a model: its family's task (``vitlab.family``), a classifier's for any other model."""
    return task_class_for(type(model))(model, cfg=cfg, hparams=hparams)


def task_class_for(model_class: type) -> type[BaseTask]:
    """The task class of a model class: the one its family declares, else :class:`ClassificationTask`."""
    family = family_of_class(model_class)
    return ClassificationTask if family is None else family.task_class()


def _callbacks(cfg: RunConfig, run_dir: Path, task: BaseTask, validate: bool = True) -> list[pl.Callback]:
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


def _checked_data(cfg: RunConfig, stored: dict[str, Any] | None) -> tuple[VisionDataModule, dict[str, Any]]:
    """The data module, set up and checked (a first batch fits, the data trains), and its description."""
    dm = build_datamodule(cfg.data)
    shape = {"img_size": dm.img_size, "in_chans": dm.in_chans, "num_classes": dm.num_classes}
    check_first_batch_fits(cfg.model["name"], model_kwargs_for(cfg, shape), cfg.data.batch_size)
    dm.prepare_data()
    dm.setup("fit")
    dm.check_trainable()
    normalisation = pretrained_normalisation(cfg, dm, stored)
    if normalisation:
        print(normalisation, flush=True)
    return dm, data_info(dm)


def _built_model(cfg: RunConfig, kwargs: dict[str, Any], info: dict[str, Any], *, resuming: bool) -> torch.nn.Module:
    """The model of the config with ``kwargs``, its pretrained weights unless ``resuming`` (the checkpoint has them)."""
    try:
        model = create_model(cfg.model["name"], pretrained=None if resuming else cfg.model.get("pretrained"), **kwargs)
    except (ValueError, TypeError) as e:
        if isinstance(e, ConfigError | VitlabError):
            raise
        raise ConfigError(f"cannot build model {cfg.model['name']!r} with {kwargs}: {e}") from e
    if isinstance(model, PretrainedConfigured):
        model.pretrained_cfg = {"mean": info["mean"], "std": info["std"]}  # what the data is normalised with
    if cfg.trainer.grad_checkpointing:
        enable_grad_checkpointing(model)
    return model


def fit(cfg: RunConfig, resume: str | Path | None = None, callbacks: list[pl.Callback] | None = None) -> Path:
    """Train a model as ``cfg`` says; returns the run directory.

    ``resume``: a run directory or a ``.ckpt`` to continue from; ``callbacks``: extra Lightning callbacks.
    Everything is checked before the run directory is claimed: the config, the data (counts, labels, splits), the
    model (built once), the memory of a first batch and, when resuming, that the checkpoint is this config's model.
    A resume takes up only the changes :mod:`vitlab.training.resume` honours and refuses any other; what it changed
    goes into ``resumes.jsonl`` and the run's ``config.yaml`` (``env.json`` stays that of the run's start).
    """
    resumed = read_resume(cfg, resume) if resume is not None else None
    ckpt_path, stored = (resumed.checkpoint, resumed.hparams) if resumed else (None, None)
    pl.seed_everything(cfg.run.seed, workers=True, verbose=False)
    absolute_data_paths(cfg)
    run_dir = run_dir_path(cfg)
    dm, info = _checked_data(cfg, stored)
    kwargs = model_kwargs_for(cfg, info)
    if stored is not None:
        check_resume_matches(cfg, kwargs, stored, ckpt_path)
    model = _built_model(cfg, kwargs, info, resuming=ckpt_path is not None)
    hparams = {"config": to_dict(cfg), "model_kwargs": kwargs, "data_info": info}
    task = build_task(cfg, model, hparams)
    validate = len(dm.val_set) > 0  # data.val_fraction=0: no validation loop, best.ckpt is the last epoch's
    check_schedule(cfg, validate=validate)
    all_callbacks = _callbacks(cfg, run_dir, task, validate)
    example = torch.zeros(1, info["in_chans"], info["img_size"], info["img_size"])
    for callback in all_callbacks:  # the controller's model check, before the run folder exists
        if isinstance(callback, DynamicsController):
            callback.check(model, example)
    all_callbacks += setup_finetuning(cfg, model, task.monitor) + list(callbacks or [])
    if is_launching_process():
        print(run_precision(cfg).line(), flush=True)  # the run's first line, before Lightning's own
        for line in resumed.lines() if resumed else filter(None, [warmup_warning(cfg)]):
            print(line, file=sys.stderr if line.startswith("warning") else sys.stdout, flush=True)
    trainer = make_trainer(cfg, run_dir, all_callbacks, validate)
    claim = claim_run_dir(cfg, run_dir, resuming=ckpt_path is not None) if is_launching_process() else None
    try:
        _fit_claimed(cfg, run_dir, trainer, task, dm, info, resumed)
    except OSError as e:  # a full disk, a quota, a read-only folder: one line that says how to go on
        error = e if isinstance(e, OutputError) else environment_error(e, e.filename or run_dir)
        if error is None:
            raise
        raise OutputError(f"{error}; then {recovery_hint(run_dir)}") from e
    finally:
        if claim is not None:
            claim.release()
    return run_dir


def _fit_claimed(
    cfg: RunConfig,
    run_dir: Path,
    trainer: pl.Trainer,
    task: BaseTask,
    dm: VisionDataModule,
    info: dict[str, Any],
    resumed: Resume | None,
) -> None:
    """:func:`fit` once the run directory is this process's: write the run's records, train, test, export."""
    run, ckpt_path = RunDir(run_dir), resumed.checkpoint if resumed else None
    for pattern in TENSORBOARD_FILES:  # TensorBoard names its files itself: the manifest names them by pattern
        manifest.record(run_dir, glob=f"{TENSORBOARD_DIR}/{pattern}")
    if trainer.is_global_zero:
        if resumed is not None and run.is_run():
            record_resume(run, cfg, resumed)
        else:
            run.write_config(cfg)
            run.write_env(precision=run_precision(cfg).record())
        print(model_line(cfg.model["name"], task.model), flush=True)
        if not trainer.limit_val_batches:
            print("no validation set (data.val_fraction=0): best.ckpt is the last epoch's", flush=True)
        if ckpt_path is not None:
            print(f"resuming from {ckpt_path}", flush=True)
    if ckpt_path is not None and (run / ATTENTION_PATHS_FILE).is_file():  # the kernels the run measured before
        attention_path.load_decisions(run.json(ATTENTION_PATHS_FILE).get("decisions", []))
    forced = None if cfg.trainer.attention_path == "auto" else cfg.trainer.attention_path
    with quiet_warnings(), attention_path.forcing(forced):
        _train(trainer, task, dm, ckpt_path, run_dir)
        if cfg.run.test:
            results = test_once(cfg, trainer, task, dm, run.best_checkpoint)
            if trainer.is_global_zero and results:
                precisions = {"test_precision": TEST_PRECISION, "train_precision": run_precision(cfg).precision}
                run.write_json(TEST_METRICS_FILE, {**results, **precisions})
    if trainer.is_global_zero:
        if cfg.run.export:
            export_model(task.model, run.export_dir, {"data": info}, force=True)  # the run's own folder
        task.on_run_end(run_dir, dm)
        if cfg.run.report:
            from vitlab.report import write_report

            write_report([run_dir])


#: the precision every test loop runs in: the exported model's (float32 weights, no autocast), so ``test_metrics.json``,
#: ``vitlab test`` and the exported model or ONNX file agree whatever ``trainer.precision`` the run trained in
TEST_PRECISION = "32-true"


def _train(trainer: pl.Trainer, task: BaseTask, dm: VisionDataModule, ckpt_path: Path | None, run_dir: Path) -> None:
    """``trainer.fit``; Ctrl+C (Lightning shuts down cleanly, then calls ``sys.exit(1)``) is :class:`RunInterrupted`,
    whose message says how to go on."""
    try:
        trainer.fit(task, datamodule=dm, ckpt_path=str(ckpt_path) if ckpt_path else None, weights_only=True)
    except SystemExit:
        if not trainer.interrupted:
            raise
        signal.signal(signal.SIGINT, signal.default_int_handler)  # Lightning ignores SIGINT from then on
        raise RunInterrupted(
            f"interrupted during epoch {trainer.current_epoch + 1}; nothing was tested or exported. To go on, "
            f"{recovery_hint(run_dir)}"
        ) from None


@contextlib.contextmanager
def full_precision(trainer: pl.Trainer, task: BaseTask) -> Iterator[None]:
    """The trainer's loops in float32 for the block (:data:`TEST_PRECISION`): Lightning's plain precision plugin in
    place of the run's (mixed precision autocasts every forward), and the weights in float32 (``*-true`` precisions
    cast the module; their dtype comes back after the block, so the export is what it was)."""
    from lightning.pytorch.plugins.precision import Precision

    plugin, dtype = trainer.strategy.precision_plugin, next(task.parameters()).dtype
    trainer.strategy.precision_plugin = Precision()
    task.float()
    try:
        yield
    finally:
        trainer.strategy.precision_plugin = plugin
        task.to(dtype)


def test_once(
    cfg: RunConfig, trainer: pl.Trainer, task: BaseTask, dm: VisionDataModule, best: Path
) -> dict[str, float]:
    """The test metrics of the best checkpoint over the test set exactly once, in float32 (:data:`TEST_PRECISION`).

    On one process, the run's own trainer tests. Under DDP, Lightning's ``DistributedSampler`` would pad uneven
    shards by repeating images; so every rank leaves the process group, rank 0 tests alone on a one-device trainer,
    and the other ranks return.
    """
    ckpt = str(best) if best.exists() else None
    if trainer.world_size == 1:
        with full_precision(trainer, task):
            results = trainer.test(task, datamodule=dm, ckpt_path=ckpt, verbose=False, weights_only=True)
        return results[0] if results else {}
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()  # rank 0's metrics must not wait for the other ranks to sync
    if not trainer.is_global_zero:
        return {}
    single = _test_trainer(trainer.accelerator, progress_bar=False, limit_test_batches=cfg.trainer.limit_test_batches)
    results = single.test(task, datamodule=dm, ckpt_path=ckpt, verbose=False, weights_only=True)
    return results[0] if results else {}


def _test_trainer(accelerator: Any, *, progress_bar: bool, limit_test_batches: float | int | None = None) -> pl.Trainer:
    """A one-device trainer in :data:`TEST_PRECISION` that logs and saves nothing."""
    return pl.Trainer(
        accelerator=accelerator,
        devices=1,
        precision=TEST_PRECISION,
        logger=False,
        enable_checkpointing=False,
        enable_model_summary=False,
        enable_progress_bar=progress_bar,
        limit_test_batches=limit_test_batches,
    )


def evaluate(target: str | Path, stage: str = "test", overrides: list[str] | None = None) -> dict[str, float]:
    """Run the validation or test loop of a run directory (best checkpoint) or a ``.ckpt`` file, in float32
    (:data:`TEST_PRECISION`, as ``vitlab fit`` tests), seeded with the run's seed: terms that draw random samples
    (ViTCAE's MMD against prior samples) are the same every time a checkpoint is evaluated."""
    ckpt = locate_checkpoint(target)
    hp = checkpoint_hparams(read_checkpoint(ckpt))
    cfg = config_with_overrides(hp["config"], overrides)
    pl.seed_everything(cfg.run.seed, workers=True, verbose=False)
    dm = build_datamodule(cfg.data)
    model = create_model(cfg.model["name"], **hp["model_kwargs"])
    task = build_task(cfg, model, hp)
    quiet_lightning()
    with quiet_warnings():
        trainer = _test_trainer(cfg.trainer.accelerator, progress_bar=console_progress_bar(cfg))
        run = trainer.validate if stage == "validate" else trainer.test
        results = run(task, datamodule=dm, ckpt_path=str(ckpt), verbose=False, weights_only=True)
    return results[0] if results else {}
