"""The CET-ViT family's config sections ``model`` and ``loss``, plain data: ``vitlab.config.build_config`` checks
them before anything imports torch."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from vitlab.config.model import ImageModelOptions

#: the values of CET-ViT's string options (the options' ``__post_init__`` checks them; the pooling, EI variant and
#: degeneracy slots are the family's ``slots.POOLS``, ``ei.EI_VARIANTS`` and ``DEGEN_SLOTS``, which
#: ``tests/config/test_model_section.py`` keeps equal to them)
DynamicK = Literal["none", "gumbel", "exact"]
PosEmbed = Literal["none", "learned"]
SelectGrad = Literal["hard", "dense_st"]
Grouping = Literal["card", "none"]
Pool = Literal["mean", "sum"]
EIVariant = Literal["full", "two_term", "entropy_only", "none"]
DegenSlots = Literal["occupied", "all"]
EISvd = Literal["device", "host", "gram"]


@dataclass(frozen=True, kw_only=True)
class CETViTOptions(ImageModelOptions):
    """Options of :class:`vitlab.families.cet_vit.model.CETViT` (CET-ViT v4 model card, "Architecture"), checked
    before a parameter is allocated.

    ``embed_dims``, ``depths``, ``num_heads``: per MicroEncoder stage (width, Swin blocks, heads); ``window_size``:
    the Swin window (shrinks to the grid when larger); ``dynamic_img_size``: any input size (``MicroInputSize``).
    ``pos_embed``: ``none`` (the card, which is silent) or ``learned``, an absolute position embedding after the
    PatchEmbed (docs/cet_vit.md, "Architecture as built"). ``num_slots``: ``K_max`` macro slots; ``topk``: non-zeros
    per row of S (``topk = num_slots`` is dense); ``slot_ratio`` > 0: ``K_max = max(topk + 1, N // slot_ratio)``
    for ``N`` tokens instead (the card's 256 tokens into 32 slots is 8). ``mask_empty_slots``: slots without
    assignment mass leave mean(macro) and the keys of the cross-attention and MacroEncoder (otherwise they enter as
    their slot embedding alone, as in the card). ``select_grad``: ``hard`` (the card's top-k: gradient to ``k``
    logits per token) or ``dense_st`` (the dense softmax's gradient to all ``K_max``). ``pool``: ``mean`` or ``sum``
    (the card's plain ``S^T h_micro``). ``fusion_dim``, ``fusion_heads``: width and heads of the MacroEncoder,
    CrossScaleAttention and DeepEncoder; ``macro_depth``, ``deep_depth``: their global blocks. ``dynamic_k``:
    ``none``, ``gumbel`` (the straight-through estimator, docs/cet_vit.md, "Dynamic K") or ``exact`` (the estimator
    learns from the exact per-candidate losses); ``k_candidates``, ``k_hidden_dim``, ``k_tau``: its budgets, hidden
    width and Gumbel temperature. ``ei``: the EI variant in ``aux.ei["ei_loss"]``; ``ei_degen_slots``: the pairs of
    the degeneracy term, ``occupied`` slots or ``all`` (the card's mean over every pair); ``ei_svd``: where the
    singular values are computed, ``device``, ``host`` or ``gram`` (the eigenvalues of ``S^T S`` in float64).
    ``fused_window_attention``: the MicroEncoder's window attention through SDPA. ``drop_rate``, ``attn_drop_rate``,
    ``drop_path_rate``: dropout after projections and before the head, attention dropout, stochastic depth (linear
    over all blocks in forward order). ``grouping``: ``card`` or ``none``, an ablation (PatchEmbed, MicroEncoder and
    ``fc(LN(mean(h_micro)))`` only; docs/experiments/cet_vit_ablation.md, "Which element costs the accuracy").
    """

    patch_size: int = 2
    num_classes: int = 100
    embed_dims: tuple[int, ...] = (96, 192, 384, 768)
    depths: tuple[int, ...] = (2, 2, 8, 2)
    num_heads: tuple[int, ...] = (3, 6, 12, 24)
    window_size: int = 4
    mlp_ratio: float = 4.0
    qkv_bias: bool = True
    pos_embed: PosEmbed = "none"
    num_slots: int = 32
    topk: int = 3
    slot_ratio: int = 0
    mask_empty_slots: bool = False
    select_grad: SelectGrad = "hard"
    pool: Pool = "mean"
    fusion_dim: int = 192
    fusion_heads: int = 6
    macro_depth: int = 6
    deep_depth: int = 1
    dynamic_k: DynamicK = "none"
    k_candidates: tuple[int, ...] = (4, 8, 16, 32)
    k_hidden_dim: int = 64
    k_tau: float = 1.0
    ei: EIVariant = "full"
    ei_degen_slots: DegenSlots = "occupied"
    ei_svd: EISvd = "device"
    fused_window_attention: bool = False
    drop_rate: float = 0.0
    attn_drop_rate: float = 0.0
    drop_path_rate: float = 0.0
    grouping: Grouping = "card"
    dynamic_img_size: bool = False

    @property
    def slots(self) -> int:
        """``K_max``: ``num_slots``, or sized to the token count by ``slot_ratio``."""
        return max(self.topk + 1, self.grid * self.grid // self.slot_ratio) if self.slot_ratio > 0 else self.num_slots

    def __post_init__(self) -> None:
        for name in ("embed_dims", "depths", "num_heads", "k_candidates"):  # a list from Python or YAML
            object.__setattr__(self, name, tuple(getattr(self, name)))
        super().__post_init__()
        if not (len(self.embed_dims) == len(self.depths) == len(self.num_heads) >= 1):
            raise ValueError(
                f"embed_dims, depths and num_heads give one entry per MicroEncoder stage and must have the same "
                f"length, got {len(self.embed_dims)}, {len(self.depths)}, {len(self.num_heads)}"
            )
        for dim, heads in zip(self.embed_dims, self.num_heads, strict=True):
            if dim % heads != 0:
                raise ValueError(
                    f"stage width {dim} is not divisible by its {heads} heads; fix embed_dims or num_heads"
                )
        if self.fusion_dim % self.fusion_heads != 0:
            raise ValueError(f"fusion_dim {self.fusion_dim} is not divisible by fusion_heads={self.fusion_heads}")
        if self.slot_ratio < 0:
            raise ValueError(
                f"slot_ratio must be 0 (use num_slots) or a positive tokens per slot, got {self.slot_ratio}"
            )
        if self.slots < 2 or not 1 <= self.topk <= self.slots:
            raise ValueError(
                f"need num_slots >= 2 and 1 <= topk <= num_slots, got num_slots={self.slots}, topk={self.topk}"
            )
        candidates = list(self.k_candidates)
        if self.dynamic_k != "none" and (
            candidates != sorted(set(candidates)) or not all(self.topk <= c <= self.slots for c in candidates)
        ):
            raise ValueError(
                f"k_candidates must be increasing slot budgets between topk={self.topk} and num_slots={self.slots}, "
                f"got {candidates}"
            )
        if self.grouping == "none" and self.dynamic_k != "none":
            raise ValueError("grouping: none has no V-CEO to budget; use dynamic_k: none with it")


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
