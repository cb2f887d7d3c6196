"""The attention-based explanations as pure functions of the attention matrices (tensors in, tensors out).

- :func:`last_attention`: the last layer's CLS row, averaged over heads.
- :func:`attention_rollout`: Abnar & Zuidema, "Quantifying Attention Flow in Transformers", ACL 2020, sec. 3
  (the residual as ``0.5 A + 0.5 I``, the layers multiplied).
- :func:`gradient_rollout`: Chefer, Gur & Wolf, "Generic Attention-model Explainability for Interpreting Bi-Modal
  and Encoder-Decoder Transformers", ICCV 2021, eq. 5-6 (the head mean of the positive part of gradient times
  attention, accumulated as ``R <- R + A_bar R``).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def _check(maps: Sequence[torch.Tensor]) -> None:
    if not maps:
        raise ValueError("no attention matrices were recorded; the model's forward pass bypasses its Attention")
    for a in maps:
        if a.ndim != 4 or a.shape[-1] != a.shape[-2] or a.shape != maps[0].shape:
            raise ValueError(f"attention must be [B, H, N, N] of one shape in every layer, got {list(a.shape)}")


def last_attention(maps: Sequence[torch.Tensor], prefix: int = 1) -> torch.Tensor:
    """``[B, N - prefix]``: how much the CLS token attends to each patch in the last layer, mean over heads."""
    _check(maps)
    return maps[-1].mean(1)[:, 0, prefix:]


def attention_rollout(maps: Sequence[torch.Tensor], prefix: int = 1) -> torch.Tensor:
    """Attention rollout (Abnar & Zuidema 2020): ``R = A_L' ... A_1'`` with ``A' = 0.5 mean_h A + 0.5 I``
    (rows re-normalised), read at the CLS row. ``maps[l]: [B, H, N, N]`` in forward order -> ``[B, N - prefix]``."""
    _check(maps)
    eye = torch.eye(maps[0].shape[-1], dtype=maps[0].dtype, device=maps[0].device)
    rollout = eye.expand_as(maps[0][:, 0])
    for a in maps:
        mixed = 0.5 * a.mean(1) + 0.5 * eye
        rollout = (mixed / mixed.sum(-1, keepdim=True)) @ rollout
    return rollout[:, 0, prefix:]


def gradient_rollout(maps: Sequence[torch.Tensor], grads: Sequence[torch.Tensor], prefix: int = 1) -> torch.Tensor:
    """Gradient-weighted rollout (Chefer et al. 2021, eq. 5-6): ``A_bar = E_h[(grad A * A)^+]``, ``R = I``,
    ``R <- R + A_bar R`` layer by layer, read at the CLS row. ``grads[l]``: d score / d ``maps[l]``."""
    _check(maps)
    if len(grads) != len(maps) or any(g.shape != a.shape for g, a in zip(grads, maps, strict=True)):
        raise ValueError("gradient_rollout needs one gradient of the attention's shape per layer")
    relevance = torch.eye(maps[0].shape[-1], dtype=maps[0].dtype, device=maps[0].device).expand_as(maps[0][:, 0])
    for a, g in zip(maps, grads, strict=True):
        relevance = relevance + (g * a).clamp_min(0).mean(1) @ relevance
    return relevance[:, 0, prefix:]
