"""The one multi-head self-attention of vitlab.

Every model of the project attends through :class:`Attention`. Its optional features are switches on this one
module, never copies of it:

- ``temperature``: a learnable per-head temperature ``tau[h] > 0`` stored as ``log_tau`` (ViTCAE eq. 19).
  ``temperature_form="inverse"`` multiplies the logits by tau (the paper's "high tau = sharp" reading);
  ``"divide"`` divides them (eq. 19 as printed).
- capture: when ``capture`` is set (see :func:`vitlab.layers.capture.capture_attention`) the eager path runs and
  the row-stochastic attention ``[B, H, N, N]`` is kept in ``captured``; otherwise SDPA runs and no matrix exists.
- frozen heads (ViTCAE eq. 26): heads marked with :meth:`Attention.set_frozen_heads` become constants of the
  backward pass; the autograd functions that do it are :mod:`vitlab.layers.frozen_heads`.
- proportional attention (ToMe, Bolya et al. 2023, sec. 3): ``size`` adds ``log(size)`` to the logits.

Frozen heads are kept contiguous: :meth:`Attention.set_frozen_heads` permutes the heads so that the frozen ones
occupy the first slots (the rows of ``W_qkv`` and ``b_qkv``, the columns of ``W_proj`` and ``log_tau`` move
together, an exact symmetry of multi-head attention). ``head_order[j]`` (a persistent buffer, so checkpoints and
exports carry it) is the original index of the head in slot ``j``; everything the module reports (``frozen_heads``,
``tau``, ``captured``) is indexed by original head, and :meth:`Attention.permute_heads_of` applies the same
permutation to optimizer state.
"""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

from vitlab.layers.attention_path import attend
from vitlab.layers.frozen_heads import attention_probs, frozen_heads_forward

TemperatureForm = Literal["inverse", "divide"]
# The parameters of Attention that have one slice per head, by their name inside the module.
HEAD_PARAMETERS = ("qkv.weight", "qkv.bias", "proj.weight", "log_tau")


class Attention(nn.Module):
    """Multi-head self-attention. ``x: [B, N, C] -> [B, N, C]``.

    Args:
        dim: token width C.
        num_heads: heads H; ``C`` must be divisible by ``H``.
        qkv_bias: bias on the fused QKV projection.
        attn_drop: dropout on the attention probabilities.
        proj_drop: dropout after the output projection.
        temperature: add a learnable per-head temperature (``log_tau: [H]``, tau = 1 at init).
        temperature_form: ``inverse`` (logits * tau) or ``divide`` (logits / tau).
    """

    def __init__(
        self,
        dim: int,
        *,
        num_heads: int = 8,
        qkv_bias: bool = True,
        attn_drop: float = 0.0,
        proj_drop: float = 0.0,
        temperature: bool = False,
        temperature_form: TemperatureForm = "inverse",
    ) -> None:
        super().__init__()
        if dim % num_heads != 0:
            raise ValueError(f"width {dim} is not divisible by num_heads={num_heads}; choose a head count dividing it")
        if temperature_form not in ("inverse", "divide"):
            raise ValueError(f"temperature_form must be 'inverse' or 'divide', got {temperature_form!r}")
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.scale = self.head_dim**-0.5
        self.temperature_form = temperature_form
        self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias)
        self.attn_drop = attn_drop
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(proj_drop)
        if temperature:
            self.log_tau = nn.Parameter(torch.zeros(num_heads))
        else:
            self.register_parameter("log_tau", None)
        self.register_buffer("frozen_heads", torch.zeros(num_heads, dtype=torch.bool), persistent=True)
        self.register_buffer("head_order", torch.arange(num_heads), persistent=True)
        # Host-side state derived from the buffers, so the hot path never syncs with the device.
        self.num_frozen = 0
        self._permuted = False
        self.fused = True
        # Frozen heads attend in one flash call with the active ones where that applies; True forces two calls
        # (the path for other devices, dtypes, dropout and capture; kept for tests and benchmarks).
        self.split_frozen = False
        # True: a frozen head's attention pattern (its W_q, W_k rows and tau) is frozen but its W_v rows keep their
        # weight gradient (dynamics.freeze_scope: pattern); False: eq. 26 as printed, W_v frozen too.
        self.train_frozen_values = False
        self.capture = False
        self.captured: torch.Tensor | None = None

    # ----------------------------------------------------------------------------------------------------------
    @property
    def head_slots(self) -> torch.Tensor:
        """``[H]`` long (CPU): the slot of the parameters that holds each original head."""
        return self.head_order.cpu().argsort()

    @property
    def tau(self) -> torch.Tensor | None:
        """Per-head temperature ``[H]`` by original head (``None`` when the module has no temperature)."""
        if self.log_tau is None:
            return None
        tau = self.log_tau.exp()
        return tau[self.head_slots.to(tau.device)] if self._permuted else tau

    def set_frozen_heads(self, frozen: torch.Tensor) -> torch.Tensor | None:
        """Mark heads as frozen (eq. 26). ``frozen: [H]`` bool, by original head.

        The frozen heads are moved to the first slots (frozen, then the others, each in original order). Returns the
        slot permutation ``perm: [H]`` (new slot ``j`` holds what slot ``perm[j]`` held) when the heads moved, else
        None. Whoever keeps state shaped like this module's parameters (an optimizer's moments) must permute it with
        :meth:`permute_heads_of`; :class:`vitlab.diagnostics.FrozenHeadGuard` does so for the optimizers it guards.
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

    def head_parameters(self) -> list[tuple[str, nn.Parameter]]:
        """The parameters with one slice per head, ``(name, parameter)``; see :meth:`permute_heads_of`."""
        found = [("qkv.weight", self.qkv.weight), ("qkv.bias", self.qkv.bias)]
        found += [("proj.weight", self.proj.weight), ("log_tau", self.log_tau)]
        return [(name, p) for name, p in found if p is not None]

    def permute_heads_of(self, name: str, tensor: torch.Tensor, perm: torch.Tensor) -> torch.Tensor:
        """``tensor`` shaped like parameter ``name`` (one of ``HEAD_PARAMETERS``) with its head slices permuted.

        Slot ``j`` of the result is slot ``perm[j]`` of ``tensor``: rows of ``qkv.weight`` / ``qkv.bias`` per head
        within each of q, k and v, columns of ``proj.weight``, entries of ``log_tau``.
        """
        heads, head_dim = self.num_heads, self.head_dim
        perm = perm.to(tensor.device)
        if name == "qkv.weight":
            return tensor.view(3, heads, head_dim, -1)[:, perm].reshape(tensor.shape)
        if name == "qkv.bias":
            return tensor.view(3, heads, head_dim)[:, perm].reshape(tensor.shape)
        if name == "proj.weight":
            return tensor.view(-1, heads, head_dim)[:, perm].reshape(tensor.shape)
        if name == "log_tau":
            return tensor[perm]
        raise ValueError(f"{name!r} has no head slices; the parameters that do are {HEAD_PARAMETERS}")

    def in_original_order(self, name: str, tensor: torch.Tensor) -> torch.Tensor:
        """``tensor`` shaped like parameter ``name`` (its value, gradient or an optimizer moment) with the heads put
        back in original order: what a model that never permuted its heads would hold."""
        return self.permute_heads_of(name, tensor, self.head_slots) if self._permuted else tensor

    def _sync_head_state(self) -> None:
        self.num_frozen = int(self.frozen_heads.sum())
        self._permuted = not torch.equal(self.head_order.cpu(), torch.arange(self.num_heads))

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        # A state saved before heads were permuted has no head_order: its parameters are in original order.
        legacy = prefix + "head_order" not in state_dict
        if legacy:
            state_dict[prefix + "head_order"] = torch.arange(self.num_heads)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)
        self._sync_head_state()
        if legacy and self.num_frozen:
            self.set_frozen_heads(self.frozen_heads.clone())

    def _qkv_parameters(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``W_qkv [3C, C]`` and ``b_qkv [3C]`` with the q rows scaled per head by the temperature.

        The temperature scales the q rows of ``W_qkv`` and ``b_qkv`` (``(x W_q^T + b_q) tau = x (tau W_q)^T +
        tau b_q``): O(C^2) work per step, where scaling q itself costs O(B N C) forward and backward, which made
        a ViT block's training step about 3% slower (docs/benchmarks.md).
        """
        if self.log_tau is None:
            return self.qkv.weight, self.qkv.bias
        sign = 1.0 if self.temperature_form == "inverse" else -1.0
        q_rows = (sign * self.log_tau).exp().repeat_interleave(self.head_dim)  # [C]
        row_scale = torch.cat([q_rows, q_rows.new_ones(2 * q_rows.numel())])  # [3C]: q rows scaled, k and v not
        bias = None if self.qkv.bias is None else self.qkv.bias * row_scale
        return self.qkv.weight * row_scale[:, None], bias

    # ----------------------------------------------------------------------------------------------------------
    def forward(self, x: torch.Tensor, size: torch.Tensor | None = None, return_keys: bool = False):
        """``x: [B, N, C]``; ``size: [B, N, 1]`` token sizes for proportional attention (ToMe) or None.

        Returns ``[B, N, C]``, or ``([B, N, C], keys [B, N, C/H])`` with the head-averaged keys when
        ``return_keys`` (the ToMe matching metric, without gradient).
        """
        B, N, C = x.shape
        H, d = self.num_heads, self.head_dim
        bias = None if size is None else size.log().view(B, 1, 1, N).to(x.dtype)
        weight, qkv_bias = self._qkv_parameters()
        # Without autograd a frozen head computes exactly what an active one does: the plain path.
        frozen = self.num_frozen if torch.is_grad_enabled() else 0
        if frozen:  # eq. 26
            out, k = frozen_heads_forward(self, x, weight, qkv_bias, bias, return_keys)
        else:
            q, k, v = F.linear(x, weight, qkv_bias).view(B, N, 3, H, d).permute(2, 0, 3, 1, 4).unbind(0)
            out = self._attend(q, k, v, bias).transpose(1, 2).reshape(B, N, C)  # q scaled by tau
        if self.capture and self._permuted:
            self.captured = self.captured[:, self.head_slots.to(self.captured.device)]
        out = self.proj_drop(self.proj(out))
        if return_keys:
            return out, k.detach().mean(1)
        return out

    def _attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """Scaled dot-product attention of ``[B, H, N, d]`` tensors: SDPA unless a capture asks for the matrix."""
        drop = self.attn_drop if self.training else 0.0
        if self.fused and not self.capture:
            return attend(q, k, v, bias, scale=self.scale, dropout_p=drop)  # the path measured fastest
        attn = attention_probs(q, k, bias, self.scale)
        if self.capture:
            self.captured = attn.detach()
        if drop > 0:
            attn = F.dropout(attn, p=drop)
        return attn @ v
