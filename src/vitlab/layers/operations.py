"""The vocabulary of operations spoken by whatever reads a forward pass by operation type (HiLRP,
:mod:`vitlab.explain.hilrp`; the attention capture, :mod:`vitlab.diagnostics.capture`): the name of an intercepted
callable (:func:`op_name`), the classes of operations (the table of docs/explain.md, "HiLRP: relevance rules by
operation type"), and the operations that compute attention (Vaswani et al., "Attention Is All You Need", NeurIPS
2017, sec. 3.2) with their matching: ``F.scaled_dot_product_attention``, ``F.multi_head_attention_forward`` (what
``nn.MultiheadAttention`` runs) and a softmax over the last axis of a query-key product (:func:`is_query_key_product`)
reached through operations that keep it one (:data:`CARRY`). The two fused ones have plain forms (:data:`PLAIN_FORMS`),
the same function in linear maps, the products ``q k^T`` and ``A v``, a softmax, additive constants and reindexing,
which a ``TorchFunctionMode`` sees part by part (torch's ``multi_head_attention_forward`` hands itself back to the mode
before any part runs). Each reader adds only what it does with a match; outside a mode each plain form computes what
torch's does (tests/layers/test_operations.py, tests/explain/test_multihead.py).
"""

from __future__ import annotations

import inspect
from collections import Counter
from types import SimpleNamespace
from typing import Any

import torch
import torch.nn.functional as F

_BINARY = {"add", "sub", "mul", "truediv", "div", "matmul", "and", "or", "xor", "pow", "floordiv", "mod"}
_ALIASES = {"truediv": "div", "divide": "div", "multiply": "mul", "subtract": "sub", "concat": "cat"}
_ALIASES |= {"concatenate": "cat", "swapaxes": "transpose", "swapdims": "transpose", "rsub": "rsub"}
_ALIASES |= {"linalg_vector_norm": "vector_norm", "linalg_norm": "norm"}


def _names(words: str) -> frozenset[str]:
    return frozenset(words.split())


#: gradient passes unchanged: the values move, or the map is linear without a constant
PASS = _names(
    "view view_as reshape reshape_as permute transpose t T mT flatten unflatten contiguous getitem unsqueeze squeeze "
    "expand expand_as repeat tile repeat_interleave broadcast_to roll flip narrow select index_select gather "
    "take_along_dim split split_with_sizes chunk tensor_split unbind iter clone to float double half bfloat16 type "
    "type_as movedim moveaxis diagonal unfold fold pixel_shuffle pixel_unshuffle dropout dropout1d dropout2d "
    "dropout3d alpha_dropout feature_alpha_dropout max_pool1d max_pool2d max_pool3d adaptive_max_pool1d "
    "adaptive_max_pool2d max amax min amin topk sort tril triu sum mean nansum cumsum avg_pool1d avg_pool2d "
    "avg_pool3d adaptive_avg_pool1d adaptive_avg_pool2d adaptive_avg_pool3d interpolate neg positive "
    "masked_select"
)
#: the output is a gain or a statistic: computed, then held constant (normalisers, masks, signs). It may only enter
#: as a factor: entering a sum (or being the logit itself) would book its share as absorbed, and is refused by name
CONSTANT = _names("sqrt rsqrt norm vector_norm var std var_mean std_mean reciprocal sign floor ceil round trunc frac")
#: new tensors of a tensor's shape, type or device, whose values do not depend on it: constants, not cuts
CONSTRUCTORS = _names(
    "new_ones new_zeros new_full new_empty new_tensor zeros_like ones_like full_like empty_like rand_like randn_like "
    "randint_like size dim numel"
)
#: element-wise non-linearities: the identity rule ``x * stopgrad((f(x) - f(0)) / x) + f(0)``
ELEMENTWISE = _names(
    "gelu silu relu relu6 hardswish hardsigmoid sigmoid tanh elu selu celu leaky_relu softplus mish hardtanh erf "
    "exp clamp clamp_min clamp_max clip abs"
)


def op_name(func: Any) -> tuple[str, bool, bool]:
    """``(name, in_place, reversed)`` of an intercepted callable (``Tensor.__radd__`` -> ``("add", False, True)``)."""
    raw = getattr(func, "__name__", repr(func))
    if raw == "__get__":  # a property (``x.mT``)
        raw = getattr(getattr(func, "__self__", None), "__name__", raw)
    in_place = reverse = False
    if raw.startswith("__") and raw.endswith("__"):
        name = raw[2:-2]
        if name[:1] == "i" and name[1:] in _BINARY:
            name, in_place = name[1:], True
        elif name[:1] == "r" and name[1:] in _BINARY:
            name, reverse = name[1:], True
    else:
        in_place, name = raw.endswith("_"), raw.rstrip("_")
    if name == "rsub":
        name, reverse = "sub", True
    return _ALIASES.get(name, name), in_place, reverse


# ------------------------------------------------------------------------------------ the operations of attention
SDPA, MULTI_HEAD = "scaled_dot_product_attention", "multi_head_attention_forward"
#: the query-key products a softmax may normalise
QUERY_KEY = frozenset({"matmul", "bmm", "einsum", "baddbmm"})
#: operations that carry a query-key product on to its softmax: scale, bias, mask, cast, element-wise map, reshape
CARRY = ELEMENTWISE | _names("add sub mul div masked_fill where to float type_as view reshape contiguous")
_SDPA_ARGUMENTS = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")
_MULTI_HEAD_SIGNATURE = inspect.signature(F.multi_head_attention_forward)


def is_query_key_product(name: str, tensors: list[torch.Tensor]) -> bool:
    """Whether the operation ``name`` of ``tensors`` is a query-key product: one of :data:`QUERY_KEY` of two batches
    of token sequences, each at least ``[B, N, d]`` and neither a parameter (``baddbmm``'s first tensor is its bias).
    A softmax of anything else is not attention (a prototype classifier's ``softmax(z @ protos.T)``, ``[B, P]``)."""
    operands = tensors[1:] if name == "baddbmm" else tensors
    tokens = len(operands) == 2 and all(t.ndim >= 3 and not isinstance(t, torch.nn.Parameter) for t in operands)
    return name in QUERY_KEY and tokens


def keeps_axes(shape: torch.Size, axes: tuple[int, int]) -> bool:
    """Whether ``shape`` still has a query and a key axis of the sizes ``axes``."""
    return not Counter(axes) - Counter(shape)


def sdpa_arguments(args: tuple, kwargs: dict) -> dict[str, Any]:
    """The arguments of a call of ``F.scaled_dot_product_attention`` by name (those given)."""
    return dict(zip(_SDPA_ARGUMENTS, args, strict=False)) | kwargs


def multi_head_arguments(args: tuple, kwargs: dict) -> dict[str, Any]:
    """The arguments of a call of ``F.multi_head_attention_forward`` by name, torch's defaults filled in."""
    bound = _MULTI_HEAD_SIGNATURE.bind(*args, **kwargs)
    bound.apply_defaults()
    return dict(bound.arguments)


def scaled_dot_product_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
) -> torch.Tensor:
    """``softmax(q k^T * scale + mask) v`` (sec. 3.2.1) for ``query: [..., L, E]``, ``key: [..., S, E]``, ``value:
    [..., S, E_v]``: a boolean ``attn_mask`` is True where attended (SDPA's convention), a float one is added;
    ``is_causal`` attends to the lower triangle; ``scale`` defaults to ``E ** -0.5``."""
    logits = (query * (query.shape[-1] ** -0.5 if scale is None else scale)) @ key.transpose(-2, -1)
    if is_causal:
        attn_mask = torch.ones(query.shape[-2], key.shape[-2], dtype=torch.bool, device=query.device).tril()
    if attn_mask is not None and attn_mask.dtype == torch.bool:
        logits = logits.masked_fill(~attn_mask, float("-inf"))
    elif attn_mask is not None:
        logits = logits + attn_mask
    attention = torch.softmax(logits, -1)
    if dropout_p > 0:
        attention = F.dropout(attention, dropout_p)
    return attention @ value


def _as_bias(mask: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | float:
    """A boolean mask (``True``: not attended, nn.MultiheadAttention's convention) as ``-inf``; a float one as is."""
    if mask is None:
        return 0.0
    if mask.dtype == torch.bool:
        return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(mask, float("-inf"))
    return mask.to(dtype)


def _heads(t: torch.Tensor, static: torch.Tensor | None, heads: int) -> torch.Tensor:
    """``[N, B, E] -> [B, H, N, E / H]``; a static ``[B * H, N, E / H]`` (torch's ``static_k``/``static_v``) instead."""
    if static is not None:
        return static.reshape(-1, heads, *static.shape[1:])
    return t.reshape(t.shape[0], t.shape[1], heads, -1).permute(1, 2, 0, 3)


def _logit_mask(p: SimpleNamespace, shape: tuple[int, int, int, int], like: torch.Tensor) -> torch.Tensor | None:
    """The additive mask of the logits ``[B, H, L, S]`` (broadcastable) from torch's ``attn_mask`` (``[L, S]`` or
    ``[B * H, L, S]``), ``key_padding_mask`` (``[B, S]``) and ``is_causal`` (the causal mask where none is given)."""
    batch, heads, length, source = shape
    attn_mask, key_padding_mask = p.attn_mask, p.key_padding_mask
    if p.is_causal and attn_mask is None:
        attn_mask = torch.ones(length, source, dtype=torch.bool, device=like.device).triu(1)
    if attn_mask is not None and attn_mask.dim() == 3:
        attn_mask = attn_mask.reshape(batch, heads, length, source)
    if key_padding_mask is not None:
        key_padding_mask = key_padding_mask.reshape(batch, 1, 1, source)
    mask = _as_bias(attn_mask, like.dtype) + _as_bias(key_padding_mask, like.dtype)
    return mask if isinstance(mask, torch.Tensor) else None


def multi_head_attention_forward(*args: Any, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
    """torch's ``F.multi_head_attention_forward``, its arguments and result: ``query: [L, B, E]`` (or ``[L, E]``
    unbatched), ``key``/``value: [S, B, E_k]``, ``attn_mask: [L, S]`` or ``[B * H, L, S]``, ``key_padding_mask: [B,
    S]``; returns the output ``[L, B, E]`` and, with ``need_weights``, the attention ``[B, L, S']`` (``[B, H, L, S']``
    unaveraged; ``S'`` counts the added key and zero columns). ``embed_dim_to_check`` is not checked
    (``nn.MultiheadAttention`` checks the width before the call)."""
    p = SimpleNamespace(**multi_head_arguments(args, kwargs))
    batched = p.query.dim() == 3
    if not batched:
        p.query, p.key, p.value = p.query.unsqueeze(1), p.key.unsqueeze(1), p.value.unsqueeze(1)
        p.key_padding_mask = None if p.key_padding_mask is None else p.key_padding_mask.unsqueeze(0)
    (length, batch, _), source = p.query.shape, p.key.shape[0]
    weights = (p.q_proj_weight, p.k_proj_weight, p.v_proj_weight)
    weights = weights if p.use_separate_proj_weight else p.in_proj_weight.chunk(3)
    biases = (None,) * 3 if p.in_proj_bias is None else p.in_proj_bias.chunk(3)
    q, k, v = (F.linear(t, w, b) for t, w, b in zip((p.query, p.key, p.value), weights, biases, strict=True))
    if p.bias_k is not None:
        k, v = torch.cat([k, p.bias_k.repeat(1, batch, 1)]), torch.cat([v, p.bias_v.repeat(1, batch, 1)])
    q, k, v = _heads(q, None, p.num_heads), _heads(k, p.static_k, p.num_heads), _heads(v, p.static_v, p.num_heads)
    if p.add_zero_attn:
        k, v = (torch.cat([t, t.new_zeros(*t.shape[:2], 1, t.shape[3])], 2) for t in (k, v))
    logits = (q * q.shape[-1] ** -0.5) @ k.transpose(-2, -1)
    mask = _logit_mask(p, (batch, p.num_heads, length, source), q)
    if mask is not None:  # the added key and zero columns are never masked
        logits = logits + F.pad(mask, (0, k.shape[2] - source))
    attention = torch.softmax(logits, -1)
    if p.training and p.dropout_p > 0:
        attention = F.dropout(attention, p.dropout_p)
    out = (attention @ v).permute(2, 0, 1, 3).reshape(length, batch, -1)
    out = F.linear(out, p.out_proj_weight, p.out_proj_bias)
    if p.need_weights and p.average_attn_weights:
        attention = attention.mean(1)
    if not batched:
        out, attention = out.squeeze(1), attention.squeeze(0)
    return out, attention if p.need_weights else None


#: the fused attention operations, each by its plain form
PLAIN_FORMS = {SDPA: scaled_dot_product_attention, MULTI_HEAD: multi_head_attention_forward}
