"""Diagnostics of attention heads: ViTCAE's attention dynamics (drift, consensus clusters, eq. 20: ``dynamics``),
convergence (``convergence``), the probes (``probes``) and the segment maps (``segments``). The controller that
applies the dynamics during training is its own package, :mod:`vitlab.dynamics`."""
