"""What makes a training step fast on its device: ``torch.compile`` of a network's blocks and a fused AdamW.

:func:`compile_network` compiles a network **block by block** (PyTorch's "regional compilation"): one compilation
serves every block of a class and the state-dict keys do not change; a block runs eager while an attention captures
its matrix or has frozen heads (ViTCAE eq. 26), and ToMe's merging blocks stay eager. :func:`adamw` picks AdamW's
implementation (``fused``: ``"auto"``, ``True``, ``False``). Both: docs/benchmarks.md, "Compiled and fused".

:func:`choose_precision` resolves ``trainer.precision: auto``: ``bf16-mixed`` on a CUDA device that reports bf16, on
a CPU with AMX (``amx_bf16``), and on one with ``avx512_bf16`` alone where :func:`bf16_matmul_speedup` reaches
:data:`BF16_MIN_SPEEDUP`; ``32-true`` elsewhere (docs/benchmarks.md, "bf16-mixed against fp32 on an Intel Xeon
without AMX"). The flags come from ``/proc/cpuinfo`` or torch's own CPU probe. An explicit precision is used as given.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from vitlab.errors import ConfigError
from vitlab.layers.attention import Attention
from vitlab.layers.attention_path import cpu_clock
from vitlab.machine_cache import remembered
from vitlab.models.protocols import HeadFreezing

log = logging.getLogger(__name__)

#: ``torch.compile`` modes (``None``: the default mode)
COMPILE_MODES: tuple[str, ...] = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


# -------------------------------------------------------------------------------------------------------------------
# torch.compile, block by block
def compiled_blocks(network: nn.Module) -> list[tuple[str, nn.Module]]:
    """The blocks :func:`compile_network` compiles: innermost elements of an ``nn.ModuleList`` or ``nn.Sequential``
    that hold an attention (a module whose class name ends in ``Attention``: vitlab's, timm's ``WindowAttention``,
    the cross attentions), with their qualified names."""

    def holds_attention(module: nn.Module) -> bool:
        return any(type(m).__name__.endswith("Attention") for m in module.modules())

    candidates = {
        f"{name}.{child_name}" if name else child_name: child
        for name, container in network.named_modules()
        if isinstance(container, nn.ModuleList | nn.Sequential)
        for child_name, child in container.named_children()
        if holds_attention(child)
    }
    ids = {id(m) for m in candidates.values()}
    return [
        (name, block)
        for name, block in candidates.items()
        if not any(id(m) in ids for m in block.modules() if m is not block)
    ]


def _eager_reason(block: nn.Module) -> str | None:
    """Why ``block`` must run eager now, or None. Host-side attributes only: no device synchronisation."""
    for module in block.modules():
        if isinstance(module, Attention):
            if module.capture:
                return "an attention capture is on (its matrices are kept on the module)"
            if isinstance(module, HeadFreezing) and module.num_frozen:  # a host-side count: no device sync
                return "heads are frozen (each frozen set would be a new graph)"
    return None


class _BlockForward:
    """A block's ``forward``: the compiled one unless :func:`_eager_reason` says eager (logged once per reason).

    The compiled function is the block class's unbound ``forward``, called with the block, so a ``deepcopy`` of the
    network (whose copy of this object points to the copied block) runs the copy's weights."""

    def __init__(self, block: nn.Module, name: str, compiled: Any, logged: set[str]) -> None:
        self.block, self.name, self.compiled, self.logged = block, name, compiled, logged

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        reason = _eager_reason(self.block)
        if reason is None:
            return self.compiled(self.block, *args, **kwargs)
        if reason not in self.logged:
            self.logged.add(reason)
            log.warning(
                "trainer.compile: blocks run eager while %s (first: %s); the others stay compiled", reason, self.name
            )
        return type(self.block).forward(self.block, *args, **kwargs)


def check_compile_mode(mode: str | None) -> None:
    """Raise :class:`ConfigError` unless ``mode`` is None or one of :data:`COMPILE_MODES`."""
    if mode not in (None, *COMPILE_MODES):
        raise ConfigError(f"trainer.compile_mode must be one of {', '.join(COMPILE_MODES)}, got {mode!r}")


def compile_network(
    network: nn.Module, *, mode: str | None = None, backend: str = "inductor", dynamic: bool | None = None
) -> list[str]:
    """Compile ``network``'s blocks in place (module doc); returns the names of the compiled blocks.

    ``mode``: a ``torch.compile`` mode (:data:`COMPILE_MODES`; None or ``"default"``: the default); ``backend``:
    ``"inductor"`` (the default, generated kernels), ``"aot_eager"`` (traced, run by eager kernels: what the tests
    use, since it compiles in a second). ``dynamic``: torch's default (None) compiles for the first shapes
    seen and, at the first change (the last batch of an epoch, an evaluation batch size, a Swin stage of another
    width), once more with those sizes symbolic, so the recompilations stay few.
    """
    check_compile_mode(mode)
    blocks = compiled_blocks(network)
    if not blocks:
        log.warning("trainer.compile: %s has no attention blocks to compile; it runs eager", type(network).__name__)
        return []
    logged: set[str] = set()
    options = dict(mode=None if mode == "default" else mode, backend=backend, dynamic=dynamic)
    compiled: dict[type, Any] = {}  # one compiled function per block class, shared by its blocks
    for name, block in blocks:
        if is_compiled(block):
            continue
        cls = type(block)
        if cls not in compiled:
            compiled[cls] = torch.compile(cls.forward, **options)
        block.forward = _BlockForward(block, name, compiled[cls], logged)
    if getattr(network, "tome_r", 0) > 0:
        log.warning(
            "trainer.compile: token merging (tome_r=%d) shrinks the tokens block by block; its blocks run eager",
            network.tome_r,
        )
    return [name for name, _ in blocks]


def is_compiled(block: nn.Module) -> bool:
    """Whether :func:`compile_network` compiled ``block``."""
    return isinstance(block.__dict__.get("forward"), _BlockForward)


# -------------------------------------------------------------------------------------------------------------------
# AdamW
def adamw_implementation(fused: bool | str, parameters: Iterable[torch.Tensor]) -> dict[str, bool]:
    """``torch.optim.AdamW`` keyword arguments for ``fused`` (``"auto"``, ``True``, ``False``; module doc)."""
    if not (fused == "auto" or isinstance(fused, bool)):
        raise ConfigError(f"optim.fused must be auto, true or false, got {fused!r}")
    if fused is False:
        return {}
    from torch.optim.optimizer import _get_fused_kernels_supported_devices

    supported = set(_get_fused_kernels_supported_devices())
    devices = {p.device.type for p in parameters}
    fusable = bool(devices) and devices <= supported and all(p.is_floating_point() for p in parameters)
    if fused is True and not fusable:
        raise ConfigError(
            f"optim.fused=true, but torch has no fused AdamW for parameters on {', '.join(sorted(devices))} "
            f"(it has one for {', '.join(sorted(supported))}); set optim.fused=auto or false"
        )
    return {"fused": True} if fusable else {}


def adamw(
    params: list[dict[str, Any]] | list[torch.Tensor],
    *,
    lr: float,
    betas: tuple[float, float] = (0.9, 0.999),
    weight_decay: float = 0.05,
    fused: bool | str = "auto",
) -> torch.optim.AdamW:
    """``torch.optim.AdamW`` over ``params`` (tensors or parameter groups) with the implementation ``fused`` picks."""
    groups = list(params)
    tensors = [p for g in groups for p in (g["params"] if isinstance(g, dict) else [g])]
    return torch.optim.AdamW(
        groups, lr=lr, betas=tuple(betas), weight_decay=weight_decay, **adamw_implementation(fused, tensors)
    )


# -------------------------------------------------------------------------------------------------------------------
# trainer.precision: auto
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
        how = "auto: " if self.requested == "auto" else ""
        return f"precision {self.precision} ({how}{self.reason})"

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
