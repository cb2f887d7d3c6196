"""Config files and command-line overrides, read into one plain nested dict before any dataclass sees it: the YAML
files under ``configs/`` with their ``defaults:`` chains, and ``key.sub=value`` overrides merged on top."""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Hashable
from pathlib import Path
from typing import Any

import yaml

from vitlab.config.loss import loss_config_type
from vitlab.config.model import catalogue
from vitlab.errors import ConfigError

CONFIG_ROOT = Path(__file__).parent.parent / "configs"


def resolve_config_path(name: str | Path) -> Path:
    """A path, or a name under the packaged ``configs/`` folder (``vit/digits`` -> ``configs/vit/digits.yaml``)."""
    path = Path(name)
    if path.is_file():
        return path
    for candidate in (CONFIG_ROOT / path, CONFIG_ROOT / path.with_suffix(".yaml")):
        if candidate.is_file():
            return candidate
    available = sorted(str(p.relative_to(CONFIG_ROOT).with_suffix("")) for p in CONFIG_ROOT.rglob("*.yaml"))
    raise ConfigError(
        f"config file {str(name)!r} not found, neither as a path nor under {CONFIG_ROOT}. "
        f"Packaged configs: {', '.join(available)}"
    )


class UniqueKeyLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses a key given twice in one mapping (PyYAML keeps the last value silently; the
    YAML 1.2 spec, sec. 3.2.1.3, requires keys to be unique)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *base` keys may be overridden
                continue
            key = self.construct_object(key_node, deep=deep)
            if not isinstance(key, Hashable):  # PyYAML's own error names it
                continue
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r} (remove one of the two)", key_node.start_mark
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def read_yaml(path: str | Path) -> Any:
    """A YAML file's content; a syntax error (a tab in the indentation, an unclosed bracket) or a key given twice is
    a :class:`ConfigError` that names the file, the line and the column."""
    path = Path(path)
    try:
        return yaml.load(path.read_text(), Loader=UniqueKeyLoader)
    except UnicodeDecodeError as e:
        raise ConfigError(
            f"{path} is not a UTF-8 text file (byte {e.start} is {e.object[e.start : e.start + 1]!r}); pass a YAML "
            "config file, or save this one as UTF-8"
        ) from None
    except RecursionError:  # PyYAML's composer recurses once per level of brackets
        raise ConfigError(f"{path} nests its brackets too deep to read; a config is a few levels of sections") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f", line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        tabs = " (YAML indents with spaces, not tabs)" if "\t" in path.read_text() else ""
        raise ConfigError(f"{path}{where} is not valid YAML: {problem}{tabs}; fix that line") from e


def load_yaml(path: str | Path, _seen: tuple[Path, ...] = ()) -> dict[str, Any]:
    """Read a YAML config; ``defaults: [other.yaml, ...]`` entries are merged first (relative to the file)."""
    path = resolve_config_path(path)
    if path.resolve() in _seen:
        chain = " -> ".join(p.name for p in (*_seen, path.resolve()))
        raise ConfigError(f"{path}: its defaults include themselves ({chain}); remove the entry that closes the circle")
    data = read_yaml(path)
    if data is None:  # an empty file, comments only, or a lone `---`: no settings at all
        raise ConfigError(
            f"config {path} is empty (no settings); write its settings, or leave out --config to train the defaults"
        )
    if not isinstance(data, dict):
        raise ConfigError(f"{path} must hold a mapping at the top level")
    for key, value in data.items():  # an override of the section would silently replace a list or a number
        if key != "defaults" and value is not None and not isinstance(value, dict):
            raise ConfigError(f"{path}: section {key!r} must be a mapping (indented 'key: value' lines), got {value!r}")
    merged: dict[str, Any] = {}
    defaults = data.pop("defaults", []) or []
    if not isinstance(defaults, list) or not all(isinstance(d, str) for d in defaults):
        raise ConfigError(f"{path}: defaults must be a list of config files, got {defaults!r}")
    for parent in defaults:
        parent_path = (path.parent / parent) if not Path(parent).is_absolute() else Path(parent)
        if not parent_path.exists():
            parent_path = resolve_config_path(parent)
        merged = deep_merge(merged, load_yaml(parent_path, (*_seen, path.resolve())))
    return deep_merge(merged, data)


def deep_merge(base: dict[str, Any], update: dict[str, Any]) -> dict[str, Any]:
    """``update`` merged into ``base``, mappings key by key; a new preset name starts the ``model`` section from a clean
    slate (the same name merges overrides), and a preset trained by another task the ``loss`` section too (a protocol
    file's loss stays with its model: the baselines that share it get their own task's defaults)."""
    out = dict(base)
    if _new_task(base.get("model"), update.get("model")):
        out.pop("loss", None)
    for key, value in update.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict) and key != "model":
            out[key] = deep_merge(out[key], value)
        elif key == "model" and isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = dict(value) if _new_preset(out[key], value) else {**out[key], **value}
        else:
            out[key] = value
    return out


def _new_task(model: Any, override: Any) -> bool:
    if not _new_preset(model, override):
        return False
    presets = catalogue()
    classes = [presets.get(section["name"], ("",))[0] for section in (model, override)]
    return all(classes) and loss_config_type(classes[0]) is not loss_config_type(classes[1])


def _new_preset(model: Any, override: Any) -> bool:
    return (
        isinstance(model, dict)
        and isinstance(override, dict)
        and isinstance(override.get("name", ""), str)  # another is refused by the model section's check
        and override.get("name", model.get("name")) != model.get("name")
    )


def parse_overrides(args: list[str]) -> dict[str, Any]:
    """``["optim.lr=1e-3", "--trainer.devices", "2", "--data.name=mnist"]`` -> nested dict (YAML-typed values)."""
    out: dict[str, Any] = {}
    i = 0
    while i < len(args):
        arg = args[i]
        key = arg[2:] if arg.startswith("--") else arg
        if "=" in key:
            key, raw = key.split("=", 1)
        elif arg.startswith("--") and i + 1 < len(args):
            i += 1
            raw = args[i]
        else:
            raise ConfigError(f"cannot read override {arg!r}: write it as key.sub=value or --key.sub value")
        if not key or any(not part for part in key.split(".")):
            raise ConfigError(f"malformed override key {key!r}")
        try:
            value = yaml.safe_load(raw) if raw != "" else ""
        except RecursionError:
            raise ConfigError(f"override {key}= nests its brackets too deep to read; give a flat value") from None
        except yaml.YAMLError as e:
            raise ConfigError(f"override {key}={raw!r} is not a valid YAML value: {e}") from e
        if isinstance(value, str) and any(c in value for c in ".eE"):
            with contextlib.suppress(ValueError):
                value = float(value)
        node = out
        parts = key.split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"override {key!r} conflicts with another override")
        node[parts[-1]] = value
        i += 1
    return out


def _warn_about_a_new_preset(model: Any, override: Any) -> None:
    """Warn when an override's ``model.name`` replaces the config's preset: the model section then starts afresh
    (:func:`deep_merge`), and the config's other model keys (a protocol's patch size, its dropout) silently stop
    applying unless the overrides repeat them."""
    if not _new_preset(model, override) or model.get("name") is None:
        return
    dropped = [key for key in model if key != "name" and key not in override]
    if dropped:
        settings = ", ".join(f"model.{key}={model[key]!r}" for key in dropped)
        warnings.warn(
            f"model.name={override['name']} replaces the config's preset {model['name']!r}, so the config's "
            f"{settings} no longer apply; repeat them as overrides to keep them",
            UserWarning,
            stacklevel=4,
        )


def read_config(config: str | Path | None = None, overrides: list[str] | None = None) -> dict[str, Any]:
    """The YAML config (or nothing: the defaults) with the dotted overrides merged in, as a plain nested dict."""
    data: dict[str, Any] = load_yaml(config) if config else {}
    if overrides:
        parsed = parse_overrides(overrides)
        _warn_about_a_new_preset(data.get("model"), parsed.get("model"))
        data = deep_merge(data, parsed)
    return data
