"""vitlab: train, control and inspect Vision Transformers.

The names below are imported when first used (PEP 562), so that ``import vitlab`` and the ``vitlab`` command's
``--help`` do not load torch, timm and Lightning.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

from vitlab.version import __version__

if TYPE_CHECKING:
    from vitlab.export import load_model
    from vitlab.layers import attention_capture, capture_attention
    from vitlab.models import create_model, from_timm, list_models

#: public name -> the module that defines it
_LAZY = {
    "attention_capture": "vitlab.layers",
    "capture_attention": "vitlab.layers",
    "create_model": "vitlab.models",
    "from_timm": "vitlab.models",
    "list_models": "vitlab.models",
    "load_model": "vitlab.export",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'vitlab' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})


__all__ = [
    "__version__",
    "attention_capture",
    "capture_attention",
    "create_model",
    "from_timm",
    "list_models",
    "load_model",
]
