"""ViTCAE's convergence decision: when a head's attention has settled enough to freeze it (eq. 26).

ViTCAE (Jebraeeli et al., arXiv 2509.16554), section "Convergence diagnostics": the paper's absolute rule, and the
scale-free rules of this project (``relative``, ``noise``, ``decay``, and ``response``, the default: drift per unit of
learning rate); the directedness of the noise rule (its ``rho`` calibrated in
:mod:`vitlab.diagnostics.rho_calibration`). Pure functions, the rules and one small stateful tracker that takes the
run's ``dynamics`` config.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from vitlab.config.dynamics import DynamicsConfig
from vitlab.diagnostics.trend import lag_series
from vitlab.jsonio import finite_or_none


def directedness(two_epoch: torch.Tensor, earlier: torch.Tensor, later: torch.Tensor) -> torch.Tensor:
    """``r = d(t-2, t) / (d(t-2, t-1) + d(t-1, t))`` (see :class:`ConvergenceTracker`, ``convergence="noise"``), in
    [0, 1] by the triangle inequality; 0 where the head did not move at all. All ``[...]`` drifts."""
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


@dataclass(frozen=True)
class AbsoluteRule:
    """The paper's rule: a head is below its threshold when its drift is below ``eps_d`` (the drift's units)."""

    needs_directedness: ClassVar[bool] = False

    def threshold(self, tracker: ConvergenceTracker) -> torch.Tensor:
        return torch.full((tracker.num_layers, tracker.num_heads), tracker.config.eps_d, dtype=torch.float64)

    def below(
        self, tracker: ConvergenceTracker, drift: torch.Tensor, directedness: torch.Tensor | None
    ) -> torch.Tensor:
        return drift < self.threshold(tracker)


@dataclass(frozen=True)
class RelativeRule(AbsoluteRule):
    """Scale-free: the threshold is ``rel_d`` times the head's peak drift so far."""

    def threshold(self, tracker: ConvergenceTracker) -> torch.Tensor:
        return tracker.config.rel_d * tracker.peak


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
        return tracker.config.decay_ratio * tracker.decay_level()[1]

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
        return tracker.config.response_ratio * tracker.decay_level(per_rate=True)[1]

    def below(
        self, tracker: ConvergenceTracker, drift: torch.Tensor, directedness: torch.Tensor | None
    ) -> torch.Tensor:
        level = tracker.decay_level(per_rate=True)[0]
        scores, reference = tracker.decay_level(per_rate=True, scores=True)
        # the scores (a softmax's logits) have slowed too; not judged where they were not measured
        scores_still = ~(scores.isfinite() & reference.isfinite()) | (scores < tracker.config.score_ratio * reference)
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

    - ``convergence="absolute"`` (the paper): the threshold is ``eps_d``, in the units of the drift.
    - ``convergence="relative"``: the threshold is ``rel_d`` times the largest drift this head has shown so far (its
      peak, from epoch 1 on, burn-in included; see :meth:`observe`).
    - ``convergence="noise"``: the movement no longer accumulates: the *directedness* ``r_t = d(t-2, t) / (d(t-2,
      t-1) + d(t-1, t))`` (1 for steady motion one way, about 0.71 for a random walk, 0.5 for jitter) is below ``rho``.
    - ``convergence="response"`` (the default): the head's attention no longer responds to its updates. Each drift is
      divided by the epoch's learning rate (``rate`` of :meth:`observe`: the mean over the epoch's steps), and the
      decay test below runs on those ratios with ``response_ratio``, and on the score drifts per unit rate with
      ``score_ratio`` where :meth:`observe` was given them (``score``); and the directedness (noise rule) is below
      ``rho``. A decaying learning rate, which shrinks a head's drift without any settling, freezes nothing.
    - ``convergence="decay"``: the head has *settled*. Of the drifts ``d_1 .. d_t`` (burn-in included) the
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

    def __init__(self, num_layers: int, num_heads: int, config: DynamicsConfig, *, rho: float | None = None) -> None:
        """``config``: the run's ``dynamics`` section, whose convergence options (``convergence``, ``tau_clause``,
        the thresholds, ``patience``, ``thaw``, ``lag``) it checked. ``rho``: the directedness threshold where
        ``config.rho`` is ``auto`` (:func:`~vitlab.diagnostics.rho_calibration.calibrate_rho`; needed by the rules
        that read the directedness)."""
        if num_layers < 1 or num_heads < 1:
            raise ValueError(f"num_layers and num_heads must be >= 1, got {num_layers} and {num_heads}")
        self.config, self.num_layers, self.num_heads = config, num_layers, num_heads
        self.rho = float(config.rho) if rho is None and config.rho != "auto" else rho
        if self.rho is None and CONVERGENCE_STRATEGIES[config.convergence].needs_directedness:
            raise ValueError(f"rule {config.convergence!r} reads the directedness: pass rho (calibrate_rho)")
        if self.rho is not None and not 0 < self.rho <= 1:
            raise ValueError(f"rho must be in (0, 1] (a directedness), got {self.rho}")
        empty = torch.zeros(0, num_layers, num_heads, dtype=torch.float64)
        self.history = empty  # every drift observed, [T, L, H]
        self.rates = empty  # the update's size, [T, L, H]
        self.scores = empty  # score drifts (NaN: none), [T, L, H]
        self.lagged = torch.zeros(0, 2, num_layers, num_heads, dtype=torch.float64)  # score MSDs, [T, 2, L, H]
        self.lag_seen = False  # whether observe was ever given them
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
        w = self.config.decay_window
        if len(series) < 2 * w:
            nan = torch.full((self.num_layers, self.num_heads), math.nan, dtype=torch.float64)
            return nan, nan
        return series[-w:].amax(0), series[:-w].quantile(0.5, dim=0)

    def lag_still(self) -> torch.Tensor:
        """The lag clause, ``[L, H]`` bool: in the last ``decay_window`` epochs the head moved over ``lag`` epochs by
        less than ``lag_ratio`` of its jitter, or its speed per unit rate fell below ``response_ratio`` of its median
        in the earlier epochs whose movement was above it. True without ``lag`` or any ``lagged`` (:meth:`observe`)."""
        w, grid = self.config.decay_window, (self.num_layers, self.num_heads)
        if self.config.lag == 0 or not self.lag_seen:
            return torch.ones(grid, dtype=torch.bool)
        ratio, speed = lag_series(self.lagged, self.rates, self.config.lag)
        quiet = (ratio[-w:] < self.config.lag_ratio).all(0) & (len(ratio) >= w)
        if len(ratio) < 2 * w:
            return quiet
        seen = torch.where(ratio[:-w] >= self.config.lag_ratio, speed[:-w], math.nan).nanquantile(0.5, dim=0)
        return quiet | (speed[-w:].amax(0) < self.config.response_ratio * seen)

    def threshold(self) -> torch.Tensor:
        """The drift below which each head counts as stable now, ``[L, H]`` float64 (``noise``: NaN, the rule tests
        the directedness)."""
        return CONVERGENCE_STRATEGIES[self.config.convergence].threshold(self)

    def update(self, drift: torch.Tensor, tau: torch.Tensor, directedness: torch.Tensor | None = None) -> torch.Tensor:
        """Record one epoch. ``drift, tau: [L, H]``; ``directedness: [L, H]`` for ``convergence="noise"`` (``None``: not
        known yet, nothing is stable). Returns ``converged: [L, H]`` bool (a copy)."""
        self.observe(drift)
        return self.decide(drift, tau, directedness)

    def decide(self, drift: torch.Tensor, tau: torch.Tensor, directedness: torch.Tensor | None = None) -> torch.Tensor:
        """:meth:`update` for a drift already passed to :meth:`observe`."""
        drift, tau = self._as_grid(drift, "drift"), self._as_grid(tau, "tau")
        rule = CONVERGENCE_STRATEGIES[self.config.convergence]
        if self.previous_tau is None or (rule.needs_directedness and directedness is None):
            stable = torch.zeros(drift.shape, dtype=torch.bool)
        else:
            below = rule.below(self, drift, directedness)
            stable = TAU_CLAUSE_STRATEGIES[self.config.tau_clause].stable(
                below, tau, self.previous_tau, self.config.eps_tau
            )
        self.streak = torch.where(stable, self.streak + 1, torch.zeros_like(self.streak))
        if self.config.thaw:  # moving again as much as before it settled: judged anew
            level, reference = self.decay_level(per_rate=True)
            moving = self.converged & (level >= reference)
            self.converged &= ~moving
            self.streak[moving] = 0
        self.converged |= self.streak >= self.config.patience
        self.previous_tau = tau
        return self.converged.clone()

    def statistics(self, observed: bool) -> dict[str, Any]:
        """The rule's numbers for the epoch's record (docs/dynamics.md, "dynamics.jsonl"), None where the rule does
        not use them, ``[L, H]`` lists with None for NaN (too few epochs yet). ``observed``: the epoch had a drift."""
        rule = self.config.convergence
        response = rule == "response"
        level, reference = self.decay_level(per_rate=True, scores=True) if response else (None, None)
        return {
            "rho": self.rho if CONVERGENCE_STRATEGIES[rule].needs_directedness else None,
            "threshold": None if rule == "noise" else finite_or_none(self.threshold().tolist()),
            # the decay rule's statistic: the largest of the head's last decay_window drifts
            "decay_level": finite_or_none(self.decay_level()[0].tolist()) if rule == "decay" else None,
            # the response rule's: the drift per unit rate of this epoch, and the largest of the last decay_window
            "rate": float(self.rates[-1].mean()) if observed else None,
            "drift_per_rate": self.per_rate()[-1].tolist() if observed else None,
            "response_level": finite_or_none(self.decay_level(per_rate=True)[0].tolist()) if response else None,
            # and its scores' (docs/dynamics.md, "The response rule"): this epoch's score drift per unit rate, the
            # largest of the last decay_window and the threshold it must be under
            "score_per_rate": finite_or_none(self.per_rate(scores=True)[-1].tolist()) if observed else None,
            "score_level": None if level is None else finite_or_none(level.tolist()),
            "score_threshold": None
            if reference is None
            else finite_or_none((self.config.score_ratio * reference).tolist()),
        }

    def state_dict(self) -> dict[str, Any]:
        """Plain python and CPU tensors, so the tracker can ride in a Lightning checkpoint: what it has seen and
        decided, and ``rho``, the threshold in use (calibrated where ``rho: auto``). The options are the config's."""
        return {
            "num_layers": self.num_layers,
            "num_heads": self.num_heads,
            "rho": self.rho,
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
        """Restore what :meth:`state_dict` saved but ``rho`` (given to the constructor); the head grid must match.
        The options stay this tracker's config's, so a resume may change them (a state saved with its options
        keeps only its history). A state saved before a statistic existed starts it now (rates at 1, no scores)."""
        if (state["num_layers"], state["num_heads"]) != (self.num_layers, self.num_heads):
            raise ValueError(
                f"state is for a {state['num_layers']}x{state['num_heads']} head grid, "
                f"this tracker is {self.num_layers}x{self.num_heads}"
            )
        history = state.get("history")  # a state saved before the decay rule: its history starts now
        self.history = self.history if history is None else history.clone().to("cpu", torch.float64)
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
        self.peak = self.peak if peak is None else peak.clone().to("cpu", torch.float64)
        previous_tau = state["previous_tau"]
        self.previous_tau = None if previous_tau is None else previous_tau.clone().to("cpu", torch.float64)


def _since_missing(series: torch.Tensor) -> torch.Tensor:
    """The epochs of ``series: [T, ...]`` after the last one with a NaN (a statistic measured again since)."""
    missing = series.isnan().flatten(1).any(dim=1).nonzero()
    return series if not len(missing) else series[int(missing[-1]) + 1 :]
