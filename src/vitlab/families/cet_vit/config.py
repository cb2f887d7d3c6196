"""The CET-ViT family's config sections ``model`` and ``loss``, plain data: ``vitlab.config.build_config`` checks
them before anything imports torch."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from vitlab.config.model import ImageModelConfig

#: the values of CET-ViT's string options (``vitlab.families.cet_vit.options`` checks the model's with these; the
#: pooling, EI variant and degeneracy slots are the family's ``slots.POOLS``, ``ei.EI_VARIANTS`` and ``DEGEN_SLOTS``,
#: which ``tests/config/test_model_section.py`` keeps equal to them)
DynamicK = Literal["none", "gumbel", "exact"]
PosEmbed = Literal["none", "learned"]
SelectGrad = Literal["hard", "dense_st"]
Grouping = Literal["card", "none"]
Pool = Literal["mean", "sum"]
EIVariant = Literal["full", "two_term", "entropy_only", "none"]
DegenSlots = Literal["occupied", "all"]
EISvd = Literal["device", "host", "gram"]


class CETViTConfig(ImageModelConfig, total=False):
    """Options of :class:`vitlab.families.cet_vit.model.CETViT`: ``embed_dims``, ``depths`` and ``num_heads`` give one
    entry per stage; each string option one of its values. The combinations (widths and heads, slots and ``topk``,
    the Dynamic-K budgets) are checked by the model's constructor, which ``fit`` runs before it claims the run
    folder."""

    embed_dims: list[int]
    depths: list[int]
    num_heads: list[int]
    window_size: int
    mlp_ratio: float
    qkv_bias: bool
    pos_embed: PosEmbed
    num_slots: int
    topk: int
    slot_ratio: int
    mask_empty_slots: bool
    select_grad: SelectGrad
    pool: Pool
    fusion_dim: int
    fusion_heads: int
    macro_depth: int
    deep_depth: int
    dynamic_k: DynamicK
    k_candidates: list[int]
    k_hidden_dim: int
    k_tau: float
    ei: EIVariant
    ei_degen_slots: DegenSlots
    ei_svd: EISvd
    fused_window_attention: bool
    drop_rate: float
    attn_drop_rate: float
    drop_path_rate: float
    grouping: Grouping
    dynamic_img_size: bool


@dataclass
class CETLossConfig:
    """The ``loss:`` section for CET-ViT (CET-ViT v4 model card: "EI loss, as actually
    implemented", and Disclosure 1 on Dynamic K).

    ``lambda_ei`` ramps from 0 at epoch ``ei_start`` to its final value at ``ei_end`` along a cosine (the card's first
    release: 0.05, epochs 50 -> 200 of 300); ``ei_schedule: constant`` holds ``lambda_ei`` from the first step (the
    v4 card's ``entropy_reg_weight=0.01``: config ``compare/cifar10_p4_ei_card``). ``lambda_k`` weights
    ``E[K] / K_max`` of the Dynamic-K estimator (``gumbel``: added to the loss; ``exact``: inside the target
    ``argmin_c (L_c + lambda_k K_c / K_max)``, which the estimator fits by cross-entropy weighted ``k_fit_weight``).
    The EI variant (``full | two_term | entropy_only | none``) is the model option ``ei``.
    """

    lambda_ei: float = 0.05
    ei_start: float = 50
    ei_end: float = 200
    ei_schedule: Literal["ramp", "constant"] = "ramp"
    lambda_k: float = 0.01
    k_fit_weight: float = 1.0
