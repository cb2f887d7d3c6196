"""Model classes and the preset registry. The families' models live in their packages (``vitlab.families``)."""

from vitlab.models.builder import create_model, from_timm
from vitlab.models.pretrained import load_pretrained
from vitlab.models.registry import list_models
from vitlab.models.sizing import count_params, flops_per_image, match_width, parameter_count
from vitlab.models.swin import SwinTransformer
from vitlab.models.vit import VisionTransformer

__all__ = [
    "SwinTransformer",
    "VisionTransformer",
    "count_params",
    "create_model",
    "flops_per_image",
    "from_timm",
    "list_models",
    "load_pretrained",
    "match_width",
    "parameter_count",
]
