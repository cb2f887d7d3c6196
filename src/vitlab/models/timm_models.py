"""timm's models by name (``model.name=timm:NAME``): built by ``timm.create_model`` (timm, pytorch-image-models) with
the ``model`` section's other keys, and timm's plain ``Attention`` modules taken over by vitlab's.

timm's ``Attention`` (``timm.layers.Attention``: ViT, DeiT and the other models of ``vision_transformer.py``) has
vitlab's parameter layout (one ``qkv`` linear map whose rows are q, k, v by head, then ``proj``), so where it has no
qk-norm, no norm or gate inside and a biased projection, vitlab's :class:`~vitlab.layers.attention.Attention` replaces
it with the same weights and the same state-dict keys: the logits stay timm's (to rounding; SDPA either way), and the
per-head temperature (``model.temperature``, ViTCAE eq. 19) and the freezing of heads (eq. 26) apply. Other attention
stays timm's: where its heads' query and key pass through ``q_norm`` and ``k_norm`` (qk-norm ViTs, EVA's rotary
``EvaAttention``) they are steered through hooks (:mod:`vitlab.layers.head_steering`); Swin's ``WindowAttention`` is
only read, by :func:`vitlab.diagnostics.capture.capture_attention`. docs/foreign_models.md says what each command
does with one.
"""

from __future__ import annotations

import difflib
import functools
import importlib
import re
from collections.abc import Callable
from typing import Any

import timm
import torch
from timm.layers import Attention as TimmAttention
from timm.layers import PatchEmbed
from timm.models._registry import model_entrypoint
from torch import nn

from vitlab.config.model import TIMM_PREFIX, check_patch_grid
from vitlab.errors import ConfigError, ModelOptionError, UnknownModelError
from vitlab.layers.attention import Attention
from vitlab.layers.head_steering import TEMPERATURE_OPTIONS, steer_temperature

#: the options vitlab fills in from the data
DATA_OPTIONS = ("img_size", "in_chans", "num_classes")


def timm_architecture(name: str) -> str:
    """``timm:NAME`` -> ``NAME``, or an :class:`UnknownModelError` that names timm's closest models."""
    arch = name.removeprefix(TIMM_PREFIX)
    if not timm.is_model(arch):
        close = difflib.get_close_matches(arch, timm.list_models(), n=3)
        hint = f" Did you mean {', '.join(TIMM_PREFIX + c for c in close)}?" if close else ""
        raise UnknownModelError(f"timm has no model {arch!r}.{hint} `timm.list_models()` lists every model.")
    return arch


def create_timm_model(name: str, **options: Any) -> nn.Module:
    """timm's model ``name`` (``timm:NAME``) with random weights, ``options`` passed to ``timm.create_model`` but for
    ``temperature`` and ``temperature_form`` (:data:`TEMPERATURE_OPTIONS`, for the attention vitlab takes over)."""
    arch = timm_architecture(name)
    own = {key: options.pop(key) for key in TEMPERATURE_OPTIONS if key in options}
    try:
        model = timm.create_model(arch, pretrained=False, **options)
    except TypeError as e:
        key = re.search(r"unexpected keyword argument '(\w+)'", str(e))
        option = f"model.{key.group(1)}" if key else f"one of {sorted(options)}"
        raise ModelOptionError(f"timm's {arch} does not take {option} ({e}); remove it") from e
    except (ValueError, AssertionError, RuntimeError) as e:
        raise ConfigError(
            f"timm cannot build {arch} with {options}: {e or type(e).__name__}; fix the model.* keys"
        ) from e
    check_patch_grids(model)
    adopted = adopt_attention(model, **own)
    steered = steer_temperature(model, own.get("temperature_form", "inverse")) if own.get("temperature") else []
    if own.get("temperature") and not adopted and not steered:
        kinds = sorted({type(m).__name__ for m in model.modules() if "Attention" in type(m).__name__})
        raise ConfigError(
            f"model.temperature=true, but timm's {arch} attends with {', '.join(kinds) or 'no attention module'}, "
            "whose heads' query and key vitlab cannot reach (timm's attention with q_norm/k_norm); "
            "unset model.temperature"
        )
    return model


def checkpoint_filter(name: str) -> Callable[[dict, nn.Module], dict] | None:
    """The ``checkpoint_filter_fn`` of the timm file that defines ``timm:NAME`` (``vision_transformer``, ``eva``,
    ``swin_transformer``, ...): what ``timm.create_model(pretrained=True)`` runs on a checkpoint before loading it
    (position and patch embeddings resampled to the model's, other layouts' keys renamed); None where it has none."""
    module = importlib.import_module(model_entrypoint(timm_architecture(name)).__module__)
    return getattr(module, "checkpoint_filter_fn", None)


@functools.cache
def takes_image_size(name: str) -> bool:
    """Whether timm's model ``name`` (``timm:NAME``) takes ``img_size`` (ViTs do, CNNs such as ResNet do not): its
    constructor is called on the meta device, which allocates nothing, and a ``TypeError`` naming ``img_size`` says
    no; anything else is left to the real build."""
    try:
        with torch.device("meta"):
            timm.create_model(timm_architecture(name), pretrained=False, img_size=224)
    except TypeError as e:
        return "img_size" not in str(e)
    except Exception:  # whatever else it is, the real build reports it
        return True
    return True


def data_options(name: str) -> tuple[str, ...]:
    """The options of :data:`DATA_OPTIONS` that timm's model ``name`` takes from the data."""
    return DATA_OPTIONS if takes_image_size(name) else tuple(k for k in DATA_OPTIONS if k != "img_size")


def check_patch_grids(model: nn.Module) -> None:
    """Every timm ``PatchEmbed`` of ``model`` tiles its image into whole patches, as vitlab's own models must
    (:func:`~vitlab.config.model.check_patch_grid`, in the same words): timm's strided convolution would drop the
    last rows and columns. A ``PatchEmbed`` that pads (``dynamic_img_pad``) or takes any size is not checked."""
    for module in model.modules():
        if isinstance(module, PatchEmbed) and module.img_size is not None and not module.dynamic_img_pad:
            for size, patch in zip(module.img_size, module.patch_size, strict=True):
                check_patch_grid(size, patch)


def takes_over(module: nn.Module) -> bool:
    """Whether vitlab's ``Attention`` computes what this timm ``Attention`` computes, with its parameters."""
    return (
        type(module) is TimmAttention
        and all(isinstance(getattr(module, part), nn.Identity) for part in ("q_norm", "k_norm", "norm"))
        and getattr(module, "gate", None) is None
        and module.proj.bias is not None
        and module.proj.in_features == module.proj.out_features == module.qkv.in_features
    )


def adopt_attention(model: nn.Module, temperature: bool = False, temperature_form: str = "inverse") -> list[str]:
    """Replace every timm ``Attention`` of ``model`` that :func:`takes_over` accepts by vitlab's, with its weights;
    returns their module paths."""
    adopted = []
    for name, module in list(model.named_modules()):
        if not takes_over(module):
            continue
        ours = Attention(
            module.qkv.in_features,
            num_heads=module.num_heads,
            qkv_bias=module.qkv.bias is not None,
            attn_drop=module.attn_drop.p,
            proj_drop=module.proj_drop.p,
            temperature=temperature,
            temperature_form=temperature_form,
        )
        missing, unexpected = ours.load_state_dict(module.state_dict(), strict=False)
        if unexpected or set(missing) - {"log_tau"}:  # log_tau, when asked for, starts at 0 (tau = 1)
            raise RuntimeError(f"{name}: timm's Attention and vitlab's differ in {unexpected or missing}")
        parent, _, attribute = name.rpartition(".")
        setattr(model.get_submodule(parent), attribute, ours.to(module.qkv.weight))
        adopted.append(name)
    return adopted
