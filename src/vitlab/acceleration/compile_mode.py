"""``trainer.compile_mode: auto``: the ``torch.compile`` mode whose training step is fastest on this machine, timed
once and kept (:mod:`vitlab.machine_cache`); docs/benchmarks.md, "Compiled and fused"."""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable
from copy import deepcopy
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from vitlab.acceleration.compiling import check_compile_mode, classifier_objective, compile_options
from vitlab.machine_cache import remembered
from vitlab.models.sizing import input_shape_of, parameter_count

log = logging.getLogger("vitlab.acceleration")

#: the modes ``auto`` times on a CUDA device. Not ``reduce-overhead``: a CUDA graph's outputs are overwritten by its
#: next replay, and Lightning keeps the logged step loss across steps; until that is tested on a GPU, CUDA graphs are
#: an explicit ``trainer.compile_mode`` (``benchmarks/experiments/gpu_speed.py`` times all three)
CUDA_MODE_CANDIDATES: tuple[str, ...] = ("default", "max-autotune-no-cudagraphs")


def choice_line(what: str, value: str, requested: str, reason: str) -> str:
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
        return choice_line("compile mode", self.mode, self.requested, self.reason)


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
            step = torch.compile(classifier_objective, **compile_options(mode, backend, None))
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
