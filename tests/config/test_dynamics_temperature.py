"""``dynamics.mode`` schedule or learn on a model without a temperature is refused before torch is imported: the
default of each class's ``temperature`` option (its options dataclass, ``vitlab.config.model``) decides, and it has
to agree with the presets."""

import pytest

from process_fixtures import vitlab_process
from vitlab.config import ConfigError, build_config
from vitlab.config.model import has_temperature
from vitlab.models.registry import constructor_args, get_preset
from vitlab.testing import builtin_presets


@pytest.mark.parametrize("mode", ["schedule", "learn"])
def test_a_tau_mode_on_a_model_without_temperature_exits_2_before_torch_without_a_folder(mode, tmp_path):
    run_dir = tmp_path / "run"
    args = ["fit", "--config", "vit/digits", f"dynamics.mode={mode}", f"run.dir={run_dir}"]
    out, loaded = vitlab_process(args, cwd=tmp_path)
    assert out.returncode == 2, out.stderr
    assert f"dynamics.mode='{mode}' needs a temperature in every controlled module" in out.stderr
    assert "model.temperature=true" in out.stderr and len(out.stderr.strip().splitlines()) <= 2
    assert loaded == []  # refused before torch, Lightning or timm was imported
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


@pytest.mark.parametrize("preset", builtin_presets())
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
