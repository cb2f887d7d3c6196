"""Model classes; importing this package registers every preset."""

from vitlab.models.cet_vit import CETViT
from vitlab.models.registry import create_model, list_models
from vitlab.models.vit import VisionTransformer
from vitlab.models.vitcae import ViTCAE

__all__ = ["CETViT", "ViTCAE", "VisionTransformer", "create_model", "list_models"]
