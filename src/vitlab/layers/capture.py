"""Attention capture: materialise the attention matrices of every shared ``Attention`` only when asked (the switch
that :func:`vitlab.diagnostics.capture.capture_attention`, which reads any model, uses for vitlab's own modules)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn

from vitlab.layers.attention import Attention
from vitlab.layers.cross_attention import CrossAttention


def attention_modules(model: nn.Module) -> list[tuple[str, Attention]]:
    """All shared ``Attention`` modules of ``model`` with their qualified names, in forward-definition order."""
    return [(name, m) for name, m in model.named_modules() if isinstance(m, Attention)]


def is_attention(module: nn.Module) -> bool:
    """Whether ``module`` is an attention: vitlab's ``Attention`` or ``CrossAttention``, or a class whose name says
    attention (timm's ``WindowAttention``, ``EvaAttention``, CaiT's ``TalkingHeadAttn``), not a block that holds one.
    The one vocabulary of the dynamics controller's messages and of the blocks ``trainer.compile`` finds."""
    name = type(module).__name__.lower()
    return isinstance(module, Attention | CrossAttention) or (
        any(word in name for word in ("attention", "attn")) and "block" not in name
    )


class AttentionCapture:
    """What :func:`attention_capture` yields: after the forward pass, ``maps[name]`` is ``[B, H, N, N]``."""

    def __init__(self, modules: list[tuple[str, Attention]]) -> None:
        self._modules = modules
        self.maps: dict[str, torch.Tensor] = {}

    def collect(self) -> dict[str, torch.Tensor]:
        self.maps = {name: m.captured for name, m in self._modules if m.captured is not None}
        return self.maps


@contextmanager
def attention_capture(model: nn.Module, names: list[str] | None = None) -> Iterator[AttentionCapture]:
    """Context manager: inside it, the selected ``Attention`` modules run their eager path and keep their maps.

    Example::

        with attention_capture(model) as cap:
            model(x)
        maps = cap.collect()  # {"blocks.0.attn": [B, H, N, N], ...}
    """
    modules = attention_modules(model)
    if names is not None:
        unknown = sorted(set(names) - {n for n, _ in modules})
        if unknown:
            raise KeyError(f"no shared Attention module named {unknown}; available: {[n for n, _ in modules]}")
        modules = [(n, m) for n, m in modules if n in names]
    if not modules:
        raise RuntimeError(
            f"{type(model).__name__} has no vitlab.layers.Attention module, so there is no attention to capture; "
            "build the model from vitlab's shared layers"
        )
    cap = AttentionCapture(modules)
    around = [m.capture for _, m in modules]  # a capture around this one keeps its switch on
    for _, m in modules:
        m.capture, m.captured = True, None
    try:
        yield cap
        cap.collect()
    finally:
        for (_, m), on in zip(modules, around, strict=True):
            m.capture = on
            m.captured = m.captured if on else None
