"""A fresh interpreter that runs vitlab and says which deep-learning libraries it imported: what "refused at once" and
"cheap to import" mean as facts a test can check, whatever the machine's load (the times are benchmarks')."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

#: the libraries whose import is what makes a command slow to start
HEAVY = ("torch", "lightning", "torchvision", "timm", "sklearn")
SRC = Path(__file__).parents[1] / "src"
_REPORT = f"print(__import__('json').dumps([m for m in {HEAVY!r} if m in sys.modules]))"


def loaded_after(code: str) -> list[str]:
    """The HEAVY modules a fresh interpreter holds after running ``code``."""
    out = subprocess.run([sys.executable, "-c", f"import sys\n{code}\n{_REPORT}"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.splitlines()[-1])


def vitlab_process(
    args: list[str], *, cwd: Path, env: dict[str, str] | None = None
) -> tuple[subprocess.CompletedProcess, list[str]]:
    """``vitlab ARGS`` in a fresh interpreter (this tree's ``src`` first on the path unless ``env`` says), and the HEAVY
    modules it held when the command returned; the process's stdout is without that last line."""
    env = env or {**os.environ, "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")])}
    code = f"import sys\nfrom vitlab.cli.main import main\ntry:\n    rc = main()\nfinally:\n    {_REPORT}\nsys.exit(rc)"
    out = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, cwd=cwd, env=env)
    *lines, loaded = out.stdout.splitlines() or [""]
    out.stdout = "\n".join(lines)
    return out, json.loads(loaded) if loaded.startswith("[") else list(HEAVY)
