"""Every section of a run config checked before anything runs: no torch imported, no folder created.

``build_config`` calls :func:`check_sections` after the dataclasses of the sections are built (``dynamics`` is
:class:`~vitlab.config.dynamics.DynamicsConfig`): the dataset's name (``data``), the preset and its options
(``model``, against :mod:`vitlab.model_catalogue`), and the family's ``loss`` dataclass (``vitlab.family``). The model's
option values and the data's files are checked where they are used; a typo in a key or a name is caught here.
"""

from __future__ import annotations

import difflib
from typing import TYPE_CHECKING

from vitlab.config.coerce import from_dict
from vitlab.data.config import check_dataset_name
from vitlab.errors import ConfigError, ModelOptionError, UnknownModelError
from vitlab.family import BUILTIN_FAMILIES, Family, families
from vitlab.model_catalogue import MODEL_OPTIONS, PRESET_CLASSES

if TYPE_CHECKING:
    from vitlab.config import RunConfig

#: model keys that are no constructor option
MODEL_KEYS = ("name", "pretrained")


def check_sections(cfg: RunConfig) -> None:
    """Raise a :class:`~vitlab.errors.VitlabError` naming the first section of ``cfg`` with an unknown key or name."""
    check_dataset_name(cfg.data.name)
    model_class = check_model_section(cfg.model)
    family = family_of_class_name(model_class) if model_class else None
    loss_type = family.config_type("loss") if family else None
    if loss_type is not None:
        try:
            from_dict(loss_type, cfg.loss, "loss")
        except ValueError as error:  # a family dataclass's own check
            raise ConfigError(str(error)) from None


def check_model_section(model: dict) -> str | None:
    """The class name of the preset ``model["name"]`` after checking its options; None for a preset the catalogue
    does not know while a family outside vitlab is declared (the registry checks it when the model is built)."""
    name = model["name"]
    if name not in PRESET_CLASSES:
        if any(family.name not in _builtin_names() for family in families()):
            return None
        close = difflib.get_close_matches(name, list(PRESET_CLASSES), n=3)
        hint = f" Did you mean {', '.join(close)}?" if close else ""
        raise UnknownModelError(f"unknown model {name!r}.{hint} `vitlab list-models` prints every registered model.")
    cls = PRESET_CLASSES[name]
    valid = MODEL_OPTIONS[cls]
    for key in model:
        if key not in valid and key not in MODEL_KEYS:
            close = difflib.get_close_matches(key, list(valid), n=3)
            hint = f" Did you mean {', '.join(close)}?" if close else ""
            raise ModelOptionError(
                f"model {name!r} ({cls}) has no option {key!r}.{hint} Valid options: {', '.join(sorted(valid))}"
            )
    return cls


def family_of_class_name(class_name: str) -> Family | None:
    """The family that declares a model class of this name (from the declaration alone: no model is imported)."""
    for family in families():
        names = [ref.rpartition(":")[2] if isinstance(ref, str) else ref.__name__ for ref in family.models]
        if class_name in names:
            return family
    return None


def _builtin_names() -> set[str]:
    return {module.rpartition(".")[2] for module in BUILTIN_FAMILIES}
