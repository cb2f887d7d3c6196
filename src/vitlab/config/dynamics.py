"""The ``dynamics`` section of a run config (the attention-dynamics controller, ``vitlab.dynamics``), plain data:
``vitlab.config.build_config`` checks it before anything imports torch."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from vitlab.config.model import has_temperature
from vitlab.data.config import AugmentConfig, DataConfig
from vitlab.errors import ConfigError

DRIFT_UNITS = ("image", "patch")
CONVERGENCE_RULES = ("response", "decay", "noise", "relative", "absolute")
TAU_CLAUSES = ("none", "own")
MODES = ("schedule", "learn", "fixed")
PROBE_TAUS = ("model", "unit")
KAPPA_DTYPES = ("float64", "float32")
FREEZE_SCOPES = ("qkv", "pattern")
#: what ``dynamics.freeze`` takes: false, true (= heads, eq. 26), heads, or layers (a frozen prefix of the encoder)
FREEZE_MODES = (False, True, "heads", "layers")
#: what freezes the lowest trainable layer under ``freeze: layers`` (:mod:`vitlab.dynamics.layer_freezing`)
LAYER_SIGNALS = ("heads", "gradnorm", "schedule", "static")
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
    "freeze": FREEZE_MODES,
    "layer_signal": LAYER_SIGNALS,
}


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def random_augmentations(augment: AugmentConfig) -> list[str]:
    """The random training augmentations ``augment`` turns on (``data.augment.*`` names)."""
    names = ["random_crop", "hflip", "autoaugment", "random_erasing", "mixup_alpha", "cutmix_alpha"]
    return [f"data.augment.{n}" for n in names if getattr(augment, n)]


CACHE_REFUSAL = (
    "dynamics.cache_frozen reuses the frozen blocks' outputs, exact only when nothing random reaches them, but {} "
    "draw at random; turn them off or set dynamics.cache_frozen=false"
)


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


@dataclass
class DynamicsConfig:
    """The ``dynamics`` section of a run config: the controller of the ViTCAE paper's eq. 20 (tau from each head's
    drift) and eq. 26 (freezing converged heads). Thresholds are in the units of the measurements: ``d`` in image
    sides by default (``drift_units``), tau dimensionless. Every key, its default and its meaning: the table of
    docs/dynamics.md, "Configuration"; the reasons and measurements behind each default are on that page."""

    mode: str = "schedule"
    alpha: float = 4.0
    drift_units: str = "image"
    probe_size: int = 256
    probe_seed: int | None = 0
    probe_batch_size: int = 32
    probe_tau: str = "unit"
    log_model_tau: bool = False
    eps: float = 0.1
    convergence: str = "response"
    rho: float | str = "auto"
    tau_clause: str = "none"
    rel_d: float = 0.2
    decay_ratio: float = 0.5
    decay_window: int = 3
    response_ratio: float = 0.35
    score_ratio: float = 0.5
    lag: int = 0
    lag_ratio: float = 0.5
    thaw: bool = False
    eps_d: float = 0.0125
    eps_tau: float = 0.05
    patience: int = 3
    burn_in: int = 5
    freeze: bool | str = True
    freeze_scope: str = "qkv"
    layer_signal: str = "heads"
    freeze_layers: int | None = None
    freezeout_t0: float = 0.5
    gradnorm_rate: float = 0.1
    max_frozen_layers: int | None = None
    cache_frozen: bool = False
    cache_memory_mb: float = 1024.0
    target: str | None = None
    kappa_images: int = 32
    kappa_every: int = 1
    kappa_dtype: str = "float64"
    probe_min: int | None = None
    probe_z: float = 3.0
    drift_workers: int | None = None

    #: what ``vitlab fit --resume`` cannot change (it honours the rest, vitlab.training.resume): the options that
    #: shape the measurements the checkpoint holds (the previous attention maps ``[L, H, P, N]``, the drift history
    #: in its units, the cluster counts) or what the controller controls
    fixed_on_resume: ClassVar[tuple[str, ...]] = (
        "mode",
        "target",
        "freeze_scope",
        "drift_units",
        "probe_size",
        "probe_seed",
        "probe_tau",
        "probe_min",
        "probe_z",
        "log_model_tau",
        "kappa_images",
        "kappa_dtype",
    )

    def __post_init__(self) -> None:
        problems = [
            *self._not_one_of("mode", "freeze_scope", "probe_tau", "drift_units", "convergence"),
            *self._rule_problems(),
            *self._probe_problems(),
            *self._layer_problems(),
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
        """The named options whose value is not one of their :data:`_CHOICES` (``true`` is not ``1``)."""
        return [
            f"dynamics.{name} must be one of {', '.join(str(c).lower() for c in _CHOICES[name])}, "
            f"got {getattr(self, name)!r}"
            for name in names
            if not any(
                getattr(self, name) is c if isinstance(c, bool) else getattr(self, name) == c for c in _CHOICES[name]
            )
        ]

    @property
    def freezes_heads(self) -> bool:
        """Eq. 26: converged heads freeze (``freeze: true`` or ``heads``)."""
        return self.freeze is True or self.freeze == "heads"

    @property
    def freezes_layers(self) -> bool:
        """A prefix of the encoder freezes whole (``freeze: layers``, :mod:`vitlab.dynamics.layer_freezing`)."""
        return self.freeze == "layers"

    @property
    def measures(self) -> bool:
        """Whether the controller probes the attention: always, except when nothing reads it (``mode: fixed``,
        layers frozen by a signal other than the heads')."""
        return not (self.freezes_layers and self.layer_signal != "heads" and self.mode == "fixed")

    def _layer_problems(self) -> list[str]:
        """What is wrong with the layer-freezing options (``freeze: layers``)."""
        problems = self._not_one_of("freeze", "layer_signal")
        if problems:
            return problems
        layered = self.freezes_layers
        if not layered and (self.layer_signal != "heads" or self.freeze_layers is not None or self.cache_frozen):
            problems.append(
                "dynamics.layer_signal, freeze_layers and cache_frozen act under dynamics.freeze=layers; set it or "
                "leave them out"
            )
        if self.layer_signal == "static" and not _is_count(self.freeze_layers):
            problems.append(f"dynamics.layer_signal=static needs dynamics.freeze_layers >= 1, got {self.freeze_layers}")
        if self.layer_signal != "static" and self.freeze_layers is not None:
            problems.append("dynamics.freeze_layers is the static signal's count; set dynamics.layer_signal=static")
        if self.max_frozen_layers is not None and not _is_count(self.max_frozen_layers):
            problems.append(f"dynamics.max_frozen_layers must be >= 1 or null, got {self.max_frozen_layers!r}")
        if not _is_number(self.freezeout_t0) or not 0 < self.freezeout_t0 < 1:
            problems.append(
                f"dynamics.freezeout_t0 must be in (0, 1) (a fraction of training), got {self.freezeout_t0}"
            )
        if not _is_number(self.gradnorm_rate) or not self.gradnorm_rate > 0:
            problems.append(f"dynamics.gradnorm_rate must be > 0, got {self.gradnorm_rate!r}")
        if not _is_number(self.cache_memory_mb) or self.cache_memory_mb < 0:
            problems.append(f"dynamics.cache_memory_mb must be >= 0 (MiB), got {self.cache_memory_mb!r}")
        if layered and self.thaw and self.layer_signal != "heads":
            problems.append("dynamics.thaw releases on renewed drift, which only dynamics.layer_signal=heads measures")
        return problems

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
        if not _is_number(self.response_ratio) or not 0 < self.response_ratio < 1:
            problems.append(
                "dynamics.response_ratio must be in (0, 1) (a fraction of the head's earlier drift per unit rate), "
                f"got {self.response_ratio!r}"
            )
        if not _is_number(self.score_ratio) or not 0 < self.score_ratio < 1:
            problems.append(
                "dynamics.score_ratio must be in (0, 1) (a fraction of the head's earlier score drift per unit rate), "
                f"got {self.score_ratio!r}"
            )
        if isinstance(self.lag, bool) or not isinstance(self.lag, int) or self.lag == 1 or self.lag < 0:
            problems.append(f"dynamics.lag must be 0 (no lag clause) or an integer >= 2 (epochs), got {self.lag!r}")
        if not _is_number(self.lag_ratio) or not self.lag_ratio > 0:
            problems.append(
                "dynamics.lag_ratio must be > 0 (a head's movement over dynamics.lag epochs as a share of its "
                f"jitter), got {self.lag_ratio!r}"
            )
        if not isinstance(self.thaw, bool):
            problems.append(f"dynamics.thaw must be true or false, got {self.thaw!r}")
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

    def check_data(self, data: DataConfig) -> None:
        """Refuse, before the run folder exists, the cache of a frozen prefix that random augmentation reaches."""
        random = random_augmentations(data.augment)
        if self.cache_frozen and random:
            raise ConfigError(CACHE_REFUSAL.format(", ".join(random)))
