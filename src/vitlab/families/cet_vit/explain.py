"""How ``vitlab.explain`` reaches CET-ViT: its token grid, and the methods it refuses (its LRP needs no declaration:
the assignment ``S`` is a softmax and its pooling a bilinear product, both rules of operation types)."""

from __future__ import annotations

from vitlab.explain.adapters import ATTENTION_METHODS, Explainer, nhwc_grid
from vitlab.families.cet_vit.model import CETViT


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
    )
