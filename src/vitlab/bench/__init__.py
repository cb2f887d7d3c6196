"""The benchmark code of ``vitlab bench``: throughput, FLOPs, model FLOPs utilisation (MFU) and peak memory of a
network, side by side with timm.

:func:`bench` measures a registered preset's training step (forward, cross-entropy, backward, AdamW step) and its
inference (forward under ``torch.inference_mode``), optionally next to timm's network of the same shape
(``vs="timm"``, :func:`timm_counterpart`). :func:`measure_networks` is the engine, usable on any networks that take
images (``benchmarks/micro/feature_costs.py`` uses it for features switched off and on).

Every measurement alternates, round after round, between the networks and a large square matrix multiply in the
same process; ratios and MFU are formed per round and summarised by their median and quartiles
(:func:`quartile_summary`, :func:`bootstrap_median`; the fewest seconds of one call: :func:`fastest`). FLOPs per
image (:func:`training_flops_per_image`), MFU and peak memory (:func:`peak_memory`): docs/benchmarks.md, "What is
measured".

Modules: ``specs`` (what is measured), ``flops``, ``timing``, ``memory``, ``run`` (:func:`bench` and its report).
"""

from vitlab.acceleration.compile_mode import fastest
from vitlab.bench.flops import training_flops_per_image
from vitlab.bench.memory import peak_memory
from vitlab.bench.run import bench, format_bench
from vitlab.bench.specs import PHASES, NetworkSpec, timm_counterpart
from vitlab.bench.timing import (
    Runner,
    Subject,
    bootstrap_median,
    measure_networks,
    quartile_summary,
    round_ratio,
    torch_threads,
)

__all__ = [
    "PHASES",
    "NetworkSpec",
    "Runner",
    "Subject",
    "bench",
    "bootstrap_median",
    "fastest",
    "format_bench",
    "measure_networks",
    "peak_memory",
    "quartile_summary",
    "round_ratio",
    "timm_counterpart",
    "torch_threads",
    "training_flops_per_image",
]
