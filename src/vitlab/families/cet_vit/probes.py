"""CET-ViT's readings of the sparse assignment ``S`` (CET-ViT v4 model card: Disclosure 2, "Slot-usage K vs. object
complexity"), the ``vitlab probe`` sub-commands ``reversibility`` and ``slot-k``:

- :func:`reversibility_table`: the card's reading table of ``reversibility = sigma_1 / sum(sigma)`` on synthetic
  assignment matrices, with the two ReLU terms of the EI loss;
- :func:`collect_assignments` and :func:`slot_usage_summary`: the post-hoc slot-usage K per image and per class.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from vitlab.evaluation.stats import per_class_mean
from vitlab.families.cet_vit.ei import ei_terms
from vitlab.families.cet_vit.slots import slot_usage_k, topk_softmax
from vitlab.models.protocols import SlotAssigner


# -------------------------------------------------------------------------------------------------------------------
# The card's reversibility table
# -------------------------------------------------------------------------------------------------------------------
def balanced_one_hot(num_tokens: int, num_slots: int) -> torch.Tensor:
    """``[N, K]``: token n goes wholly to slot ``n mod K``. With ``K | N`` every singular value is ``sqrt(N / K)``,
    so ``reversibility = 1 / K`` exactly (the lower bound)."""
    return F.one_hot(torch.arange(num_tokens) % num_slots, num_slots).float()


def common_mode_mixture(a: float, num_tokens: int, num_slots: int) -> torch.Tensor:
    """``[1, N, K]``: ``S = (1 - a) E + a / K``, a balanced one-hot ``E`` mixed with the uniform row.

    Worked by hand (``K | N``): ``S^T S = (N/K) [(1 - a)^2 I + (2a - a^2)/K 11^T]``, so ``sigma_1 = sqrt(N/K)`` and
    the other ``K - 1`` singular values are ``sqrt(N/K) (1 - a)``: ``reversibility = 1 / (1 + (K - 1)(1 - a))``.
    """
    if num_tokens % num_slots:
        raise ValueError(f"the hand-worked mixture needs num_slots to divide num_tokens, got {num_tokens}, {num_slots}")
    return ((1 - a) * balanced_one_hot(num_tokens, num_slots) + a / num_slots).unsqueeze(0)


def mixture_for_reversibility(target: float, num_slots: int) -> float:
    """The ``a`` of :func:`common_mode_mixture` whose reversibility is ``target`` (in ``[1/K, 1]``)."""
    if not 1 / num_slots <= target <= 1:
        raise ValueError(f"reversibility lies in [1/K, 1] = [{1 / num_slots:.4g}, 1], got {target}")
    return 1 - (1 / target - 1) / (num_slots - 1)


@dataclass(frozen=True)
class SyntheticAssignment:
    """One row of the reversibility table: an assignment ``S: [B, N, K]``, what it is, and the card's reading."""

    name: str
    description: str
    S: torch.Tensor
    card_reversibility: float | None


def synthetic_assignments(
    num_tokens: int = 256, num_slots: int = 32, batch: int = 16, seed: int = 0, operating_point: float = 0.24
) -> list[SyntheticAssignment]:
    """The assignment matrices of the card's reading table (Disclosure 2), at the card's size (256 tokens, 32 slots).

    - ``concentrated``: every token on the same 3 slots with nearly the same weights (near rank one; card 0.99);
    - ``diffuse_one_hot``: each token one-hot on a slot drawn at random (card 0.04);
    - ``balanced_one_hot``: tokens spread evenly over all slots, the exact lower bound ``1 / K``;
    - ``realistic_top3``: the top-3 softmax of standard normal logits (card 0.05);
    - ``operating_point``: the hand-worked :func:`common_mode_mixture` at the trained model's reversibility (0.24).
    """
    g = torch.Generator().manual_seed(seed)
    B, N, K = batch, num_tokens, num_slots
    shared = 3 * torch.randn(B, 1, K, generator=g)
    mixture = mixture_for_reversibility(operating_point, K)
    return [
        SyntheticAssignment(
            "concentrated",
            "near rank one: every token on the same 3 slots",
            topk_softmax(shared + 0.02 * torch.randn(B, N, K, generator=g), k=3),
            0.99,
        ),
        SyntheticAssignment(
            "diffuse_one_hot",
            "each token one-hot on a random slot",
            F.one_hot(torch.randint(0, K, (B, N), generator=g), K).float(),
            0.04,
        ),
        SyntheticAssignment(
            "balanced_one_hot", "tokens spread evenly over all slots (1/K)", balanced_one_hot(N, K).unsqueeze(0), None
        ),
        SyntheticAssignment(
            "realistic_top3",
            "top-3 softmax of N(0, 1) logits",
            topk_softmax(torch.randn(B, N, K, generator=g), 3),
            0.05,
        ),
        SyntheticAssignment(
            "operating_point",
            f"uniform/one-hot mixture a={mixture:.3f}",
            common_mode_mixture(mixture, N, K),
            operating_point,
        ),
    ]


def reversibility_table(
    num_tokens: int = 256, num_slots: int = 32, batch: int = 16, seed: int = 0
) -> list[dict[str, Any]]:
    """The card's reading table (Disclosure 2) recomputed with the EI loss's own code (:func:`ei_terms`).

    One row per :func:`synthetic_assignments` matrix, averaged over its batch: ``reversibility``,
    ``norm_entropy``, the two ReLU terms ``entropy_penalty = ReLU(0.5 - norm_entropy)`` and
    ``rev_penalty = ReLU(reversibility - 0.45)``, whether each fires (is positive), and the card's reading.
    Both terms fire only for the concentrated matrix, and neither at the operating point.
    """
    rows = []
    for item in synthetic_assignments(num_tokens, num_slots, batch, seed):
        no_macro = item.S.new_zeros(item.S.shape[0], num_slots, 1)  # the degeneracy term plays no part here
        terms = ei_terms(item.S, no_macro)
        entropy_penalty = terms["entropy_penalty"].mean().item()
        rev_penalty = terms["rev_penalty"].mean().item()
        rows.append(
            {
                "name": item.name,
                "description": item.description,
                "reversibility": terms["reversibility"].mean().item(),
                "card_reversibility": item.card_reversibility,
                "norm_entropy": terms["norm_entropy"].mean().item(),
                "entropy_penalty": entropy_penalty,
                "rev_penalty": rev_penalty,
                "entropy_fires": entropy_penalty > 0,
                "rev_fires": rev_penalty > 0,
            }
        )
    return rows


def format_reversibility_table(rows: Sequence[dict[str, Any]]) -> str:
    """:func:`reversibility_table` as a fixed-width text table."""
    width = max(len(row["name"]) for row in rows)
    lines = [
        f"{'assignment S':<{width}}  {'reversibility':>13}  {'card':>5}  {'norm H':>6}  "
        f"{'ReLU(0.5-H)':>11}  {'ReLU(rev-0.45)':>14}  description"
    ]
    for row in rows:
        card = "-" if row["card_reversibility"] is None else f"{row['card_reversibility']:.2f}"
        lines.append(
            f"{row['name']:<{width}}  {row['reversibility']:>13.4f}  {card:>5}  {row['norm_entropy']:>6.3f}  "
            f"{row['entropy_penalty']:>11.4f}  {row['rev_penalty']:>14.4f}  {row['description']}"
        )
    return "\n".join(lines)


# -------------------------------------------------------------------------------------------------------------------
# Slot-usage K on a dataset
# -------------------------------------------------------------------------------------------------------------------
@torch.inference_mode()
def collect_assignments(
    model: nn.Module,
    batches: Iterable[tuple[torch.Tensor, torch.Tensor]],
    *,
    keep_images: int = 0,
    device: str | torch.device = "cpu",
) -> dict[str, torch.Tensor]:
    """Slot-usage K (card: Disclosure 1, "computed post-hoc from the assignment matrix") over a dataset.

    ``model`` has ``forward_with_aux(x) -> (logits, aux)`` with ``aux.S: [B, N, K_max]`` (CET-ViT); ``batches``
    yields ``(x: [B, C, H, W], y: [B])``. Returns ``slot_k: [M]`` (long, :func:`slot_usage_k`), ``labels: [M]``,
    ``predictions: [M]`` and the first ``keep_images`` inputs ``x: [keep, C, H, W]`` with their ``S: [keep, N, K]``.
    """
    if not isinstance(model, SlotAssigner) or getattr(model, "grouping", "card") == "none":
        raise TypeError(
            f"slot-usage K needs a model with a token-to-slot assignment S (CET-ViT's forward_with_aux); "
            f"{type(model).__name__} has none (CET-ViT with grouping: none has no S either)"
        )
    model.eval()
    slot_k, labels, predictions, images, assignments = [], [], [], [], []
    kept = 0
    for x, y in batches:
        x = x.to(device)
        logits, aux = model.forward_with_aux(x)
        slot_k.append(slot_usage_k(aux.S).cpu())
        labels.append(y.cpu())
        predictions.append(logits.argmax(-1).cpu())
        if kept < keep_images:
            take = min(keep_images - kept, len(x))
            images.append(x[:take].cpu())
            assignments.append(aux.S[:take].float().cpu())
            kept += take
    if not slot_k:
        raise ValueError("no batches to measure the slot usage on; check the data (the test set is empty?)")
    return {
        "slot_k": torch.cat(slot_k),
        "labels": torch.cat(labels),
        "predictions": torch.cat(predictions),
        "images": torch.cat(images) if images else torch.empty(0),
        "S": torch.cat(assignments) if assignments else torch.empty(0),
    }


def slot_usage_summary(
    slot_k: torch.Tensor, labels: torch.Tensor, class_names: Sequence[str], predictions: torch.Tensor | None = None
) -> dict[str, Any]:
    """Slot-usage K per image summarised per dataset and per class (card: "Slot-usage K vs. object complexity").

    ``slot_k, labels: [M]`` (and optionally ``predictions: [M]``). Returns ``num_images``, ``mean``, ``std``,
    ``distribution`` (``{K: count}`` in increasing K), ``accuracy`` (with predictions), and ``per_class``: one entry
    per class that has images (``class``, ``index``, ``n``, ``slot_usage_k``, ``accuracy``: the keys of
    ``vitlab evaluate``'s per-class assignment table, from the same :func:`~vitlab.evaluation.stats.per_class_mean`),
    ranked by mean K, largest first (the card's "complex / detailed" classes at the top).
    """
    if slot_k.shape != labels.shape or slot_k.ndim != 1:
        raise ValueError(f"slot_k and labels must both be [M], got {list(slot_k.shape)} and {list(labels.shape)}")
    if len(slot_k) == 0:
        raise ValueError("slot_usage_summary needs at least one image")
    k = slot_k.double()
    values, counts = slot_k.unique(return_counts=True)
    correct = None if predictions is None else (predictions == labels).double()
    class_k, class_counts = per_class_mean(k, labels, len(class_names))
    class_accuracy = None if correct is None else per_class_mean(correct, labels, len(class_names))[0]
    per_class = []
    for index, name in enumerate(class_names):
        if class_counts[index] == 0:
            continue
        entry = {"class": name, "index": index, "n": int(class_counts[index]), "slot_usage_k": class_k[index].item()}
        if class_accuracy is not None:
            entry["accuracy"] = class_accuracy[index].item()
        per_class.append(entry)
    per_class.sort(key=lambda entry: (-entry["slot_usage_k"], entry["index"]))
    summary = {
        "num_images": len(k),
        "mean": k.mean().item(),
        "std": k.std(unbiased=False).item(),
        "distribution": {int(v): int(c) for v, c in zip(values, counts, strict=True)},
        "per_class": per_class,
    }
    if correct is not None:
        summary["accuracy"] = correct.mean().item()
    return summary


def format_slot_usage(summary: dict[str, Any], max_classes: int = 20) -> str:
    """:func:`slot_usage_summary` as text: the K distribution, then the classes ranked by mean K."""
    total = summary["num_images"]
    lines = [f"slot-usage K over {total} images: mean {summary['mean']:.2f} (std {summary['std']:.2f})"]
    if "accuracy" in summary:
        lines[0] += f", accuracy {summary['accuracy']:.4f}"
    lines.append(
        "distribution: " + ", ".join(f"K={k}: {c} ({100 * c / total:.1f}%)" for k, c in summary["distribution"].items())
    )
    shown = summary["per_class"][:max_classes]
    if shown:
        width = max(len(str(entry["class"])) for entry in shown)
        lines.append("classes ranked by mean K:")
        for entry in shown:
            acc = f"  accuracy {entry['accuracy']:.3f}" if "accuracy" in entry else ""
            lines.append(f"  {entry['class']!s:<{width}}  K {entry['slot_usage_k']:.2f}  (n={entry['n']}){acc}")
        if len(summary["per_class"]) > len(shown):
            lines.append(f"  ... {len(summary['per_class']) - len(shown)} more classes in the JSON")
    return "\n".join(lines)
