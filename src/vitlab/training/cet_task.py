"""Lightning task for CET-ViT: cross-entropy + the ramped EI regulariser + the Dynamic-K cost."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from vitlab.config import RunConfig, from_dict
from vitlab.losses.ei import ei_weight
from vitlab.training.tasks import ClassificationTask


@dataclass
class CETLossConfig:
    """The ``loss:`` section for CET-ViT (CET-ViT v4 model card: "EI loss, as actually
    implemented", and Disclosure 1 on Dynamic K).

    ``lambda_ei`` ramps from 0 at epoch ``ei_start`` to its final value at ``ei_end`` along a cosine (the card's first
    release: 0.05, epochs 50 -> 200 of 300). ``lambda_k`` weights ``E[K] / K_max`` of the Dynamic-K estimator.
    The EI variant (``full | entropy_only | none``) is the model option ``ei``.
    """

    lambda_ei: float = 0.05
    ei_start: float = 50
    ei_end: float = 200
    lambda_k: float = 0.01


class CETViTTask(ClassificationTask):
    """CE (with label smoothing / Mixup targets) + ``lambda_ei(t) * L_EI`` + ``lambda_k * E[K]/K_max``.

    Logged every epoch: the EI terms, the mean slot-usage K, and with ``dynamic_k: gumbel`` the distribution of the
    chosen K over the epoch's images (``train/k_frac_<K>``).
    """

    loss_config = CETLossConfig

    def __init__(self, model: nn.Module, *, cfg: RunConfig, hparams: dict[str, Any]) -> None:
        super().__init__(model, cfg=cfg, hparams=hparams)
        self.loss_cfg = from_dict(self.loss_config, cfg.loss, "loss")
        estimator = getattr(model, "k_estimator", None)
        candidates = list(getattr(estimator, "k_candidates", ()))
        self.register_buffer("k_counts", torch.zeros(len(candidates)), persistent=False)
        self.k_candidates = candidates

    def compute_losses(self, batch: Any, stage: str) -> dict[str, torch.Tensor]:
        x, y = batch
        logits, aux = self.model.forward_with_aux(x)
        losses = self.classification_losses(logits, y, stage)
        weight = ei_weight(self.current_epoch, self.loss_cfg.lambda_ei, self.loss_cfg.ei_start, self.loss_cfg.ei_end)
        reg = aux.regularization(weight, self.loss_cfg.lambda_k)
        losses["loss"] = losses["loss"] + reg
        losses["ce"] = losses["loss"].detach() - reg.detach()
        losses["ei"] = aux.ei_loss.detach()
        for key in ("reversibility", "norm_entropy", "degen"):
            losses[key] = aux.ei[key].detach().mean()
        losses["slot_k"] = aux.slot_usage_k.detach().float().mean()
        if aux.k_chosen is not None:
            losses["k_expected"] = aux.k_expected.detach().mean()
            if stage == "train":
                chosen = aux.k_chosen.detach()
                for i, k in enumerate(self.k_candidates):
                    self.k_counts[i] += (chosen == k).sum()
        return losses

    def on_train_epoch_end(self) -> None:
        super().on_train_epoch_end()
        total = self.k_counts.sum()
        if self.k_candidates and total > 0:
            for k, count in zip(self.k_candidates, self.k_counts / total, strict=True):
                self.log(f"train/k_frac_{k}", count)
        self.k_counts.zero_()
