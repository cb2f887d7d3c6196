"""Diagnostics of attention heads: ViTCAE's attention dynamics (drift, consensus clusters, eq. 20, convergence), the
probes and the segment maps. The controller that applies the dynamics during training is its own package,
:mod:`vitlab.dynamics`; its names are also given here, lazily, for code that imports them from this package."""

from typing import TYPE_CHECKING

from vitlab.diagnostics.convergence import ConvergenceTracker
from vitlab.diagnostics.dynamics import (
    attention_drift,
    attention_to_cls_distribution,
    consensus_clusters,
    patch_grid_cost,
    temperature_update,
)
from vitlab.diagnostics.probes import gradient_flow, init_distance, reversibility_table, slot_usage_summary
from vitlab.diagnostics.segments import draw_segment_maps, segment_map
from vitlab.lazy import lazy_exports

if TYPE_CHECKING:
    from vitlab.dynamics import DynamicsConfig, DynamicsController, FrozenHeadGuard, ProbeMeasurement

_CONTROLLER = ("DynamicsConfig", "DynamicsController", "FrozenHeadGuard", "ProbeMeasurement")
__getattr__, __dir__ = lazy_exports(__name__, dict.fromkeys(_CONTROLLER, "vitlab.dynamics"), globals())

__all__ = [
    "ConvergenceTracker",
    "DynamicsConfig",
    "DynamicsController",
    "FrozenHeadGuard",
    "ProbeMeasurement",
    "attention_drift",
    "attention_to_cls_distribution",
    "consensus_clusters",
    "draw_segment_maps",
    "gradient_flow",
    "init_distance",
    "patch_grid_cost",
    "reversibility_table",
    "segment_map",
    "slot_usage_summary",
    "temperature_update",
]
