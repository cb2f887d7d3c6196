"""ViTCAE's convergence decision: when a head's attention has settled enough to freeze it (eq. 26).

ViTCAE (Jebraeeli et al., arXiv 2509.16554), section "Convergence diagnostics": the paper's absolute rule, and the
scale-free rules of this project (``relative``, ``noise``, ``decay``, and ``response``, the default: drift per unit of
learning rate); the directedness of the noise
rule and its calibration against simulated random walks. Pure functions and one small stateful tracker.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from vitlab.config.dynamics import CONVERGENCE_RULES, TAU_CLAUSES
from vitlab.diagnostics.dynamics import attention_drift, patch_grid_cost
from vitlab.diagnostics.trend import lag_series

DRIFT_KINDS = ("directed", "random_walk", "jitter")


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
    never. The quantile is ``mean - z sd`` of the walk's directedness (close to normal when averaged over the probe's
    images; docs/dynamics.md, "Calibrating rho on simulated drifts"). Deterministic (``seed``) and cached.
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
class DecayRule(AbsoluteRule):
    """The head has settled: its recent drift is below ``decay_ratio`` times its typical earlier drift."""

    def threshold(self, tracker: ConvergenceTracker) -> torch.Tensor:
        return tracker.decay_ratio * tracker.decay_level()[1]

    def below(
        self, tracker: ConvergenceTracker, drift: torch.Tensor, directedness: torch.Tensor | None
    ) -> torch.Tensor:
        return tracker.decay_level()[0] < self.threshold(tracker)  # False while NaN (too little history)


@dataclass(frozen=True)
class ResponseRule:
    """The head's attention no longer responds to its updates: its drift per unit of learning rate has fallen
    (the decay test on ``d_t / lr_t``, with ``response_ratio``), so has its score drift per unit rate (``score_ratio``)
    (:func:`~vitlab.diagnostics.dynamics.score_drift`, where measured: a saturating softmax whose logits keep walking
    is not settled), its movement no longer accumulates (the noise rule's directedness below ``rho``), nor over
    ``lag`` epochs (:meth:`ConvergenceTracker.lag_still`). A schedule that shrinks every step shrinks drift and rate
    together, so it settles no head by itself."""

    needs_directedness: ClassVar[bool] = True

    def threshold(self, tracker: ConvergenceTracker) -> torch.Tensor:
        return tracker.response_ratio * tracker.decay_level(per_rate=True)[1]

    def below(
        self, tracker: ConvergenceTracker, drift: torch.Tensor, directedness: torch.Tensor | None
    ) -> torch.Tensor:
        level = tracker.decay_level(per_rate=True)[0]
        scores, reference = tracker.decay_level(per_rate=True, scores=True)
        # the scores (a softmax's logits) have slowed too; not judged where they were not measured
        scores_still = ~(scores.isfinite() & reference.isfinite()) | (scores < tracker.score_ratio * reference)
        still = (level < self.threshold(tracker)) & scores_still & tracker.lag_still()
        return still & (tracker._as_grid(directedness, "directedness") < tracker.rho)


@dataclass(frozen=True)
class TauClause:
    """The paper's second clause, ``|tau_t - tau_{t-1}| < eps_tau`` (``own``), or none (``none``)."""

    required: bool

    def stable(
        self, below: torch.Tensor, tau: torch.Tensor, previous_tau: torch.Tensor, eps_tau: float
    ) -> torch.Tensor:
        return below & ((tau - previous_tau).abs() < eps_tau) if self.required else below


#: ``dynamics.convergence`` -> its rule; ``dynamics.tau_clause`` -> its clause
CONVERGENCE_STRATEGIES = {
    "response": ResponseRule(),
    "decay": DecayRule(),
    "absolute": AbsoluteRule(),
    "relative": RelativeRule(),
    "noise": NoiseRule(),
}
TAU_CLAUSE_STRATEGIES = {"own": TauClause(required=True), "none": TauClause(required=False)}


class ConvergenceTracker:
    """ViTCAE's convergence rule and scale-free variants. A head is *stable* in an epoch when its drift is below
    its threshold (and, with ``tau_clause="own"``, ``|tau_t - tau_{t-1}| < eps_tau``, the paper's second clause);
    after ``patience`` consecutive stable epochs it is converged and stays so (it is then frozen, eq. 26).

    ``tau_clause="none"`` judges the drift alone, so both arms of a comparison (tau held at 1 or not) are judged by
    the same function of the same drift. The rules (why each: docs/dynamics.md, "The convergence rule, units and the
    probe's tau"; null models: ``benchmarks/experiments/convergence_nulls.py``):

    - ``rule="absolute"`` (the paper): the threshold is ``eps_d``, in the units of the drift.
    - ``rule="relative"``: the threshold is ``rel_d`` times the largest drift this head has shown so far (its peak,
      from epoch 1 on, burn-in included; see :meth:`observe`).
    - ``rule="noise"``: the movement no longer accumulates: the *directedness* ``r_t = d(t-2, t) / (d(t-2, t-1) +
      d(t-1, t))`` (1 for steady motion one way, about 0.71 for a random walk, 0.5 for jitter) is below ``rho``.
    - ``rule="response"`` (the default): the head's attention no longer responds to its updates. Each drift is
      divided by the epoch's learning rate (``rate`` of :meth:`observe`: the mean over the epoch's steps), and the
      decay test below runs on those ratios with ``response_ratio``, and on the score drifts per unit rate with
      ``score_ratio`` where :meth:`observe` was given them (``score``); and the directedness (noise rule) is below
      ``rho``. A decaying learning rate, which shrinks a head's drift without any settling, freezes nothing.
    - ``rule="decay"``: the head has *settled*. Of the drifts ``d_1 .. d_t`` (burn-in included) the
      level is the largest of the last ``window`` and the reference the median of all before them; stable when
      ``level < decay_ratio * reference``. A head that keeps moving by a constant step (directed, random walk or
      jitter) is not frozen; one whose movement dies away is.

    The relative, noise, decay and response rules are ratios, free of the grid's units and of a constant learning
    rate's scale; only the response rule is free of a changing one. With ``thaw=True`` a converged head whose recent
    drift per unit rate (the largest of the last ``decay_window``) is back at its reference (it moves as much as it
    did before it settled), under any rule, is no longer converged and its streak starts again (docs/dynamics.md,
    "Thawing").

    Call :meth:`update` once per epoch with that epoch's drift and temperature, both ``[L, H]`` (or :meth:`observe`
    every epoch, burn-in included, and :meth:`decide` from the first deciding epoch on). The first decision only
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
        decay_ratio: float = 0.5,
        decay_window: int = 3,
        response_ratio: float = 0.35,
        score_ratio: float = 0.5,
        thaw: bool = False,
        lag: int = 0,
        lag_ratio: float = 1.0,
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
        if not 0 < decay_ratio < 1 or decay_window < 1:
            raise ValueError(f"need 0 < decay_ratio < 1 and decay_window >= 1, got {decay_ratio} and {decay_window}")
        if not 0 < response_ratio < 1 or not 0 < score_ratio < 1:
            raise ValueError(f"response_ratio and score_ratio must be in (0, 1), got {response_ratio}, {score_ratio}")
        if lag == 1 or lag < 0 or not lag_ratio > 0:
            raise ValueError(f"need lag 0 (no lag clause) or >= 2 epochs and lag_ratio > 0, got {lag} and {lag_ratio}")
        self.lag, self.lag_ratio = lag, lag_ratio
        self.lagged = torch.zeros(0, 2, num_layers, num_heads, dtype=torch.float64)  # score MSDs, [T, 2, L, H]
        self.lag_seen = False  # whether observe was ever given them
        self.decay_ratio, self.decay_window = decay_ratio, decay_window
        self.response_ratio, self.score_ratio, self.thaw = response_ratio, score_ratio, thaw
        self.history = torch.zeros(0, num_layers, num_heads, dtype=torch.float64)  # every drift observed, [T, L, H]
        self.rates = torch.zeros(0, num_layers, num_heads, dtype=torch.float64)  # the update's size, [T, L, H]
        self.scores = torch.zeros(0, num_layers, num_heads, dtype=torch.float64)  # score drifts (NaN: none), [T, L, H]
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

    def observe(
        self,
        drift: torch.Tensor,
        rate: float | torch.Tensor | None = None,
        score: torch.Tensor | None = None,
        lagged: torch.Tensor | None = None,
    ) -> None:
        """Record an epoch's drift ``[L, H]`` (the relative rule's peak, the decay and response rules' history),
        every epoch, the burn-in epochs too, when nothing is decided. ``rate``: the size of the update that
        produced it, a number or ``[L, H]`` (the epoch's mean learning rate; None: 1, a constant rate). ``score``:
        the epoch's score drift ``[L, H]`` (:func:`~vitlab.diagnostics.dynamics.score_drift`; None: not measured,
        the response rule then judges the drift alone until ``2 x decay_window`` epochs have one again). ``lagged``:
        the score MSDs ``[2, L, H]`` over one and over ``lag`` epochs (:class:`~vitlab.diagnostics.trend.LagWindow`,
        NaN where too few epochs exist; None: not measured)."""
        drift = self._as_grid(drift, "drift")
        score = torch.full_like(drift, math.nan) if score is None else self._as_grid(score, "score")
        rate = torch.ones_like(drift) if rate is None else torch.as_tensor(rate, dtype=torch.float64).expand_as(drift)
        rate = self._as_grid(rate, "rate")
        if not (rate > 0).all():
            raise ValueError("rate must be > 0: a head's drift per unit of update needs an update")
        self.peak = torch.maximum(self.peak, drift)
        self.history = torch.cat([self.history, drift[None]])
        self.rates = torch.cat([self.rates, rate[None]])
        self.scores = torch.cat([self.scores, score[None]])
        nan = torch.full((2, *drift.shape), math.nan, dtype=torch.float64)
        self.lagged = torch.cat([self.lagged, (nan if lagged is None else lagged.detach().cpu().double())[None]])
        self.lag_seen |= lagged is not None

    def per_rate(self, scores: bool = False) -> torch.Tensor:
        """Every drift observed (``scores``: every score drift, NaN where none was) divided by its rate, ``[T, L, H]``
        float64 (the response rule's statistics)."""
        return (self.scores if scores else self.history) / self.rates

    def decay_level(self, per_rate: bool = False, scores: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """The decay rule's ``(level, reference)``, each ``[L, H]`` float64: the largest of the last ``decay_window``
        drifts and the median of those before them (NaN until there are ``decay_window`` before them).
        ``per_rate``: of the drifts per unit rate (:meth:`per_rate`, the response rule); with ``scores``, of the
        score drifts per unit rate of the epochs since they were last missing (a run resumed from a state saved
        before the score clause judges them once it has ``2 x decay_window`` of them)."""
        series = self.per_rate(scores) if per_rate else self.history
        return self._decay(_since_missing(series) if scores else series)

    def _decay(self, series: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The decay test's ``(level, reference)`` of ``series: [T, L, H]`` (NaN while ``T < 2 x decay_window``)."""
        w = self.decay_window
        if len(series) < 2 * w:
            nan = torch.full((self.num_layers, self.num_heads), math.nan, dtype=torch.float64)
            return nan, nan
        return series[-w:].amax(0), series[:-w].quantile(0.5, dim=0)

    def lag_still(self) -> torch.Tensor:
        """The lag clause, ``[L, H]`` bool: in the last ``decay_window`` epochs the head moved over ``lag`` epochs by
        less than ``lag_ratio`` of its jitter, or its speed per unit rate fell below ``response_ratio`` of its median
        in the earlier epochs whose movement was above it. True without ``lag`` or any ``lagged`` (:meth:`observe`)."""
        w, grid = self.decay_window, (self.num_layers, self.num_heads)
        if self.lag == 0 or not self.lag_seen:
            return torch.ones(grid, dtype=torch.bool)
        ratio, speed = lag_series(self.lagged, self.rates, self.lag)
        quiet = (ratio[-w:] < self.lag_ratio).all(0) & (len(ratio) >= w)
        if len(ratio) < 2 * w:
            return quiet
        seen = torch.where(ratio[:-w] >= self.lag_ratio, speed[:-w], math.nan).nanquantile(0.5, dim=0)
        return quiet | (speed[-w:].amax(0) < self.response_ratio * seen)

    def threshold(self) -> torch.Tensor:
        """The drift below which each head counts as stable now, ``[L, H]`` float64 (``noise``: NaN, the rule tests
        the directedness)."""
        return CONVERGENCE_STRATEGIES[self.rule].threshold(self)

    def update(self, drift: torch.Tensor, tau: torch.Tensor, directedness: torch.Tensor | None = None) -> torch.Tensor:
        """Record one epoch. ``drift, tau: [L, H]``; ``directedness: [L, H]`` for ``rule="noise"`` (``None``: not
        known yet, nothing is stable). Returns ``converged: [L, H]`` bool (a copy)."""
        self.observe(drift)
        return self.decide(drift, tau, directedness)

    def decide(self, drift: torch.Tensor, tau: torch.Tensor, directedness: torch.Tensor | None = None) -> torch.Tensor:
        """:meth:`update` for a drift already passed to :meth:`observe`."""
        drift, tau = self._as_grid(drift, "drift"), self._as_grid(tau, "tau")
        rule = CONVERGENCE_STRATEGIES[self.rule]
        if self.previous_tau is None or (rule.needs_directedness and directedness is None):
            stable = torch.zeros(drift.shape, dtype=torch.bool)
        else:
            below = rule.below(self, drift, directedness)
            stable = TAU_CLAUSE_STRATEGIES[self.tau_clause].stable(below, tau, self.previous_tau, self.eps_tau)
        self.streak = torch.where(stable, self.streak + 1, torch.zeros_like(self.streak))
        if self.thaw:  # moving again as much as before it settled: judged anew
            level, reference = self.decay_level(per_rate=True)
            moving = self.converged & (level >= reference)
            self.converged &= ~moving
            self.streak[moving] = 0
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
            "decay_ratio": self.decay_ratio,
            "decay_window": self.decay_window,
            "response_ratio": self.response_ratio,
            "score_ratio": self.score_ratio,
            "thaw": self.thaw,
            "lag": self.lag,
            "lag_ratio": self.lag_ratio,
            "lagged": self.lagged.clone(),
            "lag_seen": self.lag_seen,
            "history": self.history.clone(),
            "rates": self.rates.clone(),
            "scores": self.scores.clone(),
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
        self.decay_ratio = state.get("decay_ratio", self.decay_ratio)
        self.decay_window = state.get("decay_window", self.decay_window)
        history = state.get("history")  # a state saved before the decay rule: its history starts now
        self.history = torch.zeros_like(self.history) if history is None else history.clone().to("cpu", torch.float64)
        self.response_ratio, self.thaw = state.get("response_ratio", self.response_ratio), state.get("thaw", self.thaw)
        self.score_ratio = state.get("score_ratio", self.score_ratio)
        self.lag, self.lag_ratio = state.get("lag", self.lag), state.get("lag_ratio", self.lag_ratio)
        self.lagged = state.get("lagged", torch.full((len(self.history), 2, *self.peak.shape), math.nan))
        self.lagged, self.lag_seen = self.lagged.to("cpu", torch.float64), state.get("lag_seen", False)  # none: new
        rates = state.get("rates")  # a state saved before the response rule: every earlier epoch at rate 1
        self.rates = torch.ones_like(self.history) if rates is None else rates.clone().to("cpu", torch.float64)
        scores = state.get("scores")  # saved before the score clause: judged from the epochs measured from now on
        self.scores = (
            torch.full_like(self.history, math.nan) if scores is None else scores.clone().to("cpu", torch.float64)
        )
        self.streak = state["streak"].clone().to("cpu", torch.long)
        self.converged = state["converged"].clone().to("cpu", torch.bool)
        peak = state.get("peak")
        self.peak = torch.zeros_like(self.peak) if peak is None else peak.clone().to("cpu", torch.float64)
        previous_tau = state["previous_tau"]
        self.previous_tau = None if previous_tau is None else previous_tau.clone().to("cpu", torch.float64)


def _since_missing(series: torch.Tensor) -> torch.Tensor:
    """The epochs of ``series: [T, ...]`` after the last one with a NaN (a statistic measured again since)."""
    missing = series.isnan().flatten(1).any(dim=1).nonzero()
    return series if not len(missing) else series[int(missing[-1]) + 1 :]
