"""`vitlab list-models` reads the torch-free catalogue: under a second from the shell, and torch is never imported."""

import subprocess
import sys
import time

CODE = (
    "import sys\nfrom vitlab.cli.main import main\nstatus = main(['list-models'])\n"
    "print('torch imported' if 'torch' in sys.modules else 'no torch')\nsys.exit(status)"
)


def test_list_models_runs_in_under_a_second_without_torch():
    start = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, timeout=60)
    elapsed = time.perf_counter() - start
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[-1] == "no torch"
    assert any(line.startswith("vit_nano ") for line in lines) and any(line.startswith("swin_pico ") for line in lines)
    assert elapsed < 1.0, f"vitlab list-models took {elapsed:.2f} s"
