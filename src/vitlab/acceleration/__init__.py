"""What makes a training step fast on its device, one subject a module (docs/benchmarks.md, "Compiled and fused"):

- :mod:`~vitlab.acceleration.compiling`: ``torch.compile`` of a network whole, with its loss, and block by block;
- :mod:`~vitlab.acceleration.compile_mode`: ``trainer.compile_mode: auto``, the mode timed fastest once per machine;
- :mod:`~vitlab.acceleration.precision`: ``trainer.precision: auto``, bf16 where the device computes it natively;
- :mod:`~vitlab.acceleration.optim`: AdamW, fused where the device has the kernel.
"""

# the one name still imported from the package (by vitlab.dynamics.layer_freezing); import from the modules
from vitlab.acceleration.compiling import compiled_blocks

__all__ = ["compiled_blocks"]
