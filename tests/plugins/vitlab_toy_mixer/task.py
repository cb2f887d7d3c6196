"""The toy family's task: the cross-entropy of every classifier plus ``logit_penalty`` times the mean squared logit."""

from typing import Any

from vitlab.config.loss import build_loss
from vitlab.training.tasks import ClassificationTask


class ToyMixerTask(ClassificationTask):
    def __init__(self, model, *, cfg, hparams) -> None:
        super().__init__(model, cfg=cfg, hparams=hparams)
        self.loss_cfg = build_loss(self.loss_config, cfg.loss)

    def compute_losses(self, batch: Any, stage: str) -> dict:
        x, y = batch
        logits = self.model(x)
        losses = self.classification_losses(logits, y, stage)
        losses["loss"] = losses["loss"] + self.loss_cfg.logit_penalty * logits.pow(2).mean()
        return losses
