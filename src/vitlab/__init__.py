"""vitlab: train, control and inspect Vision Transformers.

The names below are imported when first used (PEP 562), so that ``import vitlab`` and the ``vitlab`` command's
``--help`` do not load torch, timm and Lightning.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING

from vitlab.lazy import after_import, lazy_exports
from vitlab.version import __version__

if TYPE_CHECKING:
    from vitlab.diagnostics.capture import capture_attention
    from vitlab.explain import explain
    from vitlab.export import export_model, load_model
    from vitlab.layers import attention_capture
    from vitlab.models import create_model, from_timm, list_models

#: public name -> the module that defines it
_LAZY = {
    "attention_capture": "vitlab.layers",
    "capture_attention": "vitlab.diagnostics.capture",
    "create_model": "vitlab.models",
    "explain": "vitlab.explain",
    "export_model": "vitlab.export",
    "from_timm": "vitlab.models",
    "list_models": "vitlab.models",
    "load_model": "vitlab.export",
}


__getattr__, __dir__ = lazy_exports(__name__, _LAZY, globals())
# every preset in timm's registry as ``vitlab_<preset>`` (vitlab.timm_registry), once timm is imported
after_import("timm", lambda: import_module("vitlab.timm_registry").register())

__all__ = [
    "__version__",
    "attention_capture",
    "capture_attention",
    "create_model",
    "explain",
    "export_model",
    "from_timm",
    "list_models",
    "load_model",
]
