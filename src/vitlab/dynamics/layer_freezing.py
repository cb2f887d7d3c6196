"""Freezing a prefix of the encoder whole (``dynamics.freeze: layers``; docs/dynamics.md, "Freezing layers").

The layers are timm's groups of the model's ``group_matcher`` (:func:`vitlab.models.protocols.parameter_layers`):
0 the embeddings, ``1..B`` the blocks, the last what no group names (the final norm, the head, a decoder). A frozen
prefix of ``k`` blocks is the embeddings and blocks ``0..k-1``: their parameters stop requiring a gradient, so
autograd records nothing below block ``k`` (no saved activations, no backward there; block ``k``'s input is a plain
tensor), and an optimizer step skips them (their gradient is None), so AdamW's weight decay and moments leave them
bit-identical. A frozen block keeps its dropout in training mode, as ``finetune.freeze=backbone`` does; the cache of
its outputs (:mod:`vitlab.dynamics.layer_cache`) refuses a prefix with dropout.

What grows the prefix is a pure function of per-layer signals:

- :func:`heads_prefix`: every head of the lowest trainable block converged by the convergence rule (ViTCAE's
  eq. 26 signal carried to layers);
- :func:`gradnorm_prefix`: AutoFreeze's (Liu et al. 2021, "AutoFreeze: Automatically Freezing Model Blocks to
  Accelerate Fine-tuning", sec. 3): the lowest trainable block freezes when the relative change of its gradient
  norm between two evaluation intervals (here epochs) falls below a threshold, one block per interval;
- :func:`schedule_prefix`: FreezeOut's (Brock et al. 2017, "FreezeOut: Accelerate Training by Progressively
  Freezing Layers", sec. 2): block ``i`` frozen once the fraction ``t_i`` of training is done, ``t_i`` linear in
  ``i`` from ``t_0`` to 1 (the paper's linear scaling). Unlike the paper, each block keeps the run's learning rate
  until it freezes (FreezeOut anneals each layer's rate to zero by ``t_i``, which needs a parameter group per layer),
  and blocks freeze at epoch ends;
- ``static``: the first ``freeze_layers`` blocks frozen from the start.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from vitlab.acceleration import compiled_blocks
from vitlab.config.dynamics import DynamicsConfig
from vitlab.dynamics.freezing import dropping_gradients
from vitlab.errors import ConfigError
from vitlab.models.protocols import LayerGrouped, parameter_layers


def leading_true(flags: Sequence[bool] | torch.Tensor) -> int:
    """How many of ``flags`` are true before the first false."""
    count = 0
    for flag in flags:
        if not bool(flag):
            break
        count += 1
    return count


def heads_prefix(layer_converged: torch.Tensor, frozen: int, cap: int, thaw: bool = False) -> int:
    """The frozen prefix after an epoch under the heads' signal: the leading blocks whose heads have all converged
    (``layer_converged: [B]`` bool), at most ``cap``; without ``thaw`` it never shrinks below ``frozen``."""
    leading = leading_true(layer_converged[:cap])
    return leading if thaw else max(frozen, leading)


def gradnorm_change_rates(previous: torch.Tensor, current: torch.Tensor) -> torch.Tensor:
    """AutoFreeze's per-block gradient-norm change rate ``|n_t - n_{t-1}| / n_{t-1}`` (``[B]``; inf where
    ``n_{t-1} = 0``, a block that had no gradient yet)."""
    previous, current = previous.double(), current.double()
    return torch.where(previous > 0, (current - previous).abs() / previous, torch.full_like(previous, torch.inf))


def gradnorm_prefix(rates: torch.Tensor, frozen: int, threshold: float, cap: int) -> int:
    """The lowest trainable block joins the prefix when its change rate (``rates: [B]``) is below ``threshold``."""
    return frozen + 1 if frozen < cap and float(rates[frozen]) < threshold else frozen


def freezeout_times(t0: float, blocks: int) -> list[float]:
    """FreezeOut's linear schedule: block ``i`` of ``blocks`` freezes at ``t_i = t0 + (1 - t0) i / (blocks - 1)``
    of training (the last at the end: it never freezes)."""
    return [t0 + (1 - t0) * i / max(blocks - 1, 1) for i in range(blocks)]


def schedule_prefix(fraction: float, t0: float, blocks: int, cap: int) -> int:
    """The blocks FreezeOut has frozen once ``fraction`` of training is done, at most ``cap``."""
    return min(cap, sum(t < 1 and t <= fraction for t in freezeout_times(t0, blocks)))


class LayerFreezer:
    """Freezes the embeddings and the first ``k`` blocks of ``model`` (a :class:`LayerGrouped` model): see the
    module's docstring. :meth:`freeze` sets ``k`` (grow, or shrink under ``thaw``); :meth:`attach` an optimizer
    so that it skips the frozen parameters even where a gradient reaches them (zeros from DDP);
    :meth:`accumulate_gradient_norms` after each backward and :meth:`read_gradient_norms` once an epoch (the
    gradnorm signal, one host read per epoch)."""

    def __init__(self, model: nn.Module, max_frozen: int | None = None) -> None:
        names = {id(p): n for n, p in model.named_parameters()}
        self.layer_of, self.block_names = self.check(model, max_frozen)
        top = max(self.layer_of.values())
        self.blocks = top - 1
        self.cap = self.blocks - 1 if max_frozen is None else max_frozen
        self.parameters: list[list[nn.Parameter]] = [[] for _ in range(top + 1)]
        for p in model.parameters():
            self.parameters[self.layer_of[names[id(p)]]].append(p)
        self.trainable = {id(p) for p in model.parameters() if p.requires_grad}  # what thawing gives back
        self.frozen = 0
        self.module_blocks: list[int] = []  # the block of each controlled attention module (the heads signal)
        self.freeze_epochs: list[int | None] = [None] * self.blocks
        self.previous_norms: torch.Tensor | None = None
        self._norms: torch.Tensor | None = None  # [B] on the device: the sum of this epoch's per-step norms
        self._steps = 0
        self._restored: dict[str, Any] | None = None  # a checkpoint's state, until the optimizers exist
        self._hooks: list[Any] = []

    @staticmethod
    def check(model: nn.Module, max_frozen: int | None) -> tuple[dict[str, int], list[str]]:
        """The model's parameter layers and block names (:func:`model_layers`), or a :class:`ConfigError` naming
        what layer freezing needs."""
        found = model_layers(model)
        if found is None:
            raise ConfigError(
                f"dynamics.freeze=layers needs a model whose blocks vitlab finds (timm's group_matcher, or attention "
                f"blocks in an nn.ModuleList); {type(model).__name__} has neither: use dynamics.freeze=heads"
            )
        layer_of, names = found
        blocks = max(layer_of.values()) - 1
        if blocks < 2 or (max_frozen is not None and max_frozen > blocks):
            raise ConfigError(
                f"{type(model).__name__} has {blocks} blocks; dynamics.freeze=layers freezes at most all of them "
                f"(dynamics.max_frozen_layers={max_frozen}) and needs at least 2"
            )
        return layer_of, names

    def block_modules(self, model: nn.Module) -> list[nn.Module]:
        """The block modules in forward order."""
        return [model.get_submodule(name) for name in self.block_names]

    def layer_of_module(self, name: str) -> int:
        """The block of the module ``name`` (its first parameter's layer minus the embeddings'), -1 if none."""
        layers = [layer for n, layer in self.layer_of.items() if n.startswith(f"{name}.")]
        return min(layers) - 1 if layers else -1

    def frozen_heads(self, like: torch.Tensor) -> torch.Tensor:
        """``[L, H]`` bool (shaped ``like``): the heads of the controlled modules in frozen blocks, whose tau the
        schedule must leave alone."""
        in_prefix = torch.tensor([0 <= block < self.frozen for block in self.module_blocks], dtype=torch.bool)
        return in_prefix[:, None].expand_as(like)

    def frozen_parameters(self) -> list[nn.Parameter]:
        return [p for layer in self.parameters[: self.frozen + 1] for p in layer] if self.frozen else []

    def freeze(self, k: int, epoch: int | None = None) -> None:
        """Freeze the embeddings and blocks ``0..k-1`` (``k = 0``: nothing), give the others their gradient back
        (those that had one when the freezer was made); ``epoch`` is recorded as the freeze epoch of new blocks."""
        if not 0 <= k <= self.cap:
            raise ValueError(f"k must be in [0, {self.cap}], got {k}")
        for layer, params in enumerate(self.parameters):
            for p in params:
                if k and layer <= k:
                    p.requires_grad_(False)
                    p.grad = None
                elif id(p) in self.trainable:
                    p.requires_grad_(True)
        for block in range(self.blocks):
            if block >= k:
                self.freeze_epochs[block] = None
            elif self.freeze_epochs[block] is None:
                self.freeze_epochs[block] = epoch
        self.frozen = k

    def attach(self, optimizer: torch.optim.Optimizer) -> None:
        """Let ``optimizer`` skip the frozen parameters (gradient set to None before its update)."""
        self._hooks.append(optimizer.register_step_pre_hook(dropping_gradients(self.drop_frozen_gradients)))

    def drop_frozen_gradients(self) -> None:
        for p in self.frozen_parameters():
            p.grad = None

    def detach(self) -> None:
        for hook in self._hooks:
            hook.remove()
        self._hooks = []

    @torch.no_grad()
    def accumulate_gradient_norms(self) -> None:
        """Add each block's gradient norm (over its parameters) to the epoch's sum, on the device: no host sync."""
        norms = []
        for params in self.parameters[1 : self.blocks + 1]:
            grads = [p.grad for p in params if p.grad is not None]
            norms.append(torch.stack(torch._foreach_norm(grads)).square().sum().sqrt() if grads else None)
        like = next((n for n in norms if n is not None), None)
        if like is None:
            return
        norms = torch.stack([torch.zeros_like(like) if n is None else n for n in norms]).float()
        self._norms = norms if self._norms is None else self._norms + norms
        self._steps += 1

    def read_gradient_norms(self) -> torch.Tensor | None:
        """The epoch's mean per-step gradient norm of each block ``[B]`` on the host (None without steps); resets."""
        if self._norms is None:
            return None
        norms = (self._norms / self._steps).cpu()
        self._norms, self._steps = None, 0
        return norms

    def frozen_share(self) -> float:
        """The share of the blocks frozen, ``k / B``: the frozen share of the encoder's FLOPs, blocks being equal."""
        return self.frozen / self.blocks

    def state_dict(self) -> dict[str, Any]:
        return {"frozen": self.frozen, "freeze_epochs": list(self.freeze_epochs), "previous": self.previous_norms}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a checkpoint's prefix, applied by :meth:`apply_restored` once the optimizers exist: they are
        built from the parameters that require a gradient, as the checkpoint's optimizer state was."""
        self._restored = state

    def apply_restored(self) -> None:
        if self._restored is not None:
            state, self._restored = self._restored, None
            self.freeze(state["frozen"])
            self.freeze_epochs, self.previous_norms = list(state["freeze_epochs"]), state["previous"]


def model_layers(model: nn.Module) -> tuple[dict[str, int], list[str]] | None:
    """The layer of every parameter name (0 the embeddings, block ``i`` layer ``i + 1``, the last what follows the
    blocks) and the blocks' module names: timm's groups (:func:`~vitlab.models.protocols.parameter_layers`) for a
    :class:`LayerGrouped` model, else the blocks :func:`~vitlab.acceleration.compiled_blocks` finds (HF transformers'
    encoder layers, torchvision's encoder blocks), the parameters outside them before or after them by their order;
    None without blocks."""
    if isinstance(model, LayerGrouped):
        layer_of = parameter_layers(model)
        return layer_of, block_names(layer_of, max(layer_of.values()) - 1)
    blocks = compiled_blocks(model)
    if not blocks:
        return None
    owner = {id(p): layer for layer, (_, block) in enumerate(blocks, start=1) for p in block.parameters()}
    layer_of, after = {}, 0
    for name, parameter in model.named_parameters():
        layer_of[name] = owner.get(id(parameter), after)
        after = len(blocks) + 1 if id(parameter) in owner else after
    return layer_of, [name for name, _ in blocks]


def block_names(layer_of: dict[str, int], blocks: int) -> list[str]:
    """The module name of each block: its parameters' names up to their first index (``encoder.blocks.3``)."""
    names = []
    for block in range(blocks):
        counts: Counter[str] = Counter()
        for name, layer in layer_of.items():
            parts = name.split(".")
            index = next((i for i, part in enumerate(parts) if part.isdigit()), None)
            if layer == block + 1 and index is not None:
                counts[".".join(parts[: index + 1])] += 1
        names.append(counts.most_common(1)[0][0])
    return names


def prefix_modules(model: nn.Module, max_frozen: int | None) -> dict[str, nn.Module]:
    """What a frozen prefix of at most ``max_frozen`` blocks runs: those blocks and the modules beside the blocks'
    container (the embeddings, their dropout; also the final norm and head, which hold no randomness of their own
    in a ViT)."""
    _, names = LayerFreezer.check(model, max_frozen)
    blocks = len(names)
    cap = blocks - 1 if max_frozen is None else max_frozen
    container = names[0].rsplit(".", 1)[0]
    parent_name = container.rsplit(".", 1)[0] if "." in container else ""
    parent = model.get_submodule(parent_name)
    beside = {f"{parent_name}.{n}".lstrip("."): m for n, m in parent.named_children() if n != container.split(".")[-1]}
    return {**beside, **{name: model.get_submodule(name) for name in names[:cap]}}


def next_prefix(
    freezer: LayerFreezer, config: DynamicsConfig, fraction: float, converged: torch.Tensor | None
) -> tuple[int, dict[str, Any]]:
    """The prefix after an epoch under ``config.layer_signal`` and what it read: ``fraction`` of training done,
    ``converged: [L, H]`` bool the controlled heads' (the heads signal; the modules' blocks from
    ``freezer.module_blocks``)."""
    k, signal, read = freezer.frozen, config.layer_signal, {}
    if signal == "static":
        return min(config.freeze_layers, freezer.cap), read
    if signal == "schedule":
        return max(k, schedule_prefix(fraction, config.freezeout_t0, freezer.blocks, freezer.cap)), read
    if signal == "gradnorm":
        norms = freezer.read_gradient_norms()
        read["gradient_norms"] = None if norms is None else norms.tolist()
        if norms is not None and freezer.previous_norms is not None:
            rates = gradnorm_change_rates(freezer.previous_norms, norms)
            read["gradnorm_rates"] = rates.tolist()
            k = gradnorm_prefix(rates, k, config.gradnorm_rate, freezer.cap)
        freezer.previous_norms = norms if norms is not None else freezer.previous_norms
        return k, read
    layer_converged = layer_convergence(converged, freezer.module_blocks, freezer.blocks)
    read["layer_converged"] = layer_converged.tolist()
    return heads_prefix(layer_converged, k, freezer.cap, config.thaw), read


def layer_convergence(converged: torch.Tensor | None, module_blocks: list[int], blocks: int) -> torch.Tensor:
    """``[B]`` bool: whether every head of every controlled module in each block has converged (``converged: [L,
    H]`` bool, module ``l`` in block ``module_blocks[l]``); a block without a controlled module never has."""
    out = torch.zeros(blocks, dtype=torch.bool)
    if converged is None:
        return out
    for block in range(blocks):
        rows = [layer for layer, b in enumerate(module_blocks) if b == block]
        out[block] = bool(rows) and bool(converged[rows].all())
    return out
