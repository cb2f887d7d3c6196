"""The timm feature-extraction methods of :class:`vitlab.families.cet_vit.model.CETViT`: the token streams at the
taps of ``feature_info`` (``forward_intermediates``) and the parts no tap reads dropped
(``prune_intermediate_layers``)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from vitlab.models.contract import check_output_fmt, tokens_to_maps


class FeatureTaps:
    """timm's ``forward_intermediates`` and ``prune_intermediate_layers`` for CET-ViT (its streams: the class
    docstring of ``CETViT``)."""

    def forward_intermediates(
        self,
        x: torch.Tensor,
        indices: int | Sequence[int] | None = None,
        norm: bool = False,
        stop_early: bool = False,
        output_fmt: str = "NCHW",
        intermediates_only: bool = False,
    ) -> list[torch.Tensor] | tuple[torch.Tensor, list[torch.Tensor]]:
        """Final features (``forward_features``) and the token streams at the taps ``indices`` of ``feature_info``
        (timm's: None all, an int the last ``n``, a list those): see the class docstring for the streams.

        ``output_fmt="NCHW"``: maps ``[B, C, G, G]``; ``"NLC"``: tokens (micro and fused ``[B, N, C]``, macro the
        slots ``[B, K_max, D]``). The whole pass runs whatever ``stop_early`` says (the fused stream needs the macro
        one). CET-ViT has no norm over its tokens, so ``norm=True`` is refused.
        """
        check_output_fmt(output_fmt)
        if norm:
            raise ValueError(
                "CET-ViT has no final norm over its tokens (its head normalises the pooled streams); use norm=False"
            )
        take, _ = self.take_indices(len(self.feature_info), indices)
        taps: list[torch.Tensor] = []
        grid, enc = self.patch_embed.dynamic_feat_size(x.shape[-2:]), self._encode(x, taps=taps)
        inter = []
        for i in take:
            y, stream = taps[i], self.feature_info[i]["stream"]
            y = y.flatten(1, 2) if y.ndim == 4 else y  # the micro stages' [B, G, G, C]
            if output_fmt == "NCHW":
                y = tokens_to_maps(enc.S @ y if stream == "macro" else y, grid)
            inter.append(y)
        return inter if intermediates_only else (enc.tokens, inter)

    def prune_intermediate_layers(
        self, indices: int | Sequence[int] = 1, prune_norm: bool = False, prune_head: bool = True
    ) -> list[int]:
        """Drop the DeepEncoder blocks after the last tap of ``indices``. With ``prune_head`` the model becomes a
        feature extractor (timm's ``features_only``): ``forward`` returns the tokens (``global_pool=""``), and every
        part no tap reads goes: the head, the cross-scale update of the slots (only the head reads it), and what
        follows the last tap (later micro stages; with micro taps only, the V-CEO and everything after it, which
        leaves the ``grouping: none`` model; later macro blocks, the cross-scale attention and the DeepEncoder), so
        each parameter left gets a gradient and DDP needs no ``find_unused_parameters``. ``prune_norm`` changes
        nothing (there is no final token norm). Returns the absolute indices."""
        take, last = self.take_indices(len(self.feature_info), indices)
        streams = [info["stream"] for info in self.feature_info]
        if self.grouping != "none":
            first_deep = len(self.feature_info) - len(self.deep_encoder)
            self.deep_encoder = self.deep_encoder[: max(0, last - first_deep + 1)]
            self.feature_info = self.feature_info[: first_deep + len(self.deep_encoder)]
        if prune_head:
            self.reset_classifier(0, "")
            self.head = nn.Identity()
            self._prune_before(streams, last)
            self.feature_info = self.feature_info[: last + 1]
        return take

    def _prune_before(self, streams: list[str], last: int) -> None:
        """:meth:`prune_intermediate_layers` with ``prune_head``: the parts after tap ``last`` (``streams``: the
        stream of each tap of ``feature_info``), which no tap reads."""
        micro = streams.count("micro")
        if last < micro:
            self.micro_encoder.stages = self.micro_encoder.stages[: last + 1]
            self.micro_encoder.widen = self.micro_encoder.widen[: last + 1]
            for name in ("v_ceo", "k_estimator", "fusion_proj", "macro_encoder", "cross_scale"):
                setattr(self, name, None)
            self.grouping, self.deep_encoder = "none", nn.ModuleList()
        elif streams[last] == "macro":
            self.macro_encoder.blocks = self.macro_encoder.blocks[: last - micro + 1]
            self.cross_scale, self.deep_encoder = None, nn.ModuleList()
        elif self.cross_scale is not None:
            self.cross_scale.macro_from_micro = None
