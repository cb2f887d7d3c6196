"""The core's model presets, as plain names: preset -> (model class, description).

``vitlab.config.build_config`` checks a config's ``model`` section against this table and the families' own
(``Family.presets``) before anything imports torch, and ``vitlab list-models`` prints them without torch. The table is
the registry's, written out (``tests/models/test_catalogue.py`` checks that the two agree and prints the table to
paste when they do not); a class's options are the keys of its ``model`` section type (``vitlab.config.model``).
"""

from __future__ import annotations

#: preset name -> (model class name, one-line description)
PRESETS: dict[str, tuple[str, str]] = {
    "swin_micro": ("SwinTransformer", "Swin for 32x32 (patch 2, window 4), width 32, depths (2, 2, 2, 2)"),
    "swin_nano": ("SwinTransformer", "Swin for 32x32 (patch 2, window 4), width 24, depths (1, 1, 2, 1)"),
    "swin_pico": ("SwinTransformer", "Swin for 32x32 (patch 2, window 4), width 16, depths (1, 1, 1, 1)"),
    "swin_tiny": ("SwinTransformer", "Swin for 32x32 (patch 2, window 4), width 96, depths (2, 2, 6, 2)"),
    "tome_nano": ("VisionTransformer", "vit_nano with Token Merging, r = 8 per block"),
    "tome_pico": ("VisionTransformer", "vit_pico with Token Merging, r = 8 per block"),
    "tome_tiny": ("VisionTransformer", "vit_tiny with Token Merging, r = 8 per block"),
    "vit_base": ("VisionTransformer", "ViT classifier, width 768, depth 12"),
    "vit_micro": ("VisionTransformer", "ViT classifier, width 192, depth 6"),
    "vit_nano": ("VisionTransformer", "ViT classifier, width 128, depth 6"),
    "vit_pico": ("VisionTransformer", "ViT classifier, width 64, depth 4"),
    "vit_small": ("VisionTransformer", "ViT classifier, width 384, depth 12"),
    "vit_tiny": ("VisionTransformer", "ViT classifier, width 192, depth 12"),
}
