"""The controller's policy (ViTCAE paper, eq. 20 and 26): measure the heads on the probe, schedule their
temperatures, track convergence under the configured rule, freeze the converged heads, and the checkpoint state that
lets a resumed run go on with the same schedule, decisions and frozen heads (docs/dynamics.md, "Resume and several
processes")."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Self

import torch
from torch import nn

from vitlab.config import from_dict
from vitlab.config.dynamics import DynamicsConfig
from vitlab.diagnostics.convergence import (
    CONVERGENCE_STRATEGIES,
    ConvergenceTracker,
    directedness,
    directedness_standard_error,
)
from vitlab.diagnostics.dynamics import (
    attention_drift,
    patch_grid_cost,
    score_drift,
    temperature_update,
)
from vitlab.diagnostics.rho_calibration import calibrate_rho
from vitlab.diagnostics.trend import LagWindow
from vitlab.dynamics.freezing import FrozenHeadGuard, SteeredHeadGuard, guard_for
from vitlab.dynamics.layer_cache import CachedPrefix
from vitlab.dynamics.layer_freezing import LayerFreezer
from vitlab.dynamics.probe import (
    ObservedAttention,
    ProbeMeasurement,
    _model_attribute,
    head_temperatures,
    measure_heads,
    modules_to_control,
    set_head_temperatures,
)
from vitlab.errors import ConfigError
from vitlab.layers.attention import Attention
from vitlab.layers.head_steering import SteeredHeads


class DynamicsPolicy:
    """The controller's decisions, without Lightning: attach a model, :meth:`measure` a probe, :meth:`advance` one
    epoch (temperature schedule, convergence, freezing), and the checkpoint state. :class:`DynamicsController` is
    this policy as a Lightning callback."""

    def __init__(
        self, config: DynamicsConfig | None = None, run_dir: str | Path = ".", *, probe: torch.Tensor | None = None
    ) -> None:
        self.config = config or DynamicsConfig()
        self.run_dir = Path(run_dir)
        self.probe = probe
        self.model: nn.Module | None = None
        self.module_names: list[str] = []
        self.modules: list[Attention | SteeredHeads | ObservedAttention] = []
        self.guard: FrozenHeadGuard | SteeredHeadGuard | None = None  # None: attention only observed
        self.example: torch.Tensor | None = None  # an input for a model whose attention is found by running it
        self.cost: torch.Tensor | None = None
        self.grid: tuple[int, int] | None = None
        self.num_prefix_tokens = 1
        self.epoch: int | None = None  # the last epoch measured; 0 = before training
        self.tracker: ConvergenceTracker | None = None
        self.previous: torch.Tensor | None = None  # [L, H, P, N] float32 (P = probe_min when not extended)
        self.lag_window = LagWindow(self.config.lag) if self.config.lag else None  # not saved: refilled on resume
        self.previous_model_tau: torch.Tensor | None = None  # the same at the model's own tau (log_model_tau)
        # seconds of this epoch's parts (probe passes, kappa, each drift), written as the record's seconds_parts
        self.timings: dict[str, float] = {}
        self.before_previous: torch.Tensor | None = None  # [L, H, P, N] of epoch t-2 (convergence: noise)
        self.last_drift: torch.Tensor | None = None  # [L, H] float64, d(t-2, t-1)
        self.kappa: torch.Tensor | None = None  # [L, H] float64, the last count
        self.kappa_epoch: int | None = None  # the epoch it was counted at
        self.frozen: torch.Tensor | None = None  # [L, H] bool
        self.layers: LayerFreezer | None = None  # freeze: layers (the callback makes it)
        self._pending_state: dict[str, Any] | None = None
        self._epoch_started: float | None = None
        self._rate_sum, self._rate_steps = 0.0, 0  # the learning rates of this epoch's steps (the callback)
        self._epoch_steps = self._cached_steps = self._cached_val = 0
        self.cached: CachedPrefix | None = None  # cache_frozen (the callback makes it)

    @classmethod
    def from_config(cls, values: dict[str, Any] | DynamicsConfig | None, run_dir: str | Path) -> Self:
        """From the ``dynamics`` section of a run config (a dict; unknown keys are errors that name the key)."""
        if not isinstance(values, DynamicsConfig):
            values = from_dict(DynamicsConfig, values or {}, "dynamics")
        return cls(values, run_dir)

    @property
    def shape(self) -> tuple[int, int]:
        """``(L, H)``: controlled layers and heads per layer."""
        return len(self.modules), self.modules[0].num_heads

    # --- setting up -------------------------------------------------------------------------------------------------
    def check(
        self, model: nn.Module, example: torch.Tensor | None = None
    ) -> tuple[list[tuple[str, Attention | ObservedAttention]], Any]:
        """What :meth:`attach` needs of ``model``, checked without changing it (``vitlab fit`` calls this before
        the run folder exists): the controlled modules, one head count, a temperature where the mode needs one and
        the patch grid. Returns the named modules and the grid; a :class:`ConfigError` names what is missing.

        A model without vitlab's ``Attention`` (timm's EVA, HF's ViT...) has its attention found by running it on
        ``example: [1, C, H, W]`` (kept for :meth:`attach`), its heads steered by hooks where vitlab reaches them,
        else observed only (:func:`~vitlab.dynamics.probe.observed_modules`)."""
        if example is not None:
            self.example = example[:1]
        return modules_to_control(model, self.config, self.example if self.probe is None else self.probe[:1])

    def attach(self, model: nn.Module) -> None:
        """Resolve the controlled modules and the patch grid of ``model`` (:meth:`check`); in ``fixed`` mode set
        tau = 1 and take it out of training. Call before the optimizer is built (Lightning: the ``setup`` hook)."""
        cfg = self.config
        named, grid = self.check(model)
        self.model = model
        self.module_names, self.modules = [n for n, _ in named], [m for _, m in named]
        self.cost, self.grid = patch_grid_cost(*grid, units=cfg.drift_units), (int(grid[0]), int(grid[1]))
        prefix = _model_attribute(model, "num_prefix_tokens")
        self.num_prefix_tokens = 1 if prefix is None else prefix
        self.guard = guard_for(self.modules)
        if self.guard is not None:
            for module in self.guard.modules:
                module.train_frozen_values = cfg.freeze_scope == "pattern"
        if cfg.mode == "fixed":
            for module in self.modules:
                if module.log_tau is not None:
                    with torch.no_grad():
                        module.log_tau.zero_()
                    module.log_tau.requires_grad_(False)
        if self._pending_state is not None:
            self._load_pending_state()

    # --- checkpoint state (docs/dynamics.md, "Resume and several processes") ------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """What a resumed run needs to go on, as plain python and CPU tensors (``torch.load(weights_only=True)``)."""
        return {
            "epoch": self.epoch,
            "modules": list(self.module_names),
            "tracker": None if self.tracker is None else self.tracker.state_dict(),
            "previous": self.previous,
            "previous_model_tau": self.previous_model_tau,
            "before_previous": self.before_previous,
            "last_drift": self.last_drift,
            "frozen": self.frozen,
            "kappa": self.kappa,
            "kappa_epoch": self.kappa_epoch,
            "layers": None if self.layers is None else self.layers.state_dict(),
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore from :meth:`state_dict`; applied once a model is attached (at once if one already is)."""
        self._pending_state = state_dict
        if self.model is not None:
            self._load_pending_state()

    def _load_pending_state(self) -> None:
        """The saved state under this run's options: a resume may change those :class:`DynamicsConfig` does not fix
        (``fixed_on_resume``), the tracker's rule and thresholds among them."""
        state, self._pending_state = self._pending_state, None
        if state["modules"] != self.module_names:
            raise ConfigError(
                f"the checkpoint's dynamics state controls {state['modules']}, this run controls "
                f"{self.module_names}; resume with the same model and dynamics.target"
            )
        self.epoch, self.previous, self.frozen = state["epoch"], state["previous"], state["frozen"]
        self.kappa, self.kappa_epoch = state.get("kappa"), state.get("kappa_epoch")  # absent before kappa_every
        self.previous_model_tau = state.get("previous_model_tau")  # absent before log_model_tau
        self.before_previous, self.last_drift = state.get("before_previous"), state.get("last_drift")
        if self.layers is not None and state.get("layers") is not None:
            self.layers.load_state_dict(state["layers"])
        self.tracker = None
        if state["tracker"] is not None:
            # rho: auto keeps the value the run calibrated (the same grid and probe); a number set now wins
            saved_rho = state["tracker"].get("rho") or 0.75  # none saved: the rule read no directedness
            self.tracker = self._new_tracker(rho=saved_rho if self.config.rho == "auto" else None)
            self.tracker.load_state_dict(state["tracker"])
        if self.frozen is not None and self.guard is not None:
            self.guard.freeze(self.frozen)

    # --- one epoch of control ---------------------------------------------------------------------------------------
    def _timed(self, part: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """``fn(*args, **kwargs)``, its seconds added to ``self.timings[part]`` (the record's ``seconds_parts``)."""
        started = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            self.timings[part] = self.timings.get(part, 0.0) + time.perf_counter() - started

    def _transport(self, part: str, p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
        """:func:`attention_drift` of ``p`` against ``q`` on the grid's cost with ``drift_workers`` threads, timed as
        ``part``."""
        workers = self.config.drift_workers or torch.get_num_threads()
        return self._timed(part, attention_drift, p, q, self.cost, workers=workers)

    def measure(self, probe: torch.Tensor, kappa: bool = True, probe_tau: str | None = None) -> ProbeMeasurement:
        """:func:`~vitlab.dynamics.probe.measure_heads` of the attached model's controlled heads on ``probe``."""
        if self.model is None:
            raise RuntimeError("attach a model before measuring")
        named = list(zip(self.module_names, self.modules, strict=True))
        options = dict(kappa=kappa, probe_tau=probe_tau, timed=self._timed)
        return measure_heads(self.model, named, probe, self.config, self.num_prefix_tokens, **options)

    def temperatures(self) -> torch.Tensor:
        """Current ``tau: [L, H]`` float64 of the controlled heads (1 where a module has no temperature)."""
        return head_temperatures(self.modules)

    def resolved_rho(self, images: int | None = None) -> float:
        """``dynamics.rho``, with ``auto`` calibrated for this run's patch grid and probe image count
        (:func:`calibrate_rho`): the probe's size, or ``images`` where no probe batch is held (measurements passed
        to :meth:`advance` directly)."""
        cfg = self.config
        if cfg.rho != "auto":
            return float(cfg.rho)
        if self.grid is None:
            raise RuntimeError("attach a model before calibrating rho: the calibration needs its patch grid")
        count = len(self.probe) if self.probe is not None else images
        if count is None:
            raise RuntimeError("rho: auto needs the probe's image count")
        return calibrate_rho(self.grid, min(count, cfg.probe_size), cfg.drift_units)

    def _new_tracker(self, images: int | None = None, rho: float | None = None) -> ConvergenceTracker:
        """A tracker under this run's config; ``rho``: the calibrated one a checkpoint kept, else :meth:`resolved_rho`
        where the rule reads the directedness."""
        if rho is None and self._reads_directedness:
            rho = self.resolved_rho(images)
        return ConvergenceTracker(*self.shape, self.config, rho=rho)

    @property
    def _reads_directedness(self) -> bool:
        """Whether the convergence rule reads the noise rule's directedness (``noise``, ``response``)."""
        return CONVERGENCE_STRATEGIES[self.config.convergence].needs_directedness

    def wants_kappa(self, epoch: int) -> bool:
        """Whether epoch ``epoch``'s probe pass counts the clusters (``kappa_every``)."""
        return epoch % self.config.kappa_every == 0 or self.kappa is None

    def advance(
        self,
        measurement: ProbeMeasurement,
        epoch: int | None = None,
        extend: Callable[[], torch.Tensor] | None = None,
        model_tau: torch.Tensor | None = None,
        rate: float | None = None,
    ) -> dict[str, Any]:
        """Record one epoch: drift against the previous measurement, the temperature schedule (eq. 20), convergence
        and freezing (eq. 26). Returns the epoch's record (as written to ``dynamics.jsonl``).

        The drift ``d_t`` is measured with the weights and tau the epoch ended with; in ``schedule`` mode ``tau_{t+1}
        = 1 / (1 + alpha d_t)`` is written into the heads that are not frozen; from epoch ``burn_in`` on the tracker
        sees ``d_t`` and that new tau (:meth:`_decide`). The first call (epoch 0) has no drift.

        With the adaptive probe (``probe_min``) ``measurement`` holds the first ``probe_min`` probe images and
        ``extend()`` returns the others' distributions, ``[L, H, P - probe_min, N]``, for the heads whose decision is
        uncertain (:meth:`_drift`) and before the first decision. ``model_tau``: the same probe images at the model's
        own tau, ``[L, H, P', N]`` (``log_model_tau``); their drift is recorded and decides nothing. ``rate``: the
        epoch's mean learning rate, the unit of the response rule's drift (None: 1, a constant rate).
        """
        cfg = self.config
        num_layers, num_heads = self.shape
        if measurement.distributions.shape[:2] != (num_layers, num_heads):
            raise ValueError(f"the measurement is for a {list(measurement.distributions.shape[:2])} head grid")
        epoch = (0 if self.epoch is None else self.epoch + 1) if epoch is None else epoch
        if self.tracker is None:
            self.tracker = self._new_tracker(measurement.distributions.shape[2])
            self.frozen = torch.zeros(num_layers, num_heads, dtype=torch.bool)
        if measurement.kappa is not None:
            self.kappa, self.kappa_epoch = measurement.kappa, epoch
        current, drift, drift_images, two_epoch_mean = self._observe(measurement, epoch, extend, rate)
        if extend is not None and current.shape[2] == cfg.probe_min and epoch in self._before_first_decision():
            current = torch.cat([current, extend().float()], dim=2)
        tau = self.temperatures()
        directed = self._directedness(current, drift, two_epoch_mean)
        converged = self._decide(epoch, drift, tau, directed)
        if self._reads_directedness:
            self.before_previous, self.last_drift = self.previous, drift
        self.previous, self.epoch = current, epoch
        record = self._record(epoch, drift, directed, tau, converged, drift_images)
        return record if model_tau is None else record | self._model_tau_record(model_tau)

    def _observe(
        self, measurement: ProbeMeasurement, epoch: int, extend: Callable[[], torch.Tensor] | None, rate: float | None
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
        """The epoch's drift against the previous one (:meth:`_drift`), shown to the tracker with the score drift and
        the lag window, and in ``schedule`` mode eq. 20's tau written into the heads that are not frozen. Returns
        ``(current, drift, drift_images, two_epoch_mean)``, only ``current`` at the first epoch."""
        cfg, current = self.config, measurement.distributions.float()
        lagged = None if self.lag_window is None else self.lag_window.push(current[:, :, : cfg.probe_min or None])
        if self.previous is None:
            return current, None, None, None
        drift, drift_images, current, two_epoch_mean = self._drift(current, extend, deciding=epoch >= cfg.burn_in)
        # on the same images every epoch (the adaptive probe's first probe_min, else the whole probe)
        common = min(current.shape[2], self.previous.shape[2], cfg.probe_min or current.shape[2])
        score = score_drift(current[:, :, :common], self.previous[:, :, :common]).mean(dim=-1)
        self.tracker.observe(drift, rate, score, lagged)  # every epoch: the peak, the decay rules' history
        if cfg.mode == "schedule":
            fixed = self.frozen if self.layers is None else self.frozen | self.layers.frozen_heads(self.frozen)
            set_head_temperatures(self.modules, temperature_update(drift, cfg.alpha), ~fixed)
        return current, drift, drift_images, two_epoch_mean

    def _before_first_decision(self) -> set[int]:
        """The epochs whose probe pass takes the whole probe, so that the first decision can use it: the one before
        it and, under the noise rule (``d(t-2, t)``), the one before that too."""
        burn_in = self.config.burn_in
        return {max(burn_in - 1, 0)} | ({max(burn_in - 2, 0)} if self._reads_directedness else set())

    def _decide(self, epoch: int, drift: torch.Tensor | None, tau: torch.Tensor, directed: torch.Tensor | None):
        """Convergence from epoch ``burn_in`` on, and the heads that converge frozen with their tau (eq. 26);
        returns ``converged: [L, H]`` bool."""
        cfg = self.config
        if epoch >= cfg.burn_in:
            # The first tracker update only records tau (no previous tau, no streak): at epoch 0 its drift is a
            # placeholder.
            converged = self.tracker.decide(torch.zeros_like(tau) if drift is None else drift, tau, directed)
        else:
            converged = self.tracker.converged.clone()
        if (
            cfg.freezes_heads
            and not torch.equal(converged, self.frozen)
            and (cfg.thaw or (converged & ~self.frozen).any())
        ):
            self.frozen = converged.clone() if cfg.thaw else self.frozen | converged
            self.guard.freeze(self.frozen)  # freeze=true is refused where there is no guard
        return converged

    def _directedness(
        self, current: torch.Tensor, drift: torch.Tensor | None, two_epoch_mean: torch.Tensor | None
    ) -> torch.Tensor | None:
        """The noise rule's directedness ``d(t-2, t) / (d(t-2, t-1) + d(t-1, t))`` per head, once three epochs exist."""
        if drift is None or self.before_previous is None or self.last_drift is None:
            return None
        if two_epoch_mean is None:  # the adaptive probe measured it already, on each head's images
            common = min(current.shape[2], self.before_previous.shape[2])
            two_epoch_mean = self._transport(
                "drift_two_epoch", current[:, :, :common], self.before_previous[:, :, :common]
            ).mean(dim=-1)
        return directedness(two_epoch_mean, self.last_drift, drift)

    def _model_tau_record(self, model_tau: torch.Tensor) -> dict[str, Any]:
        """The drift of the probe at the model's own tau (``log_model_tau``; recorded, decides nothing)."""
        model_tau, drift = model_tau.float(), None
        if self.previous_model_tau is not None:
            common = min(model_tau.shape[2], self.previous_model_tau.shape[2])
            drift = self._transport(
                "drift_model_tau", model_tau[:, :, :common], self.previous_model_tau[:, :, :common]
            ).mean(dim=-1)
        self.previous_model_tau = model_tau
        return {
            "drift_model_tau": None if drift is None else drift.tolist(),
            "mean_drift_model_tau": None if drift is None else float(drift.mean()),
        }

    def _record(self, epoch, drift, directed, tau, converged, drift_images) -> dict[str, Any]:
        """The epoch's ``dynamics.jsonl`` record (docs/dynamics.md, "dynamics.jsonl"); the keys of options not at
        their default only under them: the clusters' epoch, the adaptive probe's images."""
        cfg = self.config
        extra = {"kappa_epoch": self.kappa_epoch} if cfg.kappa_every > 1 else {}
        if cfg.probe_min is not None:
            extra["drift_images"] = None if drift_images is None else drift_images.tolist()
        return {
            "epoch": epoch,
            "mode": cfg.mode,
            "modules": self.module_names,
            "drift_units": cfg.drift_units,
            "grid": None if self.grid is None else list(self.grid),
            "probe_tau": cfg.probe_tau,
            "convergence": cfg.convergence,
            "tau_clause": cfg.tau_clause,
            "freeze_scope": cfg.freeze_scope,
            "drift": None if drift is None else drift.tolist(),
            "directedness": None if directed is None else directed.tolist(),
            **self.tracker.statistics(observed=drift is not None),
            "kappa": self.kappa.tolist(),
            "tau": tau.tolist(),
            "converged": converged.tolist(),
            "frozen": self.frozen.tolist(),
            "non_converged": int((~converged).sum()),
            "mean_drift": None if drift is None else float(drift.mean()),
        } | extra

    def _drift(
        self, current: torch.Tensor, extend: Callable[[], torch.Tensor] | None, deciding: bool
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """``d: [L, H]`` float64 of ``current: [L, H, P, N]`` against ``self.previous``, the probe images each head
        averaged over ``[L, H]``, ``current`` (extended when the adaptive probe asked for the other images), and,
        with the adaptive probe under the noise rule, the two-epoch drift ``d(t-2, t)`` per head (else None: the
        caller measures it). ``deciding``: the convergence test runs this epoch (no extension during the burn-in,
        nothing is decided)."""
        cfg, previous = self.config, self.previous
        if cfg.probe_min is None:
            per_image = self._transport("drift", current, previous)  # [L, H, P]
            return per_image.mean(dim=-1), torch.full(per_image.shape[:2], per_image.shape[-1]), current, None
        base = min(cfg.probe_min, current.shape[2], previous.shape[2])
        per_image = self._transport("drift", current[:, :, :base], previous[:, :, :base])
        drift = per_image.mean(dim=-1)
        images = torch.full(drift.shape, base)
        two_epoch = two_epoch_mean = None
        if self._reads_directedness:
            if self.before_previous is None or self.last_drift is None:
                return drift, images, current, None
            # the decision is on the directedness: near rho within probe_z standard errors (delta method)
            base2 = min(base, self.before_previous.shape[2])
            two_epoch = self._transport("drift_two_epoch", current[:, :, :base2], self.before_previous[:, :, :base2])
            two_epoch_mean = two_epoch.mean(dim=-1)
            ratio = directedness(two_epoch_mean, self.last_drift, per_image[..., :base2].mean(dim=-1))
            error = directedness_standard_error(two_epoch, per_image[..., :base2], self.last_drift)
            uncertain = ((ratio - self.tracker.rho).abs() < cfg.probe_z * error) & ~self.frozen
        else:
            standard_error = per_image.std(dim=-1) / math.sqrt(base) if base > 1 else torch.zeros_like(drift)
            uncertain = ((drift - self.tracker.threshold()).abs() < cfg.probe_z * standard_error) & ~self.frozen
        if deciding and uncertain.any() and extend is not None:
            current = torch.cat([current, extend().float()], dim=2)
            extended = self._extended_mean("drift", per_image, current, previous, uncertain)
            if extended is not None:  # the previous epoch was extended too: these heads average over every image
                drift[uncertain], images[uncertain] = extended
            if two_epoch is not None:  # the same for d(t-2, t), over the images epoch t-2 measured
                extended = self._extended_mean("drift_two_epoch", two_epoch, current, self.before_previous, uncertain)
                if extended is not None:
                    two_epoch_mean[uncertain] = extended[0]
        return drift, images, current, two_epoch_mean

    def _extended_mean(
        self,
        part: str,
        per_image: torch.Tensor,
        current: torch.Tensor,
        reference: torch.Tensor,
        uncertain: torch.Tensor,
    ) -> tuple[torch.Tensor, int] | None:
        """For the ``uncertain: [L, H]`` heads, the mean drift between ``current`` and ``reference`` (``[L, H, P,
        N]``) over every image both have: ``per_image: [L, H, k]`` holds it on the first ``k``, the rest is measured
        now (timed as ``part``). Returns ``(means [U], images)``, or None when they share no more than ``k``."""
        start, common = per_image.shape[-1], min(current.shape[2], reference.shape[2])
        if common <= start:
            return None
        rest = self._transport(part, current[uncertain][:, start:common], reference[uncertain][:, start:common])
        return (per_image[uncertain].sum(-1) + rest.sum(-1)) / common, common
