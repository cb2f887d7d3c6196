"""benchmarks/experiments/gpu_check.sh's CPU dry run: the same code paths as on a GPU, at tiny sizes, without CUDA."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow  # the whole check script in a subprocess
@pytest.mark.skipif(torch.cuda.is_available(), reason="with CUDA the script runs the full check, not the dry run")
def test_gpu_check_without_cuda_says_so_and_dry_runs_every_part(tmp_path):
    env = {**os.environ, "PYTHON": sys.executable, "OMP_NUM_THREADS": "1"}
    child = subprocess.run(
        ["bash", str(ROOT / "benchmarks" / "experiments" / "gpu_check.sh"), str(tmp_path)],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        check=False,
    )
    assert child.returncode == 0, child.stderr[-3000:]
    assert "no CUDA device" in child.stdout
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    assert report["dry_run"] and report["device_name"] == "CPU" and not report["errors"]
    tests = report["tests"]
    assert tests["skipped"] > 5 and tests["passed"] == tests["failed"] == 0 and "no CUDA" in tests["skip_reason"]
    (recipe,) = report["recipe"]
    assert not recipe["compile"] and recipe["precision"] == "bf16-mixed" and recipe["images_per_s_steps"] > 0
    assert recipe["steps"] == 4 and recipe["projected_card_hours_steps"] > 0
    assert [r["settings"]["model"] for r in report["bench"]] == ["vit_pico", "cet_vit_pico"]
    networks = {(row["model"], row["network"]) for row in report["bench_rows"]}
    assert ("vit_pico", "timm_compiled") in networks and ("cet_vit_pico", "ours") in networks
    table = (tmp_path / "gpu_check.md").read_text()
    assert "GPU check: CPU (CPU dry run)" in table and "| vit_pico | bf16-mixed | ours |" in table
    assert (tmp_path / "bench" / "vit_pico_bf16.json").is_file()
    (case,) = report["freezing"]["cases"]  # the freezing benchmark on the plan's device, with its verdicts
    assert case["tokens"] == 4 and {row["path"] for row in case["rows"]} == {
        "one call",
        "one call, no skip",
        "A/A control",
    }
    assert "Freezing (eq. 26" in table and "| 5 | 100% | one call |" in table
