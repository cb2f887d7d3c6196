"""The plain Vision Transformer classifier (Dosovitskiy et al. 2021), made from vitlab's shared layers.

Weights are key-compatible with timm's ``VisionTransformer`` of the same shape (see ``tests/test_vit.py``).
``tome_r > 0`` turns it into a Token Merging ViT (Bolya et al. 2023): every block merges ``r`` tokens
(:meth:`vitlab.layers.block.Block.forward_merging`); the weights and their keys do not change.
"""

from __future__ import annotations

import functools

import torch
from timm.models.vision_transformer import init_weights_vit_timm
from torch import nn

from vitlab.errors import ConfigError
from vitlab.layers import Block, PatchEmbed, trunc_normal_
from vitlab.layers.attention import TemperatureForm
from vitlab.models.registry import register_preset


def check_patch_grid(img_size: int, patch_size: int) -> int:
    """Number of patches per side; a clear error when the image does not tile into patches."""
    if img_size % patch_size != 0:
        raise ConfigError(
            f"image size {img_size} is not divisible by the patch size {patch_size}; set model.patch_size to a "
            f"divisor of {img_size} (e.g. {', '.join(str(p) for p in range(1, img_size + 1) if img_size % p == 0)}) "
            "or resize the data with data.img_size"
        )
    return img_size // patch_size


class VisionTransformer(nn.Module):
    """ViT classifier. ``x: [B, C, H, W] -> logits [B, num_classes]``.

    Model contract (timm's): ``forward_features`` -> ``forward_head``; ``forward_intermediates``;
    ``no_weight_decay``.

    ``tome_r``: tokens merged per block by Token Merging (ToMe, Bolya et al. 2023, sec. 3), in training and
    inference; 0 (default) is the plain ViT. Each block then returns ``N - r`` tokens (fewer once the tokens run
    low, see :func:`vitlab.layers.tome.bipartite_soft_matching`), the CLS token is never merged, and attention is
    proportional to the token sizes. ToMe needs ``global_pool="token"``.
    """

    def __init__(
        self,
        *,
        img_size: int = 32,
        patch_size: int = 4,
        in_chans: int = 3,
        num_classes: int = 10,
        embed_dim: int = 192,
        depth: int = 12,
        num_heads: int = 3,
        mlp_ratio: float = 4.0,
        qkv_bias: bool = True,
        drop_rate: float = 0.0,
        attn_drop_rate: float = 0.0,
        drop_path_rate: float = 0.0,
        global_pool: str = "token",
        temperature: bool = False,
        temperature_form: TemperatureForm = "inverse",
        tome_r: int = 0,
    ) -> None:
        super().__init__()
        if global_pool not in ("token", "avg"):
            raise ValueError(f"global_pool must be 'token' or 'avg', got {global_pool!r}")
        if tome_r < 0:
            raise ValueError(f"tome_r (tokens merged per block) must be >= 0, got {tome_r}")
        if tome_r > 0 and global_pool != "token":
            raise ValueError(
                "Token Merging (tome_r > 0) needs global_pool='token': merged tokens stand for different numbers of "
                "patches, so a plain mean over them is not the image mean; set global_pool='token' or tome_r=0"
            )
        grid = check_patch_grid(img_size, patch_size)
        self.num_classes = num_classes
        self.global_pool = global_pool
        self.embed_dim = embed_dim
        self.tome_r = tome_r
        self.patch_embed = PatchEmbed(img_size=img_size, patch_size=patch_size, in_chans=in_chans, embed_dim=embed_dim)
        self.grid_size = (grid, grid)
        self.num_prefix_tokens = 1
        self.cls_token = nn.Parameter(torch.zeros(1, 1, embed_dim))
        self.pos_embed = nn.Parameter(torch.zeros(1, grid * grid + 1, embed_dim))
        self.pos_drop = nn.Dropout(drop_rate)
        # Plain Python (not torch.linspace) so the model can be built on the meta device.
        dpr = [drop_path_rate * i / max(depth - 1, 1) for i in range(depth)]
        self.blocks = nn.ModuleList(
            Block(
                embed_dim,
                num_heads=num_heads,
                mlp_ratio=mlp_ratio,
                qkv_bias=qkv_bias,
                proj_drop=drop_rate,
                attn_drop=attn_drop_rate,
                drop_path=dpr[i],
                temperature=temperature,
                temperature_form=temperature_form,
            )
            for i in range(depth)
        )
        self.norm = nn.LayerNorm(embed_dim, eps=1e-6)
        self.head_drop = nn.Dropout(drop_rate)
        self.head = nn.Linear(embed_dim, num_classes) if num_classes > 0 else nn.Identity()
        trunc_normal_(self.pos_embed, std=0.02)
        nn.init.normal_(self.cls_token, std=1e-6)
        self.apply(functools.partial(init_weights_vit_timm, needs_reset=False))  # timm's ViT init: Linear layers

    @torch.jit.ignore
    def no_weight_decay(self) -> set[str]:
        names = {"pos_embed", "cls_token"}
        names |= {n for n, _ in self.named_parameters() if n.endswith("log_tau")}
        return names

    def embed(self, x: torch.Tensor) -> torch.Tensor:
        """``[B, C, H, W] -> [B, 1 + N, D]``: patches, CLS token and position embedding."""
        x = self.patch_embed(x)
        x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1)
        return self.pos_drop(x + self.pos_embed)

    def _initial_sizes(self, x: torch.Tensor) -> torch.Tensor | None:
        """Token sizes ``[B, 1 + N, 1]`` (all one) for ToMe's size tracking, or None without ToMe."""
        return x.new_ones(x.shape[0], x.shape[1], 1) if self.tome_r > 0 else None

    def _run_block(
        self, block: Block, x: torch.Tensor, size: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """One block; with ToMe (``size`` given) it also merges ``tome_r`` tokens and updates their sizes."""
        if size is None:
            return block(x), None
        return block.forward_merging(x, size, self.tome_r)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """``[B, C, H, W] -> [B, 1 + N, D]`` after the final LayerNorm (fewer tokens with ToMe)."""
        x = self.embed(x)
        size = self._initial_sizes(x)
        for block in self.blocks:
            x, size = self._run_block(block, x, size)
        return self.norm(x)

    def forward_intermediates(
        self, x: torch.Tensor, indices: list[int] | None = None, norm: bool = False
    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """Final features and the outputs ``[B, 1 + N, D]`` of the blocks in ``indices`` (default: all; with ToMe
        each has the tokens left after that block)."""
        take = set(range(len(self.blocks))) if indices is None else {i % len(self.blocks) for i in indices}
        inter = []
        x = self.embed(x)
        size = self._initial_sizes(x)
        for i, block in enumerate(self.blocks):
            x, size = self._run_block(block, x, size)
            if i in take:
                inter.append(self.norm(x) if norm else x)
        return self.norm(x), inter

    def forward_head(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        """``[B, 1 + N, D] -> [B, num_classes]`` (or the pooled ``[B, D]`` with ``pre_logits``)."""
        x = x[:, 0] if self.global_pool == "token" else x[:, self.num_prefix_tokens :].mean(1)
        x = self.head_drop(x)
        return x if pre_logits else self.head(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_head(self.forward_features(x))


_VIT_SIZES = {
    "vit_pico": dict(embed_dim=64, depth=4, num_heads=4, mlp_ratio=2.0),
    "vit_nano": dict(embed_dim=128, depth=6, num_heads=4, mlp_ratio=2.0),
    "vit_micro": dict(embed_dim=192, depth=6, num_heads=3),
    "vit_tiny": dict(embed_dim=192, depth=12, num_heads=3),
    "vit_small": dict(embed_dim=384, depth=12, num_heads=6),
    "vit_base": dict(embed_dim=768, depth=12, num_heads=12),
}
for _name, _kw in _VIT_SIZES.items():
    register_preset(_name, VisionTransformer, f"ViT classifier, width {_kw['embed_dim']}, depth {_kw['depth']}", **_kw)
# Token Merging with r = 8 per block, the ToMe baseline of the CET-ViT v4 model card ("External baselines"), on the
# ViTs that train on a CPU; the same weights as the plain preset of the same size.
for _size in ("pico", "nano", "tiny"):
    register_preset(
        f"tome_{_size}",
        VisionTransformer,
        f"vit_{_size} with Token Merging, r = 8 per block",
        tome_r=8,
        **_VIT_SIZES[f"vit_{_size}"],
    )
