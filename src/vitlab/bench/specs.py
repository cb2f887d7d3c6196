"""What is measured: a network named by its source and preset (:class:`NetworkSpec`), timm's network of the same
shape (:func:`timm_counterpart`), and the settings of a measurement."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Literal

import timm
from timm.models.swin_transformer import SwinTransformer as TimmSwinTransformer
from torch import nn

from vitlab.config.model import SwinTransformerOptions, ViTEncoderOptions
from vitlab.errors import ConfigError
from vitlab.models.builder import create_model
from vitlab.models.protocols import GenerativeModel, classifier_backbone
from vitlab.models.registry import constructor_args, get_preset, resolved_kwargs
from vitlab.models.vit import VisionTransformer

Precision = Literal["32-true", "bf16-mixed"]
PRECISIONS: tuple[str, ...] = ("32-true", "bf16-mixed")
PHASES: tuple[str, ...] = ("train", "inference")
#: ``wall``: elapsed time; ``cpu``: CPU time of the process, which time-sharing with other processes does not inflate
CLOCKS: tuple[str, ...] = ("wall", "cpu")
#: training FLOPs per forward FLOP: forward, then input and weight gradients in the backward pass
TRAINING_FLOPS_PER_FORWARD = 3


# -------------------------------------------------------------------------------------------------------------------
# What is measured
@dataclass(frozen=True)
class NetworkSpec:
    """How to build a benchmarked network; plain data, so a fresh process can rebuild it (peak memory on CPU).

    ``source="vitlab"``: the preset ``name`` with keyword ``kwargs`` overrides; a ViTCAE preset gives its encoder
    (``model.encoder``, a ``VisionTransformer`` with temperature). ``"timm_vit"`` / ``"timm_swin"``: timm's
    ``VisionTransformer`` / ``SwinTransformer`` built with ``kwargs``. ``grad_checkpointing``: the network's
    ``set_grad_checkpointing(True)`` (``trainer.grad_checkpointing``).
    """

    source: Literal["vitlab", "timm_vit", "timm_swin"]
    name: str
    kwargs: dict[str, Any] = field(default_factory=dict)
    grad_checkpointing: bool = False

    def build(self) -> nn.Module:
        if self.source == "vitlab":
            network = classifier_backbone(create_model(self.name, **self.kwargs))
        elif self.source == "timm_vit":
            network = timm.models.VisionTransformer(**self.kwargs)
        else:
            network = TimmSwinTransformer(**self.kwargs)
        if self.grad_checkpointing:
            network.set_grad_checkpointing(True)
        return network

    def describe(self) -> str:
        checkpointed = ", gradient checkpointing" if self.grad_checkpointing else ""
        if self.source == "vitlab":
            part = " (encoder)" if issubclass(get_preset(self.name).cls, GenerativeModel) else ""
            return f"vitlab {self.name}{part}{checkpointed}"
        return self.name + checkpointed


#: the options timm's ViT and Swin take under the same names (a ViT's temperature and a Swin's pooling are ours)
_VIT_KEYS = tuple(f.name for f in fields(ViTEncoderOptions) if not f.name.startswith("temperature"))
_SWIN_KEYS = tuple(f.name for f in fields(SwinTransformerOptions) if f.name not in ("global_pool", "dynamic_img_size"))


def timm_counterpart(model: str, overrides: dict[str, Any] | None = None) -> NetworkSpec:
    """timm's network of the same shape as the preset ``model`` with ``overrides``.

    ViT presets (``vit_*``; ``tome_*`` get the plain timm ViT, so the ratio is ToMe's speed-up): timm's
    ``VisionTransformer`` with the same width, depth, heads, patch, input, MLP ratio, QKV bias, pooling and dropout.
    ViTCAE presets: the timm ViT of the encoder's shape, without a head (``num_classes=0``) and without the
    temperature. Swin presets: timm's ``SwinTransformer`` with the same configuration.
    """
    cls = get_preset(model).cls
    defaults = {name: p.default for name, p in constructor_args(cls).items()}
    kwargs = defaults | resolved_kwargs(model, **(overrides or {}))
    if issubclass(cls, (VisionTransformer, GenerativeModel)):
        vit = {key: kwargs[key] for key in _VIT_KEYS}
        vit |= dict(pos_drop_rate=kwargs["drop_rate"], proj_drop_rate=kwargs["drop_rate"])
        if issubclass(cls, GenerativeModel):
            vit |= dict(num_classes=0, global_pool="token")
        else:
            vit["global_pool"] = kwargs["global_pool"]
        return NetworkSpec("timm_vit", "timm VisionTransformer", vit)
    if issubclass(cls, TimmSwinTransformer):
        swin = {key: kwargs[key] for key in _SWIN_KEYS}
        swin["proj_drop_rate"] = kwargs["drop_rate"]
        return NetworkSpec("timm_swin", "timm SwinTransformer", swin)
    raise ConfigError(
        f"--vs timm has no timm counterpart for {model!r} ({cls.__name__}); it covers the models built on a "
        "ViT (the ViT and ToMe presets, a generative model's encoder) and Swin. Run without --vs to bench it alone."
    )


def check_settings(*, batch_size: int, precision: str, repeats: int, warmup: int) -> None:
    if precision not in PRECISIONS:
        raise ConfigError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    if batch_size < 1:
        raise ConfigError(f"batch size must be at least 1, got {batch_size}")
    if repeats < 1 or warmup < 0:
        raise ConfigError(f"repeats must be >= 1 and warmup >= 0, got repeats={repeats}, warmup={warmup}")
