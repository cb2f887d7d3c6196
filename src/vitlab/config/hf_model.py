"""``model.name=hf:TYPE`` and ``hf:PATH`` in a config, torch-free: HF transformers' image classifiers by the
``model_type`` of their config class (``hf:vit``, ``hf:dinov2``, ``hf:swin``), or the ``save_pretrained`` folder of
one on this disk. A folder is read as its ``model_type`` with ``model.pretrained=PATH`` (:func:`hf_section`), so the
run records a name that rebuilds without the folder; the model is built by :mod:`vitlab.models.hf_models`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from vitlab.errors import ConfigError, UnknownModelError

#: ``model.name=hf:TYPE``: transformers' ``AutoModelForImageClassification`` of config class ``TYPE``
HF_PREFIX = "hf:"
#: the class name the config check gives an HF model (its class is known once transformers builds it)
HF_CLASS = "hf"


def is_path(text: str) -> bool:
    """Whether ``hf:TEXT`` names a folder rather than a ``model_type`` (which has no slash and no leading dot)."""
    return "/" in text or text.startswith((".", "~")) or Path(text).expanduser().is_dir()


def check_hf_name(name: str) -> None:
    """``hf:`` names something."""
    if not name.removeprefix(HF_PREFIX):
        raise UnknownModelError(
            f"model.name={name} names no HF transformers model; write hf:TYPE (e.g. hf:vit, hf:dinov2, hf:swin) or "
            "hf:PATH (a save_pretrained folder)"
        )


def hf_folder(path: str | Path) -> tuple[Path, dict[str, Any]]:
    """A ``save_pretrained`` folder and its ``config.json``; one line when it is not one (no hub is asked)."""
    folder = Path(path).expanduser().absolute()
    if not folder.is_dir():
        raise ConfigError(
            f"{path} is no folder on this disk, and vitlab never downloads from the HF hub; save the model with "
            "save_pretrained(FOLDER) on a machine with the hub and pass model.name=hf:FOLDER"
        )
    config = folder / "config.json"
    try:
        found = json.loads(config.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ConfigError(
            f"{folder} has no readable config.json ({type(e).__name__}); pass a folder written by save_pretrained"
        ) from e
    if not isinstance(found, dict) or not isinstance(found.get("model_type"), str):
        raise ConfigError(f"{config} names no model_type; pass a folder written by an HF model's save_pretrained")
    return folder, found


def hf_section(section: dict[str, Any]) -> dict[str, Any]:
    """``{name: hf:PATH}`` -> ``{name: hf:<its model_type>, pretrained: PATH}``; any other section as it is."""
    source = section["name"].removeprefix(HF_PREFIX)
    if not is_path(source):
        return section
    if section.get("pretrained"):
        raise ConfigError(
            f"model.name=hf:{source} names a folder of weights and model.pretrained={section['pretrained']} others; "
            "set one of them"
        )
    folder, config = hf_folder(source)
    return {**section, "name": HF_PREFIX + config["model_type"], "pretrained": str(folder)}
