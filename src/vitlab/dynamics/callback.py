"""The attention-dynamics controller of ViTCAE as a Lightning callback (ViTCAE paper, eq. 20 and 26;
docs/dynamics.md).

Once before training (epoch 0) and at the end of every training epoch it probes a fixed batch of validation images,
measures each controlled head's drift ``d``, consensus clusters ``kappa`` and temperature ``tau``, sets
``tau <- 1 / (1 + alpha * d)`` (eq. 20, mode ``schedule``), freezes the converged heads (eq. 26,
:class:`~vitlab.diagnostics.convergence.ConvergenceTracker`, :class:`~vitlab.dynamics.freezing.FrozenHeadGuard`) and
appends one line to ``<run_dir>/dynamics.jsonl``: docs/dynamics.md, "What happens each epoch".

Its state (epoch, tracker, previous distributions, frozen masks) rides in the checkpoint, so a resumed run continues
the same schedule. The pure algorithms live in :mod:`vitlab.diagnostics.dynamics`, the decisions in
:mod:`vitlab.dynamics.policy`.
"""

from __future__ import annotations

import time
from typing import Any

import lightning.pytorch as pl
import torch
from torch import nn

from vitlab.atomic import append_line, atomic_write_text
from vitlab.dynamics.policy import DynamicsPolicy
from vitlab.dynamics.probe import select_probe
from vitlab.errors import ConfigError
from vitlab.jsonio import strict_dumps
from vitlab.rundir import DYNAMICS_DIR, DYNAMICS_FILE

PLOTS_DIR = DYNAMICS_DIR


class DynamicsController(DynamicsPolicy, pl.Callback):
    """ViTCAE's attention-dynamics controller (ViTCAE paper, eq. 20 and 26) for any model of shared ``Attention``.

    Use it through the config (``dynamics: {mode: schedule}`` in a run's YAML) or directly::

        trainer = pl.Trainer(callbacks=[DynamicsController(DynamicsConfig(mode="schedule"), run_dir)])

    The model is ``pl_module.model`` when the LightningModule wraps one (vitlab's tasks), else ``pl_module``. The
    probe comes from ``trainer.datamodule.val_dataloader()`` unless ``probe: [P, C, H, W]`` is given.
    Outside Lightning, :meth:`attach` a model, then :meth:`measure` and :meth:`advance` once per epoch.
    """

    def step(self, trainer: pl.Trainer, epoch: int) -> dict[str, Any]:
        """Measure, advance, write the record and log its scalars: the controller's work for one epoch."""
        started = time.perf_counter()
        cfg = self.config
        self.timings = {}

        def identical_on_every_rank(value: Any) -> Any:  # identical inputs -> identical schedules and frozen masks
            return trainer.strategy.broadcast(value, src=0) if trainer.world_size > 1 else value

        first = len(self.probe) if cfg.probe_min is None else cfg.probe_min
        measurement = identical_on_every_rank(
            self._timed("probe", self.measure, self.probe[:first], kappa=self.wants_kappa(epoch))
        )
        extend = None
        if first < len(self.probe):

            def extend() -> torch.Tensor:
                return identical_on_every_rank(
                    self._timed("probe", self.measure, self.probe[first:], kappa=False)
                ).distributions

        model_tau = None
        if cfg.log_model_tau and cfg.probe_tau == "unit" and cfg.mode != "fixed":
            model_tau = identical_on_every_rank(
                self._timed("probe_model_tau", self.measure, self.probe[:first], kappa=False, probe_tau="model")
            )
            model_tau = model_tau.distributions
        rate = self._rate_sum / self._rate_steps if self._rate_steps else None
        self._rate_sum, self._rate_steps = 0.0, 0
        record = self.advance(measurement, epoch, extend, model_tau, rate)
        # The learning rate the epoch just trained with (ReduceLROnPlateau steps after this hook): the confound of
        # the drift (docs/dynamics.md, drift against learning rate).
        record["lr"] = trainer.optimizers[0].param_groups[0]["lr"] if trainer.optimizers else None
        record["seconds"] = time.perf_counter() - started
        # the probe passes include their kappa; the rest of seconds is the schedule, the tracker and the freezing
        record["seconds_parts"] = dict(self.timings)
        record["epoch_seconds"] = None if self._epoch_started is None else started - self._epoch_started
        if trainer.is_global_zero:
            if epoch == 0:  # a new record starts the file
                atomic_write_text(self.run_dir / DYNAMICS_FILE, "")
            append_line(self.run_dir / DYNAMICS_FILE, strict_dumps(record))
        if record["drift"] is not None:
            scalars = {
                "dynamics/non_converged": record["non_converged"],
                "dynamics/frozen": int(self.frozen.sum()),
                "dynamics/mean_drift": record["mean_drift"],
                "dynamics/mean_kappa": float(self.kappa.mean()),
                "dynamics/mean_tau": float(self.temperatures().mean()),
                "dynamics/seconds": record["seconds"],
                "epoch": epoch - 1,  # the training epoch that just ended (Lightning counts from 0)
            }
            for logger in trainer.loggers:
                logger.log_metrics(scalars, step=trainer.global_step)
        return record

    # --- Lightning hooks --------------------------------------------------------------------------------------------
    @staticmethod
    def _model_of(pl_module: pl.LightningModule) -> nn.Module:
        return getattr(pl_module, "model", pl_module)

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage == "fit":
            self.attach(self._model_of(pl_module))

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.probe is None:
            datamodule = trainer.datamodule
            if datamodule is None:
                raise ConfigError(
                    "the dynamics controller probes validation images: fit with a datamodule that has a "
                    "val_dataloader, or pass probe=[P, C, H, W] to DynamicsController"
                )
            self.probe = select_probe(datamodule.val_dataloader(), self.config.probe_size, self.config.probe_seed)
        if self.guard is not None:  # None: attention observed only
            self.guard.freeze(self.frozen if self.frozen is not None else torch.zeros(self.shape, dtype=torch.bool))
            for optimizer in trainer.optimizers:
                self.guard.attach(optimizer)
        # A resumed run has its measurements up to the checkpoint. When the checkpoint was written at validation end,
        # before this callback's epoch end (check_val_every_n_epoch != 1), Lightning replays on_train_epoch_end.
        if self.epoch is None:
            self.step(trainer, epoch=0)

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._epoch_started = time.perf_counter()
        self._rate_sum, self._rate_steps = 0.0, 0

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, index: int) -> None:
        # the rate this step trains with (a python float: no device sync); the epoch's mean is the response rule's unit
        if trainer.optimizers:
            self._rate_sum += trainer.optimizers[0].param_groups[0]["lr"]
            self._rate_steps += 1

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.step(trainer, epoch=trainer.current_epoch + 1)

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.guard is not None:
            self.guard.detach()

    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.is_global_zero and (self.run_dir / DYNAMICS_FILE).exists():
            from vitlab.diagnostics.plots import draw_run

            draw_run(self.run_dir / DYNAMICS_FILE, self.run_dir / PLOTS_DIR)
