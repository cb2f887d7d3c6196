"""Diagnostics of attention heads: ViTCAE's attention dynamics (drift, consensus clusters, eq. 20, convergence)."""

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
    "attention_drift",
    "attention_to_cls_distribution",
    "consensus_clusters",
    "patch_grid_cost",
    "temperature_update",
]
