"""``torch.compile`` of a network, whole (one graph of its forward, with its loss where a task asks) and block by
block (PyTorch's "regional compilation", for what runs outside that graph); docs/benchmarks.md, "Compiled and fused".

The state-dict keys do not change; a network runs eager while an attention captures its matrix or has frozen heads
(ViTCAE eq. 26), its other blocks compiled.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from vitlab.errors import ConfigError
from vitlab.layers.attention import Attention
from vitlab.layers.capture import is_attention
from vitlab.models.protocols import AttentionBlocks, HeadFreezing, SlotAssigner

log = logging.getLogger("vitlab.acceleration")  # the package's one logger

#: ``torch.compile`` modes (``None``: the default mode)
COMPILE_MODES: tuple[str, ...] = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


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


def compile_options(mode: str | None, backend: str, dynamic: bool | None) -> dict[str, Any]:
    """``torch.compile``'s keyword arguments for a resolved ``mode`` (``default``: torch's None)."""
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
    :func:`~vitlab.acceleration.compile_mode.choose_compile_mode` first); ``backend``: ``"inductor"`` (the default,
    generated kernels), ``"aot_eager"`` (traced, run by eager kernels: what the tests use, since it compiles in a
    second). ``dynamic``: torch's default
    (None) compiles for the first shapes seen and, at the first change (the last batch of an epoch, an evaluation
    batch size), once more with those sizes symbolic, so the recompilations stay few.
    """
    options = compile_options(mode, backend, dynamic)
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
    compiled = torch.compile(objective, **compile_options(mode, backend, dynamic))
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
