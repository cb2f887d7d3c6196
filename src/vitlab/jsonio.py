"""Strict JSON for every file vitlab writes: a non-finite float (NaN, inf) is written as ``null``; and the readers of
JSON and JSON-lines files, whose broken content is one line that names the file.

Python's ``json`` writes NaN as a bare ``NaN`` token by default, which strict parsers (JavaScript's
``JSON.parse``, ``jq``, most JSON libraries outside Python) reject.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from vitlab.errors import ConfigError


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


def read_json(path: str | Path) -> Any:
    """A JSON file; invalid JSON is a :class:`ConfigError` that names the file."""
    path = Path(path)
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ConfigError(f"{path} is not valid JSON ({e}); delete it or write it again") from e


def read_jsonl(path: str | Path, key: str | None = None) -> list[dict[str, Any]]:
    """The records of a JSON-lines file (``[]`` when it does not exist).

    With ``key`` (``"epoch"``, ``"step"``), lines with the same value of ``key`` (an epoch written again after a
    resume, or in two halves) are merged, later values winning, and the records come back sorted by ``key``.
    A last line cut off by a writer still at work is skipped; a broken line before it is a :class:`ConfigError`.
    """
    path = Path(path)
    if not path.exists():
        return []
    lines = [line for line in path.read_text().splitlines() if line.strip()]
    records = []
    for number, line in enumerate(lines, 1):
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError as e:
            if number == len(lines):
                break
            raise ConfigError(f"{path}, line {number}, is not valid JSON ({e}); delete the line or the file") from e
    if key is None:
        return records
    merged: dict[Any, dict[str, Any]] = {}
    for record in records:
        merged.setdefault(record[key], {}).update(record)
    return [merged[k] for k in sorted(merged)]
