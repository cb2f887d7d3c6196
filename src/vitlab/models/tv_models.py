"""torchvision's classifiers by name (``model.name=tv:NAME``): built with the ``model`` section's other keys, and made
to declare what vitlab reads of a model.

``NAME`` is one of ``torchvision.models.list_models(module=torchvision.models)`` (``vit_b_16``, ``swin_t``,
``resnet18``, ...), built by ``torchvision.models.get_model(NAME, weights=None, **options)``. Those constructors fix
their widths and depths (``vit_b_16(patch_size=2)`` is refused), so ``tv:vision_transformer`` and
``tv:swin_transformer`` name the classes themselves (``VisionTransformer``, ``SwinTransformer``) with their own keyword
arguments, for a model of any size. From the data come ``num_classes``, ``img_size`` (torchvision's ``image_size``, for
the ViTs, whose position embedding fixes their input size; the size the others are trained at, recorded for the
export's example input) and ``in_chans``: torchvision's models take RGB, so the
first convolution takes the data's channels with timm's ``adapt_input_conv`` of its weights (a gray image then gives
what the RGB image with three equal channels gave). The model built declares a ``pretrained_cfg`` (its first
convolution and classifier: :func:`vitlab.models.pretrained.load_whole_model` loads a state dict saved by torchvision
into it, the classifier re-initialised for another number of classes) and, for a ViT, its patch grid and one prefix
token (the CLS token), which the dynamics probe reads. docs/foreign_models.md says what each command does with one.
"""

from __future__ import annotations

import difflib
import re
from typing import Any

import torchvision
from timm.models import adapt_input_conv
from torch import nn
from torchvision.models import SwinTransformer, VisionTransformer

from vitlab.config.model import TV_PREFIX, check_patch_grid
from vitlab.errors import ConfigError, ModelOptionError, UnknownModelError
from vitlab.layers.head_steering import TEMPERATURE_OPTIONS, take_temperature

#: the classes by name, for models of any size (torchvision's named constructors fix widths and depths)
CLASSES: dict[str, type[nn.Module]] = {"vision_transformer": VisionTransformer, "swin_transformer": SwinTransformer}


def tv_architecture(name: str) -> str:
    """``tv:NAME`` -> ``NAME``, or an :class:`UnknownModelError` that names torchvision's closest models."""
    arch = name.removeprefix(TV_PREFIX)
    known = [*torchvision.models.list_models(module=torchvision.models), *CLASSES]
    if arch not in known:
        close = difflib.get_close_matches(arch, known, n=3)
        hint = f" Did you mean {', '.join(TV_PREFIX + c for c in close)}?" if close else ""
        raise UnknownModelError(
            f"torchvision has no classifier {arch!r}.{hint} `torchvision.models.list_models(module=torchvision."
            f"models)` lists them; {', '.join(TV_PREFIX + c for c in CLASSES)} take the class's own sizes"
        )
    return arch


def is_vit(arch: str) -> bool:
    return arch == "vision_transformer" or arch.startswith("vit_")


def data_options(name: str) -> tuple[str, ...]:
    """The options torchvision's model ``name`` takes from the data."""
    tv_architecture(name)
    return ("img_size", "in_chans", "num_classes")


def create_tv_model(name: str, img_size: int | None = None, in_chans: int = 3, **options: Any) -> nn.Module:
    """torchvision's model ``name`` (``tv:NAME``) with random weights: ``options`` go to its constructor,
    ``img_size`` as a ViT's ``image_size``, ``in_chans`` to its first convolution (:func:`take_channels`)."""
    arch = tv_architecture(name)
    own = {key: options.pop(key) for key in TEMPERATURE_OPTIONS if key in options}
    check_sizes(options)
    if img_size is not None and is_vit(arch):
        options["image_size"] = img_size
    if is_vit(arch) and "image_size" in options:
        patch = options.get("patch_size", int(arch.rsplit("_", 1)[-1]) if arch != "vision_transformer" else None)
        if isinstance(patch, int):
            check_patch_grid(options["image_size"], patch)
    try:
        model = CLASSES[arch](**options) if arch in CLASSES else torchvision.models.get_model(arch, **options)
    except TypeError as e:
        raise ModelOptionError(_option_problem(arch, options, e)) from e
    except (ValueError, AssertionError, RuntimeError) as e:
        raise ConfigError(
            f"torchvision cannot build {arch} with {options}: {e or type(e).__name__}; fix the model.* keys"
        ) from e
    take_channels(model, in_chans)
    declare(model, arch, img_size)
    take_temperature(model, own, f"tv:{arch}")
    return model


def check_sizes(options: dict[str, Any]) -> None:
    """Every whole-number option of a torchvision constructor but ``num_classes`` counts or sizes something
    (``num_layers``, ``hidden_dim``, ``depths``, ...): at least 1, since torchvision builds a model of no layers that
    trains while it ignores its input."""
    for key, value in options.items():
        values = value if isinstance(value, list | tuple) else [value]
        if key != "num_classes" and any(isinstance(v, int) and not isinstance(v, bool) and v < 1 for v in values):
            shown = list(value) if isinstance(value, tuple) else value
            raise ConfigError(f"model.{key} must be at least 1, got {shown}; set model.{key} to a positive size")


def _option_problem(arch: str, options: dict[str, Any], error: TypeError) -> str:
    """The one line for a ``TypeError`` of torchvision's constructor: an option it does not take, one its name
    fixes, or sizes it needs."""
    unexpected = re.search(r"unexpected keyword argument '(\w+)'", str(error))
    if unexpected:
        return f"torchvision's {arch} does not take model.{unexpected.group(1)} ({error}); remove it"
    fixed = re.search(r"multiple values for keyword argument '(\w+)'", str(error))
    if fixed:
        cls = "vision_transformer" if is_vit(arch) else "swin_transformer" if arch.startswith("swin") else None
        other = f"; {TV_PREFIX}{cls} takes the class's own sizes" if cls else ""
        return f"torchvision's {arch} fixes model.{fixed.group(1)}: remove it{other}"
    missing = re.findall(r"'(\w+)'", str(error)) if "missing" in str(error) else []
    if missing:
        keys = ", ".join(f"model.{key}" for key in missing)
        return f"torchvision's {arch} needs {keys} ({error}); set them"
    return f"torchvision cannot build {arch} with {sorted(options)} ({error}); fix the model.* keys"


def first_conv_name(model: nn.Module) -> str | None:
    """The qualified name of the model's first convolution of RGB images, the one the images enter."""
    return next((n for n, m in model.named_modules() if isinstance(m, nn.Conv2d) and m.in_channels == 3), None)


def classifier_name(model: nn.Module) -> str | None:
    """The qualified name of the model's last linear layer, its classifier (``heads.head``, ``head``, ``fc``)."""
    return next((n for n, m in reversed(list(model.named_modules())) if isinstance(m, nn.Linear)), None)


def take_channels(model: nn.Module, in_chans: int) -> None:
    """Rebuild the first convolution of ``model`` for ``in_chans`` channels, its weights adapted from RGB by
    ``adapt_input_conv`` (timm: summed for one channel, repeated and rescaled for more)."""
    name = first_conv_name(model)
    if in_chans == 3 or name is None:
        return
    old = model.get_submodule(name)
    new = nn.Conv2d(
        in_chans, old.out_channels, old.kernel_size, old.stride, old.padding, old.dilation, old.groups,
        bias=old.bias is not None,
    )  # fmt: skip
    new.weight.data = adapt_input_conv(in_chans, old.weight.data)
    if old.bias is not None:
        new.bias.data = old.bias.data
    parent, _, attribute = name.rpartition(".")
    setattr(model.get_submodule(parent), attribute, new)


def declare(model: nn.Module, arch: str, img_size: int | None) -> None:
    """What vitlab reads of a model, set on the torchvision model built: ``num_classes``, a ``pretrained_cfg``
    naming its first convolution, classifier and input size, and for a ViT its patch grid and one prefix token."""
    first = next(n for n, m in model.named_modules() if isinstance(m, nn.Conv2d))
    head = classifier_name(model)
    model.num_classes = model.get_submodule(head).out_features if head else 0
    model.pretrained_cfg = dict(architecture=TV_PREFIX + arch, first_conv=first, classifier=head or "")
    if isinstance(model, VisionTransformer):
        img_size = model.image_size
        model.grid_size = (img_size // model.patch_size,) * 2
        model.num_prefix_tokens = 1  # the class token
    if img_size is not None:
        model.pretrained_cfg["input_size"] = (model.get_submodule(first).in_channels, img_size, img_size)
