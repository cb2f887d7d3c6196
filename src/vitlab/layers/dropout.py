"""Dropout (Srivastava et al. 2014, sec. 2) whose mask costs what its arithmetic costs.

torch's CPU dropout draws one Bernoulli variate per element, each from its own call of the generator; on a ViT's
MLP hidden ``[B, N, 4C]`` that costs several times the matrix product next to it. :func:`dropout` cuts the mask
from the bits of one ``random_`` over int64 words, 16 bits per element (a quarter of the generator calls of
one draw per element), and applies it in one masked fill and one scale:

- element ``i`` is dropped when its 16 bits, read as a signed integer, fall below ``-2**15 + round(p * 2**16)``:
  with probability ``p_q = round(p * 2**16) / 2**16``, within ``2**-17`` of ``p``;
- a kept element is scaled by ``1 / (1 - p_q)``, so the expectation is the input's exactly, as with torch's;
- the bits come from torch's default generator of the tensor's device, so ``torch.manual_seed`` makes the masks
  reproducible.

:class:`Dropout` is ``nn.Dropout`` with this mask (no parameters: state-dict keys do not change);
:func:`use_fast_dropout` swaps it into a built model, for vitlab's own modules and timm's alike. Under
``torch.compile`` the draw runs eager (a graph break), so a compiled block draws the same masks as an eager one.
Drop-path (stochastic depth) draws one variate per sample, ``[B, 1, 1]``, and is left to timm's ``DropPath``.
"""

from __future__ import annotations

import torch
from torch import nn

#: bits of the random word per element; the drop probability is rounded to a multiple of ``2**-MASK_BITS``
MASK_BITS = 16


def quantized_drop_probability(p: float) -> float:
    """The drop probability :func:`dropout` realises for ``p``: ``round(p * 2**16) / 2**16`` (at least one step
    above zero for ``p > 0``)."""
    steps = 2**MASK_BITS
    return max(round(p * steps), 1 if p > 0 else 0) / steps


def drop_mask(shape: torch.Size | tuple[int, ...], p: float, device: torch.device | str = "cpu") -> torch.Tensor:
    """A bool mask of ``shape``, True where an element is dropped, each with probability
    :func:`quantized_drop_probability` of ``p``, independently."""
    count = 1
    for size in shape:
        count *= size
    words = torch.empty((count + 3) // 4, dtype=torch.int64, device=device).random_(-(2**63), 2**63 - 1)
    threshold = -(2 ** (MASK_BITS - 1)) + round(quantized_drop_probability(p) * 2**MASK_BITS)
    return words.view(torch.int16)[:count].view(shape) < threshold


def dropout(x: torch.Tensor, p: float, training: bool = True) -> torch.Tensor:
    """Inverted dropout of ``x`` (any shape) with drop probability ``p`` (module doc); ``x`` itself when not
    ``training`` or ``p == 0``."""
    if not 0 <= p <= 1:
        raise ValueError(f"dropout probability must be in [0, 1], got {p}")
    if not training or p == 0:
        return x
    if p == 1:
        return x * 0
    dropped = drop_mask(x.shape, p, x.device)
    return x.masked_fill(dropped, 0).mul_(1 / (1 - quantized_drop_probability(p)))


class Dropout(nn.Dropout):
    """``nn.Dropout`` with the mask of :func:`dropout`. ``x: any shape -> same shape``."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return dropout(input, self.p, self.training)


def use_fast_dropout(model: nn.Module) -> nn.Module:
    """Replace every plain ``nn.Dropout`` in ``model`` (its own modules and timm's) by :class:`Dropout` with the
    same ``p``, in place; returns ``model``. State-dict keys do not change (dropout has no state)."""
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if type(child) is nn.Dropout:
                setattr(module, name, Dropout(child.p))
    return model
