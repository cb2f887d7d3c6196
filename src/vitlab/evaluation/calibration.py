"""Calibration: expected calibration error, temperature scaling and reliability diagrams.

CET-ViT v4 model card, "Calibration": ECE with 15 equal-width bins (Naeini et al. 2015,
Guo et al. 2017), a single temperature fitted on one half of the validation set by L-BFGS on the NLL and evaluated
on the other half, and the reliability diagram.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from matplotlib.figure import Figure

from vitlab.rundir import save_figure


def _check_classification(scores: torch.Tensor, labels: torch.Tensor) -> None:
    if scores.ndim != 2:
        raise ValueError(f"logits / probabilities must be [B, K], got {list(scores.shape)}")
    if labels.shape != (scores.shape[0],):
        raise ValueError(f"labels must be [B] = [{scores.shape[0]}] to match the scores, got {list(labels.shape)}")
    if labels.dtype.is_floating_point or labels.dtype == torch.bool:
        raise ValueError(f"labels must be integer class indices, got dtype {labels.dtype}")
    if scores.shape[0] == 0:
        raise ValueError("no samples: calibration needs at least one prediction")
    if labels.min() < 0 or labels.max() >= scores.shape[1]:
        raise ValueError(f"labels must lie in [0, {scores.shape[1]}), got range [{labels.min()}, {labels.max()}]")
    if not torch.isfinite(scores).all():
        raise ValueError("logits / probabilities contain NaN or inf")


def _as_probabilities(logits_or_probs: torch.Tensor) -> torch.Tensor:
    """``[B, K]`` -> float64 probabilities: rows already in [0, 1] summing to 1 are kept, others are softmaxed."""
    scores = logits_or_probs.detach().to(torch.float64)
    is_probability = (
        (scores >= 0).all() and (scores <= 1).all() and torch.allclose(scores.sum(-1), torch.ones_like(scores[:, 0]))
    )
    return scores if is_probability else scores.softmax(dim=-1)


def _calibration_bins(probs: torch.Tensor, labels: torch.Tensor, n_bins: int):
    """Top-label confidences in ``n_bins`` equal-width bins ``[i/n, (i+1)/n)``, a confidence of 1 in the last bin.

    ``probs: [B, K]``, ``labels: [B]`` -> per-bin ``(accuracy, confidence, count)``, each ``[n_bins]``.
    """
    confidence, prediction = probs.max(dim=-1)
    correct = (prediction == labels).to(probs.dtype)
    bin_index = (confidence * n_bins).floor().long().clamp(max=n_bins - 1)
    count = probs.new_zeros(n_bins).index_add_(0, bin_index, torch.ones_like(confidence))
    accuracy = probs.new_zeros(n_bins).index_add_(0, bin_index, correct) / count.clamp(min=1)
    mean_confidence = probs.new_zeros(n_bins).index_add_(0, bin_index, confidence) / count.clamp(min=1)
    return accuracy, mean_confidence, count


def expected_calibration_error(logits_or_probs: torch.Tensor, labels: torch.Tensor, n_bins: int = 15) -> float:
    """Top-label expected calibration error, L1, over ``n_bins`` equal-width confidence bins.

    ``ECE = sum_b |B_b| / B * |acc(B_b) - conf(B_b)|`` (Guo et al. 2017, eq. 3). ``logits_or_probs: [B, K]``: rows
    that are already probabilities (in [0, 1], summing to 1) are used as they are, anything else is softmaxed.
    ``labels: [B]`` class indices. Equals torchmetrics' ``MulticlassCalibrationError(norm="l1")``, except that a
    confidence of exactly 1 falls in the last bin here rather than in a bin of its own.
    """
    if n_bins < 1:
        raise ValueError(f"n_bins must be >= 1, got {n_bins}")
    _check_classification(logits_or_probs, labels)
    probs = _as_probabilities(logits_or_probs)
    accuracy, confidence, count = _calibration_bins(probs, labels.to(probs.device), n_bins)
    return float(((accuracy - confidence).abs() * count).sum() / count.sum())


def fit_temperature(logits: torch.Tensor, labels: torch.Tensor, max_iter: int = 100) -> float:
    """Temperature scaling (Guo et al. 2017, section 4.2): the single ``T > 0`` minimising the NLL of ``logits / T``.

    ``logits: [B, K]``, ``labels: [B]``. Optimises ``log T`` (so T stays positive) with L-BFGS in float64.
    """
    _check_classification(logits, labels)
    logits64 = logits.detach().to("cpu", torch.float64)
    labels = labels.detach().to("cpu")
    log_temperature = torch.zeros((), dtype=torch.float64, requires_grad=True)
    optimizer = torch.optim.LBFGS([log_temperature], lr=1.0, max_iter=max_iter, line_search_fn="strong_wolfe")

    def closure() -> torch.Tensor:
        optimizer.zero_grad()
        loss = F.cross_entropy(logits64 / log_temperature.exp(), labels)
        loss.backward()
        return loss

    optimizer.step(closure)
    temperature = log_temperature.exp().item()
    if not torch.isfinite(torch.tensor(temperature)):
        raise RuntimeError("temperature scaling diverged; are the logits constant or the labels all one class?")
    return temperature


def _classification_metrics(logits: torch.Tensor, labels: torch.Tensor, n_bins: int) -> dict[str, float]:
    return {
        "ece": expected_calibration_error(logits, labels, n_bins=n_bins),
        "nll": F.cross_entropy(logits, labels).item(),
        "top1": (logits.argmax(-1) == labels).double().mean().item(),  # the key of the evaluation suite's tables
    }


def calibration_split_eval(
    logits: torch.Tensor, labels: torch.Tensor, seed: int = 0, n_bins: int = 15
) -> dict[str, float | int]:
    """Fit the temperature on a random half of the data and report ECE, NLL and top-1 accuracy on the other half.

    ``logits: [B, K]``, ``labels: [B]``, B >= 2. Returns a flat dict (ready for a JSON line): ``temperature``,
    ``{ece,nll,top1}_{before,after}`` measured on the held-out half, and ``n_fit``, ``n_eval``.
    """
    _check_classification(logits, labels)
    if logits.shape[0] < 2:
        raise ValueError("calibration_split_eval needs at least 2 samples, one to fit T and one to evaluate")
    logits64, labels = logits.detach().to("cpu", torch.float64), labels.detach().to("cpu")
    order = torch.randperm(logits64.shape[0], generator=torch.Generator().manual_seed(seed))
    fit, held_out = order[: logits64.shape[0] // 2], order[logits64.shape[0] // 2 :]
    temperature = fit_temperature(logits64[fit], labels[fit])
    before = _classification_metrics(logits64[held_out], labels[held_out], n_bins)
    after = _classification_metrics(logits64[held_out] / temperature, labels[held_out], n_bins)
    return {
        "temperature": temperature,
        **{f"{name}_before": value for name, value in before.items()},
        **{f"{name}_after": value for name, value in after.items()},
        "n_fit": len(fit),
        "n_eval": len(held_out),
    }


def _draw_reliability(axes, probs: torch.Tensor, labels: torch.Tensor, n_bins: int, title: str) -> None:
    accuracy, confidence, count = _calibration_bins(probs, labels, n_bins)
    ece = float(((accuracy - confidence).abs() * count).sum() / count.sum())
    width = 1.0 / n_bins
    filled = count > 0
    centres = ((torch.arange(n_bins, dtype=torch.float64) + 0.5) * width)[filled].numpy()
    accuracy, confidence = accuracy[filled].numpy(), confidence[filled].numpy()
    axes.bar(centres, accuracy, width=width, edgecolor="black", color="tab:blue", label="accuracy")
    gap_bottom, gap_height = np.minimum(accuracy, confidence), np.abs(accuracy - confidence)
    axes.bar(centres, gap_height, bottom=gap_bottom, width=width, color="tab:red", alpha=0.35, hatch="//", label="gap")
    axes.plot([0, 1], [0, 1], linestyle="--", color="gray", label="perfect calibration")
    axes.set(xlim=(0, 1), ylim=(0, 1), xlabel="confidence", ylabel="accuracy", title=f"{title} (ECE {ece:.4f})")
    axes.legend(loc="upper left")


def reliability_diagram(
    logits_or_probs: torch.Tensor,
    labels: torch.Tensor,
    path: str | Path,
    title: str = "Reliability diagram",
    *,
    after: torch.Tensor | None = None,
    n_bins: int = 15,
) -> Path:
    """Write a reliability diagram (Guo et al. 2017, figure 1) as a PNG: per-bin accuracy against confidence.

    ``logits_or_probs: [B, K]`` (probabilities or logits, as for :func:`expected_calibration_error`), ``labels: [B]``.
    ``after: [B, K]`` optional, e.g. the temperature-scaled logits, drawn in a second panel beside the first.
    Returns the path written.
    """
    _check_classification(logits_or_probs, labels)
    panels = [("before" if after is not None else title, logits_or_probs)]
    if after is not None:
        _check_classification(after, labels)
        panels.append(("after", after))
    labels = labels.detach().to("cpu")
    figure = Figure(figsize=(4.5 * len(panels), 4.5), layout="constrained")
    for axes, (panel_title, scores) in zip(figure.subplots(1, len(panels), squeeze=False)[0], panels, strict=True):
        _draw_reliability(axes, _as_probabilities(scores.cpu()), labels, n_bins, panel_title)
    if after is not None:
        figure.suptitle(title)
    return save_figure(figure, path, dpi=100)
