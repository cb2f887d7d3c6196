"""How faithful an explanation is: deletion and insertion curves, the model-randomisation sanity check, time.

- Deletion / insertion (Petsiuk, Das & Saenko, "RISE", BMVC 2018, sec. 4.1): the image's patches are removed
  (set to zero, the dataset mean after normalisation) or inserted into a zero image, most relevant first, and the
  target class's probability is followed; the area under that curve (mean over the steps, from 0 to all patches)
  is low for a faithful deletion order and high for a faithful insertion order. The same curves under a random
  order are the reference.
- Model-randomisation sanity check (Adebayo et al., "Sanity Checks for Saliency Maps", NeurIPS 2018, sec. 3.1):
  the Spearman rank correlation between the maps of the trained model and of the same architecture with freshly
  initialised weights, on absolute values; a map that depends on what the model learned correlates little.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from scipy.stats import spearmanr
from torch import nn

from vitlab.explain.adapters import OVERVIEW_METHODS, Explainer, MethodRefused, explainer_for
from vitlab.explain.api import explain, explainer_on
from vitlab.progress import progress


def patch_relevance(maps: torch.Tensor, patch: int) -> torch.Tensor:
    """``[B, H, W] -> [B, (H / patch) * (W / patch)]``: the summed relevance of each ``patch x patch`` square."""
    return F.avg_pool2d(maps[:, None].double(), patch)[:, 0].flatten(1)


def _masks(order: torch.Tensor, grid: tuple[int, int], patch: int, steps: int) -> torch.Tensor:
    """``order: [P]`` patch indices -> ``[steps + 1, 1, H, W]`` masks, mask ``s`` = the first ``s / steps`` of them."""
    num = order.numel()
    masks = torch.zeros(steps + 1, num)
    for s in range(steps + 1):
        masks[s, order[: round(s * num / steps)]] = 1.0
    return F.interpolate(masks.view(steps + 1, 1, *grid), scale_factor=patch, mode="nearest")


@torch.no_grad()
def deletion_insertion(
    model: nn.Module, images: torch.Tensor, target: torch.Tensor, orders: torch.Tensor, *, patch: int, steps: int
) -> tuple[np.ndarray, np.ndarray]:
    """Per image, the deletion and insertion AUC of the target probability for a patch order.

    ``images: [B, C, H, W]`` (normalised), ``orders: [B, P]`` patch indices, most relevant first. Returns two
    ``[B]`` arrays: the mean of the probability over ``steps + 1`` points from none to all patches changed.
    """
    ex = explainer_for(model)
    grid = (images.shape[-2] // patch, images.shape[-1] // patch)
    deletion, insertion = [], []
    for image, t, order in zip(images, target, orders, strict=True):
        masks = _masks(order, grid, patch, steps).to(image)
        curves = []
        for batch in (image * (1 - masks), image * masks):
            curves.append(ex.logits(model, batch).softmax(-1)[:, t].double().cpu().numpy())
        deletion.append(curves[0].mean())
        insertion.append(curves[1].mean())
    return np.asarray(deletion), np.asarray(insertion)


def randomised_copy(model: nn.Module, seed: int = 0) -> nn.Module:
    """The same architecture with every parameter drawn again from ``N(0, 0.02^2)`` and every LayerNorm reset to
    the identity: Adebayo et al.'s full (cascading) randomisation, down to the patch embedding."""
    fresh = copy.deepcopy(model)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in fresh.parameters():
            p.copy_(torch.randn(p.shape, generator=generator, dtype=p.dtype) * 0.02)
        for m in fresh.modules():
            if isinstance(m, nn.LayerNorm | nn.GroupNorm) and m.weight is not None:
                m.weight.fill_(1.0)
                m.bias.zero_()
    return fresh


def rank_correlation(a: torch.Tensor, b: torch.Tensor) -> np.ndarray:
    """``[B]``: Spearman's rho between ``|a[i]|`` and ``|b[i]|`` over pixels (NaN for a constant map)."""
    pairs = zip(a.abs().flatten(1).numpy(), b.abs().flatten(1).numpy(), strict=True)
    return np.asarray([spearmanr(x, y).statistic if x.std() > 0 and y.std() > 0 else np.nan for x, y in pairs], float)


def _explain_batches(
    model: nn.Module, images: torch.Tensor, method: str, batch_size: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, float]:
    """The method's maps, targets and conservation (None where it has none) over ``images`` in batches, and the
    seconds the explanations took."""
    maps, targets, conservation, seconds = [], [], [], 0.0
    for start in range(0, images.shape[0], batch_size):
        began = time.perf_counter()
        explanation = explain(model, images[start : start + batch_size], method=method)
        seconds += time.perf_counter() - began
        maps.append(explanation.maps)
        targets.append(explanation.target)
        if explanation.conservation is not None:
            conservation.append(explanation.conservation)
    return torch.cat(maps), torch.cat(targets), torch.cat(conservation) if conservation else None, seconds


def evaluate_method(
    model: nn.Module,
    images: torch.Tensor,
    method: str,
    *,
    patch: int,
    steps: int = 16,
    batch_size: int = 8,
    seed: int = 0,
) -> dict[str, Any]:
    """One method on ``images: [B, C, H, W]``: per-image deletion/insertion AUC (and under a random order),
    the sanity-check correlation, conservation, and seconds per image. Returns lists per image and their means."""
    maps_t, target, conservation, seconds = _explain_batches(model, images, method, batch_size)
    generator = torch.Generator().manual_seed(seed)
    relevance = patch_relevance(maps_t, patch)
    order = relevance.argsort(dim=1, descending=True)
    random_order = torch.stack([torch.randperm(relevance.shape[1], generator=generator) for _ in relevance])
    deletion, insertion = deletion_insertion(model, images, target, order, patch=patch, steps=steps)
    random_deletion, random_insertion = deletion_insertion(
        model, images, target, random_order, patch=patch, steps=steps
    )
    random_model = randomised_copy(model, seed)
    random_maps = torch.cat(
        [
            explain(random_model, images[s : s + batch_size], method=method, target=target[s : s + batch_size]).maps
            for s in range(0, images.shape[0], batch_size)
        ]
    )
    rho = rank_correlation(maps_t, random_maps)
    per_image = {
        "deletion_auc": deletion.tolist(),
        "insertion_auc": insertion.tolist(),
        "random_deletion_auc": random_deletion.tolist(),
        "random_insertion_auc": random_insertion.tolist(),
        "randomisation_spearman": rho.tolist(),
    }
    if conservation is not None:
        per_image["conservation"] = conservation.double().tolist()
    summary = {key: float(np.nanmean(values)) for key, values in per_image.items()}
    if conservation is not None:
        summary["conservation_max"] = float(max(per_image["conservation"]))
    summary["seconds_per_image"] = seconds / images.shape[0]
    return {"summary": summary, "per_image": per_image}


def evaluate_methods(
    model: nn.Module,
    images: torch.Tensor,
    methods: Sequence[str] | None = None,
    explainer: Explainer | None = None,
    **kwargs: Any,
) -> dict[str, Any]:
    """The applicable overview methods (or ``methods``) through :func:`evaluate_method`; the refused ones with
    reasons (declared, or found when the LRP rules meet an operation they have none for: :func:`explainer_on`,
    unless ``explainer`` is that already)."""
    ex = explainer or explainer_on(model, images[:1], methods or OVERVIEW_METHODS)
    chosen = list(methods or ex.applicable(OVERVIEW_METHODS))
    for m in chosen:
        ex.check(m)
    results, refused = {}, dict(ex.refused)
    for m in progress(chosen, "vitlab explain --evaluate: method", name=str):
        try:
            results[m] = evaluate_method(model, images, m, **kwargs)
        except MethodRefused as e:
            refused[m] = str(e)
    return {"kind": ex.kind, "methods": results, "refused": refused}
