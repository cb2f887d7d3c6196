"""The one multi-head self-attention of vitlab.

Every model of the project attends through :class:`Attention`. Its optional features are switches on this one
module, never copies of it:

- ``temperature``: a learnable per-head temperature ``tau[h] > 0`` stored as ``log_tau`` (ViTCAE eq. 19).
  ``temperature_form="inverse"`` multiplies the logits by tau (the paper's "high tau = sharp" reading);
  ``"divide"`` divides them (eq. 19 as printed).
- capture: when ``capture`` is set (see :func:`vitlab.layers.capture.attention_capture`) the eager path runs and
  the row-stochastic attention ``[B, H, N, N]`` is kept in ``captured``; otherwise SDPA runs and no matrix exists.
- frozen heads (ViTCAE eq. 26) are a subclass owned by the package that needs them,
  :class:`vitlab.dynamics.FrozenHeadAttention`, which overrides :meth:`Attention.attend_heads`.
- proportional attention (ToMe, Bolya et al. 2023, sec. 3): ``size`` adds ``log(size)`` to the logits.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from vitlab.config.model import TemperatureForm
from vitlab.layers.attention_path import attend
from vitlab.layers.dropout import dropout


def attention_probs(q: torch.Tensor, k: torch.Tensor, bias: torch.Tensor | None, scale: float) -> torch.Tensor:
    """Row-stochastic attention ``softmax(q k^T * scale + bias)``: ``[B, H, N, d] -> [B, H, N, N]``."""
    logits = (q * scale) @ k.transpose(-2, -1)
    if bias is not None:
        logits = logits + bias
    return logits.softmax(dim=-1)


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
        self.fused = True
        self.capture = False
        self.captured: torch.Tensor | None = None

    # ----------------------------------------------------------------------------------------------------------
    @property
    def tau(self) -> torch.Tensor | None:
        """Per-head temperature ``[H]`` (``None`` when the module has no temperature)."""
        return None if self.log_tau is None else self.log_tau.exp()

    def _qkv_parameters(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``W_qkv [3C, C]`` and ``b_qkv [3C]`` with the q rows scaled per head by the temperature.

        The temperature scales the q rows of ``W_qkv`` and ``b_qkv`` (``(x W_q^T + b_q) tau = x (tau W_q)^T +
        tau b_q``): O(C^2) work per step, where scaling q itself costs O(B N C) forward and backward
        (docs/benchmarks.md, "A fix this benchmark found: the temperature").
        """
        if self.log_tau is None:
            return self.qkv.weight, self.qkv.bias
        sign = 1.0 if self.temperature_form == "inverse" else -1.0
        q_rows = (sign * self.log_tau).exp().repeat_interleave(self.head_dim)  # [C]
        row_scale = torch.cat([q_rows, q_rows.new_ones(2 * q_rows.numel())])  # [3C]: q rows scaled, k and v not
        bias = None if self.qkv.bias is None else self.qkv.bias * row_scale
        return self.qkv.weight * row_scale[:, None], bias

    # ----------------------------------------------------------------------------------------------------------
    def forward(
        self,
        x: torch.Tensor,
        size: torch.Tensor | None = None,
        return_keys: bool = False,
        attn_mask: torch.Tensor | None = None,
        is_causal: bool = False,
    ):
        """``x: [B, N, C]``; ``size: [B, N, 1]`` token sizes for proportional attention (ToMe) or None;
        ``attn_mask``: an additive float mask broadcast to ``[B, H, N, N]`` (timm's ``Block`` passes its
        ``attn_mask`` and ``is_causal``, None and False unless the model masks tokens).

        Returns ``[B, N, C]``, or ``([B, N, C], keys [B, N, C/H])`` with the head-averaged keys when
        ``return_keys`` (the ToMe matching metric, without gradient).
        """
        B, N, _ = x.shape
        if is_causal or (attn_mask is not None and not attn_mask.is_floating_point()):
            raise ValueError("vitlab's Attention takes an additive float attn_mask only (no is_causal, no bool mask)")
        bias = None if size is None else size.log().view(B, 1, 1, N).to(x.dtype)
        if attn_mask is not None:
            bias = attn_mask if bias is None else bias + attn_mask
        weight, qkv_bias = self._qkv_parameters()
        out, k = self.attend_heads(x, weight, qkv_bias, bias, return_keys)
        out = self.proj_drop(self.proj(out))
        if return_keys:
            return out, k.detach().mean(1)
        return out

    def attend_heads(
        self,
        x: torch.Tensor,
        weight: torch.Tensor,
        qkv_bias: torch.Tensor | None,
        bias: torch.Tensor | None,
        return_keys: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The heads' attention before the output projection: ``x: [B, N, C] -> ([B, N, C], keys [B, H, N, d])``.

        ``weight``, ``qkv_bias``: the QKV parameters with the temperature applied; ``bias``: proportional attention's
        ``[B, 1, 1, N]`` or None. The keys may be None unless ``return_keys``. Subclasses with other heads (frozen
        heads, ViTCAE eq. 26) override this.
        """
        B, N, C = x.shape
        H, d = self.num_heads, self.head_dim
        q, k, v = F.linear(x, weight, qkv_bias).view(B, N, 3, H, d).permute(2, 0, 3, 1, 4).unbind(0)
        return self._attend(q, k, v, bias).transpose(1, 2).reshape(B, N, C), k  # q scaled by tau

    def _attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """Scaled dot-product attention of ``[B, H, N, d]`` tensors: SDPA unless a capture asks for the matrix."""
        drop = self.attn_drop if self.training else 0.0
        if self.fused and not self.capture:
            return attend(q, k, v, bias, scale=self.scale, dropout_p=drop)  # SDPA: the fast path (docs/benchmarks.md)
        attn = attention_probs(q, k, bias, self.scale)
        if self.capture:
            self.captured = attn.detach()
        if drop > 0:
            attn = dropout(attn, drop)  # vitlab's mask, as on the eager path
        return attn @ v
