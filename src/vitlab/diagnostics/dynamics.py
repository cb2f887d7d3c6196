"""Attention dynamics of the ViTCAE controller: drift, consensus clusters, temperature schedule (the convergence
rule is :mod:`vitlab.diagnostics.convergence`).

ViTCAE (Jebraeeli et al., arXiv 2509.16554), section "Convergence diagnostics" and eq. 20. Every function here is
pure: tensors in, tensors out; the controller that runs them once per epoch lives in the training code.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch
from ot.lp.emd_wrap import emd_c

from vitlab.config.dynamics import DRIFT_UNITS

# Attention maps come out of float32 / bf16 softmaxes; a row may miss unit mass by a few ulps times N.
_MASS_TOLERANCE = 1e-3
# ot.emd2's defaults: its iteration cap, and the C solver's code for an optimal solution
_EMD_MAX_ITER = 100_000
_EMD_OPTIMAL = 1
# Below this many patches a drift problem is so small that the part of the call that holds the GIL dominates it and
# a second thread slows it down (docs/experiments/dynamics_costs.md, "The transport problems on several threads");
# smaller grids stay on one thread.
_THREADED_MIN_PATCHES = 25


def patch_grid_cost(grid_h: int, grid_w: int, units: str = "patch") -> torch.Tensor:
    """Ground cost of the attention evolution distance: Euclidean distance between patch centres.

    ``units="patch"``: in patch widths (the paper's grid). ``units="image"``: in image sides (a row step is
    ``1 / grid_h``, a column step ``1 / grid_w``), so the same movement of attention over the image has the same
    cost on a 4x4 and an 8x8 grid. Patches are numbered row-major, as ``PatchEmbed`` flattens them.
    Returns ``cost: [N, N]`` float64, N = H * W.
    """
    if grid_h < 1 or grid_w < 1:
        raise ValueError(f"the patch grid must be at least 1x1, got {grid_h}x{grid_w}")
    if units not in DRIFT_UNITS:
        raise ValueError(f"units must be one of {', '.join(DRIFT_UNITS)}, got {units!r}")
    rows, cols = torch.meshgrid(torch.arange(grid_h), torch.arange(grid_w), indexing="ij")
    centres = torch.stack([rows.flatten(), cols.flatten()], dim=1).to(torch.float64)
    if units == "image":
        centres = centres / torch.tensor([grid_h, grid_w], dtype=torch.float64)
    # Not through a matrix product (cdist's default beyond 25 points): that one is neither exactly symmetric nor
    # exactly zero on the diagonal when the centres are not exact binary fractions (a 6x6 or 14x14 grid in image
    # units), and attention_drift rejects such a cost.
    return torch.cdist(centres, centres, compute_mode="donot_use_mm_for_euclid_dist")


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


def attention_drift(p: torch.Tensor, q: torch.Tensor, cost: torch.Tensor, workers: int = 1) -> torch.Tensor:
    """Attention evolution distance: exact 1-Wasserstein distance between attention distributions on the patch grid.

    ViTCAE section "Convergence diagnostics", the ``d[l, h]`` that drives eq. 20.
    ``p, q: [..., N]`` distributions (rows summing to 1), ``cost: [N, N]`` a metric (e.g. :func:`patch_grid_cost`).
    ``workers``: threads that solve the transport problems (POT's C solver releases the GIL) on grids of at least
    25 patches (smaller problems are faster on one); every problem is solved exactly as with one, so the values do
    not depend on it. Returns ``d: [...]`` float64 on ``p``'s device.

    The result is exact optimal transport, POT's network simplex. Because the ground cost is a metric, W1 depends on
    ``p - q`` only (Kantorovich-Rubinstein), so the mass the two distributions share stays in place and only
    ``(p - q)+`` is moved onto ``(p - q)-``: the same optimum on a smaller problem. Each problem goes straight to
    POT's C solver (``ot.lp.emd_wrap.emd_c``, what ``ot.emd2`` calls after its argument handling); the marginals of
    all problems are prepared in one vectorised pass as ``ot.emd2`` prepares them, and the solver, given the whole
    cost matrix, drops the zero-mass points itself, so the values are those of ``ot.emd2`` on the reduced problem
    (to rounding, ~1e-16).
    """
    cost_np = np.ascontiguousarray(_checked_drift_inputs(p, q, cost, workers).numpy())
    num_patches = p.shape[-1]
    todo, moved_mass, source, target = _transport_problems(p.reshape(-1, num_patches), q.reshape(-1, num_patches))
    drift = np.zeros(len(moved_mass))

    def solve(rows: np.ndarray) -> None:
        for row in rows.tolist():
            _, value, _, _, code = emd_c(source[row], target[row], cost_np, _EMD_MAX_ITER, 1)
            if code != _EMD_OPTIMAL:
                raise RuntimeError(f"POT's network simplex stopped without an optimum (code {code}) on a drift problem")
            drift[todo[row]] = moved_mass[todo[row]] * value

    rows = np.arange(len(todo))
    if workers > 1 and num_patches >= _THREADED_MIN_PATCHES and len(todo) >= 2 * workers:
        with ThreadPoolExecutor(workers) as pool:
            list(pool.map(solve, np.array_split(rows, workers)))  # list(): a worker's error is raised here
    else:
        solve(rows)
    return torch.from_numpy(drift).reshape(p.shape[:-1]).to(p.device)


def _transport_problems(p: torch.Tensor, q: torch.Tensor) -> tuple[np.ndarray, ...]:
    """The reduced problems of :func:`attention_drift` for ``p, q: [M, N]``: ``(todo, moved_mass [M], source,
    target)``, ``(p - q)+`` onto ``(p - q)-`` for the rows ``todo`` that move mass, both of unit mass and the target
    rescaled to the source's mass as ``ot.emd2`` does, every row at once (the solver drops the zero-mass points
    itself, faster than cutting each problem to its support in Python: benchmarks/micro/drift_solver.py)."""
    p64, q64 = p.detach().to("cpu", torch.float64), q.detach().to("cpu", torch.float64)
    difference = (p64 / p64.sum(-1, keepdim=True) - q64 / q64.sum(-1, keepdim=True)).numpy()
    surplus, deficit = difference > 0, difference < 0
    moved_mass = np.where(surplus, difference, 0).sum(-1)
    # A row with surplus but no deficit differs only by rounding (both rows sum to 1; e.g. one ulp apart): its W1 is
    # 0 to within moved_mass * max(cost), and the solver must not see an empty target (it crashes on one).
    todo = np.flatnonzero((moved_mass > 0) & deficit.any(-1))
    source = np.where(surplus[todo], difference[todo], 0.0) / moved_mass[todo, None]
    target = np.where(deficit[todo], -difference[todo], 0.0)
    target = target / target.sum(-1, keepdims=True)
    return todo, moved_mass, source, target * (source.sum(-1, keepdims=True) / target.sum(-1, keepdims=True))


def _checked_drift_inputs(p: torch.Tensor, q: torch.Tensor, cost: torch.Tensor, workers: int) -> torch.Tensor:
    """:func:`attention_drift`'s inputs checked; returns ``cost`` as float64 on the CPU."""
    if p.shape != q.shape:
        raise ValueError(f"p and q must have the same shape, got {list(p.shape)} and {list(q.shape)}")
    if workers < 1:
        raise ValueError(f"workers must be at least 1, got {workers}")
    num_patches = p.shape[-1]
    if cost.shape != (num_patches, num_patches):
        raise ValueError(f"cost must be [N, N] = [{num_patches}, {num_patches}] to match p, got {list(cost.shape)}")
    cost64 = cost.detach().to("cpu", torch.float64)
    if cost64.diagonal().abs().max() > 0 or not torch.equal(cost64, cost64.T) or (cost64 < 0).any():
        raise ValueError("cost must be a metric: symmetric, non-negative, zero on the diagonal (see patch_grid_cost)")
    _check_distributions(p, "p")
    _check_distributions(q, "q")
    return cost64


def score_drift(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """How far a head's attention *scores* moved between two distributions ``p, q: [..., N] -> [...]`` float64: the
    root mean square over the patches of the change of the centred log-attention ``z = log a - mean(log a)`` (a
    softmax's logits up to their mean), the logarithm taken in float64 of the attention as given. Attention that is 0
    in its own dtype (a float32 softmax below ~1e-45, a logit gap of ~100) counts as that dtype's smallest normal
    number (float32: 1.2e-38, e^-87.3), where its logit is lost anyway.

    The response rule's second statistic (this project, beside ViTCAE's drift of section "Convergence diagnostics";
    docs/dynamics.md, "The response rule"): as a softmax saturates its attention, and so its drift, hardly moves while
    its logits keep walking; the scores show the walk.
    """

    def centred(a: torch.Tensor) -> torch.Tensor:
        z = a.double().clamp_min(torch.finfo(a.dtype).tiny).log()
        return z - z.mean(dim=-1, keepdim=True)

    return (centred(p) - centred(q)).pow(2).mean(dim=-1).sqrt()


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
