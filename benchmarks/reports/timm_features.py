"""The feature-extraction table of docs/timm.md: a vitlab backbone and a timm one built by ``timm.create_model(...,
features_only=True)`` (timm's builder), one row per feature map: its shape and stride, measured on one random image.

    OMP_NUM_THREADS=1 python -m benchmarks.reports.timm_features
"""

from __future__ import annotations

import timm
import torch

import vitlab  # noqa: F401  (registers the vitlab_* models with timm)

#: (timm name, create_model options, input side)
MODELS = [
    ("vitlab_swin_pico", {}, 64),
    ("vitlab_cet_vit_nano_global", {"out_indices": (0, 1, 2)}, 64),
    ("vitlab_vit_pico", {}, 64),
    ("swin_tiny_patch4_window7_224", {}, 224),
    ("resnet18", {"out_indices": (1, 2, 3, 4)}, 64),
]


def rows() -> list[str]:
    lines = [
        "| model | input | feature_cls | out_indices | shape `[B, C, H, W]` (or NHWC) | stride |",
        "|---|---|---|---|---|---|",
    ]
    for name, options, side in MODELS:
        options = {"dynamic_img_size": True, **options} if name.startswith("vitlab_") else options
        model = timm.create_model(name, pretrained=False, features_only=True, **options).eval()
        with torch.no_grad():
            maps = model(torch.randn(1, 3, side, side))
        kind = type(model).__name__
        info = zip(model.feature_info.out_indices, maps, model.feature_info.reduction(), strict=True)
        for index, out, stride in info:
            lines.append(f"| `{name}` | {side}x{side} | {kind} | {index} | {list(out.shape)} | {stride} |")
    return lines


if __name__ == "__main__":
    torch.manual_seed(0)
    print("\n".join(rows()))
