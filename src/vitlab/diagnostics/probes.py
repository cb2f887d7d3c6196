"""Probes that find dead or inert parts of a model, for any model of the project (CET-ViT v4 model card:
"Reproduce the diagnostics").

The CET-ViT card (Disclosure 1) found its Dynamic-K estimator dead with two checks that any model deserves:

- :func:`gradient_flow`: one training batch through the task's real training loss, backward, and every parameter
  whose gradient is None (not in the graph) or all zeros. The card: "All 6 parameters return ``grad = None`` under
  the training loss".
- :func:`init_distance`: per parameter tensor, the trained statistics (mean, std) against those of several fresh
  initialisations. The card: "Trained weights vs. fresh init: statistically indistinguishable after 287 epochs".

And two readings of the sparse assignment ``S`` (card: Disclosure 2, "Slot-usage K vs. object complexity"):

- :func:`reversibility_table`: the card's reading table of ``reversibility = sigma_1 / sum(sigma)`` on synthetic
  assignment matrices, with the two ReLU terms of the EI loss;
- :func:`collect_assignments` and :func:`slot_usage_summary`: the post-hoc slot-usage K per image and per class.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from vitlab.evaluation.stats import per_class_mean
from vitlab.layers.slots import slot_usage_k, topk_softmax
from vitlab.losses.ei import ei_terms
from vitlab.models.protocols import SlotAssigner

#: with this relative floor on the spread across fresh initialisations, a tensor every seed initialises to the same
#: constants (LayerNorm weights 1, biases 0) counts as moved as soon as training changes it at all
_SPREAD_FLOOR = 1e-6


# -------------------------------------------------------------------------------------------------------------------
# Gradient flow
# -------------------------------------------------------------------------------------------------------------------
def gradient_flow(task: nn.Module, batch: Any) -> dict[str, Any]:
    """Every parameter of ``task`` that the training loss does not reach (CET-ViT card, Disclosure 1, check 1).

    ``task`` is a vitlab Lightning task (anything with ``compute_losses(batch, stage) -> {"loss": scalar, ...}``);
    ``batch`` one training batch as its data loader yields it, on the task's device. The task runs in training mode
    (dropout, Gumbel noise, Mixup targets as in training), the loss is backpropagated once, the gradients are read
    and cleared again, and the task's mode is restored (its running metrics, such as the training accuracy, do see
    the batch).

    Returns ``{"loss", "num_tensors", "num_trainable", "no_grad", "zero_grad", "frozen", "dead", "grad_norms"}``:
    ``no_grad`` the trainable parameters whose ``.grad`` is None, ``zero_grad`` those whose gradient is all zeros,
    ``dead`` both lists together, ``frozen`` the parameters with ``requires_grad=False`` (not counted as dead), and
    ``grad_norms`` the L2 norm of every gradient that exists. Names drop the task's ``model.`` prefix.
    """
    if not hasattr(task, "compute_losses"):
        raise TypeError(
            f"gradient_flow needs a training task with compute_losses(batch, stage), got {type(task).__name__}; "
            "wrap the model with vitlab.training.run.build_task(cfg, model, hparams)"
        )
    was_training = task.training
    task.train()
    task.zero_grad(set_to_none=True)
    try:
        with warnings.catch_warnings():
            # compute_losses logs through self.log, which warns (and does nothing) outside a Trainer
            warnings.filterwarnings("ignore", message=r".*self\.log\(\).*")
            loss = task.compute_losses(batch, "train")["loss"]
        loss.backward()
        no_grad, zero_grad, frozen, norms = [], [], [], {}
        for full_name, param in task.named_parameters():
            name = full_name.removeprefix("model.")
            if not param.requires_grad:
                frozen.append(name)
            elif param.grad is None:
                no_grad.append(name)
            else:
                norms[name] = param.grad.detach().float().norm().item()
                if not param.grad.any():
                    zero_grad.append(name)
    finally:
        task.zero_grad(set_to_none=True)
        task.train(was_training)
    return {
        "loss": loss.item(),
        "num_tensors": len(norms) + len(no_grad) + len(frozen),
        "num_trainable": len(norms) + len(no_grad),
        "no_grad": no_grad,
        "zero_grad": zero_grad,
        "dead": no_grad + zero_grad,
        "frozen": frozen,
        "grad_norms": norms,
    }


def format_gradient_flow(report: dict[str, Any]) -> str:
    """A short text report of :func:`gradient_flow`: counts, then every dead parameter by kind."""
    lines = [
        f"training loss {report['loss']:.4g}; {report['num_trainable']} trainable parameter tensors, "
        f"{len(report['frozen'])} frozen",
    ]
    for key, label in (("no_grad", "no gradient (grad is None)"), ("zero_grad", "all-zero gradient")):
        if report[key]:
            lines.append(f"{len(report[key])} with {label}:")
            lines += [f"  {name}" for name in report[key]]
    lines.append(
        f"DEAD: {len(report['dead'])} parameter tensors get no gradient"
        if report["dead"]
        else "every parameter gets a gradient"
    )
    return "\n".join(lines)


# -------------------------------------------------------------------------------------------------------------------
# Distance from a fresh initialisation
# -------------------------------------------------------------------------------------------------------------------
def _mean_std(t: torch.Tensor) -> tuple[float, float]:
    t = t.detach().double()
    return t.mean().item(), t.std(unbiased=False).item()


def _z(value: float, centre: float, spread: float) -> float:
    """``|value - centre|`` in units of ``spread``, floored so that a spread of zero still gives a finite number."""
    return abs(value - centre) / max(spread, _SPREAD_FLOOR * max(1.0, abs(centre)))


def init_distance(
    model: nn.Module, make_fresh: Callable[[int], nn.Module], n_seeds: int = 5, k: float = 3.0
) -> dict[str, Any]:
    """Parameter tensors of ``model`` whose statistics cannot be told from a fresh initialisation (card, check 2).

    ``make_fresh(seed)`` builds the same architecture, freshly initialised from ``seed``; it is called for seeds
    ``0 .. n_seeds - 1``. For each parameter tensor the mean ``m`` and (population) standard deviation ``s`` of its
    entries are compared with their average over the fresh models; the unit is their spread across the seeds (the
    standard deviation over seeds, floored at ``1e-6 * max(1, |average|)`` for tensors every seed initialises to the
    same constants)::

        z_mean = |m - mean_seeds(m_i)| / spread(m_i)        z_std = |s - mean_seeds(s_i)| / spread(s_i)

    A tensor is *indistinguishable* when ``z_mean <= k`` and ``z_std <= k``: training left its statistics within
    the noise of the initialiser. An untouched tensor is always flagged; a trained one is flagged only if training
    moved it less than the seed-to-seed spread, so the check is sharp for large tensors and weak for tiny ones.

    Returns ``{"n_seeds", "k", "tensors": [{name, shape, numel, mean, std, init_mean, init_mean_spread, init_std,
    init_std_spread, z_mean, z_std, indistinguishable}], "indistinguishable": [names]}``.
    """
    if n_seeds < 2:
        raise ValueError(f"init_distance needs at least 2 fresh seeds to measure their spread, got n_seeds={n_seeds}")
    trained = dict(model.named_parameters())
    fresh_stats: dict[str, list[tuple[float, float]]] = {name: [] for name in trained}
    for seed in range(n_seeds):
        fresh = dict(make_fresh(seed).named_parameters())
        if fresh.keys() != trained.keys() or any(fresh[n].shape != trained[n].shape for n in trained):
            raise ValueError(
                "make_fresh(seed) must build the same architecture as the trained model (same parameter names and "
                "shapes); rebuild it from the trained model's preset and constructor arguments"
            )
        for name, param in fresh.items():
            fresh_stats[name].append(_mean_std(param))
    rows = []
    for name, param in trained.items():
        means = torch.tensor([m for m, _ in fresh_stats[name]], dtype=torch.float64)
        stds = torch.tensor([s for _, s in fresh_stats[name]], dtype=torch.float64)
        mean, std = _mean_std(param)
        init_mean, init_std = means.mean().item(), stds.mean().item()
        mean_spread, std_spread = means.std().item(), stds.std().item()
        z_mean, z_std = _z(mean, init_mean, mean_spread), _z(std, init_std, std_spread)
        rows.append(
            {
                "name": name,
                "shape": list(param.shape),
                "numel": param.numel(),
                "mean": mean,
                "std": std,
                "init_mean": init_mean,
                "init_mean_spread": mean_spread,
                "init_std": init_std,
                "init_std_spread": std_spread,
                "z_mean": z_mean,
                "z_std": z_std,
                "indistinguishable": z_mean <= k and z_std <= k,
            }
        )
    return {
        "n_seeds": n_seeds,
        "k": k,
        "tensors": rows,
        "indistinguishable": [row["name"] for row in rows if row["indistinguishable"]],
    }


def format_init_distance(report: dict[str, Any]) -> str:
    """A text table of the tensors :func:`init_distance` flags, then a one-line verdict."""
    flagged = [row for row in report["tensors"] if row["indistinguishable"]]
    lines = [
        f"{len(report['tensors'])} parameter tensors against {report['n_seeds']} fresh initialisations "
        f"(indistinguishable: mean and std within {report['k']:g} seed-spreads of a fresh init)"
    ]
    if flagged:
        width = max(len(row["name"]) for row in flagged)
        lines.append(f"{'tensor':<{width}}  {'numel':>8}  {'mean':>10}  {'init mean':>10}  {'std':>9}  {'init std':>9}")
        lines += [
            f"{row['name']:<{width}}  {row['numel']:>8}  {row['mean']:>10.3g}  {row['init_mean']:>10.3g}  "
            f"{row['std']:>9.3g}  {row['init_std']:>9.3g}"
            for row in flagged
        ]
        lines.append(f"FLAGGED: {len(flagged)} tensors cannot be told from a fresh initialisation")
    else:
        lines.append("every tensor moved away from its initialisation")
    return "\n".join(lines)


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
