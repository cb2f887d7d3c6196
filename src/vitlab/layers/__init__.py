"""Shared building blocks. Every model of vitlab is made from these."""

from timm.layers import DropPath, Mlp, PatchEmbed, trunc_normal_

from vitlab.layers.attention import Attention
from vitlab.layers.block import Block
from vitlab.layers.capture import attention_capture, attention_modules
from vitlab.layers.cross_attention import CrossAttention

__all__ = [
    "Attention",
    "Block",
    "CrossAttention",
    "DropPath",
    "Mlp",
    "PatchEmbed",
    "attention_capture",
    "attention_modules",
    "trunc_normal_",
]
