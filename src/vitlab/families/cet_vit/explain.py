"""How ``vitlab.explain`` reaches CET-ViT: the assignment ``S`` as a fixed routing, and the methods it refuses."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from vitlab.explain.adapters import ATTENTION_METHODS, Explainer, nhwc_grid
from vitlab.families.cet_vit.model import CETViT
from vitlab.families.cet_vit.parts import VCEO


def _assignment_rule(m: nn.Module) -> dict[str, Callable[..., object]] | None:
    """V-CEO's ``S`` (a top-k softmax of the tokens) held constant: with it, ``h_macro = S^T h_micro / mass`` is a
    fixed pooling and relevance flows through it by re-indexing (the CP-LRP treatment of a softmax gain, Ali et al.
    2022, sec. 3)."""
    if not isinstance(m, VCEO):
        return None
    assignment = m.assignment

    def detached(*args, **kwargs) -> torch.Tensor:
        return assignment(*args, **kwargs).detach()

    return {"assignment": detached}


def explainer(model: CETViT) -> Explainer:
    """CET-ViT has no CLS token; its micro tokens attend in (shifted) windows (the card's model) and its macro
    tokens are slots that ``S`` fills, so the attention methods are refused. Grad-CAM reads the micro encoder's
    token grid."""
    reason = (
        "CET-ViT has no CLS token and its macro tokens are slots filled by the assignment S: the micro tokens' "
        "(windowed) attention and the slots' attention act on different token sets, so no product of attention "
        "matrices maps the prediction onto patches"
    )
    return Explainer(
        kind="cet_vit",
        gradcam_layer=(model.micro_encoder, nhwc_grid),
        refused=dict.fromkeys(ATTENTION_METHODS, reason),
        rules=(_assignment_rule,),
        additive=("slot_embed",),
    )
