"""What the controller measures its heads on: the probe images, the controlled modules, the measurement record."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from lightning.pytorch.utilities import rank_zero_warn
from torch import nn

from vitlab.config.dynamics import TAU_MODES, DynamicsConfig
from vitlab.diagnostics.capture import attention_recording
from vitlab.errors import ConfigError
from vitlab.layers.attention import Attention
from vitlab.layers.capture import attention_capture, attention_modules
from vitlab.models.contract import module_mode


@dataclass
class ProbeMeasurement:
    """What one probe pass measures for ``L`` controlled layers of ``H`` heads on ``P`` probe images.

    Attributes:
        distributions: CLS-to-patch attention renormalised over the ``N`` patches, ``[L, H, P, N]`` float32 (CPU).
        kappa: consensus clusters, mean over the first ``kappa_images`` probe images, ``[L, H]`` float64; ``None``
            when the pass did not count them (``kappa_every``, or the adaptive probe's extension).
    """

    distributions: torch.Tensor
    kappa: torch.Tensor | None


@contextlib.contextmanager
def unit_temperature(modules: list[Attention]) -> Iterator[None]:
    """Inside: tau = 1 in every module that has a temperature. After: the exact previous ``log_tau`` again."""
    with_tau = [m for m in modules if m.log_tau is not None]
    saved = [m.log_tau.detach().clone() for m in with_tau]
    try:
        with torch.no_grad():
            for module in with_tau:
                module.log_tau.zero_()
        yield
    finally:
        with torch.no_grad():
            for module, log_tau in zip(with_tau, saved, strict=True):
                module.log_tau.copy_(log_tau)


def controlled_modules(model: nn.Module, target: str | None) -> list[tuple[str, Attention]]:
    """The shared ``Attention`` modules the controller acts on, in forward order (see ``DynamicsConfig.target``)."""
    modules = attention_modules(model)
    if not modules:
        raise ConfigError(
            f"{type(model).__name__} has no vitlab.layers.Attention module; the dynamics controller needs a model "
            "built from vitlab's shared layers"
        )
    if target is None:
        target = getattr(model, "dynamics_target", None)
    if target is None:
        with_temperature = [(n, m) for n, m in modules if m.log_tau is not None]
        return with_temperature or modules
    chosen = [(n, m) for n, m in modules if n.startswith(target)]
    if not chosen:
        raise ConfigError(
            f"dynamics.target={target!r} matches no attention module; available: {[n for n, _ in modules]}"
        )
    return chosen


@dataclass(frozen=True)
class ObservedAttention:
    """An attention operation that the controller reads (:mod:`vitlab.diagnostics.capture`) but cannot steer: not
    vitlab's ``Attention``, so no temperature and no head to freeze."""

    num_heads: int
    log_tau: None = None
    tau: None = None


def observed_modules(
    model: nn.Module, config: DynamicsConfig, example: torch.Tensor | None, tokens: int
) -> list[tuple[str, ObservedAttention]]:
    """The attention of a model without vitlab's ``Attention`` that the controller observes: every attention over
    all ``tokens`` (prefix and patches) that ``model.forward_features(example)`` computes (under ``config.target``).
    The temperature modes and freezing are refused by name, as are models whose attention has no CLS row over the
    image (no class token, windows only)."""
    kinds = sorted({type(m).__name__ for m in model.modules() if "attention" in type(m).__name__.lower()})
    what = f"{type(model).__name__} attends with {', '.join(kinds) or 'operations of no attention module'}"
    if config.mode in TAU_MODES:
        raise ConfigError(
            f"dynamics.mode={config.mode} sets a per-head temperature, but {what}, whose heads vitlab cannot scale "
            "(only vitlab's and timm's plain Attention); use dynamics.mode=fixed"
        )
    if config.freezes_heads:
        raise ConfigError(
            f"dynamics.freeze=true freezes heads whose parameters vitlab knows (vitlab's and timm's plain Attention), "
            f"but {what}; set dynamics.freeze=false to observe its heads"
        )
    if _model_attribute(model, "num_prefix_tokens") == 0:
        raise ConfigError(
            f"{type(model).__name__} has no CLS token, and the drift reads the CLS row of attention; choose a model "
            "with a class token (e.g. model.class_token=true for timm's ViT)"
        )
    if example is None:
        raise ConfigError(
            "the controller reads the attention of a model without vitlab's Attention on an example: "
            "pass example=[1, C, H, W] to check()"
        )
    with torch.no_grad(), module_mode(model, training=False), attention_recording(model) as record:
        getattr(model, "forward_features", model)(example.to(next(model.parameters()).device))
    chosen = [
        (name, ObservedAttention(probs.shape[1]))
        for name, probs in record.maps.items()
        if name not in record.windows
        and probs.shape[-1] == tokens
        and (config.target is None or name.startswith(config.target))
    ]
    if not chosen:
        found = ", ".join(f"{n} ({record.windows.get(n, 1)} windows of {p.shape[-1]})" for n, p in record.maps.items())
        raise ConfigError(
            f"{what}, and none of its attention covers the {tokens} tokens of the image ({found or 'none captured'}): "
            "the drift needs a CLS row over every patch, which windowed attention (Swin) has not; check dynamics.target"
        )
    return chosen


def modules_to_control(
    model: nn.Module, config: DynamicsConfig, example: torch.Tensor | None
) -> tuple[list[tuple[str, Attention | ObservedAttention]], Any]:
    """The attention the controller acts on (vitlab's ``Attention``: :func:`controlled_modules`) or observes (any
    other: :func:`observed_modules`, found by running ``example``), and the model's patch grid."""
    grid = _model_attribute(model, "grid_size")
    if grid is None:
        raise ConfigError(
            f"{type(model).__name__} has no grid_size attribute; the drift needs the patch grid (grid_h, grid_w)"
        )
    if attention_modules(model):
        return controlled_modules(model, config.target), grid
    tokens = (_model_attribute(model, "num_prefix_tokens") or 1) + int(grid[0]) * int(grid[1])
    return observed_modules(model, config, example, tokens), grid


def captured_attention(
    model: nn.Module, forward: Callable[[torch.Tensor], Any], images: torch.Tensor, names: list[str], observed: bool
) -> dict[str, torch.Tensor]:
    """``forward(images)`` with the attention of ``model`` captured: vitlab's ``Attention`` modules ``names``
    through their switch, or, when the attention is ``observed`` (:func:`observed_modules`), every attention
    through :func:`~vitlab.diagnostics.capture.attention_recording`."""
    if observed:
        with attention_recording(model) as record:
            forward(images)
        return record.maps
    with attention_capture(model, names) as capture:
        forward(images)
        return capture.collect()


def _model_attribute(model: nn.Module, name: str) -> Any:
    """``name`` on the model or, failing that, on its first submodule that has it (e.g. ``model.encoder``)."""
    for module in model.modules():
        if hasattr(module, name):
            return getattr(module, name)
    return None


def select_probe(loader: Any, size: int, seed: int | None) -> torch.Tensor:
    """The probe images ``[P, C, H, W]`` from an ordered (not shuffled) loader of ``(x, y)`` batches.

    ``seed`` picks a random subset of ``min(size, len(dataset))`` images (kept in loader order); ``None`` takes the
    first ones. Only the chosen images are kept while the loader is read. The global RNG is left untouched.
    """
    total = len(loader.dataset)
    if total == 0:
        raise ConfigError("the validation set is empty; the dynamics controller needs validation images to probe")
    if size > total:
        rank_zero_warn(f"dynamics.probe_size={size} but the validation set has {total} images; probing all of them")
        size = total
    if seed is None:
        wanted = torch.arange(size)
    else:
        wanted = torch.randperm(total, generator=torch.Generator().manual_seed(seed))[:size].sort().values
    chosen, position = [], 0
    with torch.random.fork_rng(devices=[]):  # a DataLoader draws its base seed from the global RNG
        for batch in loader:
            images = batch[0] if isinstance(batch, list | tuple) else batch
            in_batch = wanted[(wanted >= position) & (wanted < position + len(images))] - position
            chosen.append(images[in_batch])
            position += len(images)
            if position > wanted[-1]:
                break
    return torch.cat(chosen)
