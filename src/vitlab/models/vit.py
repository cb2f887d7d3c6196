"""The plain Vision Transformer classifier (Dosovitskiy et al. 2021), made from vitlab's shared layers.

Weights are key-compatible with timm's ``VisionTransformer`` of the same shape (see ``tests/test_vit.py``).
``tome_r > 0`` turns it into a Token Merging ViT (Bolya et al. 2023): every block merges ``r`` tokens
(:meth:`vitlab.layers.block.Block.forward_merging`); the weights and their keys do not change.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import torch
from timm.layers import PatchEmbed, resample_abs_pos_embed, trunc_normal_
from timm.models.vision_transformer import init_weights_vit_timm
from torch import nn

from vitlab.config.model import VisionTransformerOptions, takes_options
from vitlab.layers import Block
from vitlab.layers.tome import TokenMatching
from vitlab.models.contract import ModelContract, check_output_fmt, tokens_to_maps

#: pooling of the head: the CLS token, the mean of the patch tokens, or none (``reset_classifier(0, "")``)
GLOBAL_POOLS = ("token", "avg", "")


@takes_options(VisionTransformerOptions)
class VisionTransformer(ModelContract, nn.Module):
    """ViT classifier. ``x: [B, C, H, W] -> logits [B, num_classes]``.

    Model contract (timm's, :mod:`vitlab.models.contract`): ``forward_features`` -> ``forward_head``;
    ``forward_intermediates`` (feature maps ``[B, D, H/P, W/P]`` or tokens) and ``prune_intermediate_layers``;
    ``get_classifier`` / ``reset_classifier``; ``set_grad_checkpointing``; ``group_matcher``; ``no_weight_decay``;
    ``pretrained_cfg``; ``feature_info`` (one entry per block).

    ``tome_r``: tokens merged per block by Token Merging (ToMe, Bolya et al. 2023, sec. 3), in training and
    inference; 0 (default) is the plain ViT. Each block then returns ``N - r`` tokens (fewer once the tokens run
    low, see :func:`vitlab.layers.tome.bipartite_soft_matching`), the CLS token is never merged, and attention is
    proportional to the token sizes. ToMe needs ``global_pool="token"``.

    ``dynamic_img_size`` (timm's ViT): any input size that tiles into patches, the position embedding resampled to
    its grid on each forward (``timm.layers.resample_abs_pos_embed``, bicubic); :meth:`set_input_size` resamples
    it once, for a new fixed size. At the size the model was built for, both leave the logits unchanged.
    """

    def __init__(self, **options: Any) -> None:
        super().__init__()
        o = VisionTransformerOptions(**options)
        self.dynamic_img_size = o.dynamic_img_size
        self.num_classes, self.in_chans = o.num_classes, o.in_chans
        self.global_pool = o.global_pool
        self.embed_dim = self.num_features = self.head_hidden_size = o.embed_dim
        self.tome_r = o.tome_r
        self.patch_embed = PatchEmbed(
            img_size=o.img_size,
            patch_size=o.patch_size,
            in_chans=o.in_chans,
            embed_dim=o.embed_dim,
            strict_img_size=not o.dynamic_img_size,
            output_fmt="NHWC" if o.dynamic_img_size else None,  # NHWC: the grid for the position embedding
        )
        self.num_prefix_tokens = 1
        self.cls_token = nn.Parameter(torch.zeros(1, 1, o.embed_dim))
        self.pos_embed = nn.Parameter(torch.zeros(1, o.grid * o.grid + 1, o.embed_dim))
        self.pos_drop = nn.Dropout(o.drop_rate)
        # Plain Python (not torch.linspace) so the model can be built on the meta device.
        dpr = [o.drop_path_rate * i / max(o.depth - 1, 1) for i in range(o.depth)]
        block = dict(mlp_ratio=o.mlp_ratio, qkv_bias=o.qkv_bias, proj_drop=o.drop_rate, attn_drop=o.attn_drop_rate)
        temperature = dict(temperature=o.temperature, temperature_form=o.temperature_form)
        self.blocks = nn.ModuleList(
            Block(o.embed_dim, num_heads=o.num_heads, drop_path=dpr[i], **block, **temperature) for i in range(o.depth)
        )
        self.feature_info = [
            dict(module=f"blocks.{i}", num_chs=o.embed_dim, reduction=o.patch_size) for i in range(o.depth)
        ]
        self.norm = nn.LayerNorm(o.embed_dim, eps=1e-6)
        self.head_drop = nn.Dropout(o.drop_rate)
        self.head = nn.Linear(o.embed_dim, o.num_classes) if o.num_classes > 0 else nn.Identity()
        trunc_normal_(self.pos_embed, std=0.02)
        nn.init.normal_(self.cls_token, std=1e-6)
        self.apply(functools.partial(init_weights_vit_timm, needs_reset=False))  # timm's ViT init: Linear layers

    @torch.jit.ignore
    def no_weight_decay(self) -> set[str]:
        names = {"pos_embed", "cls_token"}
        names |= {n for n, _ in self.named_parameters() if n.endswith("log_tau")}
        return names

    @torch.jit.ignore
    def group_matcher(self, coarse: bool = False) -> dict[str, object]:
        """timm's layer groups (``timm.models.group_parameters``): the embeddings, each block, then the final norm
        with the head, which no pattern names (one group, the last; BEiT's layer decay, Bao et al. 2022, sec. 2.6,
        trains both at the full rate)."""
        return dict(stem=r"^cls_token|^pos_embed|^patch_embed", blocks=[(r"^blocks\.(\d+)", None)])

    @torch.jit.ignore
    def get_classifier(self) -> nn.Module:
        return self.head

    def reset_classifier(self, num_classes: int, global_pool: str | None = None) -> None:
        """A new head for ``num_classes`` (0: none, the forward gives the pooled ``[B, D]``); ``global_pool``
        ``token``, ``avg`` or ``""`` (no pooling: the forward gives the tokens ``[B, 1 + N, D]``)."""
        if global_pool is not None:
            if global_pool not in GLOBAL_POOLS or (self.tome_r > 0 and global_pool == "avg"):
                raise ValueError(
                    f"global_pool must be one of token, avg or '' (avg not with Token Merging), got {global_pool!r}"
                )
            self.global_pool = global_pool
        self.num_classes = num_classes
        like = dict(device=self.cls_token.device, dtype=self.cls_token.dtype)
        self.head = nn.Linear(self.embed_dim, num_classes, **like) if num_classes > 0 else nn.Identity()
        self.head.train(self.training)

    @property
    def grid_size(self) -> tuple[int, int]:
        """The patch grid of the input size the model is set for (``set_input_size``)."""
        return tuple(self.patch_embed.grid_size)

    def set_input_size(self, img_size: int | tuple[int, int] | None = None, patch_size: int | None = None) -> None:
        """A new fixed input size (timm's ``VisionTransformer.set_input_size``): the patch embedding's, and the
        position embedding resampled to the new grid (``resample_abs_pos_embed``; the CLS position is kept)."""
        old_grid = self.grid_size
        self.patch_embed.set_input_size(img_size=img_size, patch_size=patch_size)
        if self.grid_size != old_grid:
            grad = self.pos_embed.requires_grad  # a frozen embedding stays frozen (timm's test_models)
            self.pos_embed = nn.Parameter(self._pos_embed_for(self.grid_size, old_grid), grad)
        self.feature_info = [{**info, "reduction": self.patch_embed.feat_ratio()} for info in self.feature_info]

    def _pos_embed_for(self, grid: Sequence[int], old_grid: Sequence[int] | None = None) -> torch.Tensor:
        """The position embedding ``[1, 1 + H*W, D]`` for a ``grid`` of patches (as it is at the model's own)."""
        old_grid = old_grid or self.grid_size
        return resample_abs_pos_embed(self.pos_embed, new_size=grid, old_size=old_grid, num_prefix_tokens=1)

    def embed(self, x: torch.Tensor) -> torch.Tensor:
        """``[B, C, H, W] -> [B, 1 + N, D]``: patches, CLS token and position embedding."""
        x = self.patch_embed(x)
        pos_embed = self.pos_embed
        if self.dynamic_img_size:  # [B, H', W', D]: the position embedding resampled to this grid
            pos_embed = self._pos_embed_for(x.shape[1:3])
            x = x.flatten(1, 2)
        x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1)
        return self.pos_drop(x + pos_embed)

    def _initial_sizes(self, x: torch.Tensor) -> torch.Tensor | None:
        """Token sizes ``[B, 1 + N, 1]`` (all one) for ToMe's size tracking, or None without ToMe."""
        return x.new_ones(x.shape[0], x.shape[1], 1) if self.tome_r > 0 else None

    def _run_block(
        self, block: Block, x: torch.Tensor, size: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor | None, TokenMatching | None]:
        """One block (checkpointed with ``set_grad_checkpointing``); with ToMe (``size`` given) it also merges
        ``tome_r`` tokens, updates their sizes and returns the matching."""
        if size is None:
            return self.checkpointed(block, x), None, None
        return self.checkpointed(functools.partial(block.forward_merging, return_matching=True), x, size, self.tome_r)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """``[B, C, H, W] -> [B, 1 + N, D]`` after the final LayerNorm (fewer tokens with ToMe)."""
        x = self.embed(x)
        size = self._initial_sizes(x)
        for block in self.blocks:
            x, size, _ = self._run_block(block, x, size)
        return self.norm(x)

    def forward_intermediates(
        self,
        x: torch.Tensor,
        indices: int | Sequence[int] | None = None,
        norm: bool = False,
        stop_early: bool = False,
        output_fmt: str = "NCHW",
        intermediates_only: bool = False,
        return_prefix_tokens: bool = False,
    ) -> list[torch.Tensor] | tuple[torch.Tensor, list[torch.Tensor]]:
        """Final features ``[B, 1 + N, D]`` and the outputs of the blocks in ``indices`` (timm's: None all, an int
        the last ``n``, a list those), after the final norm with ``norm``.

        ``output_fmt="NCHW"``: feature maps ``[B, D, H/P, W/P]`` of the patch tokens; with ToMe every patch takes
        the value of the token it was merged into (:meth:`vitlab.layers.tome.TokenMatching.unmerge`, the paper's
        way back to the grid). ``"NLC"``: the patch tokens ``[B, N', D]`` left after that block. The CLS token is
        left out of both; ``return_prefix_tokens`` pairs each with it, ``[B, 1, D]``. ``stop_early`` skips the
        blocks after the last one taken (the final features are then those of that block).
        """
        check_output_fmt(output_fmt)
        take, last = self.take_indices(len(self.blocks), indices)
        inter = []
        grid = self.patch_embed.dynamic_feat_size(x.shape[-2:])
        x = self.embed(x)
        size = self._initial_sizes(x)
        # where each CLS-and-patch position's token is now, for ToMe's feature maps: [B, 1 + N]
        source = torch.arange(x.shape[1], device=x.device).expand(x.shape[0], -1) if size is not None else None
        for i, block in enumerate(self.blocks[: last + 1] if stop_early else self.blocks):
            x, size, matching = self._run_block(block, x, size)
            if matching is not None and output_fmt == "NCHW":
                now = torch.arange(x.shape[1], device=x.device, dtype=torch.float32).expand(x.shape[0], -1)
                source = matching.unmerge(now.unsqueeze(-1)).squeeze(-1).long().gather(1, source)
            if i in take:
                y = self.norm(x) if norm else x
                prefix, y = y[:, : self.num_prefix_tokens], y[:, self.num_prefix_tokens :]
                if output_fmt == "NCHW":
                    if source is not None:
                        y = torch.cat([prefix, y], 1).gather(1, source[:, 1:, None].expand(-1, -1, y.shape[-1]))
                    y = tokens_to_maps(y, grid)
                inter.append((y, prefix) if return_prefix_tokens else y)
        if intermediates_only:
            return inter
        return self.norm(x), inter

    def prune_intermediate_layers(
        self, indices: int | Sequence[int] = 1, prune_norm: bool = False, prune_head: bool = True
    ) -> list[int]:
        """Drop the blocks after the last of ``indices`` (and the final norm, the head); returns the indices."""
        take, last = self.take_indices(len(self.blocks), indices)
        self.blocks = self.blocks[: last + 1]
        self.feature_info = self.feature_info[: last + 1]
        if prune_norm:
            self.norm = nn.Identity()
        if prune_head:
            self.reset_classifier(0, "")
        return take

    def forward_head(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        """``[B, 1 + N, D] -> [B, num_classes]`` (or the pooled ``[B, D]`` with ``pre_logits``; the tokens
        unchanged with ``global_pool=""``)."""
        if self.global_pool == "token":
            x = x[:, 0]
        elif self.global_pool == "avg":
            x = x[:, self.num_prefix_tokens :].mean(1)
        x = self.head_drop(x)
        return x if pre_logits else self.head(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_head(self.forward_features(x))
