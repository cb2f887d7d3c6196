"""vitlab: train, control and inspect Vision Transformers."""

from vitlab.layers import attention_capture, capture_attention
from vitlab.models import create_model, from_timm, list_models

__version__ = "0.1.0"


def load_model(path, map_location="cpu"):
    """Rebuild a model offline from an exported folder (``model.safetensors`` + ``config.json``) or a checkpoint."""
    from vitlab.export import load_model as _load

    return _load(path, map_location=map_location)


__all__ = [
    "__version__",
    "attention_capture",
    "capture_attention",
    "create_model",
    "from_timm",
    "list_models",
    "load_model",
]
