"""Model classes and the preset registry. The families' models (``ViTCAE``, ``CETViT``) live in their packages
(``vitlab.families``) and are named here lazily, for code that imports them from ``vitlab.models``."""

from typing import TYPE_CHECKING

from vitlab.lazy import lazy_exports
from vitlab.models.builder import create_model, from_timm
from vitlab.models.pretrained import load_pretrained
from vitlab.models.registry import list_models
from vitlab.models.sizing import count_params, flops_per_image, match_width, parameter_count
from vitlab.models.swin import SwinTransformer
from vitlab.models.vit import VisionTransformer

if TYPE_CHECKING:
    from vitlab.families.cet_vit.model import CETViT
    from vitlab.families.vitcae.model import ViTCAE

__getattr__, __dir__ = lazy_exports(
    __name__, {"CETViT": "vitlab.families.cet_vit.model", "ViTCAE": "vitlab.families.vitcae.model"}, globals()
)

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
    "parameter_count",
]
