"""``torch.nn.functional.multi_head_attention_forward`` (what ``nn.MultiheadAttention`` runs) written in the
operations HiLRP has rules for: linear maps (the input and output projections), the two bilinear products
``q k^T`` and ``A v``, a softmax over the keys, additive constants (biases, masks, ``bias_k``/``bias_v`` and
``add_zero_attn``'s zeros) and reindexing (Vaswani et al., "Attention Is All You Need", NeurIPS 2017, sec. 3.2.2).

torch's own function cannot be run under a ``TorchFunctionMode`` (it hands itself back to the mode before any of its
operations run), so :mod:`vitlab.explain.hilrp` runs this one instead, under the mode, and each part takes its rule.
Outside a mode it computes what torch's does (``tests/explain/test_multihead.py``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def _additive(mask: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | float:
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


def _logit_mask(
    attn_mask: torch.Tensor | None,
    key_padding_mask: torch.Tensor | None,
    is_causal: bool,
    shape: tuple[int, int, int, int],
    like: torch.Tensor,
) -> torch.Tensor | None:
    """The additive mask of the logits ``[B, H, L, S]`` (broadcastable) from torch's ``attn_mask`` (``[L, S]`` or
    ``[B * H, L, S]``), ``key_padding_mask`` (``[B, S]``) and ``is_causal`` (the causal mask where none is given)."""
    batch, heads, length, source = shape
    if is_causal and attn_mask is None:
        attn_mask = torch.ones(length, source, dtype=torch.bool, device=like.device).triu(1)
    if attn_mask is not None and attn_mask.dim() == 3:
        attn_mask = attn_mask.reshape(batch, heads, length, source)
    if key_padding_mask is not None:
        key_padding_mask = key_padding_mask.reshape(batch, 1, 1, source)
    mask = _additive(attn_mask, like.dtype) + _additive(key_padding_mask, like.dtype)
    return mask if isinstance(mask, torch.Tensor) else None


def multi_head_attention_forward(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    embed_dim_to_check: int,
    num_heads: int,
    in_proj_weight: torch.Tensor | None,
    in_proj_bias: torch.Tensor | None,
    bias_k: torch.Tensor | None,
    bias_v: torch.Tensor | None,
    add_zero_attn: bool,
    dropout_p: float,
    out_proj_weight: torch.Tensor,
    out_proj_bias: torch.Tensor | None,
    training: bool = True,
    key_padding_mask: torch.Tensor | None = None,
    need_weights: bool = True,
    attn_mask: torch.Tensor | None = None,
    use_separate_proj_weight: bool = False,
    q_proj_weight: torch.Tensor | None = None,
    k_proj_weight: torch.Tensor | None = None,
    v_proj_weight: torch.Tensor | None = None,
    static_k: torch.Tensor | None = None,
    static_v: torch.Tensor | None = None,
    average_attn_weights: bool = True,
    is_causal: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """torch's signature and result: ``query: [L, B, E]`` (or ``[L, E]`` unbatched), ``key``/``value: [S, B, E_k]``,
    ``attn_mask: [L, S]`` or ``[B * H, L, S]``, ``key_padding_mask: [B, S]``; returns the output ``[L, B, E]`` and,
    with ``need_weights``, the attention ``[B, L, S']`` (``[B, H, L, S']`` unaveraged; ``S'`` counts the added
    key and zero columns). ``embed_dim_to_check`` is accepted for torch's signature (``nn.MultiheadAttention`` checks
    the width before the call)."""
    batched = query.dim() == 3
    if not batched:
        query, key, value = query.unsqueeze(1), key.unsqueeze(1), value.unsqueeze(1)
        key_padding_mask = None if key_padding_mask is None else key_padding_mask.unsqueeze(0)
    (length, batch, _), source = query.shape, key.shape[0]
    weights = (q_proj_weight, k_proj_weight, v_proj_weight) if use_separate_proj_weight else in_proj_weight.chunk(3)
    biases = (None,) * 3 if in_proj_bias is None else in_proj_bias.chunk(3)
    q, k, v = (F.linear(t, w, b) for t, w, b in zip((query, key, value), weights, biases, strict=True))
    if bias_k is not None:
        k, v = torch.cat([k, bias_k.repeat(1, batch, 1)]), torch.cat([v, bias_v.repeat(1, batch, 1)])
    q, k, v = _heads(q, None, num_heads), _heads(k, static_k, num_heads), _heads(v, static_v, num_heads)
    if add_zero_attn:
        k, v = (torch.cat([t, t.new_zeros(*t.shape[:2], 1, t.shape[3])], 2) for t in (k, v))
    logits = (q * q.shape[-1] ** -0.5) @ k.transpose(-2, -1)
    mask = _logit_mask(attn_mask, key_padding_mask, is_causal, (batch, num_heads, length, source), q)
    if mask is not None:  # the added key and zero columns are never masked
        logits = logits + F.pad(mask, (0, k.shape[2] - source))
    attention = torch.softmax(logits, -1)
    if training and dropout_p > 0:
        attention = F.dropout(attention, dropout_p)
    out = (attention @ v).permute(2, 0, 1, 3).reshape(length, batch, -1)
    out = F.linear(out, out_proj_weight, out_proj_bias)
    if need_weights and average_attn_weights:
        attention = attention.mean(1)
    if not batched:
        out, attention = out.squeeze(1), attention.squeeze(0)
    return out, attention if need_weights else None
