"""Swin Transformer (Liu et al. 2021) for small inputs: timm's ``SwinTransformer`` behind vitlab's model contract.

The CET-ViT v4 model card compares against a size-matched Swin "under an identical protocol" ("External
baselines"). On 32x32
images Swin needs small patches and windows: patch 2 gives the same 16x16 grid of 256 tokens that CET-ViT's
micro encoder sees, and a window of 4 splits it into 16 windows; each later stage halves the grid by patch
merging (16 -> 8 -> 4 -> 2 with four stages). A window larger than a stage's grid shrinks to the grid (then no shift).

The class is timm's model, so the contract (``forward_features`` -> ``forward_head``, ``forward_intermediates``,
``reset_classifier``, ``set_grad_checkpointing``, ``group_matcher``, ``feature_info``, ``no_weight_decay``) and the
state-dict keys are timm's; :class:`~vitlab.models.contract.ModelContract` adds the ``pretrained_cfg`` that timm's
builder would attach. Only the constructor is vitlab's: keyword-only, with the options a baseline needs, so presets
register, train, export and load like every other model.
Each window attention runs SDPA or its eager softmax, whichever
:func:`vitlab.layers.attention_path.choose_window_attention_path` measures faster for the call.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from timm.models.swin_transformer import SwinTransformer as TimmSwinTransformer
from timm.models.swin_transformer import WindowAttention

from vitlab.layers.attention_path import choose_window_attention_path
from vitlab.models.contract import ModelContract
from vitlab.models.registry import register_preset
from vitlab.models.vit import check_patch_grid


class SwinTransformer(TimmSwinTransformer, ModelContract):
    """Swin classifier. ``x: [B, C, H, W] -> logits [B, num_classes]``; features are NHWC ``[B, H', W', C']``.

    Args:
        img_size, patch_size, in_chans, num_classes: input and output.
        embed_dim: width of the first stage; stage ``i`` has width ``embed_dim * 2**i``.
        depths, num_heads: Swin blocks and attention heads per stage.
        window_size: attention window (tokens per side).
        mlp_ratio, qkv_bias: block options.
        drop_rate: dropout after the attention and MLP projections and before the head (as in vitlab's ViT).
        attn_drop_rate: dropout on the attention probabilities.
        drop_path_rate: stochastic depth, rising linearly over all blocks.
        global_pool: ``avg`` (timm's default) or ``""`` (``forward`` gives the NHWC features), as timm's Swin.
        dynamic_img_size: accept any input size whose grid the patch merging halves, the attention masks built for
            it on each forward (timm's Swin); ``set_input_size`` changes the fixed size and the windows instead.
    """

    classifier_name = "head.fc"

    def pool_size(self) -> tuple[int, int]:
        """The last stage's grid, ``forward_features``' ``[B, H', W', C']`` (timm's Swin cfg ``pool_size``)."""
        return tuple(self.layers[-1].output_resolution)

    @torch.jit.ignore
    def set_grad_checkpointing(self, enable: bool = True) -> None:
        """timm's switch on every stage, and ``grad_checkpointing`` on the model, as on every vitlab model."""
        super().set_grad_checkpointing(enable)
        self.grad_checkpointing = enable

    def __init__(
        self,
        *,
        img_size: int = 32,
        patch_size: int = 2,
        in_chans: int = 3,
        num_classes: int = 10,
        embed_dim: int = 96,
        depths: Sequence[int] = (2, 2, 6, 2),
        num_heads: Sequence[int] = (3, 6, 12, 24),
        window_size: int = 4,
        mlp_ratio: float = 4.0,
        qkv_bias: bool = True,
        drop_rate: float = 0.0,
        attn_drop_rate: float = 0.0,
        drop_path_rate: float = 0.0,
        global_pool: str = "avg",
        dynamic_img_size: bool = False,
    ) -> None:
        depths, num_heads = tuple(depths), tuple(num_heads)
        check_patch_grid(img_size, patch_size)
        if len(depths) != len(num_heads):
            raise ValueError(
                f"depths and num_heads give one entry per stage and must have the same length, got {len(depths)} "
                f"and {len(num_heads)}"
            )
        for stage, heads in enumerate(num_heads):
            width = embed_dim * 2**stage
            if width % heads != 0:
                raise ValueError(
                    f"stage {stage} has width {width} (embed_dim * 2**{stage}), not divisible by its {heads} heads; "
                    "choose embed_dim or num_heads so that every stage width is a multiple of its head count"
                )
        super().__init__(
            img_size=img_size,
            patch_size=patch_size,
            in_chans=in_chans,
            num_classes=num_classes,
            embed_dim=embed_dim,
            depths=depths,
            num_heads=num_heads,
            window_size=window_size,
            mlp_ratio=mlp_ratio,
            qkv_bias=qkv_bias,
            drop_rate=drop_rate,
            proj_drop_rate=drop_rate,
            attn_drop_rate=attn_drop_rate,
            drop_path_rate=drop_path_rate,
            global_pool=global_pool,
            dynamic_img_size=dynamic_img_size,
        )
        for module in self.modules():
            if isinstance(module, WindowAttention):
                module.register_forward_pre_hook(choose_window_attention_path)


_SWIN_SIZES = {
    "swin_pico": dict(embed_dim=16, depths=(1, 1, 1, 1), num_heads=(1, 2, 4, 8), mlp_ratio=2.0),
    # CET-ViT nano's micro-encoder depths (1, 1, 2, 1)
    "swin_nano": dict(embed_dim=24, depths=(1, 1, 2, 1), num_heads=(2, 4, 8, 16)),
    "swin_micro": dict(embed_dim=32, depths=(2, 2, 2, 2), num_heads=(2, 4, 8, 16)),
    # timm's swin_tiny shape (Swin-T)
    "swin_tiny": dict(embed_dim=96, depths=(2, 2, 6, 2), num_heads=(3, 6, 12, 24)),
}
for _name, _kw in _SWIN_SIZES.items():
    register_preset(
        _name,
        SwinTransformer,
        f"Swin for 32x32 (patch 2, window 4), width {_kw['embed_dim']}, depths {_kw['depths']}",
        **_kw,
    )
