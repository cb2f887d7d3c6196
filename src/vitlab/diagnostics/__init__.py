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

__all__ = [
    "ConvergenceTracker",
    "DynamicsConfig",
    "DynamicsController",
    "FrozenHeadGuard",
    "ProbeMeasurement",
    "attention_drift",
    "attention_to_cls_distribution",
    "consensus_clusters",
    "patch_grid_cost",
    "temperature_update",
]
