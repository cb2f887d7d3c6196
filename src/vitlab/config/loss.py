"""The ``loss`` section of a run config, checked against the task that trains the preset's class: a family's
``config_types["loss"]`` dataclass (``vitlab.family``), :class:`ClassificationLossConfig` for every other model.

The section holds the keys the config sets (the task builds its dataclass from them, the defaults filling the rest),
each checked and typed by that dataclass, its own checks included. A key the task does not use is refused, another
task's key as well (it would train silently without effect); a config file that changes the model to one of another
task starts the ``loss`` section from a clean slate (``vitlab.config.files.deep_merge``).
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass
from typing import Any

from vitlab.config.coerce import from_dict, unknown_key_error
from vitlab.config.model import family_of_class_name
from vitlab.errors import ConfigError
from vitlab.family import families


@dataclass
class ClassificationLossConfig:
    """The ``loss`` section of the classification task: it has no key. The cross-entropy's label smoothing is
    ``optim.label_smoothing``; Mixup and CutMix are ``data.augment.mixup_alpha`` and ``cutmix_alpha``."""


def loss_config_type(class_name: str) -> type:
    """The loss dataclass of the task for a model class."""
    family = family_of_class_name(class_name)
    declared = family.config_type("loss") if family else None
    return declared if declared is not None else ClassificationLossConfig


def check_loss_section(class_name: str, values: Any) -> dict[str, Any]:
    """``values`` checked for the task of ``class_name``: each key one of its dataclass's, typed and checked by it. A
    key of another task's loss, which this task would not use, or an unknown key raises a
    :class:`~vitlab.errors.ConfigError` that names it and the fix."""
    own = loss_config_type(class_name)
    if not isinstance(values, dict):
        raise ConfigError(f"loss must be a mapping, got {values!r}")
    own_keys = typing.get_type_hints(own)
    for key in values:
        if key not in own_keys:
            owner = next((f.name for f in families() if key in _keys(f.config_type("loss"))), None)
            if owner is None:
                raise unknown_key_error(key, list(own_keys), "loss")
            raise ConfigError(
                f"loss.{key} is not used by the task of {class_name} (the key belongs to the loss of the {owner!r} "
                f"family); remove loss.{key} or choose a model of that family"
            )
    built = from_dict(own, dict(values), "loss")
    return {key: getattr(built, key) for key in values}


def build_loss(loss_type: type, values: Any) -> Any:
    """The task's loss dataclass ``loss_type`` from a ``loss`` section (checked, :func:`check_loss_section`), the
    defaults filling the keys it does not set."""
    return values if isinstance(values, loss_type) else from_dict(loss_type, values, "loss")


def _keys(loss_type: type | None) -> dict[str, Any]:
    return typing.get_type_hints(loss_type) if loss_type is not None and dataclasses.is_dataclass(loss_type) else {}
