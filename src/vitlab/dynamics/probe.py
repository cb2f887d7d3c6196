"""What the controller measures its heads on: the probe images, the controlled modules, the measurement record."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from lightning.pytorch.utilities import rank_zero_warn
from torch import nn

from vitlab.errors import ConfigError
from vitlab.layers.attention import Attention
from vitlab.layers.capture import attention_modules


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
