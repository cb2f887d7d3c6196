"""Lightning task for CET-ViT: cross-entropy + the ramped EI regulariser + the Dynamic-K cost."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from vitlab.config import RunConfig
from vitlab.config.loss import build_loss
from vitlab.families.cet_vit.config import CETLossConfig
from vitlab.families.cet_vit.ei import ei_weight
from vitlab.families.cet_vit.slots import exact_k_targets
from vitlab.training.tasks import ClassificationTask


class CETViTTask(ClassificationTask):
    """CE (with label smoothing / Mixup targets) + ``lambda_ei(t) * L_EI`` + ``lambda_k * E[K]/K_max``.

    ``train/loss`` and ``val/loss`` hold the whole objective at that epoch; ``test/loss`` is the cross-entropy
    alone (``test/ce``), the same in ``vitlab fit`` and ``vitlab test``, and comparable with every other classifier;
    the regulariser's terms are logged beside it (``test/ei``, ``test/k_expected``, ...).

    Logged every epoch: the EI terms, the mean slot-usage K, and with ``dynamic_k: gumbel`` the distribution of the
    chosen K over the epoch's images (``train/k_frac_<K>``).
    """

    def __init__(self, model: nn.Module, *, cfg: RunConfig, hparams: dict[str, Any]) -> None:
        super().__init__(model, cfg=cfg, hparams=hparams)
        self.loss_cfg = build_loss(self.loss_config, cfg.loss)
        estimator = getattr(model, "k_estimator", None)
        candidates = list(getattr(estimator, "k_candidates", ()))
        self.register_buffer("k_counts", torch.zeros(len(candidates)), persistent=False)
        self.k_candidates = candidates

    def compute_losses(self, batch: Any, stage: str) -> dict[str, torch.Tensor]:
        x, y = batch
        lc = self.loss_cfg
        weight = ei_weight(self.current_epoch, lc.lambda_ei, lc.ei_start, lc.ei_end, lc.ei_schedule)
        # No SVD in training when the EI term cannot reach the loss; evaluation still reports the terms.
        logits, aux = self.model.forward_with_aux(x, compute_ei=stage != "train" or weight > 0)
        losses = self.classification_losses(logits, y, stage)
        reg, extras = regularisation(self.model, aux, y, weight, lc, self.k_candidates)
        losses.update(extras)
        ce = losses["loss"].detach()
        # The test loss is the cross-entropy alone, as for every classifier: the regulariser's weight follows the
        # training epoch, which `vitlab test` (epoch 0) and the test at the end of `vitlab fit` do not share.
        if stage != "test":
            losses["loss"] = losses["loss"] + reg
        losses["ce"] = ce
        losses["ei"] = aux.ei_loss.detach()
        for key in ("reversibility", "norm_entropy", "degen"):
            if key in aux.ei:
                losses[key] = aux.ei[key].detach().mean()
        if aux.slot_usage_k is not None:  # None with grouping: none (no V-CEO)
            losses["slot_k"] = aux.slot_usage_k.detach().float().mean()
        if aux.vceo_margin is not None:
            losses["vceo_margin"] = aux.vceo_margin.mean()
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


def regularisation(
    model: nn.Module, aux: Any, y: torch.Tensor, weight: float, lc: CETLossConfig, k_candidates: list[int]
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """``lambda_ei * L_EI + lambda_k * E[K]/K_max`` at EI weight ``weight`` and, with ``dynamic_k: exact``, the
    estimator's fit to ``argmin_c (L_c + lambda_k K_c / K_max)`` (CET-ViT v4 model card, Disclosure 1), with the
    logged ``k_fit`` and ``k_gain``."""
    reg = aux.regularization(weight, lc.lambda_k)
    extras: dict[str, torch.Tensor] = {}
    if aux.candidate_logits is not None:  # dynamic_k: exact
        per_candidate = torch.stack([F.cross_entropy(c, y, reduction="none") for c in aux.candidate_logits])
        targets = exact_k_targets(per_candidate, k_candidates, model.num_slots, lc.lambda_k)
        k_fit = F.cross_entropy(aux.k_logits, targets)
        reg = reg + lc.k_fit_weight * k_fit
        extras["k_fit"] = k_fit.detach()
        # the loss the estimator's choice gains against always taking the largest budget (negative = better)
        chosen = aux.k_logits.detach().argmax(-1)
        extras["k_gain"] = (per_candidate.gather(0, chosen[None]) - per_candidate[-1:]).mean()
    return reg, extras


def bench_objective(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """The training loss ``vitlab bench`` times for a CET-ViT: what :class:`CETViTTask` computes once the EI ramp has
    reached its final weight (the loss section's defaults), the EI term's SVD and the Dynamic-K fit included."""
    lc = CETLossConfig()
    logits, aux = model.forward_with_aux(x, compute_ei=lc.lambda_ei > 0)
    estimator = getattr(model, "k_estimator", None)
    candidates = list(getattr(estimator, "k_candidates", ()))
    reg, _ = regularisation(model, aux, y, lc.lambda_ei, lc, candidates)
    return F.cross_entropy(logits.float(), y) + reg
