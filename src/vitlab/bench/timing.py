"""Timing: networks and a matrix-multiply peak measured alternately, round after round, and summarised per round."""

from __future__ import annotations

import contextlib
import functools
import random
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

import torch
from torch import nn

from vitlab.acceleration.compile_mode import choose_compile_mode
from vitlab.acceleration.compiling import classifier_objective, compiled_objective
from vitlab.acceleration.optim import adamw
from vitlab.bench.flops import training_flops_per_image
from vitlab.bench.specs import CLOCKS, PHASES, check_settings
from vitlab.family import family_of, resolve
from vitlab.models.sizing import input_shape_of, parameter_count
from vitlab.progress import progress


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
    """How a network is run: ``compile`` ``"none"`` (eager), ``"trainer"`` (vitlab's ``trainer.compile``: the network
    whole with its loss in one graph, :func:`vitlab.acceleration.compiling.compiled_objective`) or ``"model"``
    (``torch.compile`` of the network, the loss eager: what a timm user writes), with ``mode`` (``auto``:
    :func:`vitlab.acceleration.compile_mode.choose_compile_mode`) and ``backend``; ``fused``: AdamW's implementation
    (``"auto"``, ``True``, ``False``: torch's default, :func:`vitlab.acceleration.optim.adamw`); ``grad_clip``: the
    gradient-norm clipping before each step (``vitlab fit``'s ``optim.grad_clip``; None: none, a timm script's
    default)."""

    compile: Literal["none", "trainer", "model"] = "none"
    mode: str | None = None
    backend: str = "inductor"
    fused: bool | str = False
    grad_clip: float | None = None

    def describe(self) -> str:
        how = {"none": "eager", "trainer": "compiled whole with its loss", "model": "torch.compile(model)"}[
            self.compile
        ]
        if self.compile != "none" and self.mode not in (None, "default"):
            how += f" ({self.mode})"
        clip = "" if self.grad_clip is None else f", grad-norm clip {self.grad_clip:g}"
        return f"{how}, AdamW {'fused=' + str(self.fused) if self.fused is not False else 'torch default'}{clip}"


def bench_objective(network: nn.Module) -> Callable[..., torch.Tensor] | None:
    """The training loss of ``network``'s family (:attr:`vitlab.family.Family.bench_objective`), or None: the
    cross-entropy of the output."""
    family = family_of(network)
    return resolve(family.bench_objective) if family is not None and family.bench_objective else None


def objective_name(network: nn.Module) -> str:
    """What the timed training step's loss is: the family's objective by name, or ``cross_entropy``."""
    objective = bench_objective(network)
    return "cross_entropy" if objective is None else f"{objective.__module__}.{objective.__qualname__}"


def _cross_entropy(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """The cross-entropy of ``model(x)``'s logits against ``y``
    (:func:`vitlab.acceleration.compiling.classifier_objective`)."""
    return classifier_objective(model, x, y)[1]


class Subject:
    """One network under measurement: the (optionally compiled) module and loss, its AdamW, a fixed batch, targets."""

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
        # a family's training loss, its regulariser included (e.g. CET-ViT's EI), else the cross-entropy
        objective = bench_objective(self.network) or _cross_entropy
        self.runnable, self.loss = self.network, functools.partial(objective, self.network)
        if runner.compile != "none":
            how = dict(batch_size=batch_size, precision=precision, device=device, backend=runner.backend)
            mode = choose_compile_mode(runner.mode, self.network, **how).mode
            options = dict(mode=None if mode == "default" else mode, backend=runner.backend)
        if runner.compile == "trainer":
            self.loss = compiled_objective(self.network, objective, **options)
        elif runner.compile == "model":
            self.runnable = torch.compile(self.network, **options)
            self.loss = functools.partial(objective, self.runnable)
        self.optimizer = adamw(list(self.network.parameters()), lr=1e-4, weight_decay=0.05, fused=runner.fused)
        self.grad_clip = runner.grad_clip

    def train_step(self) -> None:
        self.network.train()
        self.optimizer.zero_grad(set_to_none=True)
        with autocast(self.precision, self.device):
            loss = self.loss(self.x, self.y)
        loss.backward()
        if self.grad_clip is not None:
            nn.utils.clip_grad_norm_(self.network.parameters(), self.grad_clip)
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
    for _, task in progress(tasks.items(), "vitlab bench: warm-up", name=lambda item: item[0]):
        per_call = min(_time_calls(task.run, 1, device)["wall"] for _ in range(max(warmup, 1)))
        task.calls = max(1, round(sample_seconds / per_call))
    order = list(tasks)
    for round_index in progress(range(repeats), "vitlab bench: timing round"):
        for name in order if round_index % 2 == 0 else reversed(order):
            for clock, seconds in _time_calls(tasks[name].run, tasks[name].calls, device).items():
                tasks[name].seconds[clock].append(seconds)


def quartile_summary(values: list[float]) -> dict[str, float]:
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


def bootstrap_median(values: list[float], resamples: int = 2000, seed: int = 0) -> tuple[float, float, float]:
    """The median of ``values`` and a 95% percentile-bootstrap interval for it (Efron & Tibshirani 1993, ch. 13:
    ``resamples`` resamples of the rounds with replacement, the 2.5th and 97.5th percentiles of their medians)."""
    rng = random.Random(seed)
    medians = sorted(statistics.median(rng.choices(values, k=len(values))) for _ in range(resamples))
    return statistics.median(values), medians[int(0.025 * resamples)], medians[int(0.975 * resamples) - 1]


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
    with ``compile=True`` as ``torch.compile`` of the network).

    Returns ``{"clocks", "matmul_peak": {"size", "precision", "flops_per_s": {clock: summary}}, "networks": {name:
    {"parameters", "flops_per_image", "train": {clock: ...}, "inference": {clock: ...}}}}`` plus, for bf16 runs,
    ``"matmul_peak_fp32"``. Clocks: ``wall`` and, on CPU, ``cpu`` (process CPU time, see :data:`CLOCKS`). Each
    phase and clock holds ``images_per_s`` and ``mfu`` (and ``mfu_vs_fp32_peak`` for bf16) summaries over the
    rounds, and the raw ``seconds_per_batch`` per round, in round order, for :func:`round_ratio`.
    """
    check_settings(batch_size=batch_size, precision=precision, repeats=repeats, warmup=warmup)
    device = torch.device(device)
    clocks = CLOCKS if device.type == "cpu" else ("wall",)  # CUDA runs asynchronously: the host's CPU time is no clock
    flops = {name: training_flops_per_image(network.to(device)) for name, network in networks.items()}
    peak_precisions = [precision] if precision == "32-true" else [precision, "32-true"]
    matmuls = {p: _Matmul(matmul_size, p, device) for p in peak_precisions}
    default = Runner(compile="model") if compile else Runner()
    runners = {name: (runners or {}).get(name, default) for name in networks}
    tasks = _timing_tasks(networks, runners, matmuls, batch_size=batch_size, precision=precision, device=device)
    _measure_alternating(tasks, repeats=repeats, warmup=warmup, sample_seconds=sample_seconds, device=device)
    peak_flops, peaks = _matmul_peaks(tasks, matmuls, precision, clocks, matmul_size)
    seconds = {
        name: {phase: {clock: tasks[f"{name} {phase}"].seconds[clock] for clock in clocks} for phase in PHASES}
        for name in networks
    }
    networks_record = {
        name: _network_record(network, runners[name], flops[name], seconds[name], batch_size, precision, peak_flops)
        for name, network in networks.items()
    }
    return {"clocks": list(clocks), **peaks, "networks": networks_record}


def _timing_tasks(
    networks: dict[str, nn.Module], runners: dict[str, Runner], matmuls: dict[str, _Matmul], **subject: Any
) -> dict[str, _Task]:
    """What :func:`measure_networks` times in turn: each matmul peak, each network's training step and inference
    (``subject``: the :class:`Subject` keywords ``batch_size``, ``precision``, ``device``)."""
    tasks = {f"matmul {p}": _Task(matmul) for p, matmul in matmuls.items()}
    for name, network in networks.items():
        timed = Subject(network, **subject, runner=runners[name])
        tasks[f"{name} train"] = _Task(timed.train_step)
        tasks[f"{name} inference"] = _Task(timed.inference)
    return tasks


def _matmul_peaks(
    tasks: dict[str, _Task], matmuls: dict[str, _Matmul], precision: str, clocks: tuple[str, ...], size: int
) -> tuple[dict[tuple[str, str], list[float]], dict[str, Any]]:
    """The matmul peak per round, ``{(precision, clock): [flops/s]}``, and its records: ``matmul_peak`` (the run's
    precision) and, for a bf16 run, ``matmul_peak_fp32``, each summarised per clock."""
    peak_flops = {
        (p, clock): [matmul.flops / s for s in tasks[f"matmul {p}"].seconds[clock]]
        for p, matmul in matmuls.items()
        for clock in clocks
    }
    records = {
        "matmul_peak" if p == precision else "matmul_peak_fp32": {
            "size": size,
            "precision": p,
            "flops_per_s": {clock: quartile_summary(peak_flops[p, clock]) for clock in clocks},
        }
        for p in matmuls
    }
    return peak_flops, records


def _network_record(
    network: nn.Module,
    runner: Runner,
    flops: dict[str, Any],
    seconds: dict[str, dict[str, list[float]]],
    batch_size: int,
    precision: str,
    peak_flops: dict[tuple[str, str], list[float]],
) -> dict[str, Any]:
    """One network's entry of :func:`measure_networks`: what it is, and per phase and clock its throughput and MFU
    over the rounds from ``seconds[phase][clock]`` (seconds per batch, per round)."""
    entry: dict[str, Any] = {
        "parameters": parameter_count(network),
        "flops_per_image": flops,
        "runner": {**asdict(runner), "description": runner.describe()},
        "objective": objective_name(network),
    }
    for phase in PHASES:
        work = flops["training" if phase == "train" else "forward"] * batch_size
        entry[phase] = {}
        for clock, per_batch in seconds[phase].items():
            measured = {
                "images_per_s": quartile_summary([batch_size / s for s in per_batch]),
                "mfu": _mfu(work, per_batch, peak_flops[precision, clock]),
                "seconds_per_batch": per_batch,
            }
            if precision != "32-true":
                measured["mfu_vs_fp32_peak"] = _mfu(work, per_batch, peak_flops["32-true", clock])
            entry[phase][clock] = measured
    return entry


def _mfu(work: float, seconds: list[float], peaks: list[float]) -> dict[str, float]:
    """Per round: ``work`` FLOPs in ``seconds`` over the matmul FLOP/s of the same round."""
    return quartile_summary([work / s / peak for s, peak in zip(seconds, peaks, strict=True)])


def round_ratio(
    result: dict[str, Any], numerator: str, denominator: str, phase: str, clock: str = "wall"
) -> dict[str, float]:
    """Throughput of ``numerator`` over ``denominator`` in ``phase`` on ``clock``, formed per round, summarised
    over the rounds (``>= 1``: the numerator is at least as fast)."""
    top = result["networks"][numerator][phase][clock]["seconds_per_batch"]
    bottom = result["networks"][denominator][phase][clock]["seconds_per_batch"]
    return quartile_summary([b / t for t, b in zip(top, bottom, strict=True)])
