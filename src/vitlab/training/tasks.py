"""Thin Lightning tasks around plain ``nn.Module`` models. The model math lives in ``vitlab.models``."""

from __future__ import annotations

import math
from typing import Any

import lightning.pytorch as pl
import torch
import torch.nn.functional as F
from torch import nn
from torchmetrics.classification import MulticlassAccuracy

from vitlab.config import OptimConfig, RunConfig


def param_groups(model: nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """AdamW groups: no decay for biases, norms (1-D tensors), embeddings and temperatures
    (``model.no_weight_decay()``)."""
    skip = set(getattr(model, "no_weight_decay", lambda: set())())
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        (no_decay if p.ndim <= 1 or name in skip or name.split(".")[-1] in skip else decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


class WarmupCosine:
    """LR multiplier: linear warm-up over ``warmup`` steps, then cosine decay to ``min_ratio`` at ``total`` steps.
    A callable object (not a closure) so it travels in checkpoints."""

    def __init__(self, warmup: int, total: int, min_ratio: float) -> None:
        self.warmup, self.total, self.min_ratio = warmup, max(total, 1), min_ratio

    def __call__(self, step: int) -> float:
        if step < self.warmup:
            return (step + 1) / self.warmup
        progress = min(1.0, (step - self.warmup) / max(1, self.total - self.warmup))
        return self.min_ratio + (1 - self.min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


class BaseTask(pl.LightningModule):
    """Optimiser, schedule and metric plumbing shared by every task. Subclasses implement ``compute_losses``.

    ``hparams`` (the resolved config, the model's constructor arguments and the data description) is saved in
    every checkpoint as plain data, so checkpoints load with ``torch.load(weights_only=True)``.
    """

    #: the validation metric that picks ``best.ckpt``, and whether lower or higher is better
    monitor: tuple[str, str] = ("val/loss", "min")

    def __init__(self, model: nn.Module, *, cfg: RunConfig, hparams: dict[str, Any]) -> None:
        super().__init__()
        self.model = model
        self.cfg = cfg
        self.optim_cfg: OptimConfig = cfg.optim
        self.save_hyperparameters(hparams)

    plateau: torch.optim.lr_scheduler.ReduceLROnPlateau | None = None
    _plateau_state: dict[str, Any] | None = None

    def on_train_epoch_end(self) -> None:
        """ReduceLROnPlateau on the validation loss (the ViTCAE paper's schedule), before the checkpoint is saved."""
        if self.plateau is not None and "val/loss" in self.trainer.callback_metrics:
            self.plateau.step(float(self.trainer.callback_metrics["val/loss"]))

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        if self.plateau is not None:
            checkpoint["plateau_scheduler"] = self.plateau.state_dict()

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        # Called before configure_optimizers on resume; the state is applied when the scheduler is built.
        self._plateau_state = checkpoint.get("plateau_scheduler")

    def extra_callbacks(self, run_dir: Any) -> list[pl.Callback]:
        """Task-specific callbacks (e.g. the attention-dynamics controller)."""
        return []

    def on_run_end(self, run_dir: Any, datamodule: Any) -> None:
        """Called on rank 0 after fit, test and export (e.g. to write generated grids)."""

    def forward(self, x: torch.Tensor) -> Any:
        return self.model(x)

    def compute_losses(self, batch: Any, stage: str) -> dict[str, torch.Tensor]:
        raise NotImplementedError

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        losses = self.compute_losses(batch, "train")
        self._log_losses(losses, "train")
        # A host float, so no device sync; the epoch mean lands in metrics.jsonl and TensorBoard.
        self.log("train/lr", self.optimizers().param_groups[0]["lr"], on_step=False, on_epoch=True)
        return losses["loss"]

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self._log_losses(self.compute_losses(batch, "val"), "val")

    def test_step(self, batch: Any, batch_idx: int) -> None:
        self._log_losses(self.compute_losses(batch, "test"), "test")

    def _log_losses(self, losses: dict[str, torch.Tensor], stage: str) -> None:
        # Epoch-level only: logging on_step would make the progress bar read a device value every step.
        for key, value in losses.items():
            self.log(
                f"{stage}/{key}",
                value.detach(),
                on_step=False,
                on_epoch=True,
                prog_bar=key == "loss",
                sync_dist=stage != "train",
            )

    def param_groups(self) -> list[dict[str, Any]]:
        """The optimiser's parameter groups: :func:`param_groups`, split by layer when ``finetune.layer_decay``."""
        groups = param_groups(self.model, self.optim_cfg.weight_decay)
        if self.cfg.finetune.layer_decay is None:
            return groups
        from vitlab.training.finetune import layer_decay_groups

        return layer_decay_groups(self.model, groups, self.optim_cfg.lr, self.cfg.finetune.layer_decay)

    def configure_optimizers(self) -> Any:
        cfg = self.optim_cfg
        optimizer = torch.optim.AdamW(
            self.param_groups(), lr=cfg.lr, betas=tuple(cfg.betas), weight_decay=cfg.weight_decay
        )
        if cfg.schedule == "none":
            return optimizer
        if cfg.schedule == "plateau":
            # Stepped by this task in on_train_epoch_end, not by Lightning: Lightning steps epoch schedulers after
            # the epoch's checkpoint is written, so a resumed run would miss one step (see on_save_checkpoint).
            self.plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(
                optimizer, mode="min", factor=cfg.plateau_factor, patience=cfg.plateau_patience, min_lr=cfg.min_lr
            )
            if self._plateau_state is not None:
                self.plateau.load_state_dict(self._plateau_state)
            return optimizer
        if cfg.schedule == "cosine":
            total = int(self.trainer.estimated_stepping_batches)
            steps_per_epoch = max(1, total // max(1, self.trainer.max_epochs or 1))
            warmup = round(cfg.warmup_epochs * steps_per_epoch)
            fn = WarmupCosine(warmup, total, cfg.min_lr / cfg.lr if cfg.lr > 0 else 0.0)
            scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, fn)
            return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}
        raise ValueError(f"unknown optim.schedule {cfg.schedule!r}; use cosine, plateau or none")


class ClassificationTask(BaseTask):
    """Cross-entropy classification with label smoothing and optional soft (Mixup/CutMix) targets."""

    monitor = ("val/acc", "max")

    def __init__(self, model: nn.Module, *, cfg: RunConfig, hparams: dict[str, Any]) -> None:
        super().__init__(model, cfg=cfg, hparams=hparams)
        num_classes = hparams["data_info"]["num_classes"]
        self.num_classes = num_classes
        # keyed by stage; "train" itself would clash with nn.Module.train
        self.accuracy = nn.ModuleDict(
            {f"{s}_acc": MulticlassAccuracy(num_classes, average="micro") for s in ("train", "val", "test")}
        )

    def classification_losses(self, logits: torch.Tensor, y: torch.Tensor, stage: str) -> dict[str, torch.Tensor]:
        """CE (label smoothing in training) and accuracy; ``y`` is ``[B]`` class indices or ``[B, K]`` soft."""
        smoothing = self.optim_cfg.label_smoothing if stage == "train" else 0.0
        loss = F.cross_entropy(logits, y, label_smoothing=smoothing)
        if y.ndim == 1:
            acc = self.accuracy[f"{stage}_acc"]
            acc(logits.detach(), y)
            self.log(f"{stage}/acc", acc, on_step=False, on_epoch=True, prog_bar=True)
        return {"loss": loss}

    def compute_losses(self, batch: Any, stage: str) -> dict[str, torch.Tensor]:
        x, y = batch
        out = self.model(x)
        logits = out if isinstance(out, torch.Tensor) else out.logits
        return self.classification_losses(logits, y, stage)
