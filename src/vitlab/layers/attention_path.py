"""Which kernel computes scaled dot-product attention, chosen by measuring the candidates on the case at hand.

``softmax(q k^T * scale + bias) v`` (Vaswani et al. 2017, sec. 3.2.1) has several implementations in torch whose
order of speed depends on the device, the dtype, the shape and whether attention dropout is on. The candidates
(:data:`PATHS`): ``sdpa`` (``F.scaled_dot_product_attention``), ``math`` (SDPA held to its math backend) and
``eager`` (the softmax written out, :func:`vitlab.layers.dropout.dropout` on the probabilities, the one path run with
attention dropout on, so that a seeded run's masks never depend on a timing). :func:`attend` times them on the first
call of each :class:`AttentionKey` and keeps the fastest per machine (:mod:`vitlab.machine_cache`; the timing on the
thread's CPU clock, :func:`cpu_clock`): docs/benchmarks.md, "Experiments faster on the CPU", its paragraph
"The attention path".
:func:`decisions` lists the choices with their timings. :func:`force_attention_path` or the environment variable
``VITLAB_ATTENTION_PATH`` (a name of :data:`PATHS`) holds every call to one path. Under ``torch.compile``,
``torch.fx`` tracing, a dispatch mode (a FLOP counter) or on the meta device nothing is timed and the ``sdpa`` path
runs; ``torch.fx`` records :func:`attend` as one call (timm's ``register_notrace_function``), so a traced graph
chooses when it runs.

:func:`choose_window_attention_path` does the same for timm's Swin ``WindowAttention``, whose own switch
``fused_attn`` picks between SDPA and its eager softmax (with the model's dropout module on the probabilities); with
attention dropout on, its eager softmax runs. While ``torch.export`` (and so ONNX) traces, the path is timm's own
(``use_fused_attn``), the one timm's Swin exports by; while ``torch.fx`` traces, the path the module last ran.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from timm.layers import register_notrace_function, use_fused_attn
from torch import nn
from torch.fx._symbolic_trace import is_fx_symbolic_tracing
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils._python_dispatch import _get_current_dispatch_mode

from vitlab.layers.dropout import dropout
from vitlab.machine_cache import remembered

log = logging.getLogger(__name__)

#: the attention implementations :func:`attend` chooses among (module doc)
PATHS: tuple[str, ...] = ("sdpa", "math", "eager")
#: the environment variable that forces one path
ENV_VARIABLE = "VITLAB_ATTENTION_PATH"
#: timed calls per candidate (after one untimed call); the fastest counts
TIMED_CALLS = 3


@dataclass(frozen=True)
class AttentionKey:
    """What the choice of a path depends on. ``shape``: ``[B, H, N, d]`` of q (of ``x`` for a window attention)."""

    kind: str
    device: str
    dtype: str
    shape: tuple[int, ...]
    dropout: bool
    backward: bool
    bias: bool


_decisions: dict[AttentionKey, str] = {}
_timings: dict[AttentionKey, dict[str, float]] = {}
_forced: str | None = None


def check_path(path: str | None) -> None:
    if path is not None and path not in PATHS:
        raise ValueError(f"attention path must be one of {', '.join(PATHS)}, got {path!r}")


def force_attention_path(path: str | None) -> None:
    """Run every attention through ``path`` (one of :data:`PATHS`), or choose by measurement again (None)."""
    global _forced
    check_path(path)
    _forced = path


@contextlib.contextmanager
def forcing(path: str | None) -> Iterator[None]:
    """:func:`force_attention_path` for a block (None: no change), the previous setting restored after it."""
    previous = _forced
    if path is not None:
        force_attention_path(path)
    try:
        yield
    finally:
        force_attention_path(previous)


def forced_path() -> str | None:
    """The forced path: :func:`force_attention_path`'s, else ``VITLAB_ATTENTION_PATH``'s, else None."""
    path = _forced or os.environ.get(ENV_VARIABLE) or None
    if path is not None and path not in PATHS:
        raise ValueError(f"{ENV_VARIABLE}={path!r} is not an attention path; set it to one of {', '.join(PATHS)}")
    return path


def decisions() -> list[dict]:
    """Every key decided in this process: the key's fields, the ``path`` chosen and ``seconds`` per candidate."""
    return [{**asdict(key), "path": path, "seconds": _timings.get(key, {})} for key, path in _decisions.items()]


def load_decisions(records: list[dict]) -> int:
    """Take the decisions of :func:`decisions` records (a run's ``attention_paths.json``) as this process's, so a
    resumed run computes every attention of a known key by the path it used before; returns how many were taken."""
    fields = set(AttentionKey.__dataclass_fields__)
    taken = 0
    for record in records:
        if record.get("path") not in PATHS or not fields <= set(record):
            continue
        values = {name: record[name] for name in fields}
        key = AttentionKey(**{**values, "shape": tuple(values["shape"])})
        _decisions[key] = record["path"]
        _timings[key] = dict(record.get("seconds") or {})
        taken += 1
    return taken


def clear_decisions() -> None:
    """Forget the decisions, so the next call of each key measures again."""
    _decisions.clear()
    _timings.clear()


def run_path(
    path: str,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    bias: torch.Tensor | None,
    *,
    scale: float,
    dropout_p: float,
) -> torch.Tensor:
    """Attention of ``q, k, v: [B, H, N, d]`` (``bias`` broadcast to ``[B, H, N, N]`` or None) by ``path``."""
    if path == "sdpa":
        return F.scaled_dot_product_attention(q, k, v, attn_mask=bias, dropout_p=dropout_p, scale=scale)
    if path == "math":
        with sdpa_kernel(SDPBackend.MATH):
            return F.scaled_dot_product_attention(q, k, v, attn_mask=bias, dropout_p=dropout_p, scale=scale)
    logits = (q * scale) @ k.transpose(-2, -1)
    if bias is not None:
        logits = logits + bias
    return dropout(logits.softmax(dim=-1), dropout_p) @ v


@register_notrace_function  # torch.fx (timm's fx feature extraction) keeps the call; the choice runs with the graph
def attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    scale: float,
    dropout_p: float = 0.0,
) -> torch.Tensor:
    """``softmax(q k^T * scale + bias) v`` with dropout ``dropout_p`` on the probabilities, by the path chosen for
    this call's :class:`AttentionKey` (module doc). ``q, k, v: [B, H, N, d] -> [B, H, N, d]``."""
    path = forced_path() or ("eager" if dropout_p > 0 else None if _measurable(q) else "sdpa")
    if path is None:
        backward = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))
        key = AttentionKey(
            "sdpa", q.device.type, str(q.dtype), tuple(q.shape), dropout_p > 0, backward, bias is not None
        )
        path = _decisions.get(key)
        if path is None:
            inputs = [t.detach().clone().requires_grad_(backward) for t in (q, k, v)]
            detached = None if bias is None else bias.detach()

            def candidate(name: str) -> Callable[[], torch.Tensor]:
                return lambda: run_path(name, *inputs, detached, scale=scale, dropout_p=dropout_p)

            path = _decide(key, {name: candidate(name) for name in PATHS}, inputs if backward else None)
    return run_path(path, q, k, v, bias, scale=scale, dropout_p=dropout_p)


def cpu_clock() -> Callable[[], float]:
    """The clock a timing reads: with one intra-op thread the calling thread's CPU time (all the work is on it, and
    other processes on a shared machine do not count), else the wall clock."""
    return time.thread_time if torch.get_num_threads() == 1 else time.perf_counter


def _measurable(x: torch.Tensor) -> bool:
    """Whether timing candidates on ``x`` means anything: not while compiling or ``torch.fx`` tracing, not under a
    dispatch mode (a FLOP counter would count every candidate) or a torch-function mode (an explanation's relevance
    rules: what they time is not the kernel, and the choice would be kept for the machine), not on the meta device."""
    if torch.compiler.is_compiling() or is_fx_symbolic_tracing() or torch._C._len_torch_function_stack() > 0:
        return False
    return not (_get_current_dispatch_mode() is not None or x.device.type == "meta")


def _decide(
    key: AttentionKey, candidates: dict[str, Callable[[], torch.Tensor]], inputs: list[torch.Tensor] | None
) -> str:
    """The fastest candidate for ``key`` (forward, and backward to ``inputs`` when given), measured once per machine
    (:func:`vitlab.machine_cache.remembered`) and recorded for the process."""
    case = json.dumps(asdict(key), sort_keys=True)
    path, seconds = remembered("attention_path", case, lambda: _time(key, candidates, inputs))
    _decisions[key], _timings[key] = path, seconds
    log.info("attention path %s for %s (seconds per call: %s)", path, key, seconds)
    return path


def _time(
    key: AttentionKey, candidates: dict[str, Callable[[], torch.Tensor]], inputs: list[torch.Tensor] | None
) -> tuple[str, dict[str, float]]:
    """Time each candidate; the fastest and every candidate's seconds."""
    device = torch.device(key.device)
    cuda = [device.index or 0] if device.type == "cuda" else []
    seconds = {}
    # The timing graphs are the measurement's own: identity saved-tensor hooks keep them out of an enclosing
    # activation checkpoint (whose recomputation, with the decision cached, would save fewer tensors), and the
    # random generators are restored (the CPU's, and the CUDA device's).
    identity = torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t)
    with torch.random.fork_rng(devices=cuda), identity:
        for name, forward in candidates.items():

            def call(forward: Callable[[], torch.Tensor] = forward) -> None:
                out = forward()
                if inputs is not None:
                    torch.autograd.grad(out, inputs, torch.ones_like(out), allow_unused=True)

            call()
            best = float("inf")
            clock = cpu_clock()
            for _ in range(TIMED_CALLS):
                if cuda:
                    torch.cuda.synchronize(device)
                start = clock()
                call()
                if cuda:
                    torch.cuda.synchronize(device)
                best = min(best, clock() - start)
            seconds[name] = best
    return min(seconds, key=seconds.get), seconds


# -------------------------------------------------------------------------------------------------------------------
# timm's Swin window attention
def choose_window_attention_path(module: nn.Module, args: tuple) -> None:
    """Forward pre-hook for timm's ``WindowAttention``: set its ``fused_attn`` (SDPA, or its eager softmax) to the
    faster for this call's key. A forced ``eager`` or ``math`` path gives the eager softmax, ``sdpa`` SDPA."""
    if getattr(module, "_choosing_path", False) or is_fx_symbolic_tracing():  # fx: the graph keeps the last path
        return
    if torch.compiler.is_exporting():  # timm's own choice, the path timm's Swin exports by (ONNX with autograd on)
        module.fused_attn = use_fused_attn(experimental=True)
        return
    dropout_on = module.attn_drop.p > 0 and module.training
    path = forced_path() or ("eager" if dropout_on else None if _measurable(args[0]) else "sdpa")
    if path is None:
        x, mask = args[0], args[1] if len(args) > 1 else None
        backward = torch.is_grad_enabled() and module.training
        dtype = torch.get_autocast_dtype(x.device.type) if torch.is_autocast_enabled(x.device.type) else x.dtype
        key = AttentionKey("window", x.device.type, str(dtype), tuple(x.shape), False, backward, mask is not None)
        path = _decisions.get(key)
        if path is None:
            inputs = [x.detach().clone().requires_grad_(backward)]
            detached = None if mask is None else mask.detach()

            def candidate(fused: bool) -> Callable[[], torch.Tensor]:
                def run() -> torch.Tensor:
                    module.fused_attn, module._choosing_path = fused, True
                    try:
                        return module(inputs[0], detached)
                    finally:
                        module._choosing_path = False

                return run

            path = _decide(key, {"sdpa": candidate(True), "eager": candidate(False)}, inputs if backward else None)
    module.fused_attn = path == "sdpa"
