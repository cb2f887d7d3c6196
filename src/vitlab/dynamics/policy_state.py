"""The dynamics controller's checkpoint state (ViTCAE paper, eq. 20 and 26; docs/dynamics.md, "Resume and several
processes"): what rides in a Lightning checkpoint so that a resumed run continues the same schedule, decisions and
frozen heads. A mixin of :class:`vitlab.dynamics.policy.DynamicsPolicy`, whose attributes it reads and restores."""

from __future__ import annotations

import inspect
from typing import Any

from vitlab.diagnostics.convergence import ConvergenceTracker
from vitlab.errors import ConfigError

#: the options of :class:`ConvergenceTracker` a run's config sets (all but the head grid, which the model fixes)
TRACKER_SETTINGS = [
    name for name in inspect.signature(ConvergenceTracker).parameters if name not in ("num_layers", "num_heads")
]


class PolicyState:
    """``state_dict`` / ``load_state_dict`` of :class:`~vitlab.dynamics.policy.DynamicsPolicy`."""

    def state_dict(self) -> dict[str, Any]:
        """Plain python and CPU tensors (loads with ``torch.load(weights_only=True)``)."""
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
        if state["tracker"] is None:
            self.tracker = None
            return
        cfg = self.config
        # rho: auto keeps the value the run calibrated (the same grid and probe); a number set now wins
        saved_rho = state["tracker"].get("rho", 0.75)
        rho = saved_rho if cfg.rho == "auto" or not self._reads_directedness else float(cfg.rho)
        self.tracker = self._new_tracker(rho=rho)
        # This run's settings win over the checkpoint's, so a resume may change them: every option of the tracker's
        # constructor (its rule and thresholds) as this run's config built it; the saved history and streaks go on.
        built = self.tracker.state_dict()
        self.tracker.load_state_dict({**state["tracker"], **{key: built[key] for key in TRACKER_SETTINGS}})
        if self.frozen is not None and self.guard is not None:
            self.guard.freeze(self.frozen)
