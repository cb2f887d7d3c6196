"""Pure functions of a token-to-slot assignment ``S: [B, N, K_max]`` (CET-ViT v4 model card: V-CEO, Disclosure 1).

CET-ViT builds its assignment with them, and its probes and evaluation read ``S`` with them.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

POOLS = ("mean", "sum")
ASSIGNMENT_ABLATIONS = ("none", "random", "uniform")


# ------------------------------------------------------------------------------------------------------------------
# Pure functions of the V-CEO assignment
# ------------------------------------------------------------------------------------------------------------------
def topk_softmax(logits: torch.Tensor, k: int) -> torch.Tensor:
    """Sparse top-k softmax (card: "Sparse top-3 softmax assignment"). ``logits: [..., K] -> S: [..., K]``.

    Per row, a softmax over the ``k`` largest logits and zero elsewhere, so every row sums to 1 with exactly ``k``
    non-zeros. ``k = K`` is the dense softmax (the card's dense-softmax ablation). Logits of ``-inf`` (masked
    slots) are never selected while at least ``k`` logits are finite.
    """
    if not 1 <= k <= logits.shape[-1]:
        raise ValueError(f"top-k softmax needs 1 <= k <= K = {logits.shape[-1]} slots, got k={k}")
    values, index = logits.topk(k, dim=-1)
    weights = values.softmax(-1)  # float32 under autocast, whatever the logits' dtype
    return weights.new_zeros(logits.shape).scatter(-1, index, weights)


def dense_straight_through(S: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    """The hard top-k ``S`` in the forward pass, the dense softmax's gradient in the backward pass.

    ``S + softmax(logits) - stop_gradient(softmax(logits))``: the value is exactly ``S`` (the card's sparse top-3),
    but every one of the ``K_max`` logits gets the gradient of the dense softmax (``select_grad: dense_st``; the hard
    top-k passes gradient to only ``k`` of them). Masked logits (``-inf``) keep a zero gradient.
    """
    dense = logits.softmax(-1)
    return S + (dense - dense.detach())


def ablate_assignment(S: torch.Tensor, mode: str, k: int, generator: torch.Generator | None = None) -> torch.Tensor:
    """A test-time stand-in for the learned ``S`` (how many points the grouping is worth). ``S: [B, N, K] -> same``.

    ``random``: each token keeps its own top-k weights but on ``k`` distinct slots drawn uniformly at random;
    ``uniform``: every token spread evenly over all ``K`` slots (all macro tokens equal). ``none`` returns ``S``.
    """
    if mode not in ASSIGNMENT_ABLATIONS:
        raise ValueError(f"assignment ablation must be one of {', '.join(ASSIGNMENT_ABLATIONS)}, got {mode!r}")
    if mode == "none":
        return S
    if mode == "uniform":
        return torch.full_like(S, 1.0 / S.shape[-1])
    weights = S.topk(k, dim=-1).values
    noise = torch.rand(S.shape, generator=generator, device="cpu").to(S.device)
    index = noise.argsort(-1)[..., :k]
    return torch.zeros_like(S).scatter(-1, index, weights)


def occupied_slots(S: torch.Tensor) -> torch.Tensor:
    """Slots that received any assignment mass: ``S: [B, N, K] -> bool [B, K]`` (an empty slot has mass exactly 0)."""
    return S.detach().sum(1) > 0


def budget_values(k_candidates: Sequence[int], like: torch.Tensor) -> torch.Tensor:
    """The candidate budgets as a ``[C]`` tensor of ``like``'s dtype and device, filled there: a tensor made from a
    host list (``torch.tensor(k_candidates, device=...)``) is a blocking copy that waits for a CUDA device."""
    return torch.stack([like.new_full((), k) for k in k_candidates])


def exact_k_targets(
    candidate_losses: torch.Tensor, k_candidates: Sequence[int], num_slots: int, lambda_k: float
) -> torch.Tensor:
    """The Dynamic-K training target per image: ``argmin_c (L_c + lambda_k * K_c / K_max)``.

    ``candidate_losses: [C, B]`` the cross-entropy of each image with its assignment restricted to each candidate
    budget (the part after the V-CEO run once per candidate, :meth:`CETViT.candidate_logits`). Returns ``[B]`` long
    candidate indices. The estimator is trained by cross-entropy toward them (``dynamic_k: exact``).
    """
    if candidate_losses.ndim != 2 or candidate_losses.shape[0] != len(k_candidates):
        raise ValueError(
            f"candidate_losses must be [C, B] with C = {len(k_candidates)} candidates, "
            f"got {list(candidate_losses.shape)}"
        )
    cost = budget_values(k_candidates, candidate_losses) / num_slots
    return (candidate_losses + lambda_k * cost[:, None]).argmin(0)


def topk_margin(logits: torch.Tensor, k: int) -> torch.Tensor:
    """``logits: [B, N, K_max]`` -> ``[B]``: per image, the mean over tokens of the k-th largest logit minus the
    (k+1)-th, the margin by which each token's top-k choice stands (0: a tie at the edge of the choice)."""
    values = logits.topk(k + 1, dim=-1).values
    return (values[..., k - 1] - values[..., k]).mean(-1)


def slot_usage_k(S: torch.Tensor, threshold: float = 0.05) -> torch.Tensor:
    """Post-hoc number of active macro regions per image (CET-ViT v4 model card: Disclosure 1).

    ``usage = S.sum(1)`` normalised over slots; ``K = #(usage > threshold)``. ``S: [B, N, K_max] -> [B]`` (long).
    """
    if S.ndim != 3:
        raise ValueError(f"S must be [B, N, K_max], got shape {list(S.shape)}")
    usage = S.sum(1)
    usage = usage / usage.sum(-1, keepdim=True).clamp_min(1e-8)
    return (usage > threshold).sum(-1)


def pool_slots(S: torch.Tensor, tokens: torch.Tensor, pool: str = "mean") -> torch.Tensor:
    """Macro tokens from an assignment (card: ``h_macro = S^T h_micro``). ``S: [B, N, K]``, ``tokens: [B, N, D]``.

    Returns ``[B, K, D]``. ``pool="sum"`` is the card's plain sum; ``"mean"`` (default) divides each slot by its
    mass ``sum_n S[n, k]`` counted in tokens, floored at one token, so a slot holding less than one token's worth
    is scaled down with it instead of being blown up (its gradient would carry ``1 / mass``).
    """
    if pool not in POOLS:
        raise ValueError(f"pool must be one of {', '.join(POOLS)}, got {pool!r}")
    pooled = S.transpose(1, 2) @ tokens
    if pool == "sum":
        return pooled
    return pooled / S.sum(1).clamp_min(1.0).unsqueeze(-1)


def dynamic_k_assignment(
    logits: torch.Tensor, choice: torch.Tensor, k_candidates: Sequence[int], k: int
) -> torch.Tensor:
    """Top-k assignment with a per-image slot budget picked from ``k_candidates`` (CET-ViT v4 model card,
    Disclosure 1; rebuilt to train, docs/cet_vit.md, "Dynamic K").

    ``logits: [B, N, K_max]``, ``choice: [B, C]`` one-hot over the candidates (straight-through Gumbel-softmax in
    training: hard values, soft gradient). Returns ``S: [B, N, K_max]``::

        S = sum_c choice[:, c] * topk_softmax(logits with slots >= K_c set to -inf, k)

    In the forward pass this is exactly the masked top-k softmax of the chosen budget. In the backward pass
    ``dL/dchoice_c = <dL/dS, S_c>`` compares the loss under every candidate budget, so the estimator gets a
    non-zero gradient from the classification loss. (Masking the logits with ``log(mask)`` instead gives it none:
    S is invariant to a common scale of the unmasked slots, and masked slots lie outside the top-k, so the gradient
    reaching the mask sums to zero.)
    """
    if choice.shape != (logits.shape[0], len(k_candidates)):
        raise ValueError(f"choice must be [B, C] = [{logits.shape[0]}, {len(k_candidates)}], got {list(choice.shape)}")
    slot = torch.arange(logits.shape[-1], device=logits.device)
    S = torch.zeros_like(logits)
    for c, budget in enumerate(k_candidates):
        masked = logits.masked_fill(slot >= budget, float("-inf"))
        S = S + choice[:, c, None, None] * topk_softmax(masked, k)
    return S
