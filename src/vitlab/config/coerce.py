"""Building dataclasses from nested dicts, with errors that name the key (``from_dict``), and back (``to_dict``).

A ``typing.TypedDict`` or a dataclass type also types a plain mapping through :func:`typed_mapping`, each key one of
its fields (the ``model`` section: a preset and the options the config sets, nothing else).
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import types
import typing
from typing import Any

from vitlab.errors import ConfigError


def unknown_key_error(key: str, valid: list[str], where: str) -> ConfigError:
    """``unknown config key 'loss.foo'. Did you mean ...? Valid keys in section 'loss': ...`` (one line)."""
    path = f"{where}.{key}" if where else key
    close = difflib.get_close_matches(key, valid, n=3)
    hint = f" Did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
    section = f"section '{where}'" if where else "the top level"
    if not valid:
        return ConfigError(f"unknown config key '{path}': {section} takes no keys here")
    return ConfigError(f"unknown config key '{path}'.{hint} Valid keys in {section}: {', '.join(sorted(valid))}")


def typed_mapping(tp: Any, values: Any, where: str) -> dict[str, Any]:
    """``values`` checked against ``tp`` (a ``TypedDict`` or a dataclass type): each key one of its keys, each value of
    its type; the mapping stays a mapping (a dataclass type is not built: its defaults are not filled in)."""
    if not isinstance(values, dict):
        raise ConfigError(f"{where or 'the config'} must be a mapping, got {values!r}")
    hints = typing.get_type_hints(tp)
    out = {}
    for key, value in values.items():
        if key not in hints:
            raise unknown_key_error(key, list(hints), where)
        out[key] = _coerce(value, hints[key], f"{where}.{key}" if where else key)
    return out


def _coerce(value: Any, tp: Any, where: str) -> Any:
    """Check/convert ``value`` to the annotated type ``tp`` (a small subset of typing: what our configs use)."""
    if typing.is_typeddict(tp):
        return typed_mapping(tp, value, where)
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        if isinstance(value, tp):
            return value
        if not isinstance(value, dict):
            raise ConfigError(f"{where} must be a mapping, got {value!r}")
        return from_dict(tp, value, where)
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        return _coerce_union(value, tp, where)
    if tp is Any:
        return value
    if origin is typing.Literal:
        if value in args:
            return value
        raise ConfigError(f"{where} must be one of {', '.join(map(str, args))}, got {value!r}")
    if origin in (tuple, dict, list):
        return _coerce_container(value, origin, args, where)
    return _coerce_scalar(value, tp, where)


def _coerce_union(value: Any, tp: Any, where: str) -> Any:
    """``value`` as the first member of the union ``tp`` it fits, an exact type first."""
    args = typing.get_args(tp)
    if value is None and type(None) in args:
        return None
    if type(value) in args:  # an exact match wins: `limit_train_batches: 1` is one batch, not 1.0 = 100%
        return value
    options = [arg for arg in args if arg is not type(None)]
    if len(options) == 1:  # `X | None`: X's own error names the problem
        return _coerce(value, options[0], where)
    for arg in options:
        with contextlib.suppress(ConfigError):
            return _coerce(value, arg, where)
    raise ConfigError(f"{where}: {value!r} does not fit {tp}")


def _coerce_container(value: Any, origin: type, args: tuple[Any, ...], where: str) -> Any:
    """``value`` as ``tuple[X, ...]``, ``tuple[X, Y]``, ``dict[...]`` or ``list[...]`` (a list is read as a tuple)."""
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{where} must be a mapping, got {value!r}")
        return dict(value)
    if origin is list:
        if not isinstance(value, list | tuple):
            raise ConfigError(f"{where} must be a list, got {value!r}")
        return list(value)
    if len(args) == 2 and args[1] is Ellipsis:  # tuple[X, ...]: any length
        if not isinstance(value, list | tuple):
            raise ConfigError(f"{where} must be a list, got {value!r}")
        return tuple(_coerce(v, args[0], f"{where}[{i}]") for i, v in enumerate(value))
    if not isinstance(value, list | tuple) or len(value) != len(args):
        raise ConfigError(f"{where} must be a list of {len(args)} values, got {value!r}")
    return tuple(_coerce(v, a, f"{where}[{i}]") for i, (v, a) in enumerate(zip(value, args, strict=True)))


def _coerce_scalar(value: Any, tp: Any, where: str) -> Any:
    """``value`` as ``bool``, ``int``, ``str`` or ``float`` (an int, or a string such as YAML 1.1's ``1e-3``, is
    read as a float); any other type takes the value as it is."""
    if tp is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if tp is float and isinstance(value, str):
        # YAML 1.1 reads "1e-3" (no dot) as a string; researchers write learning rates that way.
        with contextlib.suppress(ValueError):
            return float(value)
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{where} must be true or false, got {value!r}")
    if tp in (int, str, float):
        if isinstance(value, tp) and not (tp is int and isinstance(value, bool)):
            return value
        raise ConfigError(f"{where} must be of type {tp.__name__}, got {value!r}")
    return value


def from_dict(cls: type, values: dict[str, Any], where: str = "") -> Any:
    """Build dataclass ``cls`` from ``values``; an unknown key raises :class:`ConfigError` with suggestions, and so
    does a ``ValueError`` of the dataclass's own check."""
    kwargs = typed_mapping(cls, values, where)
    try:
        return cls(**kwargs)
    except ConfigError:
        raise
    except ValueError as error:  # a dataclass's own check (its __post_init__) from outside the config layer
        raise ConfigError(str(error)) from None


def to_dict(cfg: Any) -> Any:
    """Plain nested dicts/lists (YAML- and JSON-safe) from a config dataclass."""
    if dataclasses.is_dataclass(cfg):
        return {f.name: to_dict(getattr(cfg, f.name)) for f in dataclasses.fields(cfg)}
    if isinstance(cfg, dict):
        return {k: to_dict(v) for k, v in cfg.items()}
    if isinstance(cfg, list | tuple):
        return [to_dict(v) for v in cfg]
    return cfg
