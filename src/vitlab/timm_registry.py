"""vitlab's presets in timm's model registry (timm, pytorch-image-models: ``timm.models._registry.register_model``,
``generate_default_cfgs`` and ``timm.models._builder.build_model_with_cfg``), so ``timm.create_model`` builds them.

Every preset ``P`` of the catalogue (:func:`vitlab.config.model.catalogue`: the core's and each family's) is the
timm model ``vitlab_P``, built by :func:`vitlab.create_model` through timm's own builder (its options, feature
extraction and ``pretrained=True`` with a ``pretrained_cfg_overlay`` file); a ViTCAE preset is its encoder. Weights
of another input size are fitted by :func:`_fit_weights`. Registration reads names only (no torch); ``import
vitlab`` registers when timm is imported, before or after (:func:`vitlab.lazy.after_import`). Names, options and
feature maps: docs/timm.md.
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any

from timm.layers import resample_abs_pos_embed, resample_abs_pos_embed_nhwc, resize_rel_pos_bias_table
from timm.models._builder import build_model_with_cfg
from timm.models._manipulate import adapt_input_conv
from timm.models._registry import generate_default_cfgs, register_model
from torch import nn

from vitlab.config.model import catalogue, model_options_type
from vitlab.errors import FamilyError
from vitlab.family import presets as preset_rows

#: the prefix of vitlab's names in timm's registry
PREFIX = "vitlab_"
#: the features a ViT-like model gives with ``features_only`` unless ``out_indices`` says (timm's ViT: 3)
DEFAULT_OUT_INDICES = 3


def _default_cfg(preset: str) -> dict[str, Any]:
    """The registered cfg (timm's ``_cfg`` of a model file): the preset's input size and class count as its table
    row and its options' defaults give them, without building it (``timm.get_pretrained_cfg_value`` reads them, as
    timm's tests do to size their inputs); the model's own ``pretrained_cfg`` also gives the classifier and first
    convolution of the preset as built (:func:`create` overlays them)."""
    own = _table_options(preset)
    chans, size = own.get("in_chans", 3), own.get("img_size", 32)
    return dict(
        url="",
        input_size=(chans, size, size),
        fixed_input_size=False,
        interpolation="bicubic",
        crop_pct=1.0,
        crop_mode="center",
        mean=(0.5,) * chans,
        std=(0.5,) * chans,
        num_classes=own.get("num_classes", 10),
        first_conv="patch_embed.proj",
        classifier="head",
        license="mit",
    )


def _table_options(preset: str) -> dict[str, Any]:
    """The options of ``preset`` that its table row and its options' defaults give; none where the row's family
    cannot load its options (building the model then says why)."""
    if preset not in preset_rows():
        return {}
    row = preset_rows()[preset][1]
    try:
        options = model_options_type(row.model)
    except (ImportError, FamilyError):
        options = None
    fields = dataclasses.fields(options) if options is not None else ()
    return {**{f.name: f.default for f in fields if f.default is not dataclasses.MISSING}, **row.kwargs}


def _preset_model(name: str, generative: bool, device: Any = None, dtype: Any = None, **kwargs: Any) -> nn.Module:
    """The preset through :func:`vitlab.create_model`; a generative preset's encoder, with its own head. ``device``
    and ``dtype`` are timm's factory arguments (every timm model takes them): the model is built on ``device``
    (``meta`` included) and cast to ``dtype``."""
    import torch

    from vitlab.models.builder import create_model
    from vitlab.models.protocols import classifier_backbone

    with torch.device(device) if device is not None else contextlib.nullcontext():
        if generative:
            num_classes = kwargs.pop("num_classes", 10)
            model = classifier_backbone(create_model(name, **kwargs))
            model.reset_classifier(num_classes)
        else:
            model = create_model(name, **kwargs)
    return model.to(dtype=dtype) if dtype is not None else model


def _fit_weights(state: dict[str, Any], model: nn.Module) -> dict[str, Any]:
    """timm's ``pretrained_filter_fn``: a whole ViTCAE checkpoint's ``encoder.`` weights; position embeddings and
    relative position bias tables of another input size resampled to the model's, as timm's ViT and Swin filters do
    (``resample_abs_pos_embed``, ``resample_abs_pos_embed_nhwc``, ``resize_rel_pos_bias_table``); a first
    convolution of another channel count adapted by timm's ``adapt_input_conv`` from the file's own count (a gray
    export into an RGB model: its filter spread over the three channels), which the registry's cfg cannot know."""
    if any(k.startswith("encoder.") for k in state):
        state = {k.removeprefix("encoder."): v for k, v in state.items() if k.startswith("encoder.")}
    own = model.state_dict()
    for key, value in state.items():
        target = own.get(key)
        if target is None or target.shape == value.shape:
            continue
        if key.endswith("pos_embed") and value.ndim == 4:  # CET-ViT's [1, G, G, C]
            state[key] = resample_abs_pos_embed_nhwc(value, target.shape[1:3])
        elif key.endswith("pos_embed"):  # ViT's [1, 1 + G*G, C]
            state[key] = resample_abs_pos_embed(value, new_size=model.grid_size, num_prefix_tokens=1)
        elif value.ndim == 4 == target.ndim and value.shape[1] != target.shape[1]:  # the first convolution
            state[key] = adapt_input_conv(target.shape[1], value, base_chans=value.shape[1])
        elif key.endswith("relative_position_bias_table"):
            window = model.get_submodule(key.rpartition(".")[0]).window_size
            state[key] = resize_rel_pos_bias_table(value, new_window_size=window, new_bias_shape=target.shape)
    return state


def create(name: str, pretrained: bool = False, **kwargs: Any) -> nn.Module:
    """``timm.create_model(PREFIX + name, ...)``: the preset through timm's ``build_model_with_cfg``."""
    from vitlab.models.protocols import GenerativeModel
    from vitlab.models.registry import constructor_args, get_preset, resolved_kwargs
    from vitlab.models.swin import SwinTransformer

    preset = get_preset(name)
    defaults = {k: p.default for k, p in constructor_args(preset.cls).items()}
    own = {**defaults, **resolved_kwargs(name)}
    generative = issubclass(preset.cls, GenerativeModel)
    overlay = dict(
        input_size=(own["in_chans"], own["img_size"], own["img_size"]),
        mean=(0.5,) * own["in_chans"],
        std=(0.5,) * own["in_chans"],
        num_classes=own["num_classes"],
        first_conv="patch_embed.proj" if generative else preset.cls.first_conv,
        classifier="head" if generative else preset.cls.classifier_name,
    )
    if issubclass(preset.cls, SwinTransformer):
        feature_cfg = dict(flatten_sequential=True, out_indices=tuple(range(len(own["depths"]))))
    else:
        feature_cfg = dict(feature_cls="getter", out_indices=DEFAULT_OUT_INDICES)
    return build_model_with_cfg(
        lambda **kw: _preset_model(name, generative, **kw),
        PREFIX + name,
        pretrained,
        pretrained_cfg_overlay={**overlay, **(kwargs.pop("pretrained_cfg_overlay", None) or {})},
        pretrained_filter_fn=_fit_weights,
        feature_cfg=feature_cfg,
        **kwargs,
    )


def _entrypoint(name: str):
    def entrypoint(pretrained: bool = False, **kwargs: Any) -> nn.Module:
        return create(name, pretrained, **kwargs)

    entrypoint.__name__ = entrypoint.__qualname__ = PREFIX + name
    entrypoint.__doc__ = f"vitlab's preset {name!r} (:func:`vitlab.create_model`) through timm's builder."
    entrypoint.__module__ = __name__
    return entrypoint


default_cfgs: dict[str, Any] = {}


def register(presets: list[str] | None = None) -> list[str]:
    """Register ``presets`` (all of the catalogue's by default) in timm's registry; returns their timm names."""
    names = [PREFIX + p for p in (presets if presets is not None else sorted(catalogue()))]
    default_cfgs.update(generate_default_cfgs({n: _default_cfg(n.removeprefix(PREFIX)) for n in names}))
    for name in names:
        register_model(_entrypoint(name.removeprefix(PREFIX)))
    return names
