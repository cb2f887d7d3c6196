"""CET-ViT: a hierarchical ViT that routes micro tokens into macro slots by sparse top-k assignment.

Source: the CET-ViT v4 model card ("Architecture", Disclosure 1, "EI loss, as actually implemented"); where the
card is silent, the project decides (docs/cet_vit.md). Pipeline (card: "Architecture")::

    PatchEmbed (P x P)                          -> micro tokens on a G x G grid
    MicroEncoder: Swin stages, full resolution  -> h_micro [B, N, C]        (no patch merging: V-CEO needs all N)
    V-CEO: S = topk_softmax(Linear(LN(h_micro)))  [B, N, K_max]           (the operative mechanism, k = 3)
    fusion_proj: Linear C -> D                   (bridges the micro width to the fusion width)
    h_macro = S^T h_micro / slot mass             [B, K_max, D]          (``pool="sum"``: the card's plain sum)
    MacroEncoder: shared Blocks over h_macro + slot embedding
    CrossScaleAttention: micro <- macro and macro <- micro, each with a residual
    DeepEncoder: shared Blocks over the fused micro tokens
    head: Linear(LN(concat(mean(micro), mean(macro))))

Pooling the projected tokens equals projecting the pooled ones (a linear map commutes with a weighted mean), so
one projection serves both the micro stream and the macro tokens.

``dynamic_k="gumbel"`` adds the Dynamic-K estimator that the card's Disclosure 1 found dead, rebuilt so that it
trains (the project's decision; docs/cet_vit.md, "Dynamic K"; :func:`dynamic_k_assignment`).

Training interface: ``forward(x)`` returns the logits only, so CET-ViT obeys the same contract as every other
model (evaluation, TTA, calibration, attention capture call ``model(x)``). A training task calls
``forward_with_aux(x) -> (logits, CETViTAux)`` and adds ``aux.regularization(lambda_ei, lambda_k)``, i.e.
``lambda_ei * ei_loss + lambda_k * k_cost``, to the cross-entropy; ``lambda_ei`` follows
:func:`vitlab.families.cet_vit.ei.ei_weight`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from timm.models.vision_transformer import init_weights_vit_timm
from torch import nn

from vitlab.families.cet_vit import baselines  # noqa: F401 (registers the size-matched baselines)
from vitlab.families.cet_vit.ei import EIVariant, ei_terms
from vitlab.families.cet_vit.features import FeatureTaps
from vitlab.families.cet_vit.options import check_options
from vitlab.families.cet_vit.outputs import CETViTAux, Encoded
from vitlab.families.cet_vit.parts import (
    VCEO,
    CrossScaleAttention,
    DynamicKEstimator,
    FusionHead,
    MacroEncoder,
    MicroEncoder,
    MicroInputSize,
)
from vitlab.families.cet_vit.presets import DESCRIPTIONS, PRESETS
from vitlab.families.cet_vit.slots import (
    ablate_assignment,
    occupied_slots,
    pool_slots,
    slot_usage_k,
    topk_margin,
)
from vitlab.layers import Block, PatchEmbed, trunc_normal_
from vitlab.models.contract import ModelContract
from vitlab.models.registry import register_preset
from vitlab.models.sizing import parameter_count
from vitlab.models.vit import check_patch_grid


class CETViT(MicroInputSize, FeatureTaps, ModelContract, nn.Module):
    """CET-ViT classifier (CET-ViT v4 model card: "Architecture"). ``x: [B, C, H, W] -> logits [B, num_classes]``.

    timm's model contract (:mod:`vitlab.models.contract`): ``forward_features`` -> ``forward_head``;
    ``embed_dim`` is the token width ``D`` of ``forward_features``; ``num_features`` and ``head_hidden_size`` the
    pooled width ``2D`` (``D`` with ``grouping: none``) that ``forward_head(pre_logits=True)`` and the forward with
    ``num_classes=0`` give. ``forward_intermediates`` taps the three token streams, in forward order
    (``feature_info``, each entry with its ``stream``): ``micro`` (each MicroEncoder stage, ``[B, C_i, G, G]``),
    ``macro`` (each MacroEncoder block's slots ``[B, K_max, D]``; as a map, each patch's mixture of its slots
    ``S h_macro``, the rows of S summing to one) and ``fused`` (the micro stream after the CrossScaleAttention and
    after each DeepEncoder block, ``[B, D, G, G]``). ``set_grad_checkpointing`` checkpoints the Swin blocks, the
    macro blocks, the cross-scale attention and the deep blocks; ``group_matcher`` orders the parameters the same way
    for layer-wise learning-rate decay.

    Args:
        img_size, patch_size, in_chans, num_classes: input and output.
        embed_dims, depths, num_heads: per MicroEncoder stage (width, Swin blocks, heads).
        window_size: Swin window (shrinks to the grid when larger); dynamic_img_size: :class:`MicroInputSize`.
        pos_embed: ``none`` (the card, which is silent) or ``learned``: an absolute position embedding added after
            the PatchEmbed (docs/cet_vit.md, "Architecture as built"), so the stages after the windowed micro
            encoder know where a token was.
        num_slots: ``K_max`` macro slots. ``topk``: non-zeros per row of S (``topk = num_slots`` is dense).
        slot_ratio: when > 0, ``K_max = max(topk + 1, N // slot_ratio)`` sized to the token count ``N`` instead of
            ``num_slots`` (the card's 256 tokens into 32 slots is ``slot_ratio=8``).
        mask_empty_slots: remove slots without assignment mass from mean(macro), the cross-attention keys and the
            MacroEncoder's keys (otherwise they enter as their slot embedding alone, as in the card).
        select_grad: ``hard`` (the card's top-k: gradient to ``k`` logits per token) or ``dense_st`` (same forward,
            the dense softmax's gradient to all ``K_max`` logits, :func:`dense_straight_through`).
        pool: ``mean`` (default) or ``sum`` (the card's plain ``S^T h_micro``), see :func:`pool_slots`.
        fusion_dim, fusion_heads: width and heads of the MacroEncoder, CrossScaleAttention and DeepEncoder.
        macro_depth, deep_depth: global blocks in the MacroEncoder and the DeepEncoder.
        dynamic_k: ``none``, ``gumbel`` (the straight-through estimator, docs/cet_vit.md, "Dynamic K") or ``exact`` (the
            estimator learns from the exact per-candidate losses, :func:`exact_k_targets`).
        k_candidates, k_hidden_dim, k_tau: the estimator's budgets, hidden width and Gumbel temperature.
        ei: EI variant reported in ``aux.ei["ei_loss"]``: ``full``, ``two_term``, ``entropy_only`` or ``none``.
        ei_degen_slots: the pairs of the EI degeneracy term: ``occupied`` (default, the slots with assignment mass)
            or ``all`` (the card's mean over every pair, an empty slot counting as cosine 0); an empty slot is never
            normalised either way (:func:`vitlab.families.cet_vit.ei.macro_degeneracy`).
        ei_svd: how the EI term's singular values are computed: ``device`` (default, ``svdvals`` on the model's
            device), ``host`` (the CPU, the values and gradient copied; the same numbers, for a GPU where cuSOLVER's
            per-image calls and synchronisation cost more than the copies) or ``gram`` (the eigenvalues of
            ``S^T S`` in float64, one batched call; :func:`vitlab.families.cet_vit.ei.assignment_singular_values`).
        fused_window_attention: the MicroEncoder's window attention through SDPA (see :class:`MicroEncoder`).
        drop_rate, attn_drop_rate, drop_path_rate: dropout after projections and before the head, attention
            dropout, and stochastic depth (linear over all blocks in forward order).
        grouping: ``card`` (the card's pipeline) or ``none``, an ablation switch
            (docs/experiments/cet_vit_ablation.md, "Which element costs the accuracy"): PatchEmbed, the
            MicroEncoder and ``fc(LN(mean(h_micro)))`` only; no V-CEO, MacroEncoder, CrossScaleAttention or
            DeepEncoder are built, and there is no S and no EI term.

    ``assignment_ablation`` (an attribute, not a constructor option): ``none``, or ``random`` / ``uniform`` to
    replace S at test time (:func:`ablate_assignment`; :func:`vitlab.families.cet_vit.grouping.grouping_ablation`).
    """

    classifier_name = "head.fc"

    def __init__(
        self,
        *,
        img_size: int = 32,
        patch_size: int = 2,
        in_chans: int = 3,
        num_classes: int = 100,
        embed_dims: Sequence[int] = (96, 192, 384, 768),
        depths: Sequence[int] = (2, 2, 8, 2),
        num_heads: Sequence[int] = (3, 6, 12, 24),
        window_size: int = 4,
        mlp_ratio: float = 4.0,
        qkv_bias: bool = True,
        pos_embed: str = "none",
        num_slots: int = 32,
        topk: int = 3,
        slot_ratio: int = 0,
        mask_empty_slots: bool = False,
        select_grad: str = "hard",
        pool: str = "mean",
        fusion_dim: int = 192,
        fusion_heads: int = 6,
        macro_depth: int = 6,
        deep_depth: int = 1,
        dynamic_k: str = "none",
        k_candidates: Sequence[int] = (4, 8, 16, 32),
        k_hidden_dim: int = 64,
        k_tau: float = 1.0,
        ei: EIVariant = "full",
        ei_degen_slots: str = "occupied",
        ei_svd: str = "device",
        fused_window_attention: bool = False,
        drop_rate: float = 0.0,
        attn_drop_rate: float = 0.0,
        drop_path_rate: float = 0.0,
        grouping: str = "card",
        dynamic_img_size: bool = False,
    ) -> None:
        super().__init__()
        embed_dims, depths, num_heads = tuple(embed_dims), tuple(depths), tuple(num_heads)
        k_candidates = tuple(k_candidates)
        grid = check_patch_grid(img_size, patch_size)
        if slot_ratio < 0:
            raise ValueError(f"slot_ratio must be 0 (use num_slots) or a positive tokens per slot, got {slot_ratio}")
        if slot_ratio > 0:
            num_slots = max(topk + 1, grid * grid // slot_ratio)
        check_options(
            embed_dims=embed_dims,
            depths=depths,
            num_heads=num_heads,
            num_slots=num_slots,
            topk=topk,
            pool=pool,
            fusion_dim=fusion_dim,
            fusion_heads=fusion_heads,
            dynamic_k=dynamic_k,
            k_candidates=k_candidates,
            ei=ei,
            choices={
                "pos_embed": pos_embed,
                "select_grad": select_grad,
                "grouping": grouping,
                "ei_degen_slots": ei_degen_slots,
                "ei_svd": ei_svd,
            },
        )
        self.grouping = grouping
        self.num_classes = num_classes
        self.num_slots = num_slots
        self.pool = pool
        self.ei_variant = ei
        self.ei_degen_slots = ei_degen_slots
        self.ei_svd = ei_svd
        self.mask_empty_slots = mask_empty_slots
        self.dynamic_k = dynamic_k
        self.assignment_ablation = "none"
        self.window_size, self.dynamic_img_size = window_size, dynamic_img_size
        self.global_pool = "avg"
        if grouping == "none":
            macro_depth = deep_depth = 0
        micro_end = sum(depths)
        macro_end = micro_end + macro_depth
        num_blocks = macro_end + deep_depth
        # Plain Python (not torch.linspace) so the model can be built on the meta device.
        dpr = [drop_path_rate * i / max(num_blocks - 1, 1) for i in range(num_blocks)]
        micro_dpr, macro_dpr, deep_dpr = dpr[:micro_end], dpr[micro_end:macro_end], dpr[macro_end:]
        blocks = dict(mlp_ratio=mlp_ratio, qkv_bias=qkv_bias, proj_drop=drop_rate, attn_drop=attn_drop_rate)

        self.patch_embed = PatchEmbed(
            img_size=img_size,
            patch_size=patch_size,
            in_chans=in_chans,
            embed_dim=embed_dims[0],
            norm_layer=nn.LayerNorm,
            output_fmt="NHWC",
            strict_img_size=not dynamic_img_size,
        )
        if pos_embed == "learned":
            self.pos_embed = nn.Parameter(torch.zeros(1, grid, grid, embed_dims[0]))
            trunc_normal_(self.pos_embed, std=0.02)
        else:
            self.pos_embed = None
        self.micro_encoder = MicroEncoder(
            grid=grid,
            embed_dims=embed_dims,
            depths=depths,
            num_heads=num_heads,
            window_size=window_size,
            drop_path=micro_dpr,
            fused_attention=fused_window_attention,
            dynamic_mask=dynamic_img_size,
            **blocks,
        )
        micro_dim = embed_dims[-1]
        self.feature_info = [
            dict(module=f"micro_encoder.stages.{i}", num_chs=dim, reduction=patch_size, stream="micro")
            for i, dim in enumerate(embed_dims)
        ]
        if grouping == "none":
            self.k_estimator = None
            self.embed_dim = self.num_features = self.head_hidden_size = micro_dim
            self.head = FusionHead(micro_dim, num_classes=num_classes, drop=drop_rate, streams=1)
            self.apply(init_weights_vit_timm)
            return
        self.embed_dim, self.num_features, self.head_hidden_size = fusion_dim, 2 * fusion_dim, 2 * fusion_dim
        fused = dict(num_chs=fusion_dim, reduction=patch_size)
        self.feature_info += [
            dict(module=f"macro_encoder.blocks.{i}", stream="macro", **fused) for i in range(macro_depth)
        ]
        self.feature_info += [dict(module="cross_scale", stream="fused", **fused)]
        self.feature_info += [dict(module=f"deep_encoder.{i}", stream="fused", **fused) for i in range(deep_depth)]
        self.v_ceo = VCEO(micro_dim, num_slots=num_slots, topk=topk, select_grad=select_grad)
        if dynamic_k != "none":
            self.k_estimator = DynamicKEstimator(
                micro_dim, k_candidates=k_candidates, hidden_dim=k_hidden_dim, tau=k_tau, mode=dynamic_k
            )
        else:
            self.k_estimator = None
        self.fusion_proj = nn.Linear(micro_dim, fusion_dim) if micro_dim != fusion_dim else nn.Identity()
        self.macro_encoder = MacroEncoder(
            fusion_dim, num_slots=num_slots, depth=macro_depth, num_heads=fusion_heads, drop_path=macro_dpr, **blocks
        )
        self.cross_scale = CrossScaleAttention(
            fusion_dim, num_heads=fusion_heads, qkv_bias=qkv_bias, attn_drop=attn_drop_rate, proj_drop=drop_rate
        )
        self.deep_encoder = nn.ModuleList(
            Block(fusion_dim, num_heads=fusion_heads, drop_path=deep_dpr[i], **blocks) for i in range(deep_depth)
        )
        self.head = FusionHead(fusion_dim, num_classes=num_classes, drop=drop_rate)
        self.apply(init_weights_vit_timm)

    @torch.jit.ignore
    def no_weight_decay(self) -> set[str]:
        """Relative position bias tables, the slot and position embeddings (timm's Swin and ViT convention)."""
        return {
            name
            for name, _ in self.named_parameters()
            if name.endswith(("relative_position_bias_table", "slot_embed", "pos_embed"))
        }

    @torch.jit.ignore
    def group_matcher(self, coarse: bool = False) -> dict[str, Any]:
        """timm's layer groups in forward order: the embeddings; each MicroEncoder block (a stage's widening
        projection with its first block; ``coarse``: one group a stage); the V-CEO with the Dynamic-K estimator and
        the fusion projection; each MacroEncoder block (the slot embedding with the first); the CrossScaleAttention;
        each DeepEncoder block; the head last (unmatched, timm's rule)."""
        micro = (
            [(r"^micro_encoder\.(?:widen|stages)\.(\d+)", None)]
            if coarse
            else [(r"^micro_encoder\.widen\.(\d+)", (0,)), (r"^micro_encoder\.stages\.(\d+)\.blocks\.(\d+)", None)]
        )
        return dict(
            stem=r"^patch_embed|^pos_embed",
            micro=micro,
            assign=r"^v_ceo|^k_estimator|^fusion_proj",
            macro=r"^macro_encoder"
            if coarse
            else [(r"^macro_encoder\.slot_embed", (0,)), (r"^macro_encoder\.blocks\.(\d+)", None)],
            cross=r"^cross_scale",
            deep=r"^deep_encoder" if coarse else [(r"^deep_encoder\.(\d+)", None)],
        )

    @torch.jit.ignore
    def set_grad_checkpointing(self, enable: bool = True) -> None:
        self.grad_checkpointing = enable
        self.micro_encoder.set_grad_checkpointing(enable)
        if self.grouping != "none":
            self.macro_encoder.grad_checkpointing = enable

    @torch.jit.ignore
    def get_classifier(self) -> nn.Module:
        return self.head.fc

    def reset_classifier(self, num_classes: int, global_pool: str | None = None) -> None:
        """A new ``head.fc`` for ``num_classes`` (0: none; the forward gives the pooled, normalised
        ``[B, head_hidden_size]``); ``global_pool`` ``avg`` (the mean of each stream) or ``""`` (no pooling: the
        forward gives the tokens of ``forward_features``)."""
        if global_pool not in (None, "avg", ""):
            raise ValueError(
                f"CET-ViT pools by the mean of each stream: global_pool must be 'avg' or '', got {global_pool!r}"
            )
        self.global_pool = global_pool if global_pool is not None else self.global_pool
        self.num_classes = num_classes
        like = dict(device=self.head.norm.weight.device, dtype=self.head.norm.weight.dtype)
        width = self.head_hidden_size
        self.head.fc = nn.Linear(width, num_classes, **like) if num_classes > 0 else nn.Identity()
        self.head.fc.train(self.training)

    def micro_tokens(self, x: torch.Tensor, taps: list[torch.Tensor] | None = None) -> torch.Tensor:
        """``[B, C, H, W] -> h_micro [B, N, C_last]``: PatchEmbed (+ position embedding) and the MicroEncoder."""
        return self.micro_encoder(self.position_embedded(self.patch_embed(x)), taps).flatten(1, 2)

    def _after_vceo(
        self, micro: torch.Tensor, S: torch.Tensor, taps: list[torch.Tensor] | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """The part after the V-CEO: ``micro [B, N, D]``, ``S`` -> (tokens ``[B, N + K, D]``, h_macro, occupied).
        ``taps`` receives the macro blocks' outputs and the fused micro stream (``forward_intermediates``)."""
        occupied = occupied_slots(S) if self.mask_empty_slots else None
        h_macro = pool_slots(S, micro, self.pool)  # [B, K, D]
        macro = self.macro_encoder(h_macro, occupied, taps)
        if self.cross_scale is not None:  # None: pruned to the macro taps (prune_intermediate_layers)
            micro, macro = self.checkpointed(self.cross_scale, micro, macro, occupied)
            if taps is not None:
                taps.append(micro)
        for block in self.deep_encoder:
            micro = self.checkpointed(block, micro)
            if taps is not None:
                taps.append(micro)
        return torch.cat([micro, macro], dim=1), h_macro, occupied

    def _encode(
        self, x: torch.Tensor, force_choice: torch.Tensor | None = None, taps: list[torch.Tensor] | None = None
    ) -> Encoded:
        """One pass; ``force_choice: [B, C]`` one-hot overrides the Dynamic-K estimator's choice; ``taps`` receives
        the outputs that ``feature_info`` lists, in its order."""
        h_micro = self.micro_tokens(x, taps)  # [B, N, C]
        if self.grouping == "none":
            return Encoded(h_micro, None, None, None, h_micro, None)
        logits = self.v_ceo.logits(h_micro)
        choice = k_logits = None
        if self.k_estimator is None:
            S = self.v_ceo.assignment(logits)
        else:
            choice, k_logits = self.k_estimator(h_micro)
            if force_choice is not None:
                choice = force_choice.to(logits.dtype)
            S = self.v_ceo.assignment(logits, choice, self.k_estimator.k_candidates)
        S = ablate_assignment(S, self.assignment_ablation, self.v_ceo.topk)
        micro = self.fusion_proj(h_micro)  # [B, N, D]
        tokens, h_macro, occupied = self._after_vceo(micro, S, taps)
        return Encoded(tokens, S, h_macro, occupied, micro, logits, choice, k_logits)

    @torch.no_grad()
    def candidate_logits(self, encoded: Encoded) -> torch.Tensor:
        """``[C, B, classes]``: every image's logits with its assignment restricted to each candidate budget.

        The part after the V-CEO runs once per candidate from the same micro tokens, without gradient and with
        dropout and stochastic depth off (their noise would swamp loss differences of a few hundredths of a nat).
        """
        if self.k_estimator is None:
            raise ValueError("candidate_logits needs a Dynamic-K estimator (dynamic_k: gumbel or exact)")
        candidates = self.k_estimator.k_candidates
        after = [self.macro_encoder, self.cross_scale, self.deep_encoder, self.head]
        modes = [m.training for part in after for m in part.modules()]
        for part in after:
            part.eval()
        try:
            B = encoded.micro.shape[0]
            out = []
            for c in range(len(candidates)):
                choice = F.one_hot(torch.full((B,), c, device=encoded.micro.device), len(candidates))
                S = self.v_ceo.assignment(encoded.assign_logits, choice.to(encoded.micro.dtype), candidates)
                tokens, _, occupied = self._after_vceo(encoded.micro, S)
                out.append(self.forward_head(tokens, occupied=occupied))
            return torch.stack(out)
        finally:
            for m, mode in zip((m for part in after for m in part.modules()), modes, strict=True):
                m.training = mode

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """``[B, C, H, W] -> [B, N + K_max, D]``: the fused micro tokens followed by the macro tokens
        (``grouping: none``: ``[B, N, C]``, the micro tokens)."""
        return self._encode(x).tokens

    def forward_head(
        self, x: torch.Tensor, pre_logits: bool = False, occupied: torch.Tensor | None = None
    ) -> torch.Tensor:
        """``[B, N + K_max, D] -> [B, num_classes]`` (or the normalised ``[B, 2D]`` with ``pre_logits``).

        ``occupied: [B, K_max]`` bool restricts mean(macro) to the occupied slots (``mask_empty_slots``).
        ``grouping: none``: ``[B, N, C] -> fc(LN(mean(micro)))``.
        """
        if self.global_pool == "":
            return x
        if self.grouping == "none":
            return self.head(x.mean(1), pre_logits=pre_logits)
        micro, macro = x[:, : -self.num_slots], x[:, -self.num_slots :]
        if occupied is None:
            macro_mean = macro.mean(1)
        else:
            weight = occupied.to(macro.dtype).unsqueeze(-1)
            macro_mean = (macro * weight).sum(1) / weight.sum(1).clamp_min(1.0)
        return self.head(torch.cat([micro.mean(1), macro_mean], dim=-1), pre_logits=pre_logits)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        encoded = self._encode(x)
        return self.forward_head(encoded.tokens, occupied=encoded.occupied)

    def forward_with_aux(
        self, x: torch.Tensor, *, compute_ei: bool = True, force_choice: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, CETViTAux]:
        """Logits ``[B, num_classes]`` and the :class:`CETViTAux` record (S, h_macro, EI terms, Dynamic-K).

        ``compute_ei=False`` skips the EI terms and their SVD (a task passes it when the EI weight is 0 or
        ``ei: none``). ``force_choice: [B, C]`` one-hot fixes each image's Dynamic-K budget.
        """
        enc = self._encode(x, force_choice)
        logits = self.forward_head(enc.tokens, occupied=enc.occupied)
        if self.grouping == "none":
            return logits, CETViTAux(S=None, h_macro=None, slot_usage_k=None, ei={}, k_cost=logits.new_zeros(()))
        want_ei = compute_ei and self.ei_variant != "none"
        aux = CETViTAux(
            S=enc.S,
            h_macro=enc.h_macro,
            slot_usage_k=slot_usage_k(enc.S.detach()),
            ei=ei_terms(enc.S, enc.h_macro, variant=self.ei_variant, degen_slots=self.ei_degen_slots, svd=self.ei_svd)
            if want_ei
            else {},
            k_cost=logits.new_zeros(()),
            occupied=enc.occupied,
            vceo_margin=(
                topk_margin(enc.assign_logits.detach(), self.v_ceo.topk) if self.v_ceo.topk < self.num_slots else None
            ),
        )
        if self.k_estimator is not None:
            k_values = self.k_estimator.k_values
            aux.k_logits = enc.k_logits
            aux.k_probs = enc.k_logits.softmax(-1)
            aux.k_expected = aux.k_probs @ k_values
            aux.k_chosen = k_values[enc.choice.argmax(-1)].long()
            if self.dynamic_k == "gumbel":
                aux.k_cost = aux.k_expected.mean() / self.num_slots
            elif self.training and torch.is_grad_enabled():
                aux.candidate_logits = self.candidate_logits(enc)
        return logits, aux


def param_breakdown(model: CETViT) -> dict[str, int]:
    """Parameter count per part of a CET-ViT (its direct children: ``patch_embed``, ``micro_encoder``, ``v_ceo``,
    ``k_estimator`` when present, ``fusion_proj``, ``macro_encoder``, ``cross_scale``, ``deep_encoder``, ``head``),
    adding up to the model's total."""
    return {name: parameter_count(part) for name, part in model.named_children()}


for _name, _kw in PRESETS.items():
    register_preset(_name, CETViT, DESCRIPTIONS[_name], **_kw)
