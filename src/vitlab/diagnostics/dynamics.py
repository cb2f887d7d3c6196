"""Attention dynamics of the ViTCAE controller: drift, consensus clusters, temperature schedule, convergence.

ViTCAE (Jebraeeli et al., arXiv 2509.16554), section "Convergence diagnostics" and eq. 20. Every function here is
pure: tensors in, tensors out; the controller that runs them once per epoch lives in the training code.
"""

from __future__ import annotations

import functools
import math
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import torch
from ot.lp.emd_wrap import emd_c

from vitlab.config.dynamics import CONVERGENCE_RULES, DRIFT_UNITS, TAU_CLAUSES

# Attention maps come out of float32 / bf16 softmaxes; a row may miss unit mass by a few ulps times N.
_MASS_TOLERANCE = 1e-3
# ot.emd2's defaults: its iteration cap, and the C solver's code for an optimal solution
_EMD_MAX_ITER = 100_000
_EMD_OPTIMAL = 1
# Below this many patches a drift problem is so small that the part of the call that holds the GIL dominates it and
# a second thread slows it down (docs/experiments/dynamics_costs.md, "The transport problems on several threads");
# smaller grids stay on one thread.
_THREADED_MIN_PATCHES = 25


DRIFT_KINDS = ("directed", "random_walk", "jitter")


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
    POT's C solver (``ot.lp.emd_wrap.emd_c``, what ``ot.emd2`` calls after its argument handling, which cost
    three quarters of each call here); the marginals of all problems are prepared in one vectorised pass as
    ``ot.emd2`` prepares them, and the solver, given the whole cost matrix, drops the zero-mass points itself, so
    the values are those of ``ot.emd2`` on the reduced problem (to rounding, ~1e-16).
    """
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

    p64 = p.detach().to("cpu", torch.float64).reshape(-1, num_patches)
    q64 = q.detach().to("cpu", torch.float64).reshape(-1, num_patches)
    difference = (p64 / p64.sum(-1, keepdim=True) - q64 / q64.sum(-1, keepdim=True)).numpy()
    cost_np = np.ascontiguousarray(cost64.numpy())
    surplus, deficit = difference > 0, difference < 0
    moved_mass = np.where(surplus, difference, 0).sum(-1)
    drift = np.zeros(difference.shape[0])
    # A row with surplus but no deficit differs only by rounding (both rows sum to 1; e.g. one ulp apart): its W1 is
    # 0 to within moved_mass * max(cost), and the solver must not see an empty target (it crashes on one).
    todo = np.flatnonzero((moved_mass > 0) & deficit.any(-1))
    # (p - q)+ onto (p - q)-, both scaled to unit mass and the target rescaled to the source's mass as ot.emd2 does,
    # every row at once; the solver gets the whole cost matrix and drops the zero-mass points itself (faster than
    # cutting each problem to its support in Python: benchmarks/micro/drift_solver.py)
    source = np.where(surplus[todo], difference[todo], 0.0) / moved_mass[todo, None]
    target = np.where(deficit[todo], -difference[todo], 0.0)
    target = target / target.sum(-1, keepdims=True)
    target = target * (source.sum(-1, keepdims=True) / target.sum(-1, keepdims=True))

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


def directedness(two_epoch: torch.Tensor, earlier: torch.Tensor, later: torch.Tensor) -> torch.Tensor:
    """``r = d(t-2, t) / (d(t-2, t-1) + d(t-1, t))`` (see :class:`ConvergenceTracker`, ``rule="noise"``), in [0, 1]
    by the triangle inequality; 0 where the head did not move at all. All ``[...]`` drifts."""
    total = earlier + later
    return torch.where(total > 0, two_epoch / total.clamp_min(1e-300), torch.zeros_like(total)).clamp(0, 1)


def directedness_standard_error(two_epoch: torch.Tensor, later: torch.Tensor, earlier: torch.Tensor) -> torch.Tensor:
    """Standard error of the directedness ``r = mean(two_epoch) / (earlier + mean(later))`` (:func:`directedness`)
    from per-image drifts, by the delta method.

    ``two_epoch, later: [..., P]`` the per-image ``d(t-2, t)`` and ``d(t-1, t)`` on the same ``P`` images;
    ``earlier: [...]`` the previous epoch's ``d(t-2, t-1)``, taken as known. Returns ``[...]`` float64 (0 where
    ``P < 2`` or the head did not move). What the adaptive probe (``probe_min``) needs to tell, under the noise rule,
    whether a head's directedness is within ``probe_z`` standard errors of ``rho``.
    """
    two_epoch, later = two_epoch.double(), later.double()
    count = two_epoch.shape[-1]
    if count < 2:
        return torch.zeros(two_epoch.shape[:-1], dtype=torch.float64)
    x, y = two_epoch.mean(-1), later.mean(-1)
    total = earlier.double() + y
    moved = total > 0
    safe = torch.where(moved, total, torch.ones_like(total))
    grad_x, grad_y = 1 / safe, -x / safe**2
    centred_x, centred_y = two_epoch - x[..., None], later - y[..., None]
    var_x = (centred_x**2).sum(-1) / (count - 1)
    var_y = (centred_y**2).sum(-1) / (count - 1)
    cov = (centred_x * centred_y).sum(-1) / (count - 1)
    variance = (grad_x**2 * var_x + grad_y**2 * var_y + 2 * grad_x * grad_y * cov) / count
    return torch.where(moved, variance.clamp_min(0).sqrt(), torch.zeros_like(variance))


def temperature_update(drift: torch.Tensor | float, alpha: float = 1.0) -> torch.Tensor:
    """ViTCAE eq. 20: ``tau_{t+1} = 1 / (1 + alpha * d_t)``. ``drift: [...]`` (non-negative) -> ``tau: [...]``."""
    if not alpha > 0:
        raise ValueError(f"alpha must be > 0 (eq. 20), got {alpha}")
    drift = torch.as_tensor(drift, dtype=torch.float64) if not torch.is_tensor(drift) else drift
    if not torch.isfinite(drift).all() or (drift < 0).any():
        raise ValueError("drift must be finite and non-negative (it is a Wasserstein distance)")
    return 1.0 / (1.0 + alpha * drift)


def simulate_attention_paths(
    kind: str,
    grid: tuple[int, int],
    images: int,
    epochs: int,
    step: float,
    generator: torch.Generator,
    spread: float = 1.0,
) -> torch.Tensor:
    """Synthetic per-epoch CLS-to-patch attention for ``images`` probe images on a ``grid`` of patches, as
    softmaxes of logits ``[images, N]`` drawn ``N(0, spread^2)`` at epoch 0. Returns ``[epochs + 1, images, N]``.

    - ``directed``: the logits move in a straight line toward a second random pattern, ``step`` of the way per
      epoch (attention keeps moving the same way);
    - ``random_walk``: the logits take an independent ``N(0, step^2)`` step every epoch (movement that accumulates
      without a direction);
    - ``jitter``: fresh ``N(0, step^2)`` noise around the fixed epoch-0 logits every epoch (a settled head under
      gradient noise).

    The three reference motions against which the ``noise`` rule's ``rho`` is calibrated (:func:`calibrate_rho`).
    """
    if kind not in DRIFT_KINDS:
        raise ValueError(f"kind must be one of {', '.join(DRIFT_KINDS)}, got {kind!r}")
    if images < 1 or epochs < 2 or not step > 0:
        raise ValueError(f"need images >= 1, epochs >= 2 and step > 0, got {images}, {epochs}, {step}")
    num_patches = grid[0] * grid[1]
    options = dict(generator=generator, dtype=torch.float64)
    base = spread * torch.randn(images, num_patches, **options)
    if kind == "directed":
        direction = spread * torch.randn(images, num_patches, **options) - base
        logits = base + step * torch.arange(epochs + 1, dtype=torch.float64)[:, None, None] * direction
    elif kind == "random_walk":
        steps = step * torch.randn(epochs, images, num_patches, **options)
        logits = torch.cat([base[None], base + steps.cumsum(0)])
    else:
        logits = base + step * torch.randn(epochs + 1, images, num_patches, **options)
    return logits.softmax(-1)


def directedness_series(distributions: torch.Tensor, cost: torch.Tensor, workers: int = 1) -> torch.Tensor:
    """The ``noise`` rule's directedness at every epoch ``t >= 2`` of a path of probe distributions, as the
    controller computes it (means over the probe images first). ``distributions: [T + 1, P, N] -> [T - 1]``."""
    one = attention_drift(distributions[:-1], distributions[1:], cost, workers).mean(-1)  # d(t-1, t), [T]
    two = attention_drift(distributions[:-2], distributions[2:], cost, workers).mean(-1)  # d(t-2, t), [T - 1]
    return directedness(two, one[:-1], one[1:])


RHO_CALIBRATION_STEPS: tuple[float, ...] = (0.03, 0.1, 0.3)


@functools.lru_cache(maxsize=16)
def calibrate_rho(
    grid: tuple[int, int],
    images: int,
    units: str = "image",
    quantile: float = 0.02,
    epochs: int = 30,
    steps: tuple[float, ...] = RHO_CALIBRATION_STEPS,
    seed: int = 0,
) -> float:
    """The ``noise`` rule's ``rho`` for a probe of ``images`` images on ``grid``: the ``quantile`` of a simulated
    random walk's directedness (:func:`simulate_attention_paths`, one walk of ``epochs`` epochs per step size in
    ``steps``), the smallest over the step sizes.

    The spec (ViTCAE, "Convergence") asks that a random walk converge in at most ~5% of epochs and directed motion
    never. Averaged over the probe's ``P`` images the directedness of a random walk is close to normal, centred
    near ``1 / sqrt 2`` with a spread that shrinks as ``1 / sqrt P``; so the quantile is taken from the walk's mean
    and standard deviation (``mean - z sd``), which a few dozen epochs estimate well, where an empirical 2% tail
    would need thousands. The default 2% leaves room for the estimate's own error: out of sample (new seeds and step
    sizes) the share stays under 5% (``tests/test_convergence_rule.py``). Directed motion (directedness about 1) and
    jitter around a settled pattern (about 0.5) lie on either side. Deterministic (``seed``) and cached.
    """
    if not 0 < quantile < 0.5:
        raise ValueError(f"quantile must be in (0, 0.5), got {quantile}")
    z = -torch.distributions.Normal(0.0, 1.0).icdf(torch.tensor(quantile)).item()
    cost = patch_grid_cost(grid[0], grid[1], units)
    generator = torch.Generator().manual_seed(seed)
    levels = []
    for step in steps:
        ratios = directedness_series(
            simulate_attention_paths("random_walk", grid, images, epochs, step, generator), cost
        )
        levels.append((ratios.mean() - z * ratios.std()).item())
    return float(min(levels))


@dataclass(frozen=True)
class AbsoluteRule:
    """The paper's rule: a head is below its threshold when its drift is below ``eps_d`` (the drift's units)."""

    needs_directedness: ClassVar[bool] = False

    def threshold(self, tracker: ConvergenceTracker) -> torch.Tensor:
        return torch.full((tracker.num_layers, tracker.num_heads), tracker.eps_d, dtype=torch.float64)

    def below(
        self, tracker: ConvergenceTracker, drift: torch.Tensor, directedness: torch.Tensor | None
    ) -> torch.Tensor:
        return drift < self.threshold(tracker)


@dataclass(frozen=True)
class RelativeRule(AbsoluteRule):
    """Scale-free: the threshold is ``rel_d`` times the head's peak drift so far."""

    def threshold(self, tracker: ConvergenceTracker) -> torch.Tensor:
        return tracker.rel_d * tracker.peak


@dataclass(frozen=True)
class NoiseRule:
    """The head's movement no longer accumulates: its directedness is below ``rho`` (no drift threshold: NaN)."""

    needs_directedness: ClassVar[bool] = True

    def threshold(self, tracker: ConvergenceTracker) -> torch.Tensor:
        return torch.full((tracker.num_layers, tracker.num_heads), math.nan, dtype=torch.float64)

    def below(
        self, tracker: ConvergenceTracker, drift: torch.Tensor, directedness: torch.Tensor | None
    ) -> torch.Tensor:
        return tracker._as_grid(directedness, "directedness") < tracker.rho


@dataclass(frozen=True)
class TauClause:
    """The paper's second clause, ``|tau_t - tau_{t-1}| < eps_tau`` (``own``), or none (``none``)."""

    required: bool

    def stable(
        self, below: torch.Tensor, tau: torch.Tensor, previous_tau: torch.Tensor, eps_tau: float
    ) -> torch.Tensor:
        return below & ((tau - previous_tau).abs() < eps_tau) if self.required else below


#: ``dynamics.convergence`` -> its rule; ``dynamics.tau_clause`` -> its clause
CONVERGENCE_STRATEGIES = {"absolute": AbsoluteRule(), "relative": RelativeRule(), "noise": NoiseRule()}
TAU_CLAUSE_STRATEGIES = {"own": TauClause(required=True), "none": TauClause(required=False)}


class ConvergenceTracker:
    """ViTCAE's convergence rule and scale-free variants. A head is *stable* in an epoch when its drift is below
    its threshold (and, with ``tau_clause="own"``, ``|tau_t - tau_{t-1}| < eps_tau``, the paper's second clause);
    after ``patience`` consecutive stable epochs it is converged and stays so (it is then frozen, eq. 26).

    ``tau_clause="none"`` judges the drift alone. The clause on tau cannot fail where tau is held at 1 (the
    uncontrolled arm), so with it the two arms of a comparison are judged by different rules; without it the
    decision is the same function of the same drift in both arms.

    - ``rule="absolute"`` (the paper): the threshold is ``eps_d``, in the units of the drift.
    - ``rule="relative"``: the threshold is ``rel_d`` times the largest drift this head has shown so far (its peak,
      from epoch 1 on, burn-in included; see :meth:`observe`). A ratio has no units, so the rule is the same on any
      patch grid; and multiplying a head's whole drift curve by a constant (what a different constant learning rate
      does to the per-epoch movement of a head that is still drifting) leaves its decisions unchanged.
    - ``rule="noise"``: the head's drift is at its noise floor, i.e. its movement no longer accumulates. With the
      two-epoch drift ``d(t-2, t)``, the *directedness* ``r_t = d(t-2, t) / (d(t-2, t-1) + d(t-1, t))`` is 1 for
      attention that keeps moving the same way, about ``1 / sqrt 2 = 0.71`` for a random walk and about 0.5 for
      jitter around a fixed pattern (three noisy copies of one pattern are equally far apart). Stable when
      ``r_t < rho``. A ratio of drifts, so free of the grid's units and of a constant learning rate's scale; the
      drift at a constant rate stays at the rate's noise level and falls only when the rate falls (docs/dynamics.md,
      "The convergence rule, units and the probe's tau"), which no threshold on ``d`` alone tells apart from movement.

    Call :meth:`update` once per epoch with that epoch's drift and temperature, both ``[L, H]``. The first call only
    records tau: without a previous tau its change is undefined, so no streak can start there.
    """

    def __init__(
        self,
        num_layers: int,
        num_heads: int,
        eps_d: float,
        eps_tau: float,
        patience: int,
        rule: str = "absolute",
        rel_d: float = 0.2,
        rho: float = 0.75,
        tau_clause: str = "own",
    ) -> None:
        if num_layers < 1 or num_heads < 1:
            raise ValueError(f"num_layers and num_heads must be >= 1, got {num_layers} and {num_heads}")
        if not eps_d > 0 or not eps_tau > 0:
            raise ValueError(f"eps_d and eps_tau must be > 0, got {eps_d} and {eps_tau}")
        if patience < 1:
            raise ValueError(f"patience must be >= 1 epoch, got {patience}")
        if rule not in CONVERGENCE_RULES:
            raise ValueError(f"rule must be one of {', '.join(CONVERGENCE_RULES)}, got {rule!r}")
        if not 0 < rel_d < 1:
            raise ValueError(f"rel_d must be in (0, 1), got {rel_d}")
        if not 0 < rho <= 1:
            raise ValueError(f"rho must be in (0, 1] (a directedness), got {rho}")
        if tau_clause not in TAU_CLAUSES:
            raise ValueError(f"tau_clause must be one of {', '.join(TAU_CLAUSES)}, got {tau_clause!r}")
        self.num_layers, self.num_heads = num_layers, num_heads
        self.eps_d, self.eps_tau, self.patience = eps_d, eps_tau, patience
        self.rule, self.rel_d, self.rho, self.tau_clause = rule, rel_d, rho, tau_clause
        self.streak = torch.zeros(num_layers, num_heads, dtype=torch.long)
        self.converged = torch.zeros(num_layers, num_heads, dtype=torch.bool)
        self.peak = torch.zeros(num_layers, num_heads, dtype=torch.float64)
        self.previous_tau: torch.Tensor | None = None

    def _as_grid(self, value: torch.Tensor, name: str) -> torch.Tensor:
        shape = (self.num_layers, self.num_heads)
        value = torch.as_tensor(value).detach().to("cpu", torch.float64)
        if value.shape != shape:
            raise ValueError(f"{name} must be [L, H] = {list(shape)}, got {list(value.shape)}")
        if not torch.isfinite(value).all():
            raise ValueError(f"{name} must be finite; a NaN here means the probe pass or the schedule diverged")
        return value

    def observe(self, drift: torch.Tensor) -> None:
        """Record a drift ``[L, H]`` for the peak only (the burn-in epochs, when nothing is decided)."""
        self.peak = torch.maximum(self.peak, self._as_grid(drift, "drift"))

    def threshold(self) -> torch.Tensor:
        """The drift below which each head counts as stable now, ``[L, H]`` float64 (``noise``: NaN, the rule tests
        the directedness)."""
        return CONVERGENCE_STRATEGIES[self.rule].threshold(self)

    def update(self, drift: torch.Tensor, tau: torch.Tensor, directedness: torch.Tensor | None = None) -> torch.Tensor:
        """Record one epoch. ``drift, tau: [L, H]``; ``directedness: [L, H]`` for ``rule="noise"`` (``None``: not
        known yet, nothing is stable). Returns ``converged: [L, H]`` bool (a copy)."""
        drift, tau = self._as_grid(drift, "drift"), self._as_grid(tau, "tau")
        self.observe(drift)
        rule = CONVERGENCE_STRATEGIES[self.rule]
        if self.previous_tau is None or (rule.needs_directedness and directedness is None):
            stable = torch.zeros(drift.shape, dtype=torch.bool)
        else:
            below = rule.below(self, drift, directedness)
            stable = TAU_CLAUSE_STRATEGIES[self.tau_clause].stable(below, tau, self.previous_tau, self.eps_tau)
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
            "rule": self.rule,
            "rel_d": self.rel_d,
            "rho": self.rho,
            "tau_clause": self.tau_clause,
            "streak": self.streak.clone(),
            "converged": self.converged.clone(),
            "peak": self.peak.clone(),
            "previous_tau": None if self.previous_tau is None else self.previous_tau.clone(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore from :meth:`state_dict`; the head grid must match this tracker's. A state saved before the
        relative rule existed has no peak and no rule: it keeps this tracker's rule and starts its peak at 0."""
        if (state["num_layers"], state["num_heads"]) != (self.num_layers, self.num_heads):
            raise ValueError(
                f"state is for a {state['num_layers']}x{state['num_heads']} head grid, "
                f"this tracker is {self.num_layers}x{self.num_heads}"
            )
        self.eps_d, self.eps_tau, self.patience = state["eps_d"], state["eps_tau"], state["patience"]
        self.rule, self.rel_d = state.get("rule", self.rule), state.get("rel_d", self.rel_d)
        self.rho = state.get("rho", self.rho)
        self.tau_clause = state.get("tau_clause", "own")  # a state saved before the option had the clause
        self.streak = state["streak"].clone().to("cpu", torch.long)
        self.converged = state["converged"].clone().to("cpu", torch.bool)
        peak = state.get("peak")
        self.peak = torch.zeros_like(self.peak) if peak is None else peak.clone().to("cpu", torch.float64)
        previous_tau = state["previous_tau"]
        self.previous_tau = None if previous_tau is None else previous_tau.clone().to("cpu", torch.float64)
