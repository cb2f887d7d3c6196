"""What :meth:`CETViT.forward_with_aux <vitlab.families.cet_vit.model.CETViT.forward_with_aux>` returns next to
the logits (the assignment, the macro tokens, the EI terms and the Dynamic-K record), and what one pass keeps on the
way (:class:`Encoded`)."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class CETViTAux:
    """What ``CETViT.forward_with_aux`` returns next to the logits.

    Attributes:
        S: ``[B, N, K_max]`` the sparse assignment.
        h_macro: ``[B, K_max, D]`` the pooled macro tokens (input of the MacroEncoder).
        slot_usage_k: ``[B]`` post-hoc active-slot count (:func:`slot_usage_k`).
        ei: the EI terms of :func:`vitlab.families.cet_vit.ei.ei_terms` (``[B]`` each) and the scalar ``ei_loss``; empty
            when ``forward_with_aux(compute_ei=False)`` skipped them (no SVD), and then ``ei_loss`` is 0.
        k_cost: scalar ``E[K] / K_max`` of the straight-through estimator (0 without one and with ``exact``, whose
            cost enters the target instead).
        k_chosen: ``[B]`` the slot budget used per image, or None without an estimator.
        k_probs: ``[B, C]`` the estimator's distribution over ``k_candidates``, or None.
        k_expected: ``[B]`` ``E[K]`` per image under ``k_probs``, or None.
        k_logits: ``[B, C]`` the estimator's logits (``exact`` trains them by cross-entropy), or None.
        candidate_logits: ``[C, B, classes]`` with ``dynamic_k: exact`` in training: the logits of every image under
            every candidate budget, without gradient and without dropout (:meth:`CETViT.candidate_logits`), or None.
        occupied: ``[B, K_max]`` bool, slots with assignment mass, when ``mask_empty_slots``; else None.
        vceo_margin: ``[B]`` the mean over tokens of the V-CEO's top-k margin, the k-th largest assignment logit minus
            the (k+1)-th (how far each token's choice is from changing), without
            gradient; None with ``grouping: none`` and with a dense choice (``topk = K_max``).

    With ``grouping: none`` (no V-CEO) ``S``, ``h_macro`` and ``slot_usage_k`` are None and ``ei`` is empty.
    """

    S: torch.Tensor | None
    h_macro: torch.Tensor | None
    slot_usage_k: torch.Tensor | None
    ei: dict[str, torch.Tensor]
    k_cost: torch.Tensor
    k_chosen: torch.Tensor | None = None
    k_probs: torch.Tensor | None = None
    k_expected: torch.Tensor | None = None
    k_logits: torch.Tensor | None = None
    candidate_logits: torch.Tensor | None = None
    occupied: torch.Tensor | None = None
    vceo_margin: torch.Tensor | None = None

    @property
    def ei_loss(self) -> torch.Tensor:
        return self.ei["ei_loss"] if "ei_loss" in self.ei else self.k_cost.new_zeros(())

    def regularization(self, lambda_ei: float, lambda_k: float) -> torch.Tensor:
        """``lambda_ei * ei_loss + lambda_k * k_cost``: the term a training task adds to the cross-entropy."""
        return lambda_ei * self.ei_loss + lambda_k * self.k_cost


@dataclass
class Encoded:
    """Intermediate results of one CET-ViT pass (``CETViT._encode``; :meth:`CETViT.candidate_logits` reads it again)."""

    tokens: torch.Tensor  # forward_features: [B, N + K, 2D]
    S: torch.Tensor
    h_macro: torch.Tensor
    occupied: torch.Tensor | None
    micro: torch.Tensor  # [B, N, D] the projected micro tokens entering the part after the V-CEO
    assign_logits: torch.Tensor  # [B, N, K_max]
    choice: torch.Tensor | None = None
    k_logits: torch.Tensor | None = None
