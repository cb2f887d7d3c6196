"""Dropout (Srivastava et al. 2014, sec. 2) whose mask costs what its arithmetic costs.

torch's CPU dropout draws one Bernoulli variate per element, each from its own call of the generator; on a ViT's
MLP hidden ``[B, N, 4C]`` that costs several times the matrix product next to it. On a CPU, :func:`dropout` has two
ways, chosen by ``p`` and the ``VITLAB_DROPOUT`` switch alone (so a seed gives the same masks on every machine):

**Sparse, ``VITLAB_DROPOUT=sparse`` and ``p <= 0.25``** (opt-in; see :data:`SPARSE_MAX_P`): only the dropped
elements are drawn. In a row of independent Bernoulli(p) trials the gaps between consecutive successes are
independent geometric variates, so the sorted positions of the dropped elements are the cumulative sums of
``geometric_(p)`` draws (:func:`dropped_positions`): about ``p * n`` generator calls instead of ``n``, and each
element is dropped independently with probability ``p`` exactly, as with torch's. The output is ``x * (1 / (1 -
p))`` with the dropped positions set to 0, and the gradient the same of ``grad``; the saved state is the positions.

**Dense, the default**: the mask is cut from the bits of one ``random_`` over int64 words, 16 bits per
element (a quarter of the generator calls of one draw per element), and applied as one multiplication by a mask in
the input's dtype, forward and backward:

- element ``i`` is dropped when its 16 bits, read as a signed integer and shifted right by one (15 uniform bits,
  ``[-2**14, 2**14)``), fall below ``-2**14 + round(p * 2**15)``: with probability
  ``p_q = round(p * 2**15) / 2**15``, within ``2**-16`` of ``p``. 15 bits, not 16, so that the comparison is one
  subtraction in int16 that cannot overflow: the mask is built in the 2 bytes per element the bits came in, and a
  bf16 or fp16 input's multiplier never widens to int32 and back;
- a kept element is scaled by ``1 / (1 - p_q)``, so the expectation is the input's exactly, as with torch's;
- the bits come from torch's default generator of the tensor's device, so ``torch.manual_seed`` makes the masks
  reproducible;
- the multiplier (``1 / (1 - p_q)`` where kept, 0 where dropped; 1 and 0 for bf16 and fp16, whose kept elements are
  scaled by the Python float in the same pass, ``addcmul``, so the scale is not rounded to 8 bits) is built by
  integer arithmetic on the bits and viewed as floats: on a CPU, torch's bool masks (``masked_fill``,
  ``bool.to(float)``) run element by element. The output is bit for bit what a masked fill and a scale give, and
  the backward pass multiplies the gradient by the same saved multiplier (4 bytes per element in fp32, where a
  bool mask kept 1).

On an accelerator (CUDA and any other non-CPU device), torch's fused dropout kernel is already as cheap as its
arithmetic, and :func:`dropout` calls it.

:class:`Dropout` is ``nn.Dropout`` with this mask (no parameters: state-dict keys do not change);
:func:`use_fast_dropout` swaps it into a built model, for vitlab's own modules and timm's alike. Under
``torch.compile`` it is the compiler's own dropout (``F.dropout``, drawn and applied inside the graph, no graph
break): a compiled network draws other masks than an eager one, with the drop probability ``p`` itself.
Drop-path (stochastic depth) draws one variate per sample, ``[B, 1, 1]``, and is left to timm's ``DropPath``.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

#: uniform bits per element (of the 16 drawn, the sign-extended top 15); the drop probability is rounded to a
#: multiple of ``2**-MASK_BITS``
MASK_BITS = 15
#: with ``VITLAB_DROPOUT=sparse`` in the environment, up to this drop probability the dropped positions are drawn
#: (the sparse way); by default (``mask``) every ``p`` takes the mask way. Why the sparse way is opt-in:
#: docs/benchmarks.md, "Sparse dropout".
SPARSE_MAX_P = 0.25 if os.environ.get("VITLAB_DROPOUT", "mask") == "sparse" else -1.0


def quantized_drop_probability(p: float) -> float:
    """The drop probability of the dense mask for ``p``: ``round(p * 2**15) / 2**15`` (at least one step above zero
    for ``p > 0``)."""
    steps = 2**MASK_BITS
    return max(round(p * steps), 1 if p > 0 else 0) / steps


def realised_drop_probability(p: float) -> float:
    """The drop probability :func:`dropout` realises on a CPU: ``p`` itself on the sparse way (``p <=
    SPARSE_MAX_P``), :func:`quantized_drop_probability` on the dense one."""
    return p if p <= SPARSE_MAX_P else quantized_drop_probability(p)


def dropped_positions(
    count: int, p: float, device: torch.device | str = "cpu", draw: int | None = None
) -> torch.Tensor:
    """int64 ``[k]``: the sorted flat indices of the dropped elements among ``count``, each element dropped
    independently with probability ``0 < p < 1``: the cumulative sums of geometric gaps (trials up to and including
    a success), minus one. Drawn from torch's default generator, in float64 (exact integers up to ``2**53``), ``draw``
    gaps at a time (default: the mean count plus 8 standard deviations)."""
    if draw is None:
        mean = count * p
        draw = int(mean + 8 * math.sqrt(mean) + 16)
    ends = torch.empty(draw, dtype=torch.float64, device=device).geometric_(p).cumsum_(0)
    while ends[-1] <= count:  # every trial up to ``count`` covered; a shortfall has probability below 1e-15
        more = torch.empty(draw, dtype=torch.float64, device=device).geometric_(p).cumsum_(0).add_(ends[-1])
        ends = torch.cat([ends, more])
    positions = ends.to(torch.int64).sub_(1)
    return positions[: int(torch.searchsorted(positions, count))]


def _scaled_with_zeros(x: torch.Tensor, positions: torch.Tensor, scale: float) -> torch.Tensor:
    """``x * scale`` (row-major contiguous) with the flat ``positions`` set to 0."""
    out = x.mul(scale)
    if not out.is_contiguous():
        out = out.contiguous()
    out.view(-1).index_fill_(0, positions, 0)
    return out


_SAME_SIZE_INT = {2: torch.int16, 4: torch.int32, 8: torch.int64}


def _threshold(p: float) -> int:
    """Element ``i`` is dropped when its 16 bits, as a signed integer shifted right by one, are below this."""
    return -(2 ** (MASK_BITS - 1)) + round(quantized_drop_probability(p) * 2**MASK_BITS)


def _random_words(count: int, device: torch.device | str) -> torch.Tensor:
    """int64 words from one ``random_`` (torch's default generator) whose int16 view holds ``count`` uniform values.
    Callers view them in their own frame: a dtype view returned out of a graph break confuses ``torch.compile``."""
    return torch.empty((count + 3) // 4, dtype=torch.int64, device=device).random_(-(2**63), 2**63 - 1)


def drop_mask(shape: torch.Size | tuple[int, ...], p: float, device: torch.device | str = "cpu") -> torch.Tensor:
    """A bool mask of ``shape``, True where an element is dropped, each with probability
    :func:`quantized_drop_probability` of ``p``, independently."""
    count = math.prod(shape)
    return _random_words(count, device).view(torch.int16)[:count].bitwise_right_shift_(1).view(shape) < _threshold(p)


def kept_bits(bits: torch.Tensor, p: float) -> torch.Tensor:
    """int16 ``bits`` (overwritten) -> int16, -1 (all ones) where the element is kept and 0 where it is dropped:
    ``~(((bits >> 1) - threshold) >> 15)``, every step in place and within int16's range."""
    return bits.bitwise_right_shift_(1).sub_(_threshold(p)).bitwise_right_shift_(15).bitwise_not_()


def keep_multiplier(
    shape: torch.Size | tuple[int, ...], p: float, dtype: torch.dtype, value: float, device: torch.device | str = "cpu"
) -> torch.Tensor:
    """A tensor of ``shape`` and ``dtype`` that is ``value`` where an element is kept and 0 where it is dropped,
    with the mask :func:`drop_mask` draws from the same generator state. Built without bool tensors, in place on the
    int16 bits: the sign of ``(bits >> 1) - threshold`` (in ``[-2**15, 2**15)``, no overflow; -1 dropped, 0 kept),
    inverted, selects the bit pattern of ``value`` (widened first for a 4- or 8-byte dtype)."""
    itemsize = torch.empty((), dtype=dtype).element_size()
    int_dtype = _SAME_SIZE_INT[itemsize]
    pattern = torch.tensor(value, dtype=dtype).view(int_dtype).item()
    count = math.prod(shape)
    keep = kept_bits(_random_words(count, device).view(torch.int16)[:count], p)
    if itemsize != 2:
        keep = keep.to(int_dtype)
    return keep.bitwise_and_(pattern).view(dtype).view(shape)


def _times(x: torch.Tensor, multiplier: torch.Tensor, scale: float) -> torch.Tensor:
    """``x * multiplier * scale`` in one pass: ``addcmul`` onto a broadcast zero computes ``scale * x * multiplier``
    in the dtype's accumulation type and rounds once, as a multiplication and a scale in place do (the tests check
    bit for bit), without a second pass over the output."""
    if scale == 1.0:
        return torch.mul(x, multiplier)
    return torch.addcmul(x.new_zeros(()).expand_as(x), x, multiplier, value=scale)


class _Masked(torch.autograd.Function):
    """``drop(x, mask, scale)`` with the gradient ``drop(grad, mask, scale)``: the mask is saved, not the input.
    ``drop`` is :func:`_scaled_with_zeros` (``mask`` the dropped positions) or :func:`_times` (``mask`` the
    multiplier; ``scale`` 1.0 where the multiplier holds it already)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, mask: torch.Tensor, scale: float, drop: Callable) -> torch.Tensor:
        ctx.save_for_backward(mask)
        ctx.scale, ctx.drop = scale, drop
        return drop(x, mask, scale)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None, None, None]:
        (mask,) = ctx.saved_tensors
        return ctx.drop(grad, mask, ctx.scale), None, None, None


def dropout(x: torch.Tensor, p: float, training: bool = True) -> torch.Tensor:
    """Inverted dropout of ``x`` (any shape) with drop probability ``p`` (module doc); ``x`` itself when not
    ``training`` or ``p == 0``."""
    if not 0 <= p <= 1:
        raise ValueError(f"dropout probability must be in [0, 1], got {p}")
    if not training or p == 0:
        return x
    if p == 1:
        return x * 0
    # An accelerator: its own fused kernel. Under torch.compile: the compiler's dropout, drawn inside the graph
    # (an in-place draw or a draw of data-dependent length would break it in two at every dropout).
    if x.device.type != "cpu" or not x.is_floating_point() or torch.compiler.is_compiling():
        return F.dropout(x, p, training=True)
    if p <= SPARSE_MAX_P:
        return _Masked.apply(x, dropped_positions(x.numel(), p, x.device), 1 / (1 - p), _scaled_with_zeros)
    scale = 1 / (1 - quantized_drop_probability(p))
    if x.element_size() >= 4:  # the scale in the multiplier: one multiplication
        return _Masked.apply(x, keep_multiplier(x.shape, p, x.dtype, scale, x.device), 1.0, _times)
    return _Masked.apply(x, keep_multiplier(x.shape, p, x.dtype, 1.0, x.device), scale, _times)


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
