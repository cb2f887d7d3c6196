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
from collections.abc import Callable
from typing import Any

import lightning.pytorch as pl
import torch
from torch import nn

from vitlab.atomic import append_line, atomic_write_text
from vitlab.dynamics.layer_cache import CACHE_FILE, CachedPrefix, PrefixCache, check_cache
from vitlab.dynamics.layer_freezing import LayerFreezer, next_prefix, prefix_modules
from vitlab.dynamics.policy import DynamicsPolicy
from vitlab.dynamics.probe import select_probe
from vitlab.errors import ConfigError
from vitlab.jsonio import strict_dumps
from vitlab.rundir import DYNAMICS_DIR, DYNAMICS_FILE, LAYERS_FILE

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
        self.timings = {}

        def identical_on_every_rank(value: Any) -> Any:  # identical inputs -> identical schedules and frozen masks
            return trainer.strategy.broadcast(value, src=0) if trainer.world_size > 1 else value

        if self.config.measures:
            record = self._measure_and_advance(epoch, identical_on_every_rank)
        else:  # layers frozen by a signal that reads no attention: no probe pass
            record, self.epoch = {"epoch": epoch}, epoch
        if self.layers is not None:
            layers = self._layer_step(trainer, epoch, record.get("converged"), identical_on_every_rank)
            record["frozen_layers"] = layers["frozen_layers"]
        # The learning rate the epoch just trained with (ReduceLROnPlateau steps after this hook): the confound of
        # the drift (docs/dynamics.md, drift against learning rate).
        record["lr"] = trainer.optimizers[0].param_groups[0]["lr"] if trainer.optimizers else None
        record["seconds"] = time.perf_counter() - started
        # the probe passes include their kappa; the rest of seconds is the schedule, the tracker and the freezing
        record["seconds_parts"] = dict(self.timings)
        record["epoch_seconds"] = None if self._epoch_started is None else started - self._epoch_started
        if trainer.is_global_zero:
            if self.config.measures:
                self._append(DYNAMICS_FILE, epoch, record)
            if self.layers is not None:
                steps = self._epoch_steps or None
                seconds = {"epoch_seconds": record["epoch_seconds"], "steps": steps}
                if self.cached is not None:
                    seconds["cached_steps"], seconds["cached_val_batches"] = self._cached_steps, self._cached_val
                self._append(LAYERS_FILE, epoch, {**layers, **seconds})
        if record.get("drift") is not None:
            self._log_scalars(trainer, epoch, record)
        return record

    def _append(self, name: str, epoch: int, record: dict[str, Any]) -> None:
        if epoch == 0:  # a new record starts the file
            atomic_write_text(self.run_dir / name, "")
        append_line(self.run_dir / name, strict_dumps(record))

    def _layer_step(
        self, trainer: pl.Trainer, epoch: int, converged: list | None, identical_on_every_rank: Callable[[Any], Any]
    ) -> dict[str, Any]:
        """Grow (or, under thaw, shrink) the frozen prefix as ``layer_signal`` says; every rank freezes rank 0's
        choice at the same step. Returns the epoch's ``layers.jsonl`` record."""
        layers = self.layers
        fraction = epoch / trainer.max_epochs if trainer.max_epochs and trainer.max_epochs > 0 else 0.0
        k, read = next_prefix(layers, self.config, fraction, None if converged is None else torch.tensor(converged))
        k = identical_on_every_rank(k)
        if k != layers.frozen:
            layers.freeze(k, epoch)
        return {
            "epoch": epoch,
            "layer_signal": self.config.layer_signal,
            "blocks": layers.blocks,
            "frozen_layers": layers.frozen,
            "frozen_share": layers.frozen_share(),
            "freeze_epochs": list(layers.freeze_epochs),
            **read,
        }

    def _log_scalars(self, trainer: pl.Trainer, epoch: int, record: dict[str, Any]) -> None:
        scalars = {
            "dynamics/non_converged": record["non_converged"],
            "dynamics/frozen": int(self.frozen.sum()),
            "dynamics/mean_drift": record["mean_drift"],
            "dynamics/mean_kappa": float(self.kappa.mean()),
            "dynamics/mean_tau": float(self.temperatures().mean()),
            "dynamics/seconds": record["seconds"],
            "epoch": epoch - 1,  # the training epoch that just ended (Lightning counts from 0)
        }
        if self.layers is not None:
            scalars["dynamics/frozen_layers"] = self.layers.frozen
        for logger in trainer.loggers:
            logger.log_metrics(scalars, step=trainer.global_step)

    def _measure_and_advance(self, epoch: int, identical_on_every_rank: Callable[[Any], Any]) -> dict[str, Any]:
        """The probe passes and :meth:`advance`: the epoch's ``dynamics.jsonl`` record, without its timings."""
        cfg = self.config
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
        return self.advance(measurement, epoch, extend, model_tau, rate)

    # --- Lightning hooks --------------------------------------------------------------------------------------------
    @staticmethod
    def _model_of(pl_module: pl.LightningModule) -> nn.Module:
        return getattr(pl_module, "model", pl_module)

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage == "fit":
            self.attach(self._model_of(pl_module))

    def check(self, model: nn.Module, example: torch.Tensor | None = None) -> tuple[list[tuple[str, Any]], Any] | None:
        """:meth:`DynamicsPolicy.check` where the controller probes the attention, and what layer freezing needs
        of the model (``freeze: layers``); ``vitlab fit`` calls it before the run folder exists."""
        cfg = self.config
        if cfg.freezes_layers:
            LayerFreezer.check(model, cfg.max_frozen_layers)
        if cfg.cache_frozen:
            check_cache(prefix_modules(model, cfg.max_frozen_layers))
        return super().check(model, example) if cfg.measures else None

    def attach(self, model: nn.Module) -> None:
        """:meth:`DynamicsPolicy.attach`, and the layer freezer under ``freeze: layers`` (which alone, when no
        signal reads the attention, attaches nothing else)."""
        cfg = self.config
        if cfg.freezes_layers:
            self.layers = LayerFreezer(model, cfg.max_frozen_layers)
        if cfg.measures:
            super().attach(model)
        else:
            self.model = model
            if self._pending_state is not None:
                self._load_pending_state()
        if self.layers is not None:
            self.layers.module_blocks = [self.layers.layer_of_module(name) for name in self.module_names]
            # what thawing gives back: the parameters that train once the policy has set up (mode fixed: no tau)
            self.layers.trainable = {id(p) for p in model.parameters() if p.requires_grad}
        if cfg.cache_frozen:
            cache = PrefixCache(int(cfg.cache_memory_mb * 2**20), self.run_dir / CACHE_FILE, capacity=0)
            self.cached = CachedPrefix(self.layers.block_modules(model), cache)

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.layers is not None:
            self.layers.apply_restored()
            for optimizer in trainer.optimizers:
                self.layers.attach(optimizer)
        if self.cached is not None:  # the spill file has a row for every training and validation image
            self.cached.cache.capacity = _images_in(trainer.train_dataloader) + _images_in(
                trainer.datamodule.val_dataloader() if trainer.datamodule is not None else None
            )
            if self.epoch is None and self.config.layer_signal == "static":  # frozen from the first step
                self.layers.freeze(min(self.config.freeze_layers, self.layers.cap), epoch=0)
        if self.probe is None and self.config.measures:
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
        self._rate_sum, self._rate_steps, self._epoch_steps, self._cached_steps, self._cached_val = 0.0, 0, 0, 0, 0

    def on_before_optimizer_step(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, optimizer: torch.optim.Optimizer
    ) -> None:
        if self.layers is not None and self.config.layer_signal == "gradnorm":
            self.layers.accumulate_gradient_norms()

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, index: int) -> None:
        # the rate this step trains with (a python float: no device sync); the epoch's mean is the response rule's unit
        self._epoch_steps += 1
        if self.cached is not None:
            images = batch[0] if isinstance(batch, list | tuple) else batch
            self._cached_steps += self.cached.start_batch(images, self.layers.frozen)

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, index: int
    ) -> None:
        if self.cached is not None:
            self.cached.end_batch()
        if trainer.optimizers:
            self._rate_sum += trainer.optimizers[0].param_groups[0]["lr"]
            self._rate_steps += 1

    def on_validation_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, index: int, dataloader_idx: int = 0
    ) -> None:
        # validation images are fixed and evaluation draws nothing at random: the frozen prefix's outputs are
        # cached for them too, so validating every epoch skips the frozen blocks from the second time on
        if self.cached is not None:
            images = batch[0] if isinstance(batch, list | tuple) else batch
            self._cached_val += self.cached.start_batch(images, self.layers.frozen)

    def on_validation_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: Any,
        index: int,
        dataloader_idx: int = 0,
    ) -> None:
        if self.cached is not None:
            self.cached.end_batch()

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.step(trainer, epoch=trainer.current_epoch + 1)

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.guard is not None:
            self.guard.detach()
        if self.layers is not None:
            self.layers.detach()
        if self.cached is not None:
            self.cached.end_batch()
            self.cached.cache.clear(0)
            self.cached.cache.spill.unlink(missing_ok=True)  # a cache, not a result

    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.is_global_zero and (self.run_dir / DYNAMICS_FILE).exists():
            from vitlab.diagnostics.plots import draw_run

            draw_run(self.run_dir / DYNAMICS_FILE, self.run_dir / PLOTS_DIR)


def _images_in(loader: Any) -> int:
    """The images of ``loader``'s dataset (0 without a loader or a sized dataset)."""
    try:
        return len(loader.dataset)
    except (AttributeError, TypeError):
        return 0
