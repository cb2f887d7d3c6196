"""The CET-ViT "EI" regulariser, as the model card says it was actually implemented (CET-ViT v4 model card:
"EI loss, as actually implemented", and Disclosure 2 on the reversibility metric).

For one image the assignment matrix ``S: [N, K]`` (N micro tokens, K = K_max macro slots, rows summing to 1) has
singular values ``sigma_1 >= ... >= sigma_K``. With ``p = sigma / sum(sigma)``:

- ``norm_entropy = H(p) / log(K)`` and ``entropy_penalty = ReLU(0.5 - norm_entropy)`` (the "entropy floor");
- ``reversibility = sigma_1 / sum(sigma)`` and ``rev_penalty = ReLU(reversibility - 0.45)`` (the "reversibility
  ceiling");
- ``degen`` = mean off-diagonal cosine similarity between the macro tokens ``h_macro: [K, D]``, over the occupied
  slots (an empty slot's macro token is zero: it has no direction and is never normalised, see
  :func:`macro_degeneracy`);
- ``L_EI = entropy_penalty + 2.0 * rev_penalty + 0.1 * degen``, averaged over the batch.

Card, Disclosure 2 -- read before using these terms: reversibility is HIGH when S is concentrated (near rank one,
about 0.99) and LOW when it is diffuse (tokens one-hot over random slots, about 0.04; a realistic top-3 sparse S,
about 0.05). Both ReLU terms therefore penalise concentration; neither penalises over-diffusion, so there is no
"double well" and no "[0.20, 0.45] emergence zone". At the trained model's operating point (reversibility about
0.24) both ReLU terms are zero and the loss acts only through ``degen``. The names are kept for fidelity to the
card, not because the terms measure what those names suggest; Hoel's effective information is not computed.
"""

from __future__ import annotations

import math
from typing import Literal

import torch
import torch.nn.functional as F

EIVariant = Literal["full", "two_term", "entropy_only", "none"]
EI_VARIANTS: tuple[str, ...] = ("full", "two_term", "entropy_only", "none")
#: where the assignment matrices' SVD runs: on S's device, or on the host CPU (the values and the gradient copied)
EI_SVD_WAYS: tuple[str, ...] = ("device", "host", "gram")
#: the ``gram`` way's gradient drops a singular value below this fraction of the image's largest (a zero singular
#: value's direction is arbitrary; 0 is in its subdifferential)
GRAM_RELATIVE_FLOOR = 1e-6


class _GramSingularValues(torch.autograd.Function):
    """``S: [B, N, K] -> [B, K]`` singular values, descending, from the eigenvalues of ``S^T S`` in float64.

    Forming the Gram matrix squares the condition number; float64 keeps the values to about ``1e-8`` of the
    largest (float32 would keep ``1e-4``). The gradient is ``U diag(g) V^T`` with ``U = S V / sigma`` written as
    ``S V diag(g / sigma) V^T``: ``svdvals``'s gradient, without eigenvector derivatives (so repeated singular values
    are safe); a singular value below :data:`GRAM_RELATIVE_FLOOR` of the largest contributes none."""

    @staticmethod
    def forward(ctx, S: torch.Tensor) -> torch.Tensor:
        S64 = S.double()
        lam, V = torch.linalg.eigh(S64.mT @ S64)  # ascending
        sigma, V = lam.clamp_min(0).sqrt().flip(-1), V.flip(-1)
        ctx.save_for_backward(S64, V, sigma)
        ctx.dtype = S.dtype
        return sigma.to(torch.float32)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        S64, V, sigma = ctx.saved_tensors
        floor = sigma[..., :1] * GRAM_RELATIVE_FLOOR
        scale = torch.where(sigma > floor, grad.double() / sigma.clamp_min(1e-300), 0.0)
        return ((S64 @ V) * scale.unsqueeze(-2) @ V.mT).to(ctx.dtype)


def assignment_singular_values(S: torch.Tensor, way: str = "device") -> torch.Tensor:
    """Singular values of each image's assignment matrix, descending. ``S: [B, N, K] -> [B, min(N, K)]``.

    Computed in float32 (SVD has no half-precision kernel); ``svdvals`` has a stable gradient even for repeated
    singular values, which balanced assignments produce. On CUDA it is the one host synchronisation of a CET-ViT
    step with the EI term: torch's cuSOLVER SVD checks on the host that every matrix converged, has no variant
    that skips the check, and for matrices over 32 rows calls the solver once per image.

    ``way="host"`` computes the same singular values (LAPACK on the CPU, as a CPU run does) from a copy of ``S`` on
    the host and copies the values back; autograd carries the gradient across both copies. On a GPU that trades
    B solver calls for two copies of ``[B, N, K]`` (one synchronisation in the forward, one in the backward);
    ``benchmarks/micro/ei_svd_cuda.py`` measures both. On the CPU both ways are the same call.

    ``way="gram"`` takes the square roots of the eigenvalues of ``S^T S`` (``[B, K, K]``, one batched symmetric
    eigensolver call) in float64 (:class:`_GramSingularValues`): the same singular values to about ``1e-8`` of the
    largest, ``svdvals``'s gradient for every singular value above :data:`GRAM_RELATIVE_FLOOR` of the largest and
    none for those below (an empty slot's zero). For tall ``S`` on a GPU, where ``svdvals`` calls the solver once
    per image.
    """
    if S.ndim != 3:
        raise ValueError(f"S must be [B, N, K] (one assignment matrix per image), got shape {list(S.shape)}")
    if way not in EI_SVD_WAYS:
        raise ValueError(f"the EI SVD way must be one of {', '.join(EI_SVD_WAYS)}, got {way!r}")
    if way == "host" and S.device.type != "cpu":
        return torch.linalg.svdvals(S.float().cpu()).to(S.device)
    if way == "gram":
        return _GramSingularValues.apply(S)[..., : min(S.shape[-2:])]
    return torch.linalg.svdvals(S.float())


def reversibility(S: torch.Tensor) -> torch.Tensor:
    """Card's ``reversibility = sigma_1 / sum(sigma)`` per image. ``S: [B, N, K] -> [B]`` in ``[1/K, 1]``.

    High (-> 1) for a concentrated, near rank-one S; low (-> 1/K) for tokens spread evenly over distinct slots.
    """
    sigma = assignment_singular_values(S)
    return sigma[:, 0] / sigma.sum(-1).clamp_min(1e-12)


def normalized_spectral_entropy(sigma: torch.Tensor, num_slots: int) -> torch.Tensor:
    """``H(sigma / sum(sigma)) / log(K_max)`` per image (card's Term 1). ``sigma: [B, R] -> [B]`` in ``[0, 1]``."""
    if num_slots < 2:
        raise ValueError(f"the normalised entropy needs at least 2 slots (log(K_max) > 0), got K_max={num_slots}")
    p = sigma / sigma.sum(-1, keepdim=True).clamp_min(1e-12)
    entropy = -(p * p.clamp_min(1e-12).log()).sum(-1)
    return entropy / math.log(num_slots)


DEGEN_SLOTS: tuple[str, ...] = ("occupied", "all")


def macro_degeneracy(
    h_macro: torch.Tensor, occupied: torch.Tensor | None = None, slots: str = "occupied"
) -> torch.Tensor:
    """Mean off-diagonal cosine similarity between macro tokens (card's Term 3). ``h_macro: [B, K, D] -> [B]``.

    ``occupied: [B, K]`` bool marks the slots that hold assignment mass (default: the slots whose macro token is not
    all zeros). An empty slot's macro token is zero and has no direction, so it is never normalised: the cosine's
    gradient there is ``1 / |h|``, which :func:`torch.nn.functional.normalize` turns into ``1 / eps`` (about 1e10
    on the parameters that feed the empty slot, e.g. under ``select_grad: dense_st``).

    ``slots="occupied"`` (default): the mean runs over the ordered pairs of occupied slots only (``m (m - 1)`` of
    them for ``m`` occupied slots; 0 when fewer than two are occupied). ``slots="all"``: the card's literal mean over
    all ``K (K - 1)`` pairs, an empty slot counting as cosine 0 (its value with the card's normalisation) but
    contributing no gradient. Either way every gradient is bounded by the occupied tokens' norms.
    """
    if h_macro.ndim != 3 or h_macro.shape[1] < 2:
        raise ValueError(f"h_macro must be [B, K, D] with K >= 2 macro tokens, got shape {list(h_macro.shape)}")
    if slots not in DEGEN_SLOTS:
        raise ValueError(f"degeneracy slots must be one of {', '.join(DEGEN_SLOTS)}, got {slots!r}")
    h = h_macro.float()
    if occupied is None:
        occupied = h.detach().abs().amax(-1) > 0
    elif occupied.shape != h.shape[:2]:
        raise ValueError(f"occupied must be [B, K] = {list(h.shape[:2])}, got {list(occupied.shape)}")
    occupied = occupied.to(torch.bool) & (h.detach().norm(dim=-1) > 0)
    K = h.shape[1]
    # empty slots are replaced by a constant before the division, so no gradient reaches them through the norm
    safe = torch.where(occupied.unsqueeze(-1), h, torch.ones_like(h))
    unit = safe / safe.norm(dim=-1, keepdim=True)
    pair = occupied.unsqueeze(-1) & occupied.unsqueeze(-2) & ~torch.eye(K, dtype=torch.bool, device=h.device)
    cosine = torch.where(pair, unit @ unit.transpose(1, 2), torch.zeros((), device=h.device))  # [B, K, K]
    if slots == "all":
        return cosine.sum((1, 2)) / (K * (K - 1))
    count = pair.sum((1, 2))
    return cosine.sum((1, 2)) / count.clamp_min(1)


def ei_terms(
    S: torch.Tensor,
    h_macro: torch.Tensor,
    *,
    variant: EIVariant = "full",
    entropy_floor: float = 0.5,
    reversibility_ceiling: float = 0.45,
    rev_weight: float = 2.0,
    degen_weight: float = 0.1,
    degen_slots: str = "occupied",
    svd: str = "device",
) -> dict[str, torch.Tensor]:
    """Every EI term of the card and the loss of the chosen ``variant`` (CET-ViT v4 model card, "EI loss, as
    actually implemented").

    Args:
        S: ``[B, N, K]`` assignment matrices (rows sum to 1).
        h_macro: ``[B, K, D]`` macro tokens pooled with ``S``.
        variant: ``full`` (all three terms), ``two_term`` (the card's "Two-term EI" ablation, read as the two
            spectral terms of the first description's double well: ``entropy_penalty + rev_weight * rev_penalty``,
            without ``degen``; the card does not list the two terms), ``entropy_only`` (the card's v3 ablation:
            the entropy floor alone) or
            ``none`` (the no-EI ablation: the terms are still returned for logging, the loss is zero).
        degen_slots: ``occupied`` (default) or ``all``, see :func:`macro_degeneracy`. A slot is occupied when
            its column of ``S`` has mass (``S.sum(1) > 0``).
        svd: where the singular values are computed, ``device`` or ``host`` (:func:`assignment_singular_values`).

    Returns:
        ``norm_entropy``, ``entropy_penalty``, ``reversibility``, ``rev_penalty``, ``degen`` (each ``[B]``) and
        ``ei_loss`` (a scalar, the batch mean of the variant's weighted sum). Both penalties respond to
        concentration only (card, Disclosure 2; see the module docstring).
    """
    if variant not in EI_VARIANTS:
        raise ValueError(f"unknown EI variant {variant!r}; choose one of {', '.join(EI_VARIANTS)}")
    if h_macro.ndim != 3 or S.ndim != 3 or h_macro.shape[:2] != (S.shape[0], S.shape[2]):
        raise ValueError(
            f"h_macro must be [B, K, D] matching S [B, N, K]; got S {list(S.shape)} and h_macro {list(h_macro.shape)}"
        )
    sigma = assignment_singular_values(S, svd)
    norm_entropy = normalized_spectral_entropy(sigma, S.shape[-1])
    rev = sigma[:, 0] / sigma.sum(-1).clamp_min(1e-12)
    terms = {
        "norm_entropy": norm_entropy,
        "entropy_penalty": F.relu(entropy_floor - norm_entropy),
        "reversibility": rev,
        "rev_penalty": F.relu(rev - reversibility_ceiling),
        "degen": macro_degeneracy(h_macro, S.detach().sum(1) > 0, slots=degen_slots),
    }
    terms["ei_loss"] = _variant_loss(terms, variant, rev_weight, degen_weight)
    return terms


def _variant_loss(
    terms: dict[str, torch.Tensor], variant: EIVariant, rev_weight: float, degen_weight: float
) -> torch.Tensor:
    """The batch mean of ``variant``'s weighted sum of the per-image ``terms`` (:func:`ei_terms`); zero for ``none``."""
    if variant == "full":
        return (terms["entropy_penalty"] + rev_weight * terms["rev_penalty"] + degen_weight * terms["degen"]).mean()
    if variant == "two_term":
        return (terms["entropy_penalty"] + rev_weight * terms["rev_penalty"]).mean()
    if variant == "entropy_only":
        return terms["entropy_penalty"].mean()
    return terms["norm_entropy"].new_zeros(())


EI_SCHEDULES: tuple[str, ...] = ("ramp", "constant")


def ei_weight(epoch: float, final: float = 0.05, start: float = 50, end: float = 200, schedule: str = "ramp") -> float:
    """``lambda_ei`` at ``epoch`` (may be fractional). ``schedule="ramp"``: 0 until ``start``, a cosine ramp to
    ``final`` at ``end``, then ``final`` (docs/cet_vit.md, "The EI regulariser"; the card's first release used
    50 -> 200 of 300 epochs, final weight 0.05). ``schedule="constant"``: ``final`` from the first step (the v4
    card's config shows ``entropy_reg_weight=0.01`` and no schedule; ``start`` and ``end`` are ignored).
    """
    if schedule not in EI_SCHEDULES:
        raise ValueError(f"EI schedule must be one of {', '.join(EI_SCHEDULES)}, got {schedule!r}")
    if schedule == "constant":
        return final
    if end <= start:
        raise ValueError(f"the EI ramp must end after it starts, got start={start}, end={end}")
    if epoch <= start:
        return 0.0
    if epoch >= end:
        return final
    progress = (epoch - start) / (end - start)
    return final * 0.5 * (1.0 - math.cos(math.pi * progress))
