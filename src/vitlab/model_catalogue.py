"""The core's model presets, plain data: preset -> constructor arguments, and the catalogue derived from them.

``vitlab.config.build_config`` checks a config's ``model`` section against :data:`CATALOGUE` and the families' own
(``Family.presets``) before anything imports torch, and ``vitlab list-models`` prints them without torch;
:mod:`vitlab.models.vit` and :mod:`vitlab.models.swin` register the same tables. A class's options are the fields of
its options dataclass (``vitlab.config.model``).
"""

from __future__ import annotations

from typing import Any

#: the plain ViT classifiers (:class:`vitlab.models.vit.VisionTransformer`)
VIT_PRESETS: dict[str, dict[str, Any]] = {
    "vit_pico": dict(embed_dim=64, depth=4, num_heads=4, mlp_ratio=2.0),
    "vit_nano": dict(embed_dim=128, depth=6, num_heads=4, mlp_ratio=2.0),
    "vit_micro": dict(embed_dim=192, depth=6, num_heads=3),
    "vit_tiny": dict(embed_dim=192, depth=12, num_heads=3),
    "vit_small": dict(embed_dim=384, depth=12, num_heads=6),
    "vit_base": dict(embed_dim=768, depth=12, num_heads=12),
}
# Token Merging with r = 8 per block, the ToMe baseline of the CET-ViT v4 model card ("External baselines"), on the
# ViTs that train on a CPU; the same weights as the plain preset of the same size.
TOME_PRESETS: dict[str, dict[str, Any]] = {
    f"tome_{size}": dict(tome_r=8, **VIT_PRESETS[f"vit_{size}"]) for size in ("pico", "nano", "tiny")
}
#: Swin classifiers for 32x32 (:class:`vitlab.models.swin.SwinTransformer`)
SWIN_PRESETS: dict[str, dict[str, Any]] = {
    "swin_pico": dict(embed_dim=16, depths=(1, 1, 1, 1), num_heads=(1, 2, 4, 8), mlp_ratio=2.0),
    # CET-ViT nano's micro-encoder depths (1, 1, 2, 1)
    "swin_nano": dict(embed_dim=24, depths=(1, 1, 2, 1), num_heads=(2, 4, 8, 16)),
    "swin_micro": dict(embed_dim=32, depths=(2, 2, 2, 2), num_heads=(2, 4, 8, 16)),
    # timm's swin_tiny shape (Swin-T)
    "swin_tiny": dict(embed_dim=96, depths=(2, 2, 6, 2), num_heads=(3, 6, 12, 24)),
}


def _description(name: str, kw: dict[str, Any]) -> str:
    if name.startswith("tome_"):
        return f"vit_{name[5:]} with Token Merging, r = {kw['tome_r']} per block"
    if name.startswith("swin_"):
        return f"Swin for 32x32 (patch 2, window 4), width {kw['embed_dim']}, depths {kw['depths']}"
    return f"ViT classifier, width {kw['embed_dim']}, depth {kw['depth']}"


#: preset name -> (model class name, one-line description)
CATALOGUE: dict[str, tuple[str, str]] = {
    **{name: ("VisionTransformer", _description(name, kw)) for name, kw in {**VIT_PRESETS, **TOME_PRESETS}.items()},
    **{name: ("SwinTransformer", _description(name, kw)) for name, kw in SWIN_PRESETS.items()},
}
