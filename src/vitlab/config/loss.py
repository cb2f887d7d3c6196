"""The ``loss`` section of a run config, checked against the task that trains the preset's class: a family's
``config_types["loss"]`` dataclass (``vitlab.family``), :class:`ClassificationLossConfig` for every other model.

The section holds the keys the config sets (the task builds its dataclass from them, the defaults filling the rest),
each checked and typed by that dataclass, its own checks included. A key of another declared task's loss is kept,
typed by that task, and left unused: one protocol file serves several models (``configs/compare``: CET-ViT and the
baselines it is measured against share the ``loss`` section, which only CET-ViT reads). A key no task has is refused.
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass
from typing import Any

from vitlab.config.coerce import build_section, from_dict, unknown_key_error
from vitlab.config.model import family_of_class_name
from vitlab.errors import ConfigError
from vitlab.family import families


@dataclass
class ClassificationLossConfig:
    """The ``loss`` section of the classification task: it has no key. The cross-entropy's label smoothing is
    ``optim.label_smoothing``; Mixup and CutMix are ``data.augment.mixup_alpha`` and ``cutmix_alpha``."""


def loss_config_type(class_name: str | None) -> type:
    """The loss dataclass of the task for a model class (``dict``: a preset no declaration names, left unchecked)."""
    if class_name is None:
        return dict
    family = family_of_class_name(class_name)
    declared = family.config_type("loss") if family else None
    return declared if declared is not None else ClassificationLossConfig


def check_loss_section(class_name: str | None, values: Any) -> dict[str, Any]:
    """``values`` checked for the task of ``class_name``: its own keys typed and checked by its dataclass, another
    task's keys typed by that one's; an unknown key raises a :class:`~vitlab.errors.ConfigError` that names it and the
    closest valid keys of this task."""
    own = loss_config_type(class_name)
    if not isinstance(values, dict):
        raise ConfigError(f"loss must be a mapping, got {values!r}")
    if not dataclasses.is_dataclass(own):
        return dict(values)
    own_keys = typing.get_type_hints(own)
    foreign = _other_tasks_keys(own)
    for key in values:
        if key not in own_keys and key not in foreign:
            raise unknown_key_error(key, list(own_keys), "loss")
    built = from_dict(own, {k: v for k, v in values.items() if k in own_keys}, "loss")
    return {
        key: getattr(built, key) if key in own_keys else build_section(foreign[key], value, f"loss.{key}")
        for key, value in values.items()
    }


def build_loss(loss_type: type, values: Any) -> Any:
    """The task's loss dataclass ``loss_type`` from a ``loss`` section (checked, :func:`check_loss_section`): its own
    keys, the defaults for the rest; another task's keys are not this task's business."""
    if isinstance(values, loss_type):
        return values
    own_keys = typing.get_type_hints(loss_type)
    foreign = _other_tasks_keys(loss_type)
    return from_dict(loss_type, {k: v for k, v in values.items() if k in own_keys or k not in foreign}, "loss")


def _other_tasks_keys(own: type) -> dict[str, Any]:
    """The keys (and their types) of every other declared task's loss dataclass."""
    keys: dict[str, Any] = {}
    for family in families():
        other = family.config_type("loss")
        if other is not own and other is not None and dataclasses.is_dataclass(other):
            keys |= {k: v for k, v in typing.get_type_hints(other).items() if k not in keys}
    return keys
