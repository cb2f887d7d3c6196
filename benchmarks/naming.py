"""The one naming scheme of the results files: ``benchmarks/results/<kind>/<what>_<device>_<date>.<ext>``.

``kind`` is ``micro`` or ``experiments`` (the package that wrote it); ``what`` says what was measured
(``freezing_rounds1``, ``table1_digits``); ``device`` is a short name of the machine (``epyc``, ``xeon``, a GPU's
model, or ``cpu`` where the CPU model was not recorded); ``date`` is the day of the measurement (or, for files written
before the scheme, the day of the commit that added them). A per-seed experiment is a folder of that name holding one
``<arm>-seed<k>.json`` per run. Each JSON records its environment (:func:`vitlab.environment.environment`: command,
git revision, CPU, torch version) under ``environment``, or the run's own fields for per-run records.
"""

from __future__ import annotations

import datetime as dt
import os
import re
import subprocess
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
KINDS = ("micro", "experiments")
#: a results entry directly under ``results/<kind>/``: a file, or a folder of per-seed files
NAME = re.compile(r"^(?P<what>[a-z0-9_]+?)_(?P<device>[a-z0-9-]+)_(?P<date>\d{4}-\d{2}-\d{2})(?:\.(?:json|md))?$")


def cpu_model() -> str | None:
    """The CPU's model name from ``lscpu`` (``/proc/cpuinfo`` where lscpu is missing), or None."""
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=5, check=False).stdout
    except (OSError, subprocess.TimeoutExpired):
        out = ""
    for line in out.splitlines():
        if line.startswith("Model name:"):
            return line.split(":", 1)[1].strip()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return None


def device_name(model: str | None) -> str:
    """The ``device`` part of a results name: ``AMD EPYC 9B14`` -> ``epyc``, ``Intel(R) Xeon(R) ...`` -> ``xeon``,
    ``NVIDIA H200`` -> ``nvidia-h200``; ``cpu`` when the model is unknown."""
    if not model:
        return "cpu"
    for family in ("epyc", "xeon"):
        if family in model.lower():
            return family
    return re.sub(r"[^a-z0-9]+", "-", re.sub(r"\(r\)|\(tm\)", "", model.lower())).strip("-") or "cpu"


def results_path(kind: str, what: str, *, device: str = "cpu", suffix: str = ".json") -> Path:
    """Where a new results file goes: ``results/<kind>/<what>_<device>_<today>.json``; ``device="cuda"`` names the
    GPU, ``"cpu"`` the CPU (from lscpu)."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, not {kind!r}")
    if device == "cuda":
        import torch

        machine = device_name(torch.cuda.get_device_name(0))
    else:
        machine = device_name(cpu_model())
    return RESULTS / kind / f"{what}_{machine}_{dt.date.today().isoformat()}{suffix}"


ROOT = RESULTS.parents[1]


def repo_relative(command: list[str] | str | None, root: Path = ROOT) -> list[str] | str | None:
    """A recorded command with every absolute path beside the checkout (under its parent folder: the checkout
    itself, ``../shared``, ``../runs``) written relative to the repository root, also as the value of a
    ``key=value`` override, so that a results file names no one machine's folders; an interpreter
    (``/opt/torch/.venv/bin/python3``) by its name. Other paths (``/tmp``) stay."""
    if command is None:
        return None
    if isinstance(command, str):
        return " ".join(repo_relative(command.split(" "), root))  # type: ignore[arg-type]
    base = root.parent

    def one(arg: str) -> str:
        key, sep, value = arg.rpartition("=") if "=" in arg and not arg.startswith("/") else ("", "", arg)
        path = Path(value)
        if path.is_absolute() and path.is_relative_to(base):
            value = Path(os.path.relpath(path, root)).as_posix()
        elif path.is_absolute() and path.name.startswith("python"):
            value = path.name
        return f"{key}{sep}{value}"

    return [one(arg) for arg in command]
