"""A typo in any section of a run config is refused at once: exit 2 before torch, Lightning or timm is imported, no
run folder."""

import pytest

from process_fixtures import loaded_after, vitlab_process


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
def test_a_typo_exits_2_before_torch_without_a_folder(override, message, tmp_path):
    run_dir = tmp_path / "run"
    out, loaded = vitlab_process(["fit", "--config", "vitcae/digits", override, f"run.dir={run_dir}"], cwd=tmp_path)
    assert out.returncode == 2, out.stderr
    assert message in out.stderr
    assert loaded == [], f"{override} was refused only after importing {loaded}"
    assert not run_dir.exists() and not (tmp_path / "runs").exists()


def test_the_checks_load_no_deep_learning_library():
    overrides = ["dynamics.rho=0.5", "loss.lambda_ei=0.1"]
    code = f"from vitlab.config import build_config\nbuild_config('cet_vit/digits', {overrides!r})"
    assert loaded_after(code) == []


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
def test_a_typo_in_the_model_or_loss_of_any_task_exits_2_before_torch_without_a_folder(
    config, override, message, tmp_path
):
    run_dir = tmp_path / "run"
    out, loaded = vitlab_process(["fit", "--config", config, override, f"run.dir={run_dir}"], cwd=tmp_path)
    assert out.returncode == 2, out.stderr
    assert message in out.stderr and len(out.stderr.strip().splitlines()) <= 2  # the error and the debug hint
    assert loaded == [], f"{override} was refused only after importing {loaded}"
    assert not run_dir.exists() and not (tmp_path / "runs").exists()


def test_unknown_model_says_when_plugins_are_switched_off(monkeypatch):
    """A plug-in's preset is unknown while VITLAB_NO_PLUGINS is set: the message says so (issue 62)."""
    from vitlab.config.model import model_class_name
    from vitlab.errors import UnknownModelError
    from vitlab.models.registry import get_preset

    monkeypatch.setenv("VITLAB_NO_PLUGINS", "1")
    for lookup in (lambda: model_class_name({"name": "mixer_pico"}), lambda: get_preset("mixer_pico")):
        with pytest.raises(UnknownModelError, match=r"Plug-ins are switched off \(VITLAB_NO_PLUGINS=1\)"):
            lookup()
    monkeypatch.delenv("VITLAB_NO_PLUGINS")
    with pytest.raises(UnknownModelError) as error:
        model_class_name({"name": "mixer_pico"})
    assert "switched off" not in str(error.value)
