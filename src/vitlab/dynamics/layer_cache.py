"""The frozen prefix's outputs, cached per training image (``dynamics.cache_frozen``; docs/dynamics.md, "Caching the
frozen prefix"): once the embeddings and blocks ``0..k-1`` are frozen, block ``k-1``'s output is a fixed function of
the image, so a batch whose images have all been seen skips the frozen blocks and feeds block ``k`` the stored
outputs (AutoFreeze, Liu et al. 2021, sec. 4, caches the frozen layers' outputs the same way).

Exact only where nothing random reaches the prefix: no random augmentation (refused from the config) and no dropout,
drop-path or patch dropout in it (refused on the built model). An image is known by its bytes (a hash of the
normalised tensor), so no loader needs to carry indices. The embeddings still run (one convolution): only the blocks
are skipped. Outputs live in memory up to ``cache_memory_mb``, then in a file of the run folder (a numpy memmap).
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import numpy as np
import torch
from timm.layers import DropPath, PatchDropout
from torch import nn

from vitlab.config.dynamics import CACHE_REFUSAL
from vitlab.errors import ConfigError

CACHE_FILE = "layer_cache.npy"


def random_modules(modules: dict[str, nn.Module]) -> list[str]:
    """The names of ``modules`` (and their submodules) that drop at random in training: dropout, drop-path, patch
    dropout with a non-zero rate."""
    found = []
    for prefix, module in modules.items():
        for name, sub in module.named_modules(prefix=prefix):
            rate = (
                sub.p
                if isinstance(sub, nn.Dropout)
                else sub.drop_prob
                if isinstance(sub, DropPath)
                else sub.prob
                if isinstance(sub, PatchDropout)
                else 0.0
            )
            if rate:
                found.append(name)
    return found


def check_cache(prefix_modules: dict[str, nn.Module]) -> None:
    """Refuse, in one line, a cache of a prefix that drops at random (the augmentation: ``DynamicsConfig``)."""
    random = random_modules(prefix_modules)
    if random:
        listed = ", ".join(random[:4]) + (" ..." if len(random) > 4 else "")
        raise ConfigError(CACHE_REFUSAL.format(f"{listed} (dropout, drop-path: model.*drop*_rate)"))


def image_keys(images: torch.Tensor) -> list[bytes]:
    """One key per image of ``images: [B, C, H, W]``: a hash of its bytes."""
    array = images.detach().cpu().contiguous().numpy()
    return [hashlib.blake2b(image.tobytes(), digest_size=16).digest() for image in array]


class PrefixCache:
    """Block ``k-1``'s output ``[N, D]`` per image key for the current ``k``, in memory up to ``memory_bytes``, then
    in ``spill`` (a memmap of ``capacity`` rows, made when first needed)."""

    def __init__(self, memory_bytes: int, spill: Path, capacity: int) -> None:
        self.memory_bytes, self.spill, self.capacity = memory_bytes, Path(spill), capacity
        self.clear(0)

    def clear(self, k: int) -> None:
        """Forget every output (the prefix is now ``k`` blocks)."""
        self.k = k
        self.memory: dict[bytes, torch.Tensor] = {}
        self.rows: dict[bytes, int] = {}
        self.used = 0
        self.dtype: torch.dtype | None = None
        self._file: np.memmap | None = None

    def __contains__(self, key: bytes) -> bool:
        return key in self.memory or key in self.rows

    def put(self, keys: list[bytes], outputs: torch.Tensor) -> None:
        """Store ``outputs: [B, N, D]`` under ``keys`` (those already there are kept)."""
        outputs = outputs.detach().cpu()
        self.dtype = outputs.dtype
        for key, output in zip(keys, outputs, strict=True):
            if key in self:
                continue
            if self.used + output.numel() * output.element_size() <= self.memory_bytes:
                self.memory[key] = output.clone()
                self.used += output.numel() * output.element_size()
            else:
                self._write(key, output)

    def _write(self, key: bytes, output: torch.Tensor) -> None:
        if self._file is None:
            self.spill.parent.mkdir(parents=True, exist_ok=True)
            shape = (self.capacity, *output.shape)
            self._file = np.lib.format.open_memmap(self.spill, mode="w+", dtype=np.float32, shape=shape)
        row = len(self.rows)
        if row >= self.capacity:
            return  # more distinct images than the training set has: nothing to gain from keeping them
        self._file[row] = output.float().numpy()
        self.rows[key] = row

    def get(self, keys: list[bytes], device: torch.device) -> torch.Tensor | None:
        """The stored outputs ``[B, N, D]`` of ``keys`` on ``device``, or None unless every key is stored."""
        if self.dtype is None or not all(key in self for key in keys):
            return None
        rows = [
            self.memory[key] if key in self.memory else torch.from_numpy(np.array(self._file[self.rows[key]]))
            for key in keys
        ]
        return torch.stack([row.to(self.dtype) for row in rows]).to(device, non_blocking=True)


class CachedPrefix:
    """Runs a model's training steps from the cache: for a batch whose images are all stored, the frozen blocks
    become identities and block ``k-1``'s output is replaced by the stored outputs; for any other batch the blocks run
    and block ``k-1``'s outputs are stored. ``blocks``: the encoder's block modules in forward order."""

    def __init__(self, blocks: list[nn.Module], cache: PrefixCache) -> None:
        self.blocks, self.cache = blocks, cache
        self._keys: list[bytes] | None = None
        self._stored: torch.Tensor | None = None
        self._hooks: list[Any] = []

    def start_batch(self, images: torch.Tensor, k: int) -> bool:
        """Prepare the training step of ``images`` with ``k`` frozen blocks; returns whether it skips them."""
        self.end_batch()
        if k == 0:
            return False
        if k != self.cache.k:
            self.cache.clear(k)
        self._keys = image_keys(images)
        self._stored = self.cache.get(self._keys, images.device)
        if self._stored is None:
            self._hooks.append(self.blocks[k - 1].register_forward_hook(self._store))
            return False
        for block in self.blocks[:k]:
            block.forward = _identity  # an instance attribute: deleted again in end_batch
        self._hooks.append(self.blocks[k - 1].register_forward_hook(self._replace))
        return True

    def end_batch(self) -> None:
        for hook in self._hooks:
            hook.remove()
        self._hooks = []
        for block in self.blocks:
            block.__dict__.pop("forward", None)
        self._keys = self._stored = None

    def _store(self, module: nn.Module, args: tuple, output: torch.Tensor) -> None:
        self.cache.put(self._keys, output)

    def _replace(self, module: nn.Module, args: tuple, output: torch.Tensor) -> torch.Tensor:
        return self._stored


def _identity(x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    return x
