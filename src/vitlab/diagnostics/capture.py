"""Attention read as an operation, not as a class: the attention matrices of any model (vitlab's, timm's, HF
transformers', torchvision's), captured at run time.

Inside :func:`attention_recording` every call of the three operations that compute attention (Vaswani et al.,
"Attention Is All You Need", 2017, sec. 3.2.1, ``softmax(q k^T / sqrt(d)) v``) is intercepted by type, the way the
LRP engine attaches its rules (a ``TorchFunctionMode`` and the vocabulary of :mod:`vitlab.layers.operations`):

- ``F.scaled_dot_product_attention``: its probabilities ``softmax(q k^T * scale + mask)`` are computed beside the
  call (the mask, ``is_causal`` and grouped-query heads as SDPA reads them); the call itself runs unchanged.
- a softmax over the last axis of a query-key product (:func:`~vitlab.layers.operations.is_query_key_product`: two
  batches of token sequences, so not a prototype classifier's ``softmax(z @ protos.T)``) carried only by operations
  of :data:`~vitlab.layers.operations.CARRY` (scaling, bias, mask, cast, element-wise map, reshape) that keep its last
  two axes: timm's and HF's eager attention, torchvision's Swin. Its output is the attention. A query-key product
  that reaches a softmax through any other operation (talking heads' learned mix across heads, Shazeer et al.,
  "Talking-Heads Attention", 2020) is attention the capture cannot read: :attr:`AttentionRecord.unread` names it,
  and :func:`capture_attention` refuses.
- ``F.multi_head_attention_forward`` (``nn.MultiheadAttention``): run with ``need_weights=True,
  average_attn_weights=False`` for the per-head weights; the caller gets the output and the weights it asked for.

vitlab's own :class:`~vitlab.layers.attention.Attention` keeps its switch (:func:`vitlab.layers.capture
.attention_capture`): its frozen heads (ViTCAE eq. 26) attend in two groups and its matrix is kept in the heads'
original order. Each matrix is named by the path of the innermost module that computed it (``blocks.0.attn``; a second
one in the same module ``name#2``). A matrix is ``[B, H, Q, K]``; windowed attention (Swin: timm's, torchvision's,
HF's partition a batch of ``B`` images into ``B * W`` windows, image-major) is ``[B, W, H, Q, K]`` with ``W`` in the
model's window order, and :attr:`AttentionRecord.windows` says ``W``. What no softmax of a query-key product
computes is not captured: linear attention, pooling mixers (PoolFormer), convolutions; channel attention (XCiT's
cross-covariance softmax, ``[B, H, d, d]``) is captured but relates channels, not tokens (docs/foreign_models.md).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field, replace

import torch
from torch import nn
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten

from vitlab.layers import operations
from vitlab.layers.attention import Attention
from vitlab.layers.capture import attention_capture

#: set while a recorder computes for itself (SDPA's probabilities again): a recorder around it reads none of that
_OWN_WORK: ContextVar[bool] = ContextVar("attention_recorder_own_work", default=False)


@dataclass
class AttentionRecord:
    """What one :func:`attention_recording` block captured, in forward order.

    ``maps``: name -> ``[B, H, Q, K]`` (``[B, W, H, Q, K]`` for windowed attention), detached, rows summing to 1.
    ``windows``: name -> ``W`` for the windowed ones. ``ops``: name -> the operation read (``sdpa``, ``softmax``,
    ``multi_head_attention``, ``Attention``: vitlab's own). ``batch``: the batch size of the forward pass (its first
    tensor argument), which tells windows from images. ``unread``: module -> the operations through which a
    query-key product reached a softmax there that the capture does not follow (module doc): attention not in
    ``maps``.
    """

    maps: dict[str, torch.Tensor] = field(default_factory=dict)
    windows: dict[str, int] = field(default_factory=dict)
    ops: dict[str, str] = field(default_factory=dict)
    batch: int | None = None
    unread: dict[str, str] = field(default_factory=dict)

    def add(self, module: str, probs: torch.Tensor, op: str) -> None:
        """Record ``probs: [b, H, Q, K]`` (or ``[b, Q, K]``: one head) computed in ``module``."""
        probs = probs.detach()
        if probs.ndim == 3:
            probs = probs.unsqueeze(1)
        name, repeat = module, 1
        while name in self.maps:
            repeat += 1
            name = f"{module}#{repeat}"
        batch = self.batch or probs.shape[0]
        if probs.shape[0] != batch and probs.shape[0] % batch == 0:
            self.windows[name] = probs.shape[0] // batch
            probs = probs.reshape(batch, self.windows[name], *probs.shape[1:])
        self.maps[name], self.ops[name] = probs, op


def _sdpa_probs(func, args: tuple, kwargs: dict) -> torch.Tensor:
    """SDPA's probabilities ``softmax(q k^T * scale + mask)``, ``[..., Q, K]`` in float32: the same call, in float32,
    with the identity as values (so the mask, ``is_causal``, ``scale`` and grouped-query heads are read by SDPA
    itself) and no dropout."""
    p = operations.sdpa_arguments(args, kwargs)
    q, k = p.pop("query").float(), p.pop("key").float()
    eye = torch.eye(k.shape[-2], dtype=q.dtype, device=q.device).expand(*k.shape[:-1], k.shape[-2])
    mask = p.pop("attn_mask", None)
    mask = mask if mask is None or mask.dtype == torch.bool else mask.float()
    p = {key: value for key, value in p.items() if key != "value"} | {"dropout_p": 0.0}
    return func(q, k, eye, mask, **p)


@contextmanager
def _own_work() -> Iterator[None]:
    """A recorder's own computation: every recorder lets it pass unread, so nested recordings read each matrix once."""
    token = _OWN_WORK.set(True)
    try:
        yield
    finally:
        _OWN_WORK.reset(token)


@dataclass(frozen=True)
class _Product:
    """A query-key product ``[..., Q, K]`` on its way to a softmax: its ``Q, K``, the depth of the module stack
    where it was computed (it is dropped when that module returns), and the operations it went through that the
    capture does not follow (none: the softmax of it is attention)."""

    axes: tuple[int, int]
    depth: int
    unfollowed: tuple[str, ...] = ()


class AttentionRecorder(TorchFunctionMode):
    """The mode of :func:`attention_recording`: reads the attention operations (module doc) into ``record``;
    ``where`` is the stack of module paths the forward pass is in, ``own`` the paths of vitlab's ``Attention``
    modules (left to their own capture)."""

    def __init__(self, record: AttentionRecord, own: set[str]) -> None:
        super().__init__()
        self.record, self.own = record, own
        self.where: list[str] = []
        self._products: dict[int, tuple[torch.Tensor, _Product]] = {}  # query-key products and what carries them

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        module = self.where[-1] if self.where else ""
        if module in self.own or _OWN_WORK.get():
            return func(*args, **kwargs)
        name = operations.op_name(func)[0]
        if name == operations.SDPA:
            with _own_work():
                self.record.add(module, _sdpa_probs(func, args, kwargs), "sdpa")
            return func(*args, **kwargs)
        if name == operations.MULTI_HEAD:
            return self._multi_head(func, module, args, kwargs)
        out = func(*args, **kwargs)
        tensors = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
        if operations.is_query_key_product(name, tensors):
            self._products[id(out)] = out, _Product(tuple(out.shape[-2:]), len(self.where))
            return out
        carried = next((self._products[id(t)][1] for t in tensors if id(t) in self._products), None)
        if carried is None or not isinstance(out, torch.Tensor):
            return out
        if name == "softmax":
            self._softmax(module, out, carried, args[1] if len(args) > 1 else kwargs.get("dim"))
        elif name in operations.CARRY:
            self._products[id(out)] = out, carried
        elif operations.keeps_axes(out.shape, carried.axes):  # the product, transformed in a way not followed
            origin = self.where[carried.depth - 1] if carried.depth else ""
            inside = f" in {module.removeprefix(origin).lstrip('.')}" if module != origin else ""
            self._products[id(out)] = out, replace(carried, unfollowed=(*carried.unfollowed, f"{name}{inside}"))
        return out

    def _softmax(self, module: str, probs: torch.Tensor, product: _Product, dim: int | None) -> None:
        """A softmax of a query-key product: attention when over its key axis and carried only by operations the
        capture follows; otherwise attention it cannot read, named in ``record.unread``."""
        last = dim is not None and dim in (-1, probs.ndim - 1)
        if last and not product.unfollowed and probs.ndim >= 3 and probs.shape[-1] == product.axes[1]:
            with _own_work():
                self.record.add(module, probs, "softmax")
            self._products.clear()  # the next attention starts from its own product
            return
        how = ", ".join(dict.fromkeys(product.unfollowed)) or f"a softmax over axis {dim} of {list(probs.shape)}"
        self.record.unread.setdefault(module, how)

    def _multi_head(self, func, module: str, args: tuple, kwargs: dict):
        """``nn.MultiheadAttention``: the call with per-head weights ``[B, H, Q, K]`` recorded; returns what the
        caller asked for (the weights averaged over heads, or None)."""
        p = operations.multi_head_arguments(args, kwargs)
        asked, average = p["need_weights"], p["average_attn_weights"]
        out, weights = func(**(p | {"need_weights": True, "average_attn_weights": False}))
        self.record.add(module, weights if weights.ndim == 4 else weights.unsqueeze(0), "multi_head_attention")
        return out, (weights.mean(-3) if average else weights) if asked else None

    def enter(self, name: str, inputs: tuple) -> None:
        if not self.where:  # the model's own forward: its batch size, and a fresh set of products
            first = next((t for t in tree_flatten(inputs)[0] if isinstance(t, torch.Tensor)), None)
            self.record.batch = None if first is None else first.shape[0]
            self._products.clear()
        self.where.append(name)

    def leave(self) -> None:
        """The module returns: the products computed inside it go."""
        self.where.pop()
        self._products = {key: kept for key, kept in self._products.items() if kept[1].depth <= len(self.where)}


@contextmanager
def attention_recording(model: nn.Module) -> Iterator[AttentionRecord]:
    """Inside the block, every attention computed by ``model``'s forward passes goes into the yielded record
    (module doc). The forward's outputs are those of the model without the block: exactly where the model calls SDPA
    or a softmax (they run as called), to rounding where vitlab's ``Attention`` runs its eager path and
    ``nn.MultiheadAttention`` its weights path instead of their fused ones."""
    record = AttentionRecord()
    own = {name for name, m in model.named_modules() if isinstance(m, Attention)}
    recorder = AttentionRecorder(record, own)
    with ExitStack() as stack:
        if own:
            stack.enter_context(attention_capture(model))
        for name, m in model.named_modules():
            # an operation's own module (nn.Softmax, nn.Dropout: no parameters, no children) names no attention
            wrapper = not any(True for _ in m.children()) and not any(True for _ in m.parameters())

            def enter(m, args, kwargs, name=name, wrapper=wrapper):
                recorder.enter(recorder.where[-1] if wrapper and recorder.where else name, (args, kwargs))
                if name in own:  # read after this call only what this call computed
                    m.captured = None

            def leave(m, _args, _out, name=name):
                recorder.leave()
                if name in own and m.captured is not None:  # left in place for a recording around this one
                    record.add(name, m.captured, "Attention")

            stack.callback(m.register_forward_pre_hook(enter, with_kwargs=True).remove)
            stack.callback(m.register_forward_hook(leave, always_call=True).remove)
        stack.enter_context(recorder)
        yield record


@torch.no_grad()
def capture_attention(model: nn.Module, x: torch.Tensor, names: list[str] | None = None) -> dict[str, torch.Tensor]:
    """Run ``model(x)`` once and return its attention by module path: ``{name: [B, H, Q, K]}`` (windowed attention
    ``[B, W, H, Q, K]``), every row a softmax row (module doc). ``names``: keep only these.

    Raises :class:`ValueError` when the forward pass computed no attention the module doc lists, or attention it
    cannot read (:attr:`AttentionRecord.unread`) that ``names`` does not leave out; :class:`KeyError` when ``names``
    holds one that it did not compute.
    """
    with attention_recording(model) as record:
        model(x)
    if record.unread and (names is None or set(names) & set(record.unread)):
        read = f"names= may take the attention it read: {list(record.maps)}" if record.maps else "it read none"
        raise ValueError(f"{type(model).__name__} {unread_attention(record)}; {read}")
    if not record.maps:
        raise ValueError(
            f"{type(model).__name__} computed no attention vitlab can read (no scaled_dot_product_attention, softmax "
            "of a query-key product of token sequences or nn.MultiheadAttention); linear attention, token mixers and "
            "a softmax over classes or prototypes have no attention matrix"
        )
    if names is None:
        return record.maps
    unknown = sorted(set(names) - set(record.maps))
    if unknown:
        raise KeyError(f"no attention computed in {unknown}; computed in: {list(record.maps)}")
    return {name: record.maps[name] for name in names}


def unread_attention(record: AttentionRecord) -> str:
    """What ``record.unread`` says, as part of a sentence."""
    ways: dict[str, list[str]] = {}
    for module, how in record.unread.items():
        ways.setdefault(how, []).append(module or "the model")
    where = "; ".join(
        f"{', '.join(modules[:3])}{f' ({len(modules)} modules)' if len(modules) > 3 else ''} through {how}"
        for how, modules in ways.items()
    )
    return (
        f"computes attention that vitlab cannot read, a query-key product that reaches its softmax in {where}: the "
        "capture follows only scaling, bias, masks, casts, element-wise maps and reshapes (docs/foreign_models.md)"
    )
