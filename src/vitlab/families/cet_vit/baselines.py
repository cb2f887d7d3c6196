"""Baselines matched in size to CET-ViT (CET-ViT v4 model card: "External baselines trained under an identical
protocol"): presets of the core's ViT, ToMe and Swin in the family's table.

"Size-matched" is within 2% of CET-ViT's parameter count, on CET-ViT's input (32x32 images in 2x2 patches) at the
dataset each preset is meant for (:data:`vitlab.families.cet_vit.presets.MATCH_INPUTS`). The widths were found by
:func:`vitlab.models.sizing.match_width` (only the width changes) and are hard-coded in
:mod:`vitlab.families.cet_vit.presets`, so a preset never changes under a user; ``tests/models/test_sizing.py``
checks that they still match. Table: docs/baselines.md, "The matched presets".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torch import nn

from vitlab.families.cet_vit.presets import BASELINES
from vitlab.models.swin import SwinTransformer
from vitlab.models.vit import VisionTransformer


@dataclass(frozen=True)
class MatchedPreset:
    """A size-matched baseline: its CET-ViT ``target``, the ``base`` preset whose shape it widens or narrows."""

    name: str
    target: str
    base: str
    cls: type[nn.Module]
    kwargs: dict[str, Any]


_CLASSES: dict[str, type[nn.Module]] = {"VisionTransformer": VisionTransformer, "SwinTransformer": SwinTransformer}


def matched_presets() -> list[MatchedPreset]:
    """Every size-matched baseline: ``vit_matched_<cet>``, ``tome_matched_<cet>``, ``swin_matched_<cet>``."""
    return [MatchedPreset(name, target, base, _CLASSES[cls], kw) for name, (cls, target, base, kw) in BASELINES.items()]
