"""The ``model`` section of a run config and the options of each model class, defined once, torch-free.

A model class's options are one frozen dataclass (:class:`VisionTransformerOptions`, :class:`SwinTransformerOptions`
here; a family's in its ``config_types["model"]``): its fields, with their types and defaults, are the constructor's
keyword arguments (:func:`takes_options` gives the class that signature, and the constructor builds the dataclass,
whose ``__post_init__`` checks the values), the keys and types the config check accepts, and the options that
``vitlab list-models`` and the catalogue name. The section itself holds only the keys the config sets (a key it does
not set takes the preset's value): ``{name: <preset>, pretrained: <weights>, **options}``.
"""

from __future__ import annotations

import dataclasses
import difflib
import inspect
import os
import typing
from collections.abc import Callable
from typing import Any, Literal, NotRequired, TypedDict, TypeVar

from vitlab.config.coerce import typed_mapping
from vitlab.config.hf_model import HF_CLASS, HF_PREFIX, check_hf_name, hf_section
from vitlab.errors import ConfigError, FamilyError, ModelOptionError, UnknownModelError
from vitlab.family import NO_PLUGINS_ENV, Family, families, presets

#: model keys that are no constructor option
MODEL_KEYS = ("name", "pretrained")
#: ``model.name=timm:NAME``: timm's model ``NAME``, built by ``timm.create_model`` with the section's other keys
#: (:mod:`vitlab.models.timm_models`), which timm checks when the model is built, before the run folder exists
TIMM_PREFIX = "timm:"
#: the class name the config check gives a timm model (its class is known once timm builds it)
TIMM_CLASS = "timm"
#: ``model.name=tv:NAME``: torchvision's classifier ``NAME`` (:mod:`vitlab.models.tv_models`), checked as timm's
TV_PREFIX = "tv:"
#: the class name the config check gives a torchvision model
TV_CLASS = "torchvision"
#: model options that count or size something (an int, or one int per stage): each must be at least 1, since a
#: zero-depth or zero-width model trains and predicts while it ignores its input
SIZE_OPTIONS = (
    "img_size",
    "patch_size",
    "in_chans",
    "embed_dim",
    "embed_dims",
    "depth",
    "depths",
    "num_heads",
    "window_size",
)
#: dropout probabilities, each in [0, 1]
RATE_OPTIONS = ("drop_rate", "attn_drop_rate", "drop_path_rate")
#: the attention temperature's two forms (:class:`vitlab.layers.attention.Attention`)
TemperatureForm = Literal["inverse", "divide"]
M = TypeVar("M", bound=type)


class ModelConfig(TypedDict):
    """What every ``model`` section holds besides options: the preset (``vitlab list-models``) and, optionally,
    weights to start from (``timm:NAME``, a run directory or a file; docs/recipes.md, "Pretrained weights and
    fine-tuning")."""

    name: str
    pretrained: NotRequired[str | None]


def check_patch_grid(img_size: int, patch_size: int) -> int:
    """Number of patches per side; a clear error when the image does not tile into patches."""
    if img_size % patch_size != 0:
        raise ConfigError(
            f"image size {img_size} is not divisible by the patch size {patch_size}; set model.patch_size to a "
            f"divisor of {img_size} (e.g. {', '.join(str(p) for p in range(1, img_size + 1) if img_size % p == 0)}) "
            "or resize the data with data.img_size"
        )
    return img_size // patch_size


def check_choices(options: Any) -> None:
    """Every ``Literal`` field of the options dataclass holds one of its values (what the config check does for a
    section read from YAML, here for a model built in Python)."""
    for name, tp in typing.get_type_hints(type(options)).items():
        value = getattr(options, name)
        if typing.get_origin(tp) is Literal and value not in typing.get_args(tp):
            raise ValueError(f"{name} must be one of {', '.join(map(str, typing.get_args(tp)))}, got {value!r}")


@dataclasses.dataclass(frozen=True, kw_only=True)
class ImageModelOptions:
    """What every image model takes: the input and the classes. ``__post_init__`` checks the patch grid and the
    ``Literal`` options; a subclass that adds checks calls it."""

    img_size: int = 32
    patch_size: int = 4
    in_chans: int = 3
    num_classes: int = 10

    def __post_init__(self) -> None:
        check_option_values(vars(self))
        check_patch_grid(self.img_size, self.patch_size)
        check_choices(self)

    @property
    def grid(self) -> int:
        """Patches per side."""
        return self.img_size // self.patch_size


@dataclasses.dataclass(frozen=True, kw_only=True)
class ViTEncoderOptions(ImageModelOptions):
    """A ViT encoder's (the plain ViT's, ToMe's and ViTCAE's). ``temperature``: a learnable per-head temperature
    (tau) in every attention; its default says whether the class's attention has one when the config does not set it
    (:func:`has_temperature`)."""

    embed_dim: int = 192
    depth: int = 12
    num_heads: int = 3
    mlp_ratio: float = 4.0
    qkv_bias: bool = True
    drop_rate: float = 0.0
    attn_drop_rate: float = 0.0
    drop_path_rate: float = 0.0
    temperature: bool = False
    temperature_form: TemperatureForm = "inverse"


@dataclasses.dataclass(frozen=True, kw_only=True)
class VisionTransformerOptions(ViTEncoderOptions):
    """Options of :class:`vitlab.models.vit.VisionTransformer` (and the ToMe presets): ``global_pool``, the head's
    pooling; ``tome_r``, tokens merged per block by Token Merging (0: the plain ViT); ``dynamic_img_size``, any input
    size that tiles into patches."""

    global_pool: Literal["token", "avg"] = "token"
    tome_r: int = 0
    dynamic_img_size: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.tome_r < 0:
            raise ValueError(f"tome_r (tokens merged per block) must be >= 0, got {self.tome_r}")
        if self.tome_r > 0 and self.global_pool != "token":
            raise ValueError(
                "Token Merging (tome_r > 0) needs global_pool='token': merged tokens stand for different numbers of "
                "patches, so a plain mean over them is not the image mean; set global_pool='token' or tome_r=0"
            )


@dataclasses.dataclass(frozen=True, kw_only=True)
class SwinTransformerOptions(ImageModelOptions):
    """Options of :class:`vitlab.models.swin.SwinTransformer`: ``depths`` and ``num_heads`` give one entry per stage,
    stage ``i`` of width ``embed_dim * 2**i``."""

    patch_size: int = 2
    embed_dim: int = 96
    depths: tuple[int, ...] = (2, 2, 6, 2)
    num_heads: tuple[int, ...] = (3, 6, 12, 24)
    window_size: int = 4
    mlp_ratio: float = 4.0
    qkv_bias: bool = True
    drop_rate: float = 0.0
    attn_drop_rate: float = 0.0
    drop_path_rate: float = 0.0
    global_pool: Literal["avg", ""] = "avg"
    dynamic_img_size: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        if len(self.depths) != len(self.num_heads):
            raise ValueError(
                f"depths and num_heads give one entry per stage and must have the same length, got "
                f"{len(self.depths)} and {len(self.num_heads)}"
            )
        for stage, heads in enumerate(self.num_heads):
            width = self.embed_dim * 2**stage
            if width % heads != 0:
                raise ValueError(
                    f"stage {stage} has width {width} (embed_dim * 2**{stage}), not divisible by its {heads} heads; "
                    "choose embed_dim or num_heads so that every stage width is a multiple of its head count"
                )


#: the core's model classes -> their options
CORE_MODEL_OPTIONS: dict[str, type] = {
    "VisionTransformer": VisionTransformerOptions,
    "SwinTransformer": SwinTransformerOptions,
}


def takes_options(options: type) -> Callable[[M], M]:
    """Class decorator: the model class's constructor takes the fields of the dataclass ``options`` as its keyword
    arguments. Sets ``cls.options_type`` and the signature that ``inspect``, timm and an editor's help show; the
    constructor itself takes ``**options`` and builds ``options(**options)``, which checks them."""

    def decorate(cls: M) -> M:
        parameters = [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
        hints = typing.get_type_hints(options)
        for f in dataclasses.fields(options):
            kind = inspect.Parameter.KEYWORD_ONLY
            parameters.append(inspect.Parameter(f.name, kind, default=f.default, annotation=hints[f.name]))
        cls.__init__.__signature__ = inspect.Signature(parameters, return_annotation=None)
        cls.options_type = options
        return cls

    return decorate


def catalogue() -> dict[str, tuple[str, str]]:
    """Every preset, torch-free: the one namespace of the core's table (:mod:`vitlab.model_catalogue`) and each
    family's (``Family.presets``, :func:`vitlab.family.presets`): preset name -> (model class name, description)."""
    return {name: (row.model, row.description) for name, (_, row) in presets().items()}


def model_options_type(class_name: str) -> type | None:
    """The options dataclass of a model class: the core's or its family's ``config_types["model"]``; None for a
    class that declares none (whose section then takes no option)."""
    if class_name in CORE_MODEL_OPTIONS:
        return CORE_MODEL_OPTIONS[class_name]
    family = family_of_class_name(class_name)
    declared = family.config_type("model") if family else None
    if declared is not None and not dataclasses.is_dataclass(declared):
        raise FamilyError(
            f"family {family.name!r} declares config_types['model'] = {declared!r}, which is no dataclass: an error in "
            "the family; declare the model's options as one frozen dataclass (docs/writing_a_family.md)"
        )
    return declared


def model_options(class_name: str) -> tuple[str, ...]:
    """The constructor options of a model class: the fields of its options dataclass."""
    options = model_options_type(class_name)
    return tuple(f.name for f in dataclasses.fields(options)) if options is not None else ()


def unknown_model(name: str, known: typing.Iterable[str]) -> UnknownModelError:
    """The one-line error for a model name no preset has: the closest names, and whether plug-ins are switched off
    (their presets are then unknown too)."""
    close = difflib.get_close_matches(name, list(known), n=3)
    hint = f" Did you mean {', '.join(close)}?" if close else ""
    if os.environ.get(NO_PLUGINS_ENV, "") not in ("", "0"):
        off = f"{NO_PLUGINS_ENV}={os.environ[NO_PLUGINS_ENV]}"
        hint += f" Plug-ins are switched off ({off}): a plug-in's model needs it unset."
    return UnknownModelError(f"unknown model {name!r}.{hint} `vitlab list-models` prints every registered model.")


def model_class_name(model: Any) -> str:
    """The class name of the preset ``model["name"]``, after checking the section's keys (each an option of that class,
    or ``name`` / ``pretrained``).

    Raises :class:`~vitlab.errors.UnknownModelError` or :class:`~vitlab.errors.ModelOptionError`, each naming the
    closest valid names.
    """
    if not isinstance(model, dict) or "name" not in model:
        raise ConfigError("config section 'model' needs a 'name' (a preset from `vitlab list-models`)")
    name = model["name"]
    if not isinstance(name, str):
        why = " (YAML reads `timm:` with nothing after it as a mapping)" if isinstance(name, dict) else ""
        raise UnknownModelError(
            f"model.name must be a preset's name, got {name!r}{why}; name a preset from `vitlab list-models`, or "
            "timm's model as timm:NAME (e.g. timm:deit_tiny_patch16_224)"
        )
    if name.startswith(TIMM_PREFIX):
        check_timm_name(name)
        return TIMM_CLASS
    if name.startswith(TV_PREFIX):
        return TV_CLASS
    if name.startswith(HF_PREFIX):
        check_hf_name(name)
        return HF_CLASS
    presets = catalogue()
    if name not in presets:
        raise unknown_model(str(name), presets)
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


def check_timm_name(name: str) -> None:
    """``timm:NAME`` names an architecture, torch-free: not empty, and without a weights tag (``NAME.TAG``, which
    ``model.name`` would build with random weights; weights come through ``model.pretrained``)."""
    arch = name.removeprefix(TIMM_PREFIX)
    if not arch:
        raise UnknownModelError(
            f"model.name={name} names no timm model; write timm:NAME (e.g. timm:deit_tiny_patch16_224; "
            "`timm.list_models()` lists every model)"
        )
    if "." in arch:
        base, tag = arch.split(".", 1)
        raise ConfigError(
            f"model.name={name} names timm's weights {tag!r}, but model.name builds the architecture with random "
            f"weights; set model.name={TIMM_PREFIX}{base} and model.pretrained={name} to start from those weights"
        )


def model_section(model: Any) -> dict[str, Any]:
    """The checked ``model`` section: the preset and its keys (:func:`model_class_name`), each value of its option's
    type (tuples for lists), each size at least 1."""
    class_name = model_class_name(model)
    preset = {key: model[key] for key in MODEL_KEYS if key in model}
    options = {key: value for key, value in model.items() if key not in MODEL_KEYS}
    section = typed_mapping(ModelConfig, preset, "model")
    if options and class_name in (TIMM_CLASS, TV_CLASS, HF_CLASS):
        section |= options
    elif options:
        section |= typed_mapping(model_options_type(class_name), options, "model")
    check_model_sizes(section)
    return hf_section(section) if class_name == HF_CLASS else section


def has_temperature(model: dict[str, Any]) -> bool | None:
    """Whether the attention of the model a checked ``model`` section builds has a temperature (tau), torch-free:
    ``model.temperature`` where the section sets it, else the default of its class's ``temperature`` option; None for a
    class without that option (left to ``DynamicsPolicy.check`` on the built model)."""
    if "temperature" in model:
        return bool(model["temperature"])
    if model["name"].startswith((TIMM_PREFIX, TV_PREFIX, HF_PREFIX)):
        return False
    options = model_options_type(catalogue()[model["name"]][0])
    fields = {f.name: f.default for f in dataclasses.fields(options)} if options is not None else {}
    return bool(fields["temperature"]) if "temperature" in fields else None


def _refuse(key: str, value: Any, rule: str, fix: str) -> None:
    shown = list(value) if isinstance(value, tuple) else value
    raise ConfigError(f"model.{key} must be {rule}, got {shown}; set model.{key} to {fix}")


def check_option_values(options: dict[str, Any]) -> None:
    """The one check of a model's option values, for a config section (the keys it sets) and for every model built
    (the options dataclass's ``__post_init__``, so ``create_model``, timm's builder and ``load_model`` refuse what
    the config check refuses, in the same words): each size (:data:`SIZE_OPTIONS`) at least 1, ``mlp_ratio``
    above 0, each dropout rate (:data:`RATE_OPTIONS`) in [0, 1], ``num_classes`` at least 0 (0: no classifier, as
    timm's ``num_classes=0``). Raises :class:`ConfigError` naming the option."""
    for key in SIZE_OPTIONS:
        value = options.get(key)
        if any(isinstance(v, int) and v < 1 for v in (value if isinstance(value, list | tuple) else [value])):
            _refuse(key, value, "at least 1", "a positive size")
    ratio = options.get("mlp_ratio")
    if isinstance(ratio, int | float) and not ratio > 0:
        _refuse("mlp_ratio", ratio, "above 0", "a positive ratio (4.0 in ViT-B)")
    for key in RATE_OPTIONS:
        rate = options.get(key)
        if isinstance(rate, int | float) and not 0 <= rate <= 1:
            _refuse(key, rate, "in [0, 1]", "a probability")
    classes = options.get("num_classes")
    if isinstance(classes, int) and classes < 0:
        _refuse("num_classes", classes, "at least 0", "0 (no classifier) or more")


def check_model_sizes(model: dict[str, Any]) -> None:
    """The option values a ``model`` section sets (:func:`check_option_values`), and ``num_classes`` at least 1: a
    run trains a classifier. Raises :class:`ConfigError`."""
    check_option_values(model)
    classes = model.get("num_classes")
    if isinstance(classes, int) and classes < 1:
        _refuse("num_classes", classes, "at least 1", "a positive size")


def family_of_class_name(class_name: str) -> Family | None:
    """The family that declares a model class of this name (from the declaration alone: no model is imported)."""
    return next((family for family in families() if class_name in family.model_class_names()), None)
