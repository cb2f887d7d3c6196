"""The benchmark code of ``vitlab bench``: throughput, FLOPs, model FLOPs utilisation (MFU) and peak memory of a
network, side by side with timm. Each name is imported from its module:

- ``run``: :func:`~vitlab.bench.run.bench` measures a registered preset's training step (forward, cross-entropy,
  backward, AdamW step) and its inference (forward under ``torch.inference_mode``), optionally next to timm's network
  of the same shape (``vs="timm"``), and ``format_bench`` reports it;
- ``specs``: what is measured (``NetworkSpec``, ``timm_counterpart``);
- ``timing``: ``measure_networks``, the engine, usable on any networks that take images
  (``benchmarks/micro/feature_costs.py`` uses it for features switched off and on);
- ``flops``: ``training_flops_per_image``; ``memory``: ``peak_memory``.

Every measurement alternates, round after round, between the networks and a large square matrix multiply in the
same process; ratios and MFU are formed per round and summarised by their median and quartiles
(``timing.quartile_summary``, ``timing.bootstrap_median``; the fewest seconds of one call:
``vitlab.acceleration.compile_mode.fastest``). What is measured: docs/benchmarks.md, "What is measured".
"""
