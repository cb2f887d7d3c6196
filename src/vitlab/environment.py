"""The environment of a run or a benchmark: versions, git revision and hardware (a run's ``env.json``).

Probing only; the run directory (:mod:`vitlab.rundir`) decides where the record goes.
"""

from __future__ import annotations

import datetime as _dt
import importlib.metadata
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

from vitlab.machine_cache import cpu_model
from vitlab.version import __version__


def _version(package: str) -> str | None:
    """An installed package's version, read from its metadata (importing Lightning or torchvision takes seconds)."""
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def environment() -> dict[str, Any]:
    """Versions, git revision and hardware: a run's ``env.json``, and the ``environment`` of a benchmark record."""
    import torch

    def git(*args: str) -> str | None:
        try:
            out = subprocess.run(["git", *args], capture_output=True, text=True, timeout=5, cwd=Path(__file__).parent)
            return out.stdout.strip() if out.returncode == 0 else None
        except (OSError, subprocess.TimeoutExpired):
            return None

    return {
        "time": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "command": sys.argv,
        "versions": {
            "python": platform.python_version(),
            "vitlab": __version__,
            "torch": torch.__version__,
            **{name: _version(name) for name in ("torchvision", "timm", "lightning")},
        },
        "git": {"revision": git("rev-parse", "HEAD"), "dirty": bool(git("status", "--porcelain"))},
        "hardware": {
            "platform": platform.platform(),
            "processor": platform.processor() or platform.machine(),
            "cpu_model": cpu_model(),
            "cpu_count": os.cpu_count(),
            "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "torch_threads": torch.get_num_threads(),
            "cuda": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())],
        },
        # the switches vitlab reads from the environment (VITLAB_ATTENTION_PATH, VITLAB_DROPOUT, ...)
        "vitlab_env": {k: v for k, v in sorted(os.environ.items()) if k.startswith("VITLAB_")},
    }
