"""Strict JSON for every file vitlab writes: a non-finite float (NaN, inf) is written as ``null``.

Python's ``json`` writes NaN as a bare ``NaN`` token by default, which strict parsers (JavaScript's
``JSON.parse``, ``jq``, most JSON libraries outside Python) reject.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any


def finite_or_none(node: Any) -> Any:
    """``node`` with every non-finite float replaced by None (mappings, lists and tuples are walked)."""
    if isinstance(node, float) and not math.isfinite(node):
        return None
    if isinstance(node, Mapping):
        return {key: finite_or_none(value) for key, value in node.items()}
    if isinstance(node, list | tuple):
        return [finite_or_none(value) for value in node]
    return node


def flatten(node: Any, prefix: str = "", sep: str = ".") -> dict[str, Any]:
    """The leaves of nested mappings as ``{prefix + sep + "a" + sep + "b": leaf}`` (keys joined by ``sep``)."""
    if not isinstance(node, Mapping):
        return {prefix: node}
    flat: dict[str, Any] = {}
    for key, value in node.items():
        flat.update(flatten(value, f"{prefix}{sep}{key}" if prefix else f"{key}", sep))
    return flat


def strict_dumps(obj: Any, **kwargs: Any) -> str:
    """``json.dumps`` that writes NaN and inf as null and never emits a non-standard token."""
    return json.dumps(finite_or_none(obj), allow_nan=False, **kwargs)
