"""Small models the tests share, built the same way wherever a test needs one (a seeded preset with test sizes)."""

from __future__ import annotations

import torch

from vitlab.models import create_model


def tiny_vit(**overrides) -> torch.nn.Module:
    """``vit_pico`` on 8x8 one-channel images in 2x2 patches, 3 classes, depth 2, with per-head temperature; seed 0."""
    torch.manual_seed(0)
    kwargs = dict(img_size=8, patch_size=2, in_chans=1, num_classes=3, depth=2, temperature=True)
    return create_model("vit_pico", **{**kwargs, **overrides})
