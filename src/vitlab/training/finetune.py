"""Fine-tuning from pretrained weights: the ``finetune`` config section applied to a model and its optimiser.

- a frozen backbone / linear probe (``finetune.freeze=backbone``);
- layer-wise learning-rate decay (``finetune.layer_decay``; BEiT, Bao et al. 2022, sec. 2.6, after ELECTRA, Clark
  et al. 2020, appendix A) over the layers of the model's ``group_matcher`` (timm's), so every family has it;
- early stopping (Lightning's ``EarlyStopping``) on the validation metric.

The pretrained weights themselves come from ``model.pretrained`` (:mod:`vitlab.models.pretrained`).
"""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import EarlyStopping
from lightning.pytorch.utilities import rank_zero_info
from torch import nn

from vitlab.config import FinetuneConfig, RunConfig
from vitlab.data import VisionDataModule
from vitlab.errors import ConfigError
from vitlab.models.pretrained import PretrainedWeightsError, backbone_of
from vitlab.models.protocols import LayerGrouped, parameter_layers
from vitlab.models.weight_sources import source_pretrained_cfg


def _backbone(model: nn.Module, option: str) -> tuple[nn.Module, str]:
    try:
        backbone, where = backbone_of(model)
    except PretrainedWeightsError as e:
        raise ConfigError(f"{option} needs a ViT backbone: {e}") from e
    return backbone, f"{where}." if where else ""


def freeze_backbone(model: nn.Module) -> int:
    """Stop the gradient of every weight of the ViT backbone except its classifier head; returns how many tensors.

    For a ViT only the head then trains (a linear probe on the CLS token); for ViTCAE the encoder is fixed and the
    latent heads, prior, decoder and classifier train. Dropout in the backbone still acts in training mode.
    """
    backbone, _ = _backbone(model, "finetune.freeze=backbone")
    frozen = 0
    for name, p in backbone.named_parameters():
        if not name.startswith("head."):
            p.requires_grad_(False)
            frozen += 1
    return frozen


def layer_ids(model: nn.Module) -> dict[str, int]:
    """Layer of every parameter name for the decay: timm's ``group_parameters`` over ``model.group_matcher()``,
    0 the embeddings, then the blocks in forward order; what no group names (the head) is the last layer."""
    if not isinstance(model, LayerGrouped):
        raise ConfigError(
            f"finetune.layer_decay needs a model with timm's group_matcher (its layers in forward order); "
            f"{type(model).__name__} has none: unset finetune.layer_decay or give the model a group_matcher"
        )
    return parameter_layers(model)


def layer_decay_groups(model: nn.Module, groups: list[dict[str, Any]], lr: float, decay: float) -> list[dict[str, Any]]:
    """Split AdamW parameter ``groups`` (as :func:`vitlab.training.tasks.param_groups` makes them) by layer
    (:func:`layer_ids`), each with ``lr * decay ** (top - layer)``; a group keeps its weight decay. Empty groups
    are dropped."""
    layer_of = layer_ids(model)
    top = max(layer_of.values())
    names = {id(p): n for n, p in model.named_parameters()}
    out = []
    for group in groups:
        by_layer: dict[int, list[Any]] = {}
        for p in group["params"]:
            by_layer.setdefault(layer_of[names[id(p)]], []).append(p)
        for layer in sorted(by_layer):
            scale = decay ** (top - layer)
            out.append({**group, "params": by_layer[layer], "lr": lr * scale, "lr_scale": scale})
    return out


def pretrained_normalisation(cfg: RunConfig, dm: VisionDataModule, stored: dict[str, Any] | None = None) -> str | None:
    """Normalise the data as ``finetune.normalisation`` says: with the ``pretrained_cfg`` mean and std of
    ``model.pretrained`` (timm's convention for fine-tuning) when it names them for the data's channel count; a
    resumed run (``stored``: its checkpoint's hyper-parameters) keeps the normalisation it started with. Returns a
    line for the log, or None when the data's own statistics stay."""
    if stored is not None:
        info = stored.get("data_info") or {}
        if info.get("mean"):
            dm.set_normalisation(info["mean"], info["std"])
        return None
    source = cfg.model.get("pretrained")
    if not source or cfg.finetune.normalisation != "pretrained":
        return None
    pretrained = source_pretrained_cfg(source)
    mean, std = pretrained.get("mean"), pretrained.get("std")
    if not mean or len(mean) != dm.in_chans:
        return None
    dm.set_normalisation(mean, std)
    rounded = [tuple(round(float(v), 4) for v in values) for values in (mean, std)]
    line = f"finetune.normalisation=pretrained: mean {rounded[0]}, std {rounded[1]}"
    size = pretrained.get("input_size")
    if size and tuple(size[1:]) != (dm.img_size, dm.img_size):
        line += (
            f"; the weights were trained at {size[1]}x{size[2]}, the data is {dm.img_size}x{dm.img_size} (position "
            "embeddings resampled)"
        )
    return line


def early_stopping(cfg: FinetuneConfig, monitor: tuple[str, str]) -> EarlyStopping | None:
    """Lightning's ``EarlyStopping`` as ``cfg`` says, on ``monitor = (metric, mode)`` unless the config names one."""
    if cfg.early_stopping_patience is None:
        return None
    metric = cfg.early_stopping_monitor or monitor[0]
    mode = cfg.early_stopping_mode or (monitor[1] if metric == monitor[0] else ("min" if "loss" in metric else "max"))
    return EarlyStopping(
        monitor=metric,
        mode=mode,
        patience=cfg.early_stopping_patience,
        min_delta=cfg.early_stopping_min_delta,
        check_on_train_epoch_end=False,
        verbose=False,
    )


def setup_finetuning(cfg: RunConfig, model: nn.Module, monitor: tuple[str, str]) -> list[pl.Callback]:
    """Apply ``cfg.finetune`` to ``model`` (freezing) and return its callbacks (early stopping). Reports the
    pretrained weights that ``model.pretrained`` loaded. Layer decay acts when the task builds its optimiser."""
    summary = getattr(model, "pretrained_summary", None)
    if summary:
        rank_zero_info(summary)
    ft = cfg.finetune
    if ft.freeze == "backbone":
        rank_zero_info(f"finetune.freeze=backbone: {freeze_backbone(model)} tensors of the backbone frozen")
    if ft.layer_decay is not None:
        layers = max(layer_ids(model).values()) + 1  # fails before training starts
        rank_zero_info(
            f"finetune.layer_decay={ft.layer_decay}: {layers} layers, the first at lr * {ft.layer_decay}^{layers - 1}"
        )
    stop = early_stopping(ft, monitor)
    return [stop] if stop is not None else []
