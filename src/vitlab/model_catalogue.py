"""The core's model presets, as plain names: preset -> (model class, description).

``vitlab.config.build_config`` checks a config's ``model`` section against this table and the families' own
(``Family.presets``) before anything imports torch, and ``vitlab list-models`` prints them without torch. The table is
the registry's, written out (``tests/models/test_catalogue.py`` checks that the two agree and prints the table to
paste when they do not); a class's options are the keys of its ``model`` section type (``vitlab.config.model``).
"""

from __future__ import annotations

#: preset name -> (model class name, one-line description)
PRESETS: dict[str, tuple[str, str]] = {
    "swin_matched_cet_vit_base": (
        "SwinTransformer",
        "swin_tiny at width 105, size-matched to cet_vit_base (32x32, patch 2, 100 classes)",
    ),
    "swin_matched_cet_vit_nano": (
        "SwinTransformer",
        "swin_nano at width 24, size-matched to cet_vit_nano (32x32, patch 2, 10 classes)",
    ),
    "swin_matched_cet_vit_tiny": (
        "SwinTransformer",
        "swin_micro at width 32, size-matched to cet_vit_tiny (32x32, patch 2, 10 classes)",
    ),
    "swin_micro": ("SwinTransformer", "Swin for 32x32 (patch 2, window 4), width 32, depths (2, 2, 2, 2)"),
    "swin_nano": ("SwinTransformer", "Swin for 32x32 (patch 2, window 4), width 24, depths (1, 1, 2, 1)"),
    "swin_pico": ("SwinTransformer", "Swin for 32x32 (patch 2, window 4), width 16, depths (1, 1, 1, 1)"),
    "swin_tiny": ("SwinTransformer", "Swin for 32x32 (patch 2, window 4), width 96, depths (2, 2, 6, 2)"),
    "tome_matched_cet_vit_base": (
        "VisionTransformer",
        "vit_base + ToMe r = 8 at width 480, size-matched to cet_vit_base (32x32, patch 2, 100 classes)",
    ),
    "tome_matched_cet_vit_nano": (
        "VisionTransformer",
        "vit_nano + ToMe r = 8 at width 128, size-matched to cet_vit_nano (32x32, patch 2, 10 classes)",
    ),
    "tome_matched_cet_vit_tiny": (
        "VisionTransformer",
        "vit_micro + ToMe r = 8 at width 177, size-matched to cet_vit_tiny (32x32, patch 2, 10 classes)",
    ),
    "tome_nano": ("VisionTransformer", "vit_nano with Token Merging, r = 8 per block"),
    "tome_pico": ("VisionTransformer", "vit_pico with Token Merging, r = 8 per block"),
    "tome_tiny": ("VisionTransformer", "vit_tiny with Token Merging, r = 8 per block"),
    "vit_base": ("VisionTransformer", "ViT classifier, width 768, depth 12"),
    "vit_matched_cet_vit_base": (
        "VisionTransformer",
        "vit_base at width 480, size-matched to cet_vit_base (32x32, patch 2, 100 classes)",
    ),
    "vit_matched_cet_vit_nano": (
        "VisionTransformer",
        "vit_nano at width 128, size-matched to cet_vit_nano (32x32, patch 2, 10 classes)",
    ),
    "vit_matched_cet_vit_tiny": (
        "VisionTransformer",
        "vit_micro at width 177, size-matched to cet_vit_tiny (32x32, patch 2, 10 classes)",
    ),
    "vit_micro": ("VisionTransformer", "ViT classifier, width 192, depth 6"),
    "vit_nano": ("VisionTransformer", "ViT classifier, width 128, depth 6"),
    "vit_pico": ("VisionTransformer", "ViT classifier, width 64, depth 4"),
    "vit_small": ("VisionTransformer", "ViT classifier, width 384, depth 12"),
    "vit_tiny": ("VisionTransformer", "ViT classifier, width 192, depth 12"),
}
