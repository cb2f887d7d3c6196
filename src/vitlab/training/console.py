"""What a run prints on the console: a progress bar on a terminal, one line per epoch in a log file, and none of
Lightning's start-up noise or warnings that a user cannot act on."""

from __future__ import annotations

import contextlib
import logging
import sys
import warnings
from collections.abc import Iterator
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import TQDMProgressBar

from vitlab.config import RunConfig


def console_progress_bar(cfg: RunConfig) -> bool:
    """A progress bar only on a terminal: a log file gets one line per epoch (:class:`EpochLines`) instead."""
    return cfg.trainer.enable_progress_bar and sys.stdout.isatty() and sys.stderr.isatty()


@contextlib.contextmanager
def quiet_warnings() -> Iterator[None]:
    """Lightning's warnings that say nothing about this run (:data:`QUIET_WARNINGS`), silenced for the block."""
    with warnings.catch_warnings():
        for message in QUIET_WARNINGS:
            warnings.filterwarnings("ignore", message=message)
        yield


#: Lightning's and torch's warnings that say nothing a user can act on in a vitlab run
QUIET_WARNINGS = (
    ".*does not have many workers.*",
    ".*number of training batches.*",
    ".*LeafSpec.*is deprecated.*",  # Lightning's use of torch's pytree
    ".*Checkpoint directory .* exists and is not empty.*",  # a resume
    ".*The dirpath has changed from.*",  # a resumed copy of a run, or a checkpoint tested outside its run
    ".*callbacks used to create the checkpoint need to be provided.*",  # vitlab test: a checkpoint's own callbacks
    ".*all_gather.*deprecated.*",  # Lightning's all_gather under DDP (torch.distributed's old API)
    ".*_all_gather_base.*",
    ".*recommended to use `Trainer\\(devices=1, num_nodes=1\\)`.*",  # vitlab tests on one process (test_once)
    ".*`self.log\\(.*sync_dist=True.*",
)


class ProgressBar(TQDMProgressBar):
    """Lightning's progress bar without the logger's version (``v_num``), which means nothing in a run directory."""

    def get_metrics(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> dict[str, Any]:
        metrics = super().get_metrics(trainer, pl_module)
        metrics.pop("v_num", None)
        return metrics


class EpochLines(pl.Callback):
    """One line per epoch on stdout, for logs that go to a file (where a progress bar writes a line per update):
    ``epoch 3/10  train/loss 0.512  val/loss 0.430  val/acc 0.912  lr 9.3e-04  12.3 s``.

    Lightning hands an epoch's training values over after the epoch-end hooks, so the line is printed when the
    next epoch starts, and when training ends.
    """

    KEYS = ("train/loss", "val/loss")

    def __init__(self) -> None:
        self._pending: int | None = None

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._pending = trainer.current_epoch

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._print(trainer)

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._print(trainer)

    def _print(self, trainer: pl.Trainer) -> None:
        if self._pending is None or not trainer.is_global_zero:
            return
        metrics = {k: float(v) for k, v in trainer.callback_metrics.items() if getattr(v, "numel", lambda: 1)() == 1}
        parts = [f"epoch {self._pending + 1}/{trainer.max_epochs}"]
        keys = [*self.KEYS, *sorted(k for k in metrics if k.endswith("/acc") and k.startswith(("train/", "val/")))]
        parts += [f"{key} {metrics[key]:.4g}" for key in keys if key in metrics]
        if "train/lr" in metrics:
            parts.append(f"lr {metrics['train/lr']:.2e}")
        if "time/epoch_s" in metrics:
            parts.append(f"{metrics['time/epoch_s']:.1f} s")
        print("  ".join(parts), flush=True)
        self._pending = None


#: Lightning's start-up lines that say nothing about this run (advertisements, absent hardware, internals)
_LIGHTNING_NOISE = (
    "💡 Tip",
    "TPU available",
    "GPU available: False",  # a CPU-only machine; a GPU's line ("GPU available: True (cuda), used: ...") is kept
    "HPU available",
    "Loading `train_dataloader`",
    "`Trainer.fit` stopped: `max_epochs=",  # the run's plan, not news; other reasons to stop are kept
    "Restoring states from the checkpoint path",
    "Loaded model weights from the checkpoint",
    "Using bfloat16 Automatic Mixed Precision",  # vitlab's first line names the precision, and why
    "Using 16bit Automatic Mixed Precision",
)


class _DropLightningNoise(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.getMessage()).lstrip().startswith(_LIGHTNING_NOISE)


def quiet_lightning() -> None:
    """Drop Lightning's advertisements and internal notes from the console (idempotent)."""
    for name in ("lightning.pytorch.utilities.rank_zero", "lightning.fabric.utilities.rank_zero"):
        log = logging.getLogger(name)
        if not any(isinstance(f, _DropLightningNoise) for f in log.filters):
            log.addFilter(_DropLightningNoise())
