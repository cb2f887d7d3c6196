"""Lightning task for ViTCAE: the eq. 23-25 objective with its KL -> IMQ-MMD curriculum, the paper's recipe."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from vitlab.config import RunConfig, from_dict
from vitlab.errors import ConfigError
from vitlab.losses.vitcae import ViTCAELossConfig, vitcae_loss
from vitlab.training.tasks import ClassificationTask


class ViTCAETask(ClassificationTask):
    """Trains :class:`~vitlab.models.vitcae.ViTCAE` on ``L_total(t)`` of eq. 25 (``loss:`` section of the config:
    :class:`~vitlab.losses.vitcae.ViTCAELossConfig`). Every term is logged separately every epoch; the accuracy
    of the classifier on ``mu_cls`` is the classification accuracy of the paper's Table I.

    The model reconstructs the normalised input; reconstruction metrics in pixel space come from
    :func:`vitlab.evaluation.generative.run_generative_tasks`, which runs after training.
    """

    loss_config = ViTCAELossConfig

    #: best.ckpt by the validation objective (the quantity the paper's ReduceLROnPlateau watches): an autoencoder
    #: picked by accuracy alone can keep an early, blurry decoder.
    monitor = ("val/loss", "min")

    def __init__(self, model: nn.Module, *, cfg: RunConfig, hparams: dict[str, Any]) -> None:
        super().__init__(model, cfg=cfg, hparams=hparams)
        self.loss_cfg = from_dict(self.loss_config, cfg.loss, "loss")

    def compute_losses(self, batch: Any, stage: str) -> dict[str, torch.Tensor]:
        x, y = batch
        if y.ndim != 1:
            raise ConfigError("ViTCAE needs hard labels: set data.augment.mixup_alpha=0 and cutmix_alpha=0")
        out = self.model(x)
        # eq. 25 counts epochs from 1; Lightning from 0. Evaluation uses the objective of the epoch being trained.
        terms = vitcae_loss(out, x, y, epoch=self.current_epoch + 1, cfg=self.loss_cfg)
        acc = self.accuracy[f"{stage}_acc"]
        acc(out.logits.detach(), y)
        self.log(f"{stage}/acc", acc, on_step=False, on_epoch=True, prog_bar=True)
        return terms

    def on_run_end(self, run_dir: Path, datamodule: Any) -> None:
        if not self.cfg.run.generate:
            return
        from vitlab.evaluation.generative import run_generative_tasks

        run_generative_tasks(
            self.model.eval(), datamodule, Path(run_dir) / "generate", seed=self.cfg.run.seed, device=self.device
        )
