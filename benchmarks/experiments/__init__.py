"""Experiment drivers: scripts that train or evaluate runs, and the per-run results files they write."""
