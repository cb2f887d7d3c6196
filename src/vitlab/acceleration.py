"""What makes a training step fast on its device: ``torch.compile`` of a network with its loss, and a fused AdamW.

:func:`compile_network` compiles a network whole (one graph of its forward) and block by block (PyTorch's
"regional compilation", for what runs outside that graph); :func:`compiled_objective` compiles the forward with its
loss as one graph. The state-dict keys do not change; a network runs eager while an attention captures its matrix
or has frozen heads (ViTCAE eq. 26), its other blocks compiled. :func:`choose_compile_mode` resolves
``trainer.compile_mode: auto`` by timing the modes once per machine (:mod:`vitlab.machine_cache`). :func:`adamw`
picks AdamW's implementation (``fused``: ``"auto"``, ``True``, ``False``). All: docs/benchmarks.md, "Compiled and
fused".

:func:`choose_precision` resolves ``trainer.precision: auto``: ``bf16-mixed`` on a CUDA device that reports bf16, on
a CPU with AMX (``amx_bf16``), and on one with ``avx512_bf16`` alone where :func:`bf16_matmul_speedup` reaches
:data:`BF16_MIN_SPEEDUP`; ``32-true`` elsewhere (docs/benchmarks.md, "bf16-mixed against fp32 on an Intel Xeon
without AMX"). The flags come from ``/proc/cpuinfo`` or torch's own CPU probe. An explicit precision is used as given.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Iterable
from copy import deepcopy
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from vitlab.errors import ConfigError
from vitlab.layers.attention import Attention
from vitlab.layers.attention_path import cpu_clock
from vitlab.layers.capture import is_attention
from vitlab.machine_cache import remembered
from vitlab.models.protocols import AttentionBlocks, HeadFreezing, SlotAssigner
from vitlab.models.sizing import input_shape_of, parameter_count

log = logging.getLogger(__name__)

#: ``torch.compile`` modes (``None``: the default mode)
COMPILE_MODES: tuple[str, ...] = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


# -------------------------------------------------------------------------------------------------------------------
# torch.compile: the network whole, with its loss, and block by block
def compiled_blocks(network: nn.Module) -> list[tuple[str, nn.Module]]:
    """The blocks :func:`compile_network` compiles, with their qualified names: those an
    :class:`~vitlab.models.protocols.AttentionBlocks` model names, else the innermost elements of an ``nn.ModuleList``
    or ``nn.Sequential`` that hold an attention (:func:`~vitlab.layers.capture.is_attention`: vitlab's, timm's
    ``WindowAttention``, the cross attentions)."""
    if isinstance(network, AttentionBlocks):
        return network.attention_blocks()
    candidates = {
        f"{name}.{child_name}" if name else child_name: child
        for name, container in network.named_modules()
        if isinstance(container, nn.ModuleList | nn.Sequential)
        for child_name, child in container.named_children()
        if any(is_attention(m) for m in child.modules())
    }
    ids = {id(m) for m in candidates.values()}
    return [
        (name, block)
        for name, block in candidates.items()
        if not any(id(m) in ids for m in block.modules() if m is not block)
    ]


def _eager_reason(module: nn.Module) -> tuple[str, str] | None:
    """Why ``module`` must run eager now and the attention that says so (its name within ``module``), or None.
    Host-side attributes only: no device synchronisation."""
    for name, inner in module.named_modules():
        if isinstance(inner, Attention):
            if inner.capture:
                return "an attention capture is on (its matrices are kept on the module)", name
            if isinstance(inner, HeadFreezing) and inner.num_frozen:  # a host-side count: no device sync
                return "heads are frozen (each frozen set would be a new graph)", name
    return None


class _Guarded:
    """``compiled(module, ...)`` unless :func:`_eager_reason` says eager, then ``eager(module, ...)`` (logged once
    per reason in ``logged``, which a network shares with its blocks). Inside a compiled caller, ``eager``: the
    caller's graph traces it. ``prefix``: the module's qualified name and a dot (empty for the network).

    The functions take the module as their first argument (a class's unbound ``forward``, an objective), so a
    ``deepcopy`` of the network (whose copy of this object points to the copied module) runs the copy's weights."""

    def __init__(self, module: nn.Module, prefix: str, compiled: Any, eager: Any, logged: set[str]) -> None:
        self.module, self.prefix, self.compiled, self.eager, self.logged = module, prefix, compiled, eager, logged

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if torch.compiler.is_compiling():
            return self.eager(self.module, *args, **kwargs)
        found = _eager_reason(self.module)
        if found is None:
            return self.compiled(self.module, *args, **kwargs)
        reason, where = found
        if reason not in self.logged:
            self.logged.add(reason)
            log.warning(
                "trainer.compile: the blocks with %s run eager while %s (first: %s); the others stay compiled",
                "an attention capture" if "capture" in reason else "frozen heads",
                reason,
                f"{self.prefix}{where}",
            )
        return self.eager(self.module, *args, **kwargs)


def check_compile_mode(mode: str | None) -> None:
    """Raise :class:`ConfigError` unless ``mode`` is None, ``auto`` or one of :data:`COMPILE_MODES`."""
    if mode not in (None, "auto", *COMPILE_MODES):
        raise ConfigError(f"trainer.compile_mode must be one of auto, {', '.join(COMPILE_MODES)}, got {mode!r}")


def _options(mode: str | None, backend: str, dynamic: bool | None) -> dict[str, Any]:
    check_compile_mode(mode)
    if mode == "auto":
        raise ValueError("resolve trainer.compile_mode=auto with choose_compile_mode first")
    return dict(mode=None if mode == "default" else mode, backend=backend, dynamic=dynamic)


def compile_network(
    network: nn.Module, *, mode: str | None = None, backend: str = "inductor", dynamic: bool | None = None
) -> list[str]:
    """Compile ``network`` in place, whole and block by block; returns the names of the compiled blocks.

    ``network(x)`` runs one graph of the whole forward (and ``forward_with_aux`` one, for a
    :class:`~vitlab.models.protocols.SlotAssigner`); its attention blocks (:func:`compiled_blocks`, one compiled
    function per block class) are compiled too, for what calls them outside that graph: the eager forward, which
    runs while an attention captures its matrices or has frozen heads (ViTCAE eq. 26; each block of them then runs
    eager, the others compiled). The module tree and the state-dict keys do not change. :func:`compiled_objective`
    puts a loss into the network's graph.

    ``mode``: a ``torch.compile`` mode (:data:`COMPILE_MODES`; None or ``"default"``: the default; ``auto``:
    :func:`choose_compile_mode` first); ``backend``: ``"inductor"`` (the default, generated kernels), ``"aot_eager"``
    (traced, run by eager kernels: what the tests use, since it compiles in a second). ``dynamic``: torch's default
    (None) compiles for the first shapes seen and, at the first change (the last batch of an epoch, an evaluation
    batch size), once more with those sizes symbolic, so the recompilations stay few.
    """
    options = _options(mode, backend, dynamic)
    logged: set[str] = network.forward.logged if is_compiled(network) else set()
    blocks = compiled_blocks(network)
    compiled: dict[type, Any] = {}  # one compiled function per block class, shared by its blocks
    for name, block in blocks:
        if not is_compiled(block):
            cls = type(block)
            compiled.setdefault(cls, torch.compile(cls.forward, **options))
            block.forward = _Guarded(block, f"{name}.", compiled[cls], cls.forward, logged)
    if not is_compiled(network):
        cls = type(network)
        network.forward = _Guarded(network, "", torch.compile(cls.forward, **options), cls.forward, logged)
        if isinstance(network, SlotAssigner):  # the entry point of its task's training step
            whole = torch.compile(cls.forward_with_aux, **options)
            network.forward_with_aux = _Guarded(network, "", whole, cls.forward_with_aux, logged)
    return [name for name, _ in blocks]


def compiled_objective(
    network: nn.Module,
    objective: Callable[..., Any],
    *,
    mode: str | None = None,
    backend: str = "inductor",
    dynamic: bool | None = None,
) -> Callable[..., Any]:
    """``objective(network, *args)`` (e.g. :func:`classifier_objective`: the forward and its loss) as one compiled
    graph, called as ``f(*args)``; eager while ``network`` must run eager (:func:`compile_network`'s reasons), its
    compiled blocks then running inside. Options as :func:`compile_network`, which is applied to ``network``."""
    compile_network(network, mode=mode, backend=backend, dynamic=dynamic)
    compiled = torch.compile(objective, **_options(mode, backend, dynamic))
    return _Guarded(network, "", compiled, objective, network.forward.logged)


def classifier_objective(
    model: nn.Module, x: torch.Tensor, y: torch.Tensor, label_smoothing: float = 0.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(logits [B, K], loss [])``: the cross-entropy (with ``label_smoothing``) of ``model(x)``'s logits (the
    output, or its ``logits``) against ``y``, ``[B]`` class indices or ``[B, K]`` soft targets."""
    out = model(x)
    logits = out if isinstance(out, torch.Tensor) else out.logits
    return logits, F.cross_entropy(logits.float(), y, label_smoothing=label_smoothing)


def is_compiled(module: nn.Module) -> bool:
    """Whether :func:`compile_network` compiled ``module`` (a network or one of its blocks)."""
    return isinstance(module.__dict__.get("forward"), _Guarded)


# -------------------------------------------------------------------------------------------------------------------
# trainer.compile_mode: auto
#: the modes ``auto`` times on a CUDA device. Not ``reduce-overhead``: a CUDA graph's outputs are overwritten by its
#: next replay, and Lightning keeps the logged step loss across steps; until that is tested on a GPU, CUDA graphs are
#: an explicit ``trainer.compile_mode`` (``benchmarks/experiments/gpu_speed.py`` times all three)
CUDA_MODE_CANDIDATES: tuple[str, ...] = ("default", "max-autotune-no-cudagraphs")


def _choice_line(what: str, value: str, requested: str, reason: str) -> str:
    """``<what> <value> (auto: <reason>)``, or ``(<reason>)`` for an explicit request."""
    return f"{what} {value} ({'auto: ' if requested == 'auto' else ''}{reason})"


@dataclass(frozen=True)
class CompileChoice:
    """The ``torch.compile`` mode a run uses: ``requested`` (``auto`` or explicit), ``mode`` and why; ``seconds``:
    the training step's seconds per mode where they were timed (None: the mode failed)."""

    requested: str
    mode: str
    reason: str
    seconds: dict[str, float | None] = field(default_factory=dict)

    def line(self) -> str:
        """The line a compiled run prints, e.g. ``compile mode default (auto: cpu: nothing to time)``."""
        return _choice_line("compile mode", self.mode, self.requested, self.reason)


def choose_compile_mode(
    requested: str | None,
    network: nn.Module,
    *,
    batch_size: int,
    precision: str,
    device: torch.device | str,
    backend: str = "inductor",
    candidates: tuple[str, ...] = CUDA_MODE_CANDIDATES,
) -> CompileChoice:
    """Resolve ``trainer.compile_mode`` for ``network`` at ``batch_size`` under ``precision`` on ``device``.

    ``auto`` on a CUDA device with the inductor backend: the mode of ``candidates`` whose compiled training step
    (forward, cross-entropy, backward; :func:`time_compile_modes`) is fastest, timed once per machine and case and
    kept (:func:`vitlab.machine_cache.remembered`). Elsewhere ``default``: a CPU has no CUDA graphs, and inductor's
    max-autotune GEMM templates did not beat ATen's matrix products on one (docs/benchmarks.md, "Compiled and
    fused"); other backends have no modes. None is ``default``; an explicit mode is used as given.
    """
    check_compile_mode(requested)
    if requested != "auto":
        return CompileChoice(str(requested or "default"), requested or "default", "set explicitly")
    device = torch.device(device)
    if device.type != "cuda" or backend != "inductor":
        where = f"backend {backend} has no modes" if backend != "inductor" else f"{device.type}: nothing to time"
        return CompileChoice("auto", "default", where)
    return timed_compile_mode(
        network, batch_size=batch_size, precision=precision, device=device, backend=backend, candidates=candidates
    )


def timed_compile_mode(
    network: nn.Module,
    *,
    batch_size: int,
    precision: str,
    device: torch.device,
    backend: str = "inductor",
    candidates: tuple[str, ...] = CUDA_MODE_CANDIDATES,
) -> CompileChoice:
    """The mode of ``candidates`` whose training step :func:`time_compile_modes` times fastest, timed once per
    machine and case (network class and size, batch, precision, candidates) and kept."""
    cls = type(network)
    case = f"{cls.__module__}.{cls.__qualname__} {parameter_count(network)} params, batch {batch_size}x"
    case += f"{'x'.join(map(str, input_shape_of(network)))}, {precision}, {backend}, {' '.join(candidates)}"
    seconds = remembered(
        "compile_mode", case, lambda: time_compile_modes(network, batch_size, precision, device, candidates, backend)
    )
    timed = {mode: s for mode, s in seconds.items() if s is not None}
    if not timed:
        return CompileChoice("auto", "default", f"no mode of {', '.join(candidates)} compiled", seconds)
    measured = ", ".join(f"{m} {s * 1e3:.2f} ms" if s is not None else f"{m} failed" for m, s in seconds.items())
    reason = f"training step timed once on this machine: {measured}"
    return CompileChoice("auto", min(timed, key=timed.get), reason, seconds)


def time_compile_modes(
    network: nn.Module,
    batch_size: int,
    precision: str,
    device: torch.device,
    candidates: tuple[str, ...],
    backend: str = "inductor",
    steps: int = 5,
) -> dict[str, float | None]:
    """Seconds per training step (forward, cross-entropy, backward) of a copy of ``network`` compiled whole in each
    mode of ``candidates``: the fastest of ``steps`` after three warm-up steps; None where the mode fails."""
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(batch_size, *input_shape_of(network), generator=generator).to(device)
    dtype = {"bf16": torch.bfloat16, "16": torch.float16}.get(precision.split("-")[0])
    network = deepcopy(network).to(device).train()  # the caller's network stays where it is, uncompiled
    with torch.no_grad():
        width = classifier_objective(network, x[:1], torch.zeros(1, dtype=torch.long, device=device))[0].shape[-1]
    y = torch.randint(0, width, (batch_size,), generator=generator).to(device)

    def train_step(step: Any, copy: nn.Module) -> None:
        with torch.autocast(device.type, dtype=dtype or torch.float32, enabled=dtype is not None):
            loss = step(copy, x, y)[1]
        loss.backward()
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    seconds: dict[str, float | None] = {}
    for mode in candidates:
        try:
            step = torch.compile(classifier_objective, **_options(mode, backend, None))
            copy = deepcopy(network)
            seconds[mode] = fastest(functools.partial(train_step, step, copy), steps, warmup=3)[0]
        except Exception as e:  # a mode this machine cannot compile is not chosen
            log.warning("trainer.compile_mode=auto: %s failed on this machine (%s)", mode, e)
            seconds[mode] = None
    return seconds


def fastest(
    work: Callable[[], Any], repeats: int, *, warmup: int = 0, clock: Callable[[], float] = time.perf_counter
) -> tuple[float, Any]:
    """The fewest seconds ``work()`` took over ``repeats`` calls after ``warmup`` untimed ones (the call least
    disturbed by other processes), and what the last call returned."""
    if repeats < 1:
        raise ValueError(f"repeats must be at least 1, not {repeats}")
    for _ in range(warmup):
        work()
    best = float("inf")
    for _ in range(repeats):
        start = clock()
        result = work()
        best = min(best, clock() - start)
    return best, result


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
        return _choice_line("precision", self.precision, self.requested, self.reason)

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
