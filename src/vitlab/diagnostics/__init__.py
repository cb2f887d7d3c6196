"""Diagnostics of attention heads: ViTCAE's attention dynamics (drift, consensus clusters, eq. 20, convergence) and
the controller that applies them during training (schedule, freezing, ``dynamics.jsonl``)."""

from vitlab.diagnostics.controller import DynamicsConfig, DynamicsController, FrozenHeadGuard, ProbeMeasurement
from vitlab.diagnostics.dynamics import (
    ConvergenceTracker,
    attention_drift,
    attention_to_cls_distribution,
    consensus_clusters,
    patch_grid_cost,
    temperature_update,
)
from vitlab.diagnostics.probes import gradient_flow, init_distance, reversibility_table, slot_usage_summary
from vitlab.diagnostics.segments import draw_segment_maps, segment_map

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
