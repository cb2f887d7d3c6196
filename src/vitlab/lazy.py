"""Names of a package imported when first used (PEP 562), so that importing the package stays cheap."""

from __future__ import annotations

import contextlib
import sys
import warnings
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


class _AfterImport:
    """A ``sys.meta_path`` finder (PEP 451) that wraps the loading of one module so that a callback runs once it is
    loaded: it asks the finders after it for the module's spec and wraps that spec's loader. It stays until the module
    has been executed (a bare ``importlib.util.find_spec(name)``, which loads nothing, does not use it up), then
    removes itself and runs the callback once; a failing callback warns instead of failing the user's import."""

    def __init__(self, name: str, callback: Callable[[], None]) -> None:
        self.name, self.callback, self.done, self._finding = name, callback, False, False

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name != self.name or self.done or self._finding:
            return None
        self._finding = True  # the finders after this one may ask again (reentrancy)
        try:
            finders = [f for f in sys.meta_path if f is not self]
            spec = next((s for f in finders if (s := f.find_spec(name, path, target)) is not None), None)
        finally:
            self._finding = False
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def exec_then_call(module: Any) -> None:
            exec_module(module)
            if module.__name__ == self.name:  # a loader shared by several modules (zipimport) runs this for each
                self.fire()

        spec.loader.exec_module = exec_then_call  # this spec's loader
        return spec

    def fire(self) -> None:
        if self.done:
            return
        self.done = True
        with contextlib.suppress(ValueError):
            sys.meta_path.remove(self)
        try:
            self.callback()
        except Exception as error:  # the import the user asked for must not fail because of vitlab
            warnings.warn(f"vitlab: the hook after importing {self.name} failed: {error}", RuntimeWarning, stacklevel=2)


def after_import(name: str, callback: Callable[[], None]) -> None:
    """Run ``callback()`` once the module ``name`` is imported: now if it is, else right after its import, without
    importing it (so a package can register itself with another, e.g. timm, at no import cost). A failing callback
    warns, now as later: ``import timm, vitlab`` never raises because of vitlab's hook."""
    hook = _AfterImport(name, callback)
    if name in sys.modules:
        hook.fire()
    else:
        sys.meta_path.insert(0, hook)
