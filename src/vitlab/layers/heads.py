"""Head permutations of :class:`~vitlab.layers.attention.Attention`: an exact symmetry of multi-head attention.

Moving head ``h`` of a multi-head attention to another slot, together with its rows of ``W_qkv`` and ``b_qkv``
(within each of q, k and v), its columns of ``W_proj`` and its entry of ``log_tau``, leaves the function unchanged
(Vaswani et al. 2017, sec. 3.2.2: the heads are concatenated, then projected). Head freezing (ViTCAE eq. 26,
:class:`vitlab.dynamics.FrozenHeadAttention`) uses it to keep the frozen heads in the first slots and saves the
order beside the weights: ``head_order[j]`` is the original index of the head in slot ``j``, with the mask
``frozen_heads``. :func:`state_in_original_order` reads such a state into a model whose attention keeps its heads
in original order.
"""

from __future__ import annotations

import torch
from torch import nn

from vitlab.layers.attention import Attention

#: the parameters of Attention that have one slice per head, by their name inside the module
HEAD_PARAMETERS = ("qkv.weight", "qkv.bias", "proj.weight", "log_tau")
#: the buffers a head-freezing attention saves beside its weights
HEAD_ORDER_KEYS = ("frozen_heads", "head_order")


def permute_heads(name: str, tensor: torch.Tensor, perm: torch.Tensor, num_heads: int) -> torch.Tensor:
    """``tensor`` shaped like the Attention parameter ``name`` (one of :data:`HEAD_PARAMETERS`; its value, gradient
    or an optimizer moment) with its head slices permuted: slot ``j`` of the result is slot ``perm[j]``.

    Rows of ``qkv.weight: [3C, C]`` / ``qkv.bias: [3C]`` per head within each of q, k and v, columns of
    ``proj.weight: [C, C]``, entries of ``log_tau: [H]``.
    """
    perm = perm.to(tensor.device)
    if name == "qkv.weight":
        return tensor.view(3, num_heads, -1, tensor.shape[-1])[:, perm].reshape(tensor.shape)
    if name == "qkv.bias":
        return tensor.view(3, num_heads, -1)[:, perm].reshape(tensor.shape)
    if name == "proj.weight":
        return tensor.view(tensor.shape[0], num_heads, -1)[:, perm].reshape(tensor.shape)
    if name == "log_tau":
        return tensor[perm]
    raise ValueError(f"{name!r} has no head slices; the parameters that do are {HEAD_PARAMETERS}")


def state_in_original_order(model: nn.Module, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``state`` (a state dict of ``model``) made loadable into ``model``'s attention modules.

    For every :class:`Attention` of ``model`` that keeps no head order of its own (a plain one) but whose saved
    state has one (saved by a head-freezing attention, or by vitlab before freezing moved out of the shared
    Attention): the head slices are put back in original order and the ``frozen_heads`` and ``head_order`` keys
    dropped. The result is what a model that never permuted its heads would hold; ``state`` itself is not changed.
    """
    own = model.state_dict().keys()
    out = dict(state)
    for name, module in model.named_modules():
        if not isinstance(module, Attention):
            continue
        base = f"{name}." if name else ""
        if any(base + key in own for key in HEAD_ORDER_KEYS):
            continue  # the module keeps the order itself
        order = out.pop(base + "head_order", None)
        out.pop(base + "frozen_heads", None)
        if order is None or torch.equal(order.cpu(), torch.arange(len(order))):
            continue
        slots = order.cpu().argsort()  # the slot that holds each original head
        for key in HEAD_PARAMETERS:
            if base + key in out:
                out[base + key] = permute_heads(key, out[base + key], slots, module.num_heads)
    return out
