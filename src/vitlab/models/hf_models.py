"""HF transformers' image classifiers by name (``model.name=hf:TYPE``): ``AutoModelForImageClassification`` built
from the config class of ``model_type`` TYPE (``transformers.CONFIG_MAPPING``, e.g. ``hf:vit``, ``hf:deit``,
``hf:dinov2``, ``hf:swin``) with the ``model`` section's keys, random weights, wrapped in :class:`HFImageClassifier`,
whose forward returns the logits tensor: Lightning, the export (safetensors, ONNX) and the probes see a plain
classifier. The keys are the config class's own keyword arguments, or vitlab's names for them (:data:`ALIASES`).
Weights of a ``save_pretrained`` folder are :mod:`vitlab.models.hf_weights`'s. transformers is imported when a model
is built, never with vitlab, and nothing here asks the hub. docs/foreign_models.md says what each command does.
"""

from __future__ import annotations

import difflib
import functools
import inspect
from typing import Any

import torch
from torch import nn

from vitlab.config.hf_model import HF_PREFIX, is_path
from vitlab.config.model import check_patch_grid
from vitlab.errors import ConfigError, ModelOptionError, UnknownModelError
from vitlab.layers.head_steering import TEMPERATURE_OPTIONS, take_temperature

#: vitlab's option names -> transformers' config keys, for a config class that has the key but not vitlab's name
ALIASES = {
    "img_size": "image_size",
    "patch_size": "patch_size",
    "in_chans": "num_channels",
    "num_classes": "num_labels",
    "depth": "num_hidden_layers",
    "embed_dim": "hidden_size",
    "num_heads": "num_attention_heads",
}
#: the options vitlab fills in from the data
DATA_OPTIONS = ("img_size", "in_chans", "num_classes")
#: keyword arguments of every config class that say nothing of the network (they are not model options)
NOT_OPTIONS = frozenset(
    (
        "transformers_version",
        "architectures",
        "output_hidden_states",
        "return_dict",
        "dtype",
        "chunk_size_feed_forward",
        "is_encoder_decoder",
        "id2label",
        "label2id",
        "problem_type",
    )
)


class HFImageClassifier(nn.Module):
    """An HF transformers image classifier (``hf``) as a plain one: ``forward(x: [B, C, H, W]) -> logits [B, K]``.

    ``grid_size`` and ``num_prefix_tokens`` (the CLS token, DeiT's distillation token, Dinov2's registers; none
    without a CLS token) tell the dynamics probe the token layout; ``pretrained_cfg`` is timm's contract (the run
    writes the data's mean and std into it)."""

    def __init__(self, hf: nn.Module) -> None:
        super().__init__()
        self.hf = hf
        config = hf.config
        chans, size, patch = (getattr(config, k, None) for k in ("num_channels", "image_size", "patch_size"))
        self.num_classes = config.num_labels
        if any(
            hasattr(module, "cls_token") for module in hf.modules()
        ):  # DeiT's distillation token, Dinov2's registers
            extra = (config.model_type == "deit") + (getattr(config, "num_register_tokens", 0) or 0)
            self.num_prefix_tokens = 1 + extra
        if isinstance(size, int) and isinstance(patch, int):
            self.grid_size = (size // patch, size // patch)
        self.pretrained_cfg = {
            "mean": (0.5,) * (chans or 3),
            "std": (0.5,) * (chans or 3),
            "classifier": "hf.classifier",
        }

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.hf(pixel_values=x).logits


@functools.cache
def classifier_types() -> tuple[str, ...]:
    """transformers' ``model_type`` names that have an ``AutoModelForImageClassification``."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES

    return tuple(sorted(MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES))


def hf_model_type(name: str) -> str:
    """``hf:TYPE`` -> ``TYPE``, or an :class:`UnknownModelError` that names transformers' closest classifiers."""
    from transformers import CONFIG_MAPPING

    model_type = name.removeprefix(HF_PREFIX)
    if is_path(model_type):
        raise ConfigError(
            f"{name} names a folder; build its model_type with its weights: "
            f"create_model('hf:TYPE', pretrained={model_type!r}) (in a config, model.name={name} does this)"
        )
    if model_type not in classifier_types():
        close = difflib.get_close_matches(model_type, classifier_types(), n=3)
        hint = f" Did you mean {', '.join(HF_PREFIX + c for c in close)}?" if close else ""
        what = "has no image classifier" if model_type in CONFIG_MAPPING else "has no model_type"
        raise UnknownModelError(
            f"transformers {what} {model_type!r}.{hint} The image classifiers: "
            f"{', '.join(classifier_types())} (hf:TYPE, or hf:PATH for a save_pretrained folder)"
        )
    return model_type


@functools.cache
def option_names(model_type: str) -> dict[str, str]:
    """``{option: config key}`` for ``hf:TYPE``: the config class's keyword arguments about the network, and vitlab's
    name (:data:`ALIASES`) for each of them that the class names otherwise."""
    from transformers import CONFIG_MAPPING

    parameters = inspect.signature(CONFIG_MAPPING[model_type].__init__).parameters.values()
    names = {p.name: p.name for p in parameters if p.kind is p.KEYWORD_ONLY and not p.name.startswith("_")}
    names = {k: v for k, v in names.items() if k not in NOT_OPTIONS} | {"num_labels": "num_labels"}
    return names | {alias: key for alias, key in ALIASES.items() if key in names and alias not in names}


def data_options(name: str) -> tuple[str, ...]:
    """The options of :data:`DATA_OPTIONS` that ``hf:TYPE`` takes from the data."""
    names = option_names(hf_model_type(name))
    return tuple(k for k in DATA_OPTIONS if k in names)


def hf_config(model_type: str, options: dict[str, Any]) -> Any:
    """The config of ``hf:TYPE`` with ``options``, each refused by name where the class has no such key."""
    from transformers import CONFIG_MAPPING

    cls, names, mapped = CONFIG_MAPPING[model_type], option_names(model_type), {}
    for key, value in options.items():
        if key not in names:
            close = difflib.get_close_matches(key, list(names), n=3)
            hint = f" Did you mean {', '.join(close)}?" if close else ""
            alias = f" ({ALIASES[key]})" if key in ALIASES else ""
            raise ModelOptionError(
                f"transformers' {cls.__name__} (hf:{model_type}) has no option {key!r}{alias}.{hint} Its options: "
                f"{', '.join(sorted(names))}"
            )
        if names[key] in mapped:
            raise ModelOptionError(f"model.{key} and another model key both set {cls.__name__}.{names[key]}; set one")
        mapped[names[key]] = value
    try:
        config = cls(**mapped)
    except (TypeError, ValueError) as e:
        raise ConfigError(f"transformers' {cls.__name__} refuses {options}: {e}; fix the model.* keys") from e
    size, patch = getattr(config, "image_size", None), getattr(config, "patch_size", None)
    if isinstance(size, int) and isinstance(patch, int):
        check_patch_grid(size, patch)
    return config


def create_hf_model(name: str, **options: Any) -> HFImageClassifier:
    """transformers' image classifier ``hf:TYPE`` with random weights, built from its config with ``options``."""
    from transformers import AutoModelForImageClassification
    from transformers.models.auto.modeling_auto import MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES as CLASSES

    model_type = hf_model_type(name)
    own = {key: options.pop(key) for key in TEMPERATURE_OPTIONS if key in options}
    config = hf_config(model_type, options)
    names = CLASSES[model_type]  # DeiT's: the plain classifier and the one with a distillation head, in that order
    config.architectures = [names if isinstance(names, str) else names[0]]
    try:
        model = AutoModelForImageClassification.from_config(config)
    except (ValueError, RuntimeError, AssertionError, TypeError, ZeroDivisionError) as e:
        raise ConfigError(f"transformers cannot build hf:{model_type} with {options}: {e}; fix the model.* keys") from e
    wrapped = HFImageClassifier(model)
    take_temperature(wrapped, own, f"hf:{model_type}")
    return wrapped


def folder_options(model_type: str, config: dict[str, Any]) -> dict[str, Any]:
    """The options of a ``save_pretrained`` folder's ``config.json`` (what it sets about the network), in vitlab's
    names where ``hf:TYPE`` has them; not the data's (:data:`DATA_OPTIONS`): the classifier is re-sized to its
    classes, and an image size or channel count of its own is refused when the weights are loaded."""
    names = option_names(model_type)
    ours = {key: option for option, key in names.items()}  # the aliases come last: vitlab's name wins
    return {ours[k]: v for k, v in config.items() if k in ours and ours[k] not in DATA_OPTIONS}
