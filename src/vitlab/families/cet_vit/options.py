"""The options of :class:`~vitlab.families.cet_vit.model.CETViT` that take one of a few values (their types are the
config's, :mod:`vitlab.families.cet_vit.config`), and the check of their combinations: clear errors before a
parameter is allocated."""

from __future__ import annotations

from collections.abc import Mapping
from typing import get_args

from vitlab.families.cet_vit.config import DynamicK, Grouping, PosEmbed, SelectGrad
from vitlab.families.cet_vit.ei import DEGEN_SLOTS, EI_SVD_WAYS, EI_VARIANTS
from vitlab.families.cet_vit.slots import POOLS

DYNAMIC_K_MODES: tuple[str, ...] = get_args(DynamicK)
POS_EMBEDS: tuple[str, ...] = get_args(PosEmbed)
SELECT_GRADS: tuple[str, ...] = get_args(SelectGrad)
GROUPINGS: tuple[str, ...] = get_args(Grouping)

#: the string options checked by name in :func:`check_options` and their values
CHOICES: dict[str, tuple[str, ...]] = {
    "pos_embed": POS_EMBEDS,
    "select_grad": SELECT_GRADS,
    "grouping": GROUPINGS,
    "ei_degen_slots": DEGEN_SLOTS,
    "ei_svd": EI_SVD_WAYS,
}


def check_options(
    *,
    embed_dims: tuple[int, ...],
    depths: tuple[int, ...],
    num_heads: tuple[int, ...],
    num_slots: int,
    topk: int,
    pool: str,
    fusion_dim: int,
    fusion_heads: int,
    dynamic_k: str,
    k_candidates: tuple[int, ...],
    ei: str,
    choices: Mapping[str, str],
) -> None:
    """Clear errors for inconsistent CET-ViT options; ``choices``: the options of :data:`CHOICES` by name."""
    if not (len(embed_dims) == len(depths) == len(num_heads) >= 1):
        raise ValueError(
            f"embed_dims, depths and num_heads give one entry per MicroEncoder stage and must have the same length, "
            f"got {len(embed_dims)}, {len(depths)}, {len(num_heads)}"
        )
    for dim, heads in zip(embed_dims, num_heads, strict=True):
        if dim % heads != 0:
            raise ValueError(f"stage width {dim} is not divisible by its {heads} heads; fix embed_dims or num_heads")
    if fusion_dim % fusion_heads != 0:
        raise ValueError(f"fusion_dim {fusion_dim} is not divisible by fusion_heads={fusion_heads}")
    if num_slots < 2 or not 1 <= topk <= num_slots:
        raise ValueError(f"need num_slots >= 2 and 1 <= topk <= num_slots, got num_slots={num_slots}, topk={topk}")
    if pool not in POOLS:
        raise ValueError(f"pool must be one of {', '.join(POOLS)}, got {pool!r}")
    if ei not in EI_VARIANTS:
        raise ValueError(f"ei must be one of {', '.join(EI_VARIANTS)}, got {ei!r}")
    if dynamic_k not in DYNAMIC_K_MODES:
        raise ValueError(f"dynamic_k must be one of {', '.join(DYNAMIC_K_MODES)}, got {dynamic_k!r}")
    if dynamic_k != "none" and (
        list(k_candidates) != sorted(set(k_candidates)) or not all(topk <= c <= num_slots for c in k_candidates)
    ):
        raise ValueError(
            f"k_candidates must be increasing slot budgets between topk={topk} and num_slots={num_slots}, "
            f"got {list(k_candidates)}"
        )
    for name, value in choices.items():
        if value not in CHOICES[name]:
            raise ValueError(f"{name} must be one of {', '.join(CHOICES[name])}, got {value!r}")
    if choices.get("grouping") == "none" and dynamic_k != "none":
        raise ValueError("grouping: none has no V-CEO to budget; use dynamic_k: none with it")
