"""A registry of named model presets: names, classes and their keyword arguments (``list_models(pattern)``,
``get_preset``, ``resolved_kwargs``); :mod:`vitlab.models.builder` creates a model from a preset and loads weights.
Each preset comes from its row in the one preset namespace (``vitlab.family.presets``: the core's table,
:mod:`vitlab.model_catalogue`, and each family's), registered when first asked for.

A preset is a model class plus the keyword arguments that define it. The full resolved keyword arguments are
kept on the model as ``model.init_kwargs`` (with ``model.preset``) so an exported model can be rebuilt offline.
"""

from __future__ import annotations

import difflib
import fnmatch
import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from torch import nn

from vitlab.config.hf_model import HF_PREFIX
from vitlab.config.model import TIMM_PREFIX, TV_PREFIX, unknown_model
from vitlab.errors import FamilyError, ModelOptionError
from vitlab.family import FAMILY_API, Family, error_line, origin, plugin_failed, presets, resolve
from vitlab.model_catalogue import CORE_MODELS
from vitlab.models.hf_models import create_hf_model, hf_model_type
from vitlab.models.timm_models import create_timm_model, timm_architecture
from vitlab.models.tv_models import create_tv_model, tv_architecture


@dataclass(frozen=True)
class Preset:
    """A model class and the keyword arguments that define it; or, for ``timm:NAME``, the ``factory`` that builds
    timm's model (``cls`` is then ``nn.Module``: the class is timm's to choose, and timm checks the options)."""

    name: str
    cls: type[nn.Module]
    kwargs: dict[str, Any] = field(default_factory=dict)
    description: str = ""
    factory: Callable[..., nn.Module] | None = None

    def build(self, **kwargs: Any) -> nn.Module:
        return self.cls(**kwargs) if self.factory is None else self.factory(**kwargs)


_REGISTRY: dict[str, Preset] = {}


def _register(name: str, cls: type[nn.Module], description: str, kwargs: Mapping[str, Any]) -> None:
    _check_kwargs(cls, dict(kwargs), name)
    _REGISTRY[name] = Preset(name, cls, dict(kwargs), description)


def register_preset(name: str, cls: type[nn.Module], description: str = "", **kwargs: Any) -> None:
    """Family API 1's way to declare a preset (a plug-in's model module called it on import), kept so that such a
    plug-in still works: one :class:`~vitlab.family.PluginWarning` line says what to change. Since API 2 the family's
    preset table holds the constructor arguments (docs/writing_a_family.md, "Upgrading a plug-in")."""
    plugin_failed(
        "register_preset (family API 1)",
        DeprecationWarning(
            f"deprecated since family API {FAMILY_API}: move each preset's arguments into the family's preset table "
            f"(first {name!r}: (class name, description, dict(...))) and drop the calls (docs/writing_a_family.md, "
            "'Upgrading a plug-in')"
        ),
        left_out=False,
    )
    if name not in _REGISTRY:
        _register(name, cls, description, kwargs)


def _model_class(family: Family | None, model: str) -> type[nn.Module]:
    """The class a preset row names: one of ``family``'s models, or a core model; a plug-in's that cannot be imported
    is a one-line :class:`~vitlab.errors.FamilyError` that names the plug-in."""
    if family is None or model not in family.model_class_names():
        return resolve(CORE_MODELS[model])
    ref = family.models[family.model_class_names().index(model)]
    if origin(family) is None:
        return resolve(ref)
    try:
        return resolve(ref)
    except Exception as error:
        raise FamilyError(
            f"{origin(family)} cannot import its model {model!r} ({error_line(error)}); fix or uninstall it, or use "
            "another model"
        ) from error


def list_models(pattern: str = "*") -> list[str]:
    """Names of the presets matching a glob ``pattern`` (e.g. ``"vit_*"``), sorted: the one namespace of the core's
    and the families' tables (``vitlab.family.presets``); no model class is imported."""
    return sorted(n for n in {*presets(), *_REGISTRY} if fnmatch.fnmatch(n, pattern))


def get_preset(name: str) -> Preset:
    """The preset ``name``, registered from its table row on first use (which imports its model class); a
    ``timm:NAME`` preset is built by timm."""
    if name.startswith(TIMM_PREFIX):
        arch = timm_architecture(name)
        return Preset(name, nn.Module, description=f"timm's {arch}", factory=partial(create_timm_model, name))
    if name.startswith(TV_PREFIX):
        arch = tv_architecture(name)
        return Preset(name, nn.Module, description=f"torchvision's {arch}", factory=partial(create_tv_model, name))
    if name.startswith(HF_PREFIX):
        kind = hf_model_type(name)
        return Preset(name, nn.Module, description=f"transformers' {kind}", factory=partial(create_hf_model, name))
    if name not in _REGISTRY:
        namespace = presets()
        if name not in namespace:
            raise unknown_model(name, [*namespace, *_REGISTRY])
        family, row = namespace[name]
        cls = _model_class(family, row.model)  # an API-1 plug-in's module registers its presets as it is imported
        if name not in _REGISTRY:
            _register(name, cls, row.description, row.kwargs)
    return _REGISTRY[name]


def constructor_args(cls: type) -> dict[str, inspect.Parameter]:
    sig = inspect.signature(cls.__init__)
    return {n: p for n, p in sig.parameters.items() if n != "self" and p.kind is p.KEYWORD_ONLY}


def _check_kwargs(cls: type, kwargs: dict[str, Any], name: str) -> None:
    valid = constructor_args(cls)
    for key in kwargs:
        if key not in valid:
            close = difflib.get_close_matches(key, list(valid), n=3)
            hint = f" Did you mean {', '.join(close)}?" if close else ""
            raise ModelOptionError(
                f"model {name!r} ({cls.__name__}) has no option {key!r}.{hint} "
                f"Valid options: {', '.join(sorted(valid))}"
            )


def resolved_kwargs(name: str, **overrides: Any) -> dict[str, Any]:
    """The preset's keyword arguments with ``overrides`` applied, after checking every key exists."""
    preset = get_preset(name)
    if preset.factory is None:
        _check_kwargs(preset.cls, overrides, name)
    return {**preset.kwargs, **overrides}
