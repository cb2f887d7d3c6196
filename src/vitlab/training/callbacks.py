"""Run-directory plumbing for Lightning: JSON-lines metrics, atomic checkpoints, exact resume, DDP checks."""

from __future__ import annotations

import json
import random
import time
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import numpy as np
import torch
from lightning.fabric.utilities.types import _PATH
from lightning.pytorch.loggers.logger import Logger
from lightning.pytorch.plugins.io import TorchCheckpointIO
from lightning.pytorch.utilities import rank_zero_only

from vitlab.atomic import append_line, staged_file
from vitlab.export import checksum_file, write_checksum
from vitlab.jsonio import strict_dumps
from vitlab.layers import attention_path
from vitlab.rundir import ATTENTION_PATHS_FILE, DDP_CHECK_FILE, STEPS_FILE, TIMING_FILE, atomic_write_text


class AtomicCheckpointIO(TorchCheckpointIO):
    """Checkpoints are written to a temporary file and renamed: a killed run never leaves a truncated ``.ckpt``. Each
    gets a SHA-256 sidecar (:func:`vitlab.export.checksum_file`) that :func:`vitlab.export.read_checkpoint` checks;
    the old one goes first, so a run killed in between leaves a checkpoint without a sidecar, never a wrong one."""

    def save_checkpoint(self, checkpoint: dict[str, Any], path: _PATH, storage_options: Any | None = None) -> None:
        checksum_file(path).unlink(missing_ok=True)
        with staged_file(path) as tmp:
            torch.save(checkpoint, tmp)
        write_checksum(path)

    def remove_checkpoint(self, path: _PATH) -> None:
        super().remove_checkpoint(path)
        checksum_file(path).unlink(missing_ok=True)


STEP_PREFIX = "train_step/"  # per-step values (the task logs them on_step); they go to steps.jsonl


class JSONLinesLogger(Logger):
    """Lightning logger writing one JSON object per epoch to ``metrics.jsonl`` (epoch-level metrics merged), and
    the per-step training values (``train_step/*``, every ``trainer.log_every_n_steps`` steps) to ``steps.jsonl``
    beside it.

    Other step-level values (keys ending in ``_step``) are left to TensorBoard and test-set values to
    ``test_metrics.json``. A line is written when the epoch changes and when training ends, so a resumed run appends
    to the same file. Non-finite values are written as ``null`` (strict JSON).
    """

    def __init__(self, path: str | Path) -> None:
        super().__init__()
        self.path = Path(path)
        self.steps_path = self.path.with_name(STEPS_FILE)
        self._epoch: int | None = None
        self._buffer: dict[str, float] = {}

    @property
    def name(self) -> str:
        return "jsonl"

    @property
    def version(self) -> int:
        return 0

    @rank_zero_only
    def log_hyperparams(self, params: Any, *args: Any, **kwargs: Any) -> None:
        return None

    @rank_zero_only
    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        epoch = metrics.get("epoch")
        per_step = {k[len(STEP_PREFIX) :]: float(v) for k, v in metrics.items() if k.startswith(STEP_PREFIX)}
        if per_step:
            append_line(
                self.steps_path,
                strict_dumps({"step": step, "epoch": None if epoch is None else int(epoch), **per_step}),
            )
        values = {
            k: float(v)
            for k, v in metrics.items()
            if k != "epoch" and not k.endswith("_step") and not k.startswith(("test/", STEP_PREFIX))
        }
        if epoch is None or not values:
            return
        epoch = int(epoch)
        if self._epoch is not None and epoch != self._epoch:
            self._flush()
        self._epoch = epoch
        self._buffer.update(values)
        self._buffer["step"] = step

    def _flush(self) -> None:
        if self._epoch is None or not self._buffer:
            return
        record = {"epoch": self._epoch, **self._buffer}
        append_line(self.path, strict_dumps(record))
        self._buffer = {}

    @rank_zero_only
    def flush(self) -> None:
        """Write the buffered epoch now (called by :class:`FlushMetrics` once the epoch's last values are in)."""
        self._flush()

    @rank_zero_only
    def finalize(self, status: str) -> None:
        self._flush()


class FlushMetrics(pl.Callback):
    """Write each epoch's ``metrics.jsonl`` line as soon as the epoch ends.

    Lightning hands train-epoch values to loggers after the epoch-end hooks of ordinary callbacks, so the line is
    written at the start of the next epoch (or when training ends), not one epoch late.
    """

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        for logger in trainer.loggers:
            if isinstance(logger, JSONLinesLogger):
                logger.flush()


class EpochSeed(pl.Callback):
    """Re-seed every RNG at the start of each epoch from ``(seed, epoch)``.

    The random state an epoch starts from is then a function of the epoch alone, so a run resumed from
    ``last.ckpt`` draws exactly the same augmentations, dropout masks and shuffles as an uninterrupted one.
    """

    def __init__(self, seed: int) -> None:
        self.seed = seed

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        s = (self.seed * 100_003 + trainer.current_epoch * 7919 + trainer.global_rank) % (2**31)
        random.seed(s)
        np.random.seed(s)
        torch.manual_seed(s)


class DDPConsistencyCheck(pl.Callback):
    """After training under several processes, compare a checksum of every parameter across ranks.

    Writes ``ddp_check.json`` (world size, per-rank checksums, ``in_sync``) into the run directory and warns loudly
    when the replicas disagree.
    """

    def __init__(self, run_dir: str | Path) -> None:
        self.run_dir = Path(run_dir)

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.world_size < 2:
            return
        with torch.no_grad():
            local = torch.stack([p.detach().double().sum() for p in pl_module.parameters()])
        gathered = pl_module.all_gather(local).cpu()  # [world, P]
        in_sync = bool((gathered == gathered[0]).all())
        if trainer.is_global_zero:
            record = {"world_size": trainer.world_size, "in_sync": in_sync, "checksums": gathered.sum(1).tolist()}
            atomic_write_text(self.run_dir / DDP_CHECK_FILE, json.dumps(record, indent=2))
            if not in_sync:
                rank_zero_only(print)("WARNING: DDP replicas ended with different weights; see ddp_check.json")


#: :meth:`StepTimer._epoch_sums` key -> the name its time is logged under (``time/<name>_s``, ``time/<name>_total_s``)
_LOGGED_TIMES = {"step_s": "step", "backward_s": "backward", "elapsed_s": "epoch", "wait_s": "data_wait"}


class StepTimer(pl.Callback):
    """Where training time goes: the optimisation steps, and the backward passes inside them.

    Per epoch it logs ``time/step_s`` (the sum over batches from ``on_train_batch_start`` to ``on_train_batch_end``:
    forward, backward and optimiser step, no data loading), ``time/backward_s`` (the sum from ``on_before_backward``
    to ``on_after_backward``) and ``time/epoch_s`` (from the epoch's start to its end: data loading, validation and
    the epoch-end work of the callbacks placed before this one, such as the dynamics controller) and
    ``time/data_wait_s`` (the sum of the gaps from the epoch's start to its first batch and from each batch's end to
    the next one's start: the time the loop waits for the data loader to hand over a batch, with Lightning's own
    per-batch work). The totals over the run go to ``timing.json`` as ``time/step_total_s``,
    ``time/backward_total_s``, ``time/epoch_total_s`` and ``time/data_wait_total_s``, with ``data_wait_share``, the
    share of the epochs' time spent waiting for data; ``vitlab compare`` reads them beside the test metrics.

    Resumed runs continue the totals: they are in the checkpoint, with the sums of an epoch still in progress (a
    checkpoint written at validation end, before the epoch's end, whose end Lightning replays after a resume).

    No per-step host synchronisation: on a CPU the host clock is the device clock; on CUDA each interval is a pair
    of CUDA events, read after one synchronisation at the end of the epoch. Times are rank zero's.
    """

    def __init__(self, run_dir: str | Path) -> None:
        self.run_dir = Path(run_dir)
        self.totals = {
            **{f"time/{name}_total_s": 0.0 for name in _LOGGED_TIMES.values()},
            "data_wait_share": 0.0,
            "epochs": 0,
        }
        self._epoch_t0: float | None = None  # None outside an epoch
        self._reset_epoch(cuda=False)

    def _reset_epoch(self, cuda: bool) -> None:
        self._cuda = cuda
        self._step_s = 0.0
        self._backward_s = 0.0
        self._wait_s = 0.0
        self._batch_end: float | None = None  # host clock at the last batch's end (the epoch's start at first)
        self._pairs: dict[str, list[tuple[Any, Any]]] = {"step": [], "backward": []}
        self._open: dict[str, Any] = {}

    def _start(self, kind: str) -> None:
        if self._cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            self._open[kind] = event
        else:
            self._open[kind] = time.perf_counter()

    def _stop(self, kind: str) -> None:
        start = self._open.pop(kind, None)
        if start is None:
            return
        if self._cuda:
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            self._pairs[kind].append((start, end))
        elif kind == "step":
            self._step_s += time.perf_counter() - start
        else:
            self._backward_s += time.perf_counter() - start

    def _epoch_sums(self) -> dict[str, float]:
        """This epoch's sums so far (on CUDA: one synchronisation to read the events)."""
        if self._cuda and (self._pairs["step"] or self._pairs["backward"]):
            torch.cuda.synchronize()
            self._step_s += sum(s.elapsed_time(e) for s, e in self._pairs["step"]) / 1000.0
            self._backward_s += sum(s.elapsed_time(e) for s, e in self._pairs["backward"]) / 1000.0
            self._pairs = {"step": [], "backward": []}
        elapsed = 0.0 if self._epoch_t0 is None else time.perf_counter() - self._epoch_t0
        return {"step_s": self._step_s, "backward_s": self._backward_s, "elapsed_s": elapsed, "wait_s": self._wait_s}

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._reset_epoch(cuda=pl_module.device.type == "cuda")
        self._epoch_t0 = self._batch_end = time.perf_counter()

    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        if self._batch_end is not None:
            self._wait_s += time.perf_counter() - self._batch_end
        self._start("step")

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        self._stop("step")
        self._batch_end = time.perf_counter()

    def on_before_backward(self, trainer: pl.Trainer, pl_module: pl.LightningModule, loss: torch.Tensor) -> None:
        self._start("backward")

    def on_after_backward(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._stop("backward")

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._epoch_t0 is None:  # an epoch end replayed after a resume, with no epoch in progress restored
            return
        sums = self._epoch_sums()
        self._epoch_t0 = None
        for key, name in _LOGGED_TIMES.items():  # a checkpoint of before the data wait was timed: its total starts at 0
            pl_module.log(f"time/{name}_s", sums[key], on_step=False, on_epoch=True, rank_zero_only=True)
            self.totals[f"time/{name}_total_s"] += sums[key]
        epochs_s = self.totals["time/epoch_total_s"]
        self.totals["data_wait_share"] = self.totals["time/data_wait_total_s"] / epochs_s if epochs_s > 0 else 0.0
        self.totals["epochs"] += 1
        if trainer.is_global_zero:
            atomic_write_text(self.run_dir / TIMING_FILE, strict_dumps(self.totals, indent=2))
            # the attention kernels measured so far (a resumed run takes them up again: the same rounding)
            record = {"forced": attention_path.forced_path(), "decisions": attention_path.decisions()}
            atomic_write_text(self.run_dir / ATTENTION_PATHS_FILE, strict_dumps(record, indent=1))

    def state_dict(self) -> dict[str, Any]:
        return {**self.totals, "in_progress": self._epoch_sums() if self._epoch_t0 is not None else None}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        state = dict(state_dict)
        in_progress = state.pop("in_progress", None)
        self.totals.update(state)
        if in_progress is not None:  # continue the interrupted epoch's sums; its clock restarts now
            self._reset_epoch(cuda=False)
            self._step_s, self._backward_s = in_progress["step_s"], in_progress["backward_s"]
            self._wait_s = in_progress.get("wait_s", 0.0)  # a checkpoint of before the data wait was timed
            self._epoch_t0 = time.perf_counter() - in_progress["elapsed_s"]


class PartStats(pl.Callback):
    """Per-part training curves (where in the model training falls behind): every ``every`` optimisation steps, each
    top-level part's gradient norm and the size of the step the optimiser takes on it.

    A part is a direct child module of the task's model that owns parameters (CET-ViT: ``patch_embed``,
    ``micro_encoder``, ``v_ceo``, ``macro_encoder``, ...; a ViT: ``patch_embed``, ``blocks``, ``head``, ...);
    parameters registered on the model itself (a position embedding, a CLS token) form the part ``_own``. Per epoch
    it logs the mean over the sampled steps of

    - ``parts/<part>/grad_norm``: the L2 norm of the part's gradient before clipping (Lightning's
      ``on_before_optimizer_step`` runs before the gradient is clipped);
    - ``parts/<part>/update_ratio``: ``||w_after - w_before|| / ||w_before||`` over the part's trainable weights,
      the optimiser step including weight decay (a part that learns slowly has a small ratio).

    The sampled steps cost one copy of the trainable weights each; between them nothing is done. The sums stay on
    the device until the epoch ends (no per-step host synchronisation).
    """

    def __init__(self, every: int) -> None:
        if every < 1:
            raise ValueError(f"PartStats needs every >= 1 optimisation steps, got {every}")
        self.every = every
        self._parts: dict[str, list[torch.nn.Parameter]] = {}
        self._before: list[list[torch.Tensor]] | None = None
        self._sums: dict[str, torch.Tensor] = {}
        self._count = 0

    @staticmethod
    def parts(model: torch.nn.Module) -> dict[str, list[torch.nn.Parameter]]:
        """``{part: trainable parameters}`` in module order; ``_own`` for the model's direct parameters."""
        out: dict[str, list[torch.nn.Parameter]] = {}
        own = [p for p in model.parameters(recurse=False) if p.requires_grad]
        if own:
            out["_own"] = own
        for name, child in model.named_children():
            params = [p for p in child.parameters() if p.requires_grad]
            if params:
                out[name] = params
        return out

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._parts = self.parts(getattr(pl_module, "model", pl_module))

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._sums, self._count, self._before = {}, 0, None

    @staticmethod
    def _norm(tensors: list[torch.Tensor]) -> torch.Tensor:
        return torch.linalg.vector_norm(torch.stack(torch._foreach_norm(tensors)))

    def on_before_optimizer_step(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, optimizer: torch.optim.Optimizer
    ) -> None:
        if trainer.global_step % self.every != 0 or not self._parts:
            return
        for name, params in self._parts.items():
            grads = [p.grad.detach() for p in params if p.grad is not None]
            if grads:
                key = f"parts/{name}/grad_norm"
                self._sums[key] = self._sums.get(key, 0) + self._norm(grads)
        self._before = [[p.detach().clone() for p in params] for params in self._parts.values()]

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if self._before is None:
            return
        with torch.no_grad():
            for (name, params), before in zip(self._parts.items(), self._before, strict=True):
                delta = torch._foreach_sub([p.detach() for p in params], before)
                key = f"parts/{name}/update_ratio"
                ratio = self._norm(delta) / self._norm(before).clamp_min(1e-12)
                self._sums[key] = self._sums.get(key, 0) + ratio
        self._before = None
        self._count += 1

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not self._count:
            return
        for key, total in self._sums.items():
            pl_module.log(key, total / self._count, on_step=False, on_epoch=True, rank_zero_only=True)
