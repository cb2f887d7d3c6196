"""CET-ViT's presets, plain data: its own and the size-matched baselines', in the family's preset table
(``Family.presets``), from which the config check, ``vitlab list-models`` and the model registry read them."""

from typing import Any

#: preset name -> constructor arguments of :class:`~vitlab.families.cet_vit.model.CETViT`
PRESETS: dict[str, dict] = {
    "cet_vit_pico": dict(
        embed_dims=(32, 32, 64, 64),
        depths=(1, 1, 1, 1),
        num_heads=(2, 2, 4, 4),
        num_slots=16,
        k_candidates=(4, 8, 16),
        fusion_dim=64,
        fusion_heads=4,
        macro_depth=1,
        deep_depth=1,
        mlp_ratio=2.0,
    ),
    "cet_vit_nano": dict(
        embed_dims=(48, 48, 96, 96),
        depths=(1, 1, 2, 1),
        num_heads=(3, 3, 6, 6),
        fusion_dim=96,
        fusion_heads=3,
        macro_depth=2,
        deep_depth=1,
    ),
    # cet_vit_nano's parameters (within 1% at patch 4) moved into the micro encoder: one width-96 Swin stage of 6
    # blocks (3 shifted) at the full token grid, and a width-64 part after the V-CEO
    # (docs/experiments/cet_vit_ablation.md, "Which element costs the accuracy").
    "cet_vit_nano_wide": dict(
        embed_dims=(96,), depths=(6,), num_heads=(6,), fusion_dim=64, fusion_heads=2, macro_depth=1, deep_depth=1
    ),
    # cet_vit_nano's size with a micro encoder shaped like the matched ViT's blocks: 3 blocks of width 128, 4 heads of
    # 32, MLP ratio 2, and global attention (a window of 16 shrinks to the grid: 8x8 at patch 4, 16x16 at patch 2),
    # then the card's V-CEO (8:1 slots, empty ones masked), MacroEncoder, CrossScaleAttention and DeepEncoder at the
    # same width (docs/experiments/cet_vit_ablation.md, "The micro encoder's shape is the cost").
    "cet_vit_nano_global": dict(
        embed_dims=(128,),
        depths=(3,),
        num_heads=(4,),
        window_size=16,
        mlp_ratio=2.0,
        pos_embed="learned",
        slot_ratio=8,
        mask_empty_slots=True,
        fusion_dim=128,
        fusion_heads=4,
        macro_depth=1,
        deep_depth=1,
    ),
    "cet_vit_tiny": dict(
        embed_dims=(64, 64, 128, 192),
        depths=(2, 2, 2, 2),
        num_heads=(2, 2, 4, 6),
        fusion_dim=128,
        fusion_heads=4,
        macro_depth=2,
        deep_depth=1,
    ),
    "cet_vit_base": dict(),
}
DESCRIPTIONS: dict[str, str] = {
    "cet_vit_pico": "CET-ViT for CPU smoke runs (~0.2M params, 16 slots)",
    "cet_vit_nano": "CET-ViT for CPU training in minutes (~0.8M params)",
    "cet_vit_nano_wide": "cet_vit_nano's size with 81% of it in a width-96 micro encoder (ablation, ~0.82M params)",
    "cet_vit_nano_global": "cet_vit_nano's size, a global ViT-shaped micro encoder (width 128, MLP 2), 8:1 slots",
    "cet_vit_tiny": "small CET-ViT (~2.3M params)",
    "cet_vit_base": "CET-ViT v4 Base sized to the model card (33.5M params on 32x32, 100 classes; card: 33.12M)",
}
#: The input each CET-ViT preset is compared at (patch 2 is CET-ViT's default): CPU presets on CIFAR-10,
#: ``cet_vit_base`` on CIFAR-100 (the card's table).
MATCH_INPUTS: dict[str, dict[str, int]] = {
    "cet_vit_nano": dict(img_size=32, in_chans=3, num_classes=10),
    "cet_vit_tiny": dict(img_size=32, in_chans=3, num_classes=10),
    "cet_vit_base": dict(img_size=32, in_chans=3, num_classes=100),
}
#: Tokens merged per block by the ToMe baseline (the card's "size-matched ViT, r=8"); ToMe adds no parameters.
TOME_R = 8

#: ``{cet preset: {family: (base preset, keyword arguments)}}``: ``match_width(base, <cet params>, patch_size=2,
#: **MATCH_INPUTS[cet])`` at authoring time, hard-coded. The ToMe baseline is the ViT with ``tome_r = TOME_R``.
MATCHED: dict[str, dict[str, tuple[str, dict[str, Any]]]] = {
    "cet_vit_nano": {
        "vit": ("vit_nano", dict(embed_dim=128, depth=6, num_heads=4, mlp_ratio=2.0)),
        "swin": ("swin_nano", dict(embed_dim=24, depths=(1, 1, 2, 1), num_heads=(2, 4, 8, 16))),
    },
    "cet_vit_tiny": {
        "vit": ("vit_micro", dict(embed_dim=177, depth=6, num_heads=3)),
        "swin": ("swin_micro", dict(embed_dim=32, depths=(2, 2, 2, 2), num_heads=(2, 4, 8, 16))),
    },
    "cet_vit_base": {
        "vit": ("vit_base", dict(embed_dim=480, depth=12, num_heads=12)),
        "swin": ("swin_tiny", dict(embed_dim=105, depths=(2, 2, 6, 2), num_heads=(3, 6, 12, 24))),
    },
}


def _baselines() -> dict[str, tuple[str, str, str, dict[str, Any]]]:
    """Every size-matched baseline: name -> (model class, CET-ViT preset it matches, base preset, arguments)."""
    out = {}
    for target, matched in MATCHED.items():
        inputs = {**MATCH_INPUTS[target], "patch_size": 2}
        (vit_base, vit), (swin_base, swin) = matched["vit"], matched["swin"]
        out[f"vit_matched_{target}"] = ("VisionTransformer", target, vit_base, {**vit, **inputs})
        out[f"tome_matched_{target}"] = ("VisionTransformer", target, vit_base, {**vit, **inputs, "tome_r": TOME_R})
        out[f"swin_matched_{target}"] = ("SwinTransformer", target, swin_base, {**swin, **inputs})
    return out


#: the baselines matched in size to CET-ViT (CET-ViT v4 model card: "External baselines trained under an identical
#: protocol"): within 2% of its parameters at :data:`MATCH_INPUTS`; ``tests/models/test_sizing.py`` checks that the
#: hard-coded widths still match. Table: docs/baselines.md, "The matched presets".
BASELINES = _baselines()


def _baseline_description(target: str, base: str, kwargs: dict[str, Any]) -> str:
    what = f"{base} + ToMe r = {TOME_R}" if "tome_r" in kwargs else base
    size = MATCH_INPUTS[target]["img_size"]
    return (
        f"{what} at width {kwargs['embed_dim']}, size-matched to {target} "
        f"({size}x{size}, patch 2, {MATCH_INPUTS[target]['num_classes']} classes)"
    )


#: preset name -> (model class, description, constructor arguments): the family's table, read without torch
TABLE: dict[str, tuple[str, str, dict[str, Any]]] = {
    **{name: ("CETViT", DESCRIPTIONS[name], kw) for name, kw in PRESETS.items()},
    **{name: (cls, _baseline_description(target, base, kw), kw) for name, (cls, target, base, kw) in BASELINES.items()},
}
