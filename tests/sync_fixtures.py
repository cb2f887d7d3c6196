"""Counting host synchronisations on a CPU: the operations that make the host wait for a CUDA device.

On CUDA, ``torch.cuda.set_sync_debug_mode`` sees every synchronisation; on a CPU there is none to see, but the
operations that cause one can still be counted as they are dispatched. :class:`HostSyncCounter` is a
``TorchDispatchMode`` that records each such operation with the code that called it, and
:class:`CountSyncsPerPhase` a Lightning callback that runs one through a ``fit`` and files each operation under
the phase it happened in: a training step, a validation step, or the rest (epoch starts and ends).
"""

from __future__ import annotations

import traceback
from collections import Counter
from typing import Any

import lightning.pytorch as pl
import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

aten = torch.ops.aten

#: operations that wait for the device on CUDA: reading a value (``.item()``, ``bool(t)``, ``float(t)``, ``if t:``),
#: an output whose size depends on the values (``nonzero``, ``unique``, ...), a linear-algebra routine that checks
#: its result on the host (cuSOLVER's SVD checks convergence), and a tensor made from host data
#: (``torch.tensor(values, device=cuda)`` is a blocking copy; ``torch.full`` is not)
SYNCING = {
    aten._local_scalar_dense.default: "read a value",
    aten.nonzero.default: "nonzero",
    aten.masked_select.default: "masked_select",
    aten._unique2.default: "unique",
    aten.unique_consecutive.default: "unique_consecutive",
    aten.unique_dim.default: "unique",
    aten.repeat_interleave.Tensor: "repeat_interleave",
    aten.bincount.default: "bincount",
    aten.equal.default: "torch.equal",
    aten.is_nonzero.default: "is_nonzero",
    aten._linalg_svd.default: "SVD",
    aten._linalg_eigh.default: "eigh",
    aten.linalg_eig.default: "eig",
    aten._linalg_check_errors.default: "linalg error check",
    aten.lift_fresh.default: "tensor from host data",
}
#: reads that vitlab's code makes on a CPU only (on CUDA it keeps the value on the device): the finite-loss check
CPU_ONLY_CALLERS = ("(_stop_if_not_finite)",)


#: indexing that takes boolean masks (``x[mask]``, ``x[mask] = v``): a ``nonzero`` on CUDA
MASK_INDEXING = (aten.index.Tensor, aten.index_put.default, aten.index_put_.default)


def _is_mask(index: torch.Tensor | None) -> bool:
    return isinstance(index, torch.Tensor) and index.dtype == torch.bool


def _caller() -> str:
    """The innermost frame outside torch and this module, as ``path:line (function)``."""
    for frame in reversed(traceback.extract_stack()[:-2]):
        name = frame.filename.replace("\\", "/")
        if "/torch/" in name or name.endswith("sync_fixtures.py"):
            continue
        return f"{name.split('/site-packages/')[-1].split('/src/')[-1]}:{frame.lineno} ({frame.name})"
    return "?"


#: tensor methods that copy to the host (no-ops on a CPU tensor, so no operation is dispatched for them). A
#: ``.to(device)`` is not among them: on a CPU it cannot tell a copy to the host from a move to the training device.
TO_HOST = {torch.Tensor.tolist: "tolist", torch.Tensor.numpy: "numpy", torch.Tensor.cpu: "copy to the host"}


class _FunctionLevel(TorchFunctionMode):
    """What the dispatched operations do not show on a CPU: the copies to the host of :data:`TO_HOST` (nothing to
    dispatch for a tensor already there) and the class check that ``F.one_hot`` makes on a CPU only (on CUDA, with
    ``num_classes`` given, it reads nothing back: an out-of-range class fails in the kernel instead)."""

    def __init__(self, counter: HostSyncCounter) -> None:
        super().__init__()
        self.counter = counter
        self.one_hot_depth = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in TO_HOST:
            self.counter.record(TO_HOST[func])
        classes = args[1] if len(args) > 1 else kwargs.get("num_classes", -1)
        if func is not torch.nn.functional.one_hot or classes < 0:
            return func(*args, **kwargs)
        self.one_hot_depth += 1
        try:
            return func(*args, **kwargs)
        finally:
            self.one_hot_depth -= 1


class HostSyncCounter(TorchDispatchMode):
    """Records the dispatched operations of :data:`SYNCING`, boolean-mask indexing (``x[mask]``: a ``nonzero`` on
    CUDA) and the copies to the host of :data:`TO_HOST` as ``events``: ``(phase, what, caller)``,
    ``phase`` being whatever the attribute says at the time. What a CPU alone reads (``F.one_hot``'s class check,
    :data:`CPU_ONLY_CALLERS`) is left out."""

    def __init__(self) -> None:
        super().__init__()
        self.phase = "other"
        self.events: list[tuple[str, str, str]] = []
        self._functions = _FunctionLevel(self)

    def __enter__(self) -> HostSyncCounter:
        self._functions.__enter__()
        return super().__enter__()

    def __exit__(self, *exc: Any) -> None:
        super().__exit__(*exc)
        self._functions.__exit__(*exc)

    def record(self, what: str) -> None:
        caller = _caller()
        if not caller.endswith(CPU_ONLY_CALLERS):
            self.events.append((self.phase, what, caller))

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        what = SYNCING.get(func)
        if what is None and func in MASK_INDEXING and any(_is_mask(i) for i in args[1]):
            what = "boolean-mask indexing"
        if what is not None and not (what == "read a value" and self._functions.one_hot_depth):
            self.record(what)
        return func(*args, **(kwargs or {}))

    def count(self, phase: str) -> int:
        return sum(1 for p, _, _ in self.events if p == phase)

    def summary(self, phase: str) -> Counter:
        """``{(what, caller): times}`` in ``phase``."""
        return Counter((what, caller) for p, what, caller in self.events if p == phase)


class CountSyncsPerPhase(pl.Callback):
    """A :class:`HostSyncCounter` from the start of ``fit`` to its end, with the phases ``first_train_step`` (the
    first batch, where Lightning registers what the task logs), ``train_step`` (every later batch, from batch start
    to batch end: forward, backward, optimiser step and the task's logging), ``first_val_step``, ``val_step`` and
    ``other`` (epoch starts and ends, the loops' set-up, checkpoints). ``train_steps`` and ``val_steps`` count the
    batches."""

    def __init__(self) -> None:
        self.counter = HostSyncCounter()
        self.train_steps = 0
        self.val_steps = 0

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.counter.__enter__()

    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.counter.__exit__(None, None, None)

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, *args: Any) -> None:
        self.counter.phase = "train_step" if self.train_steps else "first_train_step"
        self.train_steps += 1

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, *args: Any) -> None:
        self.counter.phase = "other"

    def on_validation_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, *args: Any) -> None:
        self.counter.phase = "val_step" if self.val_steps else "first_val_step"
        self.val_steps += 1

    def on_validation_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, *args: Any) -> None:
        self.counter.phase = "other"
