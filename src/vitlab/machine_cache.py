"""Choices measured once per machine and kept, so that a seeded run does not depend on the machine's load.

``trainer.attention_path: auto`` (:mod:`vitlab.layers.attention_path`) and ``trainer.precision: auto`` on a CPU
with ``avx512_bf16`` (:func:`vitlab.acceleration.precision.bf16_matmul_speedup`) choose by timing. Timed afresh in every
process, the same seed on the same machine could take another kernel under another load, and end with other
metrics. Here the first measurement of a case on a machine is written to the user's cache folder
(``$VITLAB_CACHE_DIR``, else ``$XDG_CACHE_HOME/vitlab``, else ``~/.cache/vitlab``; ``VITLAB_CACHE_DIR=off``
measures in every process, as before) under a key of the machine (CPU model, GPU, torch version, threads) and the
case, and every later process on that machine reads it back. Two processes that measure one case at once both
keep the value written first (a lock on the cache folder around the read-and-write). A cache that cannot be read
or written is reported once and the process measures on its own.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import platform
from collections.abc import Callable
from pathlib import Path
from typing import Any

from vitlab.atomic import atomic_write_text

log = logging.getLogger(__name__)

ENV_VARIABLE = "VITLAB_CACHE_DIR"
FILE_NAME = "measured_choices.json"
_warned: set[str] = set()


def cache_file() -> Path | None:
    """The cache file, or None when ``VITLAB_CACHE_DIR=off``."""
    folder = os.environ.get(ENV_VARIABLE)
    if folder == "off":
        return None
    if not folder:
        folder = str(Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "vitlab")
    return Path(folder) / FILE_NAME


def cpu_model() -> str:
    """The CPU's model name from ``/proc/cpuinfo``, else what ``platform`` knows of it."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        lines = []
    found = next((line.partition(":")[2].strip() for line in lines if line.startswith("model name")), None)
    return found or platform.processor() or platform.machine()


def machine_key() -> str:
    """What a timing depends on besides the case: the CPU's model, the GPU's, the torch version and the threads."""
    import torch  # here: the run's environment reads cpu_model without loading torch

    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "no gpu"
    return f"{cpu_model()} | {gpu} | torch {torch.__version__} | {torch.get_num_threads()} threads"


def remembered(section: str, case: str, measure: Callable[[], Any]) -> Any:
    """The value kept for ``case`` of ``section`` on this machine, else ``measure()`` (a JSON value), kept for the
    next process (the value written first wins)."""
    path = cache_file()
    if path is None:
        return measure()
    key = json.dumps([machine_key(), section, case])
    try:
        found = _read(path).get(key)
    except (OSError, ValueError) as e:
        _warn(path, e)
        return measure()
    if found is not None:
        return found
    value = measure()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        folder = os.open(path.parent, os.O_RDONLY)  # the folder is the lock: no lock file is left (a full disk)
        try:
            fcntl.flock(folder, fcntl.LOCK_EX)
            entries = _read(path)
            value = entries.setdefault(key, value)
            atomic_write_text(path, json.dumps(entries, indent=1, sort_keys=True) + "\n")
        finally:
            os.close(folder)
    except (OSError, ValueError) as e:
        _warn(path, e)
    return value


def _warn(path: Path, error: Exception) -> None:
    if str(path) not in _warned:
        _warned.add(str(path))
        log.warning("cannot keep measured choices in %s (%s); measuring in this process only", path, error)


def _read(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    entries = json.loads(path.read_text())
    if not isinstance(entries, dict):
        raise ValueError(f"{path} does not hold a JSON object")
    return entries
