"""``trainer.precision: auto``: ``bf16-mixed`` on a CUDA device that reports bf16, on a CPU with AMX (``amx_bf16``),
and on one with ``avx512_bf16`` alone where :func:`bf16_matmul_speedup` reaches :data:`BF16_MIN_SPEEDUP`;
``32-true`` elsewhere (docs/benchmarks.md, "bf16-mixed against fp32 on an Intel Xeon without AMX"). The flags come
from ``/proc/cpuinfo`` or torch's own CPU probe. An explicit precision is used as given."""

from __future__ import annotations

import functools
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from vitlab.acceleration.compile_mode import choice_line
from vitlab.layers.attention_path import cpu_clock
from vitlab.machine_cache import remembered

#: CPU flags (``/proc/cpuinfo``) under which bf16 matrix products run natively, in order of preference
CPU_BF16_FLAGS: tuple[str, ...] = ("amx_bf16", "avx512_bf16")


@dataclass(frozen=True)
class PrecisionChoice:
    """The precision a run uses: ``requested`` (``auto`` or explicit), ``precision`` (Lightning's name) and why."""

    requested: str
    precision: str
    reason: str

    def line(self) -> str:
        """The one line a run prints first, e.g. ``precision bf16-mixed (auto: CPU has avx512_bf16)``."""
        return choice_line("precision", self.precision, self.requested, self.reason)

    def record(self) -> dict[str, str]:
        return asdict(self)


def cpu_bf16_flags(cpuinfo: str | Path = "/proc/cpuinfo") -> tuple[str, ...]:
    """The :data:`CPU_BF16_FLAGS` this CPU has: from the ``flags`` line of ``cpuinfo`` or, without that file,
    torch's CPU probe (``torch.cpu._is_amx_tile_supported``, ``torch.cpu._is_avx512_bf16_supported``)."""
    try:
        text = Path(cpuinfo).read_text()
    except OSError:
        probes = {"amx_bf16": "_is_amx_tile_supported", "avx512_bf16": "_is_avx512_bf16_supported"}
        return tuple(flag for flag, probe in probes.items() if getattr(torch.cpu, probe, lambda: False)())
    flags = set()
    for line in text.splitlines():
        if line.startswith("flags"):
            flags |= set(line.partition(":")[2].split())
    return tuple(flag for flag in CPU_BF16_FLAGS if flag in flags)


#: the least bf16 / fp32 matrix-product speed-up at which ``auto`` takes bf16 on a CPU without AMX
BF16_MIN_SPEEDUP = 1.2


@functools.cache
def bf16_matmul_speedup(size: int = 512, rounds: int = 3) -> float:
    """How many times faster a ``[size, size] @ [size, size]`` product runs under bf16 autocast than in fp32 on
    this CPU, with the current thread count: the fastest of ``rounds`` alternating calls of each. Measured once per
    machine (:func:`vitlab.machine_cache.remembered`), on :func:`vitlab.layers.attention_path.cpu_clock`."""
    return remembered("bf16_matmul_speedup", f"{size} {rounds}", lambda: _bf16_matmul_speedup(size, rounds))


def _bf16_matmul_speedup(size: int, rounds: int) -> float:
    generator = torch.Generator().manual_seed(0)
    a, b = torch.randn(size, size, generator=generator), torch.randn(size, size, generator=generator)
    best = {"32-true": float("inf"), "bf16-mixed": float("inf")}
    clock = cpu_clock()
    for _ in range(rounds + 1):  # the first round warms both up
        for precision in best:
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16-mixed"):
                start = clock()
                a @ b
                best[precision] = min(best[precision], clock() - start)
    return best["32-true"] / best["bf16-mixed"]


def choose_precision(
    requested: str = "auto",
    accelerator: str = "auto",
    cpu_flags: tuple[str, ...] | None = None,
    bf16_speedup: float | None = None,
) -> PrecisionChoice:
    """Resolve ``requested`` (``trainer.precision``) for ``accelerator`` (``trainer.accelerator``; module doc).

    ``cpu_flags``: the CPU's bf16 flags (default: :func:`cpu_bf16_flags`); ``bf16_speedup``: the bf16 / fp32
    matrix-product speed-up of a CPU with ``avx512_bf16`` only (default: :func:`bf16_matmul_speedup`). Anything but
    ``auto`` is returned as is, but fp16 on a CPU, which is ``bf16-mixed`` (what Lightning falls back to).
    """
    on_cpu = accelerator == "cpu" or (accelerator == "auto" and not torch.cuda.is_available())
    if requested in ("16-mixed", "16") and on_cpu:  # Lightning would switch with a warning; say it in the first line
        return PrecisionChoice(requested, "bf16-mixed", "set explicitly; fp16 autocast does not run on a CPU")
    if requested != "auto":
        return PrecisionChoice(requested, requested, "set explicitly")
    if accelerator in ("auto", "gpu", "cuda") and torch.cuda.is_available():
        name = torch.cuda.get_device_name()
        if torch.cuda.is_bf16_supported(including_emulation=False):
            return PrecisionChoice(requested, "bf16-mixed", f"CUDA device {name} computes bf16")
        return PrecisionChoice(requested, "32-true", f"CUDA device {name} has no native bf16")
    if accelerator not in ("auto", "cpu"):
        return PrecisionChoice(requested, "32-true", f"accelerator {accelerator}: no native bf16 known to vitlab")
    flags = cpu_bf16_flags() if cpu_flags is None else cpu_flags
    if "amx_bf16" in flags:
        return PrecisionChoice(requested, "bf16-mixed", "CPU has amx_bf16")
    if not flags:
        return PrecisionChoice(requested, "32-true", "CPU has neither amx_bf16 nor avx512_bf16: bf16 would be emulated")
    speedup = bf16_matmul_speedup() if bf16_speedup is None else bf16_speedup
    measured = f"CPU has avx512_bf16, no AMX; a bf16 matmul ran {speedup:.2f}x the fp32 one"
    if speedup >= BF16_MIN_SPEEDUP:
        return PrecisionChoice(requested, "bf16-mixed", measured)
    return PrecisionChoice(requested, "32-true", f"{measured} (< {BF16_MIN_SPEEDUP})")
