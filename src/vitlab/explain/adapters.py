"""Declarations: which output of a model is the logit, where its attention and token grid are, and which methods
its structure refuses. The LRP rules need none of this: they attach to operation types (:mod:`vitlab.explain.hilrp`).

Any ``nn.Module`` whose output is the logits (a tensor, a ``.logits`` attribute or a tuple's first element) is
explained; the core declares more of the models of ``vitlab.models`` (the plain ViT, ToMe, Swin); a family declares
the :class:`Explainer` of its own models through ``Family.explainer`` (a ``"module:function"`` taking the model);
a family that declares none gets the generic one (the LRP variants and the gradient methods).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import torch
from torch import nn

from vitlab.errors import ConfigError, VitlabError
from vitlab.evaluation.outputs import classifier_logits
from vitlab.family import family_of, resolve
from vitlab.models.protocols import GenerativeModel
from vitlab.models.swin import SwinTransformer
from vitlab.models.vit import VisionTransformer

#: the LRP variants (:mod:`vitlab.explain.hilrp`), each with its relevance ledger
LRP_METHODS = ("lrp", "cp_lrp", "lrp_epsilon", "lrp_gamma")
ATTENTION_METHODS = ("attention", "rollout", "grad_rollout")
#: gradient and perturbation methods through captum: they need nothing of the model but its logits
CAPTUM_METHODS = ("saliency", "input_x_gradient", "smoothgrad", "gradient_shap", "occlusion", "integrated_gradients")
METHODS = (*ATTENTION_METHODS, *LRP_METHODS, "gradcam", *CAPTUM_METHODS)
#: one method of each kind: the report's overlays and the default of ``vitlab explain --evaluate``
OVERVIEW_METHODS = ("attention", "rollout", "grad_rollout", "lrp", "gradcam", "integrated_gradients")


class MethodRefused(VitlabError, ValueError):
    """The method does not apply to this model's structure (the message names the method and the reason)."""


class UnsupportedOperation(MethodRefused):
    """An operation with no relevance rule carries relevance (the message names it; :mod:`vitlab.explain.hilrp`)."""


#: ``tokens -> [B, C, h, w]``: a layer's output as a channels-first grid for Grad-CAM
GridReshape = Callable[[torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class Explainer:
    """What the methods need of one model.

    ``kind``: a short name for tables (``vit``, ``tome``, ``swin``, a family's name).
    ``token_model``: the CLS-token ViT whose shared ``Attention`` modules the attention methods read (a generative
    model: its encoder); None when the methods are refused.
    ``gradcam_layer``: the module whose output is a token grid, and the reshape of that output to ``[B, C, h, w]``.
    ``refused``: method -> why it does not apply.
    """

    kind: str
    token_model: nn.Module | None = None
    gradcam_layer: tuple[nn.Module, GridReshape] | None = None
    refused: Mapping[str, str] = field(default_factory=dict)

    def logits(self, model: nn.Module, x: torch.Tensor) -> torch.Tensor:
        """``[B, C, H, W] -> [B, K]``: the classifier's logits (a generative model: its encoder and head only)."""
        if isinstance(model, GenerativeModel):
            return model.forward_head(model.forward_features(x))
        return classifier_logits(model, x)

    def check(self, method: str) -> None:
        if method not in METHODS:
            raise ConfigError(f"unknown explanation method {method!r}; choose one of {', '.join(METHODS)}")
        if method in self.refused:
            raise MethodRefused(f"{method} does not apply to {self.kind}: {self.refused[method]}")

    def applicable(self, among: tuple[str, ...] = METHODS) -> tuple[str, ...]:
        return tuple(m for m in among if m not in self.refused)


def patch_tokens_grid(grid: tuple[int, int], prefix: int) -> GridReshape:
    """ViT tokens ``[B, prefix + h*w, C] -> [B, C, h, w]`` (the prefix tokens dropped)."""
    return lambda t: t[:, prefix:].reshape(t.shape[0], *grid, t.shape[-1]).permute(0, 3, 1, 2)


def nhwc_grid(t: torch.Tensor) -> torch.Tensor:
    """Channels-last features ``[B, h, w, C] -> [B, C, h, w]`` (timm's Swin stages, CET-ViT's micro encoder)."""
    return t.permute(0, 3, 1, 2)


def vit_explainer(vit: VisionTransformer, kind: str) -> Explainer:
    refused: dict[str, str] = {}
    if vit.global_pool != "token":
        reason = "the model pools the mean of its tokens, so there is no CLS row of attention to read"
        refused.update(dict.fromkeys(ATTENTION_METHODS, reason))
    if vit.tome_r > 0:
        reason = (
            "Token Merging merges tokens in every block, so attention rows and token grids after the first block "
            "no longer index patches (a product of attention matrices of different sizes is undefined)"
        )
        refused.update(dict.fromkeys((*ATTENTION_METHODS, "gradcam"), reason))
        return Explainer(kind="tome", refused=refused)
    layer = (vit.blocks[-1].norm1, patch_tokens_grid(vit.grid_size, vit.num_prefix_tokens))
    return Explainer(kind=kind, token_model=vit, gradcam_layer=layer, refused=refused)


def _swin_explainer(swin: SwinTransformer) -> Explainer:
    reason = (
        "Swin attends within (shifted) windows and has no CLS token: no attention row covers the image, and "
        "windows of different stages and shifts do not compose into one token-to-token product"
    )
    # the last stage whose grid is at least 4 x 4 (later ones are 2 x 2 or 1 x 1 on small images)
    stages = [s for s in swin.layers if min(s.output_resolution) >= 4] or [swin.layers[0]]
    return Explainer(
        kind="swin", gradcam_layer=(stages[-1], nhwc_grid), refused=dict.fromkeys(ATTENTION_METHODS, reason)
    )


def _module_explainer(model: nn.Module, in_family: bool = False) -> Explainer:
    """Any other module (a timm model, a family's model that declares no explainer): the LRP variants and the captum
    methods; the attention methods and Grad-CAM need a declaration of where its attention and token grid are, which
    only a family's author can give (``Family.explainer``)."""
    author = ", or declare an Explainer for it through its Family" if in_family else ""
    reason = (
        f"{type(model).__name__} declares no CLS-token attention and no token grid; these methods apply to it: "
        f"{', '.join((*LRP_METHODS, *CAPTUM_METHODS))}{author}"
    )
    return Explainer(kind=type(model).__name__, refused=dict.fromkeys((*ATTENTION_METHODS, "gradcam"), reason))


def explainer_for(model: nn.Module) -> Explainer:
    """The :class:`Explainer` of ``model``: its family's, the core's for ViT, ToMe and Swin, or the generic one of
    any module (a family that declares no explainer included)."""
    family = family_of(model)
    if family is not None and family.explainer:
        return resolve(family.explainer)(model)
    if isinstance(model, VisionTransformer):
        return vit_explainer(model, "vit")
    if isinstance(model, SwinTransformer):
        return _swin_explainer(model)
    return _module_explainer(model, in_family=family is not None)
