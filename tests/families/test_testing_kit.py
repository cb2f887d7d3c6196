"""``vitlab.testing`` as a plug-in's CI runs it: the contract over the presets of the two toy families of
tests/plugins (an MLP-Mixer with its own task and loss, a ConvMixer trained by vitlab's classification task); a model
that breaks the contract fails it; and vitlab's own suite, with both installed, runs over its built-in families only
and passes."""

import importlib
import re
import subprocess
import sys

import pytest
import torch
from torch import nn

from plugin_fixtures import PLUGINS, ROOT, install_plugin, plugin_env
from vitlab.family import Family, families, register_family, unregister_family
from vitlab.models.registry import _REGISTRY
from vitlab.testing import CONTRACT, FamilyNotLoadedError, builtin_presets, check_training_step, family_presets
from vitlab.training.tasks import ClassificationTask

TOYS = {"toy_mixer": "vitlab_toy_mixer", "toy_convmixer": "vitlab_toy_convmixer"}


@pytest.fixture(scope="module")
def toy_families():
    """Both toy families registered in this process (as their entry points would), forgotten afterwards."""
    sys.path.insert(0, str(PLUGINS))
    try:
        for name, package in TOYS.items():
            if name not in {f.name for f in families()}:
                register_family(importlib.import_module(package).FAMILY)
        yield
    finally:
        for name in TOYS:
            for preset in family_presets(name):
                _REGISTRY.pop(preset, None)
            unregister_family(name)
        sys.path.remove(str(PLUGINS))


@pytest.mark.parametrize("check", CONTRACT, ids=lambda check: check.__name__)
@pytest.mark.parametrize("family", sorted(TOYS))
def test_a_plugin_runs_the_contract_over_its_presets(toy_families, family, check):
    presets = family_presets(family)
    assert presets and not set(presets) & set(builtin_presets())
    for preset in presets:
        check(preset)


class HalfUsed(nn.Module):
    """A classifier with a layer its forward never calls (its parameters get no gradient)."""

    def __init__(self, *, img_size: int = 8, in_chans: int = 1, num_classes: int = 3, patch_size: int = 2) -> None:
        super().__init__()
        self.num_classes = num_classes
        self.head, self.unused = nn.Linear(in_chans, num_classes), nn.Linear(1, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(x.mean(dim=(2, 3)))


def test_the_kit_fails_a_model_whose_parameter_gets_no_gradient():
    register_family(
        Family(name="half", models=(HalfUsed,), task=ClassificationTask, presets={"half": ("HalfUsed", "h")})
    )
    try:
        with pytest.raises(AssertionError, match=r"parameters with no gradient: \['unused.weight', 'unused.bias'\]"):
            check_training_step("half")
    finally:
        unregister_family("half")
        _REGISTRY.pop("half", None)


#: the suite's files that run over the presets, and those whose verdict a plug-in changed before
OVER_PRESETS = ["tests/models/test_models.py", "tests/models/test_timm_contract.py", "tests/test_layering.py"]
RUN = ["tests/families/test_core_names_no_family.py", "tests/models/test_catalogue.py", "tests/cli/test_list_models.py"]


def _pytest(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
    )


@pytest.mark.slow  # pytest in two subprocesses
def test_the_suite_runs_over_the_built_in_families_and_passes_with_plugins_installed(tmp_path):
    site = install_plugin(tmp_path / "site", "vitlab-toy-mixer", "toy_mixer", "vitlab_toy_mixer")
    install_plugin(site, "vitlab-toy-convmixer", "toy_convmixer", "vitlab_toy_convmixer")
    installed, bare = plugin_env(site), plugin_env(tmp_path / "empty")
    collected = [_pytest(env, "--collect-only", *OVER_PRESETS) for env in (installed, bare)]
    assert all(c.returncode == 0 for c in collected), collected[0].stdout[-3000:]
    ids = [[line for line in c.stdout.splitlines() if "::" in line] for c in collected]
    assert ids[0] == ids[1] and any("[vit_pico]" in line for line in ids[0])
    run = _pytest(installed, *RUN)
    assert run.returncode == 0, run.stdout[-3000:]


def test_the_kit_fails_closed_on_a_family_that_is_not_loaded(monkeypatch):
    """A kit test parametrized over an absent family's presets would report "skipped" and pass: it must fail, naming
    the family and why (issue 62)."""
    monkeypatch.delenv("VITLAB_NO_PLUGINS", raising=False)
    with pytest.raises(FamilyNotLoadedError, match=r"'mixer' is not loaded \(no installed distribution"):
        family_presets("mixer")
    monkeypatch.setenv("VITLAB_NO_PLUGINS", "1")
    with pytest.raises(FamilyNotLoadedError, match="VITLAB_NO_PLUGINS=1 switches plug-ins off"):
        family_presets("mixer")
    with pytest.raises(FamilyNotLoadedError, match=re.escape("'vitcae' has no preset matching 'nothing_*'")):
        family_presets("vitcae", "nothing_*")
    assert "vitcae_pico" in family_presets("vitcae")


#: a third-party plug-in with an obvious preset name, such as a real MLP-Mixer package would declare
THIRD_PARTY = """from vitlab.family import Family
from vitlab.training.tasks import ClassificationTask

FAMILY = Family(
    name="mixer",
    models=(),
    task=ClassificationTask,
    presets={"mixer_pico": ("VisionTransformer", "a third party's preset", dict(embed_dim=16, depth=1, num_heads=2))},
)
"""


@pytest.mark.slow  # pytest in a subprocess
def test_the_suite_is_hermetic_with_a_third_party_plugin_installed(tmp_path):
    """vitlab's own toy families take names no plug-in would (issue 62: a plug-in declaring ``mixer_pico`` gave the
    suite 6 errors, its toy family clashing with it)."""
    site = install_plugin(tmp_path / "site", "vitlab-mixer", "mixer", "vitlab_mixer:FAMILY",
                          {"vitlab_mixer.py": THIRD_PARTY})  # fmt: skip
    run = _pytest(plugin_env(site), "tests/families/test_testing_kit.py", "-k", "contract_over_its_presets")
    assert run.returncode == 0 and f"{2 * len(CONTRACT)} passed" in run.stdout, run.stdout[-3000:]
