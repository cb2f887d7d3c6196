"""Shared building blocks. Every model of vitlab is made from these and timm's layers (``timm.layers``)."""

from vitlab.layers.attention import Attention
from vitlab.layers.block import Block
from vitlab.layers.capture import attention_capture, attention_modules
from vitlab.layers.cross_attention import CrossAttention

__all__ = ["Attention", "Block", "CrossAttention", "attention_capture", "attention_modules"]
