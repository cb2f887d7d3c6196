"""timm's model contract, in one place for every vitlab model (timm, pytorch-image-models: the methods its
``tests/test_models.py`` checks on every model it ships, and ``timm.models._features``).

A model class mixes :class:`ModelContract` in and writes only what depends on its layout: ``get_classifier`` /
``reset_classifier``, ``forward_intermediates`` / ``prune_intermediate_layers``, ``group_matcher`` and its
``feature_info``. The mixin gives the parts that are the same everywhere:

- ``pretrained_cfg`` (and timm's older name ``default_cfg``): input size, interpolation, mean/std, the classifier's
  and first convolution's module names, the licence; what ``timm.data.resolve_data_config(model=model)`` reads;
- ``set_grad_checkpointing`` and :meth:`ModelContract.checkpointed`: activation checkpointing through timm's
  ``checkpoint`` (``torch.utils.checkpoint`` with ``use_reentrant=False``; the RNG state is restored for the
  recomputation, so dropout and stochastic depth draw the same masks and loss and gradients are those without it);
- :meth:`ModelContract.take_indices` (timm's ``feature_take_indices``) and :func:`tokens_to_maps`, the
  ``[B, N, C] -> [B, C, H, W]`` reshape of ``output_fmt="NCHW"``;
- :func:`feature_extractor`: timm's ``FeatureGetterNet`` around a model, the ``features_only`` feature maps of
  dense heads, with ``feature_info`` as ``timm.models.FeatureInfo``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from timm.models import checkpoint
from timm.models._builder import pretrained_cfg_for_features
from timm.models._features import FeatureGetterNet, feature_take_indices
from torch import nn

#: the output formats of ``forward_intermediates`` (timm's): feature maps, or tokens as they are
OUTPUT_FORMATS = ("NCHW", "NLC")
#: vitlab's licence (pyproject.toml): what ``pretrained_cfg["license"]`` says of weights vitlab trains
LICENSE = "mit"
#: the ``pretrained_cfg`` keys computed from the model, which an assigned cfg (timm's builder) does not replace
BUILT_KEYS = ("input_size", "fixed_input_size", "num_classes", "pool_size", "first_conv", "classifier")


def tokens_to_maps(tokens: torch.Tensor, grid: Sequence[int]) -> torch.Tensor:
    """Patch tokens ``[B, H*W, C]`` (row-major grid) -> feature maps ``[B, C, H, W]``."""
    height, width = grid
    if tokens.ndim != 3 or tokens.shape[1] != height * width:
        raise ValueError(
            f"expected tokens [B, {height * width}, C] of a {height}x{width} grid, got {list(tokens.shape)}"
        )
    return tokens.reshape(tokens.shape[0], height, width, tokens.shape[2]).permute(0, 3, 1, 2).contiguous()


def check_output_fmt(output_fmt: str) -> None:
    if output_fmt not in OUTPUT_FORMATS:
        raise ValueError(f"output_fmt must be one of {', '.join(OUTPUT_FORMATS)}, got {output_fmt!r}")


class ModelContract:
    """The shared half of timm's model contract (module docstring); mixed into an ``nn.Module``.

    Class attributes a model sets: ``classifier_name`` (the head's module, ``pretrained_cfg["classifier"]``) and
    ``first_conv`` (the convolution of the model's timm ``PatchEmbed``, which gives the input size).
    ``pretrained_cfg`` is computed from the model's input and head; assigning a dict to it (as timm's builder does,
    or ``vitlab fit`` with the data's mean and std) updates its keys other than :data:`BUILT_KEYS`.
    """

    classifier_name: str = "head"
    first_conv: str = "patch_embed.proj"
    grad_checkpointing: bool = False

    # --- pretrained_cfg -----------------------------------------------------------------------------------------
    @property
    def pretrained_cfg(self) -> dict[str, Any]:
        """timm's ``pretrained_cfg`` keys (``timm.models.PretrainedCfg``) for this model as built. Mean and std are
        those of the data the model was trained on once ``vitlab fit`` or an export set them; before that
        ``(0.5, ...)``, the ``[-1, 1]`` scaling. The keys of :data:`BUILT_KEYS` always describe the model as it is
        (its input size, ``set_input_size`` included, classes, pooled grid, first conv and classifier)."""
        embed = self.get_submodule(self.first_conv.rpartition(".")[0])  # timm's PatchEmbed: img_size, proj
        chans = embed.proj.in_channels
        built = {
            "input_size": (chans, *embed.img_size),
            "fixed_input_size": not getattr(self, "dynamic_img_size", False),
            "num_classes": self.num_classes,
            "pool_size": self.pool_size(),
            "first_conv": self.first_conv,
            "classifier": self.classifier_name,
        }
        cfg = {
            "architecture": getattr(self, "preset", type(self).__name__),
            "tag": None,
            "url": "",
            "hf_hub_id": None,
            "interpolation": "bicubic",
            "crop_pct": 1.0,
            "crop_mode": "center",
            "mean": (0.5,) * chans,
            "std": (0.5,) * chans,
            "license": LICENSE,
        }
        return {**cfg, **self.__dict__.get("_pretrained_cfg_set", {}), **built}

    @pretrained_cfg.setter
    def pretrained_cfg(self, values: dict[str, Any]) -> None:
        self.__dict__["_pretrained_cfg_set"] = {
            **self.__dict__.get("_pretrained_cfg_set", {}),
            **{k: tuple(v) if isinstance(v, list) else v for k, v in dict(values).items() if k not in BUILT_KEYS},
        }

    def pool_size(self) -> tuple[int, int] | None:
        """``pretrained_cfg["pool_size"]``: the grid of ``forward_features`` for a model with a spatial one (timm's
        Swin), None for token models."""
        return None

    @property
    def default_cfg(self) -> dict[str, Any]:
        """timm's older name of :attr:`pretrained_cfg` (timm's builder assigns it: ``model.default_cfg = ...``)."""
        return self.pretrained_cfg

    @default_cfg.setter
    def default_cfg(self, values: dict[str, Any]) -> None:
        self.pretrained_cfg = values

    # --- gradient checkpointing ---------------------------------------------------------------------------------
    @torch.jit.ignore
    def set_grad_checkpointing(self, enable: bool = True) -> None:
        """Recompute each block's activations in the backward pass instead of keeping them (timm's switch)."""
        self.grad_checkpointing = enable

    def checkpointed(self, function: Callable[..., Any], *args: Any) -> Any:
        """``function(*args)``, checkpointed when gradient checkpointing is on and autograd records this pass."""
        if self.grad_checkpointing and torch.is_grad_enabled():
            return checkpoint(function, *args)
        return function(*args)

    # --- intermediates ------------------------------------------------------------------------------------------
    @staticmethod
    def take_indices(count: int, indices: int | Sequence[int] | None) -> tuple[list[int], int]:
        """timm's ``feature_take_indices``: ``None`` all, an int the last ``n``, a list those (negative from the
        end); returns the absolute indices and the largest."""
        return feature_take_indices(count, indices if isinstance(indices, int | None) else list(indices))


def feature_extractor(
    model: nn.Module, out_indices: int | Sequence[int] = 4, *, norm: bool = False, prune: bool = True
) -> nn.Module:
    """``features_only``: timm's ``FeatureGetterNet`` around ``model``, whose forward returns the feature maps
    ``[B, C_i, H_i, W_i]`` of ``out_indices`` (``model.forward_intermediates(..., intermediates_only=True)``) and
    whose ``feature_info`` (channels, reductions, module names) describes them. ``prune`` drops the layers after
    the last one taken and the head (``prune_intermediate_layers``), as timm does, and with them every part the
    maps do not pass through, so each parameter of the extractor gets a gradient (DDP without
    ``find_unused_parameters``)."""
    out = out_indices if isinstance(out_indices, int) else tuple(out_indices)
    cfg = pretrained_cfg_for_features(model.pretrained_cfg)
    wrapper = FeatureGetterNet(model, out_indices=out, norm=norm, prune=prune)
    wrapper.pretrained_cfg = wrapper.default_cfg = cfg  # as timm's builder sets it: resolve_data_config reads it
    return wrapper


@contextmanager
def module_mode(module: nn.Module, training: bool) -> Iterator[nn.Module]:
    """``module.train(training)`` for the ``with`` block; afterwards every submodule gets back its own mode (a part
    kept in eval mode inside a training model stays so)."""
    modes = [(m, m.training) for m in module.modules()]
    module.train(training)
    try:
        yield module
    finally:
        for m, mode in modes:
            m.training = mode
