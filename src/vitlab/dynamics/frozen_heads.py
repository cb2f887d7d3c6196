"""Frozen heads (ViTCAE eq. 26): :class:`FrozenHeadAttention`, the shared Attention whose heads can be frozen.

Heads marked with :meth:`FrozenHeadAttention.set_frozen_heads` become constants of the backward pass: their
attention pattern gets no gradient, their rows of ``W_q, W_k, W_v`` and their tau get exactly zero gradient, and
only the input gradient through their value path is kept. With ``train_frozen_values`` (``dynamics.freeze_scope:
pattern``) only the pattern is frozen: their rows of ``W_v`` keep their weight gradient. Three routes, all exact:

- one flash call over all heads (:class:`_FrozenHeadsInOneCall`, the CPU default), the frozen heads' ``dV = P^T dO``
  from the kernel's log-sum-exps;
- two calls (``split_frozen``, other devices, dtypes, dropout, capture): the frozen heads through
  :class:`_FrozenHeadAttention`, the active ones through ``Attention._attend``;
- the QKV projection with the frozen rows cut (:class:`_QKVWithFrozenHeads`).

Frozen heads are kept contiguous (``set_frozen_heads`` permutes them into the first slots, an exact symmetry of
multi-head attention, :mod:`vitlab.layers.heads`, recorded in the persistent buffer ``head_order``), so every route
slices, never gathers; everything the module reports is indexed by original head. The routes and the permutation in
full: docs/dynamics.md, "Freezing (eq. 26)".

The shared :class:`~vitlab.layers.attention.Attention` knows nothing of this: the dynamics controller
(:class:`vitlab.dynamics.FrozenHeadGuard`) makes the modules it controls ``FrozenHeadAttention`` in place
(:meth:`FrozenHeadAttention.install`) and decides which heads freeze.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from vitlab.layers.attention import Attention, attention_probs
from vitlab.layers.dropout import dropout
from vitlab.layers.heads import permute_heads


class _QKVWithFrozenHeads(torch.autograd.Function):
    """The fused QKV product ``x W^T + b`` split into the frozen heads' and the active heads' q, k, v.

    ``x: [B, N, C]``, ``weight: [3C, C]``, ``bias: [3C]`` or None, the frozen heads in the first ``frozen`` slots.
    Returns ``(q_f, k_f, v_f, q_a, k_a, v_a)``, each ``[B, heads, N, d]`` (views of the one product). The frozen
    heads' attention is a constant of the backward pass (eq. 26), so ``q_f`` and ``k_f`` are not differentiable:
    their rows of ``W`` and ``b`` get exactly zero gradient, never formed, and they add nothing to the input
    gradient. ``v_f`` keeps its input gradient, and its weight gradient only with ``train_v`` (the frozen heads'
    pattern frozen, their values trained). The backward forms one product per part instead of one for all of
    ``3C``; it never materialises a ``[B, N, 3C]`` gradient.
    """

    @staticmethod
    def forward(
        ctx: Any,
        x: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        heads: int,
        frozen: int,
        train_v: bool = False,
    ):
        B, N = x.shape[:2]
        qkv = F.linear(x, weight, bias).view(B, N, 3, heads, -1).permute(2, 0, 3, 1, 4)
        ctx.save_for_backward(x, weight)
        ctx.frozen, ctx.heads, ctx.has_bias, ctx.train_v = frozen, heads, bias is not None, train_v
        ctx.set_materialize_grads(False)
        q_f, k_f, v_f = qkv[:, :, :frozen].unbind(0)
        q_a, k_a, v_a = qkv[:, :, frozen:].unbind(0)
        ctx.mark_non_differentiable(q_f, k_f)
        return q_f, k_f, v_f, q_a, k_a, v_a

    @staticmethod
    def backward(ctx: Any, _q_f, _k_f, grad_v_f, grad_q_a, grad_k_a, grad_v_a):
        x, weight = ctx.saved_tensors
        grads = _qkv_backward(
            x,
            weight,
            ctx.has_bias,
            ctx.heads,
            ctx.frozen,
            ctx.needs_input_grad[:3],
            grad_v_f,
            grad_q_a,
            grad_k_a,
            grad_v_a,
            train_v=ctx.train_v,
        )
        return *grads, None, None, None


def _qkv_backward(
    x, weight, has_bias: bool, heads: int, frozen: int, needs, grad_v_f, grad_q_a, grad_k_a, grad_v_a, train_v=False
):
    """The backward of the fused QKV product with the frozen heads in the first ``frozen`` slots (eq. 26).

    ``grad_v_f: [B, frozen, N, d]`` and ``grad_{q,k,v}_a: [B, heads - frozen, N, d]`` (any may be None: zeros);
    ``needs``: whether ``x``, ``weight``, ``bias`` want a gradient. Returns ``(grad_x, grad_weight, grad_bias)``.
    The weight gradient is formed only for the active rows (the frozen rows are an exact zero, never computed), and
    with ``train_v`` also for the frozen heads' v rows (``dynamics.freeze_scope: pattern``); the input gradient
    comes from the active q, k, v and the frozen v, one product per part, with no ``[B, N, 3C]`` gradient tensor.
    """
    B, N, C = x.shape
    width = weight.shape[0] // 3
    split = frozen * (width // heads)  # rows of each of q, k, v that belong to frozen heads
    reference = next((g for g in (grad_v_f, grad_v_a, grad_q_a, grad_k_a) if g is not None), None)
    if reference is None:
        return None, None, None
    dtype = reference.dtype  # under autocast the product ran in the gradient's dtype
    w = weight.view(3, width, C).to(dtype)

    def flat(grad: torch.Tensor | None, count: int) -> torch.Tensor:
        """``[B, count, N, d] -> [B N, count d]`` (zeros for a part that got no gradient)."""
        if grad is None:
            return reference.new_zeros(B * N, count * (width // heads))
        return grad.transpose(1, 2).reshape(B * N, -1)

    # (part, its rows, the gradient of their outputs): the frozen v first (frozen q and k have none), then the
    # active heads' q, k, v, the only rows that get a weight gradient
    active = heads - frozen
    parts = [(2, slice(0, split), flat(grad_v_f, frozen))] if frozen else []
    if active:
        parts += [(p, slice(split, width), flat(g, active)) for p, g in enumerate((grad_q_a, grad_k_a, grad_v_a))]
    trained = parts[1:] if frozen and not train_v else parts
    zero = (slice(0, 2 if train_v else 3), slice(0, split))  # q, k (and v) rows of the frozen heads: no weight gradient
    grad_x = None
    if needs[0]:
        for part, rows, grad in parts:
            grad_x = grad @ w[part, rows] if grad_x is None else torch.addmm(grad_x, grad, w[part, rows], out=grad_x)
        grad_x = grad_x.view(B, N, C).to(x.dtype)
    grad_w, grad_b = _qkv_parameter_grads(x, weight, (needs[1], has_bias and needs[2]), trained, zero, dtype)
    return grad_x, grad_w, grad_b


def _qkv_parameter_grads(x, weight, needs, trained, zero, dtype):
    """The QKV weight and bias gradients (``needs``: of each) of the ``trained`` rows; the rows ``zero`` are 0."""
    grad_w = grad_b = None
    if needs[0]:
        x2 = x.reshape(-1, weight.shape[1]).to(dtype)
        grad_w = weight.new_empty(3, weight.shape[0] // 3, weight.shape[1], dtype=dtype)
        grad_w[zero] = 0
        for part, rows, grad in trained:
            torch.mm(grad.T, x2, out=grad_w[part, rows])
        grad_w = grad_w.view(weight.shape).to(weight.dtype)
    if needs[1]:
        grad_b = weight.new_empty(3, weight.shape[0] // 3, dtype=dtype)
        grad_b[zero] = 0
        for part, rows, grad in trained:
            grad_b[part, rows] = grad.sum(0)
        grad_b = grad_b.view(-1).to(weight.dtype)
    return grad_w, grad_b


# PyTorch's CPU flash-attention kernel (what SDPA runs on the CPU), which also returns each row's log-sum-exp.
_CPU_FLASH = "_scaled_dot_product_flash_attention_for_cpu"


def _flash_with_logsumexp(q: torch.Tensor) -> bool:
    """Whether the CPU flash kernel with log-sum-exps can run on ``q``'s device and dtype."""
    return q.device.type == "cpu" and q.dtype in (torch.float32, torch.float64) and hasattr(torch.ops.aten, _CPU_FLASH)


def _grad_v_from_logsumexp(q, k, bias, lse, scale: float, grad_out) -> torch.Tensor:
    """A frozen head's ``dV = P^T dO`` (``[B, h, N, d]``) from the flash kernel's row log-sum-exps ``lse: [B, h, N]``,
    without forming ``P``: ``dV_j = sum_i exp(s_ij + b_j - lse_i) dO_i`` is one more flash call with the roles of
    queries and keys swapped: queries ``[k_j, 1]``, keys ``[q_i, -lse_i / scale]`` (so their scaled product is
    ``s_ij - lse_i``), values ``[dO_i, 0]``. Its softmax divides row ``j`` by ``Z_j = sum_i exp(s_ij - lse_i)`` and
    returns ``log Z_j``, so ``dV_j = exp(log Z_j + b_j) out_j``. Tiled like the forward: no ``[B, h, N, N]`` tensor
    (why: docs/dynamics.md, "Freezing"), no autograd; exact up to rounding."""
    dtype = q.dtype
    one = k.new_ones(*k.shape[:-1], 1)
    out, log_z = getattr(torch.ops.aten, _CPU_FLASH)(
        torch.cat([k, one], -1),
        torch.cat([q, (-lse / scale).unsqueeze(-1).to(dtype)], -1),
        torch.cat([grad_out.to(dtype), torch.zeros_like(one)], -1),
        scale=scale,
    )
    if bias is not None:  # [B, 1, 1, N]: a per-key bias, one factor per row j of dV
        log_z = log_z + bias.reshape(bias.shape[0], 1, -1)
    return (out[..., :-1] * log_z.exp().unsqueeze(-1).to(dtype)).to(grad_out.dtype)


class _FrozenHeadsInOneCall(torch.autograd.Function):
    """Eq. 26 as one fused QKV product and ONE flash-attention call over all heads, frozen and active together.

    ``x: [B, N, C]``, ``weight: [3C, C]``, ``bias: [3C]`` or None, ``mask: [B, 1, 1, N]`` or None (ToMe's size
    bias), the frozen heads in the first ``frozen`` slots. Returns ``(out [B, H, N, d], keys [B, H, N, d])``; the
    keys (ToMe's matching metric) are not differentiable. The forward is exactly the path without freezing: the
    QKV product, PyTorch's CPU flash kernel (what SDPA runs on the CPU; it also returns each row's log-sum-exp).
    The backward runs the flash backward only on the active heads' slice, and for the frozen heads only ``dV = P^T
    dO`` from the saved log-sum-exps, one more flash call (:func:`_grad_v_from_logsumexp`); then the QKV backward of
    :func:`_qkv_backward` (no weight gradient for the frozen rows, no input gradient through their q and k). There
    is no split of the heads into two attention calls and no concatenation of their outputs. CPU, float32/64, no
    attention dropout, no autocast only (:func:`single_call_applies`); elsewhere the two-call path runs.
    ``train_v``: the frozen heads' v rows keep their weight gradient (only their pattern is frozen).
    """

    @staticmethod
    def forward(ctx: Any, x, weight, bias, mask, heads: int, frozen: int, scale: float, train_v: bool = False):
        B, N, _ = x.shape
        qkv = F.linear(x, weight, bias)
        q, k, v = qkv.view(B, N, 3, heads, -1).permute(2, 0, 3, 1, 4).unbind(0)
        out, lse = getattr(torch.ops.aten, _CPU_FLASH)(q, k, v, attn_mask=mask, scale=scale)
        ctx.save_for_backward(x, weight, qkv, mask, out, lse)
        ctx.heads, ctx.frozen, ctx.scale, ctx.has_bias = heads, frozen, scale, bias is not None
        ctx.train_v = train_v
        ctx.set_materialize_grads(False)
        ctx.mark_non_differentiable(k)
        return out, k

    @staticmethod
    def backward(ctx: Any, grad_out, _grad_keys):
        if grad_out is None:
            return None, None, None, None, None, None, None, None
        x, weight, qkv, mask, out, lse = ctx.saved_tensors
        B, N, _ = x.shape
        heads, frozen, scale = ctx.heads, ctx.frozen, ctx.scale
        q, k, v = qkv.view(B, N, 3, heads, -1).permute(2, 0, 3, 1, 4).unbind(0)
        f, a = slice(0, frozen), slice(frozen, heads)
        grad_v_f = _grad_v_from_logsumexp(q[:, f], k[:, f], mask, lse[:, f], scale, grad_out[:, f])
        grad_q_a = grad_k_a = grad_v_a = None
        if frozen < heads:
            grad_q_a, grad_k_a, grad_v_a = getattr(torch.ops.aten, _CPU_FLASH + "_backward")(
                grad_out[:, a], q[:, a], k[:, a], v[:, a], out[:, a], lse[:, a], 0.0, False, attn_mask=mask, scale=scale
            )
        needs = ctx.needs_input_grad[:3]
        grads = _qkv_backward(
            x, weight, ctx.has_bias, heads, frozen, needs, grad_v_f, grad_q_a, grad_k_a, grad_v_a, train_v=ctx.train_v
        )
        return *grads, None, None, None, None, None


class _FrozenHeadAttention(torch.autograd.Function):
    """Attention of frozen heads: ``O = P V`` with ``P = softmax(q k^T * scale + bias)`` a constant (eq. 26).

    ``q, k, v: [B, F, N, d]``, ``bias: [B, 1, 1, N]`` or None. Only ``v`` gets a gradient, ``dV = P^T dO``; ``P`` is
    not kept between the passes. The forward is SDPA. On the CPU it is PyTorch's flash kernel, which also returns
    each row's log-sum-exp ``lse``, so the backward is one more flash call (:func:`_grad_v_from_logsumexp`, no
    ``P``); elsewhere it recomputes the softmax, without autograd either way. With attention
    dropout (or on the eager path) ``P`` is formed, dropped out and kept for the backward, so both passes see the
    same mask.
    """

    @staticmethod
    def forward(ctx: Any, q, k, v, bias, scale: float, dropout_p: float, fused: bool):
        ctx.scale = scale
        ctx.mode = "recompute" if fused and dropout_p == 0 else "saved"
        if ctx.mode == "recompute" and _flash_with_logsumexp(q):
            ctx.mode = "logsumexp"
            out, lse = getattr(torch.ops.aten, _CPU_FLASH)(q, k, v, attn_mask=bias, scale=scale)
            ctx.save_for_backward(q, k, bias, lse)
            return out
        if ctx.mode == "recompute":
            ctx.save_for_backward(q, k, bias)
            return F.scaled_dot_product_attention(q, k, v, attn_mask=bias, scale=scale)
        probs = attention_probs(q, k, bias, scale)
        if dropout_p > 0:
            probs = dropout(probs, dropout_p)  # vitlab's mask (vitlab.layers.dropout)
        ctx.save_for_backward(probs)
        return probs @ v

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor):
        if ctx.mode == "logsumexp":
            q, k, bias, lse = ctx.saved_tensors
            return None, None, _grad_v_from_logsumexp(q, k, bias, lse, ctx.scale, grad_out), None, None, None, None
        if ctx.mode == "recompute":
            q, k, bias = ctx.saved_tensors
            probs = attention_probs(q, k, bias, ctx.scale)
        else:
            (probs,) = ctx.saved_tensors
        grad_v = probs.to(grad_out.dtype).transpose(-2, -1) @ grad_out
        return None, None, grad_v, None, None, None, None


def frozen_heads_forward(
    module: FrozenHeadAttention,
    x: torch.Tensor,
    weight: torch.Tensor,
    qkv_bias: torch.Tensor | None,
    bias: torch.Tensor | None,
    return_keys: bool,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The attention of ``module`` with its first ``module.num_frozen`` head slots frozen (eq. 26), before the
    output projection: ``x: [B, N, C] -> ([B, N, C], keys [B, H, N, d] or None)``. ``weight``, ``qkv_bias``: the
    QKV parameters with the temperature applied; ``bias``: proportional attention's ``[B, 1, 1, N]`` or None."""
    B, N, C = x.shape
    H, frozen = module.num_heads, module.num_frozen
    if single_call_applies(module, x, weight):
        out, k = _FrozenHeadsInOneCall.apply(
            x, weight, qkv_bias, bias, H, frozen, module.scale, module.train_frozen_values
        )
        return out.transpose(1, 2).reshape(B, N, C), k
    parts = _QKVWithFrozenHeads.apply(x, weight, qkv_bias, H, frozen, module.train_frozen_values)
    out = attend_with_frozen(module, *parts, bias)
    return out, torch.cat([parts[1], parts[4]], dim=1) if return_keys else None


def single_call_applies(module: FrozenHeadAttention, x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether the frozen heads attend in one flash call with the active ones (:class:`_FrozenHeadsInOneCall`): the
    fused path without capture or attention dropout, on the CPU in float32/64 without autocast, and ``split_frozen``
    off. Otherwise the frozen and active heads attend in two calls (:func:`attend_with_frozen`)."""
    return (
        not module.split_frozen
        and module.fused
        and not module.capture
        and not (module.training and module.attn_drop > 0)
        and x.dtype == weight.dtype
        and _flash_with_logsumexp(x)
        and hasattr(torch.ops.aten, _CPU_FLASH + "_backward")
        and not torch.is_autocast_enabled("cpu")
    )


def attend_with_frozen(
    module: FrozenHeadAttention, q_f, k_f, v_f, q_a, k_a, v_a, bias: torch.Tensor | None
) -> torch.Tensor:
    """Eq. 26: the frozen heads' attention (``*_f: [B, F, N, d]``) is a constant and only their value path has a
    gradient (:class:`_FrozenHeadAttention`); the active heads (``*_a``) attend as usual. Returns ``[B, N, C]``,
    the two groups written side by side in one copy."""
    drop = module.attn_drop if module.training else 0.0
    outs = [_FrozenHeadAttention.apply(q_f, k_f, v_f, bias, module.scale, drop, module.fused)]
    captured = None
    if q_a.shape[1]:
        outs.append(module._attend(q_a, k_a, v_a, bias))
        captured = module.captured
    if module.capture:
        with torch.no_grad():
            probs = attention_probs(q_f, k_f, bias, module.scale)
        module.captured = probs if captured is None else torch.cat([probs, captured], dim=1)
    B, _, N, _ = q_f.shape
    return torch.cat([o.transpose(1, 2) for o in outs], dim=2).view(B, N, -1)


class FrozenHeadAttention(Attention):
    """The shared :class:`~vitlab.layers.attention.Attention` with heads that can be frozen (ViTCAE eq. 26).

    Same constructor, parameters and forward as ``Attention``; it adds the persistent buffers ``frozen_heads: [H]``
    bool (by original head) and ``head_order: [H]`` long, and :meth:`set_frozen_heads`. Without autograd, or with
    no head frozen, it computes exactly what ``Attention`` does. ``split_frozen``: True forces the two-call path
    (kept for tests and benchmarks); ``train_frozen_values``: True freezes a frozen head's attention pattern (its
    ``W_q``, ``W_k`` rows and tau) but lets its ``W_v`` rows train (``dynamics.freeze_scope: pattern``); False is
    eq. 26 as printed. :meth:`install` turns an existing ``Attention`` into one, in place.
    """

    def __init__(self, dim: int, **kwargs: Any) -> None:
        super().__init__(dim, **kwargs)
        self._init_head_state()

    @classmethod
    def install(cls, module: Attention) -> FrozenHeadAttention:
        """Make ``module`` a ``FrozenHeadAttention`` in place (its class swapped, its weights and everything that
        holds it untouched, no head frozen) and return it; one that already is one is returned as it is."""
        if isinstance(module, cls):
            return module
        if type(module) is not Attention:
            raise TypeError(f"frozen heads replace the shared Attention, not {type(module).__name__}")
        module.__class__ = cls
        module._init_head_state()
        return module

    def _init_head_state(self) -> None:
        device = self.qkv.weight.device
        self.register_buffer("frozen_heads", torch.zeros(self.num_heads, dtype=torch.bool, device=device))
        self.register_buffer("head_order", torch.arange(self.num_heads, device=device))
        # Host-side state derived from the buffers, so the hot path never syncs with the device.
        self.num_frozen = 0
        self._permuted = False
        self.split_frozen = False
        self.train_frozen_values = False

    @property
    def head_slots(self) -> torch.Tensor:
        """``[H]`` long (CPU): the slot of the parameters that holds each original head."""
        return self.head_order.cpu().argsort()

    @property
    def tau(self) -> torch.Tensor | None:
        """Per-head temperature ``[H]`` by original head (``None`` when the module has no temperature)."""
        tau = super().tau
        return tau[self.head_slots.to(tau.device)] if tau is not None and self._permuted else tau

    def set_frozen_heads(self, frozen: torch.Tensor) -> torch.Tensor | None:
        """Mark heads as frozen (eq. 26). ``frozen: [H]`` bool, by original head.

        The frozen heads are moved to the first slots (frozen, then the others, each in original order). Returns the
        slot permutation ``perm: [H]`` (new slot ``j`` holds what slot ``perm[j]`` held) when the heads moved, else
        None. Whoever keeps state shaped like this module's parameters (an optimizer's moments) must permute it with
        :meth:`permute_heads_of`; :class:`vitlab.dynamics.FrozenHeadGuard` does so for the optimizers it guards.
        """
        frozen = torch.as_tensor(frozen, dtype=torch.bool).detach().cpu()
        if frozen.shape != (self.num_heads,):
            raise ValueError(f"frozen mask must have shape [{self.num_heads}], got {list(frozen.shape)}")
        order = torch.cat([frozen.nonzero().flatten(), (~frozen).nonzero().flatten()])
        current = self.head_order.cpu()
        perm = None
        if not torch.equal(order, current):
            perm = current.argsort()[order]
            with torch.no_grad():
                for name, parameter in self.head_parameters():
                    parameter.copy_(self.permute_heads_of(name, parameter, perm))
                    if parameter.grad is not None:
                        parameter.grad.copy_(self.permute_heads_of(name, parameter.grad, perm))
                self.head_order.copy_(order)
        self.frozen_heads.copy_(frozen)
        self._sync_head_state()
        return perm

    def head_parameters(self) -> list[tuple[str, torch.nn.Parameter]]:
        """The parameters with one slice per head, ``(name, parameter)``; see :meth:`permute_heads_of`."""
        found = [("qkv.weight", self.qkv.weight), ("qkv.bias", self.qkv.bias)]
        found += [("proj.weight", self.proj.weight), ("log_tau", self.log_tau)]
        return [(name, p) for name, p in found if p is not None]

    def permute_heads_of(self, name: str, tensor: torch.Tensor, perm: torch.Tensor) -> torch.Tensor:
        """``tensor`` shaped like parameter ``name`` (one of ``HEAD_PARAMETERS``) with its head slices permuted:
        slot ``j`` of the result is slot ``perm[j]`` of ``tensor`` (:func:`vitlab.layers.heads.permute_heads`)."""
        return permute_heads(name, tensor, perm, self.num_heads)

    def in_original_order(self, name: str, tensor: torch.Tensor) -> torch.Tensor:
        """``tensor`` shaped like parameter ``name`` (its value, gradient or an optimizer moment) with the heads put
        back in original order: what a model that never permuted its heads would hold."""
        return self.permute_heads_of(name, tensor, self.head_slots) if self._permuted else tensor

    def _sync_head_state(self) -> None:
        self.num_frozen = int(self.frozen_heads.sum())
        self._permuted = not torch.equal(self.head_order.cpu(), torch.arange(self.num_heads))

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        # A state saved by a plain Attention has neither buffer (no head frozen); one saved before heads were
        # permuted has no head_order: its parameters are in original order.
        if prefix + "frozen_heads" not in state_dict:
            state_dict[prefix + "frozen_heads"] = torch.zeros(self.num_heads, dtype=torch.bool)
        legacy = prefix + "head_order" not in state_dict
        if legacy:
            state_dict[prefix + "head_order"] = torch.arange(self.num_heads)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)
        self._sync_head_state()
        if legacy and self.num_frozen:
            self.set_frozen_heads(self.frozen_heads.clone())

    def attend_heads(
        self, x: Tensor, weight: Tensor, qkv_bias: Tensor | None, bias: Tensor | None, return_keys: bool = False
    ) -> tuple[Tensor, Tensor | None]:
        """:meth:`Attention.attend_heads` with the first ``num_frozen`` head slots frozen (eq. 26); ``captured`` by
        original head."""
        # Without autograd a frozen head computes exactly what an active one does: the plain path.
        if self.num_frozen and torch.is_grad_enabled():
            out, k = frozen_heads_forward(self, x, weight, qkv_bias, bias, return_keys)
        else:
            out, k = super().attend_heads(x, weight, qkv_bias, bias, return_keys)
        if self.capture and self._permuted:
            self.captured = self.captured[:, self.head_slots.to(self.captured.device)]
        return out, k
