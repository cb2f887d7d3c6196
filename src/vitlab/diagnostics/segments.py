"""Segment maps of a token-to-slot assignment: which macro slot each micro token joined, drawn over the image.

CET-ViT's V-CEO routes every micro token (one image patch) to its top-3 of ``K_max`` slots (card: "V-CEO Module");
colouring each patch by its strongest slot shows the groups the model formed without segmentation supervision (the
card's "emergent semantic regions", cf. Slot Attention and GroupViT). Slot ``k`` has the same colour in every image,
so a slot reused across images reads as one colour. Drawn with matplotlib's Agg canvas (no display needed).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import matplotlib
import numpy as np
import torch
import torch.nn.functional as F
from matplotlib.figure import Figure

from vitlab.rundir import save_figure

_QUALITATIVE = ("tab20", "tab20b", "tab20c")  # 60 distinct colours; more slots fall back to an evenly spaced hue


def segment_map(S: torch.Tensor, grid: tuple[int, int]) -> torch.Tensor:
    """Top slot of every micro token on the patch grid. ``S: [B, N, K]`` with ``N = Gh * Gw`` tokens in row-major
    order (as the patch embedding flattens them) ``-> [B, Gh, Gw]`` (long)."""
    if S.ndim != 3:
        raise ValueError(f"S must be [B, N, K], got shape {list(S.shape)}")
    height, width = grid
    if S.shape[1] != height * width:
        raise ValueError(f"S has {S.shape[1]} tokens but the grid {height}x{width} holds {height * width}")
    return S.argmax(-1).view(S.shape[0], height, width)


def slot_palette(num_slots: int) -> np.ndarray:
    """``[K, 3]`` RGB colours in [0, 1], one per slot: matplotlib's qualitative maps, then evenly spaced hues.

    The tab20 maps hold pairs of a dark and a light shade of one hue; the dark shades come first, so the first ten
    slots get ten different hues.
    """
    pairs = [np.asarray(matplotlib.colormaps[name].colors)[:, :3] for name in _QUALITATIVE]
    colours = np.concatenate([shades[0::2] for shades in pairs] + [shades[1::2] for shades in pairs])
    if num_slots <= len(colours):
        return colours[:num_slots]
    return matplotlib.colormaps["hsv"](np.linspace(0, 1, num_slots, endpoint=False))[:, :3]


def colour_segments(segments: torch.Tensor, num_slots: int, size: tuple[int, int]) -> np.ndarray:
    """``segments: [B, Gh, Gw]`` slot indices -> ``[B, H, W, 3]`` colours, each token's cell blown up to its patch
    (nearest-neighbour) at image size ``size = (H, W)``."""
    upsampled = F.interpolate(segments[:, None].float(), size=size, mode="nearest")[:, 0].long()
    return slot_palette(num_slots)[upsampled.numpy()]


def overlay(images: np.ndarray, colours: np.ndarray, alpha: float) -> np.ndarray:
    """Alpha blend ``(1 - alpha) * image + alpha * colour``; ``images, colours: [B, H, W, 3]`` in [0, 1]."""
    if not 0 <= alpha <= 1:
        raise ValueError(f"alpha must lie in [0, 1], got {alpha}")
    return np.clip((1 - alpha) * images + alpha * colours, 0.0, 1.0)  # rounding may step past 1


def draw_segment_maps(
    images: torch.Tensor,
    S: torch.Tensor,
    grid: tuple[int, int],
    *,
    titles: Sequence[str] | None = None,
    alpha: float = 0.45,
) -> Figure:
    """A grid with one column per image: the image, its segment map, and the two alpha-blended.

    ``images: [B, C, H, W]`` in [0, 1] (C = 1 or 3), ``S: [B, N, K]`` their assignments on the ``grid`` of
    tokens, ``titles``: one caption per image (e.g. the label, the prediction and the slot-usage K).
    """
    if images.ndim != 4 or images.shape[1] not in (1, 3):
        raise ValueError(f"images must be [B, C, H, W] with 1 or 3 channels, got shape {list(images.shape)}")
    if len(images) != len(S) or len(images) == 0:
        raise ValueError(f"need one assignment per image and at least one image, got {len(images)} and {len(S)}")
    if titles is not None and len(titles) != len(images):
        raise ValueError(f"need one title per image, got {len(titles)} for {len(images)} images")
    size = (images.shape[2], images.shape[3])
    rgb = images.detach().float().clamp(0, 1).expand(-1, 3, -1, -1).permute(0, 2, 3, 1).cpu().numpy()
    colours = colour_segments(segment_map(S.detach().cpu(), grid), S.shape[-1], size)
    blended = overlay(rgb, colours, alpha)
    count = len(images)
    figure = Figure(figsize=(1.6 * count, 5.0), layout="constrained")
    axes = figure.subplots(3, count, squeeze=False)
    for column in range(count):
        for row, (panel, label) in enumerate(((rgb, "image"), (colours, "top slot"), (blended, "overlay"))):
            ax = axes[row, column]
            ax.imshow(panel[column], interpolation="nearest")
            ax.set_xticks([])
            ax.set_yticks([])
            if column == 0:
                ax.set_ylabel(label)
        if titles is not None:
            axes[0, column].set_title(titles[column], fontsize=8)
    return figure


def save_segment_maps(
    path: str | Path,
    images: torch.Tensor,
    S: torch.Tensor,
    grid: tuple[int, int],
    *,
    titles: Sequence[str] | None = None,
    alpha: float = 0.45,
    dpi: int = 120,
) -> Path:
    """:func:`draw_segment_maps` written to a PNG at ``path`` (its folder is created)."""
    return save_figure(draw_segment_maps(images, S, grid, titles=titles, alpha=alpha), path, dpi=dpi)
