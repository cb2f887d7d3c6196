"""Micro-benchmarks: the time (or FLOPs, or memory) of one piece, measured on this machine."""
