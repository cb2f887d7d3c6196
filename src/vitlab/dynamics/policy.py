"""The controller's policy (ViTCAE paper, eq. 20 and 26): measure the heads on the probe, schedule their
temperatures, track convergence under the configured rule, freeze the converged heads (its checkpoint state:
:mod:`vitlab.dynamics.policy_state`)."""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Self

import torch
from torch import nn

from vitlab.config import from_dict
from vitlab.config.dynamics import TAU_MODES, TEMPERATURE_FIX, DynamicsConfig
from vitlab.diagnostics.convergence import (
    CONVERGENCE_STRATEGIES,
    ConvergenceTracker,
    calibrate_rho,
    directedness,
    directedness_standard_error,
)
from vitlab.diagnostics.dynamics import (
    attention_drift,
    attention_to_cls_distribution,
    consensus_clusters,
    patch_grid_cost,
    score_drift,
    temperature_update,
)
from vitlab.diagnostics.trend import LagWindow
from vitlab.dynamics.freezing import FrozenHeadGuard, SteeredHeadGuard, guard_for
from vitlab.dynamics.layer_cache import CachedPrefix
from vitlab.dynamics.layer_freezing import LayerFreezer
from vitlab.dynamics.policy_state import PolicyState
from vitlab.dynamics.probe import (
    ObservedAttention,
    ProbeMeasurement,
    _model_attribute,
    captured_attention,
    modules_to_control,
    unit_temperature,
)
from vitlab.errors import ConfigError
from vitlab.layers.attention import Attention
from vitlab.layers.head_steering import SteeredHeads
from vitlab.models.contract import module_mode


class DynamicsPolicy(PolicyState):
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
        self._epoch_steps = self._cached_steps = 0
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
        cfg = self.config
        if example is not None:
            self.example = example[:1]
        named, grid = modules_to_control(model, cfg, self.example if self.probe is None else self.probe[:1])
        heads = {m.num_heads for _, m in named}
        if len(heads) != 1:
            raise ConfigError(
                f"the controlled attention modules have different head counts {sorted(heads)}; choose modules of "
                "one kind with dynamics.target"
            )
        has_temperature = [m.log_tau is not None for _, m in named]
        if cfg.mode in TAU_MODES and not all(has_temperature):
            raise ConfigError(
                f"dynamics.mode={cfg.mode!r} needs a temperature in every controlled module, but "
                f"{[n for (n, _), t in zip(named, has_temperature, strict=True) if not t]} have none; {TEMPERATURE_FIX}"
            )
        return named, grid

    def attach(self, model: nn.Module) -> None:
        """Resolve the controlled modules and the patch grid of ``model`` (:meth:`check`); in ``fixed`` mode set
        tau = 1 and take it out of training. Call before the optimizer is built (Lightning: the ``setup`` hook)."""
        cfg = self.config
        named, grid = self.check(model)
        self.model = model
        self.module_names = [n for n, _ in named]
        self.modules = [m for _, m in named]
        self.cost = patch_grid_cost(*grid, units=cfg.drift_units)
        self.grid = (int(grid[0]), int(grid[1]))
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

    @torch.no_grad()
    def measure(self, probe: torch.Tensor, kappa: bool = True, probe_tau: str | None = None) -> ProbeMeasurement:
        """Push ``probe: [P, C, H, W]`` through the attached model (eval mode, attention captured, at the temperature
        ``probe_tau`` says, default the config's) and measure the CLS-to-patch distributions and (with ``kappa``)
        the consensus clusters of every head."""
        model, cfg = self.model, self.config
        if model is None:
            raise RuntimeError("attach a model before measuring")
        device = next(model.parameters()).device
        forward = getattr(model, "forward_features", model)
        distributions, kappa_sum = [], torch.zeros(self.shape, dtype=torch.float64)
        kappa_images = min(cfg.kappa_images, len(probe)) if kappa else 0
        kappa_dtype = getattr(torch, cfg.kappa_dtype)
        probe_tau = cfg.probe_tau if probe_tau is None else probe_tau
        temperature = unit_temperature(self.modules) if probe_tau == "unit" else contextlib.nullcontext()
        with module_mode(model, training=False), temperature:
            for start in range(0, len(probe), cfg.probe_batch_size):
                images = probe[start : start + cfg.probe_batch_size].to(device)
                observed = not isinstance(self.modules[0], Attention)  # read by operation type, steered or not
                maps = captured_attention(model, forward, images, self.module_names, observed)
                chunk = []
                for layer, name in enumerate(self.module_names):
                    attn = self._checked_map(maps, name)  # [b, H, T, T]
                    chunk.append(attention_to_cls_distribution(attn, self.num_prefix_tokens).cpu())
                    if start < kappa_images:
                        clusters = self._timed(
                            "kappa", consensus_clusters, attn[: kappa_images - start], cfg.eps, dtype=kappa_dtype
                        )
                        kappa_sum[layer] += clusters.sum(0).cpu()
                distributions.append(torch.stack(chunk).transpose(1, 2))  # [L, H, b, N]
        return ProbeMeasurement(torch.cat(distributions, dim=2), kappa_sum / kappa_images if kappa else None)

    def _checked_map(self, maps: dict[str, torch.Tensor], name: str) -> torch.Tensor:
        if name not in maps:
            raise RuntimeError(
                f"{name} captured no attention in {type(self.model).__name__}.forward_features; "
                "choose modules on the encoder path with dynamics.target"
            )
        attn = maps[name].float()
        num_patches = self.cost.shape[0]
        if attn.shape[-1] != self.num_prefix_tokens + num_patches:
            raise ConfigError(
                f"{name} attends over {attn.shape[-1]} tokens, but the patch grid has {num_patches} patches and "
                f"{self.num_prefix_tokens} prefix token(s); control the encoder's attention (dynamics.target)"
            )
        return attn

    def temperatures(self) -> torch.Tensor:
        """Current ``tau: [L, H]`` float64 of the controlled heads (1 where a module has no temperature)."""
        return torch.stack(
            [
                torch.ones(m.num_heads, dtype=torch.float64) if m.tau is None else m.tau.detach().double().cpu()
                for m in self.modules
            ]
        )

    @torch.no_grad()
    def set_temperatures(self, tau: torch.Tensor, heads: torch.Tensor) -> None:
        """Write ``tau: [L, H]`` into the heads marked in ``heads: [L, H]`` bool, by original head (as ``log_tau``)."""
        for module, values, mask in zip(self.modules, tau, heads, strict=True):
            if mask.any():
                slots = module.head_slots[mask.cpu()].to(module.log_tau.device)  # parameters are in slot order
                module.log_tau[slots] = values[mask].log().to(module.log_tau)

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
        cfg = self.config
        if rho is None:  # rho plays no part in the other rules
            rho = self.resolved_rho(images) if self._reads_directedness else 0.75
        return ConvergenceTracker(
            *self.shape,
            cfg.eps_d,
            cfg.eps_tau,
            cfg.patience,
            rule=cfg.convergence,
            rel_d=cfg.rel_d,
            rho=rho,
            tau_clause=cfg.tau_clause,
            decay_ratio=cfg.decay_ratio,
            decay_window=cfg.decay_window,
            response_ratio=cfg.response_ratio,
            score_ratio=cfg.score_ratio,
            thaw=cfg.thaw,
            lag=cfg.lag,
            lag_ratio=cfg.lag_ratio,
        )

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
        current = measurement.distributions.float()
        drift = drift_images = two_epoch_mean = None
        lagged = None if self.lag_window is None else self.lag_window.push(current[:, :, : cfg.probe_min or None])
        if self.previous is not None:
            drift, drift_images, current, two_epoch_mean = self._drift(current, extend, deciding=epoch >= cfg.burn_in)
            # on the same images every epoch (the adaptive probe's first probe_min, else the whole probe)
            common = min(current.shape[2], self.previous.shape[2], cfg.probe_min or current.shape[2])
            score = score_drift(current[:, :, :common], self.previous[:, :, :common]).mean(dim=-1)
            self.tracker.observe(drift, rate, score, lagged)  # every epoch: the peak, the decay rules' history
            if cfg.mode == "schedule":
                fixed = self.frozen if self.layers is None else self.frozen | self.layers.frozen_heads(self.frozen)
                self.set_temperatures(temperature_update(drift, cfg.alpha), ~fixed)
        if extend is not None and current.shape[2] == cfg.probe_min and epoch in self._before_first_decision():
            current = torch.cat([current, extend().float()], dim=2)
        tau = self.temperatures()
        directed = self._directedness(current, drift, two_epoch_mean)
        converged = self._decide(epoch, drift, tau, directed)
        drift_model_tau = None if model_tau is None else self._model_tau_drift(model_tau)
        if self._reads_directedness:
            self.before_previous, self.last_drift = self.previous, drift
        self.previous, self.epoch = current, epoch
        record = self._record(epoch, drift, directed, tau, converged) | self._extra_record(drift_images)
        if model_tau is not None:
            record["drift_model_tau"] = None if drift_model_tau is None else drift_model_tau.tolist()
            record["mean_drift_model_tau"] = None if drift_model_tau is None else float(drift_model_tau.mean())
        return record

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

    def _model_tau_drift(self, model_tau: torch.Tensor) -> torch.Tensor | None:
        """The drift of the probe at the model's own tau (``log_model_tau``; recorded, decides nothing)."""
        model_tau = model_tau.float()
        drift = None
        if self.previous_model_tau is not None:
            common = min(model_tau.shape[2], self.previous_model_tau.shape[2])
            drift = self._transport(
                "drift_model_tau", model_tau[:, :, :common], self.previous_model_tau[:, :, :common]
            ).mean(dim=-1)
        self.previous_model_tau = model_tau
        return drift

    def _record(self, epoch, drift, directed, tau, converged) -> dict[str, Any]:
        """The epoch's ``dynamics.jsonl`` record (docs/dynamics.md, "dynamics.jsonl")."""
        cfg = self.config
        return {
            "epoch": epoch,
            "mode": cfg.mode,
            "modules": self.module_names,
            "drift_units": cfg.drift_units,
            "grid": None if self.grid is None else list(self.grid),
            "probe_tau": cfg.probe_tau,
            "convergence": cfg.convergence,
            "rho": self.tracker.rho if self._reads_directedness else None,
            "tau_clause": cfg.tau_clause,
            "freeze_scope": cfg.freeze_scope,
            "drift": None if drift is None else drift.tolist(),
            "directedness": None if directed is None else directed.tolist(),
            "threshold": None if cfg.convergence == "noise" else _nan_to_none(self.tracker.threshold()),
            # the decay rule's statistic: the largest of the head's last decay_window drifts (None: too few yet)
            "decay_level": _nan_to_none(self.tracker.decay_level()[0]) if cfg.convergence == "decay" else None,
            # the response rule's: the drift per unit rate of this epoch, and the largest of the last decay_window
            "rate": None if drift is None else float(self.tracker.rates[-1].mean()),
            "drift_per_rate": None if drift is None else self.tracker.per_rate()[-1].tolist(),
            "response_level": (
                _nan_to_none(self.tracker.decay_level(per_rate=True)[0]) if cfg.convergence == "response" else None
            ),
            # and its scores' (docs/dynamics.md, "The response rule"): this epoch's score drift per unit rate, the
            # largest of the last decay_window and the threshold it must be under
            "score_per_rate": None if drift is None else _nan_to_none(self.tracker.per_rate(scores=True)[-1]),
            **dict(zip(("score_level", "score_threshold"), self._score_level(), strict=True)),
            "kappa": self.kappa.tolist(),
            "tau": tau.tolist(),
            "converged": converged.tolist(),
            "frozen": self.frozen.tolist(),
            "non_converged": int((~converged).sum()),
            "mean_drift": None if drift is None else float(drift.mean()),
        }

    def _extra_record(self, drift_images: torch.Tensor | None) -> dict[str, Any]:
        """The keys of options that are not at their default: the clusters' epoch, the adaptive probe's images."""
        extra = {"kappa_epoch": self.kappa_epoch} if self.config.kappa_every > 1 else {}
        images = None if drift_images is None else drift_images.tolist()
        return extra | ({"drift_images": images} if self.config.probe_min is not None else {})

    def _score_level(self) -> tuple[list | None, list | None]:
        """The response rule's score level and threshold per head (None under the other rules)."""
        if self.config.convergence != "response":
            return None, None
        level, reference = self.tracker.decay_level(per_rate=True, scores=True)
        return _nan_to_none(level), _nan_to_none(self.tracker.score_ratio * reference)

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


def _nan_to_none(values: torch.Tensor) -> list[list[float | None]]:
    """``[L, H]`` as nested lists with ``None`` for NaN (JSON has no NaN)."""
    return [[None if math.isnan(v) else v for v in row] for row in values.tolist()]
