"""The ``dynamics`` section of a run config (the attention-dynamics controller, ``vitlab.dynamics``), plain data:
``vitlab.config.build_config`` checks it before anything imports torch."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from vitlab.config.model import has_temperature
from vitlab.errors import ConfigError

DRIFT_UNITS = ("image", "patch")
CONVERGENCE_RULES = ("decay", "noise", "relative", "absolute")
TAU_CLAUSES = ("none", "own")
MODES = ("schedule", "learn", "fixed")
PROBE_TAUS = ("model", "unit")
KAPPA_DTYPES = ("float64", "float32")
FREEZE_SCOPES = ("qkv", "pattern")
#: the modes that change tau, so need a temperature in every controlled module
TAU_MODES = ("schedule", "learn")
#: the remedy when they find none (here before torch, in ``DynamicsPolicy.check`` on the built model)
TEMPERATURE_FIX = "build the model with temperature=true (e.g. model.temperature=true) or use dynamics.mode=fixed"
#: the options that take one of a few names, and those names
_CHOICES = {
    "mode": MODES,
    "freeze_scope": FREEZE_SCOPES,
    "probe_tau": PROBE_TAUS,
    "drift_units": DRIFT_UNITS,
    "convergence": CONVERGENCE_RULES,
    "tau_clause": TAU_CLAUSES,
    "kappa_dtype": KAPPA_DTYPES,
}


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


@dataclass
class DynamicsConfig:
    """The ``dynamics`` section of a run config. Thresholds are in the units of the measurements: ``d`` in image
    sides by default (``drift_units``), tau dimensionless. ``docs/dynamics.md`` ("Configuration") gives the reasons
    and measurements behind each default.

    Attributes:
        mode: ``schedule`` (eq. 20 sets tau each epoch; tau also learns by gradient within the epoch), ``learn``
            (gradient only) or ``fixed`` (tau = 1 and kept out of training: the uncontrolled baseline).
        alpha: the ``alpha > 0`` of eq. 20, per unit of drift (4 per image side: the paper's ``alpha = 1`` per patch
            width on a 4x4 grid; with ``drift_units: patch`` the same strength on a grid of side ``g`` is ``4 / g``).
        drift_units: the ground cost of the drift: ``image``, the distance between patch centres in image sides (the
            same movement has the same drift on any grid), or ``patch``, in patch widths (the paper's grid).
        probe_size: validation images in the fixed probe batch.
        probe_seed: seed of the random subset of the validation set that forms the probe; ``None`` takes the first
            ``probe_size`` images in the validation loader's order.
        probe_batch_size: probe images per forward pass (bounds the memory of the materialised attention).
        probe_tau: the temperature of the probe pass whose drift drives eq. 20 and the decision: ``unit`` (tau = 1,
            so the drift follows the head's Q/K weights alone and both arms are measured alike) or ``model`` (each
            head's own tau, the paper's literal reading).
        log_model_tau: with ``probe_tau: unit`` in ``schedule``/``learn`` mode, also probe at each head's own tau
            and record that drift (``drift_model_tau``); it decides nothing and costs a probe pass and its transport.
        eps: consensus-cluster threshold: eigenvalues of modulus ``>= 1 - eps`` are counted.
        convergence: when a head is stable in an epoch (:class:`~vitlab.diagnostics.convergence.ConvergenceTracker`):
            ``decay`` (default): each of its last ``decay_window`` drifts is below ``decay_ratio`` times the median of
            its earlier drifts; ``noise``: its movement no longer accumulates (directedness below ``rho``);
            ``relative``: its drift is below ``rel_d`` times its peak drift so far; ``absolute``: below ``eps_d``
            (the paper's rule) ...
        rho: the directedness ``d(t-2, t) / (d(t-2, t-1) + d(t-1, t))`` below which the ``noise`` rule counts an
            epoch stable (1: moving one way; 0.71: a random walk; 0.5: jitter). ``auto``: calibrated for this run's
            grid and probe size (:func:`vitlab.diagnostics.convergence.calibrate_rho`); a number sets it ...
        rel_d: the fraction of the peak drift of the ``relative`` rule ...
        decay_ratio: the ``decay`` rule's fraction of the head's typical earlier drift (median) ...
        decay_window: ... that each of its last this many drifts must be below.
        eps_d: the threshold of the ``absolute`` rule, in ``drift_units`` ...
        tau_clause: ``none``: the decision reads the drift alone, the same function in both arms of a comparison;
            ``own``: also require ``|tau_t - tau_{t-1}| < eps_tau`` (the paper's second clause, which cannot fail
            where tau is fixed). The paper's rule is ``convergence: absolute, tau_clause: own``.
        eps_tau: ... with ``tau_clause: own``, its tau moved by less than ``eps_tau`` ...
        patience: ... for this many consecutive epochs; it is then converged.
        burn_in: epochs before the convergence test starts (no head converges before epoch ``burn_in + patience``):
            right after initialisation attention barely moves because nothing has been learned yet.
        freeze: freeze converged heads (eq. 26).
        freeze_scope: what freezing fixes: ``qkv`` (eq. 26 as printed: the head's rows of ``W_q``, ``W_k``, ``W_v``
            and its tau) or ``pattern`` (what the drift measured: ``W_q``, ``W_k`` and tau; ``W_v`` keeps training).
        target: module-name prefix of the controlled attention modules; ``""`` controls every shared ``Attention``.
            ``None``: the model's ``dynamics_target`` attribute if it has one, else the modules with a temperature
            if there are any (ViTCAE's encoder, not its decoder), else every module.
        kappa_images: probe images (the first ones) whose attention is eigen-decomposed for ``kappa`` (O(N^3) per
            head and image, where the drift is O(N^2)).
        kappa_every: count the clusters every this many epochs (and at epoch 0); between, a record repeats the last
            count and names its epoch in ``kappa_epoch``.
        kappa_dtype: ``float64`` or ``float32`` eigenvalues for ``kappa`` (a modulus within float32 rounding of
            ``1 - eps`` can count differently).
        probe_min: ``None``: every head's drift on all ``probe_size`` images every epoch, as the paper does. An
            integer: the adaptive probe: the probe pass and the drift run on the first ``probe_min`` images and are
            extended to all of them only for heads whose decision is uncertain (a drift, or under the noise rule a
            directedness, within ``probe_z`` standard errors of its threshold).
        probe_z: the standard errors of the adaptive probe (see ``probe_min``).
        drift_workers: threads that solve the drift's transport problems; ``None``: as many as torch uses
            (``torch.get_num_threads()``). The values do not depend on it.
    """

    mode: str = "schedule"
    alpha: float = 4.0
    drift_units: str = "image"
    probe_size: int = 256
    probe_seed: int | None = 0
    probe_batch_size: int = 32
    probe_tau: str = "unit"
    log_model_tau: bool = False
    eps: float = 0.1
    convergence: str = "decay"
    rho: float | str = "auto"
    tau_clause: str = "none"
    rel_d: float = 0.2
    decay_ratio: float = 0.5
    decay_window: int = 3
    eps_d: float = 0.0125
    eps_tau: float = 0.05
    patience: int = 3
    burn_in: int = 5
    freeze: bool = True
    freeze_scope: str = "qkv"
    target: str | None = None
    kappa_images: int = 32
    kappa_every: int = 1
    kappa_dtype: str = "float64"
    probe_min: int | None = None
    probe_z: float = 3.0
    drift_workers: int | None = None

    def __post_init__(self) -> None:
        problems = [
            *self._not_one_of("mode", "freeze_scope", "probe_tau", "drift_units", "convergence"),
            *self._rule_problems(),
            *self._probe_problems(),
        ]
        if not 0 < self.eps < 1:
            problems.append(f"dynamics.eps must be in (0, 1), got {self.eps}")
        if not (self.eps_d > 0 and self.eps_tau > 0):
            problems.append(f"dynamics.eps_d and dynamics.eps_tau must be > 0, got {self.eps_d} and {self.eps_tau}")
        if self.patience < 1:
            problems.append(f"dynamics.patience must be >= 1 epoch, got {self.patience}")
        if self.burn_in < 0:
            problems.append(f"dynamics.burn_in must be >= 0 epochs, got {self.burn_in}")
        if problems:
            raise ConfigError("; ".join(problems))

    def _not_one_of(self, *names: str) -> list[str]:
        """The named options whose value is not one of their :data:`_CHOICES`."""
        return [
            f"dynamics.{name} must be one of {', '.join(_CHOICES[name])}, got {getattr(self, name)!r}"
            for name in names
            if getattr(self, name) not in _CHOICES[name]
        ]

    def _rule_problems(self) -> list[str]:
        """What is wrong with the convergence rule's and the schedule's options."""
        problems = []
        if self.rho != "auto" and (not _is_number(self.rho) or not 0 < self.rho <= 1):
            problems.append(f"dynamics.rho must be 'auto' or a directedness in (0, 1], got {self.rho!r}")
        problems += self._not_one_of("tau_clause")
        if not _is_number(self.decay_ratio) or not 0 < self.decay_ratio < 1:
            problems.append(
                "dynamics.decay_ratio must be in (0, 1) (a fraction of the head's earlier drift), "
                f"got {self.decay_ratio!r}"
            )
        if isinstance(self.decay_window, bool) or not isinstance(self.decay_window, int) or self.decay_window < 1:
            problems.append(f"dynamics.decay_window must be an integer >= 1 (epochs), got {self.decay_window!r}")
        if not 0 < self.rel_d < 1:
            problems.append(f"dynamics.rel_d must be in (0, 1) (a fraction of the peak drift), got {self.rel_d}")
        if not self.alpha > 0:
            problems.append(f"dynamics.alpha must be > 0 (eq. 20), got {self.alpha}")
        return problems

    def _probe_problems(self) -> list[str]:
        """What is wrong with the probe's, the clusters' and the transport's options."""
        problems = []
        if self.probe_size < 1 or self.probe_batch_size < 1:
            problems.append("dynamics.probe_size and dynamics.probe_batch_size must be >= 1")
        if not 1 <= self.kappa_images <= self.probe_size:
            problems.append(
                f"dynamics.kappa_images must be in [1, probe_size={self.probe_size}], got {self.kappa_images}"
            )
        if self.kappa_every < 1:
            problems.append(f"dynamics.kappa_every must be >= 1 epoch, got {self.kappa_every}")
        problems += self._not_one_of("kappa_dtype")
        if self.probe_min is not None and not self.kappa_images <= self.probe_min <= self.probe_size:
            problems.append(
                f"dynamics.probe_min must be in [kappa_images={self.kappa_images}, probe_size={self.probe_size}] "
                f"or null (every image every epoch), got {self.probe_min}"
            )
        if not self.probe_z > 0:
            problems.append(f"dynamics.probe_z must be > 0 standard errors, got {self.probe_z}")
        if self.drift_workers is not None and self.drift_workers < 1:
            problems.append(
                f"dynamics.drift_workers must be >= 1 thread or null (as many as torch uses), got {self.drift_workers}"
            )
        return problems

    def check_model(self, model: dict[str, Any]) -> None:
        """Refuse, before torch is imported, a mode that changes tau for a model section whose attention has no
        temperature (:func:`vitlab.config.model.has_temperature`); a class that declares nothing is left to
        ``DynamicsPolicy.check`` on the built model."""
        if self.mode in TAU_MODES and has_temperature(model) is False:
            raise ConfigError(
                f"dynamics.mode={self.mode!r} needs a temperature in every controlled module, but model "
                f"{model['name']!r} is built without one; {TEMPERATURE_FIX}"
            )
