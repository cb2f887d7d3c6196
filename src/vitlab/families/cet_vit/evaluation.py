"""CET-ViT's metrics of the token-to-slot assignment ``S`` in ``vitlab evaluate`` (``Family.evaluation``): per image,
the reversibility and the slot-usage K; over the classes, their means and the correlation of reversibility with
accuracy (CET-ViT v4 model card: "Reversibility vs accuracy", "Slot-usage K vs. object complexity")."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from vitlab.evaluation.stats import correlation_report, per_class_mean
from vitlab.families.cet_vit.ei import reversibility
from vitlab.families.cet_vit.slots import slot_usage_k
from vitlab.jsonio import finite_or_none


def image_metrics(S: torch.Tensor) -> dict[str, torch.Tensor]:
    """``S: [B, N, K_max]`` -> ``{"reversibility": [B], "slot_usage_k": [B]}``."""
    return {"reversibility": reversibility(S), "slot_usage_k": slot_usage_k(S)}


def report(
    metrics: dict[str, torch.Tensor],
    labels: torch.Tensor,
    class_accuracy: torch.Tensor,
    class_names: list[str],
    seed: int,
) -> dict[str, Any]:
    """Per-class reversibility and slot-usage K, the classes ranked by K, and the correlation of reversibility with
    accuracy over the classes.

    ``metrics``: :func:`image_metrics` over the test set; ``labels: [B]``; ``class_accuracy: [K]`` (NaN for absent
    classes).
    """
    image_reversibility, image_slot_k = metrics["reversibility"], metrics["slot_usage_k"]
    num_classes = len(class_names)
    class_rev, counts = per_class_mean(image_reversibility, labels, num_classes)
    class_k, _ = per_class_mean(image_slot_k, labels, num_classes)
    present = counts > 0
    rev, acc = class_rev[present].numpy(), class_accuracy[present].numpy()
    if present.sum() < 3:
        correlation, skipped = None, f"only {int(present.sum())} classes have test images; the correlation needs 3"
    elif np.ptp(rev) == 0 or np.ptp(acc) == 0:
        which = "reversibility" if np.ptp(rev) == 0 else "accuracy"
        correlation, skipped = None, f"per-class {which} is the same for every class; the correlation is undefined"
    else:
        correlation, skipped = correlation_report(rev, acc, seed=seed), None
    per_class = [
        {
            "index": k,
            "class": class_names[k],
            "n": int(counts[k]),
            "reversibility": finite_or_none(class_rev[k].item()),
            "slot_usage_k": finite_or_none(class_k[k].item()),
            "accuracy": finite_or_none(class_accuracy[k].item()),
        }
        for k in range(num_classes)
    ]
    ranked = sorted((entry for entry in per_class if entry["n"] > 0), key=lambda entry: -entry["slot_usage_k"])
    return {
        "reversibility_mean": image_reversibility.mean().item(),
        "slot_usage_k_mean": image_slot_k.mean().item(),
        "correlation": correlation,
        "correlation_skipped": skipped,
        "per_class": per_class,
        "ranked_by_slot_usage_k": [entry["class"] for entry in ranked],
    }
