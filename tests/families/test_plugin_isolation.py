"""A plug-in fails alone: a family that cannot be imported, declares a preset another declares, or names a class that
is none of its models costs one warning line naming its distribution and entry point (and says whose error it is);
every other family and command goes on, ``import timm, vitlab`` does not raise, and ``VITLAB_NO_PLUGINS=1`` loads no
plug-in."""

import subprocess
import sys
from importlib.metadata import EntryPoint

import pytest

import vitlab.family as family_module
from process_fixtures import vitlab_process
from vitlab.errors import FamilyError
from vitlab.family import Family, PluginWarning, register_family, unregister_family
from vitlab.models.registry import get_preset, list_models

DECLARE = (
    "from vitlab.family import Family, register_family\n"
    "FAMILY = register_family(\n"
    "    Family(name={name!r}, models=('{package}.model:{cls}',), task='x:Y', presets={table!r})\n"
    ")\n"
)
#: plug-ins with one fault each: package -> its __init__; and what the warning says of each
BROKEN = {
    "missing_dependency": "import a_dependency_that_is_not_installed\n",
    "clash": DECLARE.format(name="clash", package="clash", cls="M", table={"vit_tiny": ("M", "mine")}),
    "typo": DECLARE.format(name="typo", package="typo", cls="TypoModel", table={"typo_pico": ("TypoModle", "x")}),
}
SAYS = {
    "missing_dependency": "ModuleNotFoundError: No module named 'a_dependency_that_is_not_installed'",
    "clash": "the preset 'vit_tiny' is declared by vitlab (its core) and by the family 'clash'",
    "typo": "declares the preset 'typo_pico' of class 'TypoModle', which is none of its models (TypoModel)",
}


@pytest.fixture(params=sorted(BROKEN))
def broken(request, tmp_path):
    from plugin_fixtures import install_plugin, plugin_env

    name = request.param
    site = install_plugin(tmp_path / "site", f"vitlab-{name}", name, name, {f"{name}/__init__.py": BROKEN[name]})
    return name, plugin_env(site)


def test_a_broken_plugin_costs_one_warning_line_and_every_command_goes_on(broken, tmp_path):
    name, env = broken
    for argv, code in [(["list-models"], 0), (["--help"], 0), (["fit", "--config", "vit/digits", "model.depthh=2"], 2)]:
        out, loaded = vitlab_process(argv, cwd=tmp_path, env=env)
        assert out.returncode == code, out.stderr
        warning, *rest = out.stderr.strip().splitlines()
        assert warning.startswith(
            f"vitlab: warning: the vitlab plug-in {name} = {name} of the distribution vitlab-{name}"
        )
        assert SAYS[name] in warning and "set VITLAB_NO_PLUGINS=1" in warning and warning.endswith("(PluginWarning)")
        assert loaded == []
        if argv == ["list-models"]:
            assert rest == [] and "vit_tiny                 ViT classifier" in out.stdout
        if code == 2:
            assert "Did you mean depth" in rest[0]


def test_the_switch_loads_no_plugin(broken, tmp_path):
    _, env = broken
    out, _ = vitlab_process(["list-models"], cwd=tmp_path, env={**env, "VITLAB_NO_PLUGINS": "1"})
    assert out.returncode == 0 and out.stderr == "" and "vit_nano" in out.stdout


def test_import_timm_then_vitlab_does_not_raise_because_of_a_plugin(tmp_path):
    from plugin_fixtures import install_plugin, plugin_env

    site = install_plugin(
        tmp_path / "site", "vitlab-bad", "bad", "bad", {"bad/__init__.py": BROKEN["missing_dependency"]}
    )
    code = "import timm, vitlab\nprint(len(timm.list_models('vitlab_*')) == len(vitlab.list_models()) > 0)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=plugin_env(site))
    assert out.returncode == 0 and out.stdout.strip() == "True", out.stderr
    assert "vitlab-bad" in out.stderr and "Traceback" not in out.stderr


@pytest.fixture
def fresh_families(monkeypatch):
    """The family registry as before the first use, with the entry points a test gives; restored afterwards."""
    for name in ("_FAMILIES", "_ORIGINS"):
        monkeypatch.setattr(family_module, name, dict(getattr(family_module, name)))
    monkeypatch.setattr(family_module, "_warned", set())
    monkeypatch.setattr(family_module, "_loaded", False)

    def use(*points: EntryPoint) -> None:
        monkeypatch.setattr(family_module, "entry_points", lambda group: list(points))

    return use


def test_a_plugin_whose_models_cannot_import_refuses_its_presets_in_one_line_and_no_other(fresh_families, tmp_path):
    toy = Family(name="lazy", models=("no_such_module.model:Lazy",), task="x:Y", presets={"lazy_pico": ("Lazy", "x")})
    fresh_families(EntryPoint("lazy", f"{__name__}:LAZY", "vitlab.families"))
    globals()["LAZY"] = toy
    try:
        assert "lazy_pico" in list_models() and family_module.origin(toy).endswith("an unknown distribution")
        with pytest.raises(FamilyError, match=r"lazy = .* cannot import its model 'Lazy' \(ModuleNotFoundError"):
            get_preset("lazy_pico")
        import vitlab

        with pytest.warns(PluginWarning, match=r"the vitlab plug-in lazy = .* \(its models\) is left out"):
            assert family_module.family_of(vitlab.create_model("vit_pico")) is None
    finally:
        unregister_family("lazy")


def test_a_clash_with_another_family_names_the_preset_and_both_families():
    register_family(Family(name="first", models=("m:A",), task="x:Y", presets={"shared": ("A", "a")}))
    try:
        with pytest.raises(FamilyError, match="'shared' is declared by the family 'first' and by the family 'second'"):
            register_family(Family(name="second", models=("m:B",), task="x:Y", presets={"shared": ("B", "b")}))
        assert "second" not in {f.name for f in family_module.families()}
    finally:
        unregister_family("first")


def test_a_family_may_table_presets_of_the_core_models():
    register_family(Family(name="wide", models=(), task="x:Y", presets={"vit_wide": ("VisionTransformer", "w")}))
    try:
        assert get_preset("vit_wide").cls.__name__ == "VisionTransformer"
    finally:
        unregister_family("wide")
        from vitlab.models.registry import _REGISTRY

        _REGISTRY.pop("vit_wide", None)
