"""Model classes; importing this package registers every preset."""

from vitlab.models.cet_vit import CETViT
from vitlab.models.pretrained import from_timm, load_pretrained
from vitlab.models.registry import create_model, list_models
from vitlab.models.sizing import count_params, flops_per_image, match_width
from vitlab.models.swin import SwinTransformer
from vitlab.models.vit import VisionTransformer
from vitlab.models.vitcae import ViTCAE

__all__ = [
    "CETViT",
    "SwinTransformer",
    "ViTCAE",
    "VisionTransformer",
    "count_params",
    "create_model",
    "flops_per_image",
    "from_timm",
    "list_models",
    "load_pretrained",
    "match_width",
]
