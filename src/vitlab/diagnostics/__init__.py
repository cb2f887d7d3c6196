"""Diagnostics of attention heads: ViTCAE's attention dynamics (drift, consensus clusters, eq. 20, convergence), the
probes and the segment maps. The controller that applies the dynamics during training is its own package,
:mod:`vitlab.dynamics`."""

from vitlab.diagnostics.convergence import ConvergenceTracker
from vitlab.diagnostics.dynamics import (
    attention_drift,
    attention_to_cls_distribution,
    consensus_clusters,
    patch_grid_cost,
    temperature_update,
)
from vitlab.diagnostics.probes import gradient_flow, init_distance
from vitlab.diagnostics.segments import draw_segment_maps

__all__ = [
    "ConvergenceTracker",
    "attention_drift",
    "attention_to_cls_distribution",
    "consensus_clusters",
    "draw_segment_maps",
    "gradient_flow",
    "init_distance",
    "patch_grid_cost",
    "temperature_update",
]
