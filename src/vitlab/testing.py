"""The model and config contract as a test kit: what vitlab asks of a family's models and their config section, as
checks a family runs over its own presets in its own CI, the way timm's ``tests/test_models.py`` runs over timm's
registry. vitlab's own suite runs the same checks over its built-in families (:func:`builtin_presets`)::

    import pytest
    from vitlab.testing import CONTRACT, family_presets

    @pytest.mark.parametrize("check", CONTRACT)
    @pytest.mark.parametrize("preset", family_presets("toy_mixer"))
    def test_the_contract(check, preset):
        check(preset)

Each check takes a preset name and the constructor overrides to build it with (a small input for a quick test),
and raises ``AssertionError`` naming what is broken. :data:`CONTRACT` is what every command needs (the ``model``
config section, a training step of the family's task, the export, what the model claims through a protocol);
:data:`TIMM_CONTRACT` is timm's model contract (``forward_features`` -> ``forward_head``, ``reset_classifier``,
``forward_intermediates`` with ``feature_info``, ``features_only``), which the commands that treat a model as timm's
need (docs/writing_a_family.md, "What each command needs"). A generative model (``GenerativeModel``) is checked
against timm's contract by its ``encoder`` (``EncoderBacked``).
"""

from __future__ import annotations

import fnmatch
import os
import tempfile
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from vitlab.config import RunConfig, build_config
from vitlab.config.model import model_options
from vitlab.errors import ModelOptionError
from vitlab.export import export_model, load_model
from vitlab.family import ENTRY_POINT_GROUP, NO_PLUGINS_ENV, builtin, families, presets
from vitlab.layers.capture import attention_modules, is_attention
from vitlab.models.builder import create_model
from vitlab.models.contract import feature_extractor
from vitlab.models.protocols import AttentionBlocks, DynamicsTarget, EncoderBacked, GenerativeModel, classifier_backbone
from vitlab.models.registry import constructor_args, get_preset
from vitlab.training.run import build_task

#: the batch of every check
BATCH = 2


class FamilyNotLoadedError(LookupError):
    """The kit was asked for a family that is not loaded, or for presets it does not have: a test parametrized over
    nothing would pass while checking nothing, so the kit fails closed."""


def family_presets(family: str, pattern: str = "*") -> list[str]:
    """The presets of the family named ``family`` matching the glob ``pattern``, sorted; :class:`FamilyNotLoadedError`
    naming the family and why when it is not loaded or none of its presets matches."""
    if family not in {f.name for f in families()}:
        why = (
            f"{NO_PLUGINS_ENV}={os.environ[NO_PLUGINS_ENV]} switches plug-ins off: unset it"
            if os.environ.get(NO_PLUGINS_ENV, "") not in ("", "0")
            else f"no installed distribution declares it in the entry-point group {ENTRY_POINT_GROUP}, or it failed "
            "to load (see the PluginWarning above): pip install the plug-in"
        )
        raise FamilyNotLoadedError(
            f"vitlab.testing: the family {family!r} is not loaded ({why}); the kit checks nothing"
        )
    names = sorted(
        n for n, (f, _) in presets().items() if f is not None and f.name == family and fnmatch.fnmatch(n, pattern)
    )
    if not names:
        raise FamilyNotLoadedError(f"vitlab.testing: the family {family!r} has no preset matching {pattern!r}")
    return names


def builtin_presets(pattern: str = "*") -> list[str]:
    """The presets of the core and the built-in families (none of an installed plug-in's), sorted."""
    names = {f.name for f in families() if builtin(f)}
    return sorted(
        n for n, (f, _) in presets().items() if (f is None or f.name in names) and fnmatch.fnmatch(n, pattern)
    )


def build(preset: str, **overrides: Any) -> nn.Module:
    """The preset with those of ``overrides`` its class takes (one set of overrides fits every preset)."""
    accepted = constructor_args(get_preset(preset).cls)
    return create_model(preset, **{k: v for k, v in overrides.items() if k in accepted})


def options(model: nn.Module) -> dict[str, Any]:
    """The constructor arguments ``model`` (built by ``create_model``) was built with, defaults included."""
    return {**{k: p.default for k, p in constructor_args(type(model)).items()}, **model.init_kwargs}


def example_input(model: nn.Module, batch: int = BATCH) -> torch.Tensor:
    """Random images ``[batch, in_chans, img_size, img_size]`` of the size ``model`` was built for."""
    kwargs = options(model)
    shape = (batch, kwargs["in_chans"], kwargs["img_size"], kwargs["img_size"])
    return torch.randn(shape, generator=torch.Generator().manual_seed(0))


def timm_model(preset: str, **overrides: Any) -> nn.Module:
    """The model timm's contract is asked of: the preset, or a generative preset's encoder (as ``vitlab_<preset>`` in
    timm's registry), with a head of ``overrides["num_classes"]``."""
    if not issubclass(get_preset(preset).cls, GenerativeModel):
        return build(preset, **overrides)
    num_classes = overrides.get("num_classes")
    model = build(preset, **{**overrides, "num_classes": num_classes or 1})  # class-conditioned: one class at least
    encoder = classifier_backbone(model)
    encoder.reset_classifier(encoder.num_classes if num_classes is None else num_classes)
    encoder.init_kwargs = options(model)  # the input it takes
    return encoder


def _unused(model: nn.Module) -> list[str]:
    return [n for n, p in model.named_parameters() if p.grad is None]


# -- what every command needs ----------------------------------------------------------------------------------------
def check_config(preset: str, **overrides: Any) -> None:
    """The ``model`` section: the options dataclass is the constructor's keywords, a config of the preset builds
    (with ``overrides`` as ``model.*`` keys) and an unknown option is refused."""
    cls = get_preset(preset).cls
    assert set(model_options(cls.__name__)) == set(constructor_args(cls)), f"{cls.__name__}: options != constructor"
    accepted = constructor_args(cls)
    keys = [f"model.{k}={list(v) if isinstance(v, tuple) else v}" for k, v in overrides.items() if k in accepted]
    assert build_config(None, [f"model.name={preset}", *keys]).model["name"] == preset
    try:
        build_config(None, [f"model.name={preset}", "model.no_such_option=1"])
    except ModelOptionError as error:
        assert "no_such_option" in str(error)
    else:
        raise AssertionError(f"model.no_such_option=1 was accepted for {preset}")


def check_training_step(preset: str, loss: dict[str, Any] | None = None, **overrides: Any) -> None:
    """A training step of the family's task (its ``loss`` section as given): a finite loss, and a finite, nonzero
    gradient for every parameter."""
    torch.manual_seed(0)
    model = build(preset, **overrides).train()
    num_classes = options(model)["num_classes"]
    hparams = {"config": {}, "model_kwargs": model.init_kwargs, "data_info": {"num_classes": num_classes}}
    task = build_task(RunConfig(model={"name": preset}, loss=dict(loss or {})), model, hparams)
    x = example_input(model, 4)
    losses = task.compute_losses((x, torch.arange(4) % num_classes), "train")
    assert torch.isfinite(losses["loss"]), losses
    losses["loss"].backward()
    assert not _unused(model), f"parameters with no gradient: {_unused(model)}"
    zero = [n for n, p in model.named_parameters() if p.grad.abs().sum() == 0]
    assert not zero, f"parameters with an all-zero gradient: {zero}"
    assert all(torch.isfinite(p.grad).all() for p in model.parameters())


def check_export(preset: str, **overrides: Any) -> None:
    """``export_model`` then ``load_model`` (offline, ``weights_only``) gives the same model: same output."""
    torch.manual_seed(0)
    model = build(preset, **overrides).eval()
    x = example_input(model)
    with tempfile.TemporaryDirectory() as folder:
        export_model(model, folder)
        again = load_model(folder)
    with torch.no_grad():
        torch.testing.assert_close(again(x), model(x))


def check_capabilities(preset: str, **overrides: Any) -> None:
    """What the model claims through a protocol of :mod:`vitlab.models.protocols` holds: a ``GenerativeModel`` is
    ``EncoderBacked``, its ``encoder`` one of its modules; a ``DynamicsTarget`` names a prefix of its shared
    ``Attention`` modules; ``AttentionBlocks`` names its own modules, each holding an attention, none inside another."""
    model = build(preset, **overrides)
    name = type(model).__name__
    if isinstance(model, GenerativeModel):
        assert isinstance(model, EncoderBacked), (
            f"{name} is a GenerativeModel without an encoder (protocol EncoderBacked)"
        )
    if isinstance(model, EncoderBacked):
        assert any(m is model.encoder for m in model.children()), f"{name}.encoder is not one of its modules"
    if isinstance(model, DynamicsTarget):
        attention = [n for n, _ in attention_modules(model)]
        assert any(n.startswith(model.dynamics_target) for n in attention), (
            f"{name}.dynamics_target={model.dynamics_target!r} is the prefix of no shared Attention in {attention}"
        )
    if isinstance(model, AttentionBlocks):
        _check_attention_blocks(model)


def _check_attention_blocks(model: AttentionBlocks) -> None:
    blocks, name = model.attention_blocks(), type(model).__name__
    assert blocks, f"{name}.attention_blocks() names no block"
    for where, block in blocks:
        assert model.get_submodule(where) is block, f"{name}.attention_blocks(): {where!r} is not that module"
        assert any(is_attention(m) for m in block.modules()), f"{name}.attention_blocks(): {where} holds no attention"
    ids = {id(block) for _, block in blocks}
    nested = [where for where, block in blocks if any(id(m) in ids for m in block.modules() if m is not block)]
    assert not nested, f"{name}.attention_blocks(): {nested} hold other blocks of the list"


# -- timm's model contract -------------------------------------------------------------------------------------------
def check_classifier(preset: str, **overrides: Any) -> None:
    """``forward_head(forward_features(x), pre_logits=True)`` is the pooled ``[B, head_hidden_size]``, which
    ``reset_classifier(0)`` and ``num_classes=0`` give too; ``reset_classifier(7)`` gives 7 logits."""
    torch.manual_seed(0)
    model = timm_model(preset, **overrides).eval()
    x = example_input(model)
    pooled = model.forward_head(model.forward_features(x), pre_logits=True)
    assert pooled.shape == (BATCH, model.head_hidden_size) and model.num_features > 0
    assert model.get_classifier() is model.get_submodule(model.pretrained_cfg["classifier"])
    model.reset_classifier(0)
    torch.testing.assert_close(model(x), pooled)
    model.reset_classifier(7)
    assert model(x).shape == (BATCH, 7) and model.num_classes == 7
    assert timm_model(preset, **{**overrides, "num_classes": 0}).eval()(x).shape == (BATCH, model.head_hidden_size)


def check_intermediates(preset: str, **overrides: Any) -> None:
    """``forward_intermediates`` gives one map ``[B, C_i, H_i, W_i]`` per ``feature_info`` entry and the final
    features ``forward_features`` gives, with gradient checkpointing too."""
    torch.manual_seed(0)
    model = timm_model(preset, **overrides).eval()
    x = example_input(model)
    final, maps = model.forward_intermediates(x, output_fmt="NCHW")
    assert len(maps) == len(model.feature_info)
    size = x.shape[-1]
    for info, y in zip(model.feature_info, maps, strict=True):
        assert y.shape[:2] == (BATCH, info["num_chs"]) and max(y.shape[2:]) <= -(-size // info["reduction"]), info
    torch.testing.assert_close(final, model.forward_features(x))
    torch.testing.assert_close(model.forward_intermediates(x, indices=1, intermediates_only=True)[0], maps[-1])
    model.set_grad_checkpointing(True)
    torch.testing.assert_close(model.forward_intermediates(x)[0], final)


def check_features_only(preset: str, **overrides: Any) -> None:
    """``features_only`` at ``out_indices`` from the model's depth (the first and last map, and the last
    ``min(depth, 4)`` as timm's integer form): the maps ``forward_intermediates`` gives, and every parameter of the
    pruned extractor gets a gradient (DDP without ``find_unused_parameters``)."""
    depth = len(timm_model(preset, **overrides).feature_info)
    for out_indices in [(0, depth - 1), min(depth, 4)]:
        torch.manual_seed(0)
        model = timm_model(preset, **overrides).eval()
        x = example_input(model)
        wanted = range(depth)[-out_indices:] if isinstance(out_indices, int) else out_indices
        maps = model.forward_intermediates(x, indices=list(wanted), intermediates_only=True)
        features = feature_extractor(model, out_indices=out_indices)
        out = features(x)
        assert features.feature_info.channels() == [y.shape[1] for y in out]
        for want, got in zip(maps, out, strict=True):
            torch.testing.assert_close(got, want)
        sum(y.float().square().mean() for y in out).backward()
        assert not _unused(features), f"{out_indices}: parameters without a gradient, e.g. {_unused(features)[:3]}"


Check = Callable[..., None]
#: what every command needs of a model and its config section
CONTRACT: tuple[Check, ...] = (check_config, check_training_step, check_export, check_capabilities)
#: timm's model contract, for the commands that treat a model as timm's
TIMM_CONTRACT: tuple[Check, ...] = (check_classifier, check_intermediates, check_features_only)
