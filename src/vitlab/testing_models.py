"""Tiny models of twenty-five architectures, for the tests and benchmarks that must meet more than vitlab's own
attention: vitlab's five families, eleven timm families whose operators differ (a distillation token, class
attention with LayerScale, spatial-reduction, cross-covariance, locally-grouped and sub-sampled, multi-axis (block
and grid), convolutional with attention biases, linear attention, shifted windows, rotary embeddings,
relative-position MLP), torchvision's ViT (``nn.MultiheadAttention``) and Swin, and seven HF transformers models
(ViT, DeiT, BEiT, Swin, Dinov2, CLIP's vision tower, SigLIP's with its attention-pool head). Each is built from a
configuration with random weights, nothing downloaded; the HF models need ``transformers`` (the ``dev`` extra).

    from vitlab.testing_models import ARCHITECTURES, tiny_model

    model, x = tiny_model("pvt_v2", trained=True)  # float64, eval mode, three images
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from vitlab.models import create_model


def _timm(name: str, **kw) -> nn.Module:
    import timm

    return timm.create_model(name, pretrained=False, num_classes=5, **kw)


def _maxvit() -> nn.Module:
    """MaxViT (block and grid attention, MBConv) from timm's pico configuration, shrunk to two one-block stages."""
    import dataclasses

    from timm.models.maxxvit import MaxxVit, model_cfgs

    cfg = model_cfgs["maxvit_pico_rw"]
    attention = dataclasses.replace(cfg.transformer_cfg, dim_head=8)
    cfg = dataclasses.replace(
        cfg, embed_dim=(16, 32), depths=(1, 1), block_type=("M", "M"), stem_width=(8, 16), transformer_cfg=attention
    )
    return MaxxVit(cfg, img_size=32, num_classes=5)


def _torchvision_vit() -> nn.Module:
    """torchvision's ViT (``nn.MultiheadAttention`` in every block); its head starts at zero, drawn here instead."""
    from torchvision.models import VisionTransformer

    model = VisionTransformer(image_size=16, patch_size=4, num_layers=2, num_heads=2, hidden_dim=16, mlp_dim=32)
    model.heads.head = nn.Linear(16, 5)
    return model


def _torchvision_swin() -> nn.Module:
    from torchvision.models import SwinTransformer

    return SwinTransformer(
        patch_size=[2, 2], embed_dim=8, depths=[1, 1], num_heads=[1, 2], window_size=[2, 2], num_classes=5
    )


#: one tiny encoder for the HF ViT-like configurations
HF_TINY = {"hidden_size": 16, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 32}
HF_TINY |= {"image_size": 16, "patch_size": 4}


class PooledClassifier(nn.Module):
    """A linear classifier on a backbone's ``pooler_output`` (HF SigLIP's vision model ends in its attention-pool
    head and has no classifier of its own)."""

    def __init__(self, backbone: nn.Module, width: int, num_classes: int = 5) -> None:
        super().__init__()
        self.backbone, self.head = backbone, nn.Linear(width, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.backbone(x).pooler_output)


def hf_model(name: str, **kw) -> nn.Module:
    """An HF transformers image classifier from a tiny configuration, random weights (nothing downloaded)."""
    import transformers

    if name == "Siglip":
        vision = transformers.SiglipVisionModel(transformers.SiglipVisionConfig(**HF_TINY))
        return PooledClassifier(vision, HF_TINY["hidden_size"])
    if name == "CLIP":
        config = transformers.CLIPConfig(vision_config=HF_TINY, num_labels=5)
        return transformers.CLIPForImageClassification(config)
    config = getattr(transformers, f"{name}Config")(**kw, num_labels=5)
    return getattr(transformers, f"{name}ForImageClassification")(config)


def _family_presets() -> dict[str, str]:
    """Each built-in family's smallest preset (``*_pico``), by the family's name: the core names no family."""
    from vitlab.family import builtin, families

    smallest = {f.name: sorted(p for p in f.preset_names() if p.endswith("_pico")) for f in families() if builtin(f)}
    return {name: presets[0] for name, presets in smallest.items() if presets}


def _family_model(preset: str) -> nn.Module:
    """``preset`` for 16x16 RGB images, 5 classes, patch 2, the options its class takes (two blocks where it has a
    depth)."""
    from vitlab.models.registry import constructor_args, get_preset

    wanted = dict(num_classes=5, img_size=16, patch_size=2, in_chans=3, depth=2)
    accepted = constructor_args(get_preset(preset).cls)
    return create_model(preset, **{k: v for k, v in wanted.items() if k in accepted})


#: name -> builder
ARCHITECTURES: dict[str, Callable[[], nn.Module]] = {
    "vit": lambda: create_model("vit_pico", num_classes=5, img_size=16, patch_size=4, depth=2),
    "tome": lambda: create_model("tome_pico", num_classes=5, img_size=16, patch_size=4, depth=2, tome_r=3),
    "swin": lambda: create_model(
        "swin_pico", num_classes=5, img_size=16, patch_size=2, window_size=2, depths=(1, 1), num_heads=(1, 2)
    ),
    **{family: lambda preset=preset: _family_model(preset) for family, preset in _family_presets().items()},
    "deit": lambda: _timm(
        "deit_tiny_distilled_patch16_224", img_size=16, patch_size=4, embed_dim=16, depth=2, num_heads=2
    ),
    "cait": lambda: _timm(
        "cait_xxs24_224", img_size=16, patch_size=4, embed_dim=16, depth=2, depth_token_only=1, num_heads=2
    ),
    "pvt_v2": lambda: _timm("pvt_v2_b0", embed_dims=(8, 16, 16, 16), depths=(1, 1, 1, 1), num_heads=(1, 1, 1, 1)),
    "xcit": lambda: _timm(
        "xcit_nano_12_p8_224", img_size=16, patch_size=8, embed_dim=16, depth=2, num_heads=2, cls_attn_layers=1
    ),
    "twins": lambda: _timm(
        "twins_svt_small", img_size=32, embed_dims=(8, 16, 16, 16), depths=(1, 1, 1, 1), num_heads=(1, 1, 1, 1)
    ),
    "maxvit": _maxvit,
    "levit": lambda: _timm("levit_128s", img_size=32),
    "efficientvit": lambda: _timm(
        "efficientvit_b0", widths=(8, 16, 16, 32), depths=(1, 1, 1, 1), head_dim=8, head_widths=(32, 32)
    ),
    "timm_swin": lambda: _timm(
        "swin_tiny_patch4_window7_224",
        img_size=16,
        patch_size=2,
        window_size=2,
        embed_dim=8,
        depths=(1, 1),
        num_heads=(1, 2),
    ),
    "eva02": lambda: _timm("eva02_tiny_patch14_224", img_size=16, patch_size=4, embed_dim=16, depth=2, num_heads=2),
    "vit_relpos": lambda: _timm(
        "vit_relpos_small_patch16_224", img_size=16, patch_size=4, embed_dim=16, depth=2, num_heads=2
    ),
    "torchvision_vit": _torchvision_vit,
    "torchvision_swin": _torchvision_swin,
    "hf_vit": lambda: hf_model("ViT", **HF_TINY),
    "hf_deit": lambda: hf_model("DeiT", **HF_TINY),
    "hf_beit": lambda: hf_model("Beit", **HF_TINY, use_relative_position_bias=True),
    "hf_swin": lambda: hf_model(
        "Swin", image_size=16, patch_size=2, embed_dim=8, depths=[1, 1], num_heads=[1, 2], window_size=2
    ),
    "hf_dinov2": lambda: hf_model("Dinov2", **HF_TINY),
    "hf_clip": lambda: hf_model("CLIP"),
    "hf_siglip": lambda: hf_model("Siglip"),
}
#: the architectures whose images are 32x32 (the others: 16x16)
_SIDE_32 = {"pvt_v2", "twins", "maxvit", "levit", "efficientvit"}


def tiny_model(name: str, *, trained: bool = False) -> tuple[nn.Module, torch.Tensor]:
    """The architecture in float64, eval mode, and three images for it; ``trained``: after three Adam steps on
    random labels (the rules are checked away from the initial weights, where some heads start at zero)."""
    side = 32 if name in _SIDE_32 else 16
    torch.manual_seed(0)
    model = ARCHITECTURES[name]().double()
    x = torch.randn(3, 3, side, side, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    if trained:
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
        model.train()
        for _ in range(3):
            out = model(x)
            logits = out if isinstance(out, torch.Tensor) else getattr(out, "logits", None)
            logits = out[0] if logits is None else logits
            nn.functional.cross_entropy(logits, torch.arange(3) % 5).backward()
            optimizer.step()
            optimizer.zero_grad()
    return model.eval(), x
