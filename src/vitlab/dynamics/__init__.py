"""The attention-dynamics controller (ViTCAE paper, eq. 20 and 26): an intervention on any model built from the
shared ``Attention``: it schedules the heads' temperatures and freezes the converged ones.

By job: the ``dynamics`` config section (:mod:`vitlab.config.dynamics`), the probe (:mod:`.probe`), the policy
(:mod:`.policy`: measurement, schedule, convergence, checkpoint state), freezing (:mod:`.freezing`, and the
attention whose heads freeze, :mod:`.frozen_heads`) and the Lightning callback (:mod:`.callback`, which writes
``dynamics.jsonl``). The measurements themselves are pure
functions in :mod:`vitlab.diagnostics.dynamics`.
"""

from vitlab.config.dynamics import DynamicsConfig
from vitlab.dynamics.callback import DynamicsController
from vitlab.dynamics.freezing import FrozenHeadGuard
from vitlab.dynamics.frozen_heads import FrozenHeadAttention
from vitlab.dynamics.policy import DynamicsPolicy
from vitlab.dynamics.probe import ProbeMeasurement, controlled_modules, select_probe

__all__ = [
    "DynamicsConfig",
    "DynamicsController",
    "DynamicsPolicy",
    "FrozenHeadAttention",
    "FrozenHeadGuard",
    "ProbeMeasurement",
    "controlled_modules",
    "select_probe",
]
