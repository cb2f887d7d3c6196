"""The family API's version (issue 62): a plug-in written to the previous API (a torch-free ``CATALOGUE`` of
``(class, description)`` rows, its model module calling ``register_preset`` on import, as docs/writing_a_family.md
said before API 2) works with one deprecation line; a family written for a later API is refused in one line."""

import sys
import warnings

import pytest

from vitlab.errors import FamilyError
from vitlab.family import FAMILY_API, Family, PluginWarning, register_family, unregister_family
from vitlab.models.builder import create_model
from vitlab.models.registry import _REGISTRY

OLD_MODEL = """from torch import nn

from vitlab.models.registry import register_preset


class OldNet(nn.Module):
    def __init__(self, *, img_size=8, in_chans=1, num_classes=10, patch_size=2, width=4):
        super().__init__()
        self.num_classes = num_classes
        self.head = nn.Linear(in_chans, num_classes)

    def forward(self, x):
        return self.head(x.mean(dim=(2, 3)))


for name, kwargs in {"api1_old_pico": dict(width=4), "api1_old_nano": dict(width=8)}.items():
    register_preset(name, OldNet, "an API-1 preset", **kwargs)
"""


@pytest.fixture
def api1_plugin(tmp_path):
    (tmp_path / "api1_plugin_model.py").write_text(OLD_MODEL)
    sys.path.insert(0, str(tmp_path))
    catalogue = {"api1_old_pico": ("OldNet", "an API-1 preset"), "api1_old_nano": ("OldNet", "an API-1 preset")}
    register_family(
        Family(
            name="api1_old",
            models=("api1_plugin_model:OldNet",),
            task="vitlab.training.tasks:ClassificationTask",
            presets=catalogue,
        )
    )
    try:
        yield
    finally:
        unregister_family("api1_old")
        for name in catalogue:
            _REGISTRY.pop(name, None)
        sys.modules.pop("api1_plugin_model", None)
        sys.path.remove(str(tmp_path))


def test_a_plugin_written_to_api_1_works_with_one_deprecation_line(api1_plugin):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = create_model("api1_old_pico", num_classes=3)  # was: ValueError "registered twice"
        create_model("api1_old_nano", num_classes=3)
    assert model.head.out_features == 3
    lines = [str(w.message) for w in caught if issubclass(w.category, PluginWarning)]
    assert len(lines) == 1 and "deprecated since family API 2" in lines[0], lines
    assert "\n" not in lines[0] and "Upgrading a plug-in" in lines[0] and "api1_old_pico" in lines[0]


def test_a_family_for_a_later_api_is_refused_in_one_line():
    future = Family(name="from_the_future", models=(), task="x:Y", api=FAMILY_API + 1)
    with pytest.raises(FamilyError, match=rf"written for vitlab's family API {FAMILY_API + 1}.*upgrade vitlab"):
        register_family(future)
