"""Names of a package imported when first used (PEP 562), so that importing the package stays cheap."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from importlib import import_module
from typing import Any


def lazy_exports(package: str, names: Mapping[str, str], namespace: dict[str, Any]) -> tuple[Callable, Callable]:
    """``(__getattr__, __dir__)`` for ``package`` whose public ``names`` (name -> defining module) are imported on
    first use and then cached in the package's ``namespace`` (its ``globals()``)."""

    def __getattr__(name: str) -> Any:
        if name in names:
            value = getattr(import_module(names[name]), name)
            namespace[name] = value
            return value
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    def __dir__() -> list[str]:
        return sorted({*namespace, *names})

    return __getattr__, __dir__
