"""Freezing converged heads (ViTCAE eq. 26) for the optimizers that train them: :class:`FrozenHeadGuard` (vitlab's
``Attention``) and :class:`SteeredHeadGuard` (HF's, torchvision's and timm's attention, steered by hooks).

The attention side (a frozen head's pattern is a constant of the backward pass) is
:class:`~vitlab.dynamics.frozen_heads.FrozenHeadAttention`, which the guard installs on the modules it guards;
this module keeps the frozen rows bit-identical through every optimizer step (AdamW's weight decay and moments
included).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from vitlab.dynamics.frozen_heads import FrozenHeadAttention
from vitlab.layers.attention import Attention
from vitlab.layers.head_steering import SteeredHeads


def dropping_gradients(drop: Callable[[], None]) -> Callable[..., tuple[tuple, dict] | None]:
    """An optimizer step pre-hook that calls ``drop`` (which sets the gradients of frozen parameters to None, so
    that the update skips them) now, or, when the step gets a closure (Lightning runs the backward, gradient
    clipping included, inside ``optimizer.step(closure)``), right after the closure, so that the clipping norm is
    the one every other run computes and the update is the only thing skipped."""

    def before_step(optimizer: torch.optim.Optimizer, args: tuple, kwargs: dict) -> tuple[tuple, dict] | None:
        # args: what step() was called with, the optimizer itself first
        closure = kwargs.get("closure", args[1] if len(args) > 1 else None)
        if closure is None:
            drop()
            return None

        def then_drop() -> Any:
            loss = closure()
            drop()
            return loss

        if "closure" in kwargs:
            return args, {**kwargs, "closure": then_drop}
        return (args[0], then_drop, *args[2:]), kwargs

    return before_step


class FrozenHeadGuard:
    """Eq. 26 for a list of ``Attention`` modules (one per layer): frozen heads stay bit-identical.

    The modules become :class:`FrozenHeadAttention` in place (:meth:`FrozenHeadAttention.install`: same weights,
    no head frozen) when the guard is made; :attr:`modules` holds them. :meth:`freeze` marks heads with
    ``FrozenHeadAttention.set_frozen_heads`` (their attention is then computed without autograd,
    so their rows of the QKV projection and their tau get zero gradient) and snapshots those rows and tau. Zero
    gradient is not enough: AdamW still moves a parameter through its momentum and its weight decay. So after every
    step of an optimizer passed to :meth:`attach`, :meth:`restore` copies the snapshots back.

    It also permutes the state of every attached optimizer when heads move to the first slots (attach the
    optimizers before freezing), restores only ``W_q``, ``W_k`` and tau under ``train_frozen_values``
    (``freeze_scope: pattern``), and lets the optimizers skip a tensor frozen whole (its gradient set to None before
    the update): docs/dynamics.md, "Freezing (eq. 26)". The parameters end bit-identical to updating and restoring.
    """

    def __init__(self, modules: list[Attention]) -> None:
        self.modules = [FrozenHeadAttention.install(module) for module in modules]
        self._snapshots: list[tuple[int, int, torch.Tensor, torch.Tensor | None, torch.Tensor | None]] = []
        self._optimizers: list[torch.optim.Optimizer] = []
        self._hooks: list[Any] = []
        self._frozen_whole: list[torch.Tensor] = []  # parameters every slot of which is frozen

    def freeze(self, frozen: torch.Tensor) -> None:
        """Freeze exactly the heads marked in ``frozen: [L, H]`` bool and snapshot their current parameters."""
        if frozen.shape != (len(self.modules), self.modules[0].num_heads):
            raise ValueError(f"frozen must be [L, H] = [{len(self.modules)}, {self.modules[0].num_heads}]")
        self._snapshots, self._frozen_whole = [], []
        with torch.no_grad():
            for module, mask in zip(self.modules, frozen, strict=True):
                perm = module.set_frozen_heads(mask)
                if perm is not None:
                    self._permute_optimizer_state(module, perm)
                count = module.num_frozen  # the frozen heads now fill the first `count` slots
                parts = self.frozen_parts(module)
                weight, bias, log_tau = self._views(module)
                self._snapshots.append(
                    (
                        count,
                        parts,
                        weight[:parts, :count].clone(),
                        None if bias is None else bias[:parts, :count].clone(),
                        None if log_tau is None else log_tau[:count].clone(),
                    )
                )
                if count == module.num_heads:
                    whole = [module.log_tau] if module.log_tau is not None else []
                    if parts == 3:
                        whole += [p for p in (module.qkv.weight, module.qkv.bias) if p is not None]
                    self._frozen_whole += whole

    def _permute_optimizer_state(self, module: FrozenHeadAttention, perm: torch.Tensor) -> None:
        for optimizer in self._optimizers:
            for name, parameter in module.head_parameters():
                for value in optimizer.state.get(parameter, {}).values():
                    if torch.is_tensor(value) and value.shape == parameter.shape:
                        value.copy_(module.permute_heads_of(name, value, perm))

    @staticmethod
    def frozen_parts(module: FrozenHeadAttention) -> int:
        """How many of q, k, v (in that order) a frozen head keeps fixed: 3 (eq. 26), or 2 when only its pattern is
        frozen (``FrozenHeadAttention.train_frozen_values``)."""
        return 2 if module.train_frozen_values else 3

    @staticmethod
    def _views(module: FrozenHeadAttention) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """Per-slot views of the QKV weight ``[3, H, d, C]``, bias ``[3, H, d]`` and ``log_tau [H]``."""
        heads, head_dim = module.num_heads, module.head_dim
        weight = module.qkv.weight.data.view(3, heads, head_dim, -1)
        bias = None if module.qkv.bias is None else module.qkv.bias.data.view(3, heads, head_dim)
        return weight, bias, None if module.log_tau is None else module.log_tau.data

    def restore(self) -> None:
        """Copy the snapshots of the frozen heads back into the parameters (nothing before :meth:`freeze`)."""
        with torch.no_grad():
            for module, snapshot in zip(self.modules, self._snapshots, strict=False):
                count, parts, weight_rows, bias_rows, log_tau = snapshot
                if not count:
                    continue
                weight, bias, module_log_tau = self._views(module)
                weight[:parts, :count] = weight_rows
                if bias is not None:
                    bias[:parts, :count] = bias_rows
                if module_log_tau is not None:
                    module_log_tau[:count] = log_tau

    def drop_frozen_gradients(self) -> None:
        """Set the gradient of every parameter frozen whole to None, so that an optimizer step skips it."""
        for parameter in self._frozen_whole:
            parameter.grad = None

    def attach(self, optimizer: torch.optim.Optimizer) -> None:
        """Restore the frozen heads after every ``optimizer.step()`` (and let it skip the parameters frozen whole);
        permute its state when heads move."""
        self._optimizers.append(optimizer)
        self._hooks.append(optimizer.register_step_pre_hook(dropping_gradients(self.drop_frozen_gradients)))
        self._hooks.append(optimizer.register_step_post_hook(lambda *_: self.restore()))

    def detach(self) -> None:
        for hook in self._hooks:
            hook.remove()
        self._hooks = []
        self._optimizers = []


class SteeredHeadGuard:
    """Eq. 26 for attention vitlab did not build (:class:`~vitlab.layers.head_steering.SteeredHeads`, one per layer):
    :meth:`freeze` marks the heads (their q and k detached in the forward pass) and snapshots their rows of q, k and v
    (q and k only under ``train_frozen_values``, ``freeze_scope: pattern``) and their tau; after every step of an
    optimizer passed to :meth:`attach`, :meth:`restore` copies them back, so that weight decay and moments leave a
    frozen head bit-identical, as :class:`FrozenHeadGuard` does for vitlab's ``Attention``. The heads never move."""

    def __init__(self, modules: list[SteeredHeads]) -> None:
        self.modules = modules
        self._snapshots: list[tuple[torch.Tensor, slice, torch.Tensor]] = []
        self._hooks: list[Any] = []

    def freeze(self, frozen: torch.Tensor) -> None:
        """Freeze exactly the heads marked in ``frozen: [L, H]`` bool and snapshot their current parameters."""
        if frozen.shape != (len(self.modules), self.modules[0].num_heads):
            raise ValueError(f"frozen must be [L, H] = [{len(self.modules)}, {self.modules[0].num_heads}]")
        self._snapshots = []
        with torch.no_grad():
            for module, mask in zip(self.modules, frozen, strict=True):
                module.set_frozen_heads(mask)
                parts = "qk" if getattr(module, "train_frozen_values", False) else "qkv"
                d = module.head_dim
                for head in mask.nonzero().flatten().tolist():
                    for part in parts:
                        for rows in module.rows[part]:
                            where = slice(rows.offset + head * d, rows.offset + (head + 1) * d)
                            self._snapshots.append((rows.parameter, where, rows.parameter.data[where].clone()))
                    if module.log_tau is not None:
                        where = slice(head, head + 1)
                        self._snapshots.append((module.log_tau, where, module.log_tau.data[where].clone()))

    def restore(self) -> None:
        """Copy the snapshots of the frozen heads back into the parameters (nothing before :meth:`freeze`)."""
        with torch.no_grad():
            for parameter, where, rows in self._snapshots:
                parameter.data[where] = rows

    def attach(self, optimizer: torch.optim.Optimizer) -> None:
        """Restore the frozen heads after every ``optimizer.step()``."""
        self._hooks.append(optimizer.register_step_post_hook(lambda *_: self.restore()))

    def detach(self) -> None:
        for hook in self._hooks:
            hook.remove()
        self._hooks = []


def guard_for(modules: list[Any]) -> FrozenHeadGuard | SteeredHeadGuard | None:
    """The guard of the controlled modules: :class:`FrozenHeadGuard` for vitlab's ``Attention`` (made
    ``FrozenHeadAttention`` in place), :class:`SteeredHeadGuard` for foreign heads, None for attention only read."""
    if isinstance(modules[0], Attention):
        return FrozenHeadGuard(modules)
    return SteeredHeadGuard(modules) if isinstance(modules[0], SteeredHeads) else None
