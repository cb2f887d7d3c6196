"""Thin Lightning tasks around plain ``nn.Module`` models. The model math lives in ``vitlab.models``."""

from __future__ import annotations

import functools
import glob
import math
from typing import Any

import lightning.pytorch as pl
import torch
import torch.nn.functional as F
from lightning.pytorch.plugins.precision import MixedPrecision, Precision
from lightning.pytorch.utilities import GradClipAlgorithmType
from timm.optim import param_groups_weight_decay
from torch import nn
from torchmetrics.classification import MulticlassAccuracy

from vitlab.acceleration.compile_mode import choose_compile_mode
from vitlab.acceleration.compiling import classifier_objective, compiled_objective
from vitlab.acceleration.optim import adamw
from vitlab.config import OptimConfig, RunConfig
from vitlab.errors import ConfigError, VitlabError
from vitlab.family import family_of
from vitlab.layers.heads import state_in_original_order


class NonFiniteLossError(VitlabError, FloatingPointError):
    """The training loss went NaN or infinite: the run is stopped at that step."""


def param_groups(model: nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """AdamW groups by timm's ``param_groups_weight_decay``: no decay for biases, norms (1-D tensors), embeddings and
    temperatures (``model.no_weight_decay()``, by full or last name).

    Always two groups, decay first (also at ``weight_decay=0``, where timm would make one): the layout the optimizer
    state of every checkpoint has, and the one ``training.finetune.layer_decay_groups`` splits.
    """
    skip = set(getattr(model, "no_weight_decay", lambda: set())())
    excluded = [name for name, _ in model.named_parameters() if name in skip or name.rsplit(".", 1)[-1] in skip]
    split = param_groups_weight_decay(model, weight_decay=1.0, no_weight_decay_list=[glob.escape(n) for n in excluded])
    decay = [p for group in split if group["weight_decay"] > 0 for p in group["params"]]
    no_decay = [p for group in split if group["weight_decay"] == 0 for p in group["params"]]
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


def _fused_for_precision(cfg: OptimConfig, precision: str) -> bool | str:
    """``optim.fused`` under fp16 with gradient clipping: a fused AdamW unscales the gradients inside its step,
    after Lightning has clipped them still scaled, so Lightning refuses it; ``auto`` then takes torch's default.
    (bf16-mixed has no scaler: :meth:`BaseTask.configure_gradient_clipping` clips before the fused step.)"""
    if not (precision.startswith("16") and cfg.grad_clip):
        return cfg.fused
    if cfg.fused is True:
        raise ConfigError(
            f"optim.fused=true with trainer.precision={precision} and optim.grad_clip={cfg.grad_clip}: a fused AdamW "
            "unscales fp16 gradients inside its step, after clipping; use bf16-mixed, optim.grad_clip=null or "
            "optim.fused=auto"
        )
    return False


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

    @property
    def loss_config(self) -> type | None:
        """The dataclass of the config's ``loss`` section: the one the model's family declares, once, in
        ``Family.config_types["loss"]`` (what the config check reads too); None: the task takes no loss options."""
        family = family_of(self.model)
        return family.config_type("loss") if family else None

    plateau: torch.optim.lr_scheduler.ReduceLROnPlateau | None = None
    _plateau_state: dict[str, Any] | None = None

    def on_train_epoch_end(self) -> None:
        """ReduceLROnPlateau on the validation metric that picks ``best.ckpt`` when it is a loss (``monitor``), else
        on ``val/loss`` (the ViTCAE paper's schedule), before the checkpoint is saved."""
        metric = self.monitor[0] if self.monitor[1] == "min" else "val/loss"
        if self.plateau is not None and metric in self.trainer.callback_metrics:
            self.plateau.step(float(self.trainer.callback_metrics[metric]))

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        if self.plateau is not None:
            checkpoint["plateau_scheduler"] = self.plateau.state_dict()

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        # Called before configure_optimizers on resume; the state is applied when the scheduler is built.
        self._plateau_state = checkpoint.get("plateau_scheduler")
        # Called before the weights load: a checkpoint whose attention saved a head order (frozen heads, or any
        # vitlab checkpoint from before freezing moved to vitlab.dynamics) loads into plain attention modules;
        # modules the dynamics controller made FrozenHeadAttention keep theirs.
        checkpoint["state_dict"] = state_in_original_order(self, checkpoint["state_dict"])

    #: under ``trainer.compile``, :func:`~vitlab.acceleration.compiling.classifier_objective` compiled with the network
    #: as one graph, ``(x, y, label_smoothing) -> (logits, loss)`` (None: eager)
    objective: Any = None

    def setup(self, stage: str) -> None:
        """``trainer.compile``: compile the network in place, whole and block by block, and the objective with it
        (``vitlab.acceleration``), in the mode ``trainer.compile_mode`` resolves to on the run's device; the module
        tree and the state-dict keys stay those of the eager network, so checkpoints and exports are too."""
        if stage == "fit" and self.cfg.trainer.compile:
            t = self.cfg.trainer
            how = dict(precision=str(self.trainer.precision), device=self.trainer.strategy.root_device)
            choice = choose_compile_mode(t.compile_mode, self.model, batch_size=self.cfg.data.batch_size, **how)
            print(choice.line(), flush=True)
            options = dict(mode=choice.mode, backend=t.compile_backend)
            self.objective = compiled_objective(self.model, classifier_objective, **options)

    def configure_gradient_clipping(
        self, optimizer: torch.optim.Optimizer, gradient_clip_val: float | None = None, gradient_clip_algorithm=None
    ) -> None:
        """Lightning's clipping, also for a fused AdamW under bf16-mixed: Lightning's mixed-precision plugin refuses
        to clip for any optimizer that unscales gradients in its step (for fp16's scaler), but bf16 has no scaler,
        so clipping before the fused step is exact; its plain-precision code then does the clipping."""
        plugin = self.trainer.precision_plugin
        if gradient_clip_val and isinstance(plugin, MixedPrecision) and plugin.scaler is None:
            algorithm = GradClipAlgorithmType(gradient_clip_algorithm or GradClipAlgorithmType.NORM)
            Precision.clip_gradients(plugin, optimizer, gradient_clip_val, algorithm)
            return
        super().configure_gradient_clipping(optimizer, gradient_clip_val, gradient_clip_algorithm)

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
        self._stop_if_not_finite(losses["loss"])
        self._log_losses(losses, "train")
        # Filled on the device: Lightning turns a logged Python number into torch.tensor(value, device=...), a
        # blocking copy that waits for a CUDA device at every step. The epoch mean lands in metrics.jsonl.
        lr = torch.full((), self.optimizers().param_groups[0]["lr"], device=self.device)
        self.log("train/lr", lr, on_step=False, on_epoch=True)
        # Per-step curves (TensorBoard, steps.jsonl): Lightning reads them every trainer.log_every_n_steps steps
        # only, so the device is not synchronised at every step.
        self.log("train_step/loss", losses["loss"].detach(), on_step=True, on_epoch=False)
        self.log("train_step/lr", lr, on_step=True, on_epoch=False)
        return losses["loss"]

    _first_bad_step: torch.Tensor | None = None

    def _stop_if_not_finite(self, loss: torch.Tensor) -> None:
        """Stop the run at the first step whose loss is NaN or infinite, with a message that says what to change.

        On a CPU the check is free and happens at every step. On an accelerator the step of the first non-finite
        loss is kept on the device and read every ``trainer.log_every_n_steps`` steps (when Lightning reads the
        logged values anyway), so there is no host synchronisation per step.
        """
        step = self.trainer.global_step
        if loss.device.type == "cpu":
            if not torch.isfinite(loss):
                self._raise_not_finite(float(loss.detach()), step)
            return
        if self._first_bad_step is None:
            self._first_bad_step = torch.full((), -1, dtype=torch.long, device=loss.device)
        bad = ~torch.isfinite(loss.detach()) & (self._first_bad_step < 0)
        self._first_bad_step = torch.where(bad, torch.full_like(self._first_bad_step, step), self._first_bad_step)
        if (step + 1) % max(1, self.trainer.log_every_n_steps) == 0:
            first = int(self._first_bad_step)
            if first >= 0:
                self._raise_not_finite(float("nan"), first)

    def _raise_not_finite(self, value: float, step: int) -> None:
        cfg = self.optim_cfg
        clip = "off" if cfg.grad_clip is None else f"{cfg.grad_clip:g}"
        raise NonFiniteLossError(
            f"training loss is {value} at epoch {self.current_epoch + 1}, step {step}: the run diverged and was "
            f"stopped (nothing tested or exported). Lower optim.lr (now {cfg.lr:g}) or set optim.grad_clip (now "
            f"{clip}), then train again with run.overwrite=true (the run folder holds the stopped run) or another "
            "run.dir"
        )

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
        optimizer = adamw(
            self.param_groups(),
            lr=cfg.lr,
            betas=cfg.betas,
            weight_decay=cfg.weight_decay,
            fused=_fused_for_precision(cfg, str(self.trainer.precision)),
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
        # keyed by stage; "train" itself would clash with nn.Module.train. validate_args=False: the check counts the
        # distinct labels with torch.unique, a host synchronisation in every step on a GPU.
        self.accuracy = nn.ModuleDict(
            {
                f"{s}_acc": MulticlassAccuracy(num_classes, average="micro", validate_args=False)
                for s in ("train", "val", "test")
            }
        )

    def classification_losses(
        self, logits: torch.Tensor, y: torch.Tensor, stage: str, loss: torch.Tensor | None = None
    ) -> dict[str, torch.Tensor]:
        """CE (label smoothing in training; ``loss`` where computed already) and accuracy; ``y`` is ``[B]`` class
        indices or ``[B, K]`` soft."""
        if loss is None:
            loss = F.cross_entropy(logits, y, label_smoothing=self._label_smoothing(stage))
        if y.ndim == 1:
            acc = self.accuracy[f"{stage}_acc"]
            acc(logits.detach(), y)
            self.log(f"{stage}/acc", acc, on_step=False, on_epoch=True, prog_bar=True)
        return {"loss": loss}

    def _label_smoothing(self, stage: str) -> float:
        return self.optim_cfg.label_smoothing if stage == "train" else 0.0

    def compute_losses(self, batch: Any, stage: str) -> dict[str, torch.Tensor]:
        x, y = batch
        objective = self.objective or functools.partial(classifier_objective, self.model)
        logits, loss = objective(x, y, self._label_smoothing(stage))
        return self.classification_losses(logits, y, stage, loss)
