"""A toy MLP-Mixer: patches -> blocks of token mixing and channel mixing -> mean over tokens -> classes."""

from typing import Any

import torch
from torch import nn

from vitlab.config.model import takes_options
from vitlab_toy_mixer.config import ToyMixerOptions


class MixerBlock(nn.Module):
    def __init__(self, num_tokens: int, dim: int) -> None:
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.token_mlp = nn.Sequential(nn.Linear(num_tokens, num_tokens), nn.GELU())
        self.channel_mlp = nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(), nn.Linear(2 * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: [B, N, C]."""
        x = x + self.token_mlp(self.norm1(x).transpose(1, 2)).transpose(1, 2)
        return x + self.channel_mlp(self.norm2(x))


@takes_options(ToyMixerOptions)
class ToyMixer(nn.Module):
    def __init__(self, **options: Any) -> None:
        super().__init__()
        o = ToyMixerOptions(**options)
        self.num_classes = o.num_classes
        self.patch_embed = nn.Conv2d(o.in_chans, o.dim, o.patch_size, stride=o.patch_size)
        self.blocks = nn.ModuleList(MixerBlock(o.grid * o.grid, o.dim) for _ in range(o.depth))
        self.norm = nn.LayerNorm(o.dim)
        self.head = nn.Linear(o.dim, o.num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: [B, in_chans, H, W] -> logits [B, num_classes]."""
        tokens = self.patch_embed(x).flatten(2).transpose(1, 2)
        for block in self.blocks:
            tokens = block(tokens)
        return self.head(self.norm(tokens).mean(dim=1))
