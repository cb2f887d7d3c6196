"""Building a model: a preset from the registry created with its overrides (:func:`create_model`) and, where
asked, weights loaded into it (:func:`vitlab.models.pretrained.load_pretrained`); a timm ViT as a vitlab one
(:func:`from_timm`). The registry holds names only, so nothing here is imported in a circle."""

from __future__ import annotations

from typing import Any

from torch import nn

from vitlab.config.hf_model import HF_PREFIX
from vitlab.layers.dropout import use_fast_dropout
from vitlab.models.hf_weights import load_hf_pretrained, pretrained_options
from vitlab.models.pretrained import LoadReport, check_keys, fit_to_backbone, load_pretrained
from vitlab.models.registry import get_preset, list_models, resolved_kwargs
from vitlab.models.vit import VisionTransformer
from vitlab.models.weight_sources import timm_vit_kwargs


def create_model(name: str, pretrained: str | None = None, **overrides: Any) -> nn.Module:
    """Build the preset ``name`` with keyword ``overrides`` (e.g. ``img_size=8, num_classes=10``).

    ``pretrained``: weights for the model's ViT backbone, a file, a vitlab export or run directory, or
    ``timm:NAME[.TAG]`` (:func:`vitlab.models.pretrained.load_pretrained`: position and patch embeddings resampled,
    head reset, any other mismatch an error). It is kept as ``model.pretrained``, not in ``init_kwargs``.
    Its dropouts are :class:`vitlab.layers.dropout.Dropout` (the same distribution, a cheaper mask).
    """
    hf = name.startswith(HF_PREFIX)
    if hf and pretrained:  # a save_pretrained folder: its network, under the overrides
        overrides = {**pretrained_options(name, pretrained), **overrides}
    preset = get_preset(name)
    kwargs = resolved_kwargs(name, **overrides)
    model = use_fast_dropout(preset.build(**kwargs))
    model.preset = name
    model.init_kwargs = kwargs
    if pretrained:
        if hf:
            load_hf_pretrained(model, pretrained)
        else:
            load_pretrained(model, pretrained, arch=name)
        model.pretrained = str(pretrained)
    return model


def from_timm(model: nn.Module, **overrides: Any) -> VisionTransformer:
    """A timm ``VisionTransformer`` (with its weights) as a vitlab ViT, so vitlab's ViT options (ToMe, the
    temperature, the export) apply to it. Eval mode; the logits equal timm's. (``capture_attention`` and the
    dynamics controller need no conversion: ``model.name=timm:NAME``, docs/foreign_models.md.)

    ``overrides``: further constructor options that add no weights, e.g. ``temperature=True`` (per-head
    temperatures at tau = 1, for the controller), ``drop_path_rate=0.1``. The result records a preset
    (``vit_base``'s class with the full constructor arguments), so :func:`vitlab.export.export_model` writes it.
    Raises :class:`PretrainedWeightsError` for a timm model with features vitlab's ViT lacks (registers, qk-norm,
    LayerScale, ...).
    """
    kwargs = {**timm_vit_kwargs(model), **overrides}
    preset = next(
        (
            name
            for name in list_models("vit_*")
            if all(resolved_kwargs(name).get(k) == kwargs[k] for k in ("embed_dim", "depth", "num_heads", "mlp_ratio"))
        ),
        "vit_base",
    )
    ours = create_model(preset, **kwargs)
    state = dict(model.state_dict())
    report = LoadReport(f"timm {type(model).__name__}")
    state = fit_to_backbone(state, ours, report)
    check_keys(state, ours, report.source, preset)
    ours.load_state_dict(state, strict=True)
    return ours.eval()
