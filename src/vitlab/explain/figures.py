"""Overlays of explanation maps on their images, and the faithfulness figure of ``vitlab explain --evaluate``.

The figures are plain ``matplotlib.figure.Figure`` objects, not pyplot's: pyplot keeps every figure it makes open
until it is closed, so explaining a folder image by image grew by a figure per image; these are freed with their last
reference (matplotlib's "Embedding in a web application server" example).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
from matplotlib.figure import Figure

#: methods whose maps are signed (shown on a diverging scale centred at zero)
SIGNED = ("lrp", "cp_lrp", "lrp_epsilon", "lrp_gamma", "input_x_gradient", "gradient_shap", "occlusion",
          "integrated_gradients")  # fmt: skip
TITLES = {
    "attention": "attention",
    "rollout": "rollout",
    "grad_rollout": "grad. rollout",
    "lrp": "HiLRP",
    "cp_lrp": "CP-LRP",
    "lrp_epsilon": "LRP-eps",
    "lrp_gamma": "LRP-gamma",
    "gradcam": "Grad-CAM",
    "saliency": "saliency",
    "input_x_gradient": "input x grad.",
    "smoothgrad": "SmoothGrad",
    "gradient_shap": "GradientShap",
    "occlusion": "occlusion",
    "integrated_gradients": "int. gradients",
}


def _display(image: torch.Tensor) -> np.ndarray:
    """``[C, H, W]`` in [0, 1] -> an array imshow takes."""
    array = image.permute(1, 2, 0).clamp(0, 1).cpu().numpy()
    return array[..., 0] if array.shape[-1] == 1 else array


def draw_overlay(ax: Any, image: torch.Tensor, heat: torch.Tensor, method: str) -> None:
    """One map over its image (grey): signed maps on ``bwr`` at +-99th percentile, the others on ``inferno``."""
    grey = image.mean(0).cpu().numpy()
    ax.imshow(grey, cmap="gray", interpolation="bilinear")
    heat = heat.double().cpu().numpy()
    if method in SIGNED:
        bound = float(np.percentile(np.abs(heat), 99)) or 1.0
        ax.imshow(heat, cmap="bwr", vmin=-bound, vmax=bound, alpha=0.7, interpolation="bilinear")
    else:
        low, high = float(heat.min()), float(heat.max())
        ax.imshow((heat - low) / (high - low or 1.0), cmap="inferno", alpha=0.6, interpolation="bilinear")
    ax.set_axis_off()


def overlay_grid(
    images: torch.Tensor, maps: Mapping[str, torch.Tensor], captions: Sequence[str] | None = None
) -> Figure:
    """Rows of images, columns: the image, then one overlay per method. ``images: [B, C, H, W]`` in [0, 1],
    ``maps[method]: [B, H, W]``; ``captions[i]`` labels row ``i``."""
    rows, cols = images.shape[0], 1 + len(maps)
    fig = Figure(figsize=(1.6 * cols, 1.6 * rows))
    axes = fig.subplots(rows, cols, squeeze=False)
    for i in range(rows):
        axes[i, 0].imshow(_display(images[i]), cmap="gray" if images.shape[1] == 1 else None, interpolation="bilinear")
        axes[i, 0].set_axis_off()
        if captions:
            axes[i, 0].set_title(captions[i], fontsize=7)
        for j, (method, heat) in enumerate(maps.items(), start=1):
            draw_overlay(axes[i, j], images[i], heat[i], method)
            if i == 0:
                axes[i, j].set_title(TITLES.get(method, method), fontsize=8)
    fig.tight_layout(pad=0.2)
    return fig


def faithfulness_figure(results: Mapping[str, Any], title: str) -> Figure:
    """Bars per method: deletion AUC (lower is better) and insertion AUC (higher), each next to the random
    order's, and the randomisation rank correlation (lower is better)."""
    methods = list(results["methods"])
    summary = [results["methods"][m]["summary"] for m in methods]
    fig = Figure(figsize=(11, 3.2))
    axes = fig.subplots(1, 3)
    x = np.arange(len(methods))
    for ax, key, label in (
        (axes[0], "deletion_auc", "deletion AUC (lower: faithful)"),
        (axes[1], "insertion_auc", "insertion AUC (higher: faithful)"),
    ):
        ax.bar(x - 0.2, [s[key] for s in summary], 0.4, label="method order")
        ax.bar(x + 0.2, [s[f"random_{key}"] for s in summary], 0.4, label="random order", color="0.7")
        ax.set_title(label, fontsize=9)
    axes[2].bar(x, [s["randomisation_spearman"] for s in summary], 0.5, color="tab:red")
    axes[2].set_title("rank corr. with a randomised model (lower: passes)", fontsize=9)
    for ax in axes:
        ax.set_xticks(x, [TITLES.get(m, m) for m in methods], rotation=30, ha="right", fontsize=8)
    axes[0].legend(fontsize=7)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig
