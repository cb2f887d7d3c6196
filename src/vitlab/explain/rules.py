"""The conservative relevance rules: every operation of a model made locally linear in the backward pass.

The rules follow CP-LRP (Ali et al., "XAI for Transformers: Better Explanations through Conservative
Propagation", ICML 2022, sec. 3: the attention matrix and LayerNorm's standard deviation held constant) and AttnLRP
(Achtibat et al., "AttnLRP: Attention-Aware Layer-Wise Relevance Propagation for Transformers", ICML 2024,
sec. 3.3: the identity rule for element-wise non-linearities). Each "gain" of the network is detached, so in the
backward pass the network is a linear function of its input and of the parameters that enter additively::

    LayerNorm            (x - mean x) / stopgrad(std x) * gamma + beta
    GELU, SiLU, ReLU     x * stopgrad(f(x) / x)
    attention (A.V)      stopgrad(softmax(q k^T + bias)) @ V          (the bilinear mixing becomes linear in V)
    any nn.Softmax       stopgrad(softmax(x))                         (Swin's window attention, with its shift mask)

Re-indexing needs no rule: Swin's window partition, cyclic shift, padding and patch merging, and ToMe's merge (its
matching is computed without gradient and its size weights count patches, so the merge is a fixed pooling) are
linear already. A family adds the rules of its own operations (CET-ViT's assignment ``S``) through its
:class:`~vitlab.explain.adapters.Explainer`. With every gain fixed, Euler's theorem for a linear map gives exactly
``f(x) = sum_i x_i df/dx_i + sum_b b df/db`` over the input and the additive parameters ``b`` (biases, LayerNorm
betas, position embeddings, the CLS token): the relevance is Gradient x Input of the linearised network, i.e.
LRP-0 with the rules above; the bias terms are what the rules absorb. Deviation from AttnLRP: no epsilon or gamma
stabiliser (they would break exact conservation) and no uniform rule through the softmax (it is held constant, as
in CP-LRP), so the query-key path carries no relevance.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from timm.models.swin_transformer import WindowAttention
from torch import nn

from vitlab.layers.attention import Attention, attention_probs
from vitlab.layers.attention_path import force_attention_path, forced_path
from vitlab.layers.cross_attention import CrossAttention

#: a rule: the module's replacement methods in the linearised network (``{"forward": ...}``), or None when the rule
#: does not apply
Rule = Callable[[nn.Module], dict[str, Callable[..., object]] | None]

#: element-wise activations -> their slope at 0 (the gain where f(x) / x is 0 / 0)
_ACTIVATIONS: dict[type[nn.Module], float] = {nn.GELU: 0.5, nn.SiLU: 0.5, nn.ReLU: 0.0}


def linear_gain(x: torch.Tensor, fx: torch.Tensor, slope_at_zero: float) -> torch.Tensor:
    """``x * stopgrad(f(x) / x)``: the value ``f(x)``, the gradient of a linear map (AttnLRP's identity rule)."""
    zero = x == 0
    gain = torch.where(zero, torch.full_like(x, slope_at_zero), fx / torch.where(zero, torch.ones_like(x), x))
    return x * gain.detach()


def _layer_norm(m: nn.LayerNorm) -> Callable[[torch.Tensor], torch.Tensor]:
    dims = tuple(range(-len(m.normalized_shape), 0))

    def forward(x: torch.Tensor) -> torch.Tensor:
        centred = x - x.mean(dims, keepdim=True)
        std = (centred.pow(2).mean(dims, keepdim=True) + m.eps).sqrt().detach()
        y = centred / std
        if m.weight is not None:
            y = y * m.weight
        return y + m.bias if m.bias is not None else y

    return forward


def _activation(m: nn.Module) -> Callable[[torch.Tensor], torch.Tensor]:
    slope = _ACTIVATIONS[type(m)]
    original = type(m).forward

    def forward(x: torch.Tensor) -> torch.Tensor:
        return linear_gain(x, original(m, x), slope)

    return forward


def _softmax(m: nn.Softmax) -> Callable[[torch.Tensor], torch.Tensor]:
    return lambda x: F.softmax(x, dim=m.dim).detach()


@dataclass
class AttentionRecord:
    """The attention matrices ``[B, H, N, N]`` of the recorded modules in forward order, in the autograd graph
    when they were recorded with autograd on."""

    names: list[str] = field(default_factory=list)
    probs: list[torch.Tensor] = field(default_factory=list)


def self_attention_forward(
    m: Attention, *, detach: bool, record: AttentionRecord | None = None, name: str = ""
) -> Callable[..., object]:
    """The shared :class:`~vitlab.layers.attention.Attention` on its eager path with the matrix in reach.

    ``detach``: the matrix is a constant of the backward pass (the CP-LRP rule). ``record``: the matrix is appended
    to it, in the graph (the gradient-weighted rollout takes its gradient). Same signature and outputs
    as ``Attention.forward`` in eval mode (ToMe's ``size`` and ``return_keys`` included).
    """

    def forward(x: torch.Tensor, size: torch.Tensor | None = None, return_keys: bool = False):
        B, N, C = x.shape
        weight, qkv_bias = m._qkv_parameters()
        q, k, v = F.linear(x, weight, qkv_bias).view(B, N, 3, m.num_heads, m.head_dim).permute(2, 0, 3, 1, 4)
        bias = None if size is None else size.log().view(B, 1, 1, N).to(x.dtype)
        probs = attention_probs(q, k, bias, m.scale)
        if detach:
            probs = probs.detach()
        if record is not None:
            record.names.append(name)
            record.probs.append(probs)
        out = m.proj((probs @ v).transpose(1, 2).reshape(B, N, C))
        return (out, k.detach().mean(1)) if return_keys else out

    return forward


def _cross_attention(m: CrossAttention) -> Callable[..., torch.Tensor]:
    def forward(x: torch.Tensor, context: torch.Tensor, key_mask: torch.Tensor | None = None) -> torch.Tensor:
        B, N, C = x.shape
        M = context.shape[1]
        q = m.q(x).view(B, N, m.num_heads, m.head_dim).transpose(1, 2)
        k, v = m.kv(context).view(B, M, 2, m.num_heads, m.head_dim).permute(2, 0, 3, 1, 4).unbind(0)
        bias = (
            None
            if key_mask is None
            else torch.zeros_like(key_mask, dtype=x.dtype).masked_fill(~key_mask, float("-inf"))[:, None, None, :]
        )
        probs = attention_probs(q, k, bias, m.head_dim**-0.5).detach()
        return m.proj((probs @ v).transpose(1, 2).reshape(B, N, C))

    return forward


def core_rule(m: nn.Module) -> dict[str, Callable[..., object]] | None:
    """The rules of the shared layers, timm's LayerNorm, activations, softmax and Swin's window attention."""
    forward: Callable[..., object] | None = None
    if isinstance(m, nn.LayerNorm):
        forward = _layer_norm(m)
    elif type(m) in _ACTIVATIONS:
        forward = _activation(m)
    elif isinstance(m, nn.Softmax):
        forward = _softmax(m)
    elif isinstance(m, Attention):
        forward = self_attention_forward(m, detach=True)
    elif isinstance(m, CrossAttention):
        forward = _cross_attention(m)
    return None if forward is None else {"forward": forward}


@contextmanager
def linearised(model: nn.Module, rules: Sequence[Rule] = ()) -> Iterator[None]:
    """Inside the block, every module of ``model`` that a rule applies to runs that rule's methods (``rules``
    first, then :func:`core_rule`; the first that applies wins); timm's window attention takes its eager path so
    that its ``nn.Softmax`` runs."""
    patched: list[tuple[nn.Module, str]] = []
    fused: list[tuple[nn.Module, bool]] = []
    previous = forced_path()
    force_attention_path("eager")  # the attention-path chooser would otherwise switch timm's window attention back
    try:
        for m in model.modules():
            if isinstance(m, WindowAttention):
                fused.append((m, m.fused_attn))
                m.fused_attn = False
            for rule in (*rules, core_rule):
                methods = rule(m)
                if methods is not None:
                    for name, method in methods.items():
                        setattr(m, name, method)
                        patched.append((m, name))
                    break
        yield
    finally:
        for m, name in patched:
            delattr(m, name)
        for m, value in fused:
            m.fused_attn = value
        force_attention_path(previous)


@contextmanager
def recorded_attention(model: nn.Module) -> Iterator[AttentionRecord]:
    """Inside the block, every shared ``Attention`` of ``model`` keeps its matrix, in the graph, in ``record``."""
    record = AttentionRecord()
    modules = [(n, m) for n, m in model.named_modules() if isinstance(m, Attention)]
    try:
        for name, m in modules:
            m.forward = self_attention_forward(m, detach=False, record=record, name=name)
        yield record
    finally:
        for _, m in modules:
            del m.forward
