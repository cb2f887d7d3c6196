"""A toy ConvMixer (Trockman and Kolter 2022, Section 2): a patch embedding, then blocks of a residual depthwise
convolution (mixing space) and a pointwise convolution (mixing channels), each followed by GELU and BatchNorm."""

from typing import Any

import torch
from torch import nn

from vitlab.config.model import takes_options
from vitlab_toy_convmixer.config import ToyConvMixerOptions


def _conv_act_norm(conv: nn.Conv2d) -> nn.Sequential:
    return nn.Sequential(conv, nn.GELU(), nn.BatchNorm2d(conv.out_channels))


class ConvMixerBlock(nn.Module):
    def __init__(self, dim: int, kernel_size: int) -> None:
        super().__init__()
        self.depthwise = _conv_act_norm(nn.Conv2d(dim, dim, kernel_size, groups=dim, padding="same"))
        self.pointwise = _conv_act_norm(nn.Conv2d(dim, dim, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: [B, C, H, W]."""
        return self.pointwise(x + self.depthwise(x))


@takes_options(ToyConvMixerOptions)
class ToyConvMixer(nn.Module):
    def __init__(self, **options: Any) -> None:
        super().__init__()
        o = ToyConvMixerOptions(**options)
        self.num_classes = o.num_classes
        self.patch_embed = _conv_act_norm(nn.Conv2d(o.in_chans, o.dim, o.patch_size, stride=o.patch_size))
        self.blocks = nn.ModuleList(ConvMixerBlock(o.dim, o.kernel_size) for _ in range(o.depth))
        self.head = nn.Linear(o.dim, o.num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: [B, in_chans, H, W] -> logits [B, num_classes]."""
        x = self.patch_embed(x)
        for block in self.blocks:
            x = block(x)
        return self.head(x.mean(dim=(2, 3)))
