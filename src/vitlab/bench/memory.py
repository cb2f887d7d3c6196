"""Peak memory of two training steps: CUDA's allocator statistics, or the peak RSS growth of a fresh process."""

from __future__ import annotations

import json
import resource
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from vitlab.bench.specs import NetworkSpec
from vitlab.bench.timing import Subject


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
from vitlab.bench.memory import _train_steps_peak_rss_growth_mib
from vitlab.bench.specs import NetworkSpec
request = json.loads(sys.argv[1])
spec = NetworkSpec(**request.pop("spec"))
print(json.dumps(_train_steps_peak_rss_growth_mib(spec, **request)))
"""
