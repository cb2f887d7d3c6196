"""What the evaluation reads of a model: its logits (and a ``SlotAssigner``'s assignment ``S``), the test-time
augmentation views, and the classification metrics of a set of predictions."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from vitlab.errors import ConfigError
from vitlab.evaluation.calibration import expected_calibration_error
from vitlab.models.protocols import SlotAssigner

TOP_K = 5
N_BINS = 15  # ECE bins (card: "Calibration"; Guo et al. 2017)


# -------------------------------------------------------------------------------------------------------------------
# Model outputs
# -------------------------------------------------------------------------------------------------------------------
def _logits_of(output: Any) -> torch.Tensor:
    """The logits in a model's output: the tensor itself, its ``.logits``, or the first element of a tuple."""
    if isinstance(output, torch.Tensor):
        return output
    if isinstance(getattr(output, "logits", None), torch.Tensor):
        return output.logits
    if isinstance(output, tuple | list) and output and isinstance(output[0], torch.Tensor):
        return output[0]
    raise TypeError(
        f"cannot find class logits in a model output of type {type(output).__name__}: a classifier must return a "
        "logits tensor [B, K], an object with a .logits tensor, or a tuple whose first element is the logits"
    )


def classifier_logits(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """``model(x)``'s class logits ``[B, K]`` for ``x: [B, C, H, W]``, whatever the model family returns.

    ViT and CET-ViT return the logits tensor; ViTCAE a dataclass with ``.logits``; models returning
    ``(logits, aux)`` are read by their first element.
    """
    return _logits_of(model(x))


def logits_and_assignment(model: nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Logits ``[B, K]`` and, for a model with ``forward_with_aux`` (CET-ViT), its assignment ``S: [B, N, K_max]``.

    The auxiliary record may be an object with an ``S`` attribute or a mapping with an ``"S"`` key (the card's
    original code returns a dict); models without ``forward_with_aux`` give ``S = None``.
    """
    if not isinstance(model, SlotAssigner):
        return classifier_logits(model, x), None
    logits, aux = model.forward_with_aux(x)
    assignment = aux.get("S") if isinstance(aux, Mapping) else getattr(aux, "S", None)
    return _logits_of(logits), assignment


# -------------------------------------------------------------------------------------------------------------------
# Test-time augmentation views
# -------------------------------------------------------------------------------------------------------------------
def translate(images: torch.Tensor, dy: int, dx: int) -> torch.Tensor:
    """Shift ``images: [B, C, H, W]`` by ``dy`` rows down and ``dx`` columns right, filling with 0 (black).

    ``out[..., i, j] = images[..., i - dy, j - dx]``: a crop at a fixed offset of the zero-padded image, i.e. the
    training pad-and-crop augmentation (``data.augment.random_crop``) at one of its positions.
    """
    height, width = images.shape[-2:]
    if abs(dy) >= height or abs(dx) >= width:
        raise ValueError(f"a shift of ({dy}, {dx}) pixels leaves nothing of a {height}x{width} image")
    pad_y, pad_x = abs(dy), abs(dx)
    padded = torch.nn.functional.pad(images, [pad_x, pad_x, pad_y, pad_y])
    return padded[..., pad_y - dy : pad_y - dy + height, pad_x - dx : pad_x - dx + width]


@dataclass(frozen=True)
class View:
    """One test-time view: an optional horizontal flip, then a shift by ``(dy, dx)`` pixels (see :func:`translate`)."""

    name: str
    hflip: bool = False
    shift: tuple[int, int] = (0, 0)

    @property
    def is_identity(self) -> bool:
        return not self.hflip and self.shift == (0, 0)

    def __call__(self, images: torch.Tensor) -> torch.Tensor:
        """``images: [B, C, H, W]`` in [0, 1] -> the view, same shape."""
        out = images.flip(-1) if self.hflip else images
        return translate(out, *self.shift) if self.shift != (0, 0) else out


def build_tta_views(count: int, *, hflip: bool, shift: int) -> list[View]:
    """The first ``count`` views of: identity, horizontal flip (only if ``hflip``), then shifts by ``shift`` pixels
    to the corners: ``(+s, +s)``, ``(-s, -s)``, ``(+s, -s)``, ``(-s, +s)`` (as ``(down, right)``).

    Five views are identity, flip and three shifts on flip-invariant data, identity and four shifts otherwise.
    """
    if shift < 1:
        raise ValueError(f"the TTA shift must be at least 1 pixel, got {shift}")
    candidates = [View("identity")]
    if hflip:
        candidates.append(View("hflip", hflip=True))
    for dy, dx in ((shift, shift), (-shift, -shift), (shift, -shift), (-shift, shift)):
        candidates.append(View(f"shift({dy:+d},{dx:+d})", shift=(dy, dx)))
    if not 0 <= count <= len(candidates):
        raise ConfigError(
            f"tta_views must be in 0..{len(candidates)} ({'with' if hflip else 'without'} the flip view), got {count}; "
            f"pass --tta-views 0..{len(candidates)}"
        )
    return candidates[:count]


def default_tta_shift(img_size: int) -> int:
    """``max(1, img_size // 16)`` pixels: 2 on 32x32 (CIFAR), 4 on 64x64, 1 on 8x8 or 28x28."""
    return max(1, img_size // 16)


# -------------------------------------------------------------------------------------------------------------------
# Metrics
# -------------------------------------------------------------------------------------------------------------------
def classification_metrics(
    probs: torch.Tensor, labels: torch.Tensor, *, top_k: int = TOP_K, n_bins: int = N_BINS
) -> dict[str, float]:
    """``top1``, ``top5`` (top-``min(top_k, K)``), ``nll`` and ``ece`` of probabilities ``probs: [B, K]``.

    ``labels: [B]``. The NLL is ``-mean log p_y`` with ``p_y`` floored at 1e-12 (averaged TTA probabilities have
    no logits); the ECE uses ``n_bins`` equal-width bins (:func:`expected_calibration_error`).
    """
    probs = probs.to(torch.float64)
    ranked = probs.topk(min(top_k, probs.shape[1]), dim=-1).indices
    correct_k = (ranked == labels[:, None]).any(-1)
    return {
        "top1": (ranked[:, 0] == labels).double().mean().item(),
        "top5": correct_k.double().mean().item(),
        "nll": -probs.gather(1, labels[:, None]).clamp_min(1e-12).log().mean().item(),
        "ece": expected_calibration_error(probs, labels, n_bins=n_bins),
    }
