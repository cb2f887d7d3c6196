"""A typo in any section of a run config is refused at once: exit 2 within seconds, no torch, no run folder."""

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

VITLAB = [sys.executable, "-c", "import sys; from vitlab.cli.main import main; sys.exit(main())"]


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("dynamics.rhoo=1", "unknown config key 'dynamics.rhoo'"),
        ("model.depthh=2", "has no option 'depthh'"),
        ("loss.foo=1", "unknown config key 'loss.foo'"),
        ("data.name=imagenet-1k", "unknown dataset 'imagenet-1k'"),
        ("optim.lrr=1", "unknown config key 'optim.lrr'"),
        ("model.name=vitcae_tinyy", "unknown model 'vitcae_tinyy'"),
    ],
)
def test_a_typo_exits_2_in_under_3_seconds_without_a_folder(override, message, tmp_path):
    run_dir = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2] / "src")}
    args = [*VITLAB, "fit", "--config", "vitcae/digits", override, f"run.dir={run_dir}"]
    start = time.perf_counter()
    out = subprocess.run(args, capture_output=True, text=True, cwd=tmp_path, env=env)
    elapsed = time.perf_counter() - start
    assert out.returncode == 2, out.stderr
    assert message in out.stderr
    assert elapsed < 3.0, f"{override} took {elapsed:.2f} s to be refused"
    assert not run_dir.exists() and not (tmp_path / "runs").exists()


def test_the_checks_load_no_deep_learning_library():
    code = (
        "import sys\nfrom vitlab.config import build_config\n"
        "build_config('cet_vit/digits', ['dynamics.rho=0.5', 'loss.lambda_ei=0.1'])\n"
        "print([m for m in ('torch', 'lightning', 'torchvision', 'timm', 'sklearn') if m in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip().splitlines()[-1] == "[]"


@pytest.mark.parametrize("config", ["vit/digits", "cet_vit/digits"])
@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("model.depthh=2", "Did you mean depth"),
        ("loss.foo=1", "unknown config key 'loss.foo'"),
        ("model.patch_size=two", "model.patch_size must be of type int"),
        ("model.patch_size=0", "model.patch_size must be at least 1, got 0"),
    ],
)
def test_a_typo_in_the_model_or_loss_of_any_task_exits_2_without_a_folder(config, override, message, tmp_path):
    run_dir = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2] / "src")}
    start = time.perf_counter()
    out = subprocess.run(
        [*VITLAB, "fit", "--config", config, override, f"run.dir={run_dir}"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
    )
    elapsed = time.perf_counter() - start
    assert out.returncode == 2, out.stderr
    assert message in out.stderr and len(out.stderr.strip().splitlines()) <= 2  # the error and the debug hint
    assert elapsed < 3.0, f"{override} took {elapsed:.2f} s to be refused"
    assert not run_dir.exists() and not (tmp_path / "runs").exists()
