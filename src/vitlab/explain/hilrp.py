"""HiLRP: relevance rules attached to operation types, not to architectures.

The HiLRP abstract ("the attention and resolution-reduction operators in current ViTs can be decomposed into four
operation types: linear maps, bilinear mixing, normalization or gating, and reindexing; each operation admits a
relevance rule that satisfies conservation") is implemented in the Gradient x Input formulation of AttnLRP
(Achtibat et al., "AttnLRP: Attention-Aware Layer-Wise Relevance Propagation for Transformers", ICML 2024, sec. 3):
the network runs forward unchanged, each operation's backward is replaced by its rule, and the relevance of a tensor
``t`` is ``t * dlogit/dt``. The operations are intercepted by type at run time (a ``TorchFunctionMode``), so any
network built from them is explained without an adapter; an operation without a rule that would carry relevance is
refused by name (:class:`UnsupportedOperation`).

The rules (docs/explain.md, "HiLRP: relevance rules by operation type", has the table of operations): linear maps
take the gradient (LRP-0); bilinear mixing splits it uniformly, half to each side (AttnLRP, prop. 3.2); normalizers
and gates are held constant (CP-LRP, Ali et al., ICML 2022; :mod:`vitlab.explain.normalisation`), softmax by
AttnLRP's rule, activations by the identity rule ``(f(x) - f(0)) / x`` (AttnLRP, sec. 3.3); reindexing moves
relevance with the values it indexes; the fused attention operations run as their plain forms
(:mod:`vitlab.layers.operations`). Every constant that enters additively becomes a leaf of the graph whose share
``c * dlogit/dc`` is absorbed, so ``sum(relevance of the input) + absorbed = logit`` holds to rounding
(:func:`relevance`).
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten, tree_map

from vitlab.explain.adapters import UnsupportedOperation
from vitlab.explain.normalisation import NORMALISATION_RULES
from vitlab.layers import operations
from vitlab.layers.operations import CONSTANT, CONSTRUCTORS, ELEMENTWISE, PASS, op_name


@dataclass(frozen=True)
class Variant:
    """Which rule the linear maps and the softmax take.

    ``linear``: ``"zero"`` (LRP-0: the gradient), ``"epsilon"`` (``z / (z + eps sign z)``) or ``"gamma"`` (positive
    weights boosted by ``gamma``; Montavon et al., "Layer-Wise Relevance Propagation: An Overview", 2019, sec. 10.2).
    ``softmax``: ``"attnlrp"`` (its gradient, AttnLRP prop. 3.3) or ``"constant"`` (CP-LRP: held constant, so the
    query-key path carries no relevance).
    """

    linear: str = "zero"
    softmax: str = "attnlrp"
    epsilon: float = 1e-2
    gamma: float = 0.25

    def __post_init__(self) -> None:
        if self.linear not in ("zero", "epsilon", "gamma") or self.softmax not in ("attnlrp", "constant"):
            raise ValueError(
                f"Variant(linear={self.linear!r}, softmax={self.softmax!r}): linear must be zero, epsilon or gamma "
                "and softmax attnlrp or constant"
            )


@dataclass
class Ledger:
    """What the rules of one forward pass absorb: additive constants as leaves, and terms counted in backward;
    ``cuts``, the operations where the relevance stopped (what a logit that carries none is refused by)."""

    leaves: list[torch.Tensor] = field(default_factory=list)
    terms: list[torch.Tensor] = field(default_factory=list)
    cuts: list[str] = field(default_factory=list)
    #: backward terms are counted only in the explaining backward pass (not in one the model runs itself, e.g. to
    #: time its attention paths)
    counting: bool = False

    def leaf(self, c: Any, like: torch.Tensor) -> torch.Tensor:
        t = torch.as_tensor(c, dtype=like.dtype, device=like.device).detach().clone().requires_grad_(True)
        self.leaves.append(t)
        return t


def _dot(a: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """``sum(a * g)`` where ``g`` is nonzero (a masked ``-inf`` logit takes no gradient and no relevance)."""
    return torch.where(g == 0, torch.zeros_like(g), a * g).sum()


class _AttnLRPSoftmax(torch.autograd.Function):
    """The softmax with AttnLRP's rule (prop. 3.3): relevance ``x * grad`` with the true gradient; the remainder
    ``sum(y * g) - sum(x * grad)`` is absorbed (the rule's bias term)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, dim: int, ledger: Ledger) -> torch.Tensor:
        y = torch.softmax(x, dim)
        ctx.save_for_backward(x, y)
        ctx.dim, ctx.ledger = dim, ledger
        return y

    @staticmethod
    def backward(ctx, g: torch.Tensor):
        x, y = ctx.saved_tensors
        grad = y * (g - (y * g).sum(ctx.dim, keepdim=True))
        if ctx.ledger.counting:
            ctx.ledger.terms.append((_dot(y, g) - _dot(x, grad)).detach())
        return grad, None, None


def _live(t: Any) -> bool:
    return isinstance(t, torch.Tensor) and t.requires_grad


def _any_live(tree: Any) -> bool:
    return any(_live(t) for t in tree_flatten(tree)[0])


# ----------------------------------------------------------------------------------------------------- the rules
class RelevanceMode(TorchFunctionMode):
    """Inside the block, every operation on a tensor that carries relevance (requires grad) runs with its rule;
    the absorbed constants go into ``ledger``. Parameters must not require grad (:func:`relevance` sees to it)."""

    def __init__(self, variant: Variant, ledger: Ledger) -> None:
        super().__init__()
        self.variant, self.ledger = variant, ledger
        #: id -> (weak reference, operation) of the tensors computed from an input that carries relevance by an
        #: operation that carries none back (a held gain, a comparison, a cast): they may enter only as factors
        self.held: dict[int, tuple[weakref.ref, str]] = {}

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if not torch.is_grad_enabled():
            return func(*args, **kwargs)
        inputs = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
        live = any(t.requires_grad for t in inputs)
        out = self._apply(func, args, kwargs) if live else func(*args, **kwargs)
        source = next((s for s in map(self.held_by, inputs) if s is not None), None)
        if (live or source) and not _any_live(out) and op_name(func)[0] not in CONSTRUCTORS:
            source = source or op_name(func)[0]
            self.ledger.cuts.append(source)
            for t in tree_flatten(out)[0]:
                if isinstance(t, torch.Tensor):
                    self.held[id(t)] = (weakref.ref(t), source)
        return out

    def held_by(self, t: Any) -> str | None:
        """The operation whose output ``t`` derives from, if ``t`` was cut from the relevance (:attr:`held`)."""
        entry = self.held.get(id(t)) if isinstance(t, torch.Tensor) else None
        return entry[1] if entry is not None and entry[0]() is t else None

    def _apply(self, func, args, kwargs):
        """``func`` with its rule, on arguments of which one at least carries relevance."""
        name, in_place, reverse = op_name(func)
        if name in ("max", "min") and len(args) > 1 and isinstance(args[1], torch.Tensor):
            name = f"{name}imum of two tensors"  # element-wise: a constant that wins would not be absorbed
        rule = _RULES.get(name)
        if rule is None:
            if name in PASS:
                return func(*args, **kwargs)
            if name in CONSTANT:
                args, kwargs = tree_map(lambda t: t.detach() if _live(t) else t, (args, kwargs))
                return func(*args, **kwargs)
            if name in ELEMENTWISE:
                return self._identity(func, args, kwargs, in_place)
            out = func(*args, **kwargs)
            if _any_live(out):
                raise UnsupportedOperation(
                    f"no relevance rule for {name} on a tensor that carries relevance; express the model in "
                    "linear, bilinear, normalisation and re-indexing operations, or pick a gradient method"
                )
            return out
        if reverse:
            args = (args[1], args[0], *args[2:])
        out = rule(self, name, args, kwargs)
        if in_place and isinstance(args[0], torch.Tensor):
            return args[0].copy_(out)
        return out

    # the leaves -----------------------------------------------------------------------------------------------
    def constant(self, t: Any, like: torch.Tensor) -> Any:
        """A constant that enters additively, as a leaf whose share is absorbed (None and bool tensors stay). A value
        computed from the relevance by an operation held constant (:attr:`held`) is refused by name: its share is
        the input's, not a constant's; unless it is a mask of 0 and ``-inf`` (empty slots' keys), whose share is zero
        (a masked logit takes no gradient)."""
        if t is None or (isinstance(t, torch.Tensor) and (t.requires_grad or not t.is_floating_point())):
            return t
        source = self.held_by(t)
        if source is not None and not ((t == 0) | (t == float("-inf"))).all():
            raise UnsupportedOperation(
                f"the output of {source}, which carries no relevance back (held constant as a gain, or not "
                "differentiable), enters a sum beside the relevance, where its share would be booked as absorbed; "
                "use it only as a factor (a normaliser, a mask), or pick a gradient method"
            )
        if isinstance(t, torch.Tensor | float | int) and not isinstance(t, bool):
            return self.ledger.leaf(t, like)
        return t

    def _identity(self, func, args, kwargs, in_place: bool):
        """An element-wise ``f`` by the identity rule: ``x * stopgrad((f(x) - f(0)) / x) + f(0)``, ``f(0)`` a leaf."""
        x = args[0]
        kwargs = {k: v for k, v in kwargs.items() if k != "inplace"}
        y = func(x.clone(), *args[1:], **kwargs)
        y0 = func(torch.zeros((), dtype=x.dtype, device=x.device), *args[1:], **kwargs)
        gain = torch.where(x == 0, torch.zeros_like(x), (y - y0) / torch.where(x == 0, torch.ones_like(x), x))
        out = x * gain.detach()
        if y0.item() != 0:
            out = out + self.ledger.leaf(y0, x)
        return x.copy_(out) if in_place else out

    def softmax(self, x: torch.Tensor, dim: int) -> torch.Tensor:
        if self.variant.softmax == "constant":
            return torch.softmax(x, dim).detach()
        return _AttnLRPSoftmax.apply(x, dim, self.ledger)

    def bilinear(self, op, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        """``op(a, b)`` with the uniform rule when both sides carry relevance: half of the gradient to each side
        (the forward value is exact: two equal halves of a power-of-two split)."""
        if _live(a) and _live(b):
            return 0.5 * op(a, b.detach()) + 0.5 * op(a.detach(), b)
        return op(a, b)

    def affine(self, op, x: torch.Tensor, weight: torch.Tensor, bias: Any, **kw) -> torch.Tensor:
        """A linear map or convolution ``op(x, weight) + bias`` with the variant's rule; the bias, and what the
        epsilon and gamma rules leave over, are absorbed."""
        shaped = None if bias is None or op is F.linear else bias.reshape(-1, *(1,) * (x.ndim - 2))
        if _live(weight):
            lin = self.bilinear(lambda a, w: op(a, w, None, **kw), x, weight)
            return lin if bias is None else lin + self.constant(bias if shaped is None else shaped, x)
        lin = op(x, weight, None, **kw)
        z = lin if bias is None else op(x, weight, bias, **kw)
        v = self.variant
        if v.linear == "zero":
            return lin if bias is None else lin + self.constant(bias if shaped is None else shaped, x)
        if v.linear == "epsilon":
            stab = z + v.epsilon * torch.where(z >= 0, 1.0, -1.0)
            part = lin * (z / stab).detach()
        else:
            boosted = op(x, weight + v.gamma * weight.clamp_min(0), bias, **kw)
            lin_g = op(x, weight + v.gamma * weight.clamp_min(0), None, **kw)
            ratio = z / torch.where(boosted == 0, torch.ones_like(boosted), boosted)
            part = lin_g * ratio.detach()
        return part + self.ledger.leaf(z.detach() - part.detach(), x)


def _binary(mode: RelevanceMode, name: str, args, kwargs):
    a, b = args[0], args[1]
    if name in ("mul", "matmul", "mm", "bmm"):
        return mode.bilinear(torch.mul if name == "mul" else torch.matmul, a, b)
    if name == "div":  # the denominator is a normaliser: held constant
        return torch.div(a, b.detach() if _live(b) else b, **kwargs)
    like = a if isinstance(a, torch.Tensor) else b
    op = torch.add if name == "add" else torch.sub
    return op(mode.constant(a, like), mode.constant(b, like), **kwargs)


def _pow(mode: RelevanceMode, name: str, args, kwargs):
    """``x ** n``: for a whole ``n >= 1`` the product of ``n`` factors ``x``, by the uniform rule of a product (each
    factor ``1/n`` of the gradient, AttnLRP prop. 3.2): the relevance of ``x`` is ``x ** n * g``, conserved; ``x **
    0`` is a constant. Any other exponent is a gain (a normaliser's ``** -0.5``), held constant (:data:`CONSTANT`);
    an exponent that carries relevance has no rule."""
    x, n = args[0], args[1] if len(args) > 1 else kwargs.get("exponent", 2)
    if _live(n):
        raise UnsupportedOperation("no relevance rule for pow with an exponent that carries relevance")
    whole = float(n) if not isinstance(n, torch.Tensor) or n.numel() == 1 else None
    if whole is None or whole < 0 or not whole.is_integer():
        return torch.pow(x.detach(), n)
    if whole == 0:
        return mode.constant(torch.ones_like(x.detach()), x)
    return x.detach().pow(whole - 1) * x


def _square(mode: RelevanceMode, name: str, args, kwargs):
    """``x.square()``: the bilinear product ``x * x`` (:func:`_pow` with ``n = 2``)."""
    return _pow(mode, "pow", (args[0], 2), {})


def _einsum(mode: RelevanceMode, name: str, args, kwargs):
    eq, *ops = args
    ops = list(ops[0]) if len(ops) == 1 and isinstance(ops[0], list | tuple) else ops
    live = [i for i, t in enumerate(ops) if _live(t)]
    if len(live) > 2:
        raise UnsupportedOperation(
            f"no relevance rule for an einsum of {len(live)} relevance-carrying operands; write it as products of two "
            "operands, or use a gradient method (saliency, input_x_gradient)"
        )
    if len(live) < 2:
        return torch.einsum(eq, *ops)
    i, j = live

    def op(a, b):
        ops[i], ops[j] = a, b
        return torch.einsum(eq, *ops)

    return mode.bilinear(op, ops[i], ops[j])


def _additive(mode: RelevanceMode, name: str, args, kwargs):
    """Operations that place constants beside the relevance-carrying values (``cat`` of a class token, ``where``
    and ``masked_fill`` with a constant, ``scatter`` into a constant): the constants become leaves."""
    like = next(t for t in tree_flatten((args, kwargs))[0] if _live(t))
    args, kwargs = tree_map(lambda t: mode.constant(t, like) if isinstance(t, torch.Tensor) else t, (args, kwargs))
    if name == "masked_fill":
        x, mask, value = args
        return torch.where(mask, mode.constant(value, like), x)
    if name == "where":  # python numbers beside the tensors
        args = (args[0], *(mode.constant(a, like) for a in args[1:3]))
    return getattr(torch, name)(*args, **kwargs)


def _setitem(mode: RelevanceMode, name: str, args, kwargs):
    """``x[index] = value`` in place: a constant ``x`` (a buffer the model fills) becomes a leaf first, a constant
    ``value`` a leaf too, so that what stays of either is absorbed."""
    x, index, value = args
    if not _live(x) and x.is_floating_point():
        x.copy_(mode.constant(x.clone(), x))
    return torch.Tensor.__setitem__(x, index, mode.constant(value, x))


def _softmax(mode: RelevanceMode, name: str, args, kwargs):
    x, dim = args[0], args[1] if len(args) > 1 else kwargs["dim"]
    dtype = kwargs.get("dtype") or (args[3] if len(args) > 3 else None)
    return mode.softmax(x.to(dtype) if dtype is not None else x, dim)


def _linear(mode: RelevanceMode, name: str, args, kwargs):
    x, weight = args[0], args[1] if len(args) > 1 else kwargs["weight"]
    bias = args[2] if len(args) > 2 else kwargs.get("bias")
    extra = {k: v for k, v in kwargs.items() if k not in ("weight", "bias")}
    if name != "linear":  # F.conv*(x, w, b, stride, padding, dilation, groups); the transposes order theirs otherwise
        order = ("stride", "padding", "output_padding", "groups", "dilation") if "transpose" in name else None
        for key, value in zip(order or ("stride", "padding", "dilation", "groups"), args[3:], strict=False):
            extra[key] = value
    return mode.affine(getattr(F, name), x, weight, bias, **extra)


def _pad(mode: RelevanceMode, name: str, args, kwargs):
    """Zero padding is re-indexing; a constant ``value`` beside it is absorbed (EfficientViT pads ``v`` with ones)."""
    x, pad = args[0], args[1]
    rest = dict(zip(("mode", "value"), args[2:], strict=False)) | kwargs
    value = rest.pop("value", None)
    if not value or rest.get("mode", "constant") != "constant":
        return F.pad(x, pad, **rest)
    return F.pad(x, pad) + mode.constant(F.pad(torch.zeros_like(x.detach()), pad, value=value), x)


def _attention(mode: RelevanceMode, name: str, args, kwargs):
    """SDPA and ``nn.MultiheadAttention``: their plain forms (:data:`vitlab.layers.operations.PLAIN_FORMS`) run under
    the mode, so that each part takes its rule: the products bilinear, the softmax its own, masks and biases absorbed.
    SDPA runs without dropout; its grouped-query heads are refused."""
    if name == operations.SDPA:
        args, kwargs = (), operations.sdpa_arguments(args, kwargs) | {"dropout_p": 0.0}
        if kwargs.pop("enable_gqa", False):
            raise UnsupportedOperation("no relevance rule for grouped-query attention; repeat the keys and values")
    with mode:
        return operations.PLAIN_FORMS[name](*args, **kwargs)


_RULES = {
    **dict.fromkeys(("add", "sub", "mul", "div", "matmul", "mm", "bmm"), _binary),
    **dict.fromkeys(("cat", "stack", "hstack", "vstack", "where", "masked_fill", "scatter", "scatter_add"), _additive),
    **dict.fromkeys(("scatter_reduce", "index_add", "index_copy", "index_put"), _additive),
    **dict.fromkeys(("linear", "conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d"), _linear),
    **dict(einsum=_einsum, pow=_pow, square=_square, setitem=_setitem, softmax=_softmax, pad=_pad),
    **NORMALISATION_RULES,
    **dict.fromkeys(operations.PLAIN_FORMS, _attention),
}


# ------------------------------------------------------------------------------------------------ the relevance
def _gradients(score: torch.Tensor, inputs: list[torch.Tensor], cuts: list[str]) -> tuple[Any, ...]:
    """``d score / d inputs`` through the rules; a logit that carries no relevance (every path from the input cut by
    an operation held constant or not differentiable), or a graph autograd cannot follow, is refused by name."""
    cut = ", ".join(dict.fromkeys(cuts)) or "an operation outside the rules"
    if not score.requires_grad:
        raise UnsupportedOperation(
            f"no relevance reaches the logit: {cut} carries none back (held constant as a gain, or not "
            "differentiable) on every path from the input; LRP explains logits computed by its rules (docs/explain.md)"
        )
    try:
        return torch.autograd.grad(score, inputs, allow_unused=True)
    except RuntimeError as e:
        raise UnsupportedOperation(
            f"autograd cannot follow the relevance through the model ({str(e).splitlines()[0]}); operations that cut "
            f"it: {cut}; pick a gradient method"
        ) from e


def relevance(
    model: nn.Module, logits_of, x: torch.Tensor, target: torch.Tensor, variant: Variant = Variant()
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """HiLRP relevance of ``logits_of(model, x)[:, target]`` for ``x: [B, C, H, W]``, one image at a time: the
    input relevance ``[B, C, H, W]``, what the rules absorbed ``[B]`` and the logit ``[B]``; their sum equals the
    logit to rounding (the check of conservation)."""
    params = [p for p in model.parameters() if p.requires_grad]
    out: tuple[list, list, list] = ([], [], [])
    try:
        for p in params:
            p.requires_grad_(False)
        for i in range(x.shape[0]):
            ledger = Ledger()
            xi = x[i : i + 1].detach().clone().requires_grad_(True)
            with torch.enable_grad(), RelevanceMode(variant, ledger):
                score = logits_of(model, xi)[0, target[i]]
            ledger.counting = True
            grads = _gradients(score, [xi, *ledger.leaves], ledger.cuts)
            absorbed = sum((_dot(c, g) for c, g in zip(ledger.leaves, grads[1:], strict=True) if g is not None), 0.0)
            out[0].append((xi * grads[0]).detach())
            out[1].append(torch.as_tensor(absorbed + sum(ledger.terms, 0.0), dtype=x.dtype).detach())
            out[2].append(score.detach())
    finally:
        for p in params:
            p.requires_grad_(True)
    return torch.cat(out[0]), torch.stack(out[1]), torch.stack(out[2])
