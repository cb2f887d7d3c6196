"""How many points CET-ViT's grouping is worth: the test-time assignment ablation (docs/experiments/cet_vit_ablation.md,
"Why it falls behind the matched ViT").

The learned assignment ``S`` is replaced at test time by a random top-k (each token keeps its own top-k weights on
``k`` slots drawn at random) or by the uniform assignment (every token spread over all slots, so all macro tokens
are equal), with the weights left alone (:func:`vitlab.families.cet_vit.slots.ablate_assignment`). The accuracy lost is
what the learned grouping contributes; slot-usage K (card, Disclosure 1) is reported beside it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

from vitlab.families.cet_vit.slots import ASSIGNMENT_ABLATIONS


@torch.no_grad()
def grouping_ablation(
    model: nn.Module, batches: Iterable[tuple[torch.Tensor, torch.Tensor]], *, seed: int = 0
) -> dict[str, Any]:
    """Accuracy with the learned S, a random top-k S and a uniform S, and the mean slot-usage K with the learned S.

    ``model``: a CET-ViT (``forward_with_aux`` and the ``assignment_ablation`` attribute), put in eval mode.
    ``batches``: ``(x [B, C, H, W] normalised, y [B])``. The random draws are seeded (``seed``), so a rerun gives the
    same numbers. Returns ``acc_<mode>`` for each mode, ``points_<mode>`` (learned minus ablated, in percentage
    points), ``slot_usage_k`` and ``n``.
    """
    if not hasattr(model, "assignment_ablation"):
        raise TypeError(f"{type(model).__name__} has no assignment S to ablate; the grouping ablation is for CET-ViT")
    model.eval()
    correct = dict.fromkeys(ASSIGNMENT_ABLATIONS, 0)
    slot_k, n = 0.0, 0
    torch.manual_seed(seed)  # ablate_assignment draws from the global generator
    try:
        for x, y in batches:
            for mode in ASSIGNMENT_ABLATIONS:
                model.assignment_ablation = mode
                logits, aux = model.forward_with_aux(x, compute_ei=False)
                correct[mode] += (logits.argmax(-1) == y).sum().item()
                if mode == "none":
                    slot_k += aux.slot_usage_k.float().sum().item()
            n += len(y)
    finally:
        model.assignment_ablation = "none"
    if n == 0:
        raise ValueError("grouping_ablation got no images")
    result: dict[str, Any] = {f"acc_{mode}": correct[mode] / n for mode in ASSIGNMENT_ABLATIONS}
    for mode in ASSIGNMENT_ABLATIONS[1:]:
        result[f"points_{mode}"] = 100.0 * (result["acc_none"] - result[f"acc_{mode}"])
    result["slot_usage_k"] = slot_k / n
    result["n"] = n
    return result
