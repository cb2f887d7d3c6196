"""The parts of CET-ViT (CET-ViT v4 model card, "Architecture"): the micro encoder, V-CEO, the Dynamic-K
estimator, the macro encoder, the cross-scale attention and the fusion head; the model is
:class:`vitlab.families.cet_vit.model.CETViT`."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from timm.layers import Mlp, register_notrace_function, resample_abs_pos_embed_nhwc, trunc_normal_
from timm.models import checkpoint
from timm.models.swin_transformer import SwinTransformerStage
from torch import nn

from vitlab.families.cet_vit.slots import budget_values, dense_straight_through, dynamic_k_assignment, topk_softmax
from vitlab.layers import Block, CrossAttention

# shape checks on data: torch.fx (timm's fx feature extraction) keeps these calls whole
register_notrace_function(topk_softmax)


# ------------------------------------------------------------------------------------------------------------------
# Parts
# ------------------------------------------------------------------------------------------------------------------
class MicroEncoder(nn.Module):
    """Swin stages at full token resolution (CET-ViT v4 model card, "Architecture").
    ``x: [B, G, G, C_0] -> [B, G, G, C_last]``.

    Each stage is timm's ``SwinTransformerStage`` without patch merging: window attention with relative position
    bias, windows shifted by half a window in every second block. A stage that changes the width starts with a
    linear projection (``widen``). Windows larger than the grid shrink to the grid (then no shift). A grid not
    divisible by the window is zero-padded after each block's LayerNorm and cropped after the attention; as in
    timm 1.0, padded positions are not masked out of the keys, and the cyclic shift is applied before the padding.
    ``fused_attention``: timm's window attention through SDPA (relative position bias and shift mask as its float
    mask) instead of its eager softmax; on the CPU, SDPA has no fused kernel with attention dropout > 0.
    """

    def __init__(
        self,
        *,
        grid: int,
        embed_dims: Sequence[int],
        depths: Sequence[int],
        num_heads: Sequence[int],
        window_size: int,
        mlp_ratio: float,
        qkv_bias: bool,
        proj_drop: float,
        attn_drop: float,
        drop_path: Sequence[float],
        fused_attention: bool = False,
        dynamic_mask: bool = False,
    ) -> None:
        super().__init__()
        self.widen = nn.ModuleList()
        self.stages = nn.ModuleList()
        width, first_block = embed_dims[0], 0
        for dim, depth, heads in zip(embed_dims, depths, num_heads, strict=True):
            self.widen.append(nn.Linear(width, dim) if dim != width else nn.Identity())
            self.stages.append(
                SwinTransformerStage(
                    dim=dim,
                    out_dim=dim,
                    input_resolution=(grid, grid),
                    depth=depth,
                    downsample=False,
                    num_heads=heads,
                    window_size=window_size,
                    mlp_ratio=mlp_ratio,
                    qkv_bias=qkv_bias,
                    proj_drop=proj_drop,
                    attn_drop=attn_drop,
                    drop_path=list(drop_path[first_block : first_block + depth]),
                    dynamic_mask=dynamic_mask,
                )
            )
            width, first_block = dim, first_block + depth
        for module in self.stages.modules():  # timm leaves its window attention eager unless TIMM_FUSED_ATTN=2
            if hasattr(module, "fused_attn"):
                module.fused_attn = fused_attention

    def forward(self, x: torch.Tensor, taps: list[torch.Tensor] | None = None) -> torch.Tensor:
        """``taps``: a list that receives each stage's output ``[B, G, G, C_i]`` (``forward_intermediates``)."""
        for widen, stage in zip(self.widen, self.stages, strict=True):
            x = stage(widen(x))
            if taps is not None:
                taps.append(x)
        return x

    def set_grad_checkpointing(self, enable: bool = True) -> None:
        """timm's checkpointing of the Swin blocks of every stage (``SwinTransformerStage.grad_checkpointing``)."""
        for stage in self.stages:
            stage.grad_checkpointing = enable


class MicroInputSize:
    """The input size of a model with a timm ``PatchEmbed`` (``patch_embed``), an optional NHWC ``pos_embed``
    ``[1, G, G, C]`` and a :class:`MicroEncoder` (``micro_encoder``), as timm's Swin and ViT change theirs:
    :meth:`set_input_size` for a new fixed size, ``dynamic_img_size`` for any size on each forward. The position
    embedding is resampled (``timm.layers.resample_abs_pos_embed_nhwc``), and the windows and their relative position
    bias tables follow the grid (timm's ``SwinTransformerStage.set_input_size``: a window larger than the grid
    shrinks to it, so a global micro encoder stays global)."""

    dynamic_img_size: bool = False

    @property
    def grid_size(self) -> tuple[int, int]:
        """The patch grid of the input size the model is set for."""
        return tuple(self.patch_embed.grid_size)

    def set_input_size(self, img_size: int | tuple[int, int] | None = None, patch_size: int | None = None) -> None:
        self.patch_embed.set_input_size(img_size=img_size, patch_size=patch_size)
        if self.pos_embed is not None:
            grad = self.pos_embed.requires_grad  # a frozen embedding stays frozen (timm's test_models)
            self.pos_embed = nn.Parameter(resample_abs_pos_embed_nhwc(self.pos_embed, self.grid_size), grad)
        for stage in self.micro_encoder.stages:
            stage.set_input_size(feat_size=self.grid_size, window_size=self.window_size)

    def position_embedded(self, tokens: torch.Tensor) -> torch.Tensor:
        """``tokens [B, H, W, C]`` plus the position embedding (resampled to ``H x W`` with ``dynamic_img_size``)."""
        if self.pos_embed is None:
            return tokens
        if self.dynamic_img_size:
            return tokens + resample_abs_pos_embed_nhwc(self.pos_embed, tokens.shape[1:3])
        return tokens + self.pos_embed


class VCEO(nn.Module):
    """V-CEO assignment (card: "V-CEO Module"): ``S = topk_softmax(Linear(LN(h_micro)), k)``.

    ``h_micro: [B, N, C] -> S: [B, N, K_max]``. With a Dynamic-K ``choice: [B, C]`` the slots beyond each image's
    budget are masked out before the top-k softmax (:func:`dynamic_k_assignment`).
    """

    def __init__(self, dim: int, *, num_slots: int, topk: int, select_grad: str = "hard") -> None:
        super().__init__()
        self.topk = topk
        self.select_grad = select_grad
        self.norm = nn.LayerNorm(dim)
        self.assign = nn.Linear(dim, num_slots)

    def logits(self, h_micro: torch.Tensor) -> torch.Tensor:
        """``[B, N, C] -> [B, N, K_max]`` assignment logits."""
        return self.assign(self.norm(h_micro))

    def assignment(
        self, logits: torch.Tensor, choice: torch.Tensor | None = None, k_candidates: Sequence[int] = ()
    ) -> torch.Tensor:
        """S from the logits: the top-k softmax (masked to the Dynamic-K budget when ``choice`` is given), with the
        dense straight-through gradient when ``select_grad="dense_st"`` (:func:`dense_straight_through`)."""
        if choice is None:
            S = topk_softmax(logits, self.topk)
        else:
            S = dynamic_k_assignment(logits, choice, k_candidates, self.topk)
            if self.select_grad == "dense_st":
                slot = torch.arange(logits.shape[-1], device=logits.device)
                budget = choice @ budget_values(k_candidates, choice)
                logits = logits.masked_fill(slot >= budget.detach()[:, None, None], float("-inf"))
        if self.select_grad == "dense_st":
            S = dense_straight_through(S, logits)
        return S

    def forward(
        self, h_micro: torch.Tensor, choice: torch.Tensor | None = None, k_candidates: Sequence[int] = ()
    ) -> torch.Tensor:
        return self.assignment(self.logits(h_micro), choice, k_candidates)


class DynamicKEstimator(nn.Module):
    """Per-image slot budget (CET-ViT v4 model card, Disclosure 1; docs/cet_vit.md, "Dynamic K"): an MLP on the
    mean micro token picks one of ``k_candidates``.

    ``h_micro: [B, N, C] -> (choice [B, C_k], logits [B, C_k])``. ``mode="gumbel"``: in training a straight-through
    Gumbel-softmax (``F.gumbel_softmax(hard=True)``: one-hot values, soft gradient). ``mode="exact"`` and eval: the
    one-hot argmax of the logits (``exact`` learns by cross-entropy toward :func:`exact_k_targets`, so it needs no
    gradient through the choice). ``softmax(logits)`` (no noise) gives the expected budget ``E[K]``.
    """

    def __init__(
        self, dim: int, *, k_candidates: Sequence[int], hidden_dim: int, tau: float, mode: str = "gumbel"
    ) -> None:
        super().__init__()
        self.k_candidates = tuple(k_candidates)
        self.tau = tau
        self.mode = mode
        self.norm = nn.LayerNorm(dim)
        self.mlp = Mlp(dim, hidden_features=hidden_dim, out_features=len(self.k_candidates))
        self.register_buffer("k_values", torch.tensor(self.k_candidates, dtype=torch.float), persistent=False)

    def forward(self, h_micro: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logits = self.mlp(self.norm(h_micro.mean(1)))
        if self.training and self.mode == "gumbel":
            choice = F.gumbel_softmax(logits, tau=self.tau, hard=True)
        else:
            choice = F.one_hot(logits.argmax(-1), len(self.k_candidates)).to(logits.dtype)
        return choice, logits


class MacroEncoder(nn.Module):
    """Global attention over the macro tokens plus a learned slot embedding. ``[B, K, D] -> [B, K, D]``.

    Built from the shared :class:`~vitlab.layers.Block`, so ``capture_attention`` sees its maps. An empty slot
    (no token assigned) enters as its slot embedding alone; with ``occupied: [B, K]`` (``mask_empty_slots``) it is
    removed from the attention keys (a ``log 0 = -inf`` bias, the same route as ToMe's proportional attention).
    """

    def __init__(
        self,
        dim: int,
        *,
        num_slots: int,
        depth: int,
        num_heads: int,
        mlp_ratio: float,
        qkv_bias: bool,
        proj_drop: float,
        attn_drop: float,
        drop_path: Sequence[float],
    ) -> None:
        super().__init__()
        self.slot_embed = nn.Parameter(torch.zeros(1, num_slots, dim))
        self.blocks = nn.ModuleList(
            Block(
                dim,
                num_heads=num_heads,
                mlp_ratio=mlp_ratio,
                qkv_bias=qkv_bias,
                proj_drop=proj_drop,
                attn_drop=attn_drop,
                drop_path=drop_path[i],
            )
            for i in range(depth)
        )
        trunc_normal_(self.slot_embed, std=0.02)

    grad_checkpointing = False

    def forward(
        self, h_macro: torch.Tensor, occupied: torch.Tensor | None = None, taps: list[torch.Tensor] | None = None
    ) -> torch.Tensor:
        """``taps``: a list that receives each block's output ``[B, K, D]`` (``forward_intermediates``)."""
        x = h_macro + self.slot_embed
        # [B, K, 1]: key bias log(1) = 0 or log(0) = -inf
        size = None if occupied is None else occupied.to(x.dtype).unsqueeze(-1)
        for block in self.blocks:
            if self.grad_checkpointing and torch.is_grad_enabled():
                x = checkpoint(_masked_block, block, x, size)
            else:
                x = _masked_block(block, x, size)
            if taps is not None:
                taps.append(x)
        return x


def _masked_block(block: Block, x: torch.Tensor, size: torch.Tensor | None) -> torch.Tensor:
    """``block(x)``, with the empty slots removed from the keys when ``size: [B, K, 1]`` is given."""
    if size is None:
        return block(x)
    x = x + block.drop_path1(block.attn(block.norm1(x), size=size))
    return x + block.drop_path2(block.mlp(block.norm2(x)))


class PreNormCrossAttention(nn.Module):
    """``x + CrossAttention(LN x, LN context)``: ``x: [B, N, D]`` queries, ``context: [B, M, D]`` -> ``[B, N, D]``."""

    def __init__(
        self, dim: int, *, num_heads: int, qkv_bias: bool = True, attn_drop: float = 0.0, proj_drop: float = 0.0
    ) -> None:
        super().__init__()
        self.norm_q = nn.LayerNorm(dim)
        self.norm_kv = nn.LayerNorm(dim)
        self.attn = CrossAttention(
            dim, num_heads=num_heads, qkv_bias=qkv_bias, attn_drop=attn_drop, proj_drop=proj_drop
        )

    def forward(self, x: torch.Tensor, context: torch.Tensor, key_mask: torch.Tensor | None = None) -> torch.Tensor:
        return x + self.attn(self.norm_q(x), self.norm_kv(context), key_mask=key_mask)


class CrossScaleAttention(nn.Module):
    """Micro tokens attend to macro tokens and macro tokens to micro tokens, both from the same inputs.

    ``micro: [B, N, D]``, ``macro: [B, K, D] -> (micro', macro')`` (card: "CrossScaleAttention", 0.3M parameters
    at width 192: two multi-head attentions). ``occupied: [B, K]`` removes empty slots from the micro tokens' keys.
    A feature extractor has no ``macro_from_micro`` (None: only the classifier reads the updated slots); the slots
    then pass unchanged.
    """

    def __init__(self, dim: int, *, num_heads: int, qkv_bias: bool, attn_drop: float, proj_drop: float) -> None:
        super().__init__()
        kw = dict(num_heads=num_heads, qkv_bias=qkv_bias, attn_drop=attn_drop, proj_drop=proj_drop)
        self.micro_from_macro = PreNormCrossAttention(dim, **kw)
        self.macro_from_micro = PreNormCrossAttention(dim, **kw)

    def forward(
        self, micro: torch.Tensor, macro: torch.Tensor, occupied: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        macro_out = macro if self.macro_from_micro is None else self.macro_from_micro(macro, micro)
        return self.micro_from_macro(micro, macro, occupied), macro_out


class FusionHead(nn.Module):
    """``logits = fc(drop(LN(concat(mean(micro), mean(macro)))))``. ``[B, streams * D] -> [B, num_classes]``.

    ``streams=1`` (the ``grouping: none`` ablation): ``fc(drop(LN(mean(micro))))``.
    """

    def __init__(self, dim: int, *, num_classes: int, drop: float, streams: int = 2) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(streams * dim)
        self.drop = nn.Dropout(drop)
        self.fc = nn.Linear(streams * dim, num_classes) if num_classes > 0 else nn.Identity()

    def forward(self, pooled: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        x = self.drop(self.norm(pooled))
        return x if pre_logits else self.fc(x)
