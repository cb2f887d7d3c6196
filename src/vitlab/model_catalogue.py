"""The core's model presets, plain data: one table, preset -> (model class, description, constructor arguments).

It is the core's part of the one preset namespace (``vitlab.family.presets``, the families' tables after it):
``vitlab.config.build_config`` checks a config's ``model`` section against it before anything imports torch,
``vitlab list-models`` prints it without torch, and the model registry (``vitlab.models.registry``) builds the presets
from it. A class's options are the fields of its options dataclass (``vitlab.config.model``).
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


#: the core's model classes: class name -> where it is defined (a family's table may name them too)
CORE_MODELS: dict[str, str] = {
    "VisionTransformer": "vitlab.models.vit:VisionTransformer",
    "SwinTransformer": "vitlab.models.swin:SwinTransformer",
}
#: preset name -> (model class name, one-line description, constructor arguments)
PRESETS: dict[str, tuple[str, str, dict[str, Any]]] = {
    **{name: ("VisionTransformer", _description(name, kw), kw) for name, kw in {**VIT_PRESETS, **TOME_PRESETS}.items()},
    **{name: ("SwinTransformer", _description(name, kw), kw) for name, kw in SWIN_PRESETS.items()},
}
