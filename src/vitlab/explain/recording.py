"""The attention matrices of the shared :class:`~vitlab.layers.attention.Attention`, kept in the autograd graph for
the attention methods (:mod:`vitlab.explain.methods`)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from vitlab.layers.attention import Attention, attention_probs


@dataclass
class AttentionRecord:
    """The attention matrices ``[B, H, N, N]`` of the recorded modules in forward order, in the autograd graph
    when they were recorded with autograd on."""

    names: list[str] = field(default_factory=list)
    probs: list[torch.Tensor] = field(default_factory=list)


def _recording_forward(m: Attention, record: AttentionRecord, name: str) -> Callable[..., object]:
    """The shared ``Attention`` on its eager path, its matrix appended to ``record``. Same signature and outputs
    as ``Attention.forward`` in eval mode (ToMe's ``size`` and ``return_keys`` included); the matrix is also the
    module's ``captured`` one when a capture (:func:`vitlab.layers.capture.attention_capture`) is on."""

    def forward(x: torch.Tensor, size: torch.Tensor | None = None, return_keys: bool = False):
        B, N, C = x.shape
        weight, qkv_bias = m._qkv_parameters()
        q, k, v = F.linear(x, weight, qkv_bias).view(B, N, 3, m.num_heads, m.head_dim).permute(2, 0, 3, 1, 4)
        bias = None if size is None else size.log().view(B, 1, 1, N).to(x.dtype)
        probs = attention_probs(q, k, bias, m.scale)
        record.names.append(name)
        record.probs.append(probs)
        if m.capture:  # a capture around this recording reads the same matrix
            m.captured = probs.detach()
        out = m.proj((probs @ v).transpose(1, 2).reshape(B, N, C))
        return (out, k.detach().mean(1)) if return_keys else out

    return forward


@contextmanager
def recorded_attention(model: nn.Module) -> Iterator[AttentionRecord]:
    """Inside the block, every shared ``Attention`` of ``model`` keeps its matrix, in the graph, in ``record``."""
    record = AttentionRecord()
    modules = [(n, m) for n, m in model.named_modules() if isinstance(m, Attention)]
    try:
        for name, m in modules:
            m.forward = _recording_forward(m, record, name)
        yield record
    finally:
        for _, m in modules:
            del m.forward
