"""Cross-attention: queries from one token set, keys and values from another (SDPA on the hot path).

Used by ViTCAE's decoder (patch tokens attend to the conditioning tokens made from ``z_cls``) and CET-ViT's
CrossScaleAttention (micro tokens attend to macro tokens and back, with pre-norm and a residual around it).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class CrossAttention(nn.Module):
    """Multi-head cross-attention: queries ``x: [B, N, C]`` attend to ``context: [B, M, C]`` -> ``[B, N, C]``.

    In ViTCAE's decoder (Jebraeeli, Krim, Cansever, "ViTCAE", arXiv 2509.16554) the patch tokens are the queries and
    the ``M`` tokens made from ``z_cls`` the keys and values. With ``M = 1`` every softmax row is ``[1]`` and the
    output is the projected value of the single context token, broadcast over the queries.
    """

    def __init__(
        self,
        dim: int,
        *,
        num_heads: int = 8,
        qkv_bias: bool = True,
        attn_drop: float = 0.0,
        proj_drop: float = 0.0,
    ) -> None:
        super().__init__()
        if dim % num_heads != 0:
            raise ValueError(f"width {dim} is not divisible by num_heads={num_heads}; choose a head count dividing it")
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.q = nn.Linear(dim, dim, bias=qkv_bias)
        self.kv = nn.Linear(dim, 2 * dim, bias=qkv_bias)
        self.attn_drop = attn_drop
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(proj_drop)

    def forward(self, x: torch.Tensor, context: torch.Tensor, key_mask: torch.Tensor | None = None) -> torch.Tensor:
        """``key_mask: [B, M]`` bool, True = the context token may be attended to (at least one per row), or None."""
        B, N, C = x.shape
        M = context.shape[1]
        q = self.q(x).view(B, N, self.num_heads, self.head_dim).transpose(1, 2)  # [B, H, N, d]
        k, v = self.kv(context).view(B, M, 2, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4).unbind(0)
        drop = self.attn_drop if self.training else 0.0
        mask = None if key_mask is None else key_mask[:, None, None, :]
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=drop)
        return self.proj_drop(self.proj(out.transpose(1, 2).reshape(B, N, C)))
