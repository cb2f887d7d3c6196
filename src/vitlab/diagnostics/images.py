"""A few test images of a run pushed through its model: CLS attention maps and segment maps of the token-to-slot
assignment (what ``vitlab report`` shows; the report itself runs no model).

The CLS attention of a ViT layer averaged over its heads is the usual first look at where a ViT attends (Dosovitskiy
et al. 2021, "An Image is Worth 16x16 Words", sec. 4.5 and fig. 6, which uses attention rollout; here one map per
layer, without rollout). Segment maps colour every patch by the slot of CET-ViT's assignment ``S`` that holds most of
it (CET-ViT card, "V-CEO Module"), with the colours of :mod:`vitlab.diagnostics.segments`.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from vitlab.config import DataConfig
from vitlab.data import build_datamodule, normalize
from vitlab.diagnostics.capture import capture_attention
from vitlab.evaluation.outputs import logits_and_assignment
from vitlab.family import family_of, resolve
from vitlab.models.protocols import SlotAssigner


@dataclass
class TestImages:
    """A few test images of a dataset: ``pixels: [B, C, H, W]`` in [0, 1], ``inputs`` the same normalised as the
    model was trained, ``labels`` their class names."""

    pixels: torch.Tensor
    inputs: torch.Tensor
    labels: list[str]


def pick_test_images(labels: torch.Tensor, count: int) -> list[int]:
    """Indices of the first test image of each class, in class order, then further images if there are few classes."""
    firsts = [int(torch.nonzero(labels == c)[0]) for c in torch.unique(labels).tolist()]
    chosen = firsts[:count]
    taken = set(chosen)
    chosen += list(itertools.islice((i for i in range(len(labels)) if i not in taken), count - len(chosen)))
    return chosen


def load_test_images(
    data: DataConfig, count: int, mean: Sequence[float] | None = None, std: Sequence[float] | None = None
) -> TestImages:
    """``count`` test images of ``data`` (:func:`pick_test_images`), normalised with ``mean`` / ``std`` (the model's
    training statistics; default the data module's)."""
    dm = build_datamodule(data)
    dm.setup("test")
    indices = pick_test_images(dm.test_set.labels, count)
    pixels = torch.stack([dm.test_set[i][0] for i in indices]).float() / 255
    inputs = normalize(pixels, dm.mean if mean is None else mean, dm.std if std is None else std)
    labels = [str(dm.class_names[int(dm.test_set.labels[i])]) for i in indices]
    return TestImages(pixels, inputs, labels)


def patch_grid(model: nn.Module) -> tuple[int, int] | None:
    """The model's patch grid ``(gh, gw)``, or None for a model that does not say."""
    grid = getattr(model, "grid_size", None) or getattr(getattr(model, "patch_embed", None), "grid_size", None)
    return tuple(grid) if grid is not None else None


def cls_attention_maps(maps: Mapping[str, torch.Tensor], grid: tuple[int, int]) -> dict[str, torch.Tensor]:
    """CLS-to-patch attention of each layer, averaged over the heads, on the patch grid: ``{name: [B, gh, gw]}``.

    ``maps``: ``{name: [B, H, T, T]}`` from :func:`vitlab.capture_attention`. A layer over a CLS token and the
    patches (``T = gh * gw + 1``, the CLS token first, as in ``VisionTransformer``) gives ``attn[:, :, 0, 1:]``
    averaged over ``H``. Other maps are left out: windowed or cross attention, decoders and slot encoders over other
    tokens, layers after token merging, and models without a CLS token.
    """
    num_patches = grid[0] * grid[1]
    return {
        name: attn[:, :, 0, 1:].float().mean(1).reshape(attn.shape[0], *grid)
        for name, attn in maps.items()
        if attn.ndim == 4 and attn.shape[-2] == attn.shape[-1] == num_patches + 1
    }


def attention_maps(model: nn.Module, inputs: torch.Tensor) -> dict[str, torch.Tensor]:
    """:func:`cls_attention_maps` of ``model`` on ``inputs: [B, C, H, W]`` (``{}`` for a model without them)."""
    grid = patch_grid(model)
    if grid is None:
        return {}
    try:
        return cls_attention_maps(capture_attention(model, inputs), grid)
    except ValueError:  # a model that computes no attention to read
        return {}


@dataclass
class SlotAssignment:
    """The token-to-slot assignment of a few images: ``S: [B, N, K_max]`` on the patch ``grid`` and each image's
    slot-usage K (``slot_k: [B]``, the family's ``evaluation.image_metrics``; None if it declares none)."""

    S: torch.Tensor
    grid: tuple[int, int]
    slot_k: torch.Tensor | None


def slot_assignment(model: nn.Module, inputs: torch.Tensor) -> SlotAssignment | None:
    """For a model with a token-to-slot assignment over its patch grid (``SlotAssigner``), ``S`` of ``inputs``; else
    None."""
    grid = patch_grid(model)
    if grid is None or not isinstance(model, SlotAssigner):
        return None
    with torch.no_grad():
        _, S = logits_and_assignment(model, inputs)
    if S is None or S.shape[1] != grid[0] * grid[1]:
        return None
    family = family_of(model)
    evaluation = resolve(family.evaluation) if family is not None and family.evaluation else None
    return SlotAssignment(S, grid, evaluation.image_metrics(S).get("slot_usage_k") if evaluation else None)
