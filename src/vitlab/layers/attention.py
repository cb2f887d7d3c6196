"""The one multi-head self-attention of vitlab.

Every model of the project attends through :class:`Attention`. Its optional features are switches on this one
module, never copies of it:

- ``temperature``: a learnable per-head temperature ``tau[h] > 0`` stored as ``log_tau`` (ViTCAE eq. 19).
  ``temperature_form="inverse"`` multiplies the logits by tau (the paper's "high tau = sharp" reading);
  ``"divide"`` divides them (eq. 19 as printed).
- capture: when ``capture`` is set (see :func:`vitlab.layers.capture.capture_attention`) the eager path runs and
  the row-stochastic attention ``[B, H, N, N]`` is kept in ``captured``; otherwise SDPA runs and no matrix exists.
- frozen heads (ViTCAE eq. 26): heads marked in the ``frozen_heads`` buffer get their attention pattern computed
  without autograd, so the backward pass skips their Q/K path and softmax; the value path keeps the input gradient.
- proportional attention (ToMe, Bolya et al. 2023, sec. 3): ``size`` adds ``log(size)`` to the logits.
"""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

TemperatureForm = Literal["inverse", "divide"]


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
        # Host-side copies of the frozen / active head indices, so the hot path never syncs with the device.
        self._frozen_idx: list[int] = []
        self._active_idx: list[int] = list(range(num_heads))
        self.fused = True
        self.capture = False
        self.captured: torch.Tensor | None = None

    # ----------------------------------------------------------------------------------------------------------
    @property
    def tau(self) -> torch.Tensor | None:
        """Per-head temperature ``[H]`` (``None`` when the module has no temperature)."""
        return None if self.log_tau is None else self.log_tau.exp()

    def set_frozen_heads(self, frozen: torch.Tensor) -> None:
        """Mark heads as frozen (eq. 26). ``frozen: [H]`` bool."""
        frozen = torch.as_tensor(frozen, dtype=torch.bool, device=self.frozen_heads.device)
        if frozen.shape != (self.num_heads,):
            raise ValueError(f"frozen mask must have shape [{self.num_heads}], got {list(frozen.shape)}")
        self.frozen_heads.copy_(frozen)
        self._sync_head_indices()

    def _sync_head_indices(self) -> None:
        mask = self.frozen_heads.tolist()
        self._frozen_idx = [h for h, f in enumerate(mask) if f]
        self._active_idx = [h for h, f in enumerate(mask) if not f]

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)
        self._sync_head_indices()

    def _query_scale(self) -> torch.Tensor | None:
        """``[1, H, 1, 1]`` multiplier for q that applies the temperature (None when there is none)."""
        if self.log_tau is None:
            return None
        sign = 1.0 if self.temperature_form == "inverse" else -1.0
        return (sign * self.log_tau).exp().view(1, -1, 1, 1)

    def _project_qkv(self, x: torch.Tensor) -> torch.Tensor:
        """``x: [B, N, C] -> [B, N, 3C]``, the q part scaled per head by the temperature.

        The temperature scales the q rows of ``W_qkv`` and ``b_qkv`` (``(x W_q^T + b_q) tau = x (tau W_q)^T +
        tau b_q``): O(C^2) work per step, where scaling q itself costs O(B N C) forward and backward, which made
        a ViT block's training step about 3% slower (docs/benchmarks.md).
        """
        if self.log_tau is None:
            return self.qkv(x)
        sign = 1.0 if self.temperature_form == "inverse" else -1.0
        q_rows = (sign * self.log_tau).exp().repeat_interleave(self.head_dim)  # [C]
        row_scale = torch.cat([q_rows, q_rows.new_ones(2 * q_rows.numel())])  # [3C]: q rows scaled, k and v not
        bias = None if self.qkv.bias is None else self.qkv.bias * row_scale
        return F.linear(x, self.qkv.weight * row_scale[:, None], bias)

    # ----------------------------------------------------------------------------------------------------------
    def forward(self, x: torch.Tensor, size: torch.Tensor | None = None, return_keys: bool = False):
        """``x: [B, N, C]``; ``size: [B, N, 1]`` token sizes for proportional attention (ToMe) or None.

        Returns ``[B, N, C]``, or ``([B, N, C], keys [B, N, C/H])`` with the head-averaged keys when
        ``return_keys`` (the ToMe matching metric).
        """
        B, N, C = x.shape
        bias = None if size is None else size.log().view(B, 1, 1, N).to(x.dtype)
        if self._frozen_idx:
            out, k = self._forward_with_frozen(x, bias)
        else:
            qkv = self._project_qkv(x).view(B, N, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
            q, k, v = qkv.unbind(0)  # [B, H, N, d], q already scaled by the temperature
            out = self._attend(q, k, v, bias)
        out = out.transpose(1, 2).reshape(B, N, C)
        out = self.proj_drop(self.proj(out))
        if return_keys:
            return out, k.mean(1)
        return out

    def _attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """Scaled dot-product attention of ``[B, H, N, d]`` tensors: SDPA unless a capture asks for the matrix."""
        drop = self.attn_drop if self.training else 0.0
        if self.fused and not self.capture:
            return F.scaled_dot_product_attention(q, k, v, attn_mask=bias, dropout_p=drop, scale=self.scale)
        attn = (q * self.scale) @ k.transpose(-2, -1)
        if bias is not None:
            attn = attn + bias
        attn = attn.softmax(dim=-1)
        if self.capture:
            self.captured = attn.detach()
        if drop > 0:
            attn = F.dropout(attn, p=drop)
        return attn @ v

    def _forward_with_frozen(self, x: torch.Tensor, bias: torch.Tensor | None):
        """Eq. 26: frozen heads' attention as a constant; only their value path stays in the autograd graph.

        The weight rows of frozen heads are used detached, so neither W_q, W_k, W_v rows nor tau of those heads
        get a gradient, and autograd records nothing for their Q/K projections, logits or softmax.
        """
        B, N, C = x.shape
        H, d = self.num_heads, self.head_dim
        frozen, active = self._frozen_idx, self._active_idx
        w = self.qkv.weight.view(3, H, d, C)
        b = None if self.qkv.bias is None else self.qkv.bias.view(3, H, d)
        scale = self._query_scale()
        outs = x.new_empty(B, H, N, d)
        keys = x.new_empty(B, H, N, d)
        captured_active = None

        def project(part: slice, heads: list[int], detach: bool) -> torch.Tensor:
            wr = w[part][:, heads].reshape(-1, C)
            br = None if b is None else b[part][:, heads].reshape(-1)
            if detach:
                wr = wr.detach()
                br = None if br is None else br.detach()
            return F.linear(x, wr, br).view(B, N, -1, len(heads), d).permute(2, 0, 3, 1, 4)

        if active:
            q, k, v = project(slice(0, 3), active, detach=False).unbind(0)
            if scale is not None:
                q = q * scale[:, active].to(q.dtype)
            outs[:, active] = self._attend(q, k, v, bias)
            keys[:, active] = k.detach()
            captured_active = self.captured if self.capture else None
        with torch.no_grad():
            qf, kf = project(slice(0, 2), frozen, detach=True).unbind(0)
            if scale is not None:
                qf = qf * scale[:, frozen].to(qf.dtype)
            logits = (qf * self.scale) @ kf.transpose(-2, -1)
            if bias is not None:
                logits = logits + bias
            probs = logits.softmax(-1)
        vf = project(slice(2, 3), frozen, detach=True)[0]
        outs[:, frozen] = probs @ vf
        keys[:, frozen] = kf
        if self.capture:
            full = x.new_empty(B, H, N, N)
            if captured_active is not None:
                full[:, active] = captured_active
            full[:, frozen] = probs
            self.captured = full
        return outs, keys
