"""Lightning task for ViTCAE: the eq. 23-25 objective with its KL -> IMQ-MMD curriculum, the paper's recipe."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from vitlab.config import RunConfig
from vitlab.config.loss import build_loss
from vitlab.errors import ConfigError
from vitlab.families.vitcae.losses import vitcae_loss
from vitlab.training.tasks import ClassificationTask


def calibration_scale(means: torch.Tensor, largest: float) -> tuple[float, float]:
    """``mmd_calibration: kl``: ``(KL_cls / W_cls, KL_pt / W_pt)`` from ``means = [kl_cls, mmd_cls, kl_pt, mmd_pt]``,
    each at most ``largest`` (``loss.mmd_calibration_max``): an MMD estimate near 0 would otherwise multiply the
    estimator's noise by thousands (docs/vitcae.md, ``mmd_calibration``)."""
    kl_cls, mmd_cls, kl_pt, mmd_pt = (float(v) for v in means)
    return min(kl_cls / max(mmd_cls, 1e-9), largest), min(kl_pt / max(mmd_pt, 1e-9), largest)


#: the terms whose value depends on whether ``z_cls`` and ``z_pt`` are samples (training) or the posterior means
#: (evaluation): the MMD estimates and their shares of the blends; evaluation logs them as ``<term>_mu``
SAMPLED_TERMS = ("mmd_cls", "mmd_pt", "mmd_share_cls", "mmd_share_pt")


class ViTCAETask(ClassificationTask):
    """Trains :class:`~vitlab.families.vitcae.model.ViTCAE` on ``L_total(t)`` of eq. 25 (``loss:`` section of the
    config: :class:`~vitlab.families.vitcae.losses.ViTCAELossConfig`). Every term is logged separately every epoch; the
    accuracy of the classifier on ``mu_cls`` is the classification accuracy of the paper's Table I.

    ``train/loss`` and ``val/loss`` hold eq. 25 at that epoch; ``test/loss`` is ``rec + pt_est + lambda_ce ce``
    (``monitor``, which neither the epoch nor a random prior sample changes), the same in ``vitlab fit`` and
    ``vitlab test``; eq. 25 at the epoch the test ran in is ``test/objective``, beside the other terms. The MMD
    terms of training compare samples of the posteriors with the priors, those of evaluation the posterior means
    (tens of times apart): evaluation logs them as ``val/mmd_cls_mu`` etc. (:data:`SAMPLED_TERMS`), so no curve
    draws the two as one quantity.

    The model reconstructs the normalised input; reconstruction metrics in pixel space come from
    :func:`vitlab.families.vitcae.generative.run_generative_tasks`, which runs after training.
    """

    #: best.ckpt and ReduceLROnPlateau by a validation loss, not accuracy (an autoencoder picked by accuracy alone can
    #: keep an early, blurry decoder): ``val/monitor`` (``loss.monitor: continuous``, reconstruction + patch estimator
    #: + CE, which has no step at the curriculum switch) or ``val/loss`` (``objective``, eq. 25).
    monitor = ("val/monitor", "min")

    def __init__(self, model: nn.Module, *, cfg: RunConfig, hparams: dict[str, Any]) -> None:
        super().__init__(model, cfg=cfg, hparams=hparams)
        self.loss_cfg = build_loss(self.loss_config, cfg.loss)
        if self.loss_cfg.monitor == "objective":
            self.monitor = ("val/loss", "min")
        # mmd_calibration: the W_cls / W_pt multipliers, fixed at the end of the last warm-up epoch from that epoch's
        # means of KL and MMD (sums accumulated on the device, no host sync per step); they ride in checkpoints.
        self.mmd_scale: tuple[float, float] | None = None
        self._calibration_sums: torch.Tensor | None = None  # [5]: kl_cls, mmd_cls, kl_pt, mmd_pt, batches

    def _current_mmd_scale(self) -> tuple[float, float]:
        if self.loss_cfg.mmd_calibration == "none":
            return (1.0, 1.0)
        return self.mmd_scale if self.mmd_scale is not None else (1.0, 1.0)

    def compute_losses(self, batch: Any, stage: str) -> dict[str, torch.Tensor]:
        x, y = batch
        if y.ndim != 1:
            raise ConfigError("ViTCAE needs hard labels: set data.augment.mixup_alpha=0 and cutmix_alpha=0")
        out = self.model(x)
        # eq. 25 counts epochs from 1; Lightning from 0. Evaluation uses the objective of the epoch being trained.
        epoch, cfg = self.current_epoch + 1, self.loss_cfg
        if cfg.mmd_calibration == "kl" and self.mmd_scale is None and epoch > cfg.warmup_epochs:
            # no warm-up epoch was measured (T_w = 0, or a checkpoint from before the calibration): this batch's
            # terms calibrate, once
            probe = vitcae_loss(out, x, y, epoch=0, cfg=cfg)
            self.mmd_scale = calibration_scale(
                torch.stack([probe["kl_cls"], probe["mmd_cls"], probe["kl_pt"], probe["mmd_pt"]]).detach(),
                cfg.mmd_calibration_max,
            )
        terms = vitcae_loss(out, x, y, epoch=epoch, cfg=cfg, mmd_scale=self._current_mmd_scale())
        if stage != "train":  # evaluation takes the posterior means, training samples: two quantities, two names
            for key in SAMPLED_TERMS:
                terms[f"{key}_mu"] = terms.pop(key)
        if stage == "test":
            # eq. 25 follows the training epoch, which `vitlab test` (epoch 0) and the test at the end of `vitlab fit`
            # do not share, and its MMD terms draw random prior samples: the test loss is the part that is neither
            terms["objective"], terms["loss"] = terms["loss"], terms["monitor"]
        if stage == "train" and cfg.mmd_calibration == "kl" and epoch == cfg.warmup_epochs:
            values = torch.stack([terms["kl_cls"], terms["mmd_cls"], terms["kl_pt"], terms["mmd_pt"]]).detach()
            sums = torch.cat([values, values.new_ones(1)])
            self._calibration_sums = sums if self._calibration_sums is None else self._calibration_sums + sums
        acc = self.accuracy[f"{stage}_acc"]
        acc(out.logits.detach(), y)
        self.log(f"{stage}/acc", acc, on_step=False, on_epoch=True, prog_bar=True)
        return terms

    def on_train_epoch_end(self) -> None:
        if self._calibration_sums is not None and self.current_epoch + 1 == self.loss_cfg.warmup_epochs:
            sums = self._calibration_sums
            self.mmd_scale = calibration_scale(sums[:4] / sums[4], self.loss_cfg.mmd_calibration_max)
            self._calibration_sums = None
        if self.mmd_scale is not None:
            self.log("train/mmd_scale_cls", self.mmd_scale[0], on_step=False, on_epoch=True)
            self.log("train/mmd_scale_pt", self.mmd_scale[1], on_step=False, on_epoch=True)
        super().on_train_epoch_end()

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        super().on_save_checkpoint(checkpoint)
        if self.mmd_scale is not None:
            checkpoint["mmd_scale"] = list(self.mmd_scale)

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        super().on_load_checkpoint(checkpoint)
        scale = checkpoint.get("mmd_scale")
        self.mmd_scale = None if scale is None else (float(scale[0]), float(scale[1]))

    def on_run_end(self, run_dir: Path, datamodule: Any) -> None:
        if not self.cfg.run.generate:
            return
        from vitlab.families.vitcae.generative import run_generative_tasks

        run_generative_tasks(
            self.model.eval(), datamodule, Path(run_dir) / "generate", seed=self.cfg.run.seed, device=self.device
        )
