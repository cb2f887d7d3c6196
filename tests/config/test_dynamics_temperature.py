"""``dynamics.mode`` schedule or learn on a model without a temperature is refused before torch is imported: the
default of each class's ``temperature`` option (its options dataclass, ``vitlab.config.model``) decides, and it has
to agree with the presets."""

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from vitlab.config import ConfigError, build_config
from vitlab.config.model import has_temperature
from vitlab.models.registry import constructor_args, get_preset, list_models

CHECK = (
    "import sys\nfrom vitlab.cli.main import main\nrc = main()\n"
    "print([m for m in ('torch', 'lightning', 'timm') if m in sys.modules])\nsys.exit(rc)"
)


@pytest.mark.parametrize("mode", ["schedule", "learn"])
def test_a_tau_mode_on_a_model_without_temperature_exits_2_before_torch_without_a_folder(mode, tmp_path):
    run_dir = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2] / "src")}
    args = ["fit", "--config", "vit/digits", f"dynamics.mode={mode}", f"run.dir={run_dir}"]
    start = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", CHECK, *args], capture_output=True, text=True, cwd=tmp_path, env=env)
    elapsed = time.perf_counter() - start
    assert out.returncode == 2, out.stderr
    assert f"dynamics.mode='{mode}' needs a temperature in every controlled module" in out.stderr
    assert "model.temperature=true" in out.stderr and len(out.stderr.strip().splitlines()) <= 2
    assert out.stdout.strip().splitlines()[-1] == "[]"  # refused before torch, Lightning or timm was imported
    assert elapsed < 3.0, f"dynamics.mode={mode} took {elapsed:.2f} s to be refused"
    assert not run_dir.exists() and not (tmp_path / "runs").exists()


@pytest.mark.parametrize(
    ("config", "overrides"),
    [
        ("vit/digits", ["model.temperature=true"]),  # the ViT asked for a temperature
        ("vitcae/digits", []),  # ViTCAE has one by default
        ("cet_vit/digits", []),  # no declaration: the model check decides once the model is built
    ],
)
def test_a_tau_mode_with_a_temperature_or_no_declaration_builds(config, overrides):
    assert build_config(config, ["dynamics.mode=schedule", *overrides]).dynamics.mode == "schedule"


def test_a_model_built_without_its_temperature_is_refused_in_python_too():
    with pytest.raises(ConfigError, match="needs a temperature"):
        build_config("vitcae/digits", ["dynamics.mode=learn", "model.temperature=false"])
    assert build_config("vitcae/digits", ["dynamics.mode=fixed", "model.temperature=false"]).dynamics.mode == "fixed"


@pytest.mark.parametrize("preset", list_models())
def test_the_declared_temperature_is_the_presets(preset):
    """Every class with a ``temperature`` option declares its default, and no preset builds another."""
    entry = get_preset(preset)
    options = constructor_args(entry.cls)
    declared = has_temperature({"name": preset})
    if "temperature" not in options:
        assert declared is None
        return
    assert declared is not None, f"{entry.cls.__name__} has a temperature option but declares no default"
    assert entry.kwargs.get("temperature", options["temperature"].default) is declared
