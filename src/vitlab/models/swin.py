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

import dataclasses
from typing import Any

import torch
from timm.models.swin_transformer import SwinTransformer as TimmSwinTransformer
from timm.models.swin_transformer import WindowAttention

from vitlab.config.model import SwinTransformerOptions, takes_options
from vitlab.layers.attention_path import choose_window_attention_path
from vitlab.models.contract import ModelContract


@takes_options(SwinTransformerOptions)
class SwinTransformer(TimmSwinTransformer, ModelContract):
    """Swin classifier. ``x: [B, C, H, W] -> logits [B, num_classes]``; features are NHWC ``[B, H', W', C']``.

    Options (:class:`~vitlab.config.model.SwinTransformerOptions`): timm's Swin's, with ``drop_rate`` also after the
    attention and MLP projections (as in vitlab's ViT); ``global_pool`` ``avg`` (timm's default) or ``""``
    (``forward`` gives the NHWC features); ``dynamic_img_size``: any input size whose grid the patch merging halves,
    the attention masks built for it on each forward (timm's Swin); ``set_input_size`` changes the fixed size and
    the windows instead.
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

    def __init__(self, **options: Any) -> None:
        o = SwinTransformerOptions(**options)
        super().__init__(**dataclasses.asdict(o), proj_drop_rate=o.drop_rate)
        for module in self.modules():
            if isinstance(module, WindowAttention):
                module.register_forward_pre_hook(choose_window_attention_path)
