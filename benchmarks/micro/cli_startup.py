"""How long the ``vitlab`` command takes to answer when it needs no deep-learning library: ``list-models``, a typo in
a run config, and a ``dynamics.mode`` on a model without a temperature, each in a fresh interpreter.

The tests check what makes these fast (torch, Lightning and timm are never imported:
``tests/process_fixtures.py``); the seconds themselves depend on the machine and its load, so they live here,
with the load average beside them. Run from the repository root::

    python -m benchmarks.micro.cli_startup --repeats 5

Writes ``benchmarks/results/micro/cli_startup_<device>_<date>.json`` (or ``--out``): the wall seconds of every
repeat per case, the command, git revision and CPU.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from vitlab.atomic import atomic_write_text
from vitlab.environment import environment
from vitlab.jsonio import strict_dumps

if __package__ in (None, ""):  # run as a file: the suite is imported from the repository root
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.naming import repo_relative, results_path

#: case -> the command's arguments and the exit code it must give
CASES = {
    "list_models": (["list-models"], 0),
    "typo_refused": (["fit", "--config", "vitcae/digits", "model.depthh=2"], 2),
    "tau_mode_refused": (["fit", "--config", "vit/digits", "dynamics.mode=learn"], 2),
}


def seconds(args: list[str], code: int, folder: Path) -> float:
    """Wall seconds of ``vitlab ARGS`` in a fresh interpreter, from its start to its exit."""
    start = time.perf_counter()
    out = subprocess.run([sys.executable, "-m", "vitlab.cli.main", *args], capture_output=True, text=True, cwd=folder)
    elapsed = time.perf_counter() - start
    if out.returncode != code:
        raise SystemExit(f"vitlab {' '.join(args)} exited {out.returncode}, not {code}: {out.stderr[-2000:]}")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", default=str(results_path("micro", "cli_startup")))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        times = {case: [] for case in CASES}
        load = [os.getloadavg()[0]]
        for _ in range(args.repeats):  # the cases in turn, so that a change of load reaches each
            for case, (argv, code) in CASES.items():
                times[case].append(seconds(argv, code, Path(folder)))
            load.append(os.getloadavg()[0])
    result = {
        "experiment": "cli-startup",
        "cases": {c: {"argv": CASES[c][0], "seconds": t, "median": statistics.median(t)} for c, t in times.items()},
        "load_average_1min": load,
        "environment": {**environment(), "command": ["python", *repo_relative(sys.argv)]},
    }
    atomic_write_text(Path(args.out), strict_dumps(result, indent=2) + "\n")
    for case, row in result["cases"].items():
        print(f"{case:18s} median {row['median']:.2f} s  {[round(t, 2) for t in row['seconds']]}")


if __name__ == "__main__":
    main()
