"""Attention dynamics of the ViTCAE controller: drift, consensus clusters, temperature schedule, convergence.

ViTCAE (Jebraeeli et al., arXiv 2509.16554), section "Convergence diagnostics" and eq. 20. Every function here is
pure: tensors in, tensors out; the controller that runs them once per epoch lives in the training code.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from ot.lp.emd_wrap import emd_c

# Attention maps come out of float32 / bf16 softmaxes; a row may miss unit mass by a few ulps times N.
_MASS_TOLERANCE = 1e-3
# ot.emd2's defaults: its iteration cap, and the C solver's code for an optimal solution
_EMD_MAX_ITER = 100_000
_EMD_OPTIMAL = 1


def patch_grid_cost(grid_h: int, grid_w: int) -> torch.Tensor:
    """Ground cost of the attention evolution distance: Euclidean distance between patch centres, in patch units.

    Patches are numbered row-major, as ``PatchEmbed`` flattens them. Returns ``cost: [N, N]`` float64, N = H * W.
    """
    if grid_h < 1 or grid_w < 1:
        raise ValueError(f"the patch grid must be at least 1x1, got {grid_h}x{grid_w}")
    rows, cols = torch.meshgrid(torch.arange(grid_h), torch.arange(grid_w), indexing="ij")
    centres = torch.stack([rows.flatten(), cols.flatten()], dim=1).to(torch.float64)
    return torch.cdist(centres, centres)


def _check_distributions(p: torch.Tensor, name: str) -> None:
    if not torch.isfinite(p).all() or (p < 0).any():
        raise ValueError(f"{name} must be finite and non-negative (a distribution over patches)")
    mass = p.sum(dim=-1).flatten()
    mass_error = (mass - 1).abs()
    if mass_error.numel() and mass_error.max() > _MASS_TOLERANCE:
        worst = mass[mass_error.argmax()].item()
        raise ValueError(
            f"{name} must sum to 1 over its last dim (got a row with mass {worst:.6f}); "
            "renormalise it, e.g. with attention_to_cls_distribution"
        )


def attention_drift(p: torch.Tensor, q: torch.Tensor, cost: torch.Tensor) -> torch.Tensor:
    """Attention evolution distance: exact 1-Wasserstein distance between attention distributions on the patch grid.

    ViTCAE section "Convergence diagnostics", the ``d[l, h]`` that drives eq. 20.
    ``p, q: [..., N]`` distributions (rows summing to 1), ``cost: [N, N]`` a metric (e.g. :func:`patch_grid_cost`).
    Returns ``d: [...]`` float64 on ``p``'s device.

    The result is exact optimal transport, POT's network simplex. Because the ground cost is a metric, W1 depends on
    ``p - q`` only (Kantorovich-Rubinstein), so the mass the two distributions share stays in place and only
    ``(p - q)+`` is moved onto ``(p - q)-``: the same optimum on a smaller problem. Each problem goes straight to
    POT's C solver (``ot.lp.emd_wrap.emd_c``, what ``ot.emd2`` calls after its argument handling, which cost
    three quarters of each call here); the marginals are prepared exactly as ``ot.emd2`` prepares them, so the
    values are those of ``ot.emd2`` on the reduced problem.
    """
    if p.shape != q.shape:
        raise ValueError(f"p and q must have the same shape, got {list(p.shape)} and {list(q.shape)}")
    num_patches = p.shape[-1]
    if cost.shape != (num_patches, num_patches):
        raise ValueError(f"cost must be [N, N] = [{num_patches}, {num_patches}] to match p, got {list(cost.shape)}")
    cost64 = cost.detach().to("cpu", torch.float64)
    if cost64.diagonal().abs().max() > 0 or not torch.equal(cost64, cost64.T) or (cost64 < 0).any():
        raise ValueError("cost must be a metric: symmetric, non-negative, zero on the diagonal (see patch_grid_cost)")
    _check_distributions(p, "p")
    _check_distributions(q, "q")

    p64 = p.detach().to("cpu", torch.float64).reshape(-1, num_patches)
    q64 = q.detach().to("cpu", torch.float64).reshape(-1, num_patches)
    difference = (p64 / p64.sum(-1, keepdim=True) - q64 / q64.sum(-1, keepdim=True)).numpy()
    cost_np = np.ascontiguousarray(cost64.numpy())
    surplus, deficit = difference > 0, difference < 0
    moved_mass = np.where(surplus, difference, 0).sum(-1)
    drift = np.zeros(difference.shape[0])
    for i in np.flatnonzero(moved_mass > 0):
        delta, rows, columns = difference[i], surplus[i], deficit[i]
        source = delta[rows] / moved_mass[i]
        target = -delta[columns]
        target = target / target.sum()
        target = target * source.sum(0) / target.sum(0, keepdims=True)  # ot.emd2's rescaling of b, kept bit-exact
        _, value, _, _, code = emd_c(source, target, cost_np[np.ix_(rows, columns)], _EMD_MAX_ITER, 1)
        if code != _EMD_OPTIMAL:
            raise RuntimeError(f"POT's network simplex stopped without an optimum (code {code}) on a drift problem")
        drift[i] = moved_mass[i] * value
    return torch.from_numpy(drift).reshape(p.shape[:-1]).to(p.device)


def attention_to_cls_distribution(attn: torch.Tensor, num_prefix_tokens: int = 1) -> torch.Tensor:
    """CLS-to-patch attention renormalised over the patches: the distribution whose drift ViTCAE measures.

    ``attn: [B, H, T, T]`` row-stochastic with ``T = num_prefix_tokens + N``, the CLS token first.
    Returns ``[B, H, N]``, each row summing to 1.
    """
    if attn.ndim != 4 or attn.shape[-1] != attn.shape[-2]:
        raise ValueError(f"attn must be [B, H, T, T], got {list(attn.shape)}")
    if not 1 <= num_prefix_tokens < attn.shape[-1]:
        raise ValueError(
            f"num_prefix_tokens must be in [1, T) with the CLS token first, "
            f"got {num_prefix_tokens} for T={attn.shape[-1]}"
        )
    cls_to_patches = attn[:, :, 0, num_prefix_tokens:]
    mass = cls_to_patches.sum(dim=-1, keepdim=True)
    if (mass <= 0).any():
        raise ValueError("the CLS token gives no attention to any patch in some head; its distribution is undefined")
    return cls_to_patches / mass


def consensus_clusters(attn: torch.Tensor, eps: float = 0.1, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """Number of consensus clusters of an attention head seen as a Markov chain (ViTCAE "Convergence diagnostics").

    ``attn: [..., N, N]`` row-stochastic. Counts the eigenvalues of modulus ``>= 1 - eps``: 1 for global consensus,
    k for k nearly-decoupled groups of tokens, N when every token attends only to itself. Eigenvalues are computed
    in ``dtype`` (float64 by default; in float32 a modulus within float32 rounding of ``1 - eps`` may count
    differently). Returns ``kappa: [...]`` int64 on ``attn``'s device.
    """
    if not 0 < eps < 1:
        raise ValueError(f"eps must be in (0, 1), got {eps}")
    if attn.ndim < 2 or attn.shape[-1] != attn.shape[-2]:
        raise ValueError(f"attn must be [..., N, N], got {list(attn.shape)}")
    if dtype not in (torch.float64, torch.float32):
        raise ValueError(f"dtype must be torch.float64 or torch.float32, got {dtype}")
    matrix = attn.detach().to(dtype)
    if (matrix < 0).any() or ((matrix.sum(-1) - 1).abs() > _MASS_TOLERANCE).any():
        raise ValueError("attn must be row-stochastic (non-negative rows summing to 1), as a softmax attention map is")
    moduli = torch.linalg.eigvals(matrix).abs()
    return (moduli >= 1 - eps).sum(dim=-1)


def temperature_update(drift: torch.Tensor | float, alpha: float = 1.0) -> torch.Tensor:
    """ViTCAE eq. 20: ``tau_{t+1} = 1 / (1 + alpha * d_t)``. ``drift: [...]`` (non-negative) -> ``tau: [...]``."""
    if not alpha > 0:
        raise ValueError(f"alpha must be > 0 (eq. 20), got {alpha}")
    drift = torch.as_tensor(drift, dtype=torch.float64) if not torch.is_tensor(drift) else drift
    if not torch.isfinite(drift).all() or (drift < 0).any():
        raise ValueError("drift must be finite and non-negative (it is a Wasserstein distance)")
    return 1.0 / (1.0 + alpha * drift)


class ConvergenceTracker:
    """ViTCAE's convergence rule: a head is converged once ``d < eps_d`` and ``|tau_t - tau_{t-1}| < eps_tau`` held
    for ``patience`` consecutive epochs; it then stays converged (and is frozen, eq. 26).

    Call :meth:`update` once per epoch with that epoch's drift and temperature, both ``[L, H]``. The first call only
    records tau: without a previous tau its change is undefined, so no streak can start there.
    """

    def __init__(self, num_layers: int, num_heads: int, eps_d: float, eps_tau: float, patience: int) -> None:
        if num_layers < 1 or num_heads < 1:
            raise ValueError(f"num_layers and num_heads must be >= 1, got {num_layers} and {num_heads}")
        if not eps_d > 0 or not eps_tau > 0:
            raise ValueError(f"eps_d and eps_tau must be > 0, got {eps_d} and {eps_tau}")
        if patience < 1:
            raise ValueError(f"patience must be >= 1 epoch, got {patience}")
        self.num_layers, self.num_heads = num_layers, num_heads
        self.eps_d, self.eps_tau, self.patience = eps_d, eps_tau, patience
        self.streak = torch.zeros(num_layers, num_heads, dtype=torch.long)
        self.converged = torch.zeros(num_layers, num_heads, dtype=torch.bool)
        self.previous_tau: torch.Tensor | None = None

    def update(self, drift: torch.Tensor, tau: torch.Tensor) -> torch.Tensor:
        """Record one epoch. ``drift, tau: [L, H]``. Returns ``converged: [L, H]`` bool (a copy)."""
        shape = (self.num_layers, self.num_heads)
        drift = torch.as_tensor(drift).detach().to("cpu", torch.float64)
        tau = torch.as_tensor(tau).detach().to("cpu", torch.float64)
        if drift.shape != shape or tau.shape != shape:
            raise ValueError(
                f"drift and tau must be [L, H] = {list(shape)}, got {list(drift.shape)} and {list(tau.shape)}"
            )
        if not (torch.isfinite(drift).all() and torch.isfinite(tau).all()):
            raise ValueError("drift and tau must be finite; a NaN here means the probe pass or the schedule diverged")
        if self.previous_tau is None:
            stable = torch.zeros(shape, dtype=torch.bool)
        else:
            stable = (drift < self.eps_d) & ((tau - self.previous_tau).abs() < self.eps_tau)
        self.streak = torch.where(stable, self.streak + 1, torch.zeros_like(self.streak))
        self.converged |= self.streak >= self.patience
        self.previous_tau = tau
        return self.converged.clone()

    def state_dict(self) -> dict[str, Any]:
        """Plain python and CPU tensors, so the tracker can ride in a Lightning checkpoint."""
        return {
            "num_layers": self.num_layers,
            "num_heads": self.num_heads,
            "eps_d": self.eps_d,
            "eps_tau": self.eps_tau,
            "patience": self.patience,
            "streak": self.streak.clone(),
            "converged": self.converged.clone(),
            "previous_tau": None if self.previous_tau is None else self.previous_tau.clone(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore from :meth:`state_dict`; the head grid must match this tracker's."""
        if (state["num_layers"], state["num_heads"]) != (self.num_layers, self.num_heads):
            raise ValueError(
                f"state is for a {state['num_layers']}x{state['num_heads']} head grid, "
                f"this tracker is {self.num_layers}x{self.num_heads}"
            )
        self.eps_d, self.eps_tau, self.patience = state["eps_d"], state["eps_tau"], state["patience"]
        self.streak = state["streak"].clone().to("cpu", torch.long)
        self.converged = state["converged"].clone().to("cpu", torch.bool)
        previous_tau = state["previous_tau"]
        self.previous_tau = None if previous_tau is None else previous_tau.clone().to("cpu", torch.float64)
