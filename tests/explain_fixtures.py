"""Tiny models of ten families and more for the explanation tests: vitlab's five and timm families whose operators
differ (a distillation token, class attention, spatial-reduction, cross-covariance, grid and linear attention)."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from vitlab.models import create_model


def _timm(name: str, **kw) -> nn.Module:
    import timm

    return timm.create_model(name, pretrained=False, num_classes=5, **kw)


#: name -> (builder, image side)
ARCHITECTURES: dict[str, tuple[Callable[[], nn.Module], int]] = {
    "vit": (lambda: create_model("vit_pico", num_classes=5, img_size=16, patch_size=4, depth=2), 16),
    "tome": (lambda: create_model("tome_pico", num_classes=5, img_size=16, patch_size=4, depth=2, tome_r=3), 16),
    "swin": (
        lambda: create_model(
            "swin_pico", num_classes=5, img_size=16, patch_size=2, window_size=2, depths=(1, 1), num_heads=(1, 2)
        ),
        16,
    ),
    "cet_vit": (lambda: create_model("cet_vit_pico", num_classes=5, img_size=16, patch_size=2), 16),
    "vitcae": (lambda: create_model("vitcae_pico", num_classes=5, img_size=16, patch_size=4, depth=2, in_chans=3), 16),
    "deit": (
        lambda: _timm("deit_tiny_distilled_patch16_224", img_size=16, patch_size=4, embed_dim=16, depth=2, num_heads=2),
        16,
    ),
    "cait": (
        lambda: _timm(
            "cait_xxs24_224", img_size=16, patch_size=4, embed_dim=16, depth=2, depth_token_only=1, num_heads=2
        ),
        16,
    ),
    "pvt_v2": (
        lambda: _timm("pvt_v2_b0", embed_dims=(8, 16, 16, 16), depths=(1, 1, 1, 1), num_heads=(1, 1, 1, 1)),
        32,
    ),
    "xcit": (
        lambda: _timm(
            "xcit_nano_12_p8_224", img_size=16, patch_size=8, embed_dim=16, depth=2, num_heads=2, cls_attn_layers=1
        ),
        16,
    ),
    "twins": (
        lambda: _timm(
            "twins_svt_small", img_size=32, embed_dims=(8, 16, 16, 16), depths=(1, 1, 1, 1), num_heads=(1, 1, 1, 1)
        ),
        32,
    ),
    "levit": (lambda: _timm("levit_128s", img_size=32), 32),
    "efficientvit": (
        lambda: _timm("efficientvit_b0", widths=(8, 16, 16, 32), depths=(1, 1, 1, 1), head_dim=8, head_widths=(32, 32)),
        32,
    ),
}


def tiny_model(name: str, *, trained: bool = False) -> tuple[nn.Module, torch.Tensor]:
    """The architecture in float64, eval mode, and three images for it; ``trained``: after three Adam steps on
    random labels (the rules are checked away from the initial weights, where some heads start at zero)."""
    build, side = ARCHITECTURES[name]
    torch.manual_seed(0)
    model = build().double()
    x = torch.randn(3, 3, side, side, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    if trained:
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
        model.train()
        for _ in range(3):
            out = model(x)
            logits = out if isinstance(out, torch.Tensor) else getattr(out, "logits", None)
            logits = out[0] if logits is None else logits
            nn.functional.cross_entropy(logits, torch.arange(3) % 5).backward()
            optimizer.step()
            optimizer.zero_grad()
    return model.eval(), x
