"""CET-ViT: a hierarchical ViT that routes micro tokens into macro slots by sparse top-k assignment.

Source: the CET-ViT v4 model card ("Architecture", Disclosure 1, "EI loss, as actually implemented"); where the
card is silent, the project decides (docs/cet_vit.md). The pipeline, PatchEmbed -> MicroEncoder (Swin stages at full
resolution) -> V-CEO (the top-k assignment ``S: [B, N, K_max]``) -> pooled macro slots -> MacroEncoder ->
CrossScaleAttention -> DeepEncoder -> head, is drawn in docs/cet_vit.md, "Architecture as built" (card:
"Architecture"). ``fusion_proj`` (Linear C -> D) bridges the micro width to the fusion width.

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

from typing import Any

import torch
import torch.nn.functional as F
from timm.layers import PatchEmbed, trunc_normal_
from timm.models.vision_transformer import init_weights_vit_timm
from torch import nn

from vitlab.config.model import takes_options
from vitlab.families.cet_vit.config import CETViTOptions
from vitlab.families.cet_vit.ei import ei_terms
from vitlab.families.cet_vit.features import FeatureTaps
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
from vitlab.families.cet_vit.slots import (
    ablate_assignment,
    occupied_slots,
    pool_slots,
    slot_usage_k,
    topk_margin,
)
from vitlab.layers import Block
from vitlab.models.contract import ModelContract, module_mode
from vitlab.models.sizing import parameter_count


@takes_options(CETViTOptions)
class CETViT(MicroInputSize, FeatureTaps, ModelContract, nn.Module):
    """CET-ViT classifier (CET-ViT v4 model card: "Architecture"). ``x: [B, C, H, W] -> logits [B, num_classes]``.

    timm's model contract (:mod:`vitlab.models.contract`): ``forward_features`` -> ``forward_head``;
    ``forward_features`` gives both streams in one token sequence ``[B, N + K_max, 2D]`` (:func:`stream_tokens`):
    the fused micro tokens in the first ``D`` channels, the macro tokens in the last ``D``, zeros in the other half,
    so its channels are the ``2D`` that the head pools and normalises (``grouping: none``: the micro tokens
    ``[B, N, C]``). ``embed_dim`` is the stream width ``D``; ``num_features`` and ``head_hidden_size`` are ``2D``
    (``C`` with ``grouping: none``): the width of those channels, of ``forward_head(pre_logits=True)`` and of the
    forward with ``num_classes=0``. ``forward_intermediates`` taps the three token streams, in forward
    order (``feature_info``, each entry with its ``stream``): ``micro`` (each MicroEncoder stage, ``[B, C_i, G, G]``),
    ``macro`` (each MacroEncoder block's slots ``[B, K_max, D]``; as a map, each patch's mixture of its slots ``S
    h_macro``, the rows of S summing to one) and ``fused`` (the micro stream after the CrossScaleAttention and after
    each DeepEncoder block, ``[B, D, G, G]``). ``set_grad_checkpointing`` checkpoints the Swin blocks, the macro blocks,
    the cross-scale attention and the deep blocks; ``group_matcher`` orders the parameters the same way for layer-wise
    learning-rate decay.

    Options: :class:`~vitlab.families.cet_vit.config.CETViTOptions`.

    ``assignment_ablation`` (an attribute, not a constructor option): ``none``, or ``random`` / ``uniform`` to
    replace S at test time (:func:`ablate_assignment`; :func:`vitlab.families.cet_vit.grouping.grouping_ablation`).
    """

    classifier_name = "head.fc"

    def __init__(self, **options: Any) -> None:
        super().__init__()
        o = CETViTOptions(**options)
        self.grouping, self.num_classes, self.num_slots, self.pool = o.grouping, o.num_classes, o.slots, o.pool
        self.in_chans = o.in_chans
        self.ei_variant, self.ei_degen_slots, self.ei_svd = o.ei, o.ei_degen_slots, o.ei_svd
        self.mask_empty_slots, self.dynamic_k = o.mask_empty_slots, o.dynamic_k
        self.assignment_ablation = "none"
        self.window_size, self.dynamic_img_size = o.window_size, o.dynamic_img_size
        self.global_pool = "avg"
        macro_depth, deep_depth = (0, 0) if o.grouping == "none" else (o.macro_depth, o.deep_depth)
        micro_end = sum(o.depths)
        macro_end = micro_end + macro_depth
        num_blocks = macro_end + deep_depth
        # Plain Python (not torch.linspace) so the model can be built on the meta device.
        dpr = [o.drop_path_rate * i / max(num_blocks - 1, 1) for i in range(num_blocks)]
        blocks = dict(mlp_ratio=o.mlp_ratio, qkv_bias=o.qkv_bias, proj_drop=o.drop_rate, attn_drop=o.attn_drop_rate)
        self._build_micro(o, dpr[:micro_end], blocks)
        if o.grouping == "none":
            self.k_estimator = None
            self.embed_dim = self.num_features = self.head_hidden_size = o.embed_dims[-1]
            self.head = FusionHead(o.embed_dims[-1], num_classes=o.num_classes, drop=o.drop_rate, streams=1)
        else:
            self._build_grouping(o, dpr[micro_end:macro_end], dpr[macro_end:], blocks)
        self.apply(init_weights_vit_timm)

    def _build_micro(self, o: CETViTOptions, dpr: list[float], blocks: dict[str, Any]) -> None:
        """PatchEmbed, the optional position embedding and the MicroEncoder, with their ``feature_info``."""
        self.patch_embed = PatchEmbed(
            img_size=o.img_size,
            patch_size=o.patch_size,
            in_chans=o.in_chans,
            embed_dim=o.embed_dims[0],
            norm_layer=nn.LayerNorm,
            output_fmt="NHWC",
            strict_img_size=not o.dynamic_img_size,
        )
        if o.pos_embed == "learned":
            self.pos_embed = nn.Parameter(torch.zeros(1, o.grid, o.grid, o.embed_dims[0]))
            trunc_normal_(self.pos_embed, std=0.02)
        else:
            self.pos_embed = None
        self.micro_encoder = MicroEncoder(
            grid=o.grid,
            embed_dims=o.embed_dims,
            depths=o.depths,
            num_heads=o.num_heads,
            window_size=o.window_size,
            drop_path=dpr,
            fused_attention=o.fused_window_attention,
            dynamic_mask=o.dynamic_img_size,
            **blocks,
        )
        self.feature_info = [
            dict(module=f"micro_encoder.stages.{i}", num_chs=dim, reduction=o.patch_size, stream="micro")
            for i, dim in enumerate(o.embed_dims)
        ]

    def _build_grouping(
        self, o: CETViTOptions, macro_dpr: list[float], deep_dpr: list[float], blocks: dict[str, Any]
    ) -> None:
        """The V-CEO (and the Dynamic-K estimator), MacroEncoder, CrossScaleAttention, DeepEncoder and the head."""
        micro_dim, fusion_dim, heads = o.embed_dims[-1], o.fusion_dim, o.fusion_heads
        self.embed_dim, self.num_features, self.head_hidden_size = fusion_dim, 2 * fusion_dim, 2 * fusion_dim
        fused = dict(num_chs=fusion_dim, reduction=o.patch_size)
        self.feature_info += [
            dict(module=f"macro_encoder.blocks.{i}", stream="macro", **fused) for i in range(o.macro_depth)
        ]
        self.feature_info += [dict(module="cross_scale", stream="fused", **fused)]
        self.feature_info += [dict(module=f"deep_encoder.{i}", stream="fused", **fused) for i in range(o.deep_depth)]
        self.v_ceo = VCEO(micro_dim, num_slots=o.slots, topk=o.topk, select_grad=o.select_grad)
        self.k_estimator = None
        if o.dynamic_k != "none":
            self.k_estimator = DynamicKEstimator(
                micro_dim, k_candidates=o.k_candidates, hidden_dim=o.k_hidden_dim, tau=o.k_tau, mode=o.dynamic_k
            )
        self.fusion_proj = nn.Linear(micro_dim, fusion_dim) if micro_dim != fusion_dim else nn.Identity()
        self.macro_encoder = MacroEncoder(
            fusion_dim, num_slots=o.slots, depth=o.macro_depth, num_heads=heads, drop_path=macro_dpr, **blocks
        )
        self.cross_scale = CrossScaleAttention(
            fusion_dim, num_heads=heads, qkv_bias=o.qkv_bias, attn_drop=o.attn_drop_rate, proj_drop=o.drop_rate
        )
        self.deep_encoder = nn.ModuleList(
            Block(fusion_dim, num_heads=heads, drop_path=deep_dpr[i], **blocks) for i in range(o.deep_depth)
        )
        self.head = FusionHead(fusion_dim, num_classes=o.num_classes, drop=o.drop_rate)

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

    def attention_blocks(self) -> list[tuple[str, nn.Module]]:
        """The Swin blocks of each micro stage, the macro encoder's blocks, the deep encoder's (``AttentionBlocks``:
        what ``trainer.compile`` compiles); the cross-scale attention runs inside the network's graph."""
        micro = [
            (f"micro_encoder.stages.{i}.blocks.{j}", block)
            for i, stage in enumerate(self.micro_encoder.stages)
            for j, block in enumerate(stage.blocks)
        ]
        macro = [(f"macro_encoder.blocks.{i}", block) for i, block in enumerate(self.macro_encoder.blocks)]
        return micro + macro + [(f"deep_encoder.{i}", block) for i, block in enumerate(self.deep_encoder)]

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
        """The part after the V-CEO: ``micro [B, N, D]``, ``S`` -> (tokens ``[B, N + K, 2D]``, h_macro, occupied).
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
        return stream_tokens(micro, macro), h_macro, occupied

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
        with module_mode(nn.ModuleList(after), training=False):
            B = encoded.micro.shape[0]
            out = []
            for c in range(len(candidates)):
                choice = F.one_hot(torch.full((B,), c, device=encoded.micro.device), len(candidates))
                S = self.v_ceo.assignment(encoded.assign_logits, choice.to(encoded.micro.dtype), candidates)
                tokens, _, occupied = self._after_vceo(encoded.micro, S)
                out.append(self.forward_head(tokens, occupied=occupied))
            return torch.stack(out)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """``[B, C, H, W] -> [B, N + K_max, 2D]``: the fused micro tokens and the macro tokens, each in its stream's
        half of the channels (:func:`stream_tokens`; ``grouping: none``: the micro tokens ``[B, N, C]``)."""
        return self._encode(x).tokens

    def forward_head(
        self, x: torch.Tensor, pre_logits: bool = False, occupied: torch.Tensor | None = None
    ) -> torch.Tensor:
        """``[B, N + K_max, 2D] -> [B, num_classes]``: LN(mean(micro) ++ mean(macro)) and the classifier (or the
        normalised ``[B, 2D]`` with ``pre_logits``; with ``global_pool=""`` the tokens themselves).

        ``occupied: [B, K_max]`` bool restricts mean(macro) to the occupied slots (``mask_empty_slots``).
        ``grouping: none``: ``[B, N, C] -> fc(LN(mean(micro)))``.
        """
        if self.global_pool == "":
            return x
        if self.grouping == "none":
            return self.head(x.mean(1), pre_logits=pre_logits)
        D, K = self.embed_dim, self.num_slots
        micro, macro = x[:, :-K, :D], x[:, -K:, D:]
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


def stream_tokens(micro: torch.Tensor, macro: torch.Tensor) -> torch.Tensor:
    """The two streams in one token sequence: ``micro [B, N, D]``, ``macro [B, K, D] -> [B, N + K, 2D]``, each
    token in its stream's half of the channels (micro the first ``D``, macro the last) and zeros in the other.

    The channels are those of the head's pooled vector (CET-ViT v4 model card, "Architecture": LN over the
    concatenated stream means), so timm's width checks read ``num_features`` from them, and one tensor is what
    timm's ``forward_intermediates`` and feature wrappers compare and pass on."""
    return torch.cat([F.pad(micro, (0, macro.shape[-1])), F.pad(macro, (micro.shape[-1], 0))], dim=1)


def param_breakdown(model: CETViT) -> dict[str, int]:
    """Parameter count per part of a CET-ViT (its direct children: ``patch_embed``, ``micro_encoder``, ``v_ceo``,
    ``k_estimator`` when present, ``fusion_proj``, ``macro_encoder``, ``cross_scale``, ``deep_encoder``, ``head``),
    adding up to the model's total."""
    return {name: parameter_count(part) for name, part in model.named_children()}
