"""The ``model`` section of a run config, typed: a preset's name, its weights, and the constructor options the config
changes, checked against the preset's class before anything imports torch.

The section is a ``TypedDict`` (every key optional but ``name``), not a dataclass with defaults: a key the config does
not set takes the preset's value, so the section holds exactly the keys it sets. Each model class has its own type:
:class:`VisionTransformerConfig` and :class:`SwinTransformerConfig` here, a family's in its ``config_types["model"]``
(``vitlab.family``). ``tests/config/test_model_section.py`` keeps every type equal to its constructor's keywords.
"""

from __future__ import annotations

import difflib
import typing
from typing import Any, Literal, NotRequired, TypedDict

from vitlab.errors import ConfigError, ModelOptionError, UnknownModelError
from vitlab.family import Family, families
from vitlab.model_catalogue import PRESETS

#: model keys that are no constructor option
MODEL_KEYS = ("name", "pretrained")
#: model options that count or size something (an int, or one int per stage): each must be at least 1, since a
#: zero-depth or zero-width model trains and predicts while it ignores its input
SIZE_OPTIONS = (
    "img_size",
    "patch_size",
    "in_chans",
    "num_classes",
    "embed_dim",
    "depth",
    "depths",
    "num_heads",
    "window_size",
)


class ModelConfig(TypedDict):
    """What every ``model`` section holds: the preset (``vitlab list-models``) and, optionally, weights to start from
    (``timm:NAME``, a run directory or a file; docs/recipes.md, "Pretrained weights and fine-tuning")."""

    name: str
    pretrained: NotRequired[str | None]


class ImageModelConfig(ModelConfig, total=False):
    """What every image model's section may set: the input and the classes."""

    img_size: int
    patch_size: int
    in_chans: int
    num_classes: int


class ViTEncoderConfig(ImageModelConfig, total=False):
    """The options of a ViT encoder (the plain ViT's, ToMe's and ViTCAE's)."""

    embed_dim: int
    depth: int
    num_heads: int
    mlp_ratio: float
    qkv_bias: bool
    drop_rate: float
    attn_drop_rate: float
    drop_path_rate: float
    temperature: bool
    temperature_form: Literal["inverse", "divide"]


class VisionTransformerConfig(ViTEncoderConfig, total=False):
    """Options of :class:`vitlab.models.vit.VisionTransformer` (and the ToMe presets)."""

    global_pool: Literal["token", "avg"]
    tome_r: int
    dynamic_img_size: bool


class SwinTransformerConfig(ImageModelConfig, total=False):
    """Options of :class:`vitlab.models.swin.SwinTransformer`: ``depths`` and ``num_heads`` give one entry per stage."""

    embed_dim: int
    depths: list[int]
    num_heads: list[int]
    window_size: int
    mlp_ratio: float
    qkv_bias: bool
    drop_rate: float
    attn_drop_rate: float
    drop_path_rate: float
    global_pool: Literal["avg", ""]
    dynamic_img_size: bool


#: the core's model classes with a ``temperature`` option -> its default: whether their attention has a temperature
#: (tau) when the config does not set ``model.temperature`` (a family declares its own in ``Family.temperature``)
CORE_TEMPERATURE_DEFAULTS: dict[str, bool] = {"VisionTransformer": False}

#: the core's model classes -> the type of their ``model`` section
CORE_MODEL_CONFIGS: dict[str, type] = {
    "VisionTransformer": VisionTransformerConfig,
    "SwinTransformer": SwinTransformerConfig,
}


def catalogue() -> dict[str, tuple[str, str]]:
    """Every preset, torch-free: the core's (:data:`vitlab.model_catalogue.PRESETS`) and each family's
    (``Family.presets``): preset name -> (model class name, description)."""
    return {**PRESETS, **{name: row for family in families() for name, row in family.catalogue().items()}}


def model_options(class_name: str) -> tuple[str, ...]:
    """The constructor options of a model class: the keys of its ``model`` section type (none if it declares none)."""
    section = model_config_type(class_name)
    return tuple(key for key in typing.get_type_hints(section) if key not in MODEL_KEYS) if section is not dict else ()


def model_class_name(model: Any) -> str:
    """The class name of the preset ``model["name"]``, after checking the section's keys (each an option of that class,
    or ``name`` / ``pretrained``).

    Raises :class:`~vitlab.errors.UnknownModelError` or :class:`~vitlab.errors.ModelOptionError`, each naming the
    closest valid names.
    """
    if not isinstance(model, dict) or "name" not in model:
        raise ConfigError("config section 'model' needs a 'name' (a preset from `vitlab list-models`)")
    name = model["name"]
    presets = catalogue()
    if name not in presets:
        close = difflib.get_close_matches(str(name), list(presets), n=3)
        hint = f" Did you mean {', '.join(close)}?" if close else ""
        raise UnknownModelError(f"unknown model {name!r}.{hint} `vitlab list-models` prints every registered model.")
    cls = presets[name][0]
    valid = model_options(cls)
    for key in model:
        if key not in valid and key not in MODEL_KEYS:
            close = difflib.get_close_matches(key, list(valid), n=3)
            hint = f" Did you mean {', '.join(close)}?" if close else ""
            raise ModelOptionError(
                f"model {name!r} ({cls}) has no option {key!r}.{hint} Valid options: {', '.join(sorted(valid))}"
            )
    return cls


def has_temperature(model: dict[str, Any]) -> bool | None:
    """Whether the attention of the model a checked ``model`` section builds has a temperature (tau), torch-free:
    ``model.temperature`` where the section sets it, else its class's declared default
    (:data:`CORE_TEMPERATURE_DEFAULTS`, ``Family.temperature``); None for a class that declares none."""
    if "temperature" in model:
        return bool(model["temperature"])
    class_name = catalogue()[model["name"]][0]
    if class_name in CORE_TEMPERATURE_DEFAULTS:
        return CORE_TEMPERATURE_DEFAULTS[class_name]
    family = family_of_class_name(class_name)
    return family.temperature.get(class_name) if family else None


def check_model_sizes(model: dict[str, Any]) -> None:
    """Every size the ``model`` section sets (:data:`SIZE_OPTIONS`) is at least 1, else a :class:`ConfigError`."""
    for key in SIZE_OPTIONS:
        value = model.get(key)
        values = value if isinstance(value, list) else [value]
        if any(isinstance(v, int) and v < 1 for v in values):
            raise ConfigError(f"model.{key} must be at least 1, got {value}; set model.{key} to a positive size")


def model_config_type(class_name: str) -> type:
    """The type of the ``model`` section for a model class: the core's or its family's ``config_types["model"]``;
    ``dict`` for a class that declares none (whose section then takes no option)."""
    if class_name in CORE_MODEL_CONFIGS:
        return CORE_MODEL_CONFIGS[class_name]
    family = family_of_class_name(class_name)
    declared = family.config_type("model") if family else None
    return declared if declared is not None else dict


def family_of_class_name(class_name: str) -> Family | None:
    """The family that declares a model class of this name (from the declaration alone: no model is imported)."""
    for family in families():
        names = [ref.rpartition(":")[2] if isinstance(ref, str) else ref.__name__ for ref in family.models]
        if class_name in names:
            return family
    return None
