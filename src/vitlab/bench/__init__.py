"""The benchmark code of ``vitlab bench``: throughput, FLOPs, model FLOPs utilisation (MFU) and peak memory of a
network, side by side with timm.

:func:`bench` measures a registered preset's training step (forward, cross-entropy, backward, AdamW step) and its
inference (forward under ``torch.inference_mode``), optionally next to timm's network of the same shape
(``vs="timm"``, :func:`timm_counterpart`). :func:`measure_networks` is the engine, usable on any networks that take
images (``benchmarks/micro/feature_costs.py`` uses it for features switched off and on).

Every measurement alternates, round after round, between the networks and a large square matrix multiply in the
same process, precision and thread count (the order reverses every other round). Load from other processes then
hits all of them alike; ratios and MFU are formed per round and summarised by their median and quartiles
(:func:`quartile_summary`, :func:`bootstrap_median`; the fewest seconds of one call: :func:`fastest`; the statistics
of runs over seeds are :func:`vitlab.evaluation.stats.summarize`).

Definitions (``docs/benchmarks.md``):

- FLOPs per image: the forward FLOPs that ``torch.utils.flop_counter.FlopCounterMode`` counts (matrix products,
  convolutions and attention; elementwise work is not counted), :func:`vitlab.models.sizing.flops_per_image`.
  Training FLOPs are 3x the forward FLOPs (the backward pass computes two matrix products per forward one: input
  and weight gradients); the counted backward-over-forward ratio is reported next to it as a check
  (:func:`training_flops_per_image`).
- MFU: achieved FLOP/s (FLOPs per image x images/s) over the FLOP/s of a ``matmul_size``-square matrix multiply
  measured in the same round, at the same precision (bf16 through autocast) and thread count.
- Peak memory of a training step: on CUDA, ``max_memory_allocated`` above the allocation before the network was
  built; on CPU, the growth of the peak resident set size of a fresh process (Linux: ``VmHWM`` after resetting it
  through ``/proc/self/clear_refs``; elsewhere ``getrusage`` ``ru_maxrss``) from before building the network to
  after two training steps (weights, gradients, AdamW state, activations and
  allocator overhead). A fresh process per network, because a process's peak RSS never goes down and the
  allocator keeps freed memory, so a second network measured in the same process would read the first one's peak.

Modules: ``specs`` (what is measured), ``flops``, ``timing``, ``memory``, ``run`` (:func:`bench` and its report).
"""

from vitlab.bench.flops import training_flops_per_image
from vitlab.bench.memory import peak_memory
from vitlab.bench.run import bench, format_bench
from vitlab.bench.specs import (
    CLOCKS,
    PHASES,
    PRECISIONS,
    TRAINING_FLOPS_PER_FORWARD,
    NetworkSpec,
    Precision,
    timm_counterpart,
)
from vitlab.bench.timing import (
    Runner,
    Subject,
    autocast,
    bootstrap_median,
    fastest,
    measure_networks,
    quartile_summary,
    round_ratio,
    torch_threads,
)

__all__ = [
    "CLOCKS",
    "PHASES",
    "PRECISIONS",
    "TRAINING_FLOPS_PER_FORWARD",
    "NetworkSpec",
    "Precision",
    "Runner",
    "Subject",
    "autocast",
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
