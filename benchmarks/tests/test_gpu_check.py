"""The CPU dry runs of benchmarks/experiments/gpu_check.sh and gpu_speed.sh: the code paths a GPU session runs, at
tiny sizes, without CUDA."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]


def _dry_run(script: str, out, **env) -> None:
    """``bash benchmarks/experiments/<script> <out>`` without CUDA: it says so and its dry run succeeds."""
    env = {**os.environ, "PYTHON": sys.executable, "OMP_NUM_THREADS": "1", **env}
    child = subprocess.run(
        ["bash", str(ROOT / "benchmarks" / "experiments" / script), str(out)],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        check=False,
    )
    assert child.returncode == 0, child.stderr[-3000:]
    assert "no CUDA device" in child.stdout


@pytest.mark.slow  # the whole check script in a subprocess
@pytest.mark.skipif(torch.cuda.is_available(), reason="with CUDA the script runs the full check, not the dry run")
def test_gpu_check_without_cuda_says_so_and_dry_runs_every_part(tmp_path):
    _dry_run("gpu_check.sh", tmp_path)
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


@pytest.mark.slow  # the whole script in a subprocess
@pytest.mark.skipif(torch.cuda.is_available(), reason="with CUDA the script measures, it does not dry-run")
def test_gpu_speed_without_cuda_says_so_and_dry_runs_every_part(tmp_path):
    _dry_run("gpu_speed.sh", tmp_path / "results", VITLAB_CACHE_DIR=str(tmp_path / "cache"))
    (folder,) = (tmp_path / "results").iterdir()
    assert folder.name.startswith("gpu_speed_dryrun_")  # never mistaken for a GPU's results
    report = json.loads((folder / "gpu_speed.json").read_text())
    assert report["dry_run"] and not report["errors"] and not report["skipped"]
    networks = {(row["model"], row["network"]) for row in report["bench_rows"]}
    assert networks == {("vit_pico", name) for name in ("ours", "ours_eager", "timm", "timm_compiled")}
    (record,) = report["bench"]
    assert record["networks"]["ours"]["runner"]["compile"] == "trainer" and record["settings"]["batch_size"] == 4
    assert [run["source"] for run in report["fit"]] == ["npz", "imagefolder"]
    for run in report["fit"]:
        assert run["images_per_s_steps"] > 0 and 0 <= run["data_wait_share"] < 1 and run["bench_train_img_s"] > 0
        assert "trainer.compile=true" in run["overrides"]
    assert report["auto_mode"]["requested"] == "auto" and report["auto_mode"]["mode"] == "default"
    table = (folder / "gpu_speed.md").read_text()
    assert "(CPU dry run)" in table and "| imagefolder (vit_pico) |" in table and "| vit_pico | ours |" in table
    assert (folder / "bench" / "vit_pico_bf16_b4.json").is_file()
