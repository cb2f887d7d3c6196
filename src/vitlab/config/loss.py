"""The ``loss`` section of a run config, typed by the task that trains the preset's class: a family's
``config_types["loss"]`` (``vitlab.family``), :class:`ClassificationLossConfig` for every other model."""

from __future__ import annotations

from dataclasses import dataclass

from vitlab.config.model import family_of_class_name


@dataclass
class ClassificationLossConfig:
    """The ``loss`` section of the classification task: it has no key. The cross-entropy's label smoothing is
    ``optim.label_smoothing``; Mixup and CutMix are ``data.augment.mixup_alpha`` and ``cutmix_alpha``."""


def loss_config_type(class_name: str | None) -> type:
    """The type of the ``loss`` section for a model class (``None``: a preset no declaration names, left unchecked)."""
    if class_name is None:
        return dict
    family = family_of_class_name(class_name)
    if family is None:
        return ClassificationLossConfig
    declared = family.config_type("loss")
    return declared if declared is not None else ClassificationLossConfig
