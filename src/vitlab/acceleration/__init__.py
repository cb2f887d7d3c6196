"""What makes a training step fast on its device, one subject a module (docs/benchmarks.md, "Compiled and fused"):

- :mod:`~vitlab.acceleration.compiling`: ``torch.compile`` of a network whole, with its loss, and block by block;
- :mod:`~vitlab.acceleration.compile_mode`: ``trainer.compile_mode: auto``, the mode timed fastest once per machine;
- :mod:`~vitlab.acceleration.precision`: ``trainer.precision: auto``, bf16 where the device computes it natively;
- :mod:`~vitlab.acceleration.optim`: AdamW, fused where the device has the kernel.
"""

from vitlab.acceleration.compile_mode import (
    CUDA_MODE_CANDIDATES,
    CompileChoice,
    choose_compile_mode,
    fastest,
    time_compile_modes,
    timed_compile_mode,
)
from vitlab.acceleration.compiling import (
    COMPILE_MODES,
    check_compile_mode,
    classifier_objective,
    compile_network,
    compiled_blocks,
    compiled_objective,
    is_compiled,
)
from vitlab.acceleration.optim import adamw, adamw_implementation
from vitlab.acceleration.precision import (
    BF16_MIN_SPEEDUP,
    CPU_BF16_FLAGS,
    PrecisionChoice,
    bf16_matmul_speedup,
    choose_precision,
    cpu_bf16_flags,
)

__all__ = [
    "BF16_MIN_SPEEDUP",
    "COMPILE_MODES",
    "CPU_BF16_FLAGS",
    "CUDA_MODE_CANDIDATES",
    "CompileChoice",
    "PrecisionChoice",
    "adamw",
    "adamw_implementation",
    "bf16_matmul_speedup",
    "check_compile_mode",
    "choose_compile_mode",
    "choose_precision",
    "classifier_objective",
    "compile_network",
    "compiled_blocks",
    "compiled_objective",
    "cpu_bf16_flags",
    "fastest",
    "is_compiled",
    "time_compile_modes",
    "timed_compile_mode",
]
