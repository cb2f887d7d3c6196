"""Throughput, FLOPs, model FLOPs utilisation (MFU) and peak memory of a network, side by side with timm.

:func:`bench` measures a registered preset's training step (forward, cross-entropy, backward, AdamW step) and its
inference (forward under ``torch.inference_mode``), optionally next to timm's network of the same shape
(``vs="timm"``, :func:`timm_counterpart`). :func:`measure_networks` is the engine, usable on any networks that take
images (``benchmarks/feature_costs.py`` uses it for features switched off and on).

Every measurement alternates, round after round, between the networks and a large square matrix multiply in the
same process, precision and thread count (the order reverses every other round). Load from other processes then
hits all of them alike; ratios and MFU are formed per round and summarised by their median and spread.

Definitions (``docs/benchmarks.md``):

- FLOPs per image: the forward FLOPs that ``torch.utils.flop_counter.FlopCounterMode`` counts (matrix products,
  convolutions and attention; elementwise work is not counted), :func:`vitlab.models.sizing.flops_per_image`.
  Training FLOPs are 3x the forward FLOPs (the backward pass computes two matrix products per forward one: input
  and weight gradients); the counted backward-over-forward ratio is reported next to it as a check.
- MFU: achieved FLOP/s (FLOPs per image x images/s) over the FLOP/s of a ``matmul_size``-square matrix multiply
  measured in the same round, at the same precision (bf16 through autocast) and thread count.
- Peak memory of a training step: on CUDA, ``max_memory_allocated`` above the allocation before the network was
  built; on CPU, the growth of the peak resident set size of a fresh process (Linux: ``VmHWM`` after resetting it
  through ``/proc/self/clear_refs``; elsewhere ``getrusage`` ``ru_maxrss``) from before building the network to
  after two training steps (weights, gradients, AdamW state, activations and
  allocator overhead). A fresh process per network, because a process's peak RSS never goes down and the
  allocator keeps freed memory, so a second network measured in the same process would read the first one's peak.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import timm
import torch
import torch.nn.functional as F
from timm.models.swin_transformer import SwinTransformer as TimmSwinTransformer
from torch import nn
from torch.utils.flop_counter import FlopCounterMode, sdpa_backward_flop_count

from vitlab.acceleration import adamw, check_compile_mode, compile_network
from vitlab.errors import ConfigError
from vitlab.models.registry import constructor_args, create_model, get_preset, resolved_kwargs
from vitlab.models.sizing import flops_per_image as flops_per_image_forward
from vitlab.models.sizing import input_shape_of
from vitlab.models.vit import VisionTransformer
from vitlab.models.vitcae import ViTCAE

Precision = Literal["32-true", "bf16-mixed"]
PRECISIONS: tuple[str, ...] = ("32-true", "bf16-mixed")
PHASES: tuple[str, ...] = ("train", "inference")
#: ``wall``: elapsed time; ``cpu``: CPU time of the process, which time-sharing with other processes does not inflate
CLOCKS: tuple[str, ...] = ("wall", "cpu")
#: training FLOPs per forward FLOP: forward, then input and weight gradients in the backward pass
TRAINING_FLOPS_PER_FORWARD = 3


# -------------------------------------------------------------------------------------------------------------------
# What is measured
@dataclass(frozen=True)
class NetworkSpec:
    """How to build a benchmarked network; plain data, so a fresh process can rebuild it (peak memory on CPU).

    ``source="vitlab"``: the preset ``name`` with keyword ``kwargs`` overrides; a ViTCAE preset gives its encoder
    (``model.encoder``, a ``VisionTransformer`` with temperature). ``"timm_vit"`` / ``"timm_swin"``: timm's
    ``VisionTransformer`` / ``SwinTransformer`` built with ``kwargs``.
    """

    source: Literal["vitlab", "timm_vit", "timm_swin"]
    name: str
    kwargs: dict[str, Any] = field(default_factory=dict)

    def build(self) -> nn.Module:
        if self.source == "vitlab":
            model = create_model(self.name, **self.kwargs)
            return model.encoder if isinstance(model, ViTCAE) else model
        if self.source == "timm_vit":
            return timm.models.VisionTransformer(**self.kwargs)
        return TimmSwinTransformer(**self.kwargs)

    def describe(self) -> str:
        if self.source == "vitlab":
            part = " (encoder)" if issubclass(get_preset(self.name).cls, ViTCAE) else ""
            return f"vitlab {self.name}{part}"
        return self.name


_VIT_KEYS = (
    "img_size",
    "patch_size",
    "in_chans",
    "num_classes",
    "embed_dim",
    "depth",
    "num_heads",
    "mlp_ratio",
    "qkv_bias",
    "drop_rate",
    "attn_drop_rate",
    "drop_path_rate",
)
_SWIN_KEYS = (
    "img_size",
    "patch_size",
    "in_chans",
    "num_classes",
    "embed_dim",
    "depths",
    "num_heads",
    "window_size",
    "mlp_ratio",
    "qkv_bias",
    "drop_rate",
    "attn_drop_rate",
    "drop_path_rate",
)


def timm_counterpart(model: str, overrides: dict[str, Any] | None = None) -> NetworkSpec:
    """timm's network of the same shape as the preset ``model`` with ``overrides``.

    ViT presets (``vit_*``; ``tome_*`` get the plain timm ViT, so the ratio is ToMe's speed-up): timm's
    ``VisionTransformer`` with the same width, depth, heads, patch, input, MLP ratio, QKV bias, pooling and dropout.
    ViTCAE presets: the timm ViT of the encoder's shape, without a head (``num_classes=0``) and without the
    temperature. Swin presets: timm's ``SwinTransformer`` with the same configuration.
    """
    cls = get_preset(model).cls
    defaults = {name: p.default for name, p in constructor_args(cls).items()}
    kwargs = defaults | resolved_kwargs(model, **(overrides or {}))
    if issubclass(cls, (VisionTransformer, ViTCAE)):
        vit = {key: kwargs[key] for key in _VIT_KEYS}
        vit |= dict(pos_drop_rate=kwargs["drop_rate"], proj_drop_rate=kwargs["drop_rate"])
        if issubclass(cls, ViTCAE):
            vit |= dict(num_classes=0, global_pool="token")
        else:
            vit["global_pool"] = kwargs["global_pool"]
        return NetworkSpec("timm_vit", "timm VisionTransformer", vit)
    if issubclass(cls, TimmSwinTransformer):
        swin = {key: kwargs[key] for key in _SWIN_KEYS}
        swin["proj_drop_rate"] = kwargs["drop_rate"]
        return NetworkSpec("timm_swin", "timm SwinTransformer", swin)
    raise ConfigError(
        f"--vs timm has no timm counterpart for {model!r} ({cls.__name__}); it covers the ViT presets (vit_*, "
        "tome_*), the ViTCAE encoders (vitcae_*) and Swin (swin_*). Run without --vs to bench it alone."
    )


# -------------------------------------------------------------------------------------------------------------------
# FLOPs
def _cpu_flash_attention_backward_flops(grad_out_shape, query_shape, key_shape, value_shape, *args, **kwargs) -> int:
    return sdpa_backward_flop_count(grad_out_shape, query_shape, key_shape, value_shape)


def flops_per_image(network: nn.Module, images: int = 2) -> dict[str, float]:
    """FLOPs per image: ``forward`` (:func:`vitlab.models.sizing.flops_per_image`); ``training``, 3x forward, the
    convention of the MFU; ``backward_over_forward``, counted by ``FlopCounterMode`` on a real backward pass (with
    the CPU SDPA backward kernel, which the counter does not know), a check of the 3x."""
    forward = flops_per_image_forward(network)
    device = next(network.parameters()).device
    out = network(torch.randn(images, *input_shape_of(network), device=device))
    backward_kernel = {
        torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward: _cpu_flash_attention_backward_flops
    }
    with FlopCounterMode(display=False, custom_mapping=backward_kernel) as backward_counter:
        out.float().square().mean().backward()
    network.zero_grad(set_to_none=True)
    return {
        "forward": forward,
        "training": TRAINING_FLOPS_PER_FORWARD * forward,
        "backward_over_forward": backward_counter.get_total_flops() / images / forward,
    }


# -------------------------------------------------------------------------------------------------------------------
# Timing
def autocast(precision: str, device: torch.device) -> contextlib.AbstractContextManager:
    """The autocast context of a Lightning-style ``precision``: none for ``32-true``, bf16 for ``bf16-mixed``."""
    if precision == "32-true":
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=torch.bfloat16)


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@dataclass(frozen=True)
class Runner:
    """How a network is run: ``compile`` ``"none"`` (eager), ``"blocks"`` (vitlab's ``trainer.compile``,
    :func:`vitlab.acceleration.compile_network`) or ``"model"`` (``torch.compile`` of the whole network, what a timm
    user writes), with ``mode`` and ``backend``; ``fused``: AdamW's implementation (``"auto"``, ``True``, ``False``:
    torch's default, :func:`vitlab.acceleration.adamw`)."""

    compile: Literal["none", "blocks", "model"] = "none"
    mode: str | None = None
    backend: str = "inductor"
    fused: bool | str = False

    def describe(self) -> str:
        how = {"none": "eager", "blocks": "compiled blocks", "model": "torch.compile(model)"}[self.compile]
        if self.compile != "none" and self.mode not in (None, "default"):
            how += f" ({self.mode})"
        return f"{how}, AdamW {'fused=' + str(self.fused) if self.fused is not False else 'torch default'}"


class Subject:
    """One network under measurement: the (optionally compiled) module, its AdamW, a fixed batch and targets."""

    def __init__(
        self, network: nn.Module, *, batch_size: int, precision: str, device: torch.device, runner: Runner = Runner()
    ):
        self.network = network.to(device)
        self.precision, self.device = precision, device
        generator = torch.Generator().manual_seed(0)
        self.x = torch.randn(batch_size, *input_shape_of(network), generator=generator).to(device)
        with torch.no_grad():  # before compiling: a batch of one would be a graph the timing never uses
            width = self.network(self.x[:1]).shape[-1]
        # Cross-entropy over the output's last axis: logits of a classifier, pooled features of a headless encoder.
        self.y = torch.randint(0, width, (batch_size,), generator=generator).to(device)
        self.runnable = self.network
        if runner.compile == "blocks":
            compile_network(self.network, mode=runner.mode, backend=runner.backend)
        elif runner.compile == "model":
            mode = None if runner.mode == "default" else runner.mode
            self.runnable = torch.compile(self.network, mode=mode, backend=runner.backend)
        self.optimizer = adamw(list(self.network.parameters()), lr=1e-4, weight_decay=0.05, fused=runner.fused)

    def train_step(self) -> None:
        self.network.train()
        self.optimizer.zero_grad(set_to_none=True)
        with autocast(self.precision, self.device):
            logits = self.runnable(self.x)
        F.cross_entropy(logits.float(), self.y).backward()
        self.optimizer.step()

    def inference(self) -> None:
        self.network.eval()
        with torch.inference_mode(), autocast(self.precision, self.device):
            self.runnable(self.x)


class _Matmul:
    """A square matrix multiply ``[n, n] @ [n, n]`` (``2 n^3`` FLOPs), the peak the MFU is measured against."""

    def __init__(self, size: int, precision: str, device: torch.device) -> None:
        generator = torch.Generator().manual_seed(0)
        self.a = torch.randn(size, size, generator=generator).to(device)
        self.b = torch.randn(size, size, generator=generator).to(device)
        self.precision, self.device = precision, device
        self.flops = 2 * size**3

    def __call__(self) -> None:
        with autocast(self.precision, self.device):
            self.a @ self.b


@dataclass
class _Task:
    """A timed callable: ``calls`` per sample (set after the warm-up); per round, seconds per call on each clock."""

    run: Callable[[], None]
    calls: int = 1
    seconds: dict[str, list[float]] = field(default_factory=lambda: {clock: [] for clock in CLOCKS})


def _time_calls(run: Callable[[], None], calls: int, device: torch.device) -> dict[str, float]:
    """Seconds per call of ``run``: wall clock, and the CPU time of this process (all its threads)."""
    _synchronize(device)
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(calls):
        run()
    _synchronize(device)
    return {"wall": (time.perf_counter() - wall) / calls, "cpu": (time.process_time() - cpu) / calls}


def _measure_alternating(
    tasks: dict[str, _Task], *, repeats: int, warmup: int, sample_seconds: float, device: torch.device
) -> None:
    """Warm each task up, size its samples to ``sample_seconds``, then time them round-robin, ``repeats`` rounds;
    every other round runs in reverse order so that no task always follows the same one."""
    for task in tasks.values():
        per_call = min(_time_calls(task.run, 1, device)["wall"] for _ in range(max(warmup, 1)))
        task.calls = max(1, round(sample_seconds / per_call))
    order = list(tasks)
    for round_index in range(repeats):
        for name in order if round_index % 2 == 0 else reversed(order):
            for clock, seconds in _time_calls(tasks[name].run, tasks[name].calls, device).items():
                tasks[name].seconds[clock].append(seconds)


def summarize(values: list[float]) -> dict[str, float]:
    """Median, quartiles (inclusive method), min, max and count of ``values``."""
    ordered = sorted(values)
    if len(ordered) > 1:
        q1, _, q3 = statistics.quantiles(ordered, n=4, method="inclusive")
    else:
        q1 = q3 = ordered[0]
    return {
        "median": statistics.median(ordered),
        "q1": q1,
        "q3": q3,
        "min": ordered[0],
        "max": ordered[-1],
        "n": len(ordered),
    }


@contextlib.contextmanager
def torch_threads(threads: int | None) -> Iterator[None]:
    """Run with ``threads`` intra-op threads (None: leave the setting), restoring the previous count after."""
    previous = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def measure_networks(
    networks: dict[str, nn.Module],
    *,
    batch_size: int = 64,
    precision: str = "32-true",
    device: str | torch.device = "cpu",
    compile: bool = False,
    runners: dict[str, Runner] | None = None,
    repeats: int = 5,
    warmup: int = 2,
    sample_seconds: float = 0.5,
    matmul_size: int = 1024,
) -> dict[str, Any]:
    """Time the training step and the inference of each network and the matmul peak, alternating (module doc).

    ``runners``: how each network runs (:class:`Runner`; a network without one runs eager, with torch's AdamW, or
    with ``compile=True`` as ``torch.compile`` of the whole network).

    Returns ``{"clocks", "matmul_peak": {"size", "precision", "flops_per_s": {clock: summary}}, "networks": {name:
    {"parameters", "flops_per_image", "train": {clock: ...}, "inference": {clock: ...}}}}`` plus, for bf16 runs,
    ``"matmul_peak_fp32"``. Clocks: ``wall`` and, on CPU, ``cpu`` (process CPU time, see :data:`CLOCKS`). Each
    phase and clock holds ``images_per_s`` and ``mfu`` (and ``mfu_vs_fp32_peak`` for bf16) summaries over the
    rounds, and the raw ``seconds_per_batch`` per round, in round order, for :func:`round_ratio`.
    """
    _check_settings(batch_size=batch_size, precision=precision, repeats=repeats, warmup=warmup)
    device = torch.device(device)
    clocks = CLOCKS if device.type == "cpu" else ("wall",)  # CUDA runs asynchronously: the host's CPU time is no clock
    flops = {name: flops_per_image(network.to(device)) for name, network in networks.items()}
    peak_precisions = [precision] if precision == "32-true" else [precision, "32-true"]
    matmuls = {p: _Matmul(matmul_size, p, device) for p in peak_precisions}
    tasks = {f"matmul {p}": _Task(matmul) for p, matmul in matmuls.items()}
    default = Runner(compile="model") if compile else Runner()
    runners = {name: (runners or {}).get(name, default) for name in networks}
    for name, network in networks.items():
        subject = Subject(network, batch_size=batch_size, precision=precision, device=device, runner=runners[name])
        tasks[f"{name} train"] = _Task(subject.train_step)
        tasks[f"{name} inference"] = _Task(subject.inference)
    _measure_alternating(tasks, repeats=repeats, warmup=warmup, sample_seconds=sample_seconds, device=device)

    peak_flops = {
        (p, clock): [matmul.flops / s for s in tasks[f"matmul {p}"].seconds[clock]]
        for p, matmul in matmuls.items()
        for clock in clocks
    }
    result: dict[str, Any] = {"clocks": list(clocks)}
    for p in peak_precisions:
        result["matmul_peak" if p == precision else "matmul_peak_fp32"] = {
            "size": matmul_size,
            "precision": p,
            "flops_per_s": {clock: summarize(peak_flops[p, clock]) for clock in clocks},
        }
    result["networks"] = {}
    for name, network in networks.items():
        entry: dict[str, Any] = {
            "parameters": sum(p.numel() for p in network.parameters()),
            "flops_per_image": flops[name],
            "runner": {**asdict(runners[name]), "description": runners[name].describe()},
        }
        for phase in PHASES:
            work = flops[name]["training" if phase == "train" else "forward"] * batch_size
            entry[phase] = {}
            for clock in clocks:
                seconds = tasks[f"{name} {phase}"].seconds[clock]
                measured = {
                    "images_per_s": summarize([batch_size / s for s in seconds]),
                    "mfu": _mfu(work, seconds, peak_flops[precision, clock]),
                    "seconds_per_batch": seconds,
                }
                if precision != "32-true":
                    measured["mfu_vs_fp32_peak"] = _mfu(work, seconds, peak_flops["32-true", clock])
                entry[phase][clock] = measured
        result["networks"][name] = entry
    return result


def _mfu(work: float, seconds: list[float], peaks: list[float]) -> dict[str, float]:
    """Per round: ``work`` FLOPs in ``seconds`` over the matmul FLOP/s of the same round."""
    return summarize([work / s / peak for s, peak in zip(seconds, peaks, strict=True)])


def round_ratio(
    result: dict[str, Any], numerator: str, denominator: str, phase: str, clock: str = "wall"
) -> dict[str, float]:
    """Throughput of ``numerator`` over ``denominator`` in ``phase`` on ``clock``, formed per round, summarised
    over the rounds (``>= 1``: the numerator is at least as fast)."""
    top = result["networks"][numerator][phase][clock]["seconds_per_batch"]
    bottom = result["networks"][denominator][phase][clock]["seconds_per_batch"]
    return summarize([b / t for t, b in zip(top, bottom, strict=True)])


# -------------------------------------------------------------------------------------------------------------------
# Peak memory
def _proc_status_kib(field_name: str) -> int:
    status = Path("/proc/self/status").read_text()
    return int(next(line for line in status.splitlines() if line.startswith(field_name + ":")).split()[1])


def _train_steps_peak_rss_growth_mib(
    spec: NetworkSpec, batch_size: int, precision: str, threads: int | None
) -> tuple[float, str]:
    """In a fresh process: growth of the peak RSS over building ``spec`` and two training steps, in MiB, and the
    method. On Linux the peak (``VmHWM``) is reset to the current RSS first (``/proc/self/clear_refs``), since the
    imports leave a peak of their own that a small network stays below; elsewhere ``ru_maxrss`` growth."""
    if threads is not None:
        torch.set_num_threads(threads)
    clear_refs = Path("/proc/self/clear_refs")
    try:
        clear_refs.write_text("5")
        before, method = _proc_status_kib("VmRSS"), "VmHWM of a fresh process, reset to VmRSS before the build"
    except OSError:
        before, method = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, "ru_maxrss growth of a fresh process"
    cpu = torch.device("cpu")
    subject = Subject(spec.build(), batch_size=batch_size, precision=precision, device=cpu)
    for _ in range(2):
        subject.train_step()
    if method.startswith("VmHWM"):
        return (_proc_status_kib("VmHWM") - before) / 2**10, method
    growth = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    return (growth / 2**20 if sys.platform == "darwin" else growth / 2**10), method  # bytes on macOS, KiB on Linux


def peak_memory(
    spec: NetworkSpec, *, batch_size: int, precision: str, device: str | torch.device = "cpu", threads: int | None = 1
) -> dict[str, Any]:
    """Peak memory of two eager training steps of ``spec``'s network, in MiB, and how it was measured (module doc)."""
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
        subject = Subject(spec.build(), batch_size=batch_size, precision=precision, device=device)
        for _ in range(2):
            subject.train_step()
        peak = torch.cuda.max_memory_allocated(device) - before
        del subject
        torch.cuda.empty_cache()
        return {"mib": peak / 2**20, "method": "cuda max_memory_allocated above the allocation before the build"}
    # A fresh interpreter (not multiprocessing, whose spawn re-imports the caller's main module).
    request = dict(spec=asdict(spec), batch_size=batch_size, precision=precision, threads=threads)
    child = subprocess.run(
        [sys.executable, "-c", _MEMORY_CHILD, json.dumps(request)], capture_output=True, text=True, check=False
    )
    if child.returncode != 0:
        raise RuntimeError(f"the peak-memory process for {spec.describe()} failed:\n{child.stderr[-2000:]}")
    growth, method = json.loads(child.stdout.splitlines()[-1])
    return {"mib": growth, "method": f"{method}, over the build and two training steps"}


_MEMORY_CHILD = """
import json, sys
from vitlab.bench import NetworkSpec, _train_steps_peak_rss_growth_mib
request = json.loads(sys.argv[1])
spec = NetworkSpec(**request.pop("spec"))
print(json.dumps(_train_steps_peak_rss_growth_mib(spec, **request)))
"""


# -------------------------------------------------------------------------------------------------------------------
# The benchmark of a preset
def _check_settings(*, batch_size: int, precision: str, repeats: int, warmup: int) -> None:
    if precision not in PRECISIONS:
        raise ConfigError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    if batch_size < 1:
        raise ConfigError(f"batch size must be at least 1, got {batch_size}")
    if repeats < 1 or warmup < 0:
        raise ConfigError(f"repeats must be >= 1 and warmup >= 0, got repeats={repeats}, warmup={warmup}")


def bench_environment() -> dict[str, Any]:
    """Versions, git revision and hardware of the measurement. Leaner than ``vitlab.training.run.environment``,
    which imports Lightning and torchvision (seconds on a loaded machine) for versions a benchmark does not use."""
    from vitlab.version import __version__

    try:
        revision = subprocess.run(
            ["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5, cwd=Path(__file__).parent
        )
        git = revision.stdout.strip() if revision.returncode == 0 else None
    except (OSError, subprocess.TimeoutExpired):
        git = None
    return {
        "time": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "command": sys.argv,
        "versions": {
            "python": platform.python_version(),
            "vitlab": __version__,
            "torch": torch.__version__,
            "timm": timm.__version__,
        },
        "git_revision": git,
        "hardware": {
            "platform": platform.platform(),
            "cpu_model": _cpu_model() or platform.processor() or platform.machine(),
            "cpu_count": os.cpu_count(),
            "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "torch_threads": torch.get_num_threads(),
            "cuda": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())],
        },
    }


def _cpu_model() -> str | None:
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return None


def bench(
    model: str,
    *,
    overrides: dict[str, Any] | None = None,
    batch_size: int = 64,
    precision: str = "32-true",
    compile: bool = False,
    compile_mode: str | None = None,
    compile_backend: str = "inductor",
    fused: bool | str = "auto",
    vs: str | None = None,
    threads: int | None = 1,
    repeats: int = 5,
    warmup: int = 2,
    sample_seconds: float = 0.5,
    matmul_size: int = 1024,
    device: str = "cpu",
    memory: bool = True,
) -> dict[str, Any]:
    """Benchmark the preset ``model`` (with keyword ``overrides``) alone or, with ``vs="timm"``, next to timm's.

    ``ours`` runs as ``vitlab fit`` trains: AdamW with ``optim.fused=fused`` and, with ``compile``, its blocks
    compiled (``trainer.compile``, mode ``compile_mode``); ``timm`` runs as a timm user's script does by default:
    eager, torch's default AdamW. With ``compile`` the run also times ``ours_eager`` and, with ``vs="timm"``,
    ``timm_compiled`` (``torch.compile`` of the whole network, same mode), all alternating in one process.

    Returns the :func:`measure_networks` record with ``settings``, ``environment``, ``load_average``
    (``os.getloadavg()`` before and after), each network's ``description``, ``runner`` and ``peak_memory`` (when
    ``memory``; eager training steps), and the throughput ratios formed per round, ``{clock: {phase: summary}}``:
    ``ours_over_timm``, and with ``compile`` ``ours_over_ours_eager`` and ``ours_over_timm_compiled``.
    """
    _check_settings(batch_size=batch_size, precision=precision, repeats=repeats, warmup=warmup)
    if vs not in (None, "timm"):
        raise ConfigError(f"--vs compares with 'timm' only, got {vs!r}")
    check_compile_mode(compile_mode)
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"device {device!r} asked for, but torch sees no CUDA device; use --device cpu")
    overrides = dict(overrides or {})
    ours = NetworkSpec("vitlab", model, overrides)
    specs = {"ours": ours}
    compiled = dict(mode=compile_mode, backend=compile_backend)
    runners = {"ours": Runner(compile="blocks", fused=fused, **compiled) if compile else Runner(fused=fused)}
    if compile:
        specs["ours_eager"], runners["ours_eager"] = ours, Runner(fused=fused)
    if vs == "timm":
        specs["timm"], runners["timm"] = timm_counterpart(model, overrides), Runner()
        if compile:
            specs["timm_compiled"], runners["timm_compiled"] = specs["timm"], Runner(compile="model", **compiled)
    settings = dict(
        model=model,
        overrides=overrides,
        batch_size=batch_size,
        precision=precision,
        compile=compile,
        compile_mode=compile_mode,
        compile_backend=compile_backend,
        fused=fused,
        vs=vs,
        threads=threads,
        repeats=repeats,
        warmup=warmup,
        sample_seconds=sample_seconds,
        matmul_size=matmul_size,
        device=device,
    )
    load_before = os.getloadavg()
    with torch_threads(threads):
        peak = {
            name: peak_memory(spec, batch_size=batch_size, precision=precision, device=device, threads=threads)
            for name, spec in specs.items()
            if memory and name in ("ours", "timm")
        }
        networks = {}
        for name, spec in specs.items():
            torch.manual_seed(0)  # the compiled and the eager copy of a network start from the same weights
            networks[name] = spec.build()
        result = measure_networks(
            networks,
            batch_size=batch_size,
            precision=precision,
            device=device,
            runners=runners,
            repeats=repeats,
            warmup=warmup,
            sample_seconds=sample_seconds,
            matmul_size=matmul_size,
        )
        environment = bench_environment()
    for name, spec in specs.items():
        result["networks"][name]["description"] = f"{spec.describe()}, {runners[name].describe()}"
        result["networks"][name]["spec"] = {"source": spec.source, "name": spec.name, "kwargs": spec.kwargs}
        if name in peak:
            result["networks"][name]["peak_memory"] = peak[name]
    for other in ("timm", "ours_eager", "timm_compiled"):
        if other in specs:
            result[f"ours_over_{other}"] = {
                clock: {phase: round_ratio(result, "ours", other, phase, clock) for phase in PHASES}
                for clock in result["clocks"]
            }
    return {
        "benchmark": "bench",
        "settings": settings,
        "load_average": {"before": load_before, "after": os.getloadavg()},
        "environment": environment,
        **result,
    }


def format_bench(result: dict[str, Any]) -> str:
    """A short text table of a :func:`bench` record: medians with [min, max] over the rounds, per clock."""
    s = result["settings"]
    lines = [
        f"{s['model']} {s['overrides'] or ''} batch {s['batch_size']}, {s['precision']}, threads {s['threads']}, "
        f"{s['repeats']} rounds; load average {result['load_average']['before'][0]:.2f} -> "
        f"{result['load_average']['after'][0]:.2f}"
    ]
    lines += [f"  {name}: {net.get('description', name)}" for name, net in result["networks"].items()]
    for clock in result["clocks"]:
        peak = result["matmul_peak"]["flops_per_s"][clock]
        lines += [
            f"[{clock} clock] matmul peak ({result['matmul_peak']['size']}^2, {s['precision']}): "
            f"{peak['median'] / 1e9:.1f} GFLOP/s [{peak['min'] / 1e9:.1f}, {peak['max'] / 1e9:.1f}]",
            f"  {'network':<14} {'params':>9} {'GFLOP/img':>9} {'train img/s':>18} {'MFU':>6} "
            f"{'infer img/s':>20} {'MFU':>6} {'peak MiB':>9}",
        ]
        for name, net in result["networks"].items():
            train, infer = net["train"][clock], net["inference"][clock]
            memory = net.get("peak_memory", {}).get("mib")
            lines.append(
                f"  {name:<14} {net['parameters'] / 1e6:>8.2f}M "
                f"{net['flops_per_image']['forward'] / 1e9:>9.3f} {_spread(train['images_per_s']):>18} "
                f"{train['mfu']['median']:>6.1%} {_spread(infer['images_per_s']):>20} {infer['mfu']['median']:>6.1%} "
                f"{'-' if memory is None else f'{memory:.0f}':>9}"
            )
        for other in ("timm", "ours_eager", "timm_compiled"):
            for phase, ratio in result.get(f"ours_over_{other}", {}).get(clock, {}).items():
                lines.append(
                    f"  ours / {other}, {phase}: {ratio['median']:.3f} (IQR {ratio['q1']:.3f}-{ratio['q3']:.3f}, "
                    f"range {ratio['min']:.3f}-{ratio['max']:.3f})"
                )
    return "\n".join(lines)


def _spread(summary: dict[str, float]) -> str:
    return f"{summary['median']:.1f} [{summary['min']:.1f}-{summary['max']:.1f}]"
