"""Pre-norm transformer block built on the shared :class:`~vitlab.layers.attention.Attention`."""

from __future__ import annotations

import torch
from timm.layers import DropPath, Mlp
from torch import nn

from vitlab.layers.attention import Attention, TemperatureForm
from vitlab.layers.tome import bipartite_soft_matching, merge_wavg

# ToMe's matching has data-dependent sizes: torch.fx (timm's fx feature extraction) keeps these two calls whole
torch.fx.wrap("bipartite_soft_matching")
torch.fx.wrap("merge_wavg")


class Block(nn.Module):
    """``x + DropPath(Attn(LN(x)))`` then ``x + DropPath(MLP(LN(x)))``. ``x: [B, N, C]``.

    State-dict keys match timm's ``VisionTransformer`` blocks (``norm1``, ``attn.qkv``, ``attn.proj``, ``norm2``,
    ``mlp.fc1``, ``mlp.fc2``) so weights move between the two without renaming. :meth:`forward_merging` is the same
    block with Token Merging between the attention and the MLP.
    """

    def __init__(
        self,
        dim: int,
        *,
        num_heads: int,
        mlp_ratio: float = 4.0,
        qkv_bias: bool = True,
        proj_drop: float = 0.0,
        attn_drop: float = 0.0,
        drop_path: float = 0.0,
        temperature: bool = False,
        temperature_form: TemperatureForm = "inverse",
    ) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=1e-6)
        self.attn = Attention(
            dim,
            num_heads=num_heads,
            qkv_bias=qkv_bias,
            attn_drop=attn_drop,
            proj_drop=proj_drop,
            temperature=temperature,
            temperature_form=temperature_form,
        )
        self.drop_path1 = DropPath(drop_path) if drop_path > 0 else nn.Identity()
        self.norm2 = nn.LayerNorm(dim, eps=1e-6)
        self.mlp = Mlp(in_features=dim, hidden_features=int(dim * mlp_ratio), act_layer=nn.GELU, drop=proj_drop)
        self.drop_path2 = DropPath(drop_path) if drop_path > 0 else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.drop_path1(self.attn(self.norm1(x)))
        return x + self.drop_path2(self.mlp(self.norm2(x)))

    def forward_merging(
        self, x: torch.Tensor, size: torch.Tensor, r: int, class_token: bool = True, return_matching: bool = False
    ) -> tuple[torch.Tensor, ...]:
        """The block with Token Merging (ToMe, Bolya et al. 2023, sec. 3). ``x: [B, N, C]``, ``size: [B, N, 1]``.

        Proportional attention (``log size`` added to the logits) returns the head-averaged keys; the ``r`` most
        similar token pairs by those keys merge (:func:`~vitlab.layers.tome.bipartite_soft_matching`, size-weighted
        by :func:`~vitlab.layers.tome.merge_wavg`); then the MLP runs on the ``N - r`` tokens left.
        Returns ``(x [B, N - r, C], size [B, N - r, 1])``, and the :class:`~vitlab.layers.tome.TokenMatching` with
        ``return_matching``.
        """
        attended, keys = self.attn(self.norm1(x), size=size, return_keys=True)
        x = x + self.drop_path1(attended)
        matching = bipartite_soft_matching(keys, r, class_token=class_token)
        x, size = merge_wavg(matching, x, size)
        x = x + self.drop_path2(self.mlp(self.norm2(x)))
        return (x, size, matching) if return_matching else (x, size)
